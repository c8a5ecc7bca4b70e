-- Tenants whose parts changed since their last refresh (a part newer than the newest then),
-- or whose items did (their tags, for tag_stats: an item updated since, one probe of
-- items_updated, or one deleted), and whose refresh is older than $1 seconds and 20 times
-- what it took (so recounting a large corpus that keeps growing costs at most 5% of a core):
-- the newest part id is one probe of parts_tenant (tenant_id, id).
-- name: stale_tenants
SELECT t.id
FROM tenants t
LEFT JOIN text_stats s ON s.tenant_id = t.id
WHERE (s.tenant_id IS NULL
       OR s.refreshed_at < now() - make_interval(secs => greatest($1, 20 * s.refresh_s)))
  AND (EXISTS (SELECT 1 FROM parts p
               WHERE p.tenant_id = t.id AND p.id > coalesce(s.last_part_id, 0))
       OR EXISTS (SELECT 1 FROM items i
                  WHERE i.tenant_id = t.id AND i.updated_at > s.refreshed_at)
       OR s.items_deleted)
ORDER BY t.id;

-- One refresh at a time per tenant, across every worker; the others skip it.
-- name: try_lock_tenant
SELECT pg_try_advisory_xact_lock(731416, $1::integer);

-- Document frequencies of every lexeme of the tenant's parts, from one pass of ts_stat over
-- their tsvectors. Only changed counts are written, and vanished lexemes deleted, so a
-- refresh of a stable corpus writes little. The inner query is built from a bigint, not text.
-- name: refresh_lexemes
WITH fresh AS (
    SELECT word, ndoc
    FROM ts_stat(format('SELECT tsv FROM parts WHERE tenant_id = %s', $1::bigint))
), upserted AS (
    INSERT INTO lexeme_stats (tenant_id, lexeme, parts)
    SELECT $1, word, ndoc FROM fresh
    ON CONFLICT (tenant_id, lexeme) DO UPDATE SET parts = excluded.parts
    WHERE lexeme_stats.parts <> excluded.parts
)
DELETE FROM lexeme_stats s
WHERE s.tenant_id = $1 AND NOT EXISTS (SELECT 1 FROM fresh f WHERE f.word = s.lexeme);

-- How many parts carry each tag (key and value), counted from the items (a few to a page)
-- and their parts in the parts index, not from the parts' rows. Written as refresh_lexemes is.
-- name: refresh_tags
WITH per_item AS (
    SELECT item_id, count(*) AS parts FROM parts WHERE tenant_id = $1 GROUP BY item_id
), fresh AS (
    SELECT t.key, t.value, sum(n.parts) AS parts
    FROM items i
    JOIN per_item n ON n.item_id = i.id
    CROSS JOIN LATERAL jsonb_each_text(i.tags) t
    WHERE i.tenant_id = $1
    GROUP BY t.key, t.value
), upserted AS (
    INSERT INTO tag_stats (tenant_id, key, value, parts)
    SELECT $1, key, value, parts FROM fresh
    ON CONFLICT (tenant_id, key, value) DO UPDATE SET parts = excluded.parts
    WHERE tag_stats.parts <> excluded.parts
)
DELETE FROM tag_stats s
WHERE s.tenant_id = $1
  AND NOT EXISTS (SELECT 1 FROM fresh f WHERE f.key = s.key AND f.value = s.value);

-- Run in the recount's transaction: now() is when it began, so refresh_s covers the recount.
-- name: record_refresh
INSERT INTO text_stats (tenant_id, parts, last_part_id, refreshed_at, refresh_s)
SELECT $1, count(*), coalesce(max(id), 0), now(), extract(epoch FROM clock_timestamp() - now())
FROM parts WHERE tenant_id = $1
ON CONFLICT (tenant_id) DO UPDATE
SET parts = excluded.parts, last_part_id = excluded.last_part_id,
    refreshed_at = excluded.refreshed_at, refresh_s = excluded.refresh_s, items_deleted = false
RETURNING parts;

-- What GET /v1/jobs/stats shows: the last count, and whether parts arrived since.
-- name: state
SELECT s.parts, s.refreshed_at,
       NOT EXISTS (SELECT 1 FROM parts p
                   WHERE p.tenant_id = $1 AND p.id > coalesce(s.last_part_id, 0)) AS fresh
FROM (SELECT $1::bigint AS tenant_id) t
LEFT JOIN text_stats s ON s.tenant_id = t.tenant_id;
