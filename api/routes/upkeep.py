"""Memory upkeep: the tenant's memory policy (lifetimes, cap, schedule, thresholds) and
consolidation runs (start, report, list their changes, undo)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response

from api.binding import Reader, acting_as
from api.deps import CurrentPrincipal, PoolDep, QueueDep, SettingsDep
from api.memory_schemas import WaitSeconds
from api.routes.memories import cursor_of, read_cursor
from api.schemas import SafeStr
from api.upkeep_schemas import (
    ChangePublic,
    ChangesPage,
    InboxEntry,
    InboxPage,
    PolicyPublic,
    PolicyUpdate,
    RunAccepted,
    RunCreate,
    RunPublic,
    RunsPage,
    Step,
    UndoReport,
)
from pipeline import actions, jobs, quotas
from pipeline.db import Q
from pipeline.errors import BadInput
from pipeline.memory import operations, policy
from pipeline.memory.scopes import Scope
from pipeline.memory.upkeep import runs
from pipeline.tenants import Principal

router = APIRouter(tags=["memory upkeep"])


async def _policy_public(pool: Any, tenant_id: int, rules: policy.Policy,
                         moved: int | None = None) -> PolicyPublic:
    due = await pool.fetchrow(Q["upkeep.schedule_of"], tenant_id)
    return PolicyPublic(
        lifetimes=rules.lifetimes, memory_cap=rules.memory_cap, schedule=rules.schedule,
        merge_similarity=rules.merge_similarity, link_similarity=rules.link_similarity,
        overrides=rules.overrides, expiries_moved=moved,
        next_consolidation=due["next_consolidation"] if due else None,
        next_prune=due["next_prune"] if due else None)


@router.get("/v1/memory-policy", response_model=PolicyPublic)
async def get_policy(principal: CurrentPrincipal, pool: PoolDep,
                     settings: SettingsDep) -> PolicyPublic:
    """The tenant's memory policy, defaults filled in, and when its next runs are due."""
    rules = await policy.load(pool, principal.tenant_id, settings)
    return await _policy_public(pool, principal.tenant_id, rules)


@router.put("/v1/memory-policy", response_model=PolicyPublic)
async def set_policy(body: PolicyUpdate, principal: CurrentPrincipal, pool: PoolDep,
                     settings: SettingsDep) -> PolicyPublic:
    """Change what is sent (the rest stays). A changed lifetime moves the expiry of every
    memory of its layer; a changed schedule moves the next consolidation."""
    async with pool.acquire() as conn, conn.transaction():
        rules, moved = await policy.save(
            conn, principal.tenant_id, settings,
            lifetimes=dict(body.lifetimes) if body.lifetimes is not None else None,
            memory_cap=body.memory_cap, schedule=body.schedule,
            merge_similarity=body.merge_similarity, link_similarity=body.link_similarity)
        await actions.audit(conn, principal, "memory_policy.update",
                            tenant_id=principal.tenant_id, via="api",
                            filter=body.model_dump(exclude_none=True), affected=moved)
    return await _policy_public(pool, principal.tenant_id, rules, moved)


@router.delete("/v1/memory-policy", response_model=PolicyPublic)
async def reset_policy(principal: CurrentPrincipal, pool: PoolDep,
                       settings: SettingsDep) -> PolicyPublic:
    """Back to the installation's defaults."""
    async with pool.acquire() as conn, conn.transaction():
        rules, moved = await policy.reset(conn, principal.tenant_id, settings)
        await actions.audit(conn, principal, "memory_policy.reset",
                            tenant_id=principal.tenant_id, via="api", affected=moved)
    return await _policy_public(pool, principal.tenant_id, rules, moved)


