"""What an operator does with the job ledger: list and count jobs, retry or cancel one, and
inspect and replay dead letters. Each change is one transaction; the caller enqueues the
returned refs after commit, exactly as a put does (the outbox)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from pipeline import webhooks
from pipeline.db import Q
from pipeline.errors import Conflict, NotFound
from pipeline.jobs import JobRef

MAX_REPLAY_BATCH = 10_000


@dataclass(frozen=True)
class JobFilter:
    status: str | None = None
    kind: str | None = None
    item_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    def args(self) -> tuple[Any, ...]:
        return (self.status, self.kind, self.item_id, self.created_after, self.created_before)


@dataclass(frozen=True)
class DeadLetterFilter:
    kind: str | None = None
    item_id: str | None = None
    replayed: bool | None = None
    permanent: bool | None = None


async def list_jobs(
    pool: asyncpg.Pool, tenant_id: int, flt: JobFilter, *, limit: int, offset: int
) -> tuple[list[asyncpg.Record], int]:
    rows = await pool.fetch(Q["jobs.list"], tenant_id, *flt.args(), limit, offset)
    total = await pool.fetchval(Q["jobs.count"], tenant_id, *flt.args())
    return rows, total


async def stats(
    pool: asyncpg.Pool, tenant_id: int, *, alive_window_s: float, queue_name: str,
    operator: bool,
) -> dict[str, Any]:
    """A tenant's own figures, and how many workers serve the queue (what /readyz tells
    anyone). Only an operator also gets the live workers themselves: their hosts and pids
    describe the installation, not the tenant."""
    by_status: dict[str, int] = {}
    by_kind: dict[str, dict[str, int]] = {}
    for row in await pool.fetch(Q["jobs.counts"], tenant_id):
        by_status[row["status"]] = by_status.get(row["status"], 0) + row["n"]
        by_kind.setdefault(row["kind"], {})[row["status"]] = row["n"]
    due = await pool.fetchrow(Q["jobs.due"], tenant_id)
    figures: dict[str, Any] = {
        "by_status": by_status, "by_kind": by_kind, "due": due["due"],
        "oldest_queued_at": due["oldest_due"],
        "workers_alive": await pool.fetchval(Q["workers.alive_count"], alive_window_s,
                                             queue_name),
    }
    if operator:
        workers = await pool.fetch(Q["workers.alive"], alive_window_s)
        figures["workers"] = [dict(w) for w in workers]
    return figures


# A replay or retry grants the job kind's full budget again (settings.max_attempts_for).
AttemptBudget = Callable[[str], int]


async def requeue(
    conn: asyncpg.Connection, tenant_id: int, job_id: uuid.UUID, kind: str,
    fresh_attempts: AttemptBudget,
) -> JobRef | None:
    row = await conn.fetchrow(Q["jobs.retry"], tenant_id, job_id, fresh_attempts(kind))
    if row is None:
        return None
    await conn.execute(Q["jobs.restore_dependents"], job_id)
    if row["item_id"] is not None:
        await conn.execute(Q["items.mark_pending"], tenant_id, row["item_id"])
    return JobRef(row["id"], row["kind"], row["attempts"], tenant_id=row["tenant_id"])


async def retry_job(
    pool: asyncpg.Pool, tenant_id: int, job_id: uuid.UUID, *, fresh_attempts: AttemptBudget
) -> JobRef:
    """Run a dead, cancelled or backing-off job now, with a fresh budget of attempts."""
    async with pool.acquire() as conn, conn.transaction():
        current = await conn.fetchrow(Q["jobs.lock"], tenant_id, job_id)
        if current is None:
            raise NotFound(f"no job with id {job_id}")
        ref = await requeue(conn, tenant_id, job_id, current["kind"], fresh_attempts)
        if ref is None:
            raise Conflict(f"job {job_id} is {current['status']}; only dead, cancelled or "
                           "queued jobs can be retried")
        await conn.execute(Q["dead_letters.mark_replayed_for_job"], tenant_id, job_id)
    return ref


async def cancel_job(pool: asyncpg.Pool, tenant_id: int, job_id: uuid.UUID) -> asyncpg.Record:
    """Cancel a job that has not started; its dependents and its item say so."""
    async with pool.acquire() as conn, conn.transaction():
        # The item's row before the job's, in the order a completing job takes them (see
        # pipeline/runner.py): the other order deadlocked with the completion of the job a
        # waiting one depends on. A job's item never changes, so it is read unlocked first.
        item_id = await conn.fetchval(Q["jobs.item_of"], tenant_id, job_id)
        if item_id is not None:
            await conn.execute(Q["items.lock_for_completion"], tenant_id, item_id)
        # Locked: the status a refusal quotes is the one the refusal was made on.
        current = await conn.fetchrow(Q["jobs.lock"], tenant_id, job_id)
        if current is None:
            raise NotFound(f"no job with id {job_id}")
        row = await conn.fetchrow(Q["jobs.cancel"], tenant_id, job_id)
        if row is None:
            raise Conflict(f"job {job_id} is {current['status']}; only queued or waiting jobs "
                           "can be cancelled")
        await conn.execute(Q["jobs.cancel_dependents"], job_id)
        if row["item_id"] is not None:
            await conn.execute(Q["items.mark_failed"], tenant_id, row["item_id"],
                               f"{row['kind']}: cancelled by an operator")
        # Not returned to the caller, who enqueues nothing: the next sweep does.
        await webhooks.job_cancelled(conn, row)
    return row


async def list_dead_letters(
    pool: asyncpg.Pool, tenant_id: int, flt: DeadLetterFilter, *, limit: int, offset: int
) -> tuple[list[asyncpg.Record], int]:
    args = (flt.kind, flt.item_id, flt.replayed, flt.permanent)
    rows = await pool.fetch(Q["dead_letters.list"], tenant_id, *args, limit, offset)
    return rows, await pool.fetchval(Q["dead_letters.count"], tenant_id, *args)


async def get_dead_letter(
    pool: asyncpg.Pool, tenant_id: int, dead_letter_id: int
) -> tuple[asyncpg.Record, list[asyncpg.Record]]:
    row = await pool.fetchrow(Q["dead_letters.get"], tenant_id, dead_letter_id)
    if row is None:
        raise NotFound(f"no dead letter with id {dead_letter_id}")
    return row, await pool.fetch(Q["dead_letters.attempts"], tenant_id, row["job_id"])


async def replay(
    pool: asyncpg.Pool, tenant_id: int, *, fresh_attempts: AttemptBudget,
    dead_letter_id: int | None = None, flt: DeadLetterFilter | None = None,
    limit: int = MAX_REPLAY_BATCH,
) -> list[JobRef]:
    """Put dead-lettered jobs back through the normal path: one by id, or all that match."""
    async with pool.acquire() as conn, conn.transaction():
        if dead_letter_id is not None:
            row = await conn.fetchrow(Q["dead_letters.get"], tenant_id, dead_letter_id)
            if row is None:
                raise NotFound(f"no dead letter with id {dead_letter_id}")
            if row["replayed_at"] is not None:
                raise Conflict(f"dead letter {dead_letter_id} was already replayed")
            targets = [row]
        else:
            flt = flt or DeadLetterFilter()
            targets = await conn.fetch(
                Q["dead_letters.select_for_replay"], tenant_id, flt.kind, flt.item_id,
                flt.permanent, limit,
            )
        refs = []
        for target in targets:
            ref = await requeue(conn, tenant_id, target["job_id"], target["kind"],
                                 fresh_attempts)
            await conn.execute(Q["dead_letters.mark_replayed"], tenant_id, target["id"])
            if ref is not None:
                refs.append(ref)
    return refs
