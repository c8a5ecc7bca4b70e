-- Per-tenant limits (requests a minute, items, memories, stored bytes, jobs queued) and the
-- usage they are checked against (pipeline/quotas.py).
--
-- Usage is never counted when a write is checked: a count(*) over a tenant's 100k items took
-- milliseconds, and a counter row per tenant updated by every write would be one hot row all
-- of a tenant's writers wait on. As the job counts of migration 0012 do, each write of items,
-- sources, memories or events appends its change to tenant_usage_deltas (by row or by
-- statement, below); fold_tenant_usage() adds them up into tenant_usage, and a reader sums
-- both in one statement, so it is exact at its snapshot without waiting for a fold. The deltas
-- are indexed by tenant, so a check reads only its own tenant's unfolded rows, and a check
-- folds once its tenant has more than a few (pipeline/quotas.py), whoever else writes.
--
-- Stored bytes: what a tenant sent and memmill keeps, i.e. every version's source
-- (sources.byte_size: the text, the file, or a fetched document once regularize stored it),
-- and the content of memories and of events. What is derived from those (parts, vectors, the
-- events' search texts) grows with them and is not counted again.

-- NULL: the installation's default (MEMMILL_DEFAULT_LIMIT_*), itself unlimited unless set.
CREATE TABLE tenant_limits (
    tenant_id           bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    requests_per_minute bigint CHECK (requests_per_minute >= 0),
    items               bigint CHECK (items >= 0),
    memories            bigint CHECK (memories >= 0),
    bytes               bigint CHECK (bytes >= 0),
    jobs                bigint CHECK (jobs >= 0),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- No foreign key: a tenant's deletion cascades to its rows, whose negative deltas are folded
-- after the tenant is gone (a row that folds to zero is removed).
CREATE TABLE tenant_usage (
    tenant_id bigint PRIMARY KEY,
    items     bigint NOT NULL DEFAULT 0,
    memories  bigint NOT NULL DEFAULT 0,
    bytes     bigint NOT NULL DEFAULT 0
);

CREATE TABLE tenant_usage_deltas (
    tenant_id bigint NOT NULL,
    items     bigint NOT NULL DEFAULT 0,
    memories  bigint NOT NULL DEFAULT 0,
    bytes     bigint NOT NULL DEFAULT 0
);
CREATE INDEX tenant_usage_deltas_tenant ON tenant_usage_deltas (tenant_id);

-- What a recount finds: the truth the maintained usage must equal (tests/test_quotas.py).
CREATE VIEW tenant_usage_counted AS
SELECT tenant_id, sum(items)::bigint AS items, sum(memories)::bigint AS memories,
       sum(bytes)::bigint AS bytes
FROM (
    SELECT tenant_id, count(*) AS items, 0 AS memories, 0 AS bytes FROM items GROUP BY 1
    UNION ALL
    SELECT tenant_id, 0, 0, sum(byte_size) FROM sources GROUP BY 1
    UNION ALL
    SELECT tenant_id, 0, count(*), sum(octet_length(content)) FROM memories GROUP BY 1
    UNION ALL
    SELECT tenant_id, 0, 0, sum(octet_length(content)) FROM events GROUP BY 1
) c
GROUP BY tenant_id;

-- An item, its source and a memory are written one row per statement (a put, a memory add,
-- an extraction's decision): a row trigger adds one delta row for each, which cost a put about
-- half of what a statement trigger with its transition table did (0.07-0.17 ms against
-- 0.16-0.25 ms for an item and its source). Events are written 500 at a time, and deletes come
-- in bulk (a purge, a session, a forget batch, a tenant's erasure): statement triggers add one
-- delta row per statement and tenant for those, from the transition table.
CREATE FUNCTION usage_item_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, items) VALUES (NEW.tenant_id, 1);
    RETURN NULL;
END
$$;

CREATE FUNCTION usage_source_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, bytes) VALUES (NEW.tenant_id, NEW.byte_size);
    RETURN NULL;
END
$$;

CREATE FUNCTION usage_memory_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, memories, bytes)
    VALUES (NEW.tenant_id, 1, octet_length(NEW.content));
    RETURN NULL;
END
$$;

CREATE FUNCTION usage_items_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, items)
    SELECT tenant_id, -count(*) FROM old_rows GROUP BY 1;
    RETURN NULL;
END
$$;

CREATE FUNCTION usage_sources_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, bytes)
    SELECT tenant_id, -sum(byte_size) FROM old_rows GROUP BY 1;
    RETURN NULL;
END
$$;

CREATE FUNCTION usage_memories_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, memories, bytes)
    SELECT tenant_id, -count(*), -sum(octet_length(content)) FROM old_rows GROUP BY 1;
    RETURN NULL;
END
$$;

