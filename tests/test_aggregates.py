"""The ledger's aggregates (migration 0012, pipeline/aggregates.py) against the ledger itself.

The triggers on `jobs` keep counts per (tenant, kind, state) and attempt timings; these tests
drive the real ledger paths (the runner, the operator's retry, cancel and replay, the sweeper,
a tenant's deletion) and compare every figure with a count over `jobs` and `job_attempts`
taken in the same snapshot. A `probe` task, registered for these tests only, fails on the
attempts its payload names, so retries and dead letters happen on purpose.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from fractions import Fraction
from typing import Any

import asyncpg
import pytest

from pipeline import aggregates, items, jobs, ledger, runner, sweeper, tenants
from pipeline.db import Q, create_pool
from pipeline.errors import PermanentError, TransientError
from pipeline.jobs import JobSpec
from pipeline.settings import Settings
from pipeline.tasks import TASKS, Deps

FOLD_LOCK = 7314159266  # fold_job_aggregates()'s advisory lock
ALL_STATES = {"waiting", "queued", "running", "retrying", "done", "dead", "cancelled"}
Nested = dict[str, dict[str, int]]


# -- helpers -----------------------------------------------------------------------------------


class FakeQueue:
    """The one method of arq's pool the runner and the sweeper call; records the deliveries."""

    def __init__(self) -> None:
        self.sent: list[str | None] = []

    async def enqueue_job(self, function: str, *args: Any, _job_id: str | None = None,
                          _queue_name: str | None = None, _defer_by: float | None = None
                          ) -> object:
        self.sent.append(_job_id)
        return object()


async def probe(job: asyncpg.Record, deps: Deps):  # type: ignore[no-untyped-def]
    """Fails on the attempts its payload's plan names ('transient' or 'permanent')."""
    plan = job["payload"].get("plan", [])
    mode = plan[job["attempts"] - 1] if job["attempts"] <= len(plan) else "ok"
    if mode == "transient":
        raise TransientError("upstream answered 503")
    if mode == "permanent":
        raise PermanentError("the input is corrupt")

    async def write(conn: asyncpg.Connection) -> None:
        return None

    return write


@pytest.fixture(autouse=True)
def probe_task() -> Iterator[None]:
    TASKS["probe"] = probe
    yield
    TASKS.pop("probe")


def deps_for(pool: asyncpg.Pool, settings: Settings, worker_id: str = "w-test") -> Deps:
    return Deps(pool=pool, settings=settings, queue=FakeQueue(), worker_id=worker_id)


async def new_probe(pool: asyncpg.Pool | asyncpg.Connection, tenant_id: int,
                    plan: list[str] | None = None, *, max_attempts: int = 5,
                    kind: str = "probe") -> uuid.UUID:
    (row,) = await jobs.create_jobs(
        pool, tenant_id=tenant_id, item_id=None, version=None, specs=[JobSpec(kind)],
        max_attempts=lambda _kind: max_attempts, payload={"plan": plan or []})
    return row["id"]


async def run(deps: Deps, job_id: uuid.UUID, kind: str = "probe") -> str:
    return await runner.run_job(str(job_id), kind, deps)


async def run_to_end(deps: Deps, job_id: uuid.UUID) -> list[str]:
    """Attempt after attempt until the job is no longer retried (backoff here is < 0.2 s and a
    claim takes a job due within the second)."""
    outcomes = [await run(deps, job_id)]
    while outcomes[-1] == "retry":
        outcomes.append(await run(deps, job_id))
    return outcomes


def nest(rows: list[asyncpg.Record]) -> Nested:
    out: Nested = {}
    for r in rows:
        out.setdefault(r["kind"], {})[r["status"]] = r["n"]
    return out


async def direct_counts(conn: asyncpg.Pool | asyncpg.Connection, tenant_id: int | None
                        ) -> Nested:
    """What the aggregates stand for: a count over the ledger."""
    return nest(await conn.fetch(
        "SELECT kind, job_state(status, last_error) AS status, count(*) AS n FROM jobs "
        "WHERE $1::bigint IS NULL OR tenant_id = $1 GROUP BY 1, 2", tenant_id))


async def folded_counts(conn: asyncpg.Pool | asyncpg.Connection, tenant_id: int | None
                        ) -> Nested:
    """job_counts alone, without the deltas not folded yet."""
    return nest(await conn.fetch(
        "SELECT kind, status, sum(n)::bigint AS n FROM job_counts "
        "WHERE $1::bigint IS NULL OR tenant_id = $1 GROUP BY 1, 2 HAVING sum(n) <> 0",
        tenant_id))


