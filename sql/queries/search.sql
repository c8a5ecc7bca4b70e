-- Hybrid search in one round trip.
--
-- Candidates: the HNSW index's nearest parts (iterative scans keep a filter exact) and the
-- best BM25 parts among those that contain one of the query's rarest words (the GIN index
-- keyed by tenant and word, migration 0007, read through `rare_keys`; the rarest words
-- whose document frequencies add up to at most $15, at least one that occurs: a
-- part with none of them cannot outscore one that has them by much, and the candidate set
-- stays small whatever common words the query holds; in a hybrid search whose rarest word
-- alone has more postings than that, the parts holding both of the two rarest words, see
-- `pair_keys`). Each side scores its candidates on both sides as it finds them, cosine similarity and BM25 (`terms <#> weights`, see
-- migration 0005), so a part found by one side is not penalised for being missing from the
-- other and no candidate is fetched twice; the scores are fused by search_fused() into
-- [0, 1] and blended with recency and use by search_final().
--
-- The blend moves a final score by at most `blend` (both signals lie in [0, 1]), so a
-- candidate whose fused score cannot reach the page's last place even with full signals is
-- dropped before its item is looked up (`bar`); only the page's parts are read again, for
-- their text and snippet.
--
-- Filters: a filter on tags alone (mode 3) is applied to the tags each part carries
-- (migration 0008): when few parts pass, both sides rank exactly those parts, read from the
-- tags index (faster than an index scan that would have to skip most of what it finds);
-- when many do, the HNSW scan checks each candidate's tags, and iterative scans keep going
-- until enough pass (see `tag_plan`). Any other filter needs the items: pipeline/search.py
-- first lists the items that pass (filtered_items); when they are few, the vector side ranks
-- exactly those items' parts (mode 1); when they are many, the HNSW scan checks each
-- candidate's item (mode 2). That check is a scalar sub-select on purpose: written as
-- EXISTS, Postgres hashes it, which means checking every item of the tenant first. The
-- statement runs with a generic plan (see search.py), so every option is a parameter that
-- switches a branch on or off at run time.
--
-- $1 tenant, $2 query text, $3 query vector, $4 candidates per side, $5 alpha (vector
-- weight), $6 use vectors, $7 use full text, $8 k (rrf), $9 blend, $10 recency half-life
-- (days), $11 limit, $12 offset, $13 the query embedder (provider:model: vectors are compared
-- with the query only when the same embedder made them, in the current column or the one a
-- reindex to it is building), $14 fusion ('score' or 'rrf'), $15 postings budget of the
-- full-text candidates, $16 filter mode (0 none, 1 only the items in $17, 2 check each
-- candidate's item against $18-$25, the filter as search_item_matches() takes it, 3 the
-- parts' tags against $27), $17 item ids, $26 one result per item (its best part), $27 the
-- tag filter as a jsonpath under the tenant's key, $28 MEMMILL_SEARCH_EXACT_PARTS (the
-- least bound on the parts a tag filter ranks exactly, see `tag_plan`), $29 the tag filter
-- as {key: [values]}, for the tag statistics.
-- name: hybrid
WITH terms AS (
    SELECT u.lexeme, lexeme_dim(u.lexeme) AS dim, coalesce(s.parts, 0) AS df
    FROM unnest(to_tsvector('english', $2)) u
    LEFT JOIN lexeme_stats s ON s.tenant_id = $1 AND s.lexeme = u.lexeme
),
corpus AS (
    SELECT greatest((SELECT parts FROM text_stats WHERE tenant_id = $1),
                    (SELECT max(df) FROM terms), 0) AS n
),
q AS (
    SELECT
        (SELECT ('{' || string_agg(dim || ':' || idf, ',' ORDER BY dim)
                 || '}/268435456')::sparsevec
         FROM (SELECT t.dim, sum(ln(1 + (c.n - t.df + 0.5) / (t.df + 0.5))) AS idf
               FROM terms t, corpus c GROUP BY t.dim) w) AS weights,
        (SELECT string_agg(tsquery_literal(lexeme), ' | ')::tsquery FROM terms) AS every_word,
        (SELECT array_agg(lexeme) FROM terms) AS lexemes,
        'MaxFragments=1, MaxWords=30, MinWords=10, StartSel=<<, StopSel=>>' AS headline,
        -- `present`: how many of the words so far occur in the tenant's parts. Words that
        -- occur nowhere cost nothing and come along; of the others, at least the rarest.
        (SELECT array_agg($1 || ' ' || lexeme)
         FROM (SELECT lexeme,
                      sum(df) OVER (ORDER BY df, lexeme) AS postings,
                      count(*) FILTER (WHERE df > 0) OVER (ORDER BY df, lexeme) AS present
               FROM terms) rarest
         WHERE present <= 1 OR postings <= $15) AS rare_keys,
        -- Conjunctive first: in a hybrid search, when even the rarest word has more postings
        -- than the budget, the parts holding both of the two rarest words, which the index
        -- intersects before a row is read. A part holding one of them alone can still come
        -- from the vector side, which BM25-scores its candidates too.
        (SELECT array_agg($1 || ' ' || lexeme)
         FROM (SELECT lexeme, df FROM terms WHERE df > 0 ORDER BY df, lexeme LIMIT 2) two
         WHERE $6
         HAVING count(*) = 2 AND min(df) > $15) AS pair_keys
),
ix AS (
    SELECT coalesce(model, $13) = $13 AS current,
           next_model IS NOT DISTINCT FROM $13 AS next
    FROM embedding_index
),
listed AS MATERIALIZED (
    SELECT unnest($17::text[]) AS id WHERE $16 = 1
),
-- A filter on tags alone (mode 3) ranks its parts exactly when at most `exact_parts` pass:
-- the larger of $28 (MEMMILL_SEARCH_EXACT_PARTS; 0 always checks) and 16·√(the tenant's
-- parts), which at 100k parts is about where the two ways cost the same
-- (benchmarks/filter_paths.py); when more pass, ranking them all costs more than checking
-- HNSW candidates one by one. A filter that the tag statistics say is broader goes straight
-- to the HNSW check.
tag_plan AS (
    SELECT b.exact_parts, search_tag_estimate($1, $29::jsonb) <= b.exact_parts AS narrow
    FROM (SELECT CASE WHEN $28::bigint = 0 THEN 0
                      ELSE greatest($28::bigint, (16 * sqrt(coalesce(
                               (SELECT parts FROM text_stats WHERE tenant_id = $1), 0)))::bigint)
                 END AS exact_parts) b
    WHERE $16 = 3
),
-- The filter's parts, from the index of the parts' tags under the tenant's key (migration
-- 0008; $27 is the filter under that key), each scored on both sides as it is read, up to
-- one more than `exact_parts`: statistics lag behind the parts, and a filter that turns out
-- broader than they said is checked in the HNSW scan after all.
tagged AS MATERIALIZED (
    SELECT p.id, p.item_id,
           CASE WHEN NOT $6 THEN NULL
                WHEN (SELECT current FROM ix) THEN 1 - (p.embedding <=> $3)
                WHEN (SELECT next FROM ix) THEN 1 - (p.embedding_next <=> $3)
           END AS vector_score,
           -(p.terms <#> (SELECT weights FROM q)) AS fts_score
    FROM parts p
    WHERE $16 = 3 AND (SELECT narrow FROM tag_plan)
      AND p.tenant_tags @@ $27::jsonpath AND p.tenant_id + 0 = $1
    LIMIT (SELECT exact_parts + 1 FROM tag_plan)
),
-- Whether the filter's parts are ranked exactly: the listed items' (mode 1), or few enough
-- tagged parts (mode 3).
exact AS (
    SELECT $16 = 1 OR ($16 = 3 AND (SELECT narrow FROM tag_plan)
                       AND (SELECT count(*) FROM tagged) <= (SELECT exact_parts FROM tag_plan))
           AS yes
),
vec AS (
    (SELECT p.id, p.item_id, 1 - (p.embedding <=> $3) AS vector_score,
            -(p.terms <#> (SELECT weights FROM q)) AS fts_score
     FROM parts p
     WHERE $6 AND NOT (SELECT yes FROM exact) AND (SELECT current FROM ix) AND p.tenant_id = $1
       AND p.embedding IS NOT NULL
       AND ($16 = 0 OR ($16 = 3 AND p.tenant_tags @@ $27) OR ($16 = 2 AND (
               SELECT search_item_matches(i, $18, $19, $20, $21, $22, $23, $24, $25)
               FROM items i WHERE i.tenant_id = $1 AND i.id = p.item_id)))
     ORDER BY p.embedding <=> $3
     LIMIT $4)
    UNION ALL
    (SELECT p.id, p.item_id, 1 - (p.embedding_next <=> $3) AS vector_score,
            -(p.terms <#> (SELECT weights FROM q)) AS fts_score
     FROM parts p
     WHERE $6 AND NOT (SELECT yes FROM exact) AND (SELECT next FROM ix) AND p.tenant_id = $1
       AND p.embedding_next IS NOT NULL
       AND ($16 = 0 OR ($16 = 3 AND p.tenant_tags @@ $27) OR ($16 = 2 AND (
               SELECT search_item_matches(i, $18, $19, $20, $21, $22, $23, $24, $25)
               FROM items i WHERE i.tenant_id = $1 AND i.id = p.item_id)))
     ORDER BY p.embedding_next <=> $3
     LIMIT $4)
    UNION ALL
    -- A filter's listed items: their parts are ranked one by one, with no index to follow,
    -- so one branch serves both columns (as `fts` does); BM25 only for the candidates kept.
    (SELECT l.id, l.item_id, l.vector_score,
            -(l.terms <#> (SELECT weights FROM q)) AS fts_score
     FROM (SELECT p.id, p.item_id, p.terms,
                  1 - (CASE WHEN (SELECT current FROM ix) THEN p.embedding
                            ELSE p.embedding_next END <=> $3) AS vector_score
           FROM parts p
           WHERE $6 AND $16 = 1 AND ((SELECT current FROM ix) OR (SELECT next FROM ix))
             AND p.tenant_id = $1 AND p.item_id = ANY ($17::text[])
           ORDER BY vector_score DESC NULLS LAST
           LIMIT $4) l
     WHERE l.vector_score IS NOT NULL)
    UNION ALL
    (SELECT t.id, t.item_id, t.vector_score, t.fts_score
     FROM tagged t
     WHERE $6 AND $16 = 3 AND (SELECT yes FROM exact) AND t.vector_score IS NOT NULL
     ORDER BY t.vector_score DESC, t.id
     LIMIT $4)
),
fts AS (
    (SELECT p.id, p.item_id,
           CASE WHEN NOT $6 THEN NULL
                WHEN (SELECT current FROM ix) THEN 1 - (p.embedding <=> $3)
                WHEN (SELECT next FROM ix) THEN 1 - (p.embedding_next <=> $3)
           END AS vector_score,
           -(p.terms <#> q.weights) AS fts_score
    FROM parts p, q
    -- The keys hold the tenant, so the index alone finds only this tenant's parts; the
    -- tenant test stays as a check on each row, written `+ 0` so that it is not an index
    -- condition: as one, the generic plan of a database with several tenants ANDs the
    -- keys' few postings with a bitmap of every part of the tenant (parts_tenant), 10 ms
    -- at 100k parts.
    WHERE $7 AND NOT ($16 = 3 AND (SELECT yes FROM exact))
      AND (tenant_lexemes(p.tenant_id, p.tsv)
               && CASE WHEN q.pair_keys IS NULL THEN q.rare_keys END
           OR tenant_lexemes(p.tenant_id, p.tsv) @> q.pair_keys)
      AND p.tenant_id + 0 = $1
      AND ($16 = 0
           OR ($16 = 1 AND p.item_id IN (SELECT id FROM listed))
           OR ($16 = 3 AND p.tenant_tags @@ $27)
           OR ($16 = 2 AND (
                   SELECT search_item_matches(i, $18, $19, $20, $21, $22, $23, $24, $25)
                   FROM items i WHERE i.tenant_id = $1 AND i.id = p.item_id)))
    ORDER BY fts_score DESC NULLS LAST, p.id
    LIMIT $4)
    UNION ALL
    -- A tag filter's parts ranked exactly: every one holding a query word, not only the
    -- rarest words' postings.
    (SELECT t.id, t.item_id, t.vector_score, t.fts_score
     FROM tagged t
     WHERE $7 AND $16 = 3 AND (SELECT yes FROM exact) AND t.fts_score > 0
     ORDER BY t.fts_score DESC, t.id
     LIMIT $4)
),
scored AS (
    SELECT DISTINCT ON (c.id) c.id, c.item_id, c.vector_score,
           CASE WHEN $7 THEN nullif(c.fts_score, 0) END AS fts_score
    FROM (SELECT * FROM vec UNION ALL SELECT * FROM fts) c
    ORDER BY c.id
),
ranked AS (
    SELECT s.*,
           CASE WHEN s.vector_score IS NOT NULL THEN
               row_number() OVER (ORDER BY s.vector_score DESC NULLS LAST, s.id) END
               AS vector_rank,
           CASE WHEN s.fts_score IS NOT NULL THEN
               row_number() OVER (ORDER BY s.fts_score DESC NULLS LAST, s.id) END AS fts_rank,
           max(s.vector_score) OVER () AS vector_max,
           max(s.fts_score) OVER () AS fts_max,
           count(s.vector_score) OVER () AS vector_count,
           count(s.fts_score) OVER () AS fts_count
    FROM scored s
),
fused AS (
    SELECT r.id, r.item_id, r.vector_score, r.fts_score, r.vector_rank, r.fts_rank,
           search_fused($14, $5, $8, r.vector_score, r.vector_max, r.vector_rank,
                        r.vector_count, r.fts_score, r.fts_max, r.fts_rank, r.fts_count) AS fused,
           CASE WHEN $26 THEN r.item_id ELSE r.id::text END AS grp
    FROM ranked r
),
-- The lowest final score the page's last place can have: the (limit + offset)-th best fused
-- score (of a part, or of an item's best part) with no signals at all.
bar AS (
    SELECT (1 - $9::float8) * coalesce((
        SELECT best FROM (SELECT max(fused) AS best FROM fused GROUP BY grp) g
        ORDER BY best DESC OFFSET $11::bigint + $12::bigint - 1 LIMIT 1), 0) AS final
),
final AS (
    SELECT f.*, i.title, i.summary, i.tags, i.version, i.kind,
           search_final(f.fused, $9, extract(epoch FROM now() - i.updated_at) / 86400.0, $10,
                        i.access_count) AS final
    FROM fused f
    CROSS JOIN LATERAL (SELECT * FROM items
                        WHERE tenant_id = $1 AND id = f.item_id LIMIT 1) i
    WHERE (1 - $9) * f.fused + $9 >= (SELECT final FROM bar)
),
grouped AS (
    SELECT DISTINCT ON (grp) *
    FROM final
    ORDER BY grp, final DESC, id
),
page AS (
    SELECT * FROM grouped ORDER BY final DESC, id LIMIT $11 OFFSET $12
)
SELECT page.id, page.item_id, p.position, p.text, page.vector_score, page.fts_score,
       page.vector_rank, page.fts_rank, page.fused, page.title, page.summary, page.tags,
       page.version, page.kind, page.final, (SELECT yes FROM exact) AS filter_exact,
       CASE WHEN q.every_word IS NULL THEN left(p.text, 240)
            WHEN strpos(near.snippet, '<<') > 0 THEN near.snippet
            ELSE ts_headline('english', p.text, q.every_word, q.headline)
       END AS snippet
FROM page
JOIN parts p ON p.id = page.id
CROSS JOIN q
-- ts_headline parses and stems all the text it is given, about 0.1 ms for a whole part, so it
-- first gets the 240 characters around the earliest place where a query lexeme (a stem, so
-- mostly the start of the word as written) appears, and the whole part only when that
-- stretch holds no match. On SciFact that took 0.4 of the time and gave the same snippet
-- about half the time, as long and with 2% fewer highlighted words in all.
CROSS JOIN LATERAL (
    SELECT ts_headline('english',
                       substr(p.text, greatest(min(nullif(strpos(p.text, l.lexeme), 0)) - 40, 1),
                              240),
                       q.every_word, q.headline) AS snippet
    FROM unnest(q.lexemes) l (lexeme)
) near
ORDER BY page.final DESC, page.id;

-- The items that pass a search's filters ($2-$9 as search_item_matches() takes them) when
-- they are few enough to rank their parts exactly, with that number (`few`); one more than
-- that when they are not. Exact ranking reads every part that passes, while checking HNSW
-- candidates one by one reads about (candidates / the share that passes) of them, so the two
-- cost the same when about √(c·parts) parts pass: few is the larger of $10
-- (MEMMILL_SEARCH_EXACT_ITEMS) and 8·√(the tenant's parts), which at 100k parts put the
-- switch where the two measured the same (about 2,500 items). $10 = 0 always checks. Run on a
-- pool that plans each call (not the search pool), so the GIN index on tags or the key
-- answers it. One row holding one array: a row per item cost 0.2 ms more at 453 items (of
-- 1.9 ms in all).
-- name: filtered_items
WITH few AS (
    SELECT CASE WHEN $10::bigint = 0 THEN 0
                ELSE greatest($10::bigint, (8 * sqrt(coalesce(
                         (SELECT parts FROM text_stats WHERE tenant_id = $1), 0)))::bigint)
           END AS n
)
SELECT coalesce((SELECT array_agg(passing.id)
                 FROM (SELECT i.id FROM items i
                       WHERE i.tenant_id = $1
                         AND search_item_matches(i, $2, $3, $4, $5, $6, $7, $8, $9)
                       LIMIT (SELECT n + 1 FROM few)) passing),
                '{}') AS ids,
       few.n AS few
FROM few;

-- name: touch_items
UPDATE items SET access_count = access_count + 1, accessed_at = now()
WHERE tenant_id = $1 AND id = ANY ($2::text[]);
