-- Provider calls counted by the workers (pipeline/providers/usage.py), by minute, by hour and
-- in total, and the rate limits the providers imposed (migration 0012).

-- One row per (tenant, provider, model, minute) a worker counted, as parallel arrays; each is
-- added to its minute, its hour and the total at once. Rows are written in key order, so two
-- workers adding to the same totals lock them in the same order and never deadlock.
-- name: add_calls
INSERT INTO provider_calls AS p (tenant_id, provider, model, grain, period, calls, errors_429,
                                 errors_5xx, errors_other, retries, wait_ms, call_ms,
                                 tokens_in, tokens_out)
SELECT c.tenant_id, c.provider, c.model, g.grain,
       CASE g.grain WHEN 'total' THEN 'epoch'::timestamptz
                    ELSE date_trunc(g.grain, to_timestamp(c.minute * 60), 'UTC') END AS period,
       sum(c.calls), sum(c.errors_429), sum(c.errors_5xx), sum(c.errors_other),
       sum(c.retries), sum(c.wait_ms), sum(c.call_ms), sum(c.tokens_in), sum(c.tokens_out)
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
            $7::bigint[], $8::bigint[], $9::bigint[], $10::float8[], $11::float8[],
            $12::bigint[], $13::bigint[])
     AS c (tenant_id, provider, model, minute, calls, errors_429, errors_5xx, errors_other,
           retries, wait_ms, call_ms, tokens_in, tokens_out)
CROSS JOIN (VALUES ('minute'), ('hour'), ('total')) AS g (grain)
-- Counts of a tenant erased since the calls were made are dropped with it (pipeline/erasure.py).
WHERE c.tenant_id = 0 OR EXISTS (SELECT 1 FROM tenants t WHERE t.id = c.tenant_id
                                 AND t.status NOT IN ('deleting', 'deleted'))
GROUP BY g.grain, period, c.tenant_id, c.provider, c.model
ORDER BY g.grain, period, c.tenant_id, c.provider, c.model
ON CONFLICT (grain, period, tenant_id, provider, model) DO UPDATE
SET calls = p.calls + EXCLUDED.calls, errors_429 = p.errors_429 + EXCLUDED.errors_429,
    errors_5xx = p.errors_5xx + EXCLUDED.errors_5xx,
    errors_other = p.errors_other + EXCLUDED.errors_other,
    retries = p.retries + EXCLUDED.retries, wait_ms = p.wait_ms + EXCLUDED.wait_ms,
    call_ms = p.call_ms + EXCLUDED.call_ms, tokens_in = p.tokens_in + EXCLUDED.tokens_in,
    tokens_out = p.tokens_out + EXCLUDED.tokens_out;

-- Limits met, as epoch seconds: workers flush in any order, so the latest of each wins.
-- name: add_limits
INSERT INTO provider_limits AS l (provider, model, last_limited_at, limited_until, updated_at)
SELECT provider, model, to_timestamp(at_s), to_timestamp(until_s), now()
FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[]) AS u (provider, model, at_s,
                                                                      until_s)
ORDER BY provider, model
ON CONFLICT (provider, model) DO UPDATE
SET last_limited_at = greatest(l.last_limited_at, EXCLUDED.last_limited_at),
    limited_until = greatest(l.limited_until, EXCLUDED.limited_until),
    updated_at = now();

-- The pages read the last hour by minute and the last day by hour.
-- name: prune
DELETE FROM provider_calls
WHERE (grain = 'minute' AND period < now() - interval '3 hours')
   OR (grain = 'hour' AND period < now() - interval '8 days');

