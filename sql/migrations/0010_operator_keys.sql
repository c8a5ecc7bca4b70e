-- Operators see across tenants: the workers' hosts and pids, the whole queue's depth. A
-- tenant's key sees its own numbers only. The key memmill itself registers for
-- the default tenant (`memmill up`, `memmill migrate`: named 'bootstrap') is the operator's.
ALTER TABLE api_keys ADD COLUMN operator boolean NOT NULL DEFAULT false;

UPDATE api_keys SET operator = true WHERE name = 'bootstrap';

-- A key losing (or gaining) the operator's view must reach every API's key cache at once.
DROP TRIGGER api_keys_changed ON api_keys;
CREATE TRIGGER api_keys_changed
AFTER UPDATE OF key_hash, tenant_id, revoked_at, operator OR DELETE OR TRUNCATE ON api_keys
FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys_changed();
