"""The arq worker. Dependencies travel in arq's ctx dict, filled once in `startup`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import asyncpg
from arq.connections import ArqRedis, RedisSettings
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.utils import timestamp_ms
from arq.worker import Function, Worker, func
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from pipeline import jobs, reindex, webhooks
from pipeline.db import Q, create_pool
from pipeline.fairness import FairQueueing
from pipeline.jobs import JobRef
from pipeline.providers import usage
from pipeline.queue_codec import ARQ_CODEC
from pipeline.runner import run_job
from pipeline.settings import Settings
from pipeline.sweeper import Forget, dead_deliveries, forget_quietly, sweep_forever
from pipeline.tasks import TASKS, Deps
from workers import deliveries

log = logging.getLogger(__name__)

# Sending a webhook is a job like any other (pipeline/webhooks.py), run by the same wrapper.
TASKS[jobs.WEBHOOK] = webhooks.deliver


# What a Redis outage raises in the redis client: a refused or reset connection, a timeout, and
# WatchError, which redis-py raises for a connection lost inside a WATCH.
REDIS_GONE = (RedisConnectionError, RedisTimeoutError, WatchError, OSError)
OUTAGE_PAUSE_S = 1.0


def tenant_slot_cap(settings: Settings) -> int | None:
    """The most slots of a worker one tenant's jobs may hold, or None: no cap."""
    reserved = settings.worker_reserved_slots
    if reserved is None:
        reserved = max(1, settings.worker_max_jobs // 8)
    if not settings.fair_queueing or reserved == 0:
        return None
    return max(1, settings.worker_max_jobs - reserved)


class ResilientWorker(Worker):
    """arq's Worker, made to ride out a Redis outage instead of exiting, and to keep some of
    its slots free of any one tenant.

    Stock arq lets a connection error escape its poll loop, a job task or `close()`, and the
    process dies (the in-flight jobs with it). The ledger already keeps every job safe, so a
    worker has nothing better to do than wait for Redis to come back: it keeps running the jobs
    it holds, polls again after a pause, and the sweeper re-enqueues whatever Redis lost.

    Fair queueing puts another tenant's job at the head of the queue, but a worker takes it
    only when a slot frees, and a bulk load's embed jobs hold their slots while they wait for
    the model: a single item waited seconds for each of its stages. So one tenant may hold at
    most `tenant_slots` of the slots (its id is in the queue job id, `JobRef.queue_job_id`);
    its further jobs stay in the queue, for another worker or a freed slot, and the rest are
    there for the others. A lone tenant leaves those few idle, which costs a bulk load
    nothing while its embed jobs wait for the model anyway.
    """

    def __init__(self, *args: Any, tenant_slots: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tenant_slots = tenant_slots
        self.held: Counter[int] = Counter()  # slots held, by tenant

    async def _poll_iteration(self) -> None:
        try:
            await super()._poll_iteration()
        except REDIS_GONE as exc:
            log.warning("redis unavailable, polling again in %.0fs: %s", OUTAGE_PAUSE_S, exc)
            await asyncio.sleep(OUTAGE_PAUSE_S)

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """arq's start, for every job of a look at once (`workers.deliveries`), skipping the
        jobs this worker runs already (they stay in the queue until they end) and a tenant's
        jobs past its share of the slots."""
        wanted: list[tuple[str, int | None]] = []
        counting: Counter[int] = Counter()
        for job_id in job_ids:
            if len(wanted) >= self.max_jobs - self.job_counter:
                break
            name = job_id.decode()
            if name in self.tasks:
                continue
            tenant = jobs.queue_job_tenant(name)
            if tenant is not None and self.tenant_slots is not None:
                if self.held[tenant] + counting[tenant] >= self.tenant_slots:
                    continue
                counting[tenant] += 1
            wanted.append((name, tenant))
        if not wanted:
            return
        tenants = dict(wanted)
        taken = await deliveries.take(
            self.pool, self.queue_name, [name for name, _ in wanted], now_ms=timestamp_ms(),
            in_progress_ms=int(self.in_progress_timeout_s * 1000))
        for name, score in taken:
            await self.sem.acquire()  # free: no more were taken than slots are free
            self.job_counter += 1
            task = self.loop.create_task(self.run_job(name, score))
            task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
            self.tasks[name] = task
            tenant = tenants[name]
            if tenant is not None:
                self.held[tenant] += 1
                task.add_done_callback(lambda _, tenant=tenant: self._release(tenant))

    def _release(self, tenant: int) -> None:
        self.held[tenant] -= 1
        if self.held[tenant] <= 0:
            del self.held[tenant]

    async def run_job(self, job_id: str, score: int) -> None:
        # The job's effect and its `done` live in the ledger; if Redis fails around it (reading
        # the job, or removing it after), the sweeper and the ledger claim settle it later.
        try:
            await super().run_job(job_id, score)
        except REDIS_GONE as exc:
            log.warning("job %s: redis unavailable around the job: %s", job_id, exc)

    async def close(self) -> None:
        """arq's close, except that a dead Redis must not skip `on_shutdown`, which hands the
        unfinished jobs back through the ledger."""
        if not self._handle_signals:
            self.handle_sig(signal.SIGUSR1)
        if not self._pool:
            return
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        with contextlib.suppress(*REDIS_GONE):
            await self.pool.delete(self.health_check_key)
        try:
            if self.on_shutdown:
                await self.on_shutdown(self.ctx)
        finally:
            with contextlib.suppress(*REDIS_GONE):
                await self.pool.aclose(close_connection_pool=True)
            self._pool = None


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Tally:
    """What this worker's deliveries came to since its last summary line. arq and the runner
    log each job at DEBUG only (at INFO a busy worker wrote a line per job, 40k in 40
    minutes); this one line a minute says what the worker did."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.since = time.monotonic()

    def add(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def flush(self, worker_id: str) -> None:
        """Log the summary and start counting again; nothing when there was no work."""
        counts, self.outcomes = self.outcomes, Counter()
        elapsed_s, self.since = time.monotonic() - self.since, time.monotonic()
        if not counts:
            return
        text = (f"{counts.pop('done', 0)} done, {counts.pop('retry', 0)} retried, "
                f"{counts.pop('dead', 0)} dead")
        # skipped (a duplicate delivery) and lost (a lease taken over) only when they happened.
        text += "".join(f", {n} {outcome}" for outcome, n in sorted(counts.items()))
        log.info("worker %s: %s in the last %.0f s", worker_id, text, elapsed_s)


SUMMARY_INTERVAL_S = 60.0


async def _summarize_forever(ctx: dict[str, Any]) -> None:
    while True:
        await asyncio.sleep(SUMMARY_INTERVAL_S)
        ctx["tally"].flush(ctx["worker_id"])


def forgetter(redis: ArqRedis, queue_name: str) -> Forget:
    """How the sweeper and a shutdown remove a dead delivery (see `pipeline.sweeper.Forget`):
    its queue entry and the keys arq itself deletes when it gives a job up."""

    async def forget(queue_job_ids: Sequence[str]) -> None:
        prefixes = (job_key_prefix, in_progress_key_prefix, retry_key_prefix)
        async with redis.pipeline(transaction=True) as pipe:
            pipe.zrem(queue_name, *queue_job_ids)
            pipe.delete(*(prefix + job_id for job_id in queue_job_ids for prefix in prefixes))
            await pipe.execute()

    return forget


def _job_function(kind: str, timeout_s: float) -> Function:
    async def job(ctx: dict[str, Any], job_id: str) -> str:
        outcome = await run_job(job_id, kind, ctx["deps"])
        ctx["tally"].add(outcome)
        return outcome

    job.__name__ = job.__qualname__ = kind
    # Retries are decided by our ledger, never by arq: one arq try per enqueued attempt.
    return func(job, name=kind, timeout=timeout_s, max_tries=1)


WORKER_POOL_MAX = 8


async def startup(ctx: dict[str, Any]) -> None:
    settings: Settings = ctx["settings"]
    if settings.database_url is None:
        raise RuntimeError("MEMMILL_DATABASE_URL is not set (memmill up sets it for its workers)")
    pool = await create_pool(
        settings.database_url,
        min_size=1,
        # A job holds a connection only for its statements, not while it waits on the model,
        # so many concurrent jobs share a few connections.
        max_size=min(settings.worker_max_jobs, WORKER_POOL_MAX) + 2,
        ef_search=settings.hnsw_ef_search,
    )
    ctx["deps"] = Deps(
        pool=pool,
        settings=settings,
        queue=ctx["redis"],
        worker_id=ctx["worker_id"],
    )
    # Load the model before taking jobs: a first job that spends seconds loading it would have
    # to outlive its lease on a slow machine, and the load would count against its timeout.
    if ctx.get("warm_up", True):
        await ctx["deps"].embedder.warm_up()
    # A new embedding model re-embeds the index in the background (a no-op when it matches).
    await reindex.start(pool, ctx["redis"], settings)
    ctx["forget"] = forgetter(ctx["redis"], settings.queue_name)
    ctx["background"] = [asyncio.create_task(_heartbeat_forever(ctx["deps"])),
                         asyncio.create_task(_summarize_forever(ctx))]
    if ctx.get("sweep", True):
        ctx["background"].append(asyncio.create_task(
            sweep_forever(pool, ctx["redis"], settings, forget=ctx["forget"])))
    log.info("worker %s started on queue %s", ctx["worker_id"], settings.queue_name)


async def _heartbeat_forever(deps: Deps) -> None:
    """Tell operators this worker is alive (GET /v1/jobs/stats lists live workers), and add
    the provider calls it counted since the last beat to the dashboard's."""
    while True:
        try:
            await deps.pool.execute(
                Q["workers.heartbeat"], deps.worker_id, socket.gethostname(), os.getpid(),
                deps.settings.queue_name,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("worker heartbeat failed: %s", exc)
        await _flush_usage(deps)
        await asyncio.sleep(deps.settings.worker_heartbeat_s)


async def _flush_usage(deps: Deps) -> None:
    """A failed flush keeps its counts for the next one; nothing here may end the heartbeat."""
    try:
        await usage.flush(deps.pool)
    except Exception as exc:  # noqa: BLE001 - logged; the counts wait for the next beat
        log.warning("could not store provider call counts (kept for the next try): %s", exc)


async def _release_leases(deps: Deps, forget: Forget | None) -> None:
    """Jobs still running when the grace period ended were cancelled: hand them back now.

    arq keeps a cancelled job's delivery in the queue, to run it again; run again, it is over
    its one try and arq logs "max retries exceeded". The new attempt is enqueued below, so the
    old delivery is removed (see `pipeline.sweeper.Forget`)."""
    async with deps.pool.acquire() as conn, conn.transaction():
        released = await conn.fetch(Q["workers.release_leases"], deps.worker_id)
        if released:
            await conn.execute(Q["workers.mark_released_attempts"], [r["id"] for r in released])
        await conn.execute(Q["workers.stopped"], deps.worker_id)
    if released:
        log.warning("handed %d unfinished jobs back to the queue", len(released))
        await forget_quietly(forget, dead_deliveries(released))
        refs = [JobRef(r["id"], r["kind"], r["attempts"], tenant_id=r["tenant_id"])
                for r in released]
        await jobs.enqueue(deps.pool, deps.queue, refs, queue_name=deps.settings.queue_name,
                           fair=FairQueueing.of(deps.settings))


async def shutdown(ctx: dict[str, Any]) -> None:
    for task in ctx.pop("background", []):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if "tally" in ctx:
        ctx["tally"].flush(ctx["worker_id"])
    deps: Deps | None = ctx.pop("deps", None)
    if deps is not None:
        try:
            await _release_leases(deps, ctx.get("forget"))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("could not release leases at shutdown (they expire anyway): %s", exc)
        await _flush_usage(deps)
        await deps.pool.close()


def build_worker(
    settings: Settings,
    *,
    burst: bool = False,
    redis_pool: ArqRedis | None = None,
    sweep: bool = True,
    warm_up: bool = True,
    poll_delay_s: float | None = None,
) -> Worker:
    """A worker for every job kind memmill has a task for. Tests pass `burst=True`; the queue
    benchmark, whose no-op jobs need no model, passes `warm_up=False`."""
    if redis_pool is None and settings.redis_url is None:
        raise RuntimeError("MEMMILL_REDIS_URL is not set (memmill up sets it for its workers)")
    # The sweeper enqueues through this pool: a pickling one would feed jobs this worker refuses.
    if redis_pool is not None and redis_pool.job_serializer is not ARQ_CODEC["job_serializer"]:
        raise ValueError("redis_pool must be created with pipeline.queue_codec.ARQ_CODEC")
    return ResilientWorker(
        functions=[_job_function(kind, settings.job_limits(kind).timeout_s) for kind in TASKS],
        queue_name=settings.queue_name,
        redis_settings=RedisSettings.from_dsn(settings.redis_url) if redis_pool is None else None,
        redis_pool=redis_pool,
        burst=burst,
        poll_delay=settings.worker_poll_delay_s if poll_delay_s is None else poll_delay_s,
        on_startup=startup,
        on_shutdown=shutdown,
        handle_signals=not burst,
        max_jobs=settings.worker_max_jobs,
        tenant_slots=tenant_slot_cap(settings),
        job_timeout=settings.job_timeout_s,
        keep_result=0,
        max_tries=1,
        job_completion_wait=settings.shutdown_grace_s,
        # JSON, never pickle: a job read from Redis must not be able to run code here.
        **ARQ_CODEC,
        ctx={"settings": settings, "worker_id": new_worker_id(), "sweep": sweep,
             "warm_up": warm_up, "tally": Tally()},
    )


def run(settings: Settings) -> None:
    """Run a worker until SIGINT/SIGTERM (the `memmill worker` command)."""
    build_worker(settings).run()


__all__ = ["build_worker", "run"]
