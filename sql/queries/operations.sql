-- name: insert
INSERT INTO operations (tenant_id, kind, job_id, session_id, scope, key_id)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id;

-- name: get
SELECT o.id, o.kind, o.session_id, o.scope, o.result, o.created_at,
       coalesce(o.finished_at, j.finished_at) AS finished_at, j.status AS job_status,
       j.attempts, CASE WHEN j.status = 'dead' THEN j.last_error END AS error
FROM operations o LEFT JOIN jobs j ON j.id = o.job_id
WHERE o.tenant_id = $1 AND o.id = $2;

-- name: decisions
SELECT position, action, reason, type, confidence, similarity, memory_id, target_id,
       old_content, new_content, observed_at, source_events
FROM operation_decisions WHERE tenant_id = $1 AND operation_id = $2 ORDER BY position;

-- name: of_job
SELECT id FROM operations WHERE job_id = $1;

-- name: move_to_job
UPDATE operations SET job_id = $2 WHERE job_id = $1;

-- name: finish
UPDATE operations SET result = $2, finished_at = now() WHERE job_id = $1;

-- name: insert_decisions
INSERT INTO operation_decisions (tenant_id, operation_id, position, action, reason, type,
                                 confidence, similarity, memory_id, target_id, old_content,
                                 new_content, observed_at, source_events)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);
