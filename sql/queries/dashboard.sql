-- Browser sessions, paused kinds, bulk-replay previews and the audit log (migration 0012).

-- name: create_session
INSERT INTO dashboard_sessions (token_hash, key_id, csrf_token, expires_at)
VALUES ($1, $2, $3, now() + make_interval(secs => $4));

-- A session lives as long as its key: a revoked or expired key, or a suspended tenant, ends
-- every session it opened.
-- name: session
SELECT k.id, k.tenant_id, k.role, k.name, k.user_id, k.agent_id, k.expires_at, s.csrf_token,
       t.name AS tenant_name
FROM dashboard_sessions s
JOIN api_keys k ON k.id = s.key_id AND k.revoked_at IS NULL
                   AND (k.expires_at IS NULL OR k.expires_at > now())
JOIN tenants t ON t.id = k.tenant_id AND t.status = 'active'
WHERE s.token_hash = $1 AND s.expires_at > now();

-- name: end_session
DELETE FROM dashboard_sessions WHERE token_hash = $1;

-- name: purge_sessions
DELETE FROM dashboard_sessions WHERE expires_at < now();

-- name: tenant_name
SELECT name FROM tenants WHERE id = $1;

-- name: tenant_by_name
SELECT id FROM tenants WHERE name = $1;

-- name: tenant_names
SELECT id, name FROM tenants WHERE id = ANY($1::bigint[]);

-- name: pause
INSERT INTO paused_kinds (kind, paused_by) VALUES ($1, $2)
ON CONFLICT (kind) DO NOTHING
RETURNING kind;

-- name: resume
DELETE FROM paused_kinds WHERE kind = $1 RETURNING kind;

-- A resumed kind's queued jobs lost their deliveries while it was paused: the sweeper sends
-- them again at its next pass.
-- name: redeliver_kind
UPDATE jobs SET enqueued_at = NULL WHERE status = 'queued' AND kind = $1 AND enqueued_at IS NOT NULL;

-- name: audit
INSERT INTO audit_log (tenant_id, key_id, key_name, action, target, filter, affected, skipped,
                       via, result)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: audit_list
SELECT a.*, t.name AS tenant_name FROM audit_log a LEFT JOIN tenants t ON t.id = a.tenant_id
WHERE $1::bigint IS NULL OR a.tenant_id = $1
ORDER BY a.at DESC, a.id DESC LIMIT $2;

-- name: dead_letter_tenant
SELECT tenant_id FROM dead_letters WHERE id = $1;

-- name: job_tenant
SELECT tenant_id FROM jobs WHERE id = $1;

-- name: create_preview
INSERT INTO replay_previews (tenant_id, key_id, filter, dead_letter_ids, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
RETURNING id;

-- The preview, locked: two confirmations of one preview cannot both act.
-- name: take_preview
UPDATE replay_previews SET used_at = now()
WHERE id = $1 AND key_id = $2 AND used_at IS NULL AND expires_at > now()
RETURNING tenant_id, filter, dead_letter_ids;

-- The counted dead letters that are still waiting for a replay, with their jobs locked: a
-- job replayed, retried or deleted since the preview is not among them.
-- name: still_dead
SELECT d.id, d.tenant_id, d.job_id, d.kind
FROM dead_letters d JOIN jobs j ON j.id = d.job_id
WHERE d.id = ANY($1::bigint[]) AND d.replayed_at IS NULL AND j.status = 'dead'
  AND ($2::bigint IS NULL OR d.tenant_id = $2)
ORDER BY d.id
FOR UPDATE OF d, j;

-- name: jobs_per_worker
SELECT worker_id, count(*) AS n FROM jobs WHERE status = 'running' GROUP BY worker_id;

-- The item's jobs across all its versions, oldest first, with the number of each attempt.
-- name: item_jobs
SELECT j.id, j.kind, j.version, j.status, job_state(j.status, j.last_error) AS state,
       j.attempts, j.max_attempts, j.last_error, j.created_at, j.started_at, j.finished_at,
       j.depends_on,
       extract(epoch FROM coalesce(j.finished_at, now()) - j.started_at)::float8 AS took_s
FROM jobs j
WHERE j.tenant_id = $1 AND j.item_id = $2
ORDER BY j.version DESC, j.created_at, j.id;

-- name: dependents
SELECT id, kind, status FROM jobs WHERE depends_on = $1 ORDER BY created_at;

-- name: full_attempts
SELECT attempt, worker_id, started_at, finished_at, outcome, error, traceback, retry_delay_s,
       extract(epoch FROM finished_at - started_at)::float8 AS took_s
FROM job_attempts WHERE job_id = $1 ORDER BY attempt;
