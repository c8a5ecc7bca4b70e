-- Export and import of a tenant's data (pipeline/transfer.py). $1 is always the tenant. An
-- export reads in one REPEATABLE READ snapshot, each table through a cursor in key order, so
-- a tenant of any size streams in bounded memory.

-- name: counts
SELECT (SELECT count(*) FROM memory_types WHERE tenant_id = $1) AS memory_type,
       (SELECT count(*) FROM items WHERE tenant_id = $1) AS item,
       (SELECT count(*) FROM item_versions WHERE tenant_id = $1) AS item_version,
       (SELECT count(*) FROM memories WHERE tenant_id = $1) AS memory,
       (SELECT count(*) FROM memory_history WHERE tenant_id = $1) AS memory_history,
       (SELECT count(*) FROM sessions WHERE tenant_id = $1) AS session,
       (SELECT count(*) FROM events WHERE tenant_id = $1) AS event;

-- name: memory_types
SELECT name, description, created_at FROM memory_types WHERE tenant_id = $1 ORDER BY name;

-- The size of each item's source, so its bytes are fetched a bounded batch at a time.
-- name: items
SELECT i.id, i.kind, i.uri, i.title, i.summary, i.tags, i.content_hash, i.version, i.status,
       i.error, i.created_at, i.updated_at, i.accessed_at, i.access_count,
       coalesce((SELECT s.byte_size FROM sources s
                 WHERE s.tenant_id = i.tenant_id AND s.item_id = i.id AND s.version = i.version),
                0) AS source_bytes
FROM items i WHERE i.tenant_id = $1
ORDER BY i.id;

-- name: item_versions
SELECT v.item_id, v.version, v.kind, v.uri, v.title, v.summary, v.tags, v.content_hash,
       v.created_at, v.archived_at,
       coalesce((SELECT s.byte_size FROM sources s
                 WHERE s.tenant_id = v.tenant_id AND s.item_id = v.item_id
                   AND s.version = v.version), 0) AS source_bytes
FROM item_versions v WHERE v.tenant_id = $1 AND v.item_id = ANY ($2::text[])
ORDER BY v.item_id, v.version;

-- What was ingested, per (item, version): a URL (its fetched bytes are not what was sent),
-- a file's bytes (not the text extracted from them), or the text itself.
-- name: sources
SELECT s.item_id, s.version, s.media_type, s.meta ->> 'filename' AS filename,
       s.meta ->> 'uri' AS uri,
       CASE WHEN s.meta ? 'uri' OR s.data IS NOT NULL THEN NULL ELSE s.content END AS content,
       CASE WHEN s.meta ? 'uri' THEN NULL ELSE s.data END AS data
FROM sources s
JOIN unnest($2::text[], $3::integer[]) AS k(item_id, version)
  ON s.item_id = k.item_id AND s.version = k.version
WHERE s.tenant_id = $1;

-- name: memories
SELECT id, user_id, agent_id, session_id, visibility, type AS memory_type, content, confidence,
       source, metadata, hints, pinned, observed_at, valid_until, invalid_reason, superseded_by,
       source_events, version, created_at, updated_at, access_count, accessed_at
FROM memories WHERE tenant_id = $1
ORDER BY id;

-- Who made a change is the exporting installation's (a key id, an operation id): left out.
-- name: memory_history
SELECT memory_id, version, operation, agent_id, old_content, new_content, changes, reason, at
FROM memory_history WHERE tenant_id = $1 AND memory_id = ANY ($2::uuid[])
ORDER BY memory_id, version;

-- Extraction's watermark is a sequence number of this installation; what moves is how many
-- of the session's events (in order) it covers.
-- name: sessions
SELECT s.id, s.user_id, s.agent_id, s.visibility, s.created_at, s.first_event_at,
       s.last_event_at, s.last_write_at, s.ended_at, s.summary,
       (SELECT count(*) FROM events e
        WHERE e.tenant_id = s.tenant_id AND e.session_id = s.id AND e.seq <= s.extracted_seq)
           AS extracted_events
FROM sessions s WHERE s.tenant_id = $1
ORDER BY s.id;

-- name: events
SELECT event_id, role, type AS event_type, sender_id, sender_name, content, media_item_id,
       created_at, received_at, trace_id, span_id, parent_span_id, metadata
FROM events WHERE tenant_id = $1 AND session_id = $2
ORDER BY seq;

-- Import: which of the file's ids the tenant holds already.
-- name: existing_items
SELECT id FROM items WHERE tenant_id = $1 AND id = ANY ($2::text[]) ORDER BY id;

-- name: existing_memories
SELECT id::text FROM memories WHERE tenant_id = $1 AND id = ANY ($2::uuid[]) ORDER BY id;

-- name: existing_sessions
SELECT id FROM sessions WHERE tenant_id = $1 AND id = ANY ($2::text[]) ORDER BY id;

-- name: existing_types
SELECT name FROM memory_types WHERE tenant_id = $1 AND name = ANY ($2::text[]) ORDER BY name;

-- What the export kept of items that the put path sets to now: when each was made and used.
-- name: restore_items
UPDATE items i
SET created_at = coalesce(r.created_at, i.created_at), accessed_at = r.accessed_at,
    access_count = r.access_count
