-- Search over a reader's memories and events, in one round trip.
--
-- A reader's rows are few next to a tenant's (one user's memories and conversations), so both
-- sides rank them exactly: every visible row that passes the filters is a candidate, scored by
-- cosine similarity with the query (when its vector was made by the query's embedder) and by
-- BM25, whose document frequencies are counted among those same rows, so that a word is rare
-- or common for this reader's memory, not for the tenant's. The scores are fused as the
-- document search's 'score' fusion does (search_fused, migration 0005), and lifted by the
-- signals the design adds (pipeline/memory/recall.py says why each is general):
-- - people: a row spoken by (or, for a memory, naming) a person the query names;
-- - time: a row of a month or year the query names;
-- - session: an event takes a share of the best relevance in its session.
--
-- $1 tenant, $2 query text, $3 query vector, $4 reader user, $5 reader agent, $6 memories?,
-- $7 events?, $8 session filter, $9 types, $10 valid only, $11 as of, $12 min confidence,
-- $13 after, $14 before, $15 alpha, $16 embedder key, $17 use vectors, $18 the query's words (words_of, with a space
-- on either side), $19 people lift, $20 session share, $21 limit, $22 offset, $23 months the
-- query names, $24 years it names, $25 time lift, $26 most words weighed, $27 JSON the rows'
-- metadata must contain (jsonb @>; NULL: any), $28 expired memories too.
-- name: search
-- The query's first $26 distinct words: counting a word's rows costs a pass over the reader's
-- rows, and a long query (a context's default, two turns) would pay for every word of it.
WITH terms AS MATERIALIZED (
    SELECT u.lexeme, lexeme_dim(u.lexeme) AS dim,
           ('{' || lexeme_dim(u.lexeme) || ':1}/268435456')::sparsevec AS one
    FROM (SELECT lexeme FROM unnest(to_tsvector('english', $2))
          ORDER BY (SELECT min(p) FROM unnest(positions) p) LIMIT $26) u
),
mem AS MATERIALIZED (
    SELECT 'memory'::text AS kind, m.id::text AS id, m.id AS mid, NULL::text AS session_id,
           NULL::text AS event_id, NULL::bigint AS seq, m.terms,
           CASE WHEN $17 AND m.embedding_model = $16 THEN 1 - (m.embedding <=> $3) END AS vector_score,
           m.content AS text, NULL::text AS sender,
           coalesce(m.observed_at, m.created_at) AT TIME ZONE 'UTC' AS at
    FROM memories m
    WHERE $6 AND m.tenant_id = $1
      AND scope_visible(m.visibility, m.user_id, m.agent_id, $4, $5)
      AND ($8::text IS NULL OR m.session_id = $8)
      AND ($9::text[] IS NULL OR m.type = ANY ($9))
      AND (NOT $10 OR m.valid_until IS NULL OR m.valid_until > coalesce($11, now()))
      AND ($11::timestamptz IS NULL OR m.created_at <= $11)
      AND ($12::float8 IS NULL OR m.confidence >= $12)
      AND ($13::timestamptz IS NULL OR coalesce(m.observed_at, m.created_at) >= $13)
      AND ($14::timestamptz IS NULL OR coalesce(m.observed_at, m.created_at) < $14)
      AND ($27::jsonb IS NULL OR m.metadata @> $27)
      AND ($28 OR m.expires_at IS NULL OR m.expires_at > now())
),
ev AS MATERIALIZED (
    SELECT 'event'::text AS kind, e.session_id || '/' || e.event_id AS id, NULL::uuid AS mid,
           e.session_id,
           e.event_id, e.seq, e.terms,
           CASE WHEN $17 AND e.embedding_model = $16 THEN 1 - (e.embedding <=> $3) END AS vector_score,
           NULL::text AS text, e.sender_name AS sender,
           e.created_at AT TIME ZONE 'UTC' AS at
    FROM events e
    WHERE $7 AND e.tenant_id = $1
      AND scope_visible(e.visibility, e.user_id, e.agent_id, $4, $5)
      AND ($8::text IS NULL OR e.session_id = $8)
      AND ($11::timestamptz IS NULL OR e.created_at <= $11)
      AND ($13::timestamptz IS NULL OR e.created_at >= $13)
      AND ($14::timestamptz IS NULL OR e.created_at < $14)
      AND ($27::jsonb IS NULL OR e.metadata @> $27)
),
rows AS (
    SELECT * FROM mem UNION ALL SELECT * FROM ev
),
-- The people the query names: speakers of the reader's sessions whose name is in the query,
-- as whole words (words_of, migration 0011: the query's words come as $18). Worked out once
-- per distinct speaker, not per row.
named AS MATERIALIZED (
    SELECT sender, ' ' || words_of(sender) || ' ' AS words
    FROM (SELECT DISTINCT sender FROM ev WHERE sender IS NOT NULL) d
    WHERE position(' ' || words_of(sender) || ' ' IN $18) > 0
),
-- BM25's idf from the reader's own rows: how many hold each of the query's words. A row holds
-- a word when its term vector has the word's dimension (migration 0005): an inner product in C
-- per row and word, where matching the text search vector cost ten times as much; and only
-- rows holding any of the words (one inner product each, with all of them) are counted.
worded AS MATERIALIZED (
    SELECT r.terms FROM rows r
    WHERE (r.terms <#> (SELECT ('{' || string_agg(dim || ':1', ',' ORDER BY dim)
                                || '}/268435456')::sparsevec FROM (SELECT DISTINCT dim FROM terms) d)) < 0
),
stats AS MATERIALIZED (
    SELECT t.lexeme, t.dim, count(w.terms) FILTER (WHERE (w.terms <#> t.one) < 0) AS df,
           (SELECT count(*) FROM rows) AS n
    FROM terms t LEFT JOIN worded w ON true
    GROUP BY t.lexeme, t.dim
),
weights AS (
    SELECT ('{' || string_agg(dim || ':' || idf, ',' ORDER BY dim) || '}/268435456')::sparsevec AS w
    FROM (SELECT dim, sum(ln(1 + (n - df + 0.5) / (df + 0.5))) AS idf
          FROM stats WHERE df > 0 GROUP BY 1) x
),
scored AS (
    SELECT r.kind, r.id, r.mid, r.session_id, r.event_id, r.seq, r.vector_score,
           coalesce(-(r.terms <#> (SELECT w FROM weights)), 0) AS fts_score,
           CASE WHEN r.kind = 'event' THEN coalesce(r.sender IN (SELECT sender FROM named), false)
                ELSE EXISTS (SELECT 1 FROM named n
                             WHERE position(n.words IN ' ' || words_of(r.text) || ' ') > 0)
           END AS names_person,
           (($23::int[] IS NOT NULL OR $24::int[] IS NOT NULL)
            AND ($23::int[] IS NULL OR extract(month FROM r.at)::int = ANY ($23))
            AND ($24::int[] IS NULL OR extract(year FROM r.at)::int = ANY ($24))) AS names_time
    FROM rows r
),
fused AS (
    SELECT s.*,
           search_fused('score', $15::float8, 60, s.vector_score, max(s.vector_score) OVER (),
                        NULL, NULL, s.fts_score, max(s.fts_score) OVER (), NULL, NULL)
           * CASE WHEN s.names_person THEN 1 + $19::float8 ELSE 1 END
           * CASE WHEN s.names_time THEN 1 + $25::float8 ELSE 1 END AS relevance
    FROM scored s
),
lifted AS (
    SELECT f.*,
           f.relevance + CASE WHEN f.kind = 'event'
                              THEN $20::float8 * max(f.relevance) OVER (PARTITION BY f.kind, f.session_id)
                              ELSE 0 END AS score
    FROM fused f
),
page AS (
    SELECT * FROM lifted ORDER BY score DESC, kind, id LIMIT $21 OFFSET $22
)
SELECT p.kind, p.id, p.score, p.relevance, p.vector_score, p.fts_score, p.names_person,
       p.names_time,
       m.id AS memory_id, m.type, m.content AS memory_content, m.confidence, m.observed_at,
       m.valid_until, m.source_events, m.version, m.layer, m.source, m.user_id AS memory_user,
       m.agent_id AS memory_agent, m.visibility AS memory_visibility, m.pinned,
       m.created_at AS memory_created_at, coalesce(m.metadata, e.metadata) AS metadata,
       e.session_id, e.event_id, e.role, e.sender_name, e.content AS event_content,
       e.created_at AS event_created_at
FROM page p
LEFT JOIN memories m ON m.tenant_id = $1 AND m.id = p.mid
LEFT JOIN events e ON p.kind = 'event' AND e.tenant_id = $1 AND e.seq = p.seq
ORDER BY p.score DESC, p.kind, p.id;
