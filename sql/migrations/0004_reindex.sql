-- Reindexing without a mix of models. `model` names the embedder (provider:model) whose
-- vectors are in parts.embedding. While a reindex to `next_model` runs, the new vectors go to
-- parts.embedding_next, searched only by queries embedded with that same model; when every
-- part has one, a single transaction moves them into parts.embedding and `next_model` becomes
-- `model`. A query is never compared with vectors of another model.
CREATE TABLE embedding_index (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    model       text,
    next_model  text,
    started_at  timestamptz,
    finished_at timestamptz
);
INSERT INTO embedding_index DEFAULT VALUES;

ALTER TABLE parts ADD COLUMN embedding_next vector(384);
CREATE INDEX parts_embedding_next ON parts USING hnsw (embedding_next vector_cosine_ops);

-- Cache entries are keyed by provider and model now: the same model name can come from
-- different providers with different vectors. Existing entries came from the local model.
UPDATE embedding_cache SET model = 'local:' || model WHERE position(':' IN model) = 0;
