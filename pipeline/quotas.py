"""Per-tenant limits, and the check a write makes against them before it writes anything.

A hosted installation gives each tenant limits: requests a minute (counted in Redis by
`api/rate_limit.py`), and items, memories, stored bytes and jobs queued, checked here. A limit
is the tenant's own (`tenant_limits`, set by an operator) or, where that is NULL, the
installation's default (`MEMMILL_DEFAULT_LIMIT_*`), itself unlimited unless set: a self-hosted
single tenant needs no limits, and then a check costs one statement of two index reads.

Usage is never counted when a write is checked (a `count(*)` over a tenant's 100k items takes
milliseconds). Triggers (migration 0015) append each statement's net change of a tenant's
items, memories and bytes to a table of deltas; a read adds the folded usage and the tenant's
unfolded deltas, exact at its snapshot. Jobs queued come from the job counts of migration
0012 the same way. Writers only append rows, never update a shared one, so a tenant's
concurrent writers never wait on each other. A check is one statement: the limits, and the
usage only of what a limit applies to (0.29 ms at 100k items and 400k jobs, 0.28 ms with no
limits, against 0.15 ms for a round trip). Every check looks at up to `FOLD_AFTER_ROWS` + 1
of its tenant's unfolded deltas, limits or not, and folds them all when there are more (one
session at a time; the others skip), so the deltas never pile up; a check of jobs that read
more than `JOB_FOLD_AFTER_ROWS` job count deltas (the sweeper folds those every few seconds,
but only while workers run) folds those. That keeps every check's read short (0.50 ms at both
bounds).

The check is soft at the edge: it reads usage, then the caller writes. Requests of one tenant
that run at the same time each see the usage from before the others' writes, so together they
can pass a limit by at most (requests in flight - 1) x the most one request adds (a batch of
1000 items, 500 events). No single request passes a limit, and once usage is over it, every
request that would add is refused until usage drops.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from pipeline import aggregates
from pipeline import jobs as job_kinds
from pipeline.db import Q
from pipeline.errors import BadInput, NotFound, QuotaExceeded
from pipeline.items import NewItem, caller_tags
from pipeline.settings import Settings, get_settings

LIMITS = ("requests_per_minute", "items", "memories", "bytes", "jobs")
MAX_LIMIT = 2**63 - 1
# When to come back after a 429 for a limit of what is stored: nothing frees itself, so a
# minute (the client deletes, or asks its operator); jobs queued drain as workers run them.
RETRY_AFTER_S = {"items": 60, "memories": 60, "bytes": 60, "jobs": 30}
# A tenant's unfolded usage deltas that a check reads before it folds them; and the unfolded
# job count deltas (every tenant's, as the sweeper folds them every few seconds): 1000 of them
# took a check 0.2 ms to read, 6000 took 1.5 ms.
FOLD_AFTER_ROWS = 64
JOB_FOLD_AFTER_ROWS = 1000


@dataclass(frozen=True)
class Limits:
    """A tenant's limits; None is no limit (or, as stored, the installation's default)."""

    requests_per_minute: int | None = None
    items: int | None = None
    memories: int | None = None
    bytes: int | None = None
    jobs: int | None = None

    def or_defaults(self, defaults: Limits) -> Limits:
        return Limits(**{name: getattr(self, name) if getattr(self, name) is not None
                         else getattr(defaults, name) for name in LIMITS})


@dataclass(frozen=True)
class TenantLimits:
    """What an operator set for a tenant (None: the default) and what applies."""

    tenant_id: int
    own: Limits
    effective: Limits
    updated_at: datetime | None


@dataclass(frozen=True)
class Usage:
    items: int
    memories: int
    bytes: int
    jobs: int


@dataclass(frozen=True)
class Adding:
    """What a write would add, as well as it can be known before it runs."""

    items: int = 0
    memories: int = 0
    bytes: int = 0
    jobs: int = 0


def defaults(settings: Settings) -> Limits:
    return Limits(
        requests_per_minute=settings.default_limit_requests_per_minute,
        items=settings.default_limit_items,
        memories=settings.default_limit_memories,
        bytes=settings.default_limit_bytes,
        jobs=settings.default_limit_jobs,
    )


def tenant_redis_keys(queue_name: str, tenant_id: int) -> list[str]:
    """The Redis keys memmill keeps for a tenant's limits (the request window of
    `api/rate_limit.py`), for the tenant's erasure."""
    return [rate_key(queue_name, tenant_id)]


def rate_key(queue_name: str, tenant_id: int) -> str:
    return f"{queue_name}:rate:{tenant_id}"


Db = asyncpg.Connection | asyncpg.Pool


@dataclass(frozen=True)
class State:
    """A tenant's limits and, where they were read, its usage."""

    limits: Limits
    stored: tuple[int, int, int] | None  # items, memories, bytes
    queued: int | None


async def _state(conn: Db, tenant_id: int, settings: Settings | None, adding: Adding,
                 *, everything: bool = False) -> State:
    """One statement: the limits that apply, and usage where a limit applies to what is
    added (or all of it). Folds when it read many deltas not folded yet."""
    default = defaults(settings or get_settings())
    row = await conn.fetchrow(
        Q["quotas.state"], tenant_id, *(getattr(default, n) for n in LIMITS),
        adding.items, adding.memories, adding.bytes, adding.jobs, everything,
        FOLD_AFTER_ROWS + 1)
    stored, queued = row["stored"], row["queued"]
    if row["unfolded"] > FOLD_AFTER_ROWS:
        await conn.fetchval(Q["quotas.fold"])
    if queued is not None and queued[1] > JOB_FOLD_AFTER_ROWS:
        await aggregates.fold(conn)
    return State(Limits(**{n: row[n] for n in LIMITS}),
                 (stored[0], stored[1], stored[2]) if stored is not None else None,
                 queued[0] if queued is not None else None)


