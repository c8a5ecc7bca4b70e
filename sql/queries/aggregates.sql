-- What the dashboard and /metrics read: maintained counts and timings (migration 0012), never
-- a count(*) over the ledger. $1 is a tenant id, or NULL for an operator's view of all tenants.

-- name: fold
SELECT fold_job_aggregates();

-- Folded counts plus the deltas not folded yet, in one statement: exact at its snapshot.
-- name: counts
SELECT kind, status, sum(n)::bigint AS n FROM (
    SELECT kind, status, n FROM job_counts WHERE $1::bigint IS NULL OR tenant_id = $1
    UNION ALL
    SELECT kind, status, n FROM job_count_deltas WHERE $1::bigint IS NULL OR tenant_id = $1
) c
GROUP BY kind, status HAVING sum(n) <> 0;

-- Finished attempts per period: $2 is the grain ('minute' or 'hour'), $3 the first period.
-- name: series
SELECT period, sum(done)::bigint AS done, sum(retried)::bigint AS retried,
       sum(dead)::bigint AS dead
FROM job_stats
WHERE grain = $2 AND period >= $3 AND ($1::bigint IS NULL OR tenant_id = $1)
GROUP BY period ORDER BY period;

-- Per kind since $3 at grain $2: outcomes and the histograms of wait and run time.
-- name: timings
SELECT kind, sum(done)::bigint AS done, sum(retried)::bigint AS retried,
       sum(dead)::bigint AS dead, hist_sum(wait_hist) AS wait_hist,
       hist_sum(run_hist) AS run_hist, sum(run_ms) AS run_ms, sum(wait_ms) AS wait_ms
FROM job_stats
WHERE grain = $2 AND period >= $3 AND ($1::bigint IS NULL OR tenant_id = $1)
GROUP BY kind ORDER BY kind;

-- The oldest due job of each kind: one index probe per (tenant, kind) that has queued jobs.
-- name: oldest_due
SELECT c.kind, min(o.run_after) AS oldest_due
FROM (SELECT DISTINCT tenant_id, kind FROM job_counts
      WHERE status IN ('queued', 'retrying') AND n > 0
        AND ($1::bigint IS NULL OR tenant_id = $1)) c
CROSS JOIN LATERAL (
    SELECT run_after FROM jobs
    WHERE status = 'queued' AND kind = c.kind AND tenant_id = c.tenant_id
      AND run_after <= now()
    ORDER BY run_after LIMIT 1
) o
GROUP BY c.kind;

-- Workers running now or stopped within the hour, with the jobs each holds ($1's only, for a
-- tenant). $2 is the window after which a silent worker counts as lost.
-- name: workers
SELECT w.id, w.hostname, w.pid, w.queue_name, w.started_at, w.last_seen_at, w.stopped_at,
       extract(epoch FROM now() - w.last_seen_at)::float8 AS heartbeat_age_s,
       (w.stopped_at IS NULL AND w.last_seen_at < now() - make_interval(secs => $2)) AS lost,
       (SELECT count(*) FROM jobs j
        WHERE j.status = 'running' AND j.worker_id = w.id
          AND ($1::bigint IS NULL OR j.tenant_id = $1)) AS in_hand
FROM workers w
WHERE w.stopped_at IS NULL OR w.stopped_at > now() - interval '1 hour'
ORDER BY w.stopped_at IS NOT NULL, w.started_at DESC
LIMIT 200;

-- name: paused
SELECT kind, paused_at FROM paused_kinds ORDER BY kind;
