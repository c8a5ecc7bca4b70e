-- name: list
SELECT d.*, j.last_error FROM dead_letters d JOIN jobs j ON j.id = d.job_id
WHERE d.tenant_id = $1
  AND ($2::text IS NULL OR d.kind = $2)
  AND ($3::text IS NULL OR d.item_id = $3)
  AND ($4::boolean IS NULL OR (d.replayed_at IS NOT NULL) = $4)
  AND ($5::boolean IS NULL OR d.permanent = $5)
ORDER BY d.created_at DESC, d.id DESC
LIMIT $6 OFFSET $7;

-- name: count
SELECT count(*) FROM dead_letters d
WHERE d.tenant_id = $1
  AND ($2::text IS NULL OR d.kind = $2)
  AND ($3::text IS NULL OR d.item_id = $3)
  AND ($4::boolean IS NULL OR (d.replayed_at IS NOT NULL) = $4)
  AND ($5::boolean IS NULL OR d.permanent = $5);

-- name: get
SELECT d.*, j.last_error FROM dead_letters d JOIN jobs j ON j.id = d.job_id
WHERE d.tenant_id = $1 AND d.id = $2;

-- name: attempts
SELECT attempt, worker_id, started_at, finished_at, outcome, error, retry_delay_s, traceback
FROM job_attempts WHERE tenant_id = $1 AND job_id = $2 ORDER BY attempt;

-- Not yet replayed dead letters matching a filter, oldest first, locked for the replay.
-- name: select_for_replay
SELECT id, job_id, kind FROM dead_letters
WHERE tenant_id = $1 AND replayed_at IS NULL
  AND ($2::text IS NULL OR kind = $2)
  AND ($3::text IS NULL OR item_id = $3)
  AND ($4::boolean IS NULL OR permanent = $4)
ORDER BY created_at, id
LIMIT $5
FOR UPDATE SKIP LOCKED;

-- name: mark_replayed
UPDATE dead_letters SET replayed_at = now() WHERE tenant_id = $1 AND id = $2;

-- name: mark_replayed_for_job
UPDATE dead_letters SET replayed_at = now()
WHERE tenant_id = $1 AND job_id = $2 AND replayed_at IS NULL;
