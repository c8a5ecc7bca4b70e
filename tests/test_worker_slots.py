"""How a worker takes jobs off the queue (workers/main.py, workers/deliveries.py): all of a
look's deliveries in one round trip, and a share of its slots that no one tenant may fill.

Against real Redis, with arq's own enqueue and a real `ResilientWorker` running job functions
defined here, as arq's own tests do."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from arq import constants as arq_constants
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import func

from pipeline.jobs import JobRef, queue_job_tenant
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from workers import deliveries
from workers.main import ResilientWorker, tenant_slot_cap


@pytest.fixture
async def queue(redis_url: str) -> AsyncIterator[tuple[ArqRedis, str]]:
    name = f"memmill:slots:{uuid.uuid4().hex[:10]}"
    redis = await create_pool(RedisSettings.from_dsn(redis_url), **ARQ_CODEC)
    yield redis, name
    members = [m.decode() for m in await redis.zrange(name, 0, -1)]
    keys = [prefix + m for m in members for prefix in (
        arq_constants.job_key_prefix, arq_constants.in_progress_key_prefix,
        arq_constants.retry_key_prefix)]
    await redis.delete(name, *keys)
    await redis.aclose()


def test_the_queue_job_id_names_the_tenant() -> None:
    job_id = uuid.uuid4()
    assert JobRef(job_id, "embed", 2, tenant_id=7).queue_job_id == f"{job_id}:3:7"
    assert queue_job_tenant(f"{job_id}:3:7") == 7
    assert JobRef(job_id, "embed", 2).queue_job_id == f"{job_id}:3"
    assert queue_job_tenant(f"{job_id}:3") is None
    assert queue_job_tenant("not:a:tenant") is None


def test_the_reserved_share_of_the_slots() -> None:
    assert tenant_slot_cap(Settings(worker_max_jobs=128)) == 112
    assert tenant_slot_cap(Settings(worker_max_jobs=8)) == 7
    assert tenant_slot_cap(Settings(worker_max_jobs=1)) == 1
    assert tenant_slot_cap(Settings(worker_max_jobs=16, worker_reserved_slots=6)) == 10
    assert tenant_slot_cap(Settings(worker_max_jobs=16, worker_reserved_slots=0)) is None
    assert tenant_slot_cap(Settings(worker_max_jobs=16, fair_queueing=False)) is None


async def test_take_skips_held_gone_and_future_deliveries(
    queue: tuple[ArqRedis, str],
) -> None:
    redis, name = queue
    now = round(time.time() * 1000)
    await redis.zadd(name, {"due": now - 10, "held": now - 10, "later": now + 60_000})
    await redis.set(arq_constants.in_progress_key_prefix + "held", b"1", px=60_000)
    taken = await deliveries.take(redis, name, ["later", "gone", "due", "held"],
                                  now_ms=now, in_progress_ms=5_000)
    assert taken == [("due", now - 10)]
    ttl_ms = await redis.pttl(arq_constants.in_progress_key_prefix + "due")
    assert 4_000 < ttl_ms <= 5_000
    # Taken once: a second worker's look finds it held.
    assert await deliveries.take(redis, name, ["due"], now_ms=now, in_progress_ms=5_000) == []
    assert await redis.exists(arq_constants.in_progress_key_prefix + "later") == 0


class Recorder:
    """Job functions that hold their slot until released, noting what ran at once."""

    def __init__(self) -> None:
        self.running: Counter[int] = Counter()
        self.most: Counter[int] = Counter()
        self.started: dict[str, float] = {}
        self.release = asyncio.Event()

    async def hold(self, ctx: dict, tenant: int, name: str) -> None:
        self.started[name] = time.monotonic()
        self.running[tenant] += 1
        self.most[tenant] = max(self.most[tenant], self.running[tenant])
        try:
            await self.release.wait()
        finally:
            self.running[tenant] -= 1


async def enqueue(redis: ArqRedis, name: str, tenant: int | None, label: str) -> None:
    ref = JobRef(uuid.uuid4(), "hold", tenant_id=tenant)
    await redis.enqueue_job("hold", tenant or 0, label, _job_id=ref.queue_job_id,
                            _queue_name=name)


async def test_a_tenant_never_fills_the_reserved_slots(queue: tuple[ArqRedis, str]) -> None:
    """Tenant 1's twenty jobs hold 6 of the 8 slots at most; tenant 2's job, queued behind
    all of them, starts at once; jobs with no tenant in their id are not held back."""
    redis, name = queue
    recorder = Recorder()
    for n in range(20):
        await enqueue(redis, name, 1, f"bulk {n}")
    worker = ResilientWorker(
        functions=[func(recorder.hold, name="hold")], queue_name=name, redis_pool=redis,
        max_jobs=8, tenant_slots=6, poll_delay=0.01, handle_signals=False, keep_result=0,
        **ARQ_CODEC)
    running = asyncio.create_task(worker.main())
    try:
        deadline = time.monotonic() + 10
        while recorder.running[1] < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # several more looks at the queue: still six
        assert recorder.running[1] == 6 and worker.held[1] == 6
        await enqueue(redis, name, 2, "single")
        await enqueue(redis, name, None, "untenanted")
        while len(recorder.started) < 8 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert {"single", "untenanted"} <= set(recorder.started)
        assert worker.held == {1: 6, 2: 1}
        recorder.release.set()
        while recorder.running.total() or len(recorder.started) < 22:
            assert time.monotonic() < deadline + 10, recorder.started.keys()
            await asyncio.sleep(0.01)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await worker.close()
    assert recorder.most[1] == 6
    assert len(recorder.started) == 22
    assert not worker.held
