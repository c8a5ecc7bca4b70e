-- name: upsert_tenant
INSERT INTO tenants (name) VALUES ($1)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id;

-- name: insert_api_key
INSERT INTO api_keys (tenant_id, prefix, key_hash, name, operator, read_only)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (key_hash) DO NOTHING
RETURNING id;

-- The key's id, its tenant and whether it is an operator's. last_used_at is written at most
-- once a minute: every request of a tenant checks the same key row, and a write each time made
-- concurrent requests queue on it.
-- name: authenticate
WITH key AS (
    SELECT id, tenant_id, operator, read_only, name, last_used_at FROM api_keys
    WHERE key_hash = $1 AND revoked_at IS NULL
), used AS (
    UPDATE api_keys k SET last_used_at = now()
    FROM key
    WHERE k.id = key.id
      AND (key.last_used_at IS NULL OR key.last_used_at < now() - interval '1 minute')
)
SELECT id, tenant_id, operator, read_only, name FROM key;
