-- name: insert
INSERT INTO jobs (id, tenant_id, kind, item_id, version, status, depends_on, max_attempts, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: mark_enqueued
UPDATE jobs SET enqueued_at = now() WHERE id = ANY($1::uuid[]);

-- name: get
SELECT * FROM jobs WHERE tenant_id = $1 AND id = $2;

-- name: get_any
SELECT * FROM jobs WHERE id = $1;

-- The job, locked until the transaction ends. A retry or cancel reads the status it decides on,
-- and quotes when it refuses, from this row: no worker can change it in between (reading it
-- unlocked, a cancel could say "job is queued; only queued jobs can be cancelled").
-- name: item_of
SELECT item_id FROM jobs WHERE tenant_id = $1 AND id = $2;

-- name: lock
SELECT * FROM jobs WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: attempts
SELECT attempt, worker_id, started_at, finished_at, outcome, error, retry_delay_s
FROM job_attempts WHERE tenant_id = $1 AND job_id = $2 ORDER BY attempt;

-- A queued job, or a running one whose lease has expired, is taken; anything else is left
-- alone, so a duplicate delivery of the same job does nothing. One statement also opens the
-- attempt row and, on a takeover, closes the attempt of the worker that lost the lease.
-- name: claim
WITH claimed AS (
    UPDATE jobs
    SET status = 'running', attempts = attempts + 1, worker_id = $2,
        lease_until = now() + make_interval(secs => $3), started_at = now(), updated_at = now()
    WHERE id = $1
      -- A delivery before the job is due (an extraction whose session spoke again and moved
      -- it later) is skipped; the delivery enqueued for the new time, or the sweeper, runs it.
      AND ((status = 'queued' AND run_after <= now() + interval '1 second')
           OR (status = 'running' AND lease_until < now()))
      -- A paused kind stays queued; its resume makes the sweeper deliver it again.
      AND NOT EXISTS (SELECT 1 FROM paused_kinds p WHERE p.kind = jobs.kind)
    RETURNING *
), closed AS (
    UPDATE job_attempts SET finished_at = now(), outcome = 'lost', error = 'lease expired'
    WHERE job_id = $1 AND finished_at IS NULL AND EXISTS (SELECT 1 FROM claimed)
), opened AS (
    INSERT INTO job_attempts (tenant_id, job_id, attempt, worker_id)
    SELECT tenant_id, id, attempts, $2 FROM claimed
    ON CONFLICT (job_id, attempt) DO UPDATE
    SET worker_id = EXCLUDED.worker_id, started_at = now(), finished_at = NULL, outcome = NULL
)
SELECT * FROM claimed;

-- name: finish_attempt
UPDATE job_attempts SET finished_at = now(), outcome = $3, error = $4, traceback = $5
WHERE job_id = $1 AND attempt = $2;

-- name: renew_lease
UPDATE jobs SET lease_until = now() + make_interval(secs => $3), updated_at = now()
WHERE id = $1 AND worker_id = $2 AND status = 'running'
RETURNING id;

-- Marks the job done, closes its attempt and releases the jobs waiting on it, in one round
-- trip. No row means the lease was lost; one row with a null dependent id means none waited.
-- name: complete
WITH done AS (
    UPDATE jobs SET status = 'done', finished_at = now(), lease_until = NULL, updated_at = now()
    WHERE id = $1 AND worker_id = $2 AND status = 'running'
    RETURNING id, attempts
), finished AS (
    UPDATE job_attempts SET finished_at = now(), outcome = 'done'
    FROM done WHERE job_attempts.job_id = done.id AND job_attempts.attempt = done.attempts
), released AS (
    UPDATE jobs SET status = 'queued', run_after = now(), updated_at = now()
    FROM done WHERE jobs.depends_on = done.id AND jobs.status = 'waiting'
    RETURNING jobs.id, jobs.kind, jobs.attempts, jobs.tenant_id
)
SELECT r.id, r.kind, r.attempts, r.tenant_id FROM done LEFT JOIN released r ON true;

-- name: schedule_retry
UPDATE jobs
SET status = 'queued', run_after = now() + make_interval(secs => $3), last_error = $4,
    lease_until = NULL, worker_id = NULL, enqueued_at = NULL, updated_at = now()
WHERE id = $1 AND worker_id = $2 AND status = 'running'
RETURNING id, kind, attempts, tenant_id;

-- name: mark_dead
UPDATE jobs
SET status = 'dead', last_error = $3, finished_at = now(), lease_until = NULL, updated_at = now()
WHERE id = $1 AND (worker_id = $2 OR $2 IS NULL) AND status IN ('running', 'queued')
RETURNING *;

-- Everything downstream, not only the direct dependents: regularize -> analyze -> embed.
-- name: cancel_dependents
WITH RECURSIVE downstream AS (
    SELECT id FROM jobs WHERE depends_on = $1 AND status = 'waiting'
    UNION
    SELECT j.id FROM jobs j JOIN downstream d ON j.depends_on = d.id WHERE j.status = 'waiting'
)
UPDATE jobs SET status = 'cancelled', finished_at = now(), updated_at = now()
WHERE id IN (SELECT id FROM downstream);

-- name: insert_dead_letter
INSERT INTO dead_letters (tenant_id, job_id, kind, item_id, payload, reason, permanent, attempts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- Running jobs whose worker stopped renewing the lease go back to the queue.
-- name: reclaim_expired
UPDATE jobs
SET status = 'queued', lease_until = NULL, worker_id = NULL, enqueued_at = NULL,
    run_after = now(), updated_at = now()
WHERE id IN (SELECT id FROM jobs WHERE status = 'running' AND lease_until < now()
             ORDER BY lease_until LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, kind, attempts, tenant_id;

-- name: mark_lost_attempts
UPDATE job_attempts SET finished_at = now(), outcome = 'lost', error = 'lease expired'
WHERE job_id = ANY($1::uuid[]) AND finished_at IS NULL;

-- Queued jobs that are due and that nobody enqueued recently: Redis may have lost them.
-- name: due_unenqueued
UPDATE jobs SET enqueued_at = now()
WHERE id IN (SELECT id FROM jobs
             WHERE status = 'queued' AND run_after <= now()
               AND (enqueued_at IS NULL OR enqueued_at < now() - make_interval(secs => $1))
               AND NOT EXISTS (SELECT 1 FROM paused_kinds p WHERE p.kind = jobs.kind)
             ORDER BY run_after LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING id, kind, attempts, tenant_id;

-- A new content version makes the old version's unstarted jobs pointless.
-- name: cancel_superseded
UPDATE jobs SET status = 'cancelled', finished_at = now(), updated_at = now()
WHERE tenant_id = $1 AND item_id = $2 AND status IN ('waiting', 'queued');

-- The jobs of an item's newest processed content, for the item view.
-- name: for_item
SELECT id, kind, status, attempts FROM jobs
WHERE tenant_id = $1 AND item_id = $2
  AND version = (SELECT max(version) FROM jobs WHERE tenant_id = $1 AND item_id = $2)
ORDER BY created_at;

-- name: list
SELECT * FROM jobs
WHERE tenant_id = $1
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR kind = $3)
  AND ($4::text IS NULL OR item_id = $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($6::timestamptz IS NULL OR created_at < $6)
ORDER BY created_at DESC, id DESC
LIMIT $7 OFFSET $8;

-- name: count
SELECT count(*) FROM jobs
WHERE tenant_id = $1
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR kind = $3)
  AND ($4::text IS NULL OR item_id = $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($6::timestamptz IS NULL OR created_at < $6);

-- name: counts
SELECT status, kind, count(*) AS n FROM jobs WHERE tenant_id = $1 GROUP BY status, kind;

-- A tenant's share of the waiting work: its queued jobs that are due, and since when.
-- name: due
SELECT count(*) AS due, min(run_after) AS oldest_due FROM jobs
WHERE tenant_id = $1 AND status = 'queued' AND run_after <= now();

-- A retry or replay gives the job a fresh budget of attempts; the history of earlier attempts
-- stays (attempt numbers keep counting).
-- name: retry
UPDATE jobs
SET status = 'queued', max_attempts = attempts + $3, run_after = now(), last_error = NULL,
    finished_at = NULL, enqueued_at = NULL, lease_until = NULL, worker_id = NULL,
    updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND status IN ('dead', 'cancelled', 'queued')
RETURNING *;

-- name: restore_dependents
WITH RECURSIVE downstream AS (
    SELECT id FROM jobs WHERE depends_on = $1 AND status = 'cancelled'
    UNION
    SELECT j.id FROM jobs j JOIN downstream d ON j.depends_on = d.id WHERE j.status = 'cancelled'
)
UPDATE jobs SET status = 'waiting', finished_at = NULL, updated_at = now()
WHERE id IN (SELECT id FROM downstream);

-- name: cancel
UPDATE jobs SET status = 'cancelled', finished_at = now(), lease_until = NULL, updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND status IN ('queued', 'waiting')
RETURNING *;

-- name: finish_attempt_retry
UPDATE job_attempts
SET finished_at = now(), outcome = 'retry', error = $3, traceback = $4, retry_delay_s = $5
WHERE job_id = $1 AND attempt = $2;
