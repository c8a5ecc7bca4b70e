"""The outbox: the ledger is the truth, so work that never reached Redis is not lost."""

from __future__ import annotations

import uuid

import asyncpg
from arq import create_pool
from arq.connections import RedisSettings

from pipeline import items, jobs
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from pipeline.sweeper import sweep_once
from tests.conftest import drain


async def test_sweeper_enqueues_jobs_redis_never_got(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    # Commit an item and its ledger rows, and "crash" before the enqueue.
    async with pool.acquire() as conn, conn.transaction():
        await items.put_item(conn, tenant_id=tenant[0], settings=settings,
                             item=items.NewItem(id="orphan", content="Nobody enqueued me."))
    queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        assert await queue.zcard(settings.queue_name) == 0
        result = await sweep_once(pool, queue, settings)
        assert (result.reclaimed, result.reenqueued) == (0, 2)  # analyze and summarize
        assert await queue.zcard(settings.queue_name) == 2
        # Swept again within the grace period: nothing is enqueued twice.
        assert (await sweep_once(pool, queue, settings)).reenqueued == 0
    finally:
        await queue.aclose()
    await drain(settings, pool)
    assert await pool.fetchval("SELECT status FROM items WHERE id = 'orphan'") == "ready"


async def test_sweeper_reclaims_an_expired_lease(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant[0], settings=settings,
                                      item=items.NewItem(id="stuck", content="A dead worker."))
    job_id = result.jobs[0]["id"]
    # A worker claimed the job, then died: the row says running, its lease in the past.
    await pool.execute(
        "UPDATE jobs SET status = 'running', attempts = 1, worker_id = 'dead-worker',"
        " lease_until = now() - interval '1 second' WHERE id = $1", job_id)
    await pool.execute(
        "INSERT INTO job_attempts (tenant_id, job_id, attempt, worker_id) VALUES ($1, $2, 1, 'x')",
        tenant[0], job_id)
    queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        assert (await sweep_once(pool, queue, settings)).reclaimed == 1
    finally:
        await queue.aclose()
    await drain(settings, pool)
    job = await pool.fetchrow("SELECT status, attempts FROM jobs WHERE id = $1", job_id)
    assert (job["status"], job["attempts"]) == ("done", 2)
    history = await pool.fetch(
        "SELECT outcome FROM job_attempts WHERE job_id = $1 ORDER BY attempt", job_id)
    assert [r["outcome"] for r in history] == ["lost", "done"]


async def test_later_stages_overtake_a_backlog_of_earlier_ones(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """A bulk load finishes items one by one: an item's embed, released when its analyze is
    done, runs before the analyze jobs of items submitted earlier."""
    count = 6
    queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        for i in range(count):
            async with pool.acquire() as conn, conn.transaction():
                result = await items.put_item(
                    conn, tenant_id=tenant[0], settings=settings,
                    item=items.NewItem(id=f"bulk/{i}", content=f"Document number {i}."))
            await jobs.enqueue(pool, queue, jobs.refs_to_enqueue(result.jobs),
                               queue_name=settings.queue_name)
        await drain(settings.model_copy(update={"worker_max_jobs": 1}), pool)
        order = await pool.fetch(
            "SELECT j.kind, j.item_id FROM job_attempts a JOIN jobs j ON j.id = a.job_id"
            " ORDER BY a.started_at")
        started = [(r["kind"], r["item_id"]) for r in order]
        assert started.index((jobs.EMBED, "bulk/0")) < started.index((jobs.ANALYZE, "bulk/5"))
        # A retry keeps its backoff: deferred, it sorts after what is due now.
        refs = [jobs.JobRef(uuid.uuid4(), jobs.REGULARIZE), jobs.JobRef(uuid.uuid4(), jobs.EMBED)]
        await jobs.enqueue(pool, queue, refs[:1], queue_name="memmill:test:order")
        await jobs.enqueue(pool, queue, refs[1:], queue_name="memmill:test:order", defer_s=5)
        late_embed = jobs.JobRef(uuid.uuid4(), jobs.EMBED)
        await jobs.enqueue(pool, queue, [late_embed], queue_name="memmill:test:order")
        ids = [job_id.decode() for job_id in await queue.zrange("memmill:test:order", 0, -1)]
        assert ids[0] == late_embed.queue_job_id  # enqueued last, due first
        assert ids[-1] == refs[1].queue_job_id  # the deferred retry is last
        await queue.delete("memmill:test:order")
    finally:
        await queue.aclose()
