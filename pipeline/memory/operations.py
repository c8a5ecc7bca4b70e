"""Operations: background work a caller started (embedding what it wrote, extracting a
session, deleting by scope) under an id it can look up. An operation's state is its job's, read
from the ledger, so it can never disagree with what the workers did; an extraction that waits
for its session to go quiet moves to the job that will run it."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg

from pipeline.db import Q

# The ledger's job states as an operation's.
STATE = {"waiting": "pending", "queued": "pending", "running": "running", "done": "done",
         "dead": "failed", "cancelled": "cancelled"}
FINISHED = ("done", "failed", "cancelled")


async def create(conn: asyncpg.Connection, *, tenant_id: int, kind: str, job_id: uuid.UUID,
                 key_id: int | None, session_id: str | None = None,
                 scope: dict[str, Any] | None = None) -> uuid.UUID:
    return await conn.fetchval(Q["operations.insert"], tenant_id, kind, job_id, session_id,
                               scope or {}, key_id)


async def get(pool: asyncpg.Pool, tenant_id: int, operation_id: uuid.UUID) -> dict[str, Any] | None:
    row = await pool.fetchrow(Q["operations.get"], tenant_id, operation_id)
    if row is None:
        return None
    op = dict(row)
    op["status"] = STATE.get(op.pop("job_status") or "", "done" if op["finished_at"] else "pending")
    if op["kind"] == "extract":
        op["decisions"] = [dict(d) for d in await pool.fetch(
            Q["operations.decisions"], tenant_id, operation_id)]
    return op


async def wait(pool: asyncpg.Pool, tenant_id: int, operation_id: uuid.UUID,
               timeout_s: float) -> dict[str, Any] | None:
    """The operation once finished, or as it stands when `timeout_s` runs out. Polls the
    ledger: an operation is seconds long, and a poll is one indexed read."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        op = await get(pool, tenant_id, operation_id)
        if op is None or op["status"] in FINISHED or time.monotonic() >= deadline:
            return op
        await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
        delay = min(delay * 1.5, 0.5)
