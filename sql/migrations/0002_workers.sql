-- Live workers, for the operator's view. Workers serve every tenant, so this is the one table
-- without tenant_id; no tenant data is kept in it.
CREATE TABLE workers (
    id           text PRIMARY KEY,
    hostname     text NOT NULL,
    pid          integer NOT NULL,
    queue_name   text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz
);
CREATE INDEX workers_last_seen ON workers (last_seen_at DESC);
CREATE INDEX dead_letters_job ON dead_letters (job_id);
CREATE INDEX jobs_tenant_status ON jobs (tenant_id, status, kind);

-- The backoff chosen after a failed attempt, so an operator can see the delays grow.
ALTER TABLE job_attempts ADD COLUMN retry_delay_s double precision;
