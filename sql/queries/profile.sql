-- Knowledge profiles (migration 0016): a user's topics with a comfort level.

-- Extraction's finding: a new topic, or a later statement replacing an earlier one (its
-- evidence counted). A caller's setting is kept unless extraction hears something new.
-- name: upsert
INSERT INTO profile_topics AS p (tenant_id, user_id, topic, level, summary, source,
                                 source_events)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (tenant_id, user_id, topic) DO UPDATE
SET level = EXCLUDED.level, summary = EXCLUDED.summary, source = EXCLUDED.source,
    source_events = (p.source_events || EXCLUDED.source_events),
    evidence = p.evidence + 1, updated_at = now()
WHERE NOT p.source_events @> EXCLUDED.source_events
RETURNING topic;

-- name: set
INSERT INTO profile_topics AS p (tenant_id, user_id, topic, level, summary, source)
VALUES ($1, $2, $3, $4, $5, 'caller')
ON CONFLICT (tenant_id, user_id, topic) DO UPDATE
SET level = EXCLUDED.level, summary = EXCLUDED.summary, source = 'caller', updated_at = now()
RETURNING *;

-- name: delete
DELETE FROM profile_topics WHERE tenant_id = $1 AND user_id = $2 AND topic = $3 RETURNING 1;

-- name: topics
SELECT * FROM profile_topics WHERE tenant_id = $1 AND user_id = $2
ORDER BY updated_at DESC, topic
LIMIT $3;
