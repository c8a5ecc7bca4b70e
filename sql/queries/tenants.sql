-- name: upsert_tenant
INSERT INTO tenants (name) VALUES ($1)
ON CONFLICT (name) WHERE status <> 'deleted' DO UPDATE SET name = EXCLUDED.name
RETURNING id;

-- name: insert_api_key
INSERT INTO api_keys (tenant_id, prefix, key_hash, name, role, user_id, agent_id, expires_at,
                      created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (key_hash) DO NOTHING
RETURNING id;

-- The key's id, tenant, role and binding, if the key is neither revoked nor expired and its
-- tenant is active. last_used_at is written at most once a minute: every request of a tenant
-- checks the same key row, and a write each time made concurrent requests queue on it.
-- name: authenticate
WITH key AS (
    SELECT k.id, k.tenant_id, k.role, k.name, k.user_id, k.agent_id, k.expires_at,
           k.last_used_at
    FROM api_keys k JOIN tenants t ON t.id = k.tenant_id AND t.status = 'active'
    WHERE k.key_hash = $1 AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > now())
), used AS (
    UPDATE api_keys k SET last_used_at = now()
    FROM key
    WHERE k.id = key.id
      AND (key.last_used_at IS NULL OR key.last_used_at < now() - interval '1 minute')
)
SELECT id, tenant_id, role, name, user_id, agent_id, expires_at FROM key;
