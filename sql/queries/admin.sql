-- Tenants and their keys, managed through the API (pipeline/keys.py, pipeline/tenant_admin.py)
-- and the tenant's erasure (pipeline/erasure.py). Keys are listed without their hashes.

-- name: get_key
SELECT id, tenant_id, prefix, name, role, user_id, agent_id, created_at, last_used_at,
       expires_at, revoked_at, rotated_to, created_by
FROM api_keys WHERE tenant_id = $1 AND id = $2;

-- Newest first, a page after the key id `$2` (NULL: the first page).
-- name: list_keys
SELECT id, tenant_id, prefix, name, role, user_id, agent_id, created_at, last_used_at,
       expires_at, revoked_at, rotated_to, created_by
FROM api_keys
WHERE tenant_id = $1 AND ($2::bigint IS NULL OR id < $2)
  AND ($3 OR (revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())))
ORDER BY id DESC LIMIT $4;

-- name: revoke_key
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE tenant_id = $1 AND id = $2
RETURNING id;

-- The old key of a rotation stops working at the end of its grace (or at once for 0 s), or
-- earlier if it was already to expire sooner.
-- name: retire_key
UPDATE api_keys
SET expires_at = least(coalesce(expires_at, 'infinity'), now() + make_interval(secs => $3)),
    rotated_to = $4
WHERE tenant_id = $1 AND id = $2
RETURNING expires_at;

-- name: lock_key
SELECT id, role, name, user_id, agent_id, revoked_at,
       expires_at IS NOT NULL AND expires_at <= now() AS expired
FROM api_keys WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: tenant
SELECT t.id, t.name, t.status, t.created_at, t.status_at, t.erasure,
       (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL
          AND (k.expires_at IS NULL OR k.expires_at > now())) AS active_keys
FROM tenants t WHERE t.id = $1;

-- name: lock_tenant
SELECT id, name, status FROM tenants WHERE id = $1 FOR UPDATE;

-- name: tenant_by_name
SELECT id FROM tenants WHERE name = $1 AND status <> 'deleted';

-- name: list_tenants
SELECT t.id, t.name, t.status, t.created_at, t.status_at, t.erasure,
       (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL
          AND (k.expires_at IS NULL OR k.expires_at > now())) AS active_keys
FROM tenants t
WHERE ($1::text IS NULL OR t.status = $1) AND ($2::bigint IS NULL OR t.id > $2)
ORDER BY t.id LIMIT $3;

-- name: insert_tenant
INSERT INTO tenants (name) VALUES ($1)
ON CONFLICT (name) WHERE status <> 'deleted' DO NOTHING
RETURNING id;

-- name: set_tenant_status
UPDATE tenants SET status = $2, status_at = now() WHERE id = $1
RETURNING id, name, status, created_at, status_at, erasure;

-- name: finish_erasure
UPDATE tenants SET status = 'deleted', status_at = now(), erasure = $2 WHERE id = $1;

-- Every table of ours with a tenant_id column: the erasure finds new tables by itself.
-- name: tenant_tables
SELECT c.table_name
FROM information_schema.columns c
JOIN information_schema.tables t
  ON t.table_schema = c.table_schema AND t.table_name = c.table_name
WHERE c.table_schema = current_schema() AND c.column_name = 'tenant_id'
  AND t.table_type = 'BASE TABLE'
ORDER BY c.table_name;

-- The tenant's jobs that may sit in Redis: the erasure removes their queue entries.
-- name: queued_jobs
SELECT id, attempts FROM jobs WHERE tenant_id = $1 AND status IN ('queued', 'running');

-- A page of the audit log, newest first. $1: one tenant's rows; $2: every row (an operator
-- naming no tenant). $3: an action, or a prefix ending in '.'.
-- name: audit_page
SELECT id, at, tenant_id, key_id, key_name, action, target, filter, affected, skipped, via,
       result
FROM audit_log
WHERE ($2 OR tenant_id = $1)
  AND ($3::text IS NULL OR action = $3 OR (right($3, 1) = '.' AND starts_with(action, $3)))
  AND ($4::timestamptz IS NULL OR at >= $4)
  AND ($5::bigint IS NULL OR id < $5)
ORDER BY id DESC LIMIT $6;
