-- Working memory (migration 0016): one scratchpad per tenant, user and session; session_id ''
-- is the user's own, across sessions.

-- The session's scratchpad, else the user's.
-- name: read
SELECT * FROM working_memory
WHERE tenant_id = $1 AND user_id = $2 AND session_id IN ($3, '')
ORDER BY session_id DESC
LIMIT 1;

-- name: create
INSERT INTO working_memory (tenant_id, user_id, session_id, content, agent_id, key_id)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant_id, user_id, session_id) DO NOTHING
RETURNING *;

-- name: replace
UPDATE working_memory
SET content = $4, agent_id = $5, key_id = $6, version = version + 1, updated_at = now()
WHERE tenant_id = $1 AND user_id = $2 AND session_id = $3 AND version = $7
RETURNING *;

-- name: version
SELECT version FROM working_memory WHERE tenant_id = $1 AND user_id = $2 AND session_id = $3;

-- name: delete
DELETE FROM working_memory WHERE tenant_id = $1 AND user_id = $2 AND session_id = $3
RETURNING 1;