@router.post("/v1/consolidation/runs", status_code=202, response_model=RunAccepted)
async def start_run(
    body: RunCreate, principal: CurrentPrincipal, pool: PoolDep, queue: QueueDep,
    settings: SettingsDep, response: Response,
    wait: Annotated[WaitSeconds | None, Query(description=(
        "Seconds to wait for the run to finish before answering."))] = None,
) -> RunAccepted:
    """Start a run of upkeep steps now, each a job in the ledger, in the order prune, merge,
    decay, link. With `dry_run` each step records what it would change and changes nothing.
    The run is also an operation of the same id."""
    asked = body.scope or None
    scope = acting_as(principal, asked.user_id if asked else None,
                      asked.agent_id if asked else None).as_dict()
    options = {k: v for k in runs.OPTIONS if (v := getattr(body, k)) is not None}
    rules = await policy.load(pool, principal.tenant_id, settings)
    link = options.get("link_similarity", rules.link_similarity)
    merge = options.get("merge_similarity", rules.merge_similarity)
    if link > merge:
        raise BadInput(f"link_similarity ({link:g}) must not be above merge_similarity "
                       f"({merge:g}; what the run does not set comes from the tenant's "
                       "memory policy): memories that similar are merged, not linked")
    await quotas.check(pool, principal.tenant_id, jobs=len(set(body.steps)), settings=settings)
    async with pool.acquire() as conn, conn.transaction():
        run_id, refs = await runs.start(
            conn, tenant_id=principal.tenant_id, steps=body.steps, dry_run=body.dry_run,
            scope=scope, options=options, trigger="request", key_id=principal.key_id,
            settings=settings)
        if not body.dry_run:
            await actions.audit(conn, principal, "consolidation.run",
                                tenant_id=principal.tenant_id, via="api", target=str(run_id),
                                filter={"steps": runs.ordered(body.steps), "scope": scope})
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    if wait:
        await operations.wait(pool, principal.tenant_id, run_id, wait)
    response.headers["Location"] = f"/v1/consolidation/runs/{run_id}"
    run = await runs.get(pool, principal.tenant_id, run_id)
    return RunAccepted(run_id=run_id, operation_id=run_id, run=RunPublic(**run))


def _bound(principal: Principal) -> Scope:
    return Scope(principal.user_id, principal.agent_id)


@router.get("/v1/consolidation/runs", response_model=RunsPage)
async def list_runs(
    principal: CurrentPrincipal, pool: PoolDep,
    cursor: Annotated[SafeStr | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> RunsPage:
    """The tenant's runs, requested and scheduled, newest first."""
    after = read_cursor(cursor) if cursor else (None, None)
    rows = await pool.fetch(Q["upkeep.run_list"], principal.tenant_id, after[0], after[1],
                            limit + 1, principal.user_id, principal.agent_id)
    described = [runs.describe(r) for r in rows[:limit]]
    return RunsPage(data=[RunPublic(**r) for r in described],
                    next_cursor=cursor_of(described[-1]) if len(rows) > limit else None)


@router.get("/v1/consolidation/runs/{run_id}", response_model=RunPublic)
async def get_run(run_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep) -> RunPublic:
    """A run: its status, each step's counts, its changes by step and action, its undo."""
    return RunPublic(**await runs.get(pool, principal.tenant_id, run_id, _bound(principal)))


@router.get("/v1/consolidation/runs/{run_id}/changes", response_model=ChangesPage)
async def run_changes(
    run_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep,
    step: Step | None = None,
    after: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ChangesPage:
    """Every change the run made (or, in a dry run, would make), in order: which memory, the
    other one of a pair, and the detail (similarity, confidence from and to, ...)."""
    await runs.get(pool, principal.tenant_id, run_id, _bound(principal))  # or a 404
    rows = await pool.fetch(Q["upkeep.changes_page"], principal.tenant_id, run_id, step, after,
                            limit + 1)
    page = rows[:limit]
    return ChangesPage(data=[ChangePublic(**dict(r)) for r in page],
                       next_after=page[-1]["seq"] if len(rows) > limit else None)


@router.post("/v1/consolidation/runs/{run_id}/undo", response_model=UndoReport)
async def undo_run(run_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep,
                   settings: SettingsDep) -> UndoReport:
    """Put back what an applied run changed: memories as they were before it (unless changed
    since: those are listed as skipped), its relations and observations removed, what it
    pruned written back. A run is undone once."""
    report = await runs.undo(pool, principal.tenant_id, run_id, principal.key_id, settings,
                             _bound(principal))
    await actions.audit(pool, principal, "consolidation.undo", tenant_id=principal.tenant_id,
                        via="api", target=str(run_id),
                        affected=report["restored"] + report["reinserted"]
                        + report["observations_deleted"],
                        skipped=len(report["skipped"]))
    return UndoReport(**report)


@router.get("/v1/inbox", response_model=InboxPage)
async def inbox(
    principal: CurrentPrincipal, pool: PoolDep, reader: Reader,
    status: Annotated[Literal["waiting", "promoted", "dropped"] | None, Query(description=(
        "Only these; default: all."))] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> InboxPage:
    """The low-confidence observations the scope may read, waiting for consolidation to
    promote them to memories (attention at the threshold) or drop them (waited too long)."""
    rows = await pool.fetch(Q["inbox.list"], principal.tenant_id, reader.user_id,
                            reader.agent_id, status, limit)
    return InboxPage(data=[InboxEntry(**dict(r)) for r in rows])
