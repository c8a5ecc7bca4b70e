-- The inbox of low-confidence observations (migration 0016).

-- The waiting observation of exactly this scope most like the vector ($6), if at least $7
-- alike: its attention rises by $8 (to at most 1) and it was heard in $9's events too.
-- name: hear_again
UPDATE memory_inbox i
SET attention = least(1.0, i.attention + $8::float8), heard = i.heard + 1,
    last_heard_at = now(), source_events = i.source_events || $9::jsonb
WHERE (i.tenant_id, i.id) = (
    SELECT x.tenant_id, x.id FROM memory_inbox x
    WHERE x.tenant_id = $1 AND x.status = 'waiting'
      AND x.user_id IS NOT DISTINCT FROM $2 AND x.agent_id IS NOT DISTINCT FROM $3
      AND x.visibility = $4 AND x.embedding_model = $5
      AND 1 - (x.embedding <=> $6) >= $7::float8
    ORDER BY x.embedding <=> $6
    LIMIT 1
    FOR UPDATE)
RETURNING i.id;

-- name: add
INSERT INTO memory_inbox (tenant_id, user_id, agent_id, session_id, visibility, type, content,
                          confidence, attention, hints, observed_at, source_events, embedding,
                          embedding_model)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10, $11, $12, $13);

-- What a reader sees of the inbox, most attention first; $4: the status, NULL for any.
-- name: list
SELECT id, user_id, agent_id, session_id, visibility, type, content, confidence, attention,
       heard, observed_at, source_events, status, memory_id, created_at, last_heard_at,
       decided_at
FROM memory_inbox i
WHERE i.tenant_id = $1 AND scope_visible(i.visibility, i.user_id, i.agent_id, $2, $3)
  AND ($4::text IS NULL OR i.status = $4)
ORDER BY i.attention DESC, i.created_at DESC
LIMIT $5;

-- The promote step's work in the run's scope ($2 user, $3 agent): the waiting observations
-- to promote (attention >= $4) and to drop (waited more than $5 days).
-- name: due
SELECT * FROM memory_inbox
WHERE tenant_id = $1 AND status = 'waiting'
  AND ($2::text IS NULL OR user_id = $2) AND ($3::text IS NULL OR agent_id = $3)
  AND (attention >= $4::float8 OR created_at < now() - $5::float8 * interval '1 day')
ORDER BY created_at
LIMIT $6;

-- name: decide
UPDATE memory_inbox SET status = $3, memory_id = $4, decided_at = now()
WHERE tenant_id = $1 AND id = $2 AND status = 'waiting'
RETURNING id;

-- An undo puts a decided observation back to wait.
-- name: reopen
UPDATE memory_inbox SET status = 'waiting', memory_id = NULL, decided_at = NULL
WHERE tenant_id = $1 AND id = $2 AND status <> 'waiting'
RETURNING id;
