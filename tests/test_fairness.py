"""Fair queueing between tenants (pipeline/fairness.py), against real Redis and the real API.

The unit tests enqueue refs through `pipeline.jobs.enqueue`, as the API and the workers do,
and read the scores arq stored; the end-to-end test puts a bulk load and a single item
through the API and runs them with burst workers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from arq import constants as arq_constants
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from pipeline import fairness, items, jobs
from pipeline.fairness import FairQueueing
from pipeline.jobs import JobRef
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from pipeline.sweeper import sweep_once
from tests.conftest import drain

ON = FairQueueing(enabled=True, cost_ms=1.0)
OFF = FairQueueing(enabled=False)
A, B = 101, 202


@pytest.fixture
async def queue(settings: Settings) -> AsyncIterator[ArqRedis]:
    assert settings.redis_url
    redis = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    yield redis
    keys = [k async for k in redis.scan_iter(match=f"{settings.queue_name}*")]
    members = await redis.zrange(settings.queue_name, 0, -1)
    stale = [arq_constants.job_key_prefix + m.decode() for m in members]
    for chunk in range(0, len(keys + stale), 1000):
        await redis.delete(*(keys + stale)[chunk:chunk + 1000])
    await redis.aclose()


def refs(n: int, kind: str = jobs.ANALYZE, *, tenant_id: int | None = A,
         defer_s: float | None = None) -> list[JobRef]:
    return [JobRef(uuid.uuid4(), kind, tenant_id=tenant_id, defer_s=defer_s) for _ in range(n)]


async def put(pool: asyncpg.Pool, queue: ArqRedis, settings: Settings, batch: list[JobRef],
              fair: FairQueueing = ON, **kwargs: float) -> None:
    assert await jobs.enqueue(pool, queue, batch, queue_name=settings.queue_name, fair=fair,
                              **kwargs) == len(batch)


async def rank(queue: ArqRedis, settings: Settings, ref: JobRef) -> int:
    found = await queue.zrank(settings.queue_name, ref.queue_job_id)
    assert found is not None, f"{ref.queue_job_id} is not in the queue"
    return int(found)


async def score(queue: ArqRedis, settings: Settings, ref: JobRef) -> float:
    found = await queue.zscore(settings.queue_name, ref.queue_job_id)
    assert found is not None
    return float(found)


def test_the_arq_keys_the_script_reads_are_arqs() -> None:
    assert arq_constants.job_key_prefix == fairness.ARQ_JOB_KEY_PREFIX
    assert arq_constants.in_progress_key_prefix == fairness.ARQ_IN_PROGRESS_PREFIX


async def test_a_new_tenant_goes_ahead_of_a_backlog(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    backlog = refs(1000)
    for start in range(0, 1000, 250):  # four requests, as a bulk load sends them
        await put(pool, queue, settings, backlog[start:start + 250])
    single = refs(1, tenant_id=B)
    await put(pool, queue, settings, single)
    assert await rank(queue, settings, single[0]) <= 3
    # The backlog kept its own order, one cost apart.
    scores = [await score(queue, settings, r) for r in backlog[:5]]
    assert scores == [scores[0] + i for i in range(5)]
    # B's next item lands at the head again; A's next job lands behind its whole backlog.
    later_a, later_b = refs(1), refs(1, tenant_id=B)
    await put(pool, queue, settings, later_a)
    await put(pool, queue, settings, later_b)
    assert await rank(queue, settings, later_b[0]) <= 4
    assert await rank(queue, settings, later_a[0]) == 1002  # the last, behind B's two too


async def test_with_fair_queueing_off_jobs_wait_behind_the_backlog(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    backlog = refs(300)
    await put(pool, queue, settings, backlog, fair=OFF)
    await asyncio.sleep(0.01)  # a later millisecond than the last of the backlog
    single = refs(1, tenant_id=B)
    await put(pool, queue, settings, single, fair=OFF)
    assert await rank(queue, settings, single[0]) == 300
    # Scored by due time with the stage's head start, as before fair queueing.
    now_ms = time.time() * 1000
    head_start_ms = jobs.STAGE_HEAD_START_S[jobs.ANALYZE] * 1000
    assert abs(await score(queue, settings, single[0]) - (now_ms - head_start_ms)) < 5000
    assert await queue.exists(fairness.clock_key(settings.queue_name, A)) == 0


async def test_a_ref_without_a_tenant_is_scored_by_due_time(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    untagged = refs(1, jobs.EMBED, tenant_id=None)
    await put(pool, queue, settings, untagged)
    head_start_ms = jobs.STAGE_HEAD_START_S[jobs.EMBED] * 1000
    assert abs(await score(queue, settings, untagged[0])
               - (time.time() * 1000 - head_start_ms)) < 5000


async def test_a_lone_tenants_bulk_load_is_all_due_now(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    """No capacity idles: every score is already due, whatever the stage."""
    for kind in (jobs.REGULARIZE, jobs.ANALYZE, jobs.EMBED):
        await put(pool, queue, settings, refs(1000, kind))
    now_ms = time.time() * 1000
    due = await queue.zcount(settings.queue_name, "-inf", now_ms)
    assert due == await queue.zcard(settings.queue_name) == 3000


async def test_later_stages_overtake_their_tenants_earlier_ones(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    documents = refs(200, jobs.REGULARIZE)
    texts = refs(200, jobs.ANALYZE)
    await put(pool, queue, settings, documents)
    await put(pool, queue, settings, texts)
    embed = refs(1, jobs.EMBED)
    await put(pool, queue, settings, embed)
    assert await rank(queue, settings, embed[0]) <= 3  # ahead of both backlogs of A
    # An analyze overtakes A's regularize backlog, but not A's earlier analyze jobs.
    analyze = refs(1, jobs.ANALYZE)
    await put(pool, queue, settings, analyze)
    assert await score(queue, settings, analyze[0]) > await score(queue, settings, texts[-1])
    # An earlier stage waits behind everything A has queued, and pays for what overtook A's
    # regularize backlog: 200 analyze, the embed and the analyze, and then its own cost.
    regularize = refs(1, jobs.REGULARIZE)
    await put(pool, queue, settings, regularize)
    assert await rank(queue, settings, regularize[0]) == 402  # the last of 403
    assert (await score(queue, settings, regularize[0])
            - await score(queue, settings, documents[-1])) == 203


async def test_deferred_jobs_keep_their_wall_clock_time(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    quiet = refs(1, jobs.EXTRACT, defer_s=30.0)
    await put(pool, queue, settings, quiet)
    retry = refs(1)
    await put(pool, queue, settings, retry, defer_s=12.0)
    now_ms = time.time() * 1000
    assert abs(await score(queue, settings, quiet[0]) - (now_ms + 30_000)) < 2000
    assert abs(await score(queue, settings, retry[0]) - (now_ms + 12_000)) < 2000
    # Neither is charged to the tenant.
    assert await queue.exists(fairness.clock_key(settings.queue_name, A)) == 0


async def test_a_tenants_clock_expires_and_is_what_erasure_deletes(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    await put(pool, queue, settings, refs(10))
    keys = fairness.tenant_redis_keys(settings.queue_name, A)
    assert keys == [f"{settings.queue_name}:fair:{A}"]
    ttl_ms = await queue.pttl(keys[0])
    assert 0 < ttl_ms <= fairness.CLOCK_TTL_MS
    # The workers passed the backlog: at A's next enqueue the stale clock gives way to V.
    await queue.delete(settings.queue_name)
    await asyncio.sleep(0.05)
    before_ms = time.time() * 1000
    fresh = refs(1)
    await put(pool, queue, settings, fresh)
    assert await score(queue, settings, fresh[0]) >= round(before_ms) - fairness.LEAD_MS


async def test_a_job_already_queued_is_not_charged_again(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    backlog = refs(50)
    await put(pool, queue, settings, backlog)
    clocks = await queue.hgetall(fairness.clock_key(settings.queue_name, A))
    first = await score(queue, settings, backlog[0])
    await put(pool, queue, settings, backlog)  # the sweeper sends what it has not seen lately
    assert await queue.hgetall(fairness.clock_key(settings.queue_name, A)) == clocks
    assert await score(queue, settings, backlog[0]) == first


async def test_jobs_workers_hold_do_not_hold_virtual_time_back(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    backlog = refs(40)
    await put(pool, queue, settings, backlog)
    for ref in backlog[:30]:  # running: arq leaves them in the set until they end
        await queue.set(arq_constants.in_progress_key_prefix + ref.queue_job_id, b"1", px=60_000)
    # V is also never later than now - LEAD_MS, which moves 1 ms a millisecond: once the whole
    # backlog (40 ms of virtual time) lies behind that bound, only the held jobs can decide it.
    await asyncio.sleep(0.1)
    single = refs(1, tenant_id=B)
    await put(pool, queue, settings, single)
    assert 30 <= await rank(queue, settings, single[0]) <= 32


async def test_a_job_scored_long_ago_still_gets_a_days_key(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    """arq sets a job key's expiry from its score; a score days old would make it negative."""
    three_days_ms = 3 * 86_400_000
    await queue.zadd(settings.queue_name, {"old:1": time.time() * 1000 - three_days_ms})
    job = refs(1)
    await put(pool, queue, settings, job)
    assert await score(queue, settings, job[0]) < time.time() * 1000 - three_days_ms + 10_000
    ttl_ms = await queue.pttl(arq_constants.job_key_prefix + job[0].queue_job_id)
    assert fairness.JOB_EXPIRES_S * 1000 - 60_000 < ttl_ms <= fairness.JOB_EXPIRES_S * 1000


