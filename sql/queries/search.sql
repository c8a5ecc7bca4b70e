-- Hybrid search in one round trip. Vector candidates come from the HNSW index (iterative scan
-- keeps the tenant filter exact), full-text candidates from the GIN index; a candidate missing
-- from one list takes rank n+1 there (n = that list's length). The fused RRF score is
-- multiplied by (k+1), its largest possible value's inverse, so it lies in [0, 1] before the
-- rerank signals are blended in.
-- $1 tenant, $2 query text, $3 query vector, $4 candidates per list, $5 alpha, $6 use vectors,
-- $7 use full text, $8 k, $9 blend, $10 recency half-life (days), $11 limit, $12 offset,
-- $13 the query embedder (provider:model). Vectors are compared with the query only when the
-- same embedder made them: the current column, or the one a reindex to it is building.
-- name: hybrid
WITH q AS (
    SELECT websearch_to_tsquery('english', $2) AS query
),
ix AS (
    SELECT coalesce(model, $13) = $13 AS current,
           next_model = $13 AS next
    FROM embedding_index
),
vec AS (
    SELECT id, row_number() OVER (ORDER BY distance, id) AS rank
    FROM ((SELECT p.id, p.embedding <=> $3 AS distance
           FROM parts p
           WHERE $6 AND (SELECT current FROM ix) AND p.tenant_id = $1
             AND p.embedding IS NOT NULL
           ORDER BY p.embedding <=> $3
           LIMIT $4)
          UNION ALL
          (SELECT p.id, p.embedding_next <=> $3 AS distance
           FROM parts p
           WHERE $6 AND (SELECT next FROM ix) AND p.tenant_id = $1
             AND p.embedding_next IS NOT NULL
           ORDER BY p.embedding_next <=> $3
           LIMIT $4)) v
),
fts AS (
    SELECT id, row_number() OVER (ORDER BY score DESC, id) AS rank
    FROM (SELECT p.id, ts_rank_cd(p.tsv, q.query, 32) AS score
          FROM parts p, q
          WHERE $7 AND p.tenant_id = $1 AND p.tsv @@ q.query
          ORDER BY score DESC
          LIMIT $4) f
),
fused AS (
    SELECT coalesce(vec.id, fts.id) AS id, vec.rank AS vector_rank, fts.rank AS fts_rank,
           ($8::float8 + 1) * (
               $5::float8 / ($8 + coalesce(vec.rank, (SELECT count(*) FROM vec) + 1))
               + (1 - $5::float8) / ($8 + coalesce(fts.rank, (SELECT count(*) FROM fts) + 1))
           ) AS fused
    FROM vec FULL OUTER JOIN fts ON vec.id = fts.id
),
scored AS (
    SELECT f.*, p.item_id, p.version AS part_version, p.position, p.text,
           i.title, i.summary, i.tags, i.version, i.kind, i.updated_at,
           (1 - $9::float8) * f.fused + $9::float8 * (
               0.5 * power(0.5, extract(epoch FROM now() - i.updated_at) / 86400.0 / $10::float8)
               + 0.5 * (1 - exp(-i.access_count / 10.0))
           ) AS final
    FROM fused f
    JOIN parts p ON p.id = f.id
    JOIN items i ON i.tenant_id = p.tenant_id AND i.id = p.item_id
    WHERE p.tenant_id = $1
    ORDER BY final DESC, f.id
    LIMIT $11 OFFSET $12
)
SELECT s.*,
       ts_headline('english', s.text, (SELECT query FROM q),
                   'MaxFragments=2, MaxWords=30, MinWords=10, StartSel=<<, StopSel=>>') AS snippet
FROM scored s
ORDER BY s.final DESC, s.id;

-- name: touch_items
UPDATE items SET access_count = access_count + 1, accessed_at = now()
WHERE tenant_id = $1 AND id = ANY($2::text[]);