async def limits(conn: Db, tenant_id: int, settings: Settings | None = None) -> Limits:
    """The limits that apply to the tenant: its own, else the installation's defaults."""
    return (await _state(conn, tenant_id, settings, Adding())).limits


async def tenant_limits(conn: Db, tenant_id: int, settings: Settings) -> TenantLimits:
    """A tenant's limits as set and as they apply; NotFound for an unknown tenant."""
    row = await conn.fetchrow(Q["quotas.limits"], tenant_id)
    if row is None and not await conn.fetchval(Q["quotas.tenant_exists"], tenant_id):
        raise NotFound(f"no tenant {tenant_id}")
    own = Limits(**{n: row[n] for n in LIMITS}) if row else Limits()
    return TenantLimits(tenant_id, own, own.or_defaults(defaults(settings)),
                        row["updated_at"] if row else None)


async def set_limits(conn: Db, tenant_id: int, **limits: int | None) -> Limits:
    """Set the named limits of a tenant and keep the others; None puts one back to the
    installation's default. Returns the tenant's limits as set. What the operator's route
    (`PUT /v1/tenants/{id}/limits`, which names all five) and the CLI call."""
    unknown = sorted(set(limits) - set(LIMITS))
    if unknown:
        raise BadInput(f"unknown limits {unknown}; the limits are {', '.join(LIMITS)}")
    for name, value in limits.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_LIMIT):
            raise BadInput(f"{name}: a limit is a whole number from 0 to {MAX_LIMIT}, or null "
                           "for the installation's default")
    row = await conn.fetchrow(Q["quotas.set_limits"], tenant_id,
                              *(limits.get(n) for n in LIMITS), list(limits))
    if row is None:
        raise NotFound(f"no tenant {tenant_id}")
    return Limits(**{n: row[n] for n in LIMITS})


async def usage(conn: Db, tenant_id: int,
                settings: Settings | None = None) -> tuple[Limits, Usage]:
    """The limits that apply to the tenant, and its usage of each."""
    state = await _state(conn, tenant_id, settings, Adding(), everything=True)
    assert state.stored is not None and state.queued is not None
    return state.limits, Usage(*state.stored, state.queued)


async def check(conn: Db, tenant_id: int, *, items: int = 0, memories: int = 0, bytes: int = 0,
                jobs: int = 0, settings: Settings | None = None) -> None:
    """Raise QuotaExceeded (429) when adding this much would pass one of the tenant's limits.
    Only what is added is checked: a request adding no jobs passes however many are queued."""
    adding = Adding(items, memories, bytes, jobs)
    _refuse_over(await _state(conn, tenant_id, settings, adding), adding)


def _refuse_over(state: State, adding: Adding) -> None:
    used = dict(zip(("items", "memories", "bytes"), state.stored or (), strict=False))
    if state.queued is not None:
        used["jobs"] = state.queued
    for name in ("items", "memories", "bytes", "jobs"):
        limit, more = getattr(state.limits, name), getattr(adding, name)
        if limit is not None and more > 0 and used[name] + more > limit:
            raise QuotaExceeded(name, limit_value=limit, used=used[name], adding=more,
                                retry_after_s=RETRY_AFTER_S[name])


async def check_items(conn: Db, tenant_id: int, new_items: Sequence[NewItem],
                      settings: Settings) -> None:
    """The check of a put of these items (one, a batch, an upload, URLs). First as if every
    item were new, which is one statement and enough when that fits; near a limit, what each
    really adds: nothing for an item sent again unchanged, no item for a new version, which
    one read of the existing items tells."""
    most = Adding(items=len(new_items), bytes=sum(_size(i) for i in new_items),
                  jobs=sum(_pipeline_jobs(i) for i in new_items))
    state = await _state(conn, tenant_id, settings, most)
    try:
        _refuse_over(state, most)
    except QuotaExceeded:
        rows = await conn.fetch(Q["quotas.existing_items"], tenant_id,
                                [i.id for i in new_items])
        existing = {r["id"]: r for r in rows}
        _refuse_over(state, _sum(_adds(i, existing.get(i.id), settings) for i in new_items))


def _size(item: NewItem) -> int:
    """A new source's bytes; a URL's are counted once regularize stored what it fetched."""
    return len(item.content.encode()) if item.content is not None else len(item.data or b"")


def _pipeline_jobs(item: NewItem) -> int:
    return len(job_kinds.DOCUMENT_PIPELINE if item.needs_regularize
               else job_kinds.TEXT_PIPELINE)


def _adds(item: NewItem, current: asyncpg.Record | None, settings: Settings) -> Adding:
    """What `pipeline.items.put_item` writes for an item, given the item as it is (None: new):
    the item, a new source and the jobs of its pipeline; a change of tags or title alone
    copies the source and may queue a summary; the same again writes nothing."""
    if current is None:
        return Adding(items=1, bytes=_size(item), jobs=_pipeline_jobs(item))
    if current["content_hash"] != item.content_hash:
        return Adding(bytes=_size(item), jobs=_pipeline_jobs(item))
    if caller_tags(current["tags"]) != item.tags or (
            item.title is not None and current["title"] != item.title):
        return Adding(bytes=_size(item),
                      jobs=0 if settings.summary_provider == "extractive" else 1)
    return Adding()


def _sum(parts: Iterable[Adding]) -> Adding:
    items = memories = stored = jobs = 0
    for part in parts:
        items, memories = items + part.items, memories + part.memories
        stored, jobs = stored + part.bytes, jobs + part.jobs
    return Adding(items, memories, stored, jobs)