async def assert_counts_exact(pool: asyncpg.Pool, tenant_ids: list[int]) -> None:
    """aggregates.counts against the ledger, per tenant and for all, in one snapshot each."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        for t in [*tenant_ids, None]:
            got = await aggregates.counts(conn, t)  # type: ignore[arg-type]
            want = await direct_counts(conn, t)
            assert got == want, f"tenant {t}: aggregates {got} != ledger {want}"


async def fold_and_check(pool: asyncpg.Pool, tenant_ids: list[int]) -> None:
    assert await aggregates.fold(pool) is True
    assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") == 0
    assert await pool.fetchval("SELECT count(*) FROM job_stat_deltas") == 0
    await assert_counts_exact(pool, tenant_ids)
    for t in [*tenant_ids, None]:  # the folded table alone is the truth now
        assert await folded_counts(pool, t) == await direct_counts(pool, t)


async def put_text(pool: asyncpg.Pool, settings: Settings, tenant_id: int, item_id: str,
                   content: str) -> dict[str, uuid.UUID]:
    """An item through the real put path; its jobs by kind (analyze, summarize, embed)."""
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant_id, settings=settings,
                                      item=items.NewItem(id=item_id, content=content))
    return {j["kind"]: j["id"] for j in result.jobs}


async def job_status(pool: asyncpg.Pool, job_id: uuid.UUID) -> str:
    return await pool.fetchval("SELECT job_state(status, last_error) FROM jobs WHERE id = $1",
                               job_id)


# -- 1. counts through a realistic workload ----------------------------------------------------


async def test_counts_equal_the_ledger_through_a_realistic_workload(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    doomed = await tenants.ensure_tenant(pool, "doomed")
    ids = [tenant[0], other_tenant[0], doomed]
    deps = deps_for(pool, settings)
    fresh = settings.max_attempts_for
    per_tenant: dict[int, dict[str, Any]] = {}

    # Phase 1: items put and partly processed by the real tasks, probes failing on purpose.
    for t in ids:
        doc1 = await put_text(pool, settings, t, "doc-1", "Apples grow on trees. " * 30)
        doc2 = await put_text(pool, settings, t, "doc-2", "Pears ripen off the tree. " * 30)
        assert await run(deps, doc1["analyze"], "analyze") == "done"  # releases doc-1's embed
        assert await run(deps, doc1["summarize"], "summarize") == "done"
        assert await job_status(pool, doc1["embed"]) == "queued"
        # Cancelling doc-2's analyze cancels its waiting embed; the retry restores both.
        await ledger.cancel_job(pool, t, doc2["analyze"])
        assert await job_status(pool, doc2["embed"]) == "cancelled"
        await ledger.retry_job(pool, t, doc2["analyze"], fresh_attempts=fresh)
        assert await job_status(pool, doc2["embed"]) == "waiting"

        p = {name: await new_probe(pool, t, plan, max_attempts=max_attempts)
             for name, plan, max_attempts in [
                 ("ok", [], 5), ("flaky", ["transient"], 5),
                 ("exhausted", ["transient", "transient"], 2), ("permanent", ["permanent"], 5),
                 ("retrying", ["transient"] * 3, 5), ("to_retry", ["transient"] * 3, 5),
                 ("cancel", [], 5), ("running", [], 5), ("lease", ["transient"], 5)]}
        assert await run_to_end(deps, p["ok"]) == ["done"]
        assert await run_to_end(deps, p["flaky"]) == ["retry", "done"]
        assert await run_to_end(deps, p["exhausted"]) == ["retry", "dead"]
        assert await run_to_end(deps, p["permanent"]) == ["dead"]
        assert await run(deps, p["retrying"]) == "retry"
        assert await run(deps, p["to_retry"]) == "retry"
        assert await job_status(pool, p["to_retry"]) == "retrying"
        # An operator's retry of a backing-off job: still 'queued', but no longer 'retrying'.
        await ledger.retry_job(pool, t, p["to_retry"], fresh_attempts=fresh)
        assert await job_status(pool, p["to_retry"]) == "queued"
        await ledger.cancel_job(pool, t, p["cancel"])
        assert await pool.fetchrow(Q["jobs.claim"], p["running"], "w-other", 60) is not None
        assert await run(deps, p["lease"]) == "retry"
        per_tenant[t] = {"doc1": doc1, "doc2": doc2, "probes": p}

    states = {s for by_state in (await direct_counts(pool, None)).values() for s in by_state}
    assert states == ALL_STATES  # the workload reached every state an operator sees
    assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") > 0  # nothing folded
    await assert_counts_exact(pool, ids)
    await fold_and_check(pool, ids)

    # Phase 2: replays, a superseding put, an expired lease the sweeper reclaims (the sweep
    # folds too), then more changes after that fold.
    for t in ids:
        p = per_tenant[t]["probes"]
        letter = await pool.fetchval("SELECT id FROM dead_letters WHERE job_id = $1",
                                     p["permanent"])
        refs = await ledger.replay(pool, t, fresh_attempts=fresh, dead_letter_id=letter)
        assert [r.id for r in refs] == [p["permanent"]]
        assert await run_to_end(deps, p["permanent"]) == ["done"]  # the plan failed attempt 1
        # A filtered replay of the rest: the exhausted probe goes back to the queue.
        refs = await ledger.replay(pool, t, fresh_attempts=fresh,
                                   flt=ledger.DeadLetterFilter(kind="probe"))
        assert [r.id for r in refs] == [p["exhausted"]]
        assert await job_status(pool, p["exhausted"]) == "queued"
        # New content for doc-1 cancels its queued embed and queues a new version's jobs.
        await put_text(pool, settings, t, "doc-1", "Apples fall in autumn. " * 30)
        assert await job_status(pool, per_tenant[t]["doc1"]["embed"]) == "cancelled"
        # The 'lease' probe, retrying, is claimed with a lease that has already expired.
        assert await pool.fetchrow(Q["jobs.claim"], p["lease"], "w-gone", 0) is not None
    await assert_counts_exact(pool, ids)
    result = await sweeper.sweep_once(pool, FakeQueue(), settings)
    assert result.reclaimed == len(ids)
    for t in ids:
        # Back to the queue with the error of its failed first attempt: retrying.
        assert await job_status(pool, per_tenant[t]["probes"]["lease"]) == "retrying"
        assert await run_to_end(deps, per_tenant[t]["probes"]["lease"]) == ["done"]
        assert await run(deps, per_tenant[t]["doc2"]["analyze"], "analyze") == "done"
    assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") > 0
    await assert_counts_exact(pool, ids)
    await fold_and_check(pool, ids)

    # Phase 3: a tenant deleted; ON DELETE CASCADE removes its jobs.
    before = await direct_counts(pool, doomed)
    assert sum(sum(s.values()) for s in before.values()) > 10
    await pool.execute("DELETE FROM tenants WHERE id = $1", doomed)
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE tenant_id = $1", doomed) == 0
    assert await aggregates.counts(pool, doomed) == {}
    await assert_counts_exact(pool, ids)
    await fold_and_check(pool, ids)
    assert await pool.fetchval("SELECT count(*) FROM job_counts WHERE tenant_id = $1",
                               doomed) == 0


async def test_counts_survive_a_truncate_of_the_ledger(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    """TRUNCATE fires no row or DELETE trigger: the counts must still drop to nothing."""
    ids = [tenant[0], other_tenant[0]]
    deps = deps_for(pool, settings)
    for t in ids:
        await run_to_end(deps, await new_probe(pool, t, ["transient"]))
        await new_probe(pool, t)
    assert await aggregates.fold(pool) is True
    await new_probe(pool, ids[0])                      # a delta not folded yet
    await pool.execute("TRUNCATE jobs CASCADE")
    assert await aggregates.counts(pool, None) == {}
    await fold_and_check(pool, ids)
    await new_probe(pool, ids[1])                      # counting goes on from zero
    await fold_and_check(pool, ids)
    assert await aggregates.counts(pool, ids[1]) == {"probe": {"queued": 1}}


# -- 2. job_stats against the attempts ---------------------------------------------------------


async def stats_by_grain(pool: asyncpg.Pool, tenant_id: int, kind: str
                         ) -> dict[str, asyncpg.Record]:
    rows = await pool.fetch(
        "SELECT grain, sum(done)::bigint AS done, sum(retried)::bigint AS retried, "
        "sum(dead)::bigint AS dead, hist_sum(run_hist) AS run_hist, "
        "hist_sum(wait_hist) AS wait_hist, sum(run_ms) AS run_ms, sum(wait_ms) AS wait_ms, "
        "count(*) AS periods "
        "FROM job_stats WHERE tenant_id = $1 AND kind = $2 GROUP BY grain", tenant_id, kind)
    return {r["grain"]: r for r in rows}


async def test_job_stats_equal_the_attempts_outcomes(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    t = tenant[0]
    deps = deps_for(pool, settings)
    plans: list[tuple[list[str], int]] = (
        [([], 5)] * 5 + [(["transient"], 5)] * 3 + [(["transient", "transient"], 2)] * 2
        + [(["permanent"], 5)] + [(["transient", "transient", "transient"], 5)]
    )
    for plan, max_attempts in plans:
        await run_to_end(deps, await new_probe(pool, t, plan, max_attempts=max_attempts))
    # Another tenant's attempts must not leak into this tenant's rows.
    await run_to_end(deps, await new_probe(pool, other_tenant[0], ["transient"]))
    # A queued job an operator dead-letters never ran: a dead outcome without a run time.
    never_ran = await new_probe(pool, t)
    assert await pool.fetchrow(Q["jobs.mark_dead"], never_ran, None, "given up") is not None
    # Claimed and still running: a claim (a wait) without an outcome yet.
    assert await pool.fetchrow(Q["jobs.claim"], await new_probe(pool, t), "w-x", 60)
    assert await aggregates.fold(pool) is True

    outcomes = Counter(dict(await pool.fetch(
        "SELECT a.outcome, count(*) FROM job_attempts a JOIN jobs j ON j.id = a.job_id "
        "WHERE a.tenant_id = $1 AND j.kind = 'probe' GROUP BY a.outcome", t)))
    claims = await pool.fetchval("SELECT count(*) FROM job_attempts WHERE tenant_id = $1", t)
    assert outcomes == {"done": 9, "retry": 8, "dead": 3, None: 1}
    finished = outcomes["done"] + outcomes["retry"] + outcomes["dead"]
    attempt_ms = await pool.fetchval(
        "SELECT sum(extract(epoch FROM finished_at - started_at) * 1000) FROM job_attempts "
        "WHERE tenant_id = $1 AND finished_at IS NOT NULL", t)

    stats = await stats_by_grain(pool, t, "probe")
    assert set(stats) == {"minute", "hour", "total"}
    assert stats["total"]["periods"] == 1
    for grain, row in stats.items():
        assert (row["done"], row["retried"], row["dead"]) == (
            outcomes["done"], outcomes["retry"], outcomes["dead"] + 1), grain
        assert len(row["run_hist"]) == len(row["wait_hist"]) == aggregates.HISTOGRAM_BUCKETS
        assert sum(row["run_hist"]) == finished, grain  # the never-run dead job has no run
        assert sum(row["wait_hist"]) == claims, grain
        # The run time sums the attempts' (the trigger reads the clock a little later).
        assert attempt_ms - 1 <= row["run_ms"] <= attempt_ms + 50 * finished, grain
        assert row["wait_ms"] >= 0
    other = await stats_by_grain(pool, other_tenant[0], "probe")
    assert (other["total"]["done"], other["total"]["retried"]) == (1, 1)

    # A second fold adds nothing; more attempts add exactly theirs.
    assert await aggregates.fold(pool) is True
    assert (await stats_by_grain(pool, t, "probe"))["total"]["done"] == outcomes["done"]
    await run_to_end(deps, await new_probe(pool, t, ["transient"]))
    assert await aggregates.fold(pool) is True
    total = (await stats_by_grain(pool, t, "probe"))["total"]
    assert (total["done"], total["retried"]) == (outcomes["done"] + 1, outcomes["retry"] + 1)
    assert sum(total["wait_hist"]) == claims + 2


async def test_job_stats_bucket_exact_durations(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """Waits and runs of known length land in the buckets 2^(b/2) ms says, and the sums add."""
    t = tenant[0]
    claimed: dict[str, uuid.UUID] = {}
    async with pool.acquire() as conn, conn.transaction():
        # Inside one transaction now() stands still: the waits are exact.
        for name, wait_s in [("w10s", 10), ("w100s", 100), ("w0", 0)]:
            job_id = await new_probe(conn, t)
            await conn.execute(
                "UPDATE jobs SET created_at = now() - interval '1 hour', "
                "run_after = now() - make_interval(secs => $2) WHERE id = $1", job_id, wait_s)
            assert await conn.fetchrow(Q["jobs.claim"], job_id, "w-x", 600) is not None
            claimed[name] = job_id
        # The attempts started 3 s and 60 s ago (a change of no status appends nothing).
        await conn.execute("UPDATE jobs SET started_at = now() - interval '3 seconds' "
                           "WHERE id = ANY($1::uuid[])", [claimed["w10s"], claimed["w0"]])
        await conn.execute("UPDATE jobs SET started_at = now() - interval '60 seconds' "
                           "WHERE id = $1", claimed["w100s"])
    assert await pool.fetchval("SELECT count(*) FROM job_stat_deltas") == 3  # the claims only
    assert await pool.fetch(Q["jobs.complete"], claimed["w10s"], "w-x")
    assert await pool.fetchrow(Q["jobs.schedule_retry"], claimed["w100s"], "w-x", 5.0, "503")
    assert await pool.fetchrow(Q["jobs.mark_dead"], claimed["w0"], "w-x", "corrupt")
    assert await aggregates.fold(pool) is True

    epoch = (await pool.fetchval("SELECT 'epoch'::timestamptz"))
    (row,) = await aggregates.timings(pool, t, "total", epoch)
    assert (row["kind"], row["done"], row["retried"], row["dead"]) == ("probe", 1, 1, 1)
    wait, run_hist = list(row["wait_hist"]), list(row["run_hist"])
    # 10 000 ms: 2^13 < 10 000 <= 2^13.5, bucket 27; 100 000 ms: bucket 34; 0 ms: bucket 0.
    assert {b: n for b, n in enumerate(wait) if n} == {0: 1, 27: 1, 34: 1}
    # 3 000 ms (+ the moment the statement took): bucket 24 (2^11.5 < 3 000 <= 2^12), twice;
    # 60 000 ms: bucket 32 (2^15.5 < 60 000 <= 2^16).
    assert {b: n for b, n in enumerate(run_hist) if n} == {24: 2, 32: 1}
    assert row["wait_ms"] == pytest.approx(110_000, abs=1e-6)
    assert 66_000 <= row["run_ms"] < 66_000 + 1_000
    assert aggregates.percentile_ms(wait, 0.5) == aggregates.bucket_upper_ms(27)
    assert aggregates.percentile_ms(wait, 0.95) == aggregates.bucket_upper_ms(34)
    assert aggregates.percentile_ms(run_hist, 0.5) == aggregates.bucket_upper_ms(24)


async def test_an_early_claim_waits_no_negative_time(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """A claim may take a job up to a second before it is due; its wait is 0, not negative
    (a negative one would lower the wait sums /metrics exports as a histogram's _sum)."""
    job_id = await new_probe(pool, tenant[0])
    await pool.execute("UPDATE jobs SET run_after = now() + interval '0.8 seconds' "
                       "WHERE id = $1", job_id)
    assert await pool.fetchrow(Q["jobs.claim"], job_id, "w-x", 60) is not None
    (ms,) = await pool.fetch("SELECT ms FROM job_stat_deltas WHERE outcome = 'claim'")
    assert ms["ms"] >= 0


async def test_a_takeover_of_an_expired_lease_counts_a_retry_and_a_claim(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """Another worker taking a job whose lease ran out keeps it running: the lost attempt
    still counts (as a retry, as when the sweeper hands it back) and so does the new claim."""
    job_id = await new_probe(pool, tenant[0])
    assert await pool.fetchrow(Q["jobs.claim"], job_id, "w-first", 60) is not None
    await pool.execute("UPDATE jobs SET lease_until = now() - interval '2 seconds' "
                       "WHERE id = $1", job_id)
    taken = await pool.fetchrow(Q["jobs.claim"], job_id, "w-second", 60)
    assert taken is not None and taken["attempts"] == 2
    rows = await pool.fetch("SELECT outcome, ms FROM job_stat_deltas ORDER BY outcome")
    outcomes = [r["outcome"] for r in rows]
    assert outcomes == ["claim", "claim", "retry"]
    takeover_wait = max(r["ms"] for r in rows if r["outcome"] == "claim")
    assert 1500 <= takeover_wait < 60_000  # from the lease's end, about 2 s ago


# -- 3. percentiles from histograms ------------------------------------------------------------


def hist(**buckets: int) -> list[int]:
    h = [0] * aggregates.HISTOGRAM_BUCKETS
    for name, n in buckets.items():
        h[int(name[1:])] = n
    return h


@pytest.mark.parametrize(("histogram", "q", "expected"), [
    (None, 0.5, None),
    ([], 0.5, None),
    ([0] * 48, 0.95, None),
    (hist(b0=7), 0.0, 1.0),
    (hist(b0=7), 0.5, 1.0),
    (hist(b0=7), 1.0, 1.0),
    (hist(b10=5), 0.0, 32.0),
    (hist(b10=5), 0.5, 32.0),
    (hist(b10=5), 0.99, 32.0),
    (hist(b10=1), 1.0, 32.0),
    (hist(b1=1, b2=1), 0.5, math.sqrt(2)),
    (hist(b1=1, b2=1), 0.51, 2.0),
    # p95 exactly at the edge of the tail, then inside it.
    (hist(b2=95, b40=5), 0.5, 2.0),
    (hist(b2=95, b40=5), 0.95, 2.0),
    (hist(b2=95, b40=5), 0.96, 2.0 ** 20),
    (hist(b2=94, b40=6), 0.95, 2.0 ** 20),
    (hist(b2=19, b47=1), 0.95, 2.0),
    (hist(b2=18, b47=2), 0.95, 2.0 ** 23.5),
    (hist(b47=3), 0.5, 2.0 ** 23.5),
])
def test_percentile_ms_edge_cases(histogram: list[int] | None, q: float,
                                  expected: float | None) -> None:
    got = aggregates.percentile_ms(histogram, q)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_percentile_ms_is_the_nearest_rank_bucket() -> None:
    rng = random.Random(12)
    for _ in range(300):
        h = [rng.choice([0, 0, 0, 1, 2, 7, 40]) for _ in range(48)]
        if not sum(h):
            continue
        values = [b for b, n in enumerate(h) for _ in range(n)]
        for q in (0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0):
            rank = max(1, math.ceil(Fraction(str(q)) * len(values)))
            assert aggregates.percentile_ms(h, q) == aggregates.bucket_upper_ms(
                values[rank - 1]), (h, q)


async def test_sql_buckets_agree_with_bucket_upper_ms(pool: asyncpg.Pool) -> None:
    """duration_bucket (SQL) puts ms in bucket b iff 2^((b-1)/2) < ms <= 2^(b/2)."""
    cases: list[tuple[float | None, int]] = [(None, 0), (-5.0, 0), (0.0, 0), (0.5, 0), (1.0, 0),
                                             (1.01, 1), (1e12, 47)]
    for b in range(1, 48):
        inside = 2 ** ((b - 0.5) / 2)
        cases.append((inside, b))
        if b % 2 == 0:
            cases.append((float(2 ** (b // 2)), b))   # on the bound: still bucket b
            cases.append((2 ** (b // 2) * 1.001, min(b + 1, 47)))
    got = await pool.fetch("SELECT ms, duration_bucket(ms) AS b FROM unnest($1::float8[]) ms",
                           [ms for ms, _ in cases])
    assert [r["b"] for r in got] == [b for _, b in cases]
    for ms, b in cases:
        if ms is not None and 1 < ms < aggregates.bucket_upper_ms(46):
            assert aggregates.bucket_upper_ms(b - 1) < ms <= aggregates.bucket_upper_ms(b)


# -- 4. the overview ---------------------------------------------------------------------------


async def test_overview(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    a, b = tenant[0], other_tenant[0]
    await pool.execute(
        "INSERT INTO workers (id, hostname, pid, queue_name, started_at, last_seen_at, "
        "stopped_at) VALUES "
        "('w-fresh', 'h1', 1, 'q', now() - interval '1 hour', now(), NULL), "
        "('w-stale', 'h2', 2, 'q', now() - interval '1 hour', now() - interval '120 s', NULL),"
        "('w-stopped', 'h3', 3, 'q', now() - interval '2 hours', now() - interval '10 min', "
        " now() - interval '10 min')")
    deps = deps_for(pool, settings, "w-fresh")
    for plan in ([], [], ["transient"], ["permanent"]):
        await run_to_end(deps, await new_probe(pool, a, plan))
    await run_to_end(deps, await new_probe(pool, b, []))
    # w-stale holds two of tenant a's jobs and one of tenant b's.
    for t in (a, a, b):
        assert await pool.fetchrow(Q["jobs.claim"], await new_probe(pool, t), "w-stale", 600)
    # A summarize due 90 s ago, an analyze not due for an hour, a retrying probe not due yet.
    due = await new_probe(pool, a, kind="summarize")
    later = await new_probe(pool, a, kind="analyze")
    await pool.execute("UPDATE jobs SET run_after = now() - interval '90 s' WHERE id = $1", due)
    await pool.execute("UPDATE jobs SET run_after = now() + interval '1 hour' WHERE id = $1",
                       later)
    retrying = await new_probe(pool, b, ["transient"])
    assert await run(deps, retrying) == "retry"
    await pool.execute("UPDATE jobs SET run_after = now() + interval '1 hour' WHERE id = $1",
                       retrying)
    await pool.execute("INSERT INTO paused_kinds (kind) VALUES ('ocr'), ('embed')")

    ov = await aggregates.overview(pool, a, lost_after_s=30)
    assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") == 0  # it folded
    want = await direct_counts(pool, a)
    assert ov.counts == want
    assert set(ov.totals) == set(aggregates.STATES)
    for state in aggregates.STATES:
        assert ov.totals[state] == sum(k.get(state, 0) for k in want.values()), state
    assert ov.totals["done"] == 3 and ov.totals["dead"] == 1 and ov.totals["running"] == 2
    assert ov.totals["queued"] == 2
    assert ov.kinds == ["analyze", "summarize", "probe"]  # the pipeline's order, then others

    assert len(ov.last_hour) == 60 and len(ov.last_day) == 24
    assert [p.period for p in ov.last_hour] == [
        ov.last_hour[0].period + timedelta(minutes=i) for i in range(60)]
    assert [p.period for p in ov.last_day] == [
        ov.last_day[0].period + timedelta(hours=i) for i in range(24)]
    assert ov.last_hour[-1].period == ov.computed_at.replace(second=0, microsecond=0)
    assert ov.last_day[-1].period == ov.computed_at.replace(minute=0, second=0, microsecond=0)
    assert (ov.hour_done, ov.hour_failed) == (3, 2)   # a retry and a dead letter failed
    assert (ov.day_done, ov.day_failed) == (3, 2)
    (probe_timings,) = [k for k in ov.hour_timings if k.kind == "probe"]
    assert (probe_timings.done, probe_timings.failed) == (3, 2)
    assert probe_timings.run_p50_ms is not None and probe_timings.wait_p95_ms is not None

    assert set(ov.oldest_due_s) == {"summarize"}
    assert 89 <= ov.oldest_due_s["summarize"] <= 100

    workers = {w.id: w for w in ov.workers}
    assert set(workers) == {"w-fresh", "w-stale", "w-stopped"}
    assert (workers["w-stale"].lost, workers["w-stale"].stopped) == (True, False)
    assert workers["w-stale"].heartbeat_age_s >= 119
    assert (workers["w-fresh"].lost, workers["w-fresh"].stopped) == (False, False)
    assert (workers["w-stopped"].lost, workers["w-stopped"].stopped) == (False, True)
    assert ov.workers_alive == 1
    assert workers["w-stale"].in_hand == 2     # tenant b's running job is not shown to a
    assert workers["w-fresh"].in_hand == 0
    assert ov.paused == ["embed", "ocr"]

    ov_b = await aggregates.overview(pool, b, lost_after_s=30)
    assert ov_b.counts == await direct_counts(pool, b)
    assert ov_b.totals["running"] == 1 and ov_b.totals["retrying"] == 1
    assert {w.id: w.in_hand for w in ov_b.workers}["w-stale"] == 1
    assert ov_b.oldest_due_s == {}             # b's retrying probe is not due yet
    assert (ov_b.hour_done, ov_b.hour_failed) == (1, 1)

    ov_all = await aggregates.overview(pool, None, lost_after_s=30)
    assert ov_all.counts == await direct_counts(pool, None)
    assert {w.id: w.in_hand for w in ov_all.workers}["w-stale"] == 3
    assert (ov_all.hour_done, ov_all.hour_failed) == (4, 3)
    # A longer window: the stale worker is no longer lost.
    ov_long = await aggregates.overview(pool, None, lost_after_s=600)
    assert not {w.id: w.lost for w in ov_long.workers}["w-stale"]


async def test_overview_hours_line_up_whatever_the_servers_time_zone(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """The folder's session time zone must not move the minute and hour periods: with
    Asia/Kolkata (UTC+05:30) date_trunc('hour') falls on :30 UTC, where the overview, which
    counts hours in UTC, finds nothing."""
    db = await pool.fetchval("SELECT current_database()")
    await pool.execute(f"ALTER DATABASE {db} SET timezone TO 'Asia/Kolkata'")
    assert settings.database_url
    tz_pool = await create_pool(settings.database_url, max_size=2)
    try:
        assert await tz_pool.fetchval("SHOW timezone") == "Asia/Kolkata"
        deps = deps_for(tz_pool, settings)
        for plan in ([], [], ["transient"]):
            await run_to_end(deps, await new_probe(tz_pool, tenant[0], plan))
        ov = await aggregates.overview(tz_pool, tenant[0], lost_after_s=30)
        assert (ov.hour_done, ov.hour_failed) == (3, 1)
        assert (ov.day_done, ov.day_failed) == (3, 1)
        periods = await tz_pool.fetch("SELECT grain, period FROM job_stats WHERE grain <> 'total'")
        for r in periods:
            assert (r["period"].second, r["period"].microsecond) == (0, 0)
            if r["grain"] == "hour":
                assert r["period"].minute == 0, r["period"]
    finally:
        await tz_pool.close()


async def test_overview_shows_queue_latency_while_another_session_folds(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """The sweeper folds every few seconds; an overview whose own fold loses that race still
    shows the oldest due job of a kind that was not queued at the last fold."""
    holder = await asyncpg.connect(settings.database_url)
    try:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", FOLD_LOCK)
        due = await new_probe(pool, tenant[0], kind="summarize")
        await pool.execute("UPDATE jobs SET run_after = now() - interval '30 s' WHERE id = $1",
                           due)
        ov = await aggregates.overview(pool, tenant[0], lost_after_s=30)
        assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") > 0  # not folded
        assert ov.counts == {"summarize": {"queued": 1}}
        assert set(ov.oldest_due_s) == {"summarize"}
        assert 29 <= ov.oldest_due_s["summarize"] <= 40
    finally:
        await holder.close()


# -- 5. concurrency ----------------------------------------------------------------------------


@pytest.fixture
async def big_pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    assert settings.database_url
    p = await create_pool(settings.database_url, min_size=2, max_size=14)
    yield p
    await p.close()


async def test_two_concurrent_folds_count_once(
    settings: Settings, big_pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    pool, ids = big_pool, [tenant[0], other_tenant[0]]
    deps = deps_for(pool, settings)
    for t in ids:
        for plan in ([], ["transient"], ["permanent"]):
            await run_to_end(deps, await new_probe(pool, t, plan))
        await new_probe(pool, t)

    # One fold holds its lock until its transaction ends: a second one meanwhile does nothing.
    first = await pool.acquire()
    second = await pool.acquire()
    try:
        tx = first.transaction()
        await tx.start()
        assert await aggregates.fold(first) is True
        # Without the lock the second fold would wait on the first's rows (here: forever).
        assert await asyncio.wait_for(aggregates.fold(second), 5) is False
        await new_probe(second, ids[0])            # a change while the first fold is open
        await assert_counts_exact(pool, ids)        # exact on either side of the fold
        await tx.commit()
        await assert_counts_exact(pool, ids)
        assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") > 0  # the new job
        assert await aggregates.fold(second) is True
    finally:
        await pool.release(first)
        await pool.release(second)
    await fold_and_check(pool, ids)

    # Many folds at once, again and again, with changes in between: whatever wins, each delta
    # is added once.
    for round_ in range(5):
        for t in ids:
            await run_to_end(deps, await new_probe(pool, t, ["transient"] * (round_ % 2)))
        results = await asyncio.wait_for(
            asyncio.gather(*(aggregates.fold(pool) for _ in range(8))), 10)
        assert any(results)
        await assert_counts_exact(pool, ids)
        assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") == 0
    await fold_and_check(pool, ids)
    for t in ids:
        outcomes = Counter(dict(await pool.fetch(
            "SELECT outcome, count(*) FROM job_attempts WHERE tenant_id = $1 "
            "AND outcome IS NOT NULL GROUP BY outcome", t)))
        total = (await stats_by_grain(pool, t, "probe"))["total"]
        assert (total["done"], total["retried"], total["dead"]) == (
            outcomes["done"], outcomes["retry"], outcomes["dead"])
        assert sum(total["wait_hist"]) == await pool.fetchval(
            "SELECT count(*) FROM job_attempts WHERE tenant_id = $1", t)


async def test_counts_stay_exact_while_jobs_change_and_a_folder_loops(
    settings: Settings, big_pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    pool, ids = big_pool, [tenant[0], other_tenant[0]]
    kinds = ["probe", "analyze", "embed"]
    stop = asyncio.Event()
    ops: Counter[str] = Counter()
    folds: Counter[bool] = Counter()
    checks = 0

    async def pick(conn: asyncpg.Connection, status: str, n: int = 1,
                   worker: str | None = None) -> list[uuid.UUID]:
        return [r["id"] for r in await conn.fetch(
            "SELECT id FROM jobs WHERE status = $1 AND ($3::text IS NULL OR worker_id = $3) "
            "ORDER BY random() LIMIT $2", status, n, worker)]

    async def changer(seed: int) -> None:
        rng = random.Random(seed)
        me = f"w-{seed}"
        while not stop.is_set():
            op = rng.choice(["insert", "insert", "claim", "claim", "complete", "retry_later",
                             "dead", "requeue", "cancel", "delete", "rollback", "bulk"])
            async with pool.acquire() as conn:
                if op == "insert":
                    async with conn.transaction():
                        await jobs.create_jobs(
                            conn, tenant_id=rng.choice(ids), item_id=None, version=None,
                            specs=[JobSpec(rng.choice(kinds)) for _ in range(rng.randint(1, 4))],
                            max_attempts=lambda _k: 3)
                elif op == "claim":
                    for job_id in await pick(conn, "queued", 2):
                        await conn.fetchrow(Q["jobs.claim"], job_id, me, 60)
                elif op == "complete":
                    for job_id in await pick(conn, "running", 2, me):
                        await conn.fetch(Q["jobs.complete"], job_id, me)
                elif op == "retry_later":
                    for job_id in await pick(conn, "running", 1, me):
                        await conn.fetchrow(Q["jobs.schedule_retry"], job_id, me, 0.0, "503")
                elif op == "dead":
                    for job_id in await pick(conn, "running", 1, me):
                        await conn.fetchrow(Q["jobs.mark_dead"], job_id, me, "corrupt")
                elif op == "requeue":
                    for job_id in await pick(conn, rng.choice(["dead", "cancelled", "queued"])):
                        t = await conn.fetchval("SELECT tenant_id FROM jobs WHERE id = $1",
                                                job_id)
                        if t is not None:
                            await conn.fetchrow(Q["jobs.retry"], t, job_id, 3)
                elif op == "cancel":
                    for job_id in await pick(conn, "queued"):
                        t = await conn.fetchval("SELECT tenant_id FROM jobs WHERE id = $1",
                                                job_id)
                        if t is not None:
                            await conn.fetchrow(Q["jobs.cancel"], t, job_id)
                elif op == "delete":
                    await conn.execute(
                        "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE status IN "
                        "('done', 'cancelled', 'dead') ORDER BY random() LIMIT 3 "
                        "FOR UPDATE SKIP LOCKED)")
                elif op == "rollback":
                    # Changes that never commit must leave no delta behind.
                    tx = conn.transaction()
                    await tx.start()
                    await jobs.create_jobs(conn, tenant_id=rng.choice(ids), item_id=None,
                                           version=None, specs=[JobSpec("probe")],
                                           max_attempts=lambda _k: 3)
                    await conn.execute(
                        "UPDATE jobs SET status = 'cancelled' WHERE id IN (SELECT id FROM jobs "
                        "WHERE status = 'queued' LIMIT 5 FOR UPDATE SKIP LOCKED)")
                    await tx.rollback()
                else:  # one statement moving many rows between many states
                    await conn.execute(
                        "UPDATE jobs SET status = CASE status WHEN 'queued' THEN 'cancelled' "
                        "ELSE 'queued' END, last_error = CASE WHEN random() < 0.5 "
                        "THEN 'boom' END, worker_id = NULL "
                        "WHERE id IN (SELECT id FROM jobs WHERE status IN ('queued', 'dead', "
                        "'cancelled') ORDER BY random() LIMIT 6 FOR UPDATE SKIP LOCKED)")
            ops[op] += 1
            await asyncio.sleep(0)

    async def folder() -> None:
        while not stop.is_set():
            folds[await aggregates.fold(pool)] += 1
            await asyncio.sleep(0.005)

    async def checker() -> None:
        nonlocal checks
        while not stop.is_set():
            await assert_counts_exact(pool, ids)
            checks += 1
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(changer(seed)) for seed in range(4)]
    tasks += [asyncio.create_task(folder()), asyncio.create_task(folder()),
              asyncio.create_task(checker())]
    await asyncio.sleep(4)
    stop.set()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
    finally:
        for task in tasks:
            task.cancel()

    assert sum(ops.values()) > 200 and checks > 20 and folds[True] > 20, (ops, checks, folds)
    assert await pool.fetchval("SELECT count(*) FROM jobs") > 20
    states = {s for by_state in (await direct_counts(pool, None)).values() for s in by_state}
    assert {"queued", "retrying", "running", "cancelled"} <= states
    await assert_counts_exact(pool, ids)
    await fold_and_check(pool, ids)


# -- 6. paused kinds ---------------------------------------------------------------------------


async def test_a_paused_kind_is_neither_claimed_nor_redelivered(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    paused = await new_probe(pool, tenant[0])
    other = await new_probe(pool, tenant[0], kind="summarize")
    await pool.execute("INSERT INTO paused_kinds (kind) VALUES ('probe')")

    due = {r["id"] for r in await pool.fetch(Q["jobs.due_unenqueued"], 0.0, 100)}
    assert due == {other}                       # the other kind is re-delivered
    assert await pool.fetchrow(Q["jobs.claim"], paused, "w-x", 60) is None
    assert await pool.fetchrow(Q["jobs.claim"], other, "w-x", 60) is not None
    assert await job_status(pool, paused) == "queued"
    # Through the runner too: the delivery is skipped and the job stays queued.
    assert await run(deps_for(pool, settings), paused) == "skipped"
    assert await job_status(pool, paused) == "queued"
    ov = await aggregates.overview(pool, tenant[0], lost_after_s=30)
    assert ov.paused == ["probe"] and ov.counts["probe"] == {"queued": 1}

    await pool.execute("DELETE FROM paused_kinds WHERE kind = 'probe'")
    due = {r["id"] for r in await pool.fetch(Q["jobs.due_unenqueued"], 0.0, 100)}
    assert due == {paused}
    claimed = await pool.fetchrow(Q["jobs.claim"], paused, "w-x", 60)
    assert claimed is not None and claimed["id"] == paused and claimed["status"] == "running"
