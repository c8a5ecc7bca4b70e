-- Memory upkeep (migration 0016): the tenant's policy and schedule, runs and their changes,
-- and what each step reads and writes. $1 is always the tenant. A run's scope is $2 (user)
-- and $3 (agent), either NULL for any.

-- name: policy
SELECT * FROM memory_policies WHERE tenant_id = $1;

-- A NULL argument keeps the column as it is.
-- name: save_policy
INSERT INTO memory_policies AS p (tenant_id, lifetimes, memory_cap, schedule, merge_similarity,
                                  link_similarity)
VALUES ($1, coalesce($2::jsonb, '{}'::jsonb), $3, $4, $5, $6)
ON CONFLICT (tenant_id) DO UPDATE
SET lifetimes = coalesce($2::jsonb, p.lifetimes), memory_cap = coalesce($3, p.memory_cap),
    schedule = coalesce($4, p.schedule), merge_similarity = coalesce($5, p.merge_similarity),
    link_similarity = coalesce($6, p.link_similarity), updated_at = now();

-- name: delete_policy
DELETE FROM memory_policies WHERE tenant_id = $1;

-- A layer's new lifetime ($3 days; NULL: permanent) for every memory of it, from when each
-- was written; a pinned memory stays permanent.
-- name: reset_expiry
UPDATE memories
SET expires_at = CASE WHEN $3::float8 IS NULL OR pinned THEN NULL
                      ELSE created_at + $3::float8 * interval '1 day' END
WHERE tenant_id = $1 AND layer = $2
  AND expires_at IS DISTINCT FROM CASE WHEN $3::float8 IS NULL OR pinned THEN NULL
                                       ELSE created_at + $3::float8 * interval '1 day' END;

-- name: reschedule
UPDATE memory_schedules SET next_consolidation = $2 WHERE tenant_id = $1;

-- Active tenants without a schedule yet: the sweeper gives them one.
-- name: unscheduled
SELECT t.id FROM tenants t
WHERE t.status = 'active'
  AND NOT EXISTS (SELECT 1 FROM memory_schedules s WHERE s.tenant_id = t.id)
LIMIT $1;

-- name: schedule_insert
INSERT INTO memory_schedules (tenant_id, next_consolidation, next_prune)
VALUES ($1, $2, $3) ON CONFLICT (tenant_id) DO NOTHING;

-- Whose runs are due, with whether they hold any memory at all (an empty tenant's turn only
-- moves its schedule on).
-- name: due
SELECT s.tenant_id, s.next_consolidation, s.next_prune,
       EXISTS (SELECT 1 FROM memories m WHERE m.tenant_id = s.tenant_id) AS has_memories
FROM memory_schedules s JOIN tenants t ON t.id = s.tenant_id AND t.status = 'active'
WHERE s.next_consolidation <= now() OR s.next_prune <= now()
ORDER BY least(s.next_consolidation, s.next_prune)
LIMIT $1;

-- Compare and set: only the worker that read these times moves them, and starts the runs.
-- name: claim_due
UPDATE memory_schedules SET next_consolidation = $4, next_prune = $5
WHERE tenant_id = $1 AND next_consolidation = $2 AND next_prune = $3
RETURNING tenant_id;

