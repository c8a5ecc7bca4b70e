"""What an operator does to the ledger (retry, cancel, replay, pause, resume), checked against
the key's role and written to the audit log: who, what, on which tenant, how many, when.
The JSON API and the dashboard both act through here, so neither can skip the check or the
record.

A tenant's key acts on its own tenant's jobs; an operator's key on any tenant's (the job's
own tenant is looked up); a read-only key on nothing. Pausing a kind stops it for every
tenant, so only an operator may."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from pipeline import ledger
from pipeline.db import Q
from pipeline.errors import Forbidden, NotFound
from pipeline.jobs import KINDS, JobRef
from pipeline.ledger import AttemptBudget
from pipeline.tenants import Principal

Via = Literal["api", "dashboard"]
PREVIEW_TTL_S = 15 * 60


def require_writer(principal: Principal) -> None:
    if principal.read_only:
        raise Forbidden("this key is read-only: it can read, but not change anything")


def require_operator(principal: Principal, doing: str) -> None:
    require_writer(principal)
    if not principal.operator:
        raise Forbidden(f"{doing} affects every tenant: it needs an operator's key")


async def audit(
    pool: asyncpg.Pool | asyncpg.Connection, principal: Principal, action: str, *,
    tenant_id: int | None, via: Via, target: str | None = None,
    filter: dict[str, Any] | None = None, affected: int = 0, skipped: int = 0,
    result: str = "ok",
) -> None:
    await pool.execute(
        Q["dashboard.audit"], tenant_id, principal.key_id, principal.key_name, action, target,
        filter, affected, skipped, via, result,
    )


async def _tenant_of(pool: asyncpg.Pool, principal: Principal, query: str, ident: Any,
                     what: str, across: bool) -> int:
    """The tenant whose row `ident` is: the key's own, or, for an operator acting across
    tenants (the dashboard), whichever it is. A row of another tenant is then a 404, as if
    it did not exist. The JSON API acts within the key's own tenant, operator or not."""
    if not (across and principal.operator):
        return principal.tenant_id
    tenant_id = await pool.fetchval(query, ident)
    if tenant_id is None:
        raise NotFound(f"no {what} with id {ident}")
    return tenant_id


async def job_tenant(pool: asyncpg.Pool, principal: Principal, job_id: uuid.UUID, *,
                     across: bool) -> int:
    return await _tenant_of(pool, principal, Q["dashboard.job_tenant"], job_id, "job", across)


async def dead_letter_tenant(pool: asyncpg.Pool, principal: Principal, dead_id: int, *,
                             across: bool) -> int:
    return await _tenant_of(pool, principal, Q["dashboard.dead_letter_tenant"], dead_id,
                            "dead letter", across)


async def retry(pool: asyncpg.Pool, principal: Principal, job_id: uuid.UUID, *,
                fresh_attempts: AttemptBudget, via: Via) -> JobRef:
    require_writer(principal)
    tenant_id = await job_tenant(pool, principal, job_id, across=via == "dashboard")
    ref = await ledger.retry_job(pool, tenant_id, job_id, fresh_attempts=fresh_attempts)
    await audit(pool, principal, "retry", tenant_id=tenant_id, via=via, target=str(job_id),
                affected=1)
    return ref


async def cancel(pool: asyncpg.Pool, principal: Principal, job_id: uuid.UUID, *,
                 via: Via) -> asyncpg.Record:
    require_writer(principal)
    tenant_id = await job_tenant(pool, principal, job_id, across=via == "dashboard")
    row = await ledger.cancel_job(pool, tenant_id, job_id)
    await audit(pool, principal, "cancel", tenant_id=tenant_id, via=via, target=str(job_id),
                affected=1)
    return row


async def replay_one(pool: asyncpg.Pool, principal: Principal, dead_letter_id: int, *,
                     fresh_attempts: AttemptBudget, via: Via) -> list[JobRef]:
    require_writer(principal)
    tenant_id = await dead_letter_tenant(pool, principal, dead_letter_id,
                                         across=via == "dashboard")
    refs = await ledger.replay(pool, tenant_id, fresh_attempts=fresh_attempts,
                               dead_letter_id=dead_letter_id)
    await audit(pool, principal, "replay", tenant_id=tenant_id, via=via,
                target=f"dead letter {dead_letter_id}", affected=len(refs))
    return refs


