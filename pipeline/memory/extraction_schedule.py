"""When a session is extracted: once it has been quiet for `extraction_quiet_s`, or at once
after an `ending` event or an explicit request, and never by two jobs at once.

At most one extract job of a session waits in the ledger (a unique index, migration 0011). A
write that finds one leaves it be: when it runs, the job sees the session spoke since and hands
over to a job due `extraction_quiet_s` after the last write (pipeline/memory/extract.py). A
request to extract now cancels the waiting job and queues one due at once; the operation moves
with it, so the id the caller holds always follows the job that will do the work."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.jobs import JobRef
from pipeline.memory import operations
from pipeline.settings import Settings


@dataclass
class Scheduled:
    operation_id: uuid.UUID
    refs: list[JobRef]


async def schedule(conn: asyncpg.Connection, *, tenant_id: int, key_id: int | None,
                   session_id: str, scope: dict[str, Any], now: bool,
                   settings: Settings, delay_s: float | None = None) -> Scheduled:
    """Make sure an extraction of the session is queued, in the caller's transaction."""
    waiting = await conn.fetchrow(Q["extract.waiting"], tenant_id, session_id)
    if waiting is not None and not now:
        return Scheduled(waiting["operation_id"], [])
    delay = 0.0 if now else settings.extraction_quiet_s if delay_s is None else delay_s
    job_id = uuid.uuid4()
    if waiting is not None:
        await conn.execute(Q["extract.cancel"], waiting["id"])
    created = await conn.fetchval(
        Q["extract.insert"], job_id, tenant_id, settings.max_attempts_for(jobs.EXTRACT),
        {"session_id": session_id, "now": now}, delay)
    if not created:  # a concurrent write queued one first
        waiting = await conn.fetchrow(Q["extract.waiting"], tenant_id, session_id)
        assert waiting is not None
        return Scheduled(waiting["operation_id"], [])
    if waiting is not None:
        await conn.execute(Q["operations.move_to_job"], waiting["id"], job_id)
        op = await conn.fetchval(Q["operations.of_job"], job_id)
    else:
        op = await operations.create(conn, tenant_id=tenant_id, kind="extract", job_id=job_id,
                                     key_id=key_id, session_id=session_id, scope=scope)
    return Scheduled(op, [JobRef(job_id, jobs.EXTRACT, 0, defer_s=delay, tenant_id=tenant_id)])