FROM unnest($2::text[], $3::timestamptz[], $4::timestamptz[], $5::bigint[])
     AS r(id, created_at, accessed_at, access_count)
WHERE i.tenant_id = $1 AND i.id = r.id;

-- An archived version is history: as it was when archived (what processing had found by
-- then), not as the replay left it.
-- name: restore_versions
UPDATE item_versions v
SET created_at = coalesce(r.created_at, v.created_at),
    archived_at = coalesce(r.archived_at, v.archived_at), kind = coalesce(r.kind, v.kind),
    summary = r.summary, tags = r.tags
FROM unnest($2::text[], $3::integer[], $4::timestamptz[], $5::timestamptz[], $6::text[],
            $7::text[], $8::jsonb[])
     AS r(item_id, version, created_at, archived_at, kind, summary, tags)
WHERE v.tenant_id = $1 AND v.item_id = r.item_id AND v.version = r.version;

-- name: insert_type
INSERT INTO memory_types (tenant_id, name, description, created_at)
VALUES ($1, $2, $3, coalesce($4, now()))
ON CONFLICT (tenant_id, name) DO NOTHING
RETURNING name;

-- Memories as they were, ids included (ids are unique per tenant); their vectors come from
-- embed_memory jobs, by whatever model this installation runs. Lists travel as JSON text: an
-- array parameter of lists would be read as an array of more dimensions.
-- name: insert_memories
INSERT INTO memories (tenant_id, id, user_id, agent_id, session_id, visibility, type, content,
                      confidence, source, metadata, hints, pinned, observed_at, valid_until,
                      invalid_reason, superseded_by, source_events, version, created_at,
                      updated_at, access_count, accessed_at, content_hash)
SELECT $1, m.id, m.user_id, m.agent_id, m.session_id, m.visibility, m.type, m.content,
       m.confidence, m.source, m.metadata,
       ARRAY(SELECT jsonb_array_elements_text(m.hints::jsonb)), m.pinned, m.observed_at,
       m.valid_until, m.invalid_reason, m.superseded_by, m.source_events::jsonb, m.version,
       coalesce(m.created_at, now()), coalesce(m.updated_at, now()), m.access_count,
       m.accessed_at, m.content_hash
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::float8[], $10::text[], $11::jsonb[], $12::text[], $13::boolean[],
            $14::timestamptz[], $15::timestamptz[], $16::text[], $17::uuid[], $18::text[],
            $19::integer[], $20::timestamptz[], $21::timestamptz[], $22::bigint[],
            $23::timestamptz[], $24::text[])
     AS m(id, user_id, agent_id, session_id, visibility, type, content, confidence, source,
          metadata, hints, pinned, observed_at, valid_until, invalid_reason, superseded_by,
          source_events, version, created_at, updated_at, access_count, accessed_at,
          content_hash);

-- name: insert_history
INSERT INTO memory_history (tenant_id, memory_id, version, operation, agent_id, old_content,
                            new_content, changes, reason, at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: insert_session
INSERT INTO sessions (tenant_id, id, user_id, agent_id, visibility, created_at, first_event_at,
                      last_event_at, last_write_at, ended_at, summary)
VALUES ($1, $2, $3, $4, $5, coalesce($6, now()), $7, $8, coalesce($9, now()), $10, $11)
ON CONFLICT (tenant_id, id) DO NOTHING
RETURNING id;

-- A batch of a session's events in the file's order (their sequence numbers follow it).
-- name: insert_events
INSERT INTO events (tenant_id, session_id, event_id, user_id, agent_id, visibility, role,
                    sender_id, sender_name, type, content, media_item_id, created_at,
                    received_at, trace_id, span_id, parent_span_id, metadata, search_text,
                    embed_text, content_hash)
SELECT $1, $2, e.event_id, $3, $4, $5, e.role, e.sender_id, e.sender_name, e.type, e.content,
       e.media_item_id, e.created_at, coalesce(e.received_at, now()), e.trace_id, e.span_id,
       e.parent_span_id, e.metadata, e.search_text, e.embed_text, e.content_hash
FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
            $12::text[], $13::timestamptz[], $14::timestamptz[], $15::text[], $16::text[],
            $17::text[], $18::jsonb[], $19::text[], $20::text[], $21::text[])
     WITH ORDINALITY AS e(event_id, role, sender_id, sender_name, type, content, media_item_id,
                          created_at, received_at, trace_id, span_id, parent_span_id, metadata,
                          search_text, embed_text, content_hash, ord)
ORDER BY e.ord
RETURNING seq, event_id;

-- name: finish_session
UPDATE sessions SET events = $3, extracted_seq = $4 WHERE tenant_id = $1 AND id = $2;

-- The jobs an import created (all in its one transaction, so all at its start time) that are
-- due and still to be put on the queue, read through a cursor after the commit.
-- name: imported_jobs
SELECT id, kind, attempts, status, tenant_id FROM jobs
WHERE tenant_id = $1 AND created_at = $2 AND status = 'queued' AND enqueued_at IS NULL
  AND run_after <= now();

-- name: imported_job_counts
SELECT kind, count(*) AS jobs FROM jobs
WHERE tenant_id = $1 AND created_at = now() AND status IN ('queued', 'waiting')
GROUP BY kind ORDER BY kind;

-- The import transaction's start: every job it made has it as created_at.
-- name: started
SELECT now();
