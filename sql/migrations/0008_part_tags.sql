-- Parts carry their item's tags, so that a tag filter finds its parts straight from an index.
-- Before, a search with a tag filter first listed the items that pass (GIN on items.tags),
-- then looked up each item's parts: at 100k parts a 1% filter listed 453 items, whose tags
-- sat on 453 heap pages, and probed the parts index 453 times, in a round trip of its own.
--
-- A part holds the tags under its tenant's id, `{"<tenant>": tags}`, for the reason migration
-- 0007 keys words by tenant: a tag many tenants use ({"lang": "en"}) would otherwise have one
-- posting list for all of them, and a search would read every tenant's parts of it and drop
-- the others' on the heap. jsonb_path_ops hashes each value with its whole path, so
-- `$."<tenant>"."lang" == "en"` finds exactly the tenant's parts tagged so. The key is stored,
-- not computed by an expression index: GIN's jsonb_path_ops keys are hashes, so every row it
-- finds is checked again, and building the object for that check cost 3 µs a row, five
-- times the check itself (a 1% filter's 1007 parts at 100k: 3.3 against 0.6 ms).
ALTER TABLE parts ADD COLUMN tenant_tags jsonb NOT NULL DEFAULT '{}'::jsonb;

-- What a part of this tenant stores for these tags (the one place that shape is written).
CREATE FUNCTION tenant_keyed_tags(tenant_id bigint, tags jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN jsonb_build_object(tenant_id::text, coalesce(tags, '{}'::jsonb));

-- Parts are written under their item's row lock (pipeline/runner.py), so an item's tags cannot
-- change between a part reading them here and the part's commit; FOR SHARE keeps that true
-- for any other writer too.
CREATE FUNCTION parts_take_item_tags() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.tenant_tags := tenant_keyed_tags(NEW.tenant_id, (
        SELECT tags FROM items WHERE tenant_id = NEW.tenant_id AND id = NEW.item_id FOR SHARE));
    RETURN NEW;
END
$$;
CREATE TRIGGER parts_item_tags BEFORE INSERT ON parts
    FOR EACH ROW EXECUTE FUNCTION parts_take_item_tags();

-- A change of tags alone keeps the item's parts (a new version without reprocessing), so
-- they take the new tags here. That writes a new row of each part, with its index entries
-- (HNSW's included).
CREATE FUNCTION items_pass_tags_to_parts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE parts SET tenant_tags = tenant_keyed_tags(NEW.tenant_id, NEW.tags)
    WHERE tenant_id = NEW.tenant_id AND item_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER items_tags_to_parts AFTER UPDATE OF tags ON items
    FOR EACH ROW WHEN (OLD.tags IS DISTINCT FROM NEW.tags)
    EXECUTE FUNCTION items_pass_tags_to_parts();

-- Per tenant and tag: how many parts carry it, recounted with the word statistics
-- (pipeline/text_stats.py). A search estimates from it how many parts a tag filter passes
-- before it reads them: ranking a broad filter's parts one by one costs more than checking
-- the HNSW candidates, and reading them only to learn that cost 25 ms for a 10% filter at
-- 100k parts (5,000 of them read, and each checked against the filter).
CREATE TABLE tag_stats (
    tenant_id bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key       text NOT NULL,
    value     text NOT NULL,
    parts     bigint NOT NULL,
    PRIMARY KEY (tenant_id, key, value)
);

-- How many of a tenant's parts a tag filter ({key: [values]}) passes, by tag_stats: a key
-- passes the parts of any of its values (their sum), and every key must pass (the fewest).
-- An upper bound when the statistics are fresh, as far as keys are independent.
CREATE FUNCTION search_tag_estimate(tenant_id bigint, filter jsonb) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
RETURN (SELECT coalesce(min(k.parts), 0)
        FROM (SELECT coalesce(sum(s.parts), 0) AS parts
              FROM jsonb_each(filter) f
              CROSS JOIN LATERAL jsonb_array_elements_text(f.value) v (value)
              LEFT JOIN tag_stats s
                     ON s.tenant_id = search_tag_estimate.tenant_id AND s.key = f.key
                    AND s.value = v.value
              GROUP BY f.key) k);

-- Retagged items mark their tenant's statistics stale by their updated_at; a deleted item
-- leaves nothing to see, so it sets this until the next recount.
ALTER TABLE text_stats ADD COLUMN items_deleted boolean NOT NULL DEFAULT false;

-- The parts stored so far. Every row is written again, so the HNSW index is dropped first and
-- built once at the end (inserting each vector again is far slower), and CLUSTER then rewrites
-- the table without the old rows and rebuilds the other indexes, as migration 0006 does.
DROP INDEX parts_embedding;
UPDATE parts p SET tenant_tags = tenant_keyed_tags(p.tenant_id, i.tags)
FROM items i
WHERE i.tenant_id = p.tenant_id AND i.id = p.item_id;
CLUSTER parts USING parts_pkey;
SET LOCAL maintenance_work_mem = '512MB';
CREATE INDEX parts_embedding ON parts USING hnsw (embedding vector_cosine_ops);
CREATE INDEX parts_tenant_tags ON parts USING gin (tenant_tags jsonb_path_ops);
