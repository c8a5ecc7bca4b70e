-- Memories (migration 0011). $1 is always the tenant; reads take the reader's user and agent
-- and pass every row through scope_visible().

-- $18 is the caller's id (NULL: a new one); an id the tenant holds already returns no row.
-- $20 is its layer and $21 the layer's lifetime in days (NULL: permanent).
-- name: insert
INSERT INTO memories (tenant_id, user_id, agent_id, session_id, visibility, type, content,
                      confidence, source, metadata, hints, pinned, observed_at, source_events,
                      content_hash, embedding, embedding_model, id, valid_until, layer, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
        coalesce($18::uuid, gen_random_uuid()), $19, $20,
        now() + $21::float8 * interval '1 day')
ON CONFLICT (tenant_id, id) DO NOTHING
RETURNING *;

-- name: history_add
INSERT INTO memory_history (tenant_id, memory_id, version, operation, key_id, agent_id,
                            operation_id, old_content, new_content, changes, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: get
SELECT m.* FROM memories m
WHERE m.tenant_id = $1 AND m.id = $2
  AND scope_visible(m.visibility, m.user_id, m.agent_id, $3, $4);

-- name: lock
SELECT m.* FROM memories m
WHERE m.tenant_id = $1 AND m.id = $2
  AND scope_visible(m.visibility, m.user_id, m.agent_id, $3, $4)
FOR UPDATE;

-- Sets only what changed (NULL keeps a field); the embedding goes when the content changes.
-- With $13, the expiry is set again: $14 days from when the memory was written (NULL: never).
-- name: update
UPDATE memories
SET content = coalesce($3, content), type = coalesce($4, type), layer = coalesce($12, layer),
    expires_at = CASE WHEN $13 THEN created_at + $14::float8 * interval '1 day' ELSE expires_at END,
    confidence = coalesce($5, confidence), source = coalesce($6, source),
    metadata = coalesce($7, metadata), hints = coalesce($8, hints),
    pinned = coalesce($9, pinned), observed_at = coalesce($10, observed_at),
    content_hash = coalesce($11, content_hash),
    embedding = CASE WHEN $11 IS NULL THEN embedding END,
    embedding_model = CASE WHEN $11 IS NULL THEN embedding_model END,
    version = version + 1, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: invalidate
UPDATE memories
SET valid_until = coalesce($3, now()), invalid_reason = $4, superseded_by = $5,
    version = version + 1, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: delete_one
DELETE FROM memories WHERE tenant_id = $1 AND id = $2 RETURNING id;

-- name: history
SELECT version, operation, key_id, agent_id, operation_id, old_content, new_content, changes,
       reason, at
FROM memory_history WHERE tenant_id = $1 AND memory_id = $2 ORDER BY version;

-- A page of the memories a reader sees, newest first, after the cursor (created_at, id);
-- $9, when set, is JSON their metadata must contain (jsonb @>).
-- name: list
SELECT m.* FROM memories m
WHERE m.tenant_id = $1 AND scope_visible(m.visibility, m.user_id, m.agent_id, $2, $3)
  AND ($4::text[] IS NULL OR m.type = ANY ($4))
  AND (NOT $5 OR m.valid_until IS NULL OR m.valid_until > now())
  AND ($6::timestamptz IS NULL OR (m.created_at, m.id) < ($6, $7::uuid))
  AND ($9::jsonb IS NULL OR m.metadata @> $9)
  AND ($10 OR m.expires_at IS NULL OR m.expires_at > now())
  AND ($11::text[] IS NULL OR m.layer = ANY ($11))
ORDER BY m.created_at DESC, m.id DESC
LIMIT $8;

-- name: pinned
SELECT m.* FROM memories m
WHERE m.tenant_id = $1 AND m.pinned AND scope_visible(m.visibility, m.user_id, m.agent_id, $2, $3)
  AND (m.valid_until IS NULL OR m.valid_until > now())
  AND (m.expires_at IS NULL OR m.expires_at > now())
ORDER BY m.created_at
LIMIT $4;

-- name: for_embedding
SELECT id, content AS text, content_hash FROM memories
WHERE tenant_id = $1 AND id = ANY ($2::uuid[]) AND embedding IS NULL;

-- name: set_embedding
UPDATE memories SET embedding = $3, embedding_model = $4
WHERE tenant_id = $1 AND id = $2 AND content_hash = $5;

-- Memories of exactly this scope (not what it may read: what it owns) that resemble a
-- vector, for extraction's decisions.
-- name: similar
SELECT m.id, m.type, m.content, m.observed_at, 1 - (m.embedding <=> $6) AS similarity
FROM memories m
WHERE m.tenant_id = $1 AND m.user_id IS NOT DISTINCT FROM $2
  AND m.agent_id IS NOT DISTINCT FROM $3 AND m.visibility = $4
  AND (m.valid_until IS NULL OR m.valid_until > now())
  AND (m.expires_at IS NULL OR m.expires_at > now())
  AND m.embedding_model = $5
ORDER BY m.embedding <=> $6
LIMIT $7;

-- name: register_type
INSERT INTO memory_types (tenant_id, name, description) VALUES ($1, $2, $3)
ON CONFLICT (tenant_id, name) DO UPDATE SET description = EXCLUDED.description
RETURNING name, description, created_at;

-- name: types
SELECT name, description, created_at FROM memory_types WHERE tenant_id = $1 ORDER BY name;

-- name: type_exists
SELECT EXISTS (SELECT 1 FROM memory_types WHERE tenant_id = $1 AND name = $2);

-- name: touch
UPDATE memories SET access_count = access_count + 1, accessed_at = now()
WHERE tenant_id = $1 AND id = ANY ($2::uuid[]);

-- Deleting by scope, a batch at a time: rows go with their history (cascade); their vectors
-- and text index entries go with the rows. A row another transaction holds (its embedding
-- being written) is waited for, not skipped: a delete of a user's data leaves nothing behind.
-- name: delete_scope_batch
DELETE FROM memories WHERE (tenant_id, id) IN (
    SELECT tenant_id, id FROM memories
    WHERE tenant_id = $1 AND ($2::text IS NULL OR user_id = $2)
      AND ($3::text IS NULL OR agent_id = $3) AND ($4::text IS NULL OR session_id = $4)
    LIMIT $5 FOR UPDATE)
RETURNING id;

-- name: count_scope
SELECT count(*) FROM memories
WHERE tenant_id = $1 AND ($2::text IS NULL OR user_id = $2)
  AND ($3::text IS NULL OR agent_id = $3) AND ($4::text IS NULL OR session_id = $4);
