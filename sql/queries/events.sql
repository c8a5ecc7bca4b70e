-- Sessions and their events (migration 0011). $1 is always the tenant.

-- A write to a session creates it with the writer's scope, or finds it; the caller compares
-- the scope it returns with its own (a session's scope never changes).
-- name: upsert_session
INSERT INTO sessions (tenant_id, id, user_id, agent_id, visibility)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant_id, id) DO UPDATE SET last_write_at = now()
RETURNING user_id, agent_id, visibility, extracted_seq, ended_at, (xmax = 0) AS created;

-- The session's latest events before a write: the turns a new event may answer.
-- name: latest
SELECT event_id, role, sender_name, content, created_at
FROM events WHERE tenant_id = $1 AND session_id = $2
ORDER BY created_at DESC, seq DESC LIMIT $3;

-- The batch's events, and the session's counts, in one statement.
-- name: insert_many
WITH inserted AS (
    INSERT INTO events (tenant_id, session_id, event_id, user_id, agent_id, visibility, role,
                        sender_id, sender_name, type, content, media_item_id, created_at,
                        trace_id, span_id, parent_span_id, metadata, search_text, embed_text,
                        content_hash)
    SELECT $1, $2, e.event_id, $3, $4, $5, e.role, e.sender_id, e.sender_name, e.type, e.content,
           e.media_item_id, e.created_at, e.trace_id, e.span_id, e.parent_span_id, e.metadata,
           e.search_text, e.embed_text, e.content_hash
    FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                $12::text[], $13::timestamptz[], $14::text[], $15::text[], $16::text[],
                $17::jsonb[], $18::text[], $19::text[], $20::text[])
         AS e(event_id, role, sender_id, sender_name, type, content, media_item_id, created_at,
              trace_id, span_id, parent_span_id, metadata, search_text, embed_text, content_hash)
    ON CONFLICT (tenant_id, session_id, event_id) DO NOTHING
    RETURNING seq, event_id
),
counted AS (
    UPDATE sessions
    SET events = events + (SELECT count(*) FROM inserted),
        first_event_at = least(first_event_at, $21),
        last_event_at = greatest(last_event_at, $22),
        ended_at = CASE WHEN $23 THEN coalesce(ended_at, now()) ELSE ended_at END
    WHERE tenant_id = $1 AND id = $2
)
SELECT seq, event_id FROM inserted;

-- The job that embeds a batch's events and the operation that follows it, in one statement.
-- name: embed_job
WITH job AS (
    INSERT INTO jobs (id, tenant_id, kind, status, max_attempts, payload)
    VALUES ($1, $2, 'embed_memory', 'queued', $3, $4)
    RETURNING id
)
INSERT INTO operations (tenant_id, kind, job_id, session_id, scope, key_id)
SELECT $2, 'embed', job.id, $5, $6, $7 FROM job
RETURNING id;

-- name: get_session
SELECT s.*,
       (SELECT count(*) FROM events e
        WHERE e.tenant_id = s.tenant_id AND e.session_id = s.id AND e.embedding IS NULL)
           AS unembedded
FROM sessions s
WHERE s.tenant_id = $1 AND s.id = $2
  AND scope_visible(s.visibility, s.user_id, s.agent_id, $3, $4);

-- Sessions a reader may see, most recently written first, after the cursor ($4, $5).
-- name: list_sessions
SELECT s.*, 0::bigint AS unembedded
FROM sessions s
WHERE s.tenant_id = $1 AND scope_visible(s.visibility, s.user_id, s.agent_id, $2, $3)
  AND ($4::timestamptz IS NULL OR (s.last_write_at, s.id) < ($4, $5::text))
ORDER BY s.last_write_at DESC, s.id DESC
LIMIT $6;

-- A page of a session's events in order, after the cursor (created_at, seq).
-- name: page
SELECT e.*
FROM events e
WHERE e.tenant_id = $1 AND e.session_id = $2
  AND ($3::timestamptz IS NULL OR e.created_at >= $3)
  AND ($4::timestamptz IS NULL OR (e.created_at, e.seq) > ($4, $5::bigint))
ORDER BY e.created_at, e.seq
LIMIT $6;

-- The session's last turns, oldest first: the recent part of a context.
-- name: recent
SELECT * FROM (
    SELECT e.* FROM events e
    WHERE e.tenant_id = $1 AND e.session_id = $2
    ORDER BY e.created_at DESC, e.seq DESC LIMIT $3) r
ORDER BY created_at, seq;

-- name: trace
SELECT e.*
FROM events e
WHERE e.tenant_id = $1 AND e.trace_id = $2
  AND scope_visible(e.visibility, e.user_id, e.agent_id, $3, $4)
ORDER BY e.created_at, e.seq
LIMIT 10000;

-- name: delete_session
DELETE FROM sessions s
WHERE s.tenant_id = $1 AND s.id = $2
  AND scope_visible(s.visibility, s.user_id, s.agent_id, $3, $4)
RETURNING s.events;

-- name: for_embedding
SELECT seq, embed_text AS text, content_hash
FROM events WHERE tenant_id = $1 AND seq = ANY ($2::bigint[]) AND embedding IS NULL;

-- name: set_embedding
UPDATE events
SET embedding = $3, embedding_model = $4,
    terms = bm25_terms(to_tsvector('english', search_text))
WHERE tenant_id = $1 AND seq = $2;

-- Extraction reads the events past the watermark, in order.
-- name: unextracted
SELECT seq, session_id, event_id, role, sender_name, content, created_at
FROM events
WHERE tenant_id = $1 AND session_id = $2 AND seq > $3
ORDER BY seq LIMIT $4;
