-- Relations between memories and references to items (migration 0016). $1 is always the
-- tenant; a reader's user and agent pass every memory through scope_visible().

-- name: visible
SELECT 1 FROM memories m
WHERE m.tenant_id = $1 AND m.id = $2
  AND scope_visible(m.visibility, m.user_id, m.agent_id, $3, $4);

-- name: insert
INSERT INTO memory_relations (tenant_id, from_id, kind, to_id, score, run_id)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant_id, from_id, kind, to_id) DO UPDATE SET kind = EXCLUDED.kind
RETURNING from_id, kind, to_id, score, run_id, created_at;

-- name: delete
DELETE FROM memory_relations WHERE tenant_id = $1 AND from_id = $2 AND kind = $3 AND to_id = $4
RETURNING 1;

-- The item and whether it has a part at $3 in its current version.
-- name: item_part
SELECT i.id, EXISTS (SELECT 1 FROM parts p
                     WHERE p.tenant_id = i.tenant_id AND p.item_id = i.id
                       AND p.version = i.version AND p.position = $3) AS part_exists
FROM items i WHERE i.tenant_id = $1 AND i.id = $2;

-- name: insert_reference
INSERT INTO memory_references (tenant_id, memory_id, item_id, position)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id, memory_id, item_id, position) DO UPDATE SET position = EXCLUDED.position
RETURNING item_id, position, created_at;

-- name: delete_reference
DELETE FROM memory_references
WHERE tenant_id = $1 AND memory_id = $2 AND item_id = $3 AND position = $4
RETURNING 1;

-- name: references
SELECT item_id, position FROM memory_references
WHERE tenant_id = $1 AND memory_id = $2 ORDER BY item_id, position;

-- The memories within $5 relations of $2 (both directions, of the kinds $6, NULL: all) that
-- the reader sees, each at its least depth, nearest first. A step only lands on a memory the
-- reader sees, so a walk never passes through one it may not. UNION (not UNION ALL) keeps
-- each (memory, depth) once: a cycle is cut by the depth, at one row per memory and depth.
-- name: walk
WITH RECURSIVE reached (id, depth) AS (
    SELECT $2::uuid, 0
    UNION
    SELECT step.id, r.depth + 1
    FROM reached r
    CROSS JOIN LATERAL (
        SELECT x.to_id AS id FROM memory_relations x
        WHERE x.tenant_id = $1 AND x.from_id = r.id AND ($6::text[] IS NULL OR x.kind = ANY ($6))
        UNION
        SELECT x.from_id FROM memory_relations x
        WHERE x.tenant_id = $1 AND x.to_id = r.id AND ($6::text[] IS NULL OR x.kind = ANY ($6))
    ) step
    JOIN memories m ON m.tenant_id = $1 AND m.id = step.id
     AND scope_visible(m.visibility, m.user_id, m.agent_id, $3, $4)
    WHERE r.depth < $5
)
SELECT m.*, n.depth
FROM (SELECT id, min(depth) AS depth FROM reached WHERE id <> $2 GROUP BY id) n
JOIN memories m ON m.tenant_id = $1 AND m.id = n.id
ORDER BY n.depth, m.created_at DESC, m.id
LIMIT $7;

-- name: between
SELECT from_id, kind, to_id, score, run_id, created_at FROM memory_relations
WHERE tenant_id = $1 AND from_id = ANY ($2::uuid[]) AND to_id = ANY ($2::uuid[])
  AND ($3::text[] IS NULL OR kind = ANY ($3))
ORDER BY created_at, from_id, to_id;

-- One hop from each hit ($2) to the memories the reader sees, at most $5 per hit.
-- name: neighbours
SELECT hit, id, kind, direction, type, content FROM (
    SELECT h.hit, m.id, e.kind, e.direction, m.type, m.content,
           row_number() OVER (PARTITION BY h.hit ORDER BY e.score DESC NULLS LAST, m.created_at DESC) AS n
    FROM unnest($2::uuid[]) AS h (hit)
    CROSS JOIN LATERAL (
        SELECT x.to_id AS other, x.kind, 'out' AS direction, x.score FROM memory_relations x
        WHERE x.tenant_id = $1 AND x.from_id = h.hit
        UNION ALL
        SELECT x.from_id, x.kind, 'in', x.score FROM memory_relations x
        WHERE x.tenant_id = $1 AND x.to_id = h.hit
    ) e
    JOIN memories m ON m.tenant_id = $1 AND m.id = e.other
     AND scope_visible(m.visibility, m.user_id, m.agent_id, $3, $4)
) ranked
WHERE n <= $5
ORDER BY hit, n;
