-- Tenants whose parts changed since their last refresh (a part newer than the newest then),
-- and whose refresh is older than $1 seconds and 20 times what it took (so recounting a
-- large corpus that keeps growing costs at most 5% of a core): the newest part id is one
-- probe of parts_tenant (tenant_id, id). Deleted parts alone do not mark a tenant stale;
-- their words keep counting until the next change, which only flatters a rare word a little.
-- name: stale_tenants
SELECT t.id
FROM tenants t
LEFT JOIN text_stats s ON s.tenant_id = t.id
WHERE (s.tenant_id IS NULL
       OR s.refreshed_at < now() - make_interval(secs => greatest($1, 20 * s.refresh_s)))
  AND EXISTS (SELECT 1 FROM parts p
              WHERE p.tenant_id = t.id AND p.id > coalesce(s.last_part_id, 0))
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

-- Run in the recount's transaction: now() is when it began, so refresh_s covers the recount.
-- name: record_refresh
INSERT INTO text_stats (tenant_id, parts, last_part_id, refreshed_at, refresh_s)
SELECT $1, count(*), coalesce(max(id), 0), now(), extract(epoch FROM clock_timestamp() - now())
FROM parts WHERE tenant_id = $1
ON CONFLICT (tenant_id) DO UPDATE
SET parts = excluded.parts, last_part_id = excluded.last_part_id,
    refreshed_at = excluded.refreshed_at, refresh_s = excluded.refresh_s
RETURNING parts;

-- What GET /v1/jobs/stats shows: the last count, and whether parts arrived since.
-- name: state
SELECT s.parts, s.refreshed_at,
       NOT EXISTS (SELECT 1 FROM parts p
                   WHERE p.tenant_id = $1 AND p.id > coalesce(s.last_part_id, 0)) AS fresh
FROM (SELECT $1::bigint AS tenant_id) t
LEFT JOIN text_stats s ON s.tenant_id = t.tenant_id;
