"""The arq worker. Dependencies travel in arq's ctx dict, filled once in `startup`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid
from typing import Any

import asyncpg
from arq.connections import ArqRedis, RedisSettings
from arq.worker import Function, Worker, func
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from pipeline import jobs, reindex
from pipeline.db import Q, create_pool
from pipeline.jobs import JobRef
from pipeline.providers.embeddings import get_embedder
from pipeline.runner import run_job
from pipeline.settings import Settings
from pipeline.sweeper import sweep_forever
from pipeline.tasks import TASKS, Deps

log = logging.getLogger(__name__)


# What a Redis outage raises in the redis client: a refused or reset connection, a timeout, and
# WatchError, which redis-py raises for a connection lost inside a WATCH.
REDIS_GONE = (RedisConnectionError, RedisTimeoutError, WatchError, OSError)
OUTAGE_PAUSE_S = 1.0


class ResilientWorker(Worker):
    """arq's Worker, made to ride out a Redis outage instead of exiting.

    Stock arq lets a connection error escape its poll loop, a job task or `close()`, and the
    process dies (the in-flight jobs with it). The ledger already keeps every job safe, so a
    worker has nothing better to do than wait for Redis to come back: it keeps running the jobs
    it holds, polls again after a pause, and the sweeper re-enqueues whatever Redis lost.
    """

    async def _poll_iteration(self) -> None:
        try:
            await super()._poll_iteration()
        except REDIS_GONE as exc:
            log.warning("redis unavailable, polling again in %.0fs: %s", OUTAGE_PAUSE_S, exc)
            await asyncio.sleep(OUTAGE_PAUSE_S)

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        # arq takes a semaphore slot per job before talking to Redis; an error in between
        # would leak the slot, and after max_jobs such errors the worker would never run again.
        for job_id in job_ids:
            counted = self.job_counter
            try:
                await super().start_jobs([job_id])
            except REDIS_GONE:
                if job_id.decode() not in self.tasks and self.job_counter > counted:
                    self.job_counter -= 1
                    self.sem.release()
                raise

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


def _job_function(kind: str, timeout_s: float) -> Function:
    async def job(ctx: dict[str, Any], job_id: str) -> str:
        return await run_job(job_id, kind, ctx["deps"])

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
        await get_embedder(settings).warm_up()
    # A new embedding model re-embeds the index in the background (a no-op when it matches).
    await reindex.start(pool, ctx["redis"], settings)
    ctx["background"] = [asyncio.create_task(_heartbeat_forever(ctx["deps"]))]
    if ctx.get("sweep", True):
        ctx["background"].append(
            asyncio.create_task(sweep_forever(pool, ctx["redis"], settings))
        )
    log.info("worker %s started on queue %s", ctx["worker_id"], settings.queue_name)


async def _heartbeat_forever(deps: Deps) -> None:
    """Tell operators this worker is alive (GET /v1/jobs/stats lists live workers)."""
    while True:
        try:
            await deps.pool.execute(
                Q["workers.heartbeat"], deps.worker_id, socket.gethostname(), os.getpid(),
                deps.settings.queue_name,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("worker heartbeat failed: %s", exc)
        await asyncio.sleep(deps.settings.worker_heartbeat_s)


async def _release_leases(deps: Deps) -> None:
    """Jobs still running when the grace period ended were cancelled: hand them back now."""
    async with deps.pool.acquire() as conn, conn.transaction():
        released = await conn.fetch(Q["workers.release_leases"], deps.worker_id)
        if released:
            await conn.execute(Q["workers.mark_released_attempts"], [r["id"] for r in released])
        await conn.execute(Q["workers.stopped"], deps.worker_id)
    if released:
        log.warning("handed %d unfinished jobs back to the queue", len(released))
        refs = [JobRef(r["id"], r["kind"], r["attempts"]) for r in released]
        await jobs.enqueue(deps.pool, deps.queue, refs, queue_name=deps.settings.queue_name)


async def shutdown(ctx: dict[str, Any]) -> None:
    for task in ctx.pop("background", []):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    deps: Deps | None = ctx.pop("deps", None)
    if deps is not None:
        try:
            await _release_leases(deps)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("could not release leases at shutdown (they expire anyway): %s", exc)
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
        job_timeout=settings.job_timeout_s,
        keep_result=0,
        max_tries=1,
        job_completion_wait=settings.shutdown_grace_s,
        ctx={"settings": settings, "worker_id": new_worker_id(), "sweep": sweep,
             "warm_up": warm_up},
    )


def run(settings: Settings) -> None:
    """Run a worker until SIGINT/SIGTERM (the `memmill worker` command)."""
    build_worker(settings).run()


__all__ = ["build_worker", "run"]
