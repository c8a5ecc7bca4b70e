-- name: upsert_tenant
INSERT INTO tenants (name) VALUES ($1)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id;

-- name: insert_api_key
INSERT INTO api_keys (tenant_id, prefix, key_hash, name) VALUES ($1, $2, $3, $4)
ON CONFLICT (key_hash) DO NOTHING
RETURNING id;

-- name: authenticate
UPDATE api_keys SET last_used_at = now()
WHERE key_hash = $1 AND revoked_at IS NULL
RETURNING tenant_id;
