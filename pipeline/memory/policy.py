"""A tenant's memory policy: how long each layer lives, how many memories it may keep, when
consolidation runs and at what similarities it merges and links. What the tenant leaves unset
is the installation's default (MEMMILL_MEMORY_*), read at the time of use, so changing a
default reaches every tenant that did not choose otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

import asyncpg
from croniter import CroniterBadCronError, croniter

from pipeline.db import Q
from pipeline.errors import BadInput
from pipeline.settings import Settings

Layer = Literal["conversation", "tool", "group", "pinned", "observation", "profile"]
LAYERS: tuple[str, ...] = get_args(Layer)
# Never pruned nor decayed, whatever lifetime a policy gives them: the layers a user or an
# agent chose to keep, and what consolidation distilled.
PERMANENT_LAYERS = frozenset({"pinned", "observation", "profile"})
MAX_LIFETIME_DAYS = 36_500.0


@dataclass(frozen=True)
class Policy:
    lifetimes: dict[str, float | None]
    memory_cap: int
    schedule: str
    merge_similarity: float
    link_similarity: float
    # What the tenant set itself (the rest is the installation's default).
    overrides: dict[str, Any]

    def lifetime(self, layer: str) -> timedelta | None:
        days = None if layer in PERMANENT_LAYERS else self.lifetimes.get(layer)
        return None if days is None else timedelta(days=days)

    def expires_at(self, layer: str, pinned: bool, created_at: datetime) -> datetime | None:
        """When a memory of this layer written at `created_at` expires; None: never. A pinned
        memory never does, whatever its layer."""
        lifetime = None if pinned else self.lifetime(layer)
        return None if lifetime is None else created_at + lifetime

    def next_run(self, after: datetime) -> datetime:
        return next_time(self.schedule, after)


def default_layer(type: str, pinned: bool) -> str:
    """The layer of a memory written without one: what its writer said about it (pinned, a
    conversation) or, failing that, a permanent observation. Nothing expires unless someone
    asked for a lifetime."""
    if pinned:
        return "pinned"
    return "conversation" if type == "conversation" else "observation"


def check_schedule(expression: str) -> str:
    """A cron expression (five fields, UTC) as croniter reads it, or a 422 saying why not."""
    text = " ".join(expression.split())
    if len(text.split(" ")) != 5:
        raise BadInput(f"schedule: {expression!r} is not a cron expression of five fields "
                       "(minute hour day-of-month month day-of-week), e.g. '0 3 * * *'")
    try:
        croniter(text, datetime.now(UTC)).get_next(datetime)
    except (CroniterBadCronError, ValueError, KeyError) as exc:
        raise BadInput(f"schedule: {expression!r} is not a valid cron expression: {exc}") from None
    return text


def next_time(schedule: str, after: datetime) -> datetime:
    return croniter(schedule, after.astimezone(UTC)).get_next(datetime)


def check_lifetimes(lifetimes: dict[str, float | None]) -> dict[str, float | None]:
    unknown = sorted(set(lifetimes) - set(LAYERS))
    if unknown:
        raise BadInput(f"lifetimes: unknown layers {unknown}; the layers are {', '.join(LAYERS)}")
    fixed = sorted(k for k, v in lifetimes.items() if k in PERMANENT_LAYERS and v is not None)
    if fixed:
        raise BadInput(f"lifetimes: {', '.join(fixed)} are permanent layers; send null for them")
    for layer, days in lifetimes.items():
        if days is not None and not 0 < days <= MAX_LIFETIME_DAYS:
            raise BadInput(f"lifetimes.{layer}: a lifetime is more than 0 and at most "
                           f"{MAX_LIFETIME_DAYS:g} days, or null for permanent")
    return lifetimes


def _of(row: asyncpg.Record | None, settings: Settings) -> Policy:
    own: dict[str, Any] = {}
    if row is not None:
        own = {k: row[k] for k in ("memory_cap", "schedule", "merge_similarity",
                                   "link_similarity") if row[k] is not None}
        if row["lifetimes"]:
            own["lifetimes"] = dict(row["lifetimes"])
    return Policy(
        lifetimes={**settings.memory_lifetime_days, **own.get("lifetimes", {})},
        memory_cap=own.get("memory_cap", settings.memory_cap),
        schedule=own.get("schedule", settings.memory_schedule),
        merge_similarity=own.get("merge_similarity", settings.memory_merge_similarity),
        link_similarity=own.get("link_similarity", settings.memory_link_similarity),
        overrides=own)


async def load(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int,
               settings: Settings) -> Policy:
    return _of(await conn.fetchrow(Q["upkeep.policy"], tenant_id), settings)


async def save(conn: asyncpg.Connection, tenant_id: int, settings: Settings, *,
               lifetimes: dict[str, float | None] | None, memory_cap: int | None,
               schedule: str | None, merge_similarity: float | None,
               link_similarity: float | None) -> tuple[Policy, int]:
    """Store what the tenant sets (None keeps a field; the API's `reset` clears it), then
    give the memories of every layer whose lifetime changed their new expiry, and move the
    next consolidation to the new schedule. Returns the policy and how many memories' expiry
    moved."""
    before = await load(conn, tenant_id, settings)
    if lifetimes is not None:
        lifetimes = {**before.overrides.get("lifetimes", {}), **check_lifetimes(lifetimes)}
    if schedule is not None:
        schedule = check_schedule(schedule)
    merge = merge_similarity if merge_similarity is not None else before.merge_similarity
    link = link_similarity if link_similarity is not None else before.link_similarity
    if link > merge:
        raise BadInput(f"link_similarity ({link:g}) must not be above merge_similarity "
                       f"({merge:g}): memories that similar are merged, not linked")
    await conn.execute(Q["upkeep.save_policy"], tenant_id, lifetimes, memory_cap, schedule,
                       merge_similarity, link_similarity)
    return await _follow(conn, tenant_id, before, await load(conn, tenant_id, settings))


async def reset(conn: asyncpg.Connection, tenant_id: int, settings: Settings) -> tuple[Policy, int]:
    """Back to the installation's defaults (expiries follow, as for any change)."""
    before = await load(conn, tenant_id, settings)
    await conn.execute(Q["upkeep.delete_policy"], tenant_id)
    return await _follow(conn, tenant_id, before, await load(conn, tenant_id, settings))


async def _follow(conn: asyncpg.Connection, tenant_id: int, before: Policy,
                  after: Policy) -> tuple[Policy, int]:
    """Make the memories and the schedule follow a changed policy: every memory of a layer
    whose lifetime changed gets its new expiry (from when it was written), and the next
    consolidation moves to the new schedule."""
    moved = 0
    for layer in LAYERS:
        if after.lifetime(layer) != before.lifetime(layer):
            lifetime = after.lifetime(layer)
            days = None if lifetime is None else lifetime.total_seconds() / 86400
            status = await conn.execute(Q["upkeep.reset_expiry"], tenant_id, layer, days)
            moved += int(status.rsplit(" ", 1)[-1])
    if after.schedule != before.schedule:
        await conn.execute(Q["upkeep.reschedule"], tenant_id, after.next_run(datetime.now(UTC)))
    return after, moved
