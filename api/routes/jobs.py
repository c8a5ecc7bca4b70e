from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Query

from api.deps import CurrentPrincipal, CurrentTenant, PoolDep, QueueDep, SettingsDep
from api.schemas import (
    INT64_MAX,
    AttemptPublic,
    EmbeddingIndexPublic,
    JobPublic,
    JobsPublic,
    JobStats,
    QueryTime,
    SafeStr,
    TextStatsPublic,
)
from pipeline import actions, jobs, ledger, reindex, text_stats
from pipeline.db import Q
from pipeline.errors import NotFound
from pipeline.tenants import Principal
from pipeline.tracebacks import scrub_paths

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# The filter values come from the job contract, so a new kind or status needs no edit here.
Status = Literal[jobs.STATUSES]  # type: ignore[valid-type]
Kind = Literal[jobs.KINDS]  # type: ignore[valid-type]


# `host:pid:random`, as workers.main.new_worker_id makes it.
_WORKER_ID = re.compile(r".+:\d+:(?P<tag>[0-9a-f]+)")


def shown_worker(worker_id: str, principal: Principal) -> str:
    """A worker id as the key may see it. A tenant still sees which attempts ran on the same
    worker, as `worker-<random part>`, but not the host and pid it ran on."""
    if principal.operator:
        return worker_id
    match = _WORKER_ID.fullmatch(worker_id)
    tag = match["tag"] if match else hashlib.sha256(worker_id.encode()).hexdigest()[:6]
    return f"worker-{tag}"


def attempt_fields(row: Mapping[str, Any], principal: Principal) -> dict[str, Any]:
    """An attempt row for the key: its worker shown as above, and its error and traceback
    without server paths. The worker stores them scrubbed already (pipeline.tracebacks);
    this pass covers rows stored before it did, and changes nothing in the others."""
    fields = dict(row)
    fields["worker_id"] = shown_worker(fields["worker_id"], principal)
    for name in ("error", "traceback"):
        if fields.get(name):
            fields[name] = scrub_paths(fields[name])
    return fields


def _public(row, history=()) -> JobPublic:  # type: ignore[no-untyped-def]
    """A job row for the API; `history` holds its attempts as `attempt_fields` made them."""
    duration = None
    if row["started_at"] and row["finished_at"]:
        duration = (row["finished_at"] - row["started_at"]).total_seconds() * 1000
    fields = {k: row[k] for k in JobPublic.model_fields if k not in ("duration_ms", "history")}
    if fields["last_error"]:
        fields["last_error"] = scrub_paths(fields["last_error"])
    return JobPublic(**fields, duration_ms=duration,
                     history=[AttemptPublic(**h) for h in history])


@router.get("", response_model=JobsPublic)
async def list_jobs(
    tenant: CurrentTenant,
    pool: PoolDep,
    status: Status | None = None,
    kind: Kind | None = None,
    item_id: SafeStr | None = None,
    created_after: QueryTime | None = None,
    created_before: QueryTime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
) -> JobsPublic:
    """Jobs, newest first, filtered by status, kind, item and creation time."""
    flt = ledger.JobFilter(status, kind, item_id, created_after, created_before)
    rows, total = await ledger.list_jobs(pool, tenant, flt, limit=limit, offset=offset)
    return JobsPublic(data=[_public(r) for r in rows], count=total)


@router.get("/stats", response_model=JobStats)
async def job_stats(
    principal: CurrentPrincipal, pool: PoolDep, queue: QueueDep, settings: SettingsDep
) -> JobStats:
    """This tenant's counts by status and kind, its due work and oldest due job, how many
    workers are alive; for an operator's key also the whole queue's depth in Redis and the
    live workers with their hosts and pids."""
    tenant = principal.tenant_id
    figures = await ledger.stats(
        pool, tenant, alive_window_s=3 * settings.worker_heartbeat_s,
        queue_name=settings.queue_name, operator=principal.operator)
    depth: int | None = None
    if principal.operator:
        try:
            depth = await queue.zcard(settings.queue_name)
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
async def get_job(job_id: UUID, principal: CurrentPrincipal, pool: PoolDep) -> JobPublic:
    """A job with each attempt's outcome, error and backoff."""
    row = await pool.fetchrow(Q["jobs.get"], principal.tenant_id, job_id)
    if row is None:
        raise NotFound(f"no job with id {job_id}")
    attempts = await pool.fetch(Q["jobs.attempts"], principal.tenant_id, job_id)
    return _public(row, [attempt_fields(a, principal) for a in attempts])


@router.post("/{job_id}/retry", response_model=JobPublic)
async def retry_job(
    job_id: UUID, principal: CurrentPrincipal, pool: PoolDep, queue: QueueDep,
    settings: SettingsDep,
) -> JobPublic:
    """Run a dead, cancelled or backing-off job now, with a fresh budget of attempts."""
    ref = await actions.retry(pool, principal, job_id, fresh_attempts=settings.max_attempts_for,
                              via="api")
    await jobs.enqueue(pool, queue, [ref], queue_name=settings.queue_name)
    return await get_job(job_id, principal, pool)


@router.post("/{job_id}/cancel", response_model=JobPublic)
async def cancel_job(job_id: UUID, principal: CurrentPrincipal, pool: PoolDep) -> JobPublic:
    """Cancel a job that has not started yet (queued or waiting)."""
    await actions.cancel(pool, principal, job_id, via="api")
    return await get_job(job_id, principal, pool)
