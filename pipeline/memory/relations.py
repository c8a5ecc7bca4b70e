"""Relations between memories (`supersedes`, `related_to`, `derived_from`) and from a memory
to an item or one of its parts (`references`).

A relation is seen by whoever sees both its ends: every read passes each end through
scope_visible, so a walk never steps onto (nor through) a memory its reader may not see, and a
relation cannot be written to a memory the writer cannot see. A walk is one recursive query
over (memory, depth) pairs: UNION keeps each pair once, so a cycle costs at most one row per
memory and depth, never a path per route through the graph."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal, get_args

import asyncpg

from pipeline.db import Q
from pipeline.errors import BadInput, NotFound
from pipeline.memory.scopes import Scope

Kind = Literal["supersedes", "related_to", "derived_from"]
KINDS: tuple[str, ...] = get_args(Kind)
MAX_DEPTH = 5
# Nodes a walk returns at most, nearest first: a dense neighbourhood stays one page.
MAX_NODES = 200
# Neighbours shown per hit when a search expands its hits by one hop.
EXPAND_PER_HIT = 5


@dataclass(frozen=True)
class Walk:
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    truncated: bool


async def _visible(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int,
                   memory_id: uuid.UUID, reader: Scope) -> None:
    if await conn.fetchval(Q["relations.visible"], tenant_id, memory_id, reader.user_id,
                           reader.agent_id) is None:
        raise NotFound(f"no memory {memory_id}")


async def add(conn: asyncpg.Connection, tenant_id: int, reader: Scope, from_id: uuid.UUID,
              kind: str, to_id: uuid.UUID) -> asyncpg.Record:
    """A caller's relation between two memories it sees; the same relation again is kept as
    it is (writing it twice is harmless)."""
    if kind not in KINDS:
        raise BadInput(f"kind: one of {', '.join(KINDS)}")
    if from_id == to_id:
        raise BadInput("to_id: a memory is not related to itself")
    await _visible(conn, tenant_id, from_id, reader)
    await _visible(conn, tenant_id, to_id, reader)
    return await conn.fetchrow(Q["relations.insert"], tenant_id, from_id, kind, to_id, None, None)


async def remove(conn: asyncpg.Connection, tenant_id: int, reader: Scope, from_id: uuid.UUID,
                 kind: str, to_id: uuid.UUID) -> None:
    await _visible(conn, tenant_id, from_id, reader)
    await _visible(conn, tenant_id, to_id, reader)
    if await conn.fetchval(Q["relations.delete"], tenant_id, from_id, kind, to_id) is None:
        raise NotFound(f"no {kind} relation from {from_id} to {to_id}")


async def add_reference(conn: asyncpg.Connection, tenant_id: int, reader: Scope,
                        memory_id: uuid.UUID, item_id: str,
                        position: int | None) -> asyncpg.Record:
    """A memory's reference to an item of the tenant, or to the part at `position` of its
    current version."""
    await _visible(conn, tenant_id, memory_id, reader)
    found = await conn.fetchrow(Q["relations.item_part"], tenant_id, item_id, position)
    if found is None:
        raise NotFound(f"no item {item_id!r}")
    if position is not None and not found["part_exists"]:
        raise NotFound(f"item {item_id!r} has no part at position {position}")
    return await conn.fetchrow(Q["relations.insert_reference"], tenant_id, memory_id, item_id,
                               -1 if position is None else position)


async def remove_reference(conn: asyncpg.Connection, tenant_id: int, reader: Scope,
                           memory_id: uuid.UUID, item_id: str, position: int | None) -> None:
    await _visible(conn, tenant_id, memory_id, reader)
    if await conn.fetchval(Q["relations.delete_reference"], tenant_id, memory_id, item_id,
                           -1 if position is None else position) is None:
        raise NotFound(f"memory {memory_id} has no such reference to {item_id!r}")


async def walk(pool: asyncpg.Pool, tenant_id: int, reader: Scope, memory_id: uuid.UUID,
               depth: int, kinds: list[str] | None = None) -> Walk:
    """The memories within `depth` relations of one, in both directions, nearest first, with
    the relations between them; and the items the start references."""
    if not 1 <= depth <= MAX_DEPTH:
        raise BadInput(f"depth: from 1 to {MAX_DEPTH}")
    await _visible(pool, tenant_id, memory_id, reader)
    rows = await pool.fetch(Q["relations.walk"], tenant_id, memory_id, reader.user_id,
                            reader.agent_id, depth, kinds, MAX_NODES + 1)
    truncated = len(rows) > MAX_NODES
    rows = rows[:MAX_NODES]
    ids = [memory_id, *(r["id"] for r in rows)]
    edges = await pool.fetch(Q["relations.between"], tenant_id, ids, kinds)
    return Walk(nodes=[dict(r) for r in rows], edges=[dict(e) for e in edges],
                truncated=truncated)


async def references(pool: asyncpg.Pool, tenant_id: int,
                     memory_id: uuid.UUID) -> list[dict[str, Any]]:
    return [{"item_id": r["item_id"], "position": None if r["position"] < 0 else r["position"]}
            for r in await pool.fetch(Q["relations.references"], tenant_id, memory_id)]


async def neighbours(pool: asyncpg.Pool, tenant_id: int, reader: Scope,
                     memory_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """One hop from each of a search's hits: what a search with `expand` adds to each."""
    found: dict[uuid.UUID, list[dict[str, Any]]] = {m: [] for m in memory_ids}
    if not memory_ids:
        return found
    for r in await pool.fetch(Q["relations.neighbours"], tenant_id, memory_ids, reader.user_id,
                              reader.agent_id, EXPAND_PER_HIT):
        found[r["hit"]].append({"id": r["id"], "kind": r["kind"], "direction": r["direction"],
                                "type": r["type"], "content": r["content"]})
    return found
