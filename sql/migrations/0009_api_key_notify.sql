-- The API keeps the tenants of the keys it has checked (pipeline/key_cache.py), so most
-- requests skip the round trip that checks their key. It must hear of every change that can
-- make a key stop working, at once rather than when its entry expires: a revocation, a new
-- hash or tenant, a deleted key or tenant (ON DELETE CASCADE deletes its keys), a TRUNCATE.
-- Statement-level, with no payload: such changes are rare and the cache forgets everything.
-- last_used_at, which authenticate() writes once a minute, is not among the columns.
CREATE FUNCTION notify_api_keys_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('memmill_api_keys', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_changed
AFTER UPDATE OF key_hash, tenant_id, revoked_at OR DELETE OR TRUNCATE ON api_keys
FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys_changed();