-- Per provider and model for tenant $1 (NULL: every tenant): the last hour from minute rows
-- (h_), the last day from hour rows (d_), and the installation-wide limits. A tenant sees the
-- models it called; an operator also sees models that were limited and not called.
-- name: summary
WITH recent AS (
    SELECT provider, model,
           sum(calls) FILTER (WHERE grain = 'minute') AS h_calls,
           sum(errors_429) FILTER (WHERE grain = 'minute') AS h_errors_429,
           sum(errors_5xx) FILTER (WHERE grain = 'minute') AS h_errors_5xx,
           sum(errors_other) FILTER (WHERE grain = 'minute') AS h_errors_other,
           sum(retries) FILTER (WHERE grain = 'minute') AS h_retries,
           sum(wait_ms) FILTER (WHERE grain = 'minute') AS h_wait_ms,
           sum(call_ms) FILTER (WHERE grain = 'minute') AS h_call_ms,
           sum(tokens_in) FILTER (WHERE grain = 'minute') AS h_tokens_in,
           sum(tokens_out) FILTER (WHERE grain = 'minute') AS h_tokens_out,
           sum(calls) FILTER (WHERE grain = 'hour') AS d_calls,
           sum(errors_429) FILTER (WHERE grain = 'hour') AS d_errors_429,
           sum(errors_5xx) FILTER (WHERE grain = 'hour') AS d_errors_5xx,
           sum(errors_other) FILTER (WHERE grain = 'hour') AS d_errors_other,
           sum(retries) FILTER (WHERE grain = 'hour') AS d_retries,
           sum(wait_ms) FILTER (WHERE grain = 'hour') AS d_wait_ms,
           sum(call_ms) FILTER (WHERE grain = 'hour') AS d_call_ms,
           sum(tokens_in) FILTER (WHERE grain = 'hour') AS d_tokens_in,
           sum(tokens_out) FILTER (WHERE grain = 'hour') AS d_tokens_out
    FROM provider_calls
    WHERE ((grain = 'minute' AND period > now() - interval '1 hour')
        OR (grain = 'hour' AND period > now() - interval '1 day'))
      AND ($1::bigint IS NULL OR tenant_id = $1)
    GROUP BY provider, model
)
SELECT coalesce(r.provider, l.provider) AS provider, coalesce(r.model, l.model) AS model,
       coalesce(r.h_calls, 0)::bigint AS h_calls,
       coalesce(r.h_errors_429, 0)::bigint AS h_errors_429,
       coalesce(r.h_errors_5xx, 0)::bigint AS h_errors_5xx,
       coalesce(r.h_errors_other, 0)::bigint AS h_errors_other,
       coalesce(r.h_retries, 0)::bigint AS h_retries,
       coalesce(r.h_wait_ms, 0)::float8 AS h_wait_ms,
       coalesce(r.h_call_ms, 0)::float8 AS h_call_ms,
       coalesce(r.h_tokens_in, 0)::bigint AS h_tokens_in,
       coalesce(r.h_tokens_out, 0)::bigint AS h_tokens_out,
       coalesce(r.d_calls, 0)::bigint AS d_calls,
       coalesce(r.d_errors_429, 0)::bigint AS d_errors_429,
       coalesce(r.d_errors_5xx, 0)::bigint AS d_errors_5xx,
       coalesce(r.d_errors_other, 0)::bigint AS d_errors_other,
       coalesce(r.d_retries, 0)::bigint AS d_retries,
       coalesce(r.d_wait_ms, 0)::float8 AS d_wait_ms,
       coalesce(r.d_call_ms, 0)::float8 AS d_call_ms,
       coalesce(r.d_tokens_in, 0)::bigint AS d_tokens_in,
       coalesce(r.d_tokens_out, 0)::bigint AS d_tokens_out,
       l.last_limited_at, l.limited_until
FROM recent r
FULL JOIN provider_limits l ON l.provider = r.provider AND l.model = r.model
WHERE r.provider IS NOT NULL OR $1::bigint IS NULL
ORDER BY 1, 2;

-- Every call counted, per provider and model across tenants (/metrics).
-- name: totals
SELECT provider, model, sum(calls)::bigint AS calls, sum(errors_429)::bigint AS errors_429,
       sum(errors_5xx)::bigint AS errors_5xx, sum(errors_other)::bigint AS errors_other,
       sum(retries)::bigint AS retries, sum(wait_ms) AS wait_ms, sum(call_ms) AS call_ms,
       sum(tokens_in)::bigint AS tokens_in, sum(tokens_out)::bigint AS tokens_out
FROM provider_calls
WHERE grain = 'total'
GROUP BY provider, model
ORDER BY provider, model;