async def test_a_failed_scoring_loses_no_job(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis, tenant: tuple[int, str]
) -> None:
    """A script that fails is a failed enqueue: the ledger row waits for the sweeper."""
    clock = fairness.clock_key(settings.queue_name, tenant[0])
    await queue.set(clock, b"not a hash")  # the script's HGETALL fails on it
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant[0], settings=settings,
                                      item=items.NewItem(id="fair/one", content="Kept safe."))
    refs_ = jobs.refs_to_enqueue(result.jobs)
    assert {r.tenant_id for r in refs_} == {tenant[0]}
    assert await jobs.enqueue(pool, queue, refs_, queue_name=settings.queue_name, fair=ON) == 0
    assert await queue.zcard(settings.queue_name) == 0
    assert await pool.fetchval(
        "SELECT count(*) FROM jobs WHERE status = 'queued' AND enqueued_at IS NULL") == 2
    await queue.delete(clock)
    assert (await sweep_once(pool, queue, settings)).reenqueued == 2
    assert await queue.zcard(settings.queue_name) == 2
    assert await queue.exists(clock) == 1


@pytest.mark.slow  # loads the embedding model: most of its 40 s
async def test_a_single_item_is_ready_before_another_tenants_bulk_load(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    """Through the real API and workers: A loads 16 items, then B puts one; B's is ready
    while most of A's are still waiting."""
    count = 16
    async with httpx.AsyncClient(base_url=api_url, timeout=60) as http:
        bulk = [{"id": f"bulk/{i}", "content": f"Bulk document number {i} about rivers."}
                for i in range(count)]
        r = await http.post("/v1/items/batch", json={"items": bulk},
                            headers={"Authorization": f"Bearer {tenant[1]}"})
        assert r.status_code == 202 and len(r.json()["accepted"]) == count, r.text[:300]
        r = await http.post("/v1/items", json={"id": "single", "content": "One note on lakes."},
                            headers={"Authorization": f"Bearer {other_tenant[1]}"})
        assert r.status_code == 202, r.text
    await drain(settings.model_copy(update={"worker_max_jobs": 1}), pool)
    finished = await pool.fetch(
        "SELECT tenant_id, item_id, max(finished_at) AS at FROM jobs GROUP BY 1, 2")
    single_at = next(r["at"] for r in finished if r["tenant_id"] == other_tenant[0])
    bulk_after = sum(r["at"] > single_at for r in finished if r["tenant_id"] == tenant[0])
    assert bulk_after >= count * 3 // 4, f"only {bulk_after} of {count} bulk items finished after"
    assert await pool.fetchval("SELECT count(*) FROM items WHERE status = 'ready'") == count + 1
