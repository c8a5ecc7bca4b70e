from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import CurrentPrincipal, CurrentTenant, PoolDep, QueueDep, SettingsDep
from api.routes.jobs import Kind, attempt_fields
from api.schemas import (
    INT64_MAX,
    INT64_MIN,
    AttemptDetail,
    DeadLetterPublic,
    DeadLettersPublic,
    Replayed,
    ReplayFilter,
    SafeStr,
)
from pipeline import actions, jobs, ledger
from pipeline.tracebacks import scrub_paths

router = APIRouter(prefix="/v1/dead-letters", tags=["dead letters"])
DeadLetterId = Annotated[int, Path(ge=INT64_MIN, le=INT64_MAX)]


def _public(row, history=()) -> DeadLetterPublic:  # type: ignore[no-untyped-def]
    """A dead letter for the API; `history` holds its attempts as `attempt_fields` made them.
    The reason and last error are scrubbed of server paths again, as the attempts are."""
    fields = {k: row[k] for k in DeadLetterPublic.model_fields if k != "history"}
    for name in ("reason", "last_error"):
        if fields[name]:
            fields[name] = scrub_paths(fields[name])
    return DeadLetterPublic(**fields, history=[AttemptDetail(**h) for h in history])


@router.get("", response_model=DeadLettersPublic)
async def list_dead_letters(
    tenant: CurrentTenant,
    pool: PoolDep,
    kind: Kind | None = None,
    item_id: SafeStr | None = None,
    replayed: bool | None = None,
    permanent: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
) -> DeadLettersPublic:
    """Jobs that failed for good, newest first."""
    flt = ledger.DeadLetterFilter(kind, item_id, replayed, permanent)
    rows, total = await ledger.list_dead_letters(pool, tenant, flt, limit=limit, offset=offset)
    return DeadLettersPublic(data=[_public(r) for r in rows], count=total)


@router.get("/{dead_letter_id}", response_model=DeadLetterPublic)
async def get_dead_letter(dead_letter_id: DeadLetterId, principal: CurrentPrincipal,
                          pool: PoolDep) -> DeadLetterPublic:
    """One dead letter with every attempt's error and traceback (file paths relative to the
    source tree, `<lib>/` and `<python>/`; never the server's)."""
    row, history = await ledger.get_dead_letter(pool, principal.tenant_id, dead_letter_id)
    return _public(row, [attempt_fields(h, principal) for h in history])


@router.post("/replay", response_model=Replayed)
async def replay_matching(
    body: ReplayFilter, principal: CurrentPrincipal, pool: PoolDep, queue: QueueDep,
    settings: SettingsDep,
) -> Replayed:
    """Replay every not yet replayed dead letter that matches the filter (all by default)."""
    flt = ledger.DeadLetterFilter(body.kind, body.item_id, None, body.permanent)
    refs = await actions.replay_matching(pool, principal, flt, limit=body.limit,
                                         fresh_attempts=settings.max_attempts_for, via="api")
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    return Replayed(replayed=len(refs), jobs=[r.id for r in refs])


@router.post("/{dead_letter_id}/replay", response_model=Replayed)
async def replay_one(
    dead_letter_id: DeadLetterId, principal: CurrentPrincipal, pool: PoolDep, queue: QueueDep,
    settings: SettingsDep,
) -> Replayed:
    """Put one dead-lettered job back through the normal path with fresh attempts."""
    refs = await actions.replay_one(pool, principal, dead_letter_id,
                                    fresh_attempts=settings.max_attempts_for, via="api")
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    return Replayed(replayed=len(refs), jobs=[r.id for r in refs])