-- name: run_insert
INSERT INTO upkeep_runs (tenant_id, id, steps, dry_run, trigger, scope, options, key_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING *;

-- name: run_get
SELECT r.*, j.status AS job_status, j.last_error
FROM upkeep_runs r
LEFT JOIN operations o ON o.tenant_id = r.tenant_id AND o.id = r.id
LEFT JOIN jobs j ON j.id = o.job_id
WHERE r.tenant_id = $1 AND r.id = $2;

-- name: run_lock
SELECT * FROM upkeep_runs WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- Newest first, after the cursor (created_at, id); a key bound to a user or an agent ($5,
-- $6) sees only the runs over its own scope.
-- name: run_list
SELECT r.*, j.status AS job_status, j.last_error
FROM upkeep_runs r
LEFT JOIN operations o ON o.tenant_id = r.tenant_id AND o.id = r.id
LEFT JOIN jobs j ON j.id = o.job_id
WHERE r.tenant_id = $1
  AND ($2::timestamptz IS NULL OR (r.created_at, r.id) < ($2, $3::uuid))
  AND ($5::text IS NULL OR r.scope ->> 'user_id' = $5)
  AND ($6::text IS NULL OR r.scope ->> 'agent_id' = $6)
ORDER BY r.created_at DESC, r.id DESC
LIMIT $4;

-- A step's counts; the run is finished when its last step wrote them.
-- name: run_step_done
UPDATE upkeep_runs
SET counts = counts || jsonb_build_object($3::text, $4::jsonb),
    finished_at = CASE WHEN steps[array_length(steps, 1)] = $3 THEN now() END
WHERE tenant_id = $1 AND id = $2;

-- name: run_undone
UPDATE upkeep_runs SET undone_at = now(), undo = $3 WHERE tenant_id = $1 AND id = $2;

-- name: next_seq
SELECT coalesce(max(seq), 0) FROM upkeep_changes WHERE tenant_id = $1 AND run_id = $2;

-- name: change_insert
INSERT INTO upkeep_changes (tenant_id, run_id, seq, step, action, memory_id, other_id, detail,
                            before, after_version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: changes_page
SELECT seq, step, action, memory_id, other_id, detail, after_version
FROM upkeep_changes
WHERE tenant_id = $1 AND run_id = $2 AND ($3::text IS NULL OR step = $3) AND seq > $4
ORDER BY seq
LIMIT $5;

-- name: change_counts
SELECT step, action, count(*) AS n FROM upkeep_changes
WHERE tenant_id = $1 AND run_id = $2 GROUP BY step, action ORDER BY step, action;

-- name: changes_all
SELECT * FROM upkeep_changes WHERE tenant_id = $1 AND run_id = $2 ORDER BY seq;

-- The memories a merge or a link compares: valid, unexpired, embedded by the current model,
-- in the run's scope, grouped by scope (consecutive rows), newest first within one.
-- name: comparable
SELECT id, user_id, agent_id, visibility, type, content, confidence, pinned, layer,
       access_count, hints, source_events, version, created_at,
       coalesce(observed_at, created_at) AS at, embedding
FROM memories
WHERE tenant_id = $1 AND ($2::text IS NULL OR user_id = $2) AND ($3::text IS NULL OR agent_id = $3)
  AND (valid_until IS NULL OR valid_until > now()) AND (expires_at IS NULL OR expires_at > now())
  AND embedding_model = $4
ORDER BY user_id NULLS FIRST, agent_id NULLS FIRST, visibility, created_at DESC, id;

-- A merge's loser: superseded by the keeper, if nobody changed it since the plan read it.
-- name: supersede
UPDATE memories
SET valid_until = now(), invalid_reason = $3, superseded_by = $4, version = version + 1,
    updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND version = $5 AND (valid_until IS NULL OR valid_until > now())
RETURNING *;

-- A merge's keeper takes the higher confidence and both memories' hints and source events
-- ($6), so that what the other one was drawn from stays reachable through it.
-- name: absorb
UPDATE memories
SET confidence = greatest(confidence, $3),
    hints = ARRAY(SELECT DISTINCT unnest(hints || $4::text[])),
    source_events = (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb) FROM (
        SELECT e, min(n) AS n
        FROM jsonb_array_elements(source_events || $6::jsonb) WITH ORDINALITY AS x (e, n)
        GROUP BY e) kept),
    version = version + 1, updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND version = $5
RETURNING *;

-- What decay and reinforcement would do to each memory of the scope: $4 idle days, $5 rate,
-- $6 floor, $7 uses that reinforce, $8 step. Pinned memories and permanent layers are left
-- alone; so is a memory that neither decays nor gains.
-- name: decay_plan
SELECT id, version, confidence, access_count, action,
       CASE action WHEN 'reinforce' THEN least(1.0, confidence + $8::float8)
                   WHEN 'decay' THEN greatest($6::float8, confidence * (1 - $5::float8))
                   ELSE confidence END AS new_confidence
FROM (
    SELECT m.id, m.version, m.confidence, m.access_count,
           CASE WHEN m.access_count - m.accesses_seen >= $7::bigint AND m.confidence < 1
                THEN 'reinforce'
                WHEN m.access_count = m.accesses_seen
                     AND coalesce(m.accessed_at, m.created_at) < now() - $4::float8 * interval '1 day'
                THEN CASE WHEN m.confidence <= $6::float8 THEN 'invalidate' ELSE 'decay' END
           END AS action
    FROM memories m
    WHERE m.tenant_id = $1 AND ($2::text IS NULL OR m.user_id = $2)
      AND ($3::text IS NULL OR m.agent_id = $3)
      AND NOT m.pinned AND m.layer NOT IN ('pinned', 'observation', 'profile')
      AND (m.valid_until IS NULL OR m.valid_until > now())
      AND (m.expires_at IS NULL OR m.expires_at > now())
) p
WHERE action IS NOT NULL;

-- Decay's changes, all at once, each only if the memory is still at the version planned.
-- name: decay_apply
UPDATE memories m
SET confidence = c.confidence,
    valid_until = CASE WHEN c.invalidate THEN now() ELSE m.valid_until END,
    invalid_reason = CASE WHEN c.invalidate THEN $5 ELSE m.invalid_reason END,
    version = m.version + 1, updated_at = now()
FROM unnest($2::uuid[], $3::float8[], $4::bool[], $6::int[]) AS c (id, confidence, invalidate, version)
WHERE m.tenant_id = $1 AND m.id = c.id AND m.version = c.version
RETURNING m.id, m.version, m.content;

-- Uses are counted from here on: the next decay reinforces only on new ones.
-- Only the memories decay reads (a permanent one's uses were a write of a row a run never
-- looks at again: at 1M memories, 45k rows and most of a gigabyte of WAL).
-- name: decay_seen
UPDATE memories SET accesses_seen = access_count
WHERE tenant_id = $1 AND ($2::text IS NULL OR user_id = $2) AND ($3::text IS NULL OR agent_id = $3)
  AND accesses_seen <> access_count
  AND NOT pinned AND layer NOT IN ('pinned', 'observation', 'profile');

-- name: history_many
INSERT INTO memory_history (tenant_id, memory_id, version, operation, operation_id,
                            old_content, new_content, changes, reason)
SELECT $1, h.memory_id, h.version, $2, $3, h.content, h.content, h.changes, h.reason
FROM unnest($4::uuid[], $5::int[], $6::text[], $7::jsonb[], $8::text[])
     AS h (memory_id, version, content, changes, reason);

-- Pairs already related either way (of any kind): a link is not written twice.
-- name: related_pairs
SELECT from_id, to_id FROM memory_relations
WHERE tenant_id = $1 AND (from_id = ANY ($2::uuid[]) OR to_id = ANY ($2::uuid[]));

-- Finished sessions (ended, or quiet for a day) of the scope without an observation yet.
-- name: sessions_to_observe
SELECT s.id, s.user_id, s.agent_id, s.visibility, s.summary, s.first_event_at, s.last_event_at
FROM sessions s
WHERE s.tenant_id = $1 AND ($2::text IS NULL OR s.user_id = $2)
  AND ($3::text IS NULL OR s.agent_id = $3)
  AND s.events > 0 AND (s.ended_at IS NOT NULL OR s.last_write_at < now() - interval '1 day')
  AND NOT EXISTS (SELECT 1 FROM memories m
                  WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id
                    AND m.layer = 'observation' AND m.source = 'consolidation')
ORDER BY s.last_write_at
LIMIT $4;

-- A session's valid memories, most confident first: the lines of its observation.
-- name: session_memories
SELECT id, content, source_events, coalesce(observed_at, created_at) AS at FROM memories
WHERE tenant_id = $1 AND session_id = $2 AND (valid_until IS NULL OR valid_until > now())
  AND source IS DISTINCT FROM 'consolidation'
ORDER BY confidence DESC, coalesce(observed_at, created_at)
LIMIT $3;

-- Expired memories of the scope, removed with a snapshot of each (row and history) from which
-- an undo restores it. In one statement: the snapshot reads the rows as they were.
-- name: prune_expired
WITH doomed AS (
    SELECT m.id FROM memories m
    WHERE m.tenant_id = $1 AND ($2::text IS NULL OR m.user_id = $2)
      AND ($3::text IS NULL OR m.agent_id = $3)
      AND m.expires_at <= now()
    ORDER BY m.expires_at
    LIMIT $6
    FOR UPDATE
),
snap AS (
    SELECT m.id, row_number() OVER (ORDER BY m.expires_at, m.id) AS n,
           CASE WHEN NOT $5 THEN memory_snapshot(m) END AS before,
           m.expires_at, m.layer, m.user_id, m.agent_id, m.session_id
    FROM memories m JOIN doomed d ON m.tenant_id = $1 AND m.id = d.id
),
gone AS (
    DELETE FROM memories m USING doomed d WHERE m.tenant_id = $1 AND m.id = d.id AND NOT $5
    RETURNING m.id
),
recorded AS (
    INSERT INTO upkeep_changes (tenant_id, run_id, seq, step, action, memory_id, detail, before)
    SELECT $1, $4, $7 + s.n, 'prune', 'expire', s.id,
           jsonb_build_object('layer', s.layer, 'expires_at', s.expires_at), s.before
    FROM snap s
    RETURNING memory_id
)
SELECT s.id, s.user_id, s.agent_id, s.session_id FROM snap s ORDER BY s.n;

-- Past the cap ($5 memories to remove), the impermanent memories of least value go: invalid
-- ones first, then by confidence, weighed up by use and down by age since last use.
-- name: prune_cap
WITH doomed AS (
    SELECT m.id,
           CASE WHEN m.valid_until IS NOT NULL AND m.valid_until <= now() THEN 0
                ELSE m.confidence * (1 + ln(1 + m.access_count))
                     / (1 + extract(epoch FROM now() - coalesce(m.accessed_at, m.created_at))
                            / 2592000.0) END AS value
    FROM memories m
    WHERE m.tenant_id = $1 AND NOT m.pinned AND m.layer NOT IN ('pinned', 'observation', 'profile')
    ORDER BY value, m.created_at, m.id
    LIMIT $5
    FOR UPDATE
),
snap AS (
    SELECT m.id, row_number() OVER (ORDER BY d.value, m.created_at, m.id) AS n, d.value,
           CASE WHEN NOT $3 THEN memory_snapshot(m) END AS before,
           m.layer, m.user_id, m.agent_id, m.session_id
    FROM memories m JOIN doomed d ON m.tenant_id = $1 AND m.id = d.id
),
gone AS (
    DELETE FROM memories m USING doomed d WHERE m.tenant_id = $1 AND m.id = d.id AND NOT $3
    RETURNING m.id
),
recorded AS (
    INSERT INTO upkeep_changes (tenant_id, run_id, seq, step, action, memory_id, detail, before)
    SELECT $1, $2, $4 + s.n, 'prune', 'cap', s.id,
           jsonb_build_object('layer', s.layer, 'value', round(s.value::numeric, 4)), s.before
    FROM snap s
    RETURNING memory_id
)
SELECT s.id, s.user_id, s.agent_id, s.session_id FROM snap s ORDER BY s.n;

-- name: memory_count
SELECT count(*) FROM memories WHERE tenant_id = $1;

-- Undo ---------------------------------------------------------------------------------------

-- name: version_of
SELECT id, version FROM memories WHERE tenant_id = $1 AND id = ANY ($2::uuid[]);

-- A memory back to what it was before the run ($3: the fields, as jsonb), as a new version.
-- name: restore_fields
UPDATE memories m
SET confidence = coalesce((($3::jsonb) ->> 'confidence')::float8, m.confidence),
    valid_until = CASE WHEN ($3::jsonb) ? 'valid_until'
                       THEN (($3::jsonb) ->> 'valid_until')::timestamptz ELSE m.valid_until END,
    invalid_reason = CASE WHEN ($3::jsonb) ? 'invalid_reason'
                          THEN ($3::jsonb) ->> 'invalid_reason' ELSE m.invalid_reason END,
    superseded_by = CASE WHEN ($3::jsonb) ? 'superseded_by'
                         THEN (($3::jsonb) ->> 'superseded_by')::uuid ELSE m.superseded_by END,
    hints = CASE WHEN ($3::jsonb) ? 'hints'
                 THEN ARRAY(SELECT jsonb_array_elements_text(($3::jsonb) -> 'hints')) ELSE m.hints END,
    source_events = CASE WHEN ($3::jsonb) ? 'source_events'
                         THEN ($3::jsonb) -> 'source_events' ELSE m.source_events END,
    version = m.version + 1, updated_at = now()
WHERE m.tenant_id = $1 AND m.id = $2
RETURNING *;

-- name: delete_run_relations
DELETE FROM memory_relations WHERE tenant_id = $1 AND run_id = $2;

-- name: delete_memory
DELETE FROM memories WHERE tenant_id = $1 AND id = $2 AND version = $3 RETURNING id;

-- A pruned memory back, as it was (its vector too), with its history.
-- name: reinsert
INSERT INTO memories (tenant_id, id, user_id, agent_id, session_id, visibility, type, content,
                      confidence, source, metadata, hints, pinned, observed_at, valid_until,
                      invalid_reason, superseded_by, source_events, version, created_at,
                      updated_at, access_count, accessed_at, content_hash, embedding,
                      embedding_model, layer, expires_at, accesses_seen)
SELECT $1, r.id, r.user_id, r.agent_id, r.session_id, r.visibility, r.type, r.content,
       r.confidence, r.source, r.metadata, r.hints, r.pinned, r.observed_at, r.valid_until,
       r.invalid_reason, r.superseded_by, r.source_events, r.version, r.created_at, r.updated_at,
       r.access_count, r.accessed_at, r.content_hash, r.embedding, r.embedding_model, r.layer,
       r.expires_at, r.accesses_seen
FROM jsonb_populate_record(NULL::memories, $2::jsonb) r
ON CONFLICT (tenant_id, id) DO NOTHING
RETURNING id;

-- name: reinsert_history
INSERT INTO memory_history (tenant_id, memory_id, version, operation, key_id, agent_id,
                            operation_id, old_content, new_content, changes, reason, at)
SELECT $1, h.memory_id, h.version, h.operation, h.key_id, h.agent_id, h.operation_id,
       h.old_content, h.new_content, h.changes, h.reason, h.at
FROM jsonb_populate_recordset(NULL::memory_history, $2::jsonb) h
ON CONFLICT DO NOTHING;

-- name: set_expiry
UPDATE memories SET expires_at = $3 WHERE tenant_id = $1 AND id = $2;

-- An upkeep run's operation: the same id, carried by the run's last job.
-- name: operation_insert
INSERT INTO operations (tenant_id, id, kind, job_id, scope, key_id)
VALUES ($1, $2, 'upkeep', $3, $4, $5);

-- name: schedule_of
SELECT next_consolidation, next_prune FROM memory_schedules WHERE tenant_id = $1;

-- The dashboard's runs: one tenant's ($1), or every tenant's for an operator ($1 NULL).
-- name: dashboard_runs
SELECT r.*, t.name AS tenant_name, j.status AS job_status, j.last_error
FROM upkeep_runs r
JOIN tenants t ON t.id = r.tenant_id
LEFT JOIN operations o ON o.tenant_id = r.tenant_id AND o.id = r.id
LEFT JOIN jobs j ON j.id = o.job_id
WHERE $1::bigint IS NULL OR r.tenant_id = $1
ORDER BY r.created_at DESC, r.id DESC
LIMIT $2;

-- name: dashboard_run_tenant
SELECT tenant_id FROM upkeep_runs WHERE id = $1 AND ($2::bigint IS NULL OR tenant_id = $2);

-- Serialises the starts of one tenant's runs (released at commit).
-- name: lock_tenant
SELECT pg_advisory_xact_lock(hashtextextended('memmill:upkeep:' || $1::bigint, 0));

-- A run of the tenant still to finish: its last step's job waiting, queued or running.
-- name: run_going
SELECT r.id FROM upkeep_runs r
JOIN operations o ON o.tenant_id = r.tenant_id AND o.id = r.id
JOIN jobs j ON j.id = o.job_id
WHERE r.tenant_id = $1 AND r.finished_at IS NULL
  AND j.status IN ('waiting', 'queued', 'running')
LIMIT 1;
