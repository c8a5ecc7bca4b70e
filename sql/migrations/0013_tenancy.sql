-- Hosting many tenants: a key has a role and may be bound to a user and/or an agent; a key can
-- expire (the old key of a rotation keeps working for a grace period, then is refused); a tenant
-- can be suspended (its keys refused at once) and erased (a job removes every row of it, then
-- recounts, and leaves a tombstone with the report).

-- Roles, from least to most: read (reads only), write (reads and writes the tenant's data),
-- admin (also the tenant's keys, webhooks, audit log, export and import), operator (every
-- tenant: tenants, queues, the dashboard across tenants, /metrics). The two booleans of
-- migrations 0010 and 0012 become functions of the role, so every query that reads them stays.
ALTER TABLE api_keys ADD COLUMN role text NOT NULL DEFAULT 'admin'
    CHECK (role IN ('operator', 'admin', 'write', 'read'));
UPDATE api_keys SET role = CASE WHEN operator THEN 'operator' WHEN read_only THEN 'read'
                                ELSE 'admin' END;

DROP TRIGGER api_keys_changed ON api_keys;
ALTER TABLE api_keys DROP COLUMN operator, DROP COLUMN read_only;
ALTER TABLE api_keys
    ADD COLUMN operator  boolean GENERATED ALWAYS AS (role = 'operator') STORED,
    ADD COLUMN read_only boolean GENERATED ALWAYS AS (role = 'read') STORED,
    -- A bound key acts as this user and/or agent whatever a request names (api/binding.py).
    ADD COLUMN user_id    text,
    ADD COLUMN agent_id   text,
    -- Refused from this time on: the old key of a rotation, or a key made to expire.
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN rotated_to bigint REFERENCES api_keys (id) ON DELETE SET NULL,
    ADD COLUMN created_by bigint REFERENCES api_keys (id) ON DELETE SET NULL;
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at DESC);

-- Suspended: every key of the tenant is refused, its data kept. Deleting: refused, and the
-- erasure job is removing its rows. Deleted: a tombstone holding the erasure's report; the
-- name may be used again by a new tenant.
ALTER TABLE tenants
    ADD COLUMN status     text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'suspended', 'deleting', 'deleted')),
    ADD COLUMN status_at  timestamptz,
    ADD COLUMN erasure    jsonb;
ALTER TABLE tenants DROP CONSTRAINT tenants_name_key;
CREATE UNIQUE INDEX tenants_live_name ON tenants (name) WHERE status <> 'deleted';

-- Every change that can make a key stop working (or start) must reach every API's key cache
-- at once: the key's own columns, and its tenant's status.
CREATE TRIGGER api_keys_changed
AFTER UPDATE OF key_hash, tenant_id, revoked_at, role, user_id, agent_id, expires_at
    OR DELETE OR TRUNCATE ON api_keys
FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys_changed();
CREATE TRIGGER tenants_changed
AFTER UPDATE OF status OR DELETE OR TRUNCATE ON tenants
FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys_changed();

-- The audit log records each action's result, and actions on tenants and keys from the CLI,
-- which acts through the API.
ALTER TABLE audit_log ADD COLUMN result text NOT NULL DEFAULT 'ok';
