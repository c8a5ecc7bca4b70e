"""Erasing a tenant: every row, vector and Redis key of it goes, then a recount proves that
nothing is left, and the tenant becomes a tombstone holding the report.

The job runs under the operator's tenant (it deletes the erased tenant's jobs, so it cannot be
one of them), after the tenant was set to `deleting`, which refuses its keys at once. It finds
the tables itself: every base table with a `tenant_id` column, so a table added later is
erased without anyone remembering to list it. Rows go in batches, each its own short
transaction (no lock held for long, and a retried attempt just carries on); a batch that a
foreign key blocks is tried again after the tables it waits for. Vectors and text index
entries are columns of those rows, and sources hold the bytes of files, so nothing of a tenant
lives outside Postgres but its Redis keys: its queued jobs' entries in arq's queue and job keys,
and every key named `{queue}:<what>:{tenant_id}` or `{queue}:<what>:{tenant_id}:<more>` (the
convention of per-tenant keys: fair queueing's clock, the rate limiter's windows)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import asyncpg
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from redis.asyncio import Redis

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import PermanentError, TransientError
from pipeline.tasks import Deps, Writer

log = logging.getLogger(__name__)

BATCH = 5000
MAX_PASSES = 20


def _quoted(table: str) -> str:
    return '"' + table.replace('"', '""') + '"'


async def _tables(pool: asyncpg.Pool) -> list[str]:
    return [r["table_name"] for r in await pool.fetch(Q["admin.tenant_tables"])]


async def _delete_rows(pool: asyncpg.Pool, tenant_id: int, tables: list[str]) -> dict[str, int]:
    """Delete every row of the tenant in every table, in batches, until a pass finds none."""
    removed = dict.fromkeys(tables, 0)
    for _ in range(MAX_PASSES):
        progress = blocked = 0
        for table in tables:
            statement = (f"DELETE FROM {_quoted(table)} WHERE ctid = ANY(ARRAY("
                         f"SELECT ctid FROM {_quoted(table)} WHERE tenant_id = $1 LIMIT {BATCH}))")
            while True:
                try:
                    status = await pool.execute(statement, tenant_id)
                except asyncpg.ForeignKeyViolationError:
                    blocked += 1  # rows of another table still point here: next pass
                    break
                count = int(status.rsplit(" ", 1)[-1])
                removed[table] += count
                progress += count
                if count < BATCH:
                    break
        if progress == 0 and blocked == 0:
            return removed
        if progress == 0:
            raise PermanentError("erasure stuck: foreign keys block every remaining table")
    return removed


async def _recount(pool: asyncpg.Pool, tenant_id: int, tables: list[str]) -> dict[str, int]:
    left: dict[str, int] = {}
    for table in tables:
        count = await pool.fetchval(
            f"SELECT count(*) FROM {_quoted(table)} WHERE tenant_id = $1", tenant_id)
        if count:
            left[table] = count
    return left


def _redis(deps: Deps) -> Redis:
    if not isinstance(deps.queue, Redis):
        raise PermanentError("erasure needs the workers' Redis connection")
    return deps.queue


async def _tenant_keys(redis: Redis, queue_name: str, tenant_id: int) -> list[bytes]:
    keys: list[bytes] = []
    for pattern in (f"{queue_name}:*:{tenant_id}", f"{queue_name}:*:{tenant_id}:*"):
        keys.extend([key async for key in redis.scan_iter(match=pattern, count=1000)])
    return keys


async def _delete_redis(redis: Redis, queue_name: str, tenant_id: int,
                        queued: list[asyncpg.Record]) -> int:
    """The tenant's queued jobs' entries and keys, and its own per-tenant keys."""
    removed = 0
    ids = [jobs.JobRef(r["id"], "", r["attempts"], tenant_id=tenant_id).queue_job_id
           for r in queued]
    for start in range(0, len(ids), BATCH):
        chunk = ids[start:start + BATCH]
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zrem(queue_name, *chunk)
            pipe.delete(*(prefix + job_id for job_id in chunk
                          for prefix in (job_key_prefix, in_progress_key_prefix,
                                         retry_key_prefix)))
            entries, keys = await pipe.execute()
        removed += int(entries) + int(keys)
    own = await _tenant_keys(redis, queue_name, tenant_id)
    if own:
        removed += int(await redis.delete(*own))
    return removed


async def erase_tenant(job: asyncpg.Record, deps: Deps) -> Writer:
    """The `erase_tenant` job: delete, recount, and on a clean count write the tombstone's
    report. A count that is not zero fails the attempt, and the next one carries on."""
    tenant_id = int(job["payload"]["tenant_id"])
    status = await deps.pool.fetchval("SELECT status FROM tenants WHERE id = $1", tenant_id)
    if status not in ("deleting", "deleted"):
        raise PermanentError(f"tenant {tenant_id} is {status or 'gone'}, not being deleted")
    started = datetime.now(UTC)
    redis = _redis(deps)
    queue_name = deps.settings.queue_name
    redis_removed = await _delete_redis(
        redis, queue_name, tenant_id, await deps.pool.fetch(Q["admin.queued_jobs"], tenant_id))
    tables = await _tables(deps.pool)
    removed = await _delete_rows(deps.pool, tenant_id, tables)
    # Deleting its jobs appended their counts' changes (migration 0012): gone in a second pass.
    again = await _delete_rows(deps.pool, tenant_id, tables)
    for table, count in again.items():
        removed[table] += count
    redis_removed += await _delete_redis(redis, queue_name, tenant_id, [])
    left = await _recount(deps.pool, tenant_id, tables)
    redis_left = len(await _tenant_keys(redis, queue_name, tenant_id))
    if left or redis_left:
        raise TransientError(f"erasure of tenant {tenant_id} left rows {left} and "
                             f"{redis_left} Redis keys; trying again")
    report: dict[str, Any] = {
        "removed": {table: count for table, count in removed.items() if count},
        "rows_removed": sum(removed.values()),
        "redis_keys_removed": redis_removed,
        "tables_checked": len(tables),
        "rows_left": 0,
        "redis_keys_left": 0,
        "verified": True,
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "job_id": str(job["id"]),
    }
    log.info("tenant %d erased: %d rows, %d Redis keys", tenant_id, report["rows_removed"],
             redis_removed)

    async def write(conn: asyncpg.Connection) -> None:
        await conn.execute(Q["admin.finish_erasure"], tenant_id, report)
        await conn.execute(
            Q["dashboard.audit"], None, job["payload"].get("key_id"),
            job["payload"].get("key_name", "erasure"), "tenant.erased", f"tenant {tenant_id}",
            None, report["rows_removed"], 0, "api", "ok")

    return write
