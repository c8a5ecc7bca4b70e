-- Full-text candidates are a tenant's parts holding one of the query's rarest words. The GIN
-- index on tsv alone keeps one posting list per word for all tenants together, so a search
-- read every tenant's postings of its words and dropped the others' rows on the heap; and
-- once a database held a second tenant, the search statement's generic plan ANDed that
-- bitmap with one of every row of the tenant (parts_tenant): measured with a 10k-part tenant
-- beside a 100k-part one, a full-text search of the large tenant went from about 3 ms to
-- 16 ms. A GIN index over (tenant_id, tsv) (btree_gin) fixes the plan, but the tenant is then
-- a key of its own whose posting list holds every part of the tenant, and each scan
-- intersects the words' postings with it: 0.64 ms for 406 postings at 100k parts, against
-- 0.06 ms for the word alone.
--
-- So the index keys are the pairs themselves, "tenant lexeme": one posting list per tenant
-- and word, exactly the parts a search may read. The search asks for
-- `tenant_lexemes(tenant_id, tsv) && ARRAY['<tenant> <lexeme>', ...]` (array overlap, which
-- GIN answers without rechecking rows), the same expression as the index, so the planner
-- matches it. The function is IMMUTABLE: a part's tenant and text decide its keys. It costs
-- about 20 µs a part (measured at 100k parts), ten times the default a planner assumes of a
-- function, which told it that reading every part of a tenant and computing the keys was
-- about as cheap as the index.
CREATE FUNCTION tenant_lexemes(tenant_id bigint, tsv tsvector) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE COST 1000
RETURN ARRAY(SELECT tenant_id || ' ' || lexeme FROM unnest(tsv));

CREATE INDEX parts_tenant_lexemes ON parts USING gin (tenant_lexemes(tenant_id, tsv));
DROP INDEX parts_tsv;
