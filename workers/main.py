"""The arq worker. Dependencies travel in arq's ctx dict, filled once in `startup`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from typing import Any

import asyncpg
from arq.connections import ArqRedis, RedisSettings
from arq.worker import Function, Worker, func

from pipeline import jobs
from pipeline.db import Q, create_pool
from pipeline.jobs import JobRef, RetryPolicy
from pipeline.runner import run_job
from pipeline.settings import Settings
from pipeline.sweeper import sweep_forever
from pipeline.tasks import TASKS, Deps

log = logging.getLogger(__name__)


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _job_function(kind: str, timeout_s: float) -> Function:
    async def job(ctx: dict[str, Any], job_id: str) -> str:
        return await run_job(job_id, ctx["deps"])

    job.__name__ = job.__qualname__ = kind
    # Retries are decided by our ledger, never by arq: one arq try per enqueued attempt.
    return func(job, name=kind, timeout=timeout_s, max_tries=1)


async def startup(ctx: dict[str, Any]) -> None:
    settings: Settings = ctx["settings"]
    if settings.database_url is None:
        raise RuntimeError("MEMMILL_DATABASE_URL is not set (memmill up sets it for its workers)")
    pool = await create_pool(
        settings.database_url,
        min_size=1,
        max_size=settings.worker_max_jobs + 2,
        ef_search=settings.hnsw_ef_search,
    )
    ctx["deps"] = Deps(
        pool=pool,
        settings=settings,
        queue=ctx["redis"],
        worker_id=ctx["worker_id"],
        policy=RetryPolicy(settings.retry_base_s, settings.retry_max_s),
    )
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
    poll_delay_s: float = 0.5,
) -> Worker:
    """A worker for every job kind memmill has a task for. Tests pass `burst=True`."""
    if redis_pool is None and settings.redis_url is None:
        raise RuntimeError("MEMMILL_REDIS_URL is not set (memmill up sets it for its workers)")
    return Worker(
        functions=[_job_function(kind, settings.job_timeout_s) for kind in TASKS],
        queue_name=settings.queue_name,
        redis_settings=RedisSettings.from_dsn(settings.redis_url) if redis_pool is None else None,
        redis_pool=redis_pool,
        burst=burst,
        poll_delay=poll_delay_s,
        on_startup=startup,
        on_shutdown=shutdown,
        handle_signals=not burst,
        max_jobs=settings.worker_max_jobs,
        job_timeout=settings.job_timeout_s,
        keep_result=0,
        max_tries=1,
        job_completion_wait=settings.shutdown_grace_s,
        ctx={"settings": settings, "worker_id": new_worker_id(), "sweep": sweep},
    )


def run(settings: Settings) -> None:
    """Run a worker until SIGINT/SIGTERM (the `memmill worker` command)."""
    build_worker(settings).run()


__all__ = ["build_worker", "run"]
