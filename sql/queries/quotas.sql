-- Per-tenant limits and usage (migration 0015; pipeline/quotas.py).

-- The limits an operator set for the tenant; NULL: the installation's default.
-- name: limits
SELECT requests_per_minute, items, memories, bytes, jobs, updated_at
FROM tenant_limits WHERE tenant_id = $1;

-- Sets the limits named in $7 to $2..$6 and keeps the others; no row when the tenant does not
-- exist. A new row starts with the others at NULL (the defaults).
-- name: set_limits
INSERT INTO tenant_limits AS l (tenant_id, requests_per_minute, items, memories, bytes, jobs)
SELECT t.id, $2, $3, $4, $5, $6 FROM tenants t WHERE t.id = $1
ON CONFLICT (tenant_id) DO UPDATE SET
    requests_per_minute = CASE WHEN 'requests_per_minute' = ANY ($7::text[])
                               THEN EXCLUDED.requests_per_minute ELSE l.requests_per_minute END,
    items = CASE WHEN 'items' = ANY ($7::text[]) THEN EXCLUDED.items ELSE l.items END,
    memories = CASE WHEN 'memories' = ANY ($7::text[]) THEN EXCLUDED.memories
                    ELSE l.memories END,
    bytes = CASE WHEN 'bytes' = ANY ($7::text[]) THEN EXCLUDED.bytes ELSE l.bytes END,
    jobs = CASE WHEN 'jobs' = ANY ($7::text[]) THEN EXCLUDED.jobs ELSE l.jobs END,
    updated_at = now()
RETURNING l.requests_per_minute, l.items, l.memories, l.bytes, l.jobs, l.updated_at;

-- name: tenant_exists
SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1);

-- A tenant's limits (its own, else the installation's defaults $2..$6) and, where they are
-- needed, its usage, in one statement. $7..$10 are what a write would add (items, memories,
-- bytes, jobs): usage is read only where a limit applies to something added, or everywhere
-- with $11 (GET /v1/usage). The CASE leaves a subquery it does not take unexecuted, so a
-- tenant without limits costs one primary-key read, and a look at no more than $12 of its
-- unfolded usage deltas: `unfolded` tells the caller when to fold them, limits or not.
-- stored: {items, memories, bytes}: the folded usage plus the deltas not folded yet, exact at
-- the statement's snapshot.
-- queued: {jobs waiting, queued (retrying ones included) or running, every tenant's unfolded
-- job delta rows}, from the job counts of migration 0012.
-- name: state
WITH l AS (
    SELECT coalesce(t.requests_per_minute, $2) AS requests_per_minute,
           coalesce(t.items, $3) AS items, coalesce(t.memories, $4) AS memories,
           coalesce(t.bytes, $5) AS bytes, coalesce(t.jobs, $6) AS jobs
    FROM (VALUES (true)) AS one (x) LEFT JOIN tenant_limits t ON t.tenant_id = $1::bigint
)
SELECT l.*,
       CASE WHEN $11::boolean OR (l.items IS NOT NULL AND $7::bigint > 0)
                 OR (l.memories IS NOT NULL AND $8::bigint > 0)
                 OR (l.bytes IS NOT NULL AND $9::bigint > 0) THEN (
           SELECT ARRAY[coalesce(sum(u.items), 0), coalesce(sum(u.memories), 0),
                        coalesce(sum(u.bytes), 0)]::bigint[]
           FROM (SELECT f.items, f.memories, f.bytes FROM tenant_usage f WHERE f.tenant_id = $1
                 UNION ALL
                 SELECT d.items, d.memories, d.bytes
                 FROM tenant_usage_deltas d WHERE d.tenant_id = $1) u)
       END AS stored,
       CASE WHEN $11::boolean OR (l.jobs IS NOT NULL AND $10::bigint > 0) THEN (
           SELECT ARRAY[(SELECT coalesce(sum(c.n), 0) FROM job_counts c
                         WHERE c.tenant_id = $1
                           AND c.status IN ('waiting', 'queued', 'retrying', 'running'))
                        + coalesce(sum(d.n) FILTER (
                              WHERE d.tenant_id = $1
                                AND d.status IN ('waiting', 'queued', 'retrying', 'running')), 0),
                        count(*)]::bigint[]
           FROM job_count_deltas d)
       END AS queued,
       (SELECT count(*) FROM (SELECT FROM tenant_usage_deltas d WHERE d.tenant_id = $1
                              LIMIT $12) AS seen)::integer AS unfolded
FROM l;

-- name: fold
SELECT fold_tenant_usage();

-- What a put of these ids would change: the items that exist, with what decides whether a
-- put of them is new content, new metadata or nothing.
-- name: existing_items
SELECT id, content_hash, tags, title FROM items WHERE tenant_id = $1 AND id = ANY ($2::text[]);
