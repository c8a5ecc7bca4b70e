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
INSERT INTO sources (tenant_id, item_id, version, media_type, content, data, byte_size)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (tenant_id, item_id, version) DO UPDATE
SET media_type = EXCLUDED.media_type, content = EXCLUDED.content, data = EXCLUDED.data,
    byte_size = EXCLUDED.byte_size;

-- name: get_source
SELECT * FROM sources WHERE tenant_id = $1 AND item_id = $2 AND version = $3;

-- A replayed or retried job makes a failed item pending again.
-- name: mark_pending
UPDATE items SET status = 'pending', error = NULL, updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND status = 'failed';
