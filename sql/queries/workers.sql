-- name: heartbeat
INSERT INTO workers (id, hostname, pid, queue_name) VALUES ($1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE SET last_seen_at = now(), stopped_at = NULL;

-- name: stopped
UPDATE workers SET stopped_at = now(), last_seen_at = now() WHERE id = $1;

-- Workers seen within the window, newest first.
-- name: alive
SELECT id, hostname, pid, queue_name, started_at, last_seen_at FROM workers
WHERE stopped_at IS NULL AND last_seen_at > now() - make_interval(secs => $1)
ORDER BY last_seen_at DESC;

-- Running jobs this worker still holds when it stops: back to the queue at once, so another
-- worker takes them without waiting for the lease to expire.
-- name: release_leases
UPDATE jobs
SET status = 'queued', lease_until = NULL, worker_id = NULL, enqueued_at = NULL,
    run_after = now(), updated_at = now()
WHERE worker_id = $1 AND status = 'running'
RETURNING id, kind, attempts, tenant_id;

-- name: mark_released_attempts
UPDATE job_attempts SET finished_at = now(), outcome = 'lost', error = 'worker shut down'
WHERE job_id = ANY($1::uuid[]) AND finished_at IS NULL;

-- Workers of one queue seen within the window: how many could take a job now.
-- name: alive_count
SELECT count(*) FROM workers
WHERE stopped_at IS NULL AND queue_name = $2 AND last_seen_at > now() - make_interval(secs => $1);
