-- BM25 full text. Postgres' ts_rank knows nothing of how rare a word is, so a query's common
-- words weigh as much as its telling ones. BM25 is a sum over the query's terms of
-- idf(term) * tf_part(term), and that sum is an inner product: each part stores its tf side as
-- a sparse vector (one dimension per lexeme, by hash), each query brings its idf side, and
-- pgvector's `<#>` computes the score in C. Document frequencies come from `lexeme_stats`,
-- refreshed in the background (pipeline/text_stats.py).

-- A lexeme's dimension: 28 bits of its md5 (stable across Postgres versions, unlike
-- hashtext), one-based as sparsevec's text form wants. Some 100k lexemes collide a handful
-- of times in 2^28 dimensions; a collision adds two words' weights, which is harmless.
CREATE FUNCTION lexeme_dim(lexeme text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ('x' || substr(md5(lexeme), 1, 7))::bit(28)::integer + 1;

-- A lexeme as a tsquery literal: quotes and backslashes doubled, as tsquery input wants.
CREATE FUNCTION tsquery_literal(lexeme text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN '''' || replace(replace(lexeme, '\', '\\'), '''', '''''') || '''';

-- The part side of BM25 (k1 0.9, b 0.4, as Anserini's defaults): the saturated term
-- frequency tf·(k1+1) / (tf + k1·(1 - b + b·len/avglen)). The average length is a constant,
-- not the tenant's live figure, so that a part's vector never has to be rewritten: parts are
-- cut to at most `part_max_words` (160) words, which leave about 75 lexemes after stop words
-- (measured on SciFact), so lengths vary little and the constant stays close.
CREATE FUNCTION bm25_terms(tsv tsvector) RETURNS sparsevec
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    WITH terms AS (
        SELECT lexeme_dim(lexeme) AS dim, coalesce(array_length(positions, 1), 1) AS tf
        FROM unnest(tsv)
    ), length AS (
        SELECT coalesce(sum(tf), 0) AS len FROM terms
    ), weights AS (
        SELECT dim, sum(tf) AS tf FROM terms GROUP BY dim
    )
    SELECT (coalesce('{' || string_agg(
                dim || ':' || (tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * length.len / 75.0)))::real,
                ',' ORDER BY dim) || '}', '{}') || '/268435456')::sparsevec
    FROM weights, length;
END;

-- Computed from the text, not from `tsv`: a generated column cannot read another one.
ALTER TABLE parts ADD COLUMN terms sparsevec
    GENERATED ALWAYS AS (bm25_terms(to_tsvector('english', text))) STORED;

-- The sweeper asks "any part newer than the last refresh?" per tenant: (tenant_id, id)
-- answers that from the index's edge instead of a scan of the tenant's parts.
DROP INDEX parts_tenant;
CREATE INDEX parts_tenant ON parts (tenant_id, id);

-- Per tenant: how many parts there were and the newest one at the last refresh, and how
-- long that refresh took (the next waits at least 20 times as long: at most 5% of a core).
CREATE TABLE text_stats (
    tenant_id    bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    parts        bigint NOT NULL,
    last_part_id bigint NOT NULL,
    refreshed_at timestamptz NOT NULL DEFAULT now(),
    refresh_s    float8 NOT NULL DEFAULT 0
);

-- Per tenant and lexeme: in how many parts it occurs (BM25's document frequency).
CREATE TABLE lexeme_stats (
    tenant_id bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    lexeme    text NOT NULL,
    parts     integer NOT NULL,
    PRIMARY KEY (tenant_id, lexeme)
);

-- Fusion of the two sides of a hybrid search, in [0, 1] either way:
-- 'score': alpha · vector/max(vector) + (1 - alpha) · fts/max(fts), each side divided by its
--          best score among the candidates (a side with no score adds 0);
-- 'rrf':   (k + 1) · (alpha / (k + vector_rank) + (1 - alpha) / (k + fts_rank)), a missing
--          rank counting as that list's length + 1; (k + 1) is the inverse of the best score.
CREATE FUNCTION search_fused(
    fusion text, alpha float8, k float8,
    vector_score float8, vector_max float8, vector_rank bigint, vector_count bigint,
    fts_score float8, fts_max float8, fts_rank bigint, fts_count bigint
) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE fusion
    WHEN 'rrf' THEN (k + 1) * (
        alpha / (k + coalesce(vector_rank, vector_count + 1))
        + (1 - alpha) / (k + coalesce(fts_rank, fts_count + 1)))
    ELSE alpha * coalesce(greatest(vector_score, 0) / nullif(greatest(vector_max, 0), 0), 0)
        + (1 - alpha) * coalesce(greatest(fts_score, 0) / nullif(fts_max, 0), 0)
END;

-- The rerank blend: relevance first, then freshness (halved every half-life) and use (how
-- often the item was returned, saturating). Both signals lie in [0, 1] like the fused score.
CREATE FUNCTION search_final(
    fused float8, blend float8, age_days float8, half_life_days float8, access_count bigint
) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (1 - blend) * fused + blend * (
    0.5 * power(0.5, greatest(age_days, 0) / half_life_days)
    + 0.5 * (1 - exp(-access_count / 10.0)));

-- Whether an item passes a search's filters; NULL options do not filter. `tags` is a
-- jsonpath predicate over the item's tags (pipeline/search.py writes it: each key must have
-- one of its values), which the GIN index on tags answers. One definition for both ways a
-- search filters: listing the items that pass, and checking a vector candidate's item. It
-- holds no sub-select, so Postgres inlines it into the calling query, and `@@` stands bare
-- so the index can answer it (where it is unknown, the whole test is, which WHERE drops).
CREATE FUNCTION search_item_matches(
    item items, tags jsonpath, kinds text[], item_ids text[],
    created_after timestamptz, created_before timestamptz,
    updated_after timestamptz, updated_before timestamptz, valid_only boolean
) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN (tags IS NULL OR item.tags @@ tags)
   AND (kinds IS NULL OR item.kind = ANY (kinds))
   AND (item_ids IS NULL OR item.id = ANY (item_ids))
   AND (created_after IS NULL OR item.created_at >= created_after)
   AND (created_before IS NULL OR item.created_at < created_before)
   AND (updated_after IS NULL OR item.updated_at >= updated_after)
   AND (updated_before IS NULL OR item.updated_at < updated_before)
   AND (NOT valid_only OR item.status = 'ready');
