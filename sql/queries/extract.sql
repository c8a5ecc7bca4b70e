-- The extract job of a session that waits in the ledger, if any (at most one: a unique index).
-- name: waiting
SELECT j.id, j.run_after, o.id AS operation_id
FROM jobs j LEFT JOIN operations o ON o.job_id = j.id
WHERE j.tenant_id = $1 AND j.kind = 'extract' AND j.status = 'queued'
  AND j.payload ->> 'session_id' = $2
FOR UPDATE OF j;

-- name: cancel
UPDATE jobs SET status = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = $1 AND status = 'queued';

-- name: insert
INSERT INTO jobs (id, tenant_id, kind, status, max_attempts, payload, run_after)
VALUES ($1, $2, 'extract', 'queued', $3, $4, now() + make_interval(secs => $5))
ON CONFLICT (tenant_id, (payload ->> 'session_id')) WHERE kind = 'extract' AND status = 'queued'
DO NOTHING
RETURNING true;

-- name: session
SELECT id, user_id, agent_id, visibility, extracted_seq, last_write_at, ended_at
FROM sessions WHERE tenant_id = $1 AND id = $2;

-- name: lock_session
SELECT extracted_seq FROM sessions WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: advance
UPDATE sessions SET extracted_seq = $3, summary = coalesce($4, summary)
WHERE tenant_id = $1 AND id = $2;
