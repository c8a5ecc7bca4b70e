-- name: delete_other_versions
DELETE FROM parts WHERE tenant_id = $1 AND item_id = $2 AND version <> $3;

-- name: delete_version
DELETE FROM parts WHERE tenant_id = $1 AND item_id = $2 AND version = $3;

-- name: insert_many
INSERT INTO parts (tenant_id, item_id, version, position, text, meta, content_hash)
SELECT $1, $2, $3, p.position, p.text, p.meta, p.content_hash
FROM unnest($4::integer[], $5::text[], $6::jsonb[], $7::text[])
     AS p(position, text, meta, content_hash);

-- All of them, not only those without a vector: during a reindex the vectors go to
-- embedding_next, and a re-run finds what it computed in the cache.
-- name: of_version
SELECT id, text, content_hash FROM parts
WHERE tenant_id = $1 AND item_id = $2 AND version = $3
ORDER BY position;

-- Run with executemany (pipelined): the vector codec is binary and has no array form.
-- name: set_embedding
UPDATE parts SET embedding = $3 WHERE tenant_id = $1 AND id = $2;

-- name: cached_embeddings
SELECT content_hash, embedding FROM embedding_cache
WHERE tenant_id = $1 AND model = $2 AND content_hash = ANY($3::text[]);

-- name: cache_embedding
INSERT INTO embedding_cache (tenant_id, model, content_hash, embedding)
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING;
