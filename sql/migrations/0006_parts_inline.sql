-- Keep each part in one heap tuple. A part row (text, tsvector, BM25 terms, a 384-d vector:
-- about 3.5 kB) is over the 2 kB at which Postgres starts moving values to the TOAST table,
-- and pgvector's types are stored EXTERNAL, so the vector went first: every cosine a search
-- computed outside the HNSW index (re-scoring a full-text candidate) and every snippet cost
-- a TOAST index lookup and a second heap fetch. Measured at 100k parts: 95% of vectors and
-- 60% of tsvectors were out of line, and a hybrid search spent a third of its time there.
-- Rows now stay whole up to the largest target Postgres allows; vectors stay inline (MAIN)
-- if a long part's row must give something up.
ALTER TABLE parts SET (toast_tuple_target = 8160);
ALTER TABLE parts
    ALTER COLUMN embedding SET STORAGE MAIN,
    ALTER COLUMN embedding_next SET STORAGE MAIN,
    ALTER COLUMN terms SET STORAGE MAIN;

-- The settings apply to rows written from now on; rewrite the rows already stored (and
-- rebuild the indexes) so that they follow them too. CLUSTER, unlike VACUUM FULL, may run in
-- the migration's transaction; it holds the table's lock until the rewrite ends.
CLUSTER parts USING parts_pkey;
