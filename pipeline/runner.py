"""The job wrapper: claim the ledger row, keep its lease alive, run the task, and then either
commit the result together with `done`, schedule a retry, or dead-letter.

arq re-queues only on `Retry` and runs no hook past `max_tries`, so every decision about
retries and dead letters is made here, against the ledger, on each attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import asyncpg

from pipeline import jobs, webhooks
from pipeline.db import Q
from pipeline.errors import PermanentError, RetryLater
from pipeline.fairness import FairQueueing
from pipeline.jobs import JobRef, RetryPolicy
from pipeline.providers import usage
from pipeline.tasks import TASKS, Deps, Writer
from pipeline.tracebacks import format_error, format_traceback, scrub_paths

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another worker took this job over after our lease expired; our result is discarded."""


async def _heartbeat(deps: Deps, job_id: uuid.UUID, lease_s: float) -> None:
    interval_s = max(lease_s / 3, 0.05)
    while True:
        await asyncio.sleep(interval_s)
        try:
            renewed = await deps.pool.fetchval(
                Q["jobs.renew_lease"], job_id, deps.worker_id, lease_s
            )
        except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive any failure
            # Not only OSError and PostgresError: while Postgres restarts, asyncpg also raises
            # InterfaceError and InternalClientError. A heartbeat that ends here lets the lease
            # expire, and another worker takes the job while this one still runs it.
            log.warning("job %s: heartbeat failed: %s", job_id, exc)
            continue
        if renewed is None:
            log.warning("job %s: lease lost to another worker", job_id)
            return


async def run_job(job_id: str, kind: str, deps: Deps) -> str:
    """Run one delivery of a job; returns the outcome: done, retry, dead, skipped or lost."""
    limits = deps.settings.job_limits(kind)
    job = await deps.pool.fetchrow(
        Q["jobs.claim"], uuid.UUID(job_id), deps.worker_id, limits.lease_s
    )
    if job is None:
        # Per-job lines are DEBUG: at INFO a busy worker wrote one per job (40k in 40 minutes);
        # the worker logs a summary of the outcomes once a minute instead.
        log.debug("job %s: not claimable (done, running elsewhere or cancelled), skipped", job_id)
        return "skipped"
    attempt = job["attempts"]
    task = TASKS.get(job["kind"])
    if attempt > job["max_attempts"]:
        return await _dead_letter(job, deps, "lost its lease on every attempt", permanent=False)
    if task is None:
        return await _dead_letter(
            job, deps, f"no task for job kind {job['kind']!r}", permanent=True
        )
    beat = asyncio.create_task(_heartbeat(deps, job["id"], limits.lease_s))
    try:
        with usage.tenant_scope(job["tenant_id"]):  # provider calls count for the job's tenant
            writer = await task(job, deps)
        released = await _complete(job, deps, writer)
    except LeaseLost:
        log.warning("job %s attempt %d: lease lost, result discarded", job_id, attempt)
        return "lost"
    except Exception as exc:  # noqa: BLE001 - every failure is classified; none escapes
        return await _fail(job, deps, exc, RetryPolicy(limits.retry_base_s, limits.retry_max_s))
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    log.debug("job %s %s attempt %d: done", job_id, job["kind"], attempt)
    await jobs.enqueue(deps.pool, deps.queue, released, queue_name=deps.settings.queue_name,
                       fair=FairQueueing.of(deps.settings))
    return "done"


async def _complete(job: asyncpg.Record, deps: Deps, writer: Writer) -> list[JobRef]:
    async with deps.pool.acquire() as conn, conn.transaction():
        if job["item_id"] is not None:
            await conn.execute(Q["items.lock_for_completion"], job["tenant_id"], job["item_id"])
        completed = await conn.fetch(Q["jobs.complete"], job["id"], deps.worker_id)
        if not completed:
            raise LeaseLost()
        follow_ups = await writer(conn) or []
        marked = None
        if job["item_id"] is not None:
            marked = await conn.execute(Q["items.mark_ready_if_done"], job["tenant_id"],
                                        job["item_id"])
        follow_ups += await webhooks.job_done(conn, job, item_ready=marked == "UPDATE 1")
    released = [JobRef(r["id"], r["kind"], r["attempts"], tenant_id=r["tenant_id"])
                for r in completed if r["id"] is not None]
    return released + follow_ups


async def _fail(
    job: asyncpg.Record, deps: Deps, exc: BaseException, policy: RetryPolicy
) -> str:
    attempt = job["attempts"]
    # The tenant reads these: no server path may be in them (see pipeline.tracebacks).
    error = format_error(exc)
    permanent = isinstance(exc, PermanentError)
    # The row's budget decides, not the worker's settings: a replay grants fresh attempts.
    if permanent or attempt >= job["max_attempts"]:
        reason = (scrub_paths(str(exc)) if permanent
                  else f"gave up after {attempt} attempts: {error}")
        return await _dead_letter(job, deps, reason, permanent=permanent, exc=exc)
    # A server that said when to come back (Retry-After) is not asked again sooner.
    asked_s = exc.retry_after_s if isinstance(exc, RetryLater) else None
    delay_s = max(policy.delay_s(attempt), asked_s or 0.0)
    async with deps.pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            Q["jobs.schedule_retry"], job["id"], deps.worker_id, delay_s, error
        )
        await conn.execute(
            Q["jobs.finish_attempt_retry"], job["id"], attempt, error, format_traceback(exc),
            delay_s,
        )
    if row is None:
        return "lost"
    log.warning("job %s attempt %d failed, retry in %.1fs: %s", job["id"], attempt, delay_s, error)
    await jobs.enqueue(
        deps.pool,
        deps.queue,
        [JobRef(row["id"], row["kind"], row["attempts"], tenant_id=row["tenant_id"])],
        queue_name=deps.settings.queue_name,
        defer_s=delay_s,
    )
    return "retry"


async def _dead_letter(
    job: asyncpg.Record,
    deps: Deps,
    reason: str,
    *,
    permanent: bool,
    exc: BaseException | None = None,
) -> str:
    async with deps.pool.acquire() as conn, conn.transaction():
        dead = await conn.fetchrow(Q["jobs.mark_dead"], job["id"], deps.worker_id, reason)
        if dead is None:
            return "lost"
        await conn.execute(
            Q["jobs.insert_dead_letter"],
            job["tenant_id"],
            job["id"],
            job["kind"],
            job["item_id"],
            job["payload"],
            reason,
            permanent,
            job["attempts"],
        )
        await conn.execute(
            Q["jobs.finish_attempt"],
            job["id"],
            job["attempts"],
            "dead",
            reason,
            format_traceback(exc) if exc else None,
        )
        await conn.execute(Q["jobs.cancel_dependents"], job["id"])
        if job["item_id"] is not None:
            await conn.execute(
                Q["items.mark_failed"], job["tenant_id"], job["item_id"], f"{job['kind']}: {reason}"
            )
        notices = await webhooks.job_dead(conn, job, reason, permanent=permanent)
    log.error(
        "job %s %s dead after attempt %d: %s", job["id"], job["kind"], job["attempts"], reason
    )
    await jobs.enqueue(deps.pool, deps.queue, notices, queue_name=deps.settings.queue_name,
                       fair=FairQueueing.of(deps.settings))
    return "dead"
