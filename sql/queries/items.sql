-- name: insert_item
INSERT INTO items (tenant_id, id, kind, uri, title, tags, content_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (tenant_id, id) DO NOTHING
RETURNING *;

-- name: lock_item
SELECT * FROM items WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: archive_item
INSERT INTO item_versions
    (tenant_id, item_id, version, kind, uri, title, summary, tags, content_hash, created_at)
SELECT tenant_id, id, version, kind, uri, title, summary, tags, content_hash, updated_at
FROM items WHERE tenant_id = $1 AND id = $2
ON CONFLICT DO NOTHING;

-- name: bump_item_version
UPDATE items
SET version = version + 1, kind = $3, uri = $4, title = $5, tags = $6, content_hash = $7,
    status = $8, error = NULL, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: get_item
SELECT * FROM items WHERE tenant_id = $1 AND id = $2;

-- The summary belongs to content, not to a version number: a tags-only change bumps the
-- version but keeps the content, and the summary of that content still applies.
-- name: set_summary
UPDATE items SET summary = $4, updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND content_hash = $3;

-- Completions of one item's jobs lock its row first, so the last one always sees the others.
-- name: lock_for_completion
SELECT content_hash FROM items WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: mark_ready_if_done
UPDATE items SET status = 'ready', error = NULL, updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND status = 'pending'
  AND NOT EXISTS (
      SELECT 1 FROM jobs j
      WHERE j.tenant_id = $1 AND j.item_id = $2 AND j.status IN ('waiting', 'queued', 'running'));

-- name: mark_failed
UPDATE items SET status = 'failed', error = $3, updated_at = now()
WHERE tenant_id = $1 AND id = $2;

-- name: insert_source
INSERT INTO sources (tenant_id, item_id, version, media_type, content, data, byte_size,
                     content_hash, text_hash, meta)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (tenant_id, item_id, version) DO UPDATE
SET media_type = EXCLUDED.media_type, content = EXCLUDED.content, data = EXCLUDED.data,
    byte_size = EXCLUDED.byte_size, content_hash = EXCLUDED.content_hash,
    text_hash = EXCLUDED.text_hash, meta = EXCLUDED.meta;

-- A change of tags or title alone: the new version has the same source as the previous one.
-- name: copy_source
INSERT INTO sources (tenant_id, item_id, version, media_type, content, data, byte_size,
                     content_hash, text_hash, meta)
SELECT tenant_id, item_id, $4, media_type, content, data, byte_size, content_hash, text_hash,
       meta
FROM sources WHERE tenant_id = $1 AND item_id = $2 AND version = $3
ON CONFLICT (tenant_id, item_id, version) DO NOTHING;

-- name: get_source
SELECT * FROM sources WHERE tenant_id = $1 AND item_id = $2 AND version = $3;

-- A replayed or retried job makes a failed item pending again.
-- name: mark_pending
UPDATE items SET status = 'pending', error = NULL, updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND status = 'failed';

-- The source a job works from, with the hashes it must still match when it writes.
-- name: get_job_source
SELECT s.media_type, s.content, s.data, s.meta, s.content_hash, s.text_hash, i.title, i.tags
FROM sources s JOIN items i ON i.tenant_id = s.tenant_id AND i.id = s.item_id
WHERE s.tenant_id = $1 AND s.item_id = $2 AND s.version = $3;

-- Under the item's lock: is this version still current, and its text the one the job read?
-- name: source_is_current
SELECT i.content_hash = s.content_hash AND s.text_hash IS NOT DISTINCT FROM $4
FROM items i JOIN sources s ON s.tenant_id = i.tenant_id AND s.item_id = i.id AND s.version = $3
WHERE i.tenant_id = $1 AND i.id = $2;

-- name: set_source_text
UPDATE sources SET content = $4, text_hash = $5, media_type = $6, data = coalesce($7, data),
    meta = meta || $8::jsonb, byte_size = greatest(byte_size, coalesce(octet_length($7), 0))
WHERE tenant_id = $1 AND item_id = $2 AND version = $3;

-- What extraction learned about the document: a title if the caller gave none, system tags.
-- name: set_extracted
UPDATE items SET kind = $3, title = coalesce(title, $4), tags = tags || $5::jsonb,
    updated_at = now()
WHERE tenant_id = $1 AND id = $2;

-- Summaries of other items sharing one of the caller's tags: context for an LLM summary.
-- name: related_summaries
SELECT summary FROM items
WHERE tenant_id = $1 AND id <> $2 AND summary IS NOT NULL AND tags @> ANY($3::jsonb[])
ORDER BY updated_at DESC
LIMIT $4;

-- name: states
SELECT id, version, content_hash, title, tags, status, error FROM items
WHERE tenant_id = $1 AND id = ANY($2::text[]);