async def replay_matching(pool: asyncpg.Pool, principal: Principal,
                          flt: ledger.DeadLetterFilter, *, limit: int,
                          fresh_attempts: AttemptBudget, via: Via) -> list[JobRef]:
    """The JSON API's one-step replay by filter, confined to the key's own tenant."""
    require_writer(principal)
    refs = await ledger.replay(pool, principal.tenant_id, fresh_attempts=fresh_attempts,
                               flt=flt, limit=limit)
    await audit(pool, principal, "replay", tenant_id=principal.tenant_id, via=via,
                filter={"kind": flt.kind, "item_id": flt.item_id, "permanent": flt.permanent,
                        "limit": limit},
                affected=len(refs))
    return refs


def _known_kind(kind: str) -> str:
    if kind not in KINDS:
        raise NotFound(f"no job kind {kind!r}; the kinds are {', '.join(KINDS)}")
    return kind


async def pause(pool: asyncpg.Pool, principal: Principal, kind: str, *, via: Via) -> bool:
    """Stop workers taking `kind`; False when it was paused already."""
    require_operator(principal, "pausing a job kind")
    paused = await pool.fetchval(Q["dashboard.pause"], _known_kind(kind), principal.key_id)
    await audit(pool, principal, "pause", tenant_id=None, via=via, target=kind,
                affected=int(paused is not None))
    return paused is not None


async def resume(pool: asyncpg.Pool, principal: Principal, kind: str, *, via: Via) -> bool:
    """Let workers take `kind` again; its queued jobs are delivered at the next sweep."""
    require_operator(principal, "resuming a job kind")
    async with pool.acquire() as conn, conn.transaction():
        resumed = await conn.fetchval(Q["dashboard.resume"], _known_kind(kind))
        if resumed is not None:
            await conn.execute(Q["dashboard.redeliver_kind"], kind)
    await audit(pool, principal, "resume", tenant_id=None, via=via, target=kind,
                affected=int(resumed is not None))
    return resumed is not None


@dataclass(frozen=True)
class Preview:
    """A bulk replay shown before it is done: the exact dead letters it will touch."""

    id: uuid.UUID
    count: int
    by_kind: dict[str, int]
    truncated: bool


@dataclass(frozen=True)
class BulkReplay:
    replayed: list[JobRef]
    skipped: int


async def preview_replay(pool: asyncpg.Pool, principal: Principal,
                         rows: list[asyncpg.Record], *, tenant_id: int | None,
                         filter: dict[str, Any], truncated: bool) -> Preview:
    """Keep the dead letters `rows` (what the filter matched, as the page counted them) for a
    confirmation; nothing is replayed yet."""
    require_writer(principal)
    by_kind: dict[str, int] = {}
    for row in rows:
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + 1
    preview_id = await pool.fetchval(
        Q["dashboard.create_preview"], tenant_id, principal.key_id, filter,
        [r["id"] for r in rows], PREVIEW_TTL_S,
    )
    return Preview(preview_id, len(rows), by_kind, truncated)


async def confirm_replay(pool: asyncpg.Pool, principal: Principal, preview_id: uuid.UUID, *,
                         fresh_attempts: AttemptBudget, via: Via) -> BulkReplay:
    """Replay what the preview counted and nothing else. A dead letter replayed meanwhile,
    or whose job was retried or deleted, is skipped and counted as skipped: never replayed
    twice. A preview is confirmed once, by the key that made it, within 15 minutes."""
    require_writer(principal)
    async with pool.acquire() as conn, conn.transaction():
        preview = await conn.fetchrow(Q["dashboard.take_preview"], preview_id, principal.key_id)
        if preview is None:
            raise NotFound("no such replay waiting for confirmation: it was confirmed "
                           "already, expired after 15 minutes, or is another key's")
        scope = None if principal.operator and via == "dashboard" else principal.tenant_id
        targets = await conn.fetch(Q["dashboard.still_dead"], preview["dead_letter_ids"], scope)
        refs = []
        for target in targets:
            ref = await ledger.requeue(conn, target["tenant_id"], target["job_id"],
                                       target["kind"], fresh_attempts)
            await conn.execute(Q["dead_letters.mark_replayed"], target["tenant_id"],
                               target["id"])
            if ref is not None:
                refs.append(ref)
        skipped = len(preview["dead_letter_ids"]) - len(refs)
        await audit(conn, principal, "replay", tenant_id=preview["tenant_id"], via=via,
                    filter=preview["filter"], affected=len(refs), skipped=skipped)
    return BulkReplay(refs, skipped)
