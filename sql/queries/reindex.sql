-- name: state
SELECT model, next_model, started_at, finished_at FROM embedding_index;

-- Taken by every embed write: a share lock, so writes run side by side but never across the
-- swap at the end of a reindex, which takes the row for update.
-- name: state_for_write
SELECT model, next_model FROM embedding_index FOR SHARE;

-- name: state_for_update
SELECT model, next_model FROM embedding_index FOR UPDATE;

-- name: claim_model
UPDATE embedding_index SET model = $1 WHERE model IS NULL;

-- name: begin
UPDATE embedding_index SET next_model = $1, started_at = now(), finished_at = NULL;

-- Vectors of an abandoned reindex to another model must not be mistaken for this one's.
-- name: clear_next
UPDATE parts SET embedding_next = NULL WHERE embedding_next IS NOT NULL;

-- name: tenants_with_parts
SELECT DISTINCT tenant_id FROM parts;

-- name: page
SELECT id, text, content_hash FROM parts
WHERE tenant_id = $1 AND id > $2 AND embedding_next IS NULL
ORDER BY id
LIMIT $3;

-- name: set_next
UPDATE parts SET embedding_next = $3 WHERE tenant_id = $1 AND id = $2;

-- name: progress
SELECT count(*) AS parts, count(embedding_next) AS done FROM parts WHERE tenant_id = $1;

-- name: incomplete
SELECT EXISTS (SELECT 1 FROM parts WHERE embedding_next IS NULL);

-- name: swap_vectors
UPDATE parts SET embedding = embedding_next, embedding_next = NULL
WHERE embedding_next IS NOT NULL;

-- name: finish
UPDATE embedding_index SET model = next_model, next_model = NULL, finished_at = now();

-- pgvector keeps a vector column's dimension in its type modifier.
-- name: dimension
SELECT atttypmod FROM pg_attribute WHERE attrelid = 'parts'::regclass AND attname = 'embedding';