CREATE FUNCTION usage_of_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tenant_usage_deltas (tenant_id, bytes)
        SELECT tenant_id, sum(octet_length(content)) FROM new_rows GROUP BY 1;
    ELSE
        INSERT INTO tenant_usage_deltas (tenant_id, bytes)
        SELECT tenant_id, -sum(octet_length(content)) FROM old_rows GROUP BY 1;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_items_insert AFTER INSERT ON items
FOR EACH ROW EXECUTE FUNCTION usage_item_added();
CREATE TRIGGER usage_items_delete AFTER DELETE ON items REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION usage_items_removed();
CREATE TRIGGER usage_sources_insert AFTER INSERT ON sources
FOR EACH ROW EXECUTE FUNCTION usage_source_added();
CREATE TRIGGER usage_sources_delete AFTER DELETE ON sources REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION usage_sources_removed();
CREATE TRIGGER usage_memories_insert AFTER INSERT ON memories
FOR EACH ROW EXECUTE FUNCTION usage_memory_added();
CREATE TRIGGER usage_memories_delete AFTER DELETE ON memories REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION usage_memories_removed();
CREATE TRIGGER usage_events_insert AFTER INSERT ON events REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION usage_of_events();
CREATE TRIGGER usage_events_delete AFTER DELETE ON events REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION usage_of_events();

-- Updates, row by row behind a WHEN on the column that is counted: a source's size changes
-- when regularize stores a fetched document, a memory's content when it is edited. An update
-- that does not name the column (an access count, a vector) never calls the function.
CREATE FUNCTION usage_source_resized() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, bytes)
    VALUES (NEW.tenant_id, NEW.byte_size - OLD.byte_size);
    RETURN NULL;
END
$$;

CREATE FUNCTION usage_content_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_deltas (tenant_id, bytes)
    VALUES (NEW.tenant_id, octet_length(NEW.content) - octet_length(OLD.content));
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_sources_update AFTER UPDATE OF byte_size ON sources FOR EACH ROW
WHEN (OLD.byte_size IS DISTINCT FROM NEW.byte_size)
EXECUTE FUNCTION usage_source_resized();
CREATE TRIGGER usage_memories_update AFTER UPDATE OF content ON memories FOR EACH ROW
WHEN (OLD.content IS DISTINCT FROM NEW.content)
EXECUTE FUNCTION usage_content_changed();
CREATE TRIGGER usage_events_update AFTER UPDATE OF content ON events FOR EACH ROW
WHEN (OLD.content IS DISTINCT FROM NEW.content)
EXECUTE FUNCTION usage_content_changed();

-- TRUNCATE fires no DELETE trigger: count everything again, under the fold's lock so that a
-- fold under way does not add its deltas back after.
CREATE FUNCTION usage_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7314159267);
    DELETE FROM tenant_usage_deltas;
    DELETE FROM tenant_usage;
    INSERT INTO tenant_usage (tenant_id, items, memories, bytes)
    SELECT tenant_id, items, memories, bytes FROM tenant_usage_counted;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_items_truncate AFTER TRUNCATE ON items
FOR EACH STATEMENT EXECUTE FUNCTION usage_truncated();
CREATE TRIGGER usage_sources_truncate AFTER TRUNCATE ON sources
FOR EACH STATEMENT EXECUTE FUNCTION usage_truncated();
CREATE TRIGGER usage_memories_truncate AFTER TRUNCATE ON memories
FOR EACH STATEMENT EXECUTE FUNCTION usage_truncated();
CREATE TRIGGER usage_events_truncate AFTER TRUNCATE ON events
FOR EACH STATEMENT EXECUTE FUNCTION usage_truncated();

-- What is stored already when this migration runs.
INSERT INTO tenant_usage (tenant_id, items, memories, bytes)
SELECT tenant_id, items, memories, bytes FROM tenant_usage_counted;

-- Adds the deltas up; false, doing nothing, when another session is folding. A delta inserted
-- by a transaction not yet committed is not seen by the DELETE and stays for the next fold.
CREATE FUNCTION fold_tenant_usage() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    touched bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(7314159267) THEN
        RETURN false;
    END IF;
    WITH taken AS (DELETE FROM tenant_usage_deltas RETURNING *),
    folded AS (
        INSERT INTO tenant_usage AS u (tenant_id, items, memories, bytes)
        SELECT tenant_id, sum(items), sum(memories), sum(bytes) FROM taken GROUP BY 1
        ON CONFLICT (tenant_id) DO UPDATE
        SET items = u.items + EXCLUDED.items, memories = u.memories + EXCLUDED.memories,
            bytes = u.bytes + EXCLUDED.bytes
        RETURNING u.tenant_id
    )
    SELECT array_agg(tenant_id) INTO touched FROM folded;
    DELETE FROM tenant_usage
    WHERE tenant_id = ANY (touched) AND items = 0 AND memories = 0 AND bytes = 0;
    RETURN true;
END
$$;
