from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Query

from api.deps import CurrentTenant, PoolDep, QueueDep, SettingsDep
from api.schemas import (
    AttemptPublic,
    EmbeddingIndexPublic,
    JobPublic,
    JobsPublic,
    JobStats,
    TextStatsPublic,
)
from pipeline import jobs, ledger, reindex, text_stats
from pipeline.db import Q
from pipeline.errors import NotFound

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# The filter values come from the job contract, so a new kind or status needs no edit here.
Status = Literal[jobs.STATUSES]  # type: ignore[valid-type]
Kind = Literal[jobs.KINDS]  # type: ignore[valid-type]


def _public(row, history=()) -> JobPublic:  # type: ignore[no-untyped-def]
    duration = None
    if row["started_at"] and row["finished_at"]:
        duration = (row["finished_at"] - row["started_at"]).total_seconds() * 1000
    fields = {k: row[k] for k in JobPublic.model_fields if k not in ("duration_ms", "history")}
    return JobPublic(**fields, duration_ms=duration,
                     history=[AttemptPublic(**dict(h)) for h in history])


@router.get("", response_model=JobsPublic)
async def list_jobs(
    tenant: CurrentTenant,
    pool: PoolDep,
    status: Status | None = None,
    kind: Kind | None = None,
    item_id: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JobsPublic:
    """Jobs, newest first, filtered by status, kind, item and creation time."""
    flt = ledger.JobFilter(status, kind, item_id, created_after, created_before)
    rows, total = await ledger.list_jobs(pool, tenant, flt, limit=limit, offset=offset)
    return JobsPublic(data=[_public(r) for r in rows], count=total)


@router.get("/stats", response_model=JobStats)
async def job_stats(
    tenant: CurrentTenant, pool: PoolDep, queue: QueueDep, settings: SettingsDep
) -> JobStats:
    """Counts by status and kind, queue depth in Redis, the oldest due job, live workers."""
    figures = await ledger.stats(pool, tenant, alive_window_s=3 * settings.worker_heartbeat_s)
    try:
        depth: int | None = await queue.zcard(settings.queue_name)
    except Exception:  # noqa: BLE001 - Redis down: the ledger still answers
        depth = None
    oldest = figures["oldest_queued_at"]
    age = (datetime.now(UTC) - oldest).total_seconds() if oldest else None
    index = await reindex.state(pool, tenant_id=tenant)
    return JobStats(
        **figures, queue_depth=depth, oldest_queued_age_s=age,
        embedding_index=EmbeddingIndexPublic(
            model=index.model, reindexing_to=index.next_model, parts=index.parts,
            reindexed_parts=index.done,
        ),
        text_stats=TextStatsPublic(**await text_stats.state(pool, tenant)),
    )


@router.get("/{job_id}", response_model=JobPublic)
async def get_job(job_id: UUID, tenant: CurrentTenant, pool: PoolDep) -> JobPublic:
    row = await pool.fetchrow(Q["jobs.get"], tenant, job_id)
    if row is None:
        raise NotFound(f"no job with id {job_id}")
    return _public(row, await pool.fetch(Q["jobs.attempts"], tenant, job_id))


@router.post("/{job_id}/retry", response_model=JobPublic)
async def retry_job(
    job_id: UUID, tenant: CurrentTenant, pool: PoolDep, queue: QueueDep, settings: SettingsDep
) -> JobPublic:
    """Run a dead, cancelled or backing-off job now, with a fresh budget of attempts."""
    ref = await ledger.retry_job(pool, tenant, job_id, fresh_attempts=settings.max_attempts_for)
    await jobs.enqueue(pool, queue, [ref], queue_name=settings.queue_name)
    return await get_job(job_id, tenant, pool)


@router.post("/{job_id}/cancel", response_model=JobPublic)
async def cancel_job(job_id: UUID, tenant: CurrentTenant, pool: PoolDep) -> JobPublic:
    """Cancel a job that has not started yet (queued or waiting)."""
    await ledger.cancel_job(pool, tenant, job_id)
    return await get_job(job_id, tenant, pool)
