-- Archived versions, newest first (offset 1 is the first row).
-- name: list
SELECT version, kind, uri, title, summary, tags, content_hash, created_at, archived_at
FROM item_versions WHERE tenant_id = $1 AND item_id = $2
ORDER BY version DESC;

-- name: at_offset
SELECT version, kind, uri, title, summary, tags, content_hash, created_at, archived_at
FROM item_versions WHERE tenant_id = $1 AND item_id = $2
ORDER BY version DESC
OFFSET $3 LIMIT 1;

-- name: latest
SELECT * FROM item_versions WHERE tenant_id = $1 AND item_id = $2
ORDER BY version DESC LIMIT 1;

-- The previous version becomes the item again; its archive row is consumed.
-- name: restore
UPDATE items i
SET version = v.version, kind = v.kind, uri = v.uri, title = v.title, summary = v.summary,
    tags = v.tags, content_hash = v.content_hash, status = $4, error = NULL, updated_at = now()
FROM item_versions v
WHERE i.tenant_id = $1 AND i.id = $2
  AND v.tenant_id = i.tenant_id AND v.item_id = i.id AND v.version = $3
RETURNING i.*;

-- Everything of the versions after the restored one: its archive row, sources and parts.
-- name: drop_newer
WITH archived AS (
    DELETE FROM item_versions WHERE tenant_id = $1 AND item_id = $2 AND version >= $3
), sourced AS (
    DELETE FROM sources WHERE tenant_id = $1 AND item_id = $2 AND version > $3
)
DELETE FROM parts WHERE tenant_id = $1 AND item_id = $2 AND version > $3;

-- The tenant's tag statistics (text_stats.sql) no longer hold for its parts.
-- name: purge
WITH archived AS (
    DELETE FROM item_versions WHERE tenant_id = $1 AND item_id = $2
), sourced AS (
    DELETE FROM sources WHERE tenant_id = $1 AND item_id = $2
), counted AS (
    UPDATE text_stats SET items_deleted = true WHERE tenant_id = $1 AND NOT items_deleted
)
DELETE FROM items WHERE tenant_id = $1 AND id = $2;
