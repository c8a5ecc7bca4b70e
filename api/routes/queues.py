"""Job kinds as queues: their depth and whether workers take them; an operator pauses and
resumes a kind for every tenant (the dashboard's Queues page does the same, through the same
audited actions)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentPrincipal, PoolDep
from api.routes.jobs import Kind
from api.schemas import QueueChanged, QueuePublic, QueuesPublic
from pipeline import actions, aggregates, jobs
from pipeline.db import Q

router = APIRouter(prefix="/v1/queues", tags=["queues"])


@router.get("", response_model=QueuesPublic)
async def list_queues(principal: CurrentPrincipal, pool: PoolDep) -> QueuesPublic:
    """Every job kind with this tenant's counts, from the maintained aggregates."""
    tenant = principal.tenant_id
    await aggregates.fold(pool)
    counts = await aggregates.counts(pool, tenant)
    oldest = {r["kind"]: r["oldest_due"] for r in await pool.fetch(Q["aggregates.oldest_due"],
                                                                    tenant)}
    paused = {r["kind"]: r["paused_at"] for r in await pool.fetch(Q["aggregates.paused"])}
    now = await pool.fetchval("SELECT now()")
    data = []
    for kind in jobs.KINDS:
        c = counts.get(kind, {})
        due = oldest.get(kind)
        data.append(QueuePublic(
            kind=kind, paused=kind in paused, paused_at=paused.get(kind),
            queued=c.get("queued", 0), retrying=c.get("retrying", 0),
            waiting=c.get("waiting", 0), running=c.get("running", 0),
            oldest_due_age_s=max(0.0, (now - due).total_seconds()) if due else None))
    return QueuesPublic(data=data)


@router.post("/{kind}/pause", response_model=QueueChanged)
async def pause(kind: Kind, principal: CurrentPrincipal, pool: PoolDep) -> QueueChanged:
    """Stop workers taking this kind, for every tenant (operator keys only); its jobs stay
    in the ledger."""
    changed = await actions.pause(pool, principal, kind, via="api")
    return QueueChanged(kind=kind, paused=True, changed=changed)


@router.post("/{kind}/resume", response_model=QueueChanged)
async def resume(kind: Kind, principal: CurrentPrincipal, pool: PoolDep) -> QueueChanged:
    """Let workers take this kind again; its queued jobs are delivered at the next sweep."""
    changed = await actions.resume(pool, principal, kind, via="api")
    return QueueChanged(kind=kind, paused=False, changed=changed)
