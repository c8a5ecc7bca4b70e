-- The operator's dashboard and /metrics: counts and timings kept up to date as jobs change,
-- so that no page or scrape counts the ledger; provider calls; paused job kinds; read-only
-- keys, browser sessions, bulk-replay previews and the audit log of every action.

-- Keys: a read-only key reads everything its tenant (or, for an operator, every tenant) may
-- read and changes nothing.
ALTER TABLE api_keys ADD COLUMN read_only boolean NOT NULL DEFAULT false;

DROP TRIGGER api_keys_changed ON api_keys;
CREATE TRIGGER api_keys_changed
AFTER UPDATE OF key_hash, tenant_id, revoked_at, operator, read_only OR DELETE OR TRUNCATE
ON api_keys FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys_changed();

-- ---------------------------------------------------------------------------------------------
-- Maintained job counts. A counter row per (tenant, kind, status) updated by every job change
-- would be one hot row that every worker's transaction waits on; instead each statement that
-- changes jobs appends its net change to job_count_deltas, and fold_job_aggregates() (the
-- sweeper and the dashboard call it every few seconds, one at a time) adds them up into
-- job_counts. A reader sums both in one statement, so it is exact without waiting for a fold.
-- The state an operator sees: a queued job that has failed before and waits out its backoff
-- is 'retrying' (a replay or retry clears last_error, so it is plainly queued again).
CREATE FUNCTION job_state(status text, last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status = 'queued' AND last_error IS NOT NULL THEN 'retrying'
                ELSE status END
$$;

CREATE TABLE job_counts (
    tenant_id bigint NOT NULL,
    kind      text NOT NULL,
    status    text NOT NULL,   -- job_state(): the ledger's status, or 'retrying'
    n         bigint NOT NULL,
    PRIMARY KEY (tenant_id, kind, status)
);

CREATE TABLE job_count_deltas (
    tenant_id bigint NOT NULL,
    kind      text NOT NULL,
    status    text NOT NULL,
    n         bigint NOT NULL
);

-- Timings, bucketed: a histogram is 48 counters, bucket b holding durations of at most
-- 2^(b/2) ms (so a percentile read from it is within a factor of √2), the last one the rest.
CREATE FUNCTION duration_bucket(ms double precision) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN ms IS NULL OR ms <= 1 THEN 0
                ELSE least(47, ceil(2 * log(2.0, ms::numeric))::integer) END
$$;

CREATE FUNCTION hist_add(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN a IS NULL THEN b WHEN b IS NULL THEN a
                ELSE ARRAY(SELECT x + y FROM unnest(a, b) AS t (x, y)) END
$$;

CREATE AGGREGATE hist_sum(bigint[]) (SFUNC = hist_add, STYPE = bigint[]);

-- The histogram of a set of bucket numbers (as duration_bucket gives them).
CREATE FUNCTION hist_of(buckets integer[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY(SELECT count(b.b) FROM generate_series(0, 47) AS g (i)
                 LEFT JOIN unnest(buckets) AS b (b) ON b.b = g.i
                 GROUP BY g.i ORDER BY g.i)
$$;

-- One row per finished attempt (done, retry, dead) and per claim (its wait), appended by the
-- same triggers and folded into job_stats by minute, by hour and in total.
CREATE TABLE job_stat_deltas (
    tenant_id bigint NOT NULL,
    kind      text NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    outcome   text NOT NULL CHECK (outcome IN ('claim', 'done', 'retry', 'dead')),
    ms        double precision
);

CREATE TABLE job_stats (
    tenant_id bigint NOT NULL,   -- 0: every tenant together
    kind      text NOT NULL,
    grain     text NOT NULL CHECK (grain IN ('minute', 'hour', 'total')),
    period    timestamptz NOT NULL,  -- the start of the minute or hour; 'epoch' for the total
    done      bigint NOT NULL DEFAULT 0,
    retried   bigint NOT NULL DEFAULT 0,
    dead      bigint NOT NULL DEFAULT 0,
    wait_hist bigint[] NOT NULL,
    run_hist  bigint[] NOT NULL,
    run_ms    double precision NOT NULL DEFAULT 0,   -- sums, for Prometheus' _sum
    wait_ms   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (grain, period, tenant_id, kind)
);

CREATE FUNCTION jobs_counted_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (tenant_id, kind, status, n)
    SELECT tenant_id, kind, job_state(status, last_error), count(*) FROM new_rows
    GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobs_counted_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (tenant_id, kind, status, n)
    SELECT tenant_id, kind, job_state(status, last_error), -count(*) FROM old_rows
    GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

-- A change of state moves one count; a claim records how long the job waited once due, the
-- end of an attempt how long it ran. Row by row, behind a WHEN that Postgres checks without
-- calling the function: most updates of a job (lease renewals, enqueue stamps) change no
-- state and cost nothing here. A statement-level trigger with transition tables ran for every
-- one of them and built both tables each time.
CREATE FUNCTION jobs_counted_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    old_state text := job_state(OLD.status, OLD.last_error);
    new_state text := job_state(NEW.status, NEW.last_error);
BEGIN
    IF old_state IS DISTINCT FROM new_state THEN
        INSERT INTO job_count_deltas (tenant_id, kind, status, n)
        VALUES (OLD.tenant_id, OLD.kind, old_state, -1), (NEW.tenant_id, NEW.kind, new_state, 1);
    END IF;
    IF NEW.status = 'running' AND OLD.status <> 'running' THEN
        -- A claim may take a job up to a second before it is due: that waited 0, not less.
        INSERT INTO job_stat_deltas (tenant_id, kind, outcome, ms)
        VALUES (NEW.tenant_id, NEW.kind, 'claim',
                greatest(0, extract(epoch FROM NEW.started_at
                                       - greatest(OLD.run_after, OLD.created_at)) * 1000));
    ELSIF OLD.status = 'running' AND NEW.status IN ('done', 'dead', 'queued') THEN
        INSERT INTO job_stat_deltas (tenant_id, kind, outcome, ms)
        VALUES (NEW.tenant_id, NEW.kind,
                CASE NEW.status WHEN 'done' THEN 'done' WHEN 'dead' THEN 'dead' ELSE 'retry' END,
                extract(epoch FROM clock_timestamp() - OLD.started_at) * 1000);
    ELSIF OLD.status = 'queued' AND NEW.status = 'dead' THEN
        INSERT INTO job_stat_deltas (tenant_id, kind, outcome, ms)
        VALUES (NEW.tenant_id, NEW.kind, 'dead', NULL);
    ELSIF OLD.status = 'running' AND NEW.status = 'running' THEN
        -- A worker taking over a job whose lease expired (a new attempt, still running): the
        -- lost attempt counts as a retry, as when the sweeper hands it back, and the takeover
        -- as a claim that waited from the lease's end.
        INSERT INTO job_stat_deltas (tenant_id, kind, outcome, ms)
        VALUES (NEW.tenant_id, NEW.kind, 'retry',
                extract(epoch FROM clock_timestamp() - OLD.started_at) * 1000),
               (NEW.tenant_id, NEW.kind, 'claim',
                greatest(0, extract(epoch FROM NEW.started_at - OLD.lease_until) * 1000));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_counted_insert AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION jobs_counted_insert();
CREATE TRIGGER jobs_counted_delete AFTER DELETE ON jobs REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION jobs_counted_delete();
CREATE TRIGGER jobs_counted_update AFTER UPDATE OF status, last_error, attempts ON jobs
FOR EACH ROW
WHEN (OLD.status IS DISTINCT FROM NEW.status
      OR (OLD.last_error IS NULL) <> (NEW.last_error IS NULL)
      OR OLD.attempts IS DISTINCT FROM NEW.attempts)
EXECUTE FUNCTION jobs_counted_update();

-- TRUNCATE (of jobs, or of tenants with CASCADE) fires no DELETE trigger: every count is zero
-- then. The fold's lock first, so that a fold under way does not add its deltas back after.
CREATE FUNCTION jobs_counted_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7314159266);
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_counted_truncate AFTER TRUNCATE ON jobs
FOR EACH STATEMENT EXECUTE FUNCTION jobs_counted_truncate();

-- The jobs already in the ledger when this migration runs.
INSERT INTO job_counts (tenant_id, kind, status, n)
SELECT tenant_id, kind, job_state(status, last_error), count(*) FROM jobs GROUP BY 1, 2, 3;

-- Adds the deltas up; returns false, doing nothing, when another session is folding. Minute
-- rows are kept 3 hours and hour rows 8 days: the pages show the last hour and the last day.
-- Periods are UTC minutes and hours, whatever the folding session's time zone: in one at
-- +05:30 date_trunc('hour') would fall on :30 UTC, and two sessions in different zones would
-- split one hour into two rows.
CREATE FUNCTION fold_job_aggregates() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(7314159266) THEN
        RETURN false;
    END IF;
    WITH taken AS (DELETE FROM job_count_deltas RETURNING *)
    INSERT INTO job_counts AS c (tenant_id, kind, status, n)
    SELECT tenant_id, kind, status, sum(n) FROM taken GROUP BY 1, 2, 3
    ON CONFLICT (tenant_id, kind, status) DO UPDATE SET n = c.n + EXCLUDED.n;
    DELETE FROM job_counts WHERE n = 0;

    WITH taken AS (DELETE FROM job_stat_deltas RETURNING *),
    -- Each attempt counts for its tenant and for tenant 0, the whole installation (no tenant
    -- has id 0): an operator's last hour reads 60 rows a kind, however many tenants there are.
    grains AS (
        SELECT g.grain, CASE g.grain WHEN 'total' THEN 'epoch'::timestamptz
                                     ELSE date_trunc(g.grain, t.at, 'UTC') END AS period,
               w.tenant_id, t.kind, t.outcome, t.ms
        FROM taken t CROSS JOIN (VALUES ('minute'), ('hour'), ('total')) AS g (grain)
        CROSS JOIN LATERAL (VALUES (t.tenant_id), (0::bigint)) AS w (tenant_id)
    )
    INSERT INTO job_stats AS s (grain, period, tenant_id, kind, done, retried, dead,
                                wait_hist, run_hist, run_ms, wait_ms)
    SELECT grain, period, tenant_id, kind,
           count(*) FILTER (WHERE outcome = 'done'),
           count(*) FILTER (WHERE outcome = 'retry'),
           count(*) FILTER (WHERE outcome = 'dead'),
           hist_of(array_agg(duration_bucket(ms)) FILTER (WHERE outcome = 'claim')),
           hist_of(array_agg(duration_bucket(ms))
                   FILTER (WHERE outcome <> 'claim' AND ms IS NOT NULL)),
           coalesce(sum(ms) FILTER (WHERE outcome <> 'claim'), 0),
           coalesce(sum(ms) FILTER (WHERE outcome = 'claim'), 0)
    FROM grains GROUP BY 1, 2, 3, 4
    ON CONFLICT (grain, period, tenant_id, kind) DO UPDATE
    SET done = s.done + EXCLUDED.done, retried = s.retried + EXCLUDED.retried,
        dead = s.dead + EXCLUDED.dead, wait_hist = hist_add(s.wait_hist, EXCLUDED.wait_hist),
        run_hist = hist_add(s.run_hist, EXCLUDED.run_hist),
        run_ms = s.run_ms + EXCLUDED.run_ms, wait_ms = s.wait_ms + EXCLUDED.wait_ms;

    DELETE FROM job_stats WHERE grain = 'minute' AND period < now() - interval '3 hours';
    DELETE FROM job_stats WHERE grain = 'hour' AND period < now() - interval '8 days';
    RETURN true;
END
$$;

-- Queue latency per kind: the oldest due job of each kind, for one tenant or all.
CREATE INDEX jobs_queued_kind ON jobs (kind, tenant_id, run_after) WHERE status = 'queued';
-- The jobs page lists newest first across tenants for an operator.
CREATE INDEX jobs_created ON jobs (created_at DESC, id DESC);
CREATE INDEX jobs_status_kind_created ON jobs (status, kind, created_at DESC);
-- `error:` finds a substring of the last error among a million jobs by trigrams; only jobs
-- that failed at least once carry an error, so the index stays small and cheap to keep.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX jobs_error_trgm ON jobs USING gin (last_error gin_trgm_ops)
WHERE last_error IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- Provider calls, per tenant, provider and model, by minute, hour and in total; workers add
-- what they counted every few seconds.
CREATE TABLE provider_calls (
    tenant_id    bigint NOT NULL,
    provider     text NOT NULL,
    model        text NOT NULL,
    grain        text NOT NULL CHECK (grain IN ('minute', 'hour', 'total')),
    period       timestamptz NOT NULL,
    calls        bigint NOT NULL DEFAULT 0,
    errors_429   bigint NOT NULL DEFAULT 0,
    errors_5xx   bigint NOT NULL DEFAULT 0,
    errors_other bigint NOT NULL DEFAULT 0,
    retries      bigint NOT NULL DEFAULT 0,
    wait_ms      double precision NOT NULL DEFAULT 0,
    call_ms      double precision NOT NULL DEFAULT 0,
    tokens_in    bigint NOT NULL DEFAULT 0,
    tokens_out   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (grain, period, tenant_id, provider, model)
);

-- What each provider's limiter is doing, installation-wide: the last rate limit it met and
-- until when the server asked it to wait.
CREATE TABLE provider_limits (
    provider      text NOT NULL,
    model         text NOT NULL,
    last_limited_at timestamptz,
    limited_until timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, model)
);

-- ---------------------------------------------------------------------------------------------
-- A paused kind stays in the ledger; workers do not claim it and the sweeper does not
-- re-deliver it until it is resumed. Installation-wide: only an operator pauses.
CREATE TABLE paused_kinds (
    kind      text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by bigint REFERENCES api_keys (id) ON DELETE SET NULL
);

-- Browser sessions of the dashboard: the cookie holds a random token, stored here hashed, and
-- the session dies with its key (revoked: refused on the next request; deleted: cascaded).
CREATE TABLE dashboard_sessions (
    token_hash bytea PRIMARY KEY,
    key_id     bigint NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    csrf_token text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

-- A bulk replay is shown first: the exact dead letters counted are kept here, and the
-- confirmation acts on those and no others.
CREATE TABLE replay_previews (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   bigint,          -- NULL: an operator's preview across tenants
    key_id      bigint NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    filter      jsonb NOT NULL,
    dead_letter_ids bigint[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);

-- Every action on the ledger: who (the key), what, on which tenant, how many, when.
CREATE TABLE audit_log (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    tenant_id bigint,            -- NULL: installation-wide (pause, resume) or across tenants
    key_id    bigint REFERENCES api_keys (id) ON DELETE SET NULL,
    key_name  text NOT NULL,
    action    text NOT NULL,
    target    text,
    filter    jsonb,
    affected  integer NOT NULL DEFAULT 0,
    skipped   integer NOT NULL DEFAULT 0,
    via       text NOT NULL CHECK (via IN ('api', 'dashboard'))
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, at DESC);
CREATE INDEX audit_log_at ON audit_log (at DESC);
