"""Memories: typed statements an agent keeps, each with its scope, validity and history.

A write is stored at once (full-text searchable when the call returns) and embedded by an
`embed_memory` job. Every change is a row of history with who made it, and carries the version
its writer read: a stale version is refused with the current one, never overwritten."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import numpy as np

from pipeline import jobs, webhooks
from pipeline.db import Q
from pipeline.errors import BadInput, Conflict, NotFound
from pipeline.items import content_hash
from pipeline.jobs import JobRef, JobSpec
from pipeline.memory import operations, policy
from pipeline.memory.policy import Policy, default_layer
from pipeline.memory.scopes import Scope, Visibility, visibility_for
from pipeline.settings import Settings

BUILTIN_TYPES = ("fact", "decision", "preference", "event", "project_state", "procedure",
                 "conversation", "self_assessment")
TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
MAX_TYPE_CHARS = 64


@dataclass(frozen=True)
class Author:
    """Who makes a change, for its history: the API key and the agent it speaks for."""

    key_id: int | None
    agent_id: str | None
    operation_id: uuid.UUID | None = None


@dataclass(frozen=True)
class NewMemory:
    type: str
    content: str
    confidence: float = 0.8
    source: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    hints: tuple[str, ...] = ()
    pinned: bool = False
    observed_at: datetime | None = None
    session_id: str | None = None
    source_events: tuple[tuple[str, str], ...] = ()
    # The caller's id, which makes a write safe to send again (a second one is a 409), and
    # the end of its validity, for a memory known to hold only until then.
    id: uuid.UUID | None = None
    valid_until: datetime | None = None
    # How long it lives (pipeline/memory/policy.py); None: as its type and pinning say.
    layer: str | None = None


@dataclass(frozen=True)
class Change:
    """Fields to change; None leaves a field as it is."""

    content: str | None = None
    type: str | None = None
    confidence: float | None = None
    source: str | None = None
    metadata: dict[str, Any] | None = None
    hints: tuple[str, ...] | None = None
    pinned: bool | None = None
    observed_at: datetime | None = None
    layer: str | None = None


async def known_types(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int) -> list[str]:
    return [*BUILTIN_TYPES, *(r["name"] for r in await conn.fetch(Q["memories.types"], tenant_id))]


async def check_type(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int, name: str) -> None:
    if name in BUILTIN_TYPES or await conn.fetchval(Q["memories.type_exists"], tenant_id, name):
        return
    raise BadInput(f"type: unknown memory type {name!r}; use one of {', '.join(BUILTIN_TYPES)} "
                   "or register it first (POST /v1/memory-types)")


def source_events_json(pairs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"session_id": s, "event_id": e} for s, e in pairs]


async def insert(conn: asyncpg.Connection, *, tenant_id: int, scope: Scope,
                 visibility: Visibility, memory: NewMemory, author: Author, rules: Policy,
                 embedding: np.ndarray | None = None, model: str | None = None,
                 reason: str | None = None) -> asyncpg.Record:
    """A memory and the first row of its history, in the caller's transaction. Its layer is
    the one asked for or the default for its type, and its expiry follows from the layer."""
    layer = memory.layer or default_layer(memory.type, memory.pinned)
    row = await conn.fetchrow(
        Q["memories.insert"], tenant_id, scope.user_id, scope.agent_id, memory.session_id,
        visibility, memory.type, memory.content, memory.confidence, memory.source,
        memory.metadata, list(memory.hints), memory.pinned, memory.observed_at,
        source_events_json(memory.source_events), content_hash(memory.content), embedding,
        model if embedding is not None else None, memory.id, memory.valid_until, layer,
        _days(rules.lifetime(layer), memory.pinned))
    if row is None:
        raise Conflict(f"memory_id: a memory {memory.id} exists already "
                       "(ids are unique in a tenant)")
    await write_history(conn, tenant_id, row, "add", author, None, memory.content, {}, reason)
    return row


async def add(conn: asyncpg.Connection, *, tenant_id: int, scope: Scope,
              visibility: Visibility | None, memory: NewMemory, author: Author,
              settings: Settings) -> tuple[asyncpg.Record, uuid.UUID, list[JobRef]]:
    """A memory written by a caller: stored now, embedded by a job. Returns the row, the
    operation that embeds it, and the job to enqueue after the commit."""
    await check_type(conn, tenant_id, memory.type)
    row = await insert(conn, tenant_id=tenant_id, scope=scope,
                       visibility=visibility_for(scope, visibility), memory=memory,
                       author=author, rules=await policy.load(conn, tenant_id, settings))
    op, refs = await embed_later(conn, tenant_id, [row["id"]], author, settings)
    refs += await webhooks.emit(conn, tenant_id, "memory.added", webhooks.memory_data(row))
    return row, op, refs


async def embed_later(conn: asyncpg.Connection, tenant_id: int, ids: Sequence[uuid.UUID],
                      author: Author, settings: Settings) -> tuple[uuid.UUID, list[JobRef]]:
    rows = await jobs.create_jobs(
        conn, tenant_id=tenant_id, item_id=None, version=None,
        specs=[JobSpec(jobs.EMBED_MEMORY)], max_attempts=settings.max_attempts_for,
        payload={"memories": [str(i) for i in ids]})
    op = await operations.create(conn, tenant_id=tenant_id, kind="embed", job_id=rows[0]["id"],
                                 key_id=author.key_id)
    return op, jobs.refs_to_enqueue(rows)


async def write_history(conn: asyncpg.Connection, tenant_id: int, row: asyncpg.Record,
                   operation: str, author: Author, old: str | None, new: str | None,
                   changes: dict[str, Any], reason: str | None) -> None:
    await conn.execute(Q["memories.history_add"], tenant_id, row["id"], row["version"],
                       operation, author.key_id, author.agent_id, author.operation_id, old,
                       new, changes, reason)


async def lock_current(conn: asyncpg.Connection, tenant_id: int, memory_id: uuid.UUID,
                       reader: Scope, expected_version: int | None) -> asyncpg.Record:
    """The memory, locked, if the reader sees it and (when given) its version is the one the
    writer read; a stale version is a 409 naming the current one."""
    row = await conn.fetchrow(Q["memories.lock"], tenant_id, memory_id, reader.user_id,
                              reader.agent_id)
    if row is None:
        raise NotFound(f"no memory {memory_id}")
    if expected_version is not None and row["version"] != expected_version:
        raise StaleVersion(row["version"], expected_version)
    return row


class StaleVersion(Conflict):
    """The memory changed since the writer read it."""

    def __init__(self, current: int, expected: int) -> None:
        super().__init__(f"version {expected} is stale: the memory is at version {current}; "
                         "read it again and send that version")
        self.current = current


def _changed(row: asyncpg.Record, change: Change) -> dict[str, Any]:
    fields = {k: v for k, v in change.__dict__.items() if v is not None}
    if "hints" in fields:
        fields["hints"] = list(fields["hints"])
    return {k: v for k, v in fields.items() if row[k] != v}


async def update(conn: asyncpg.Connection, *, tenant_id: int, memory_id: uuid.UUID,
                 reader: Scope, expected_version: int | None, change: Change, author: Author,
                 settings: Settings, reason: str | None = None,
                 ) -> tuple[asyncpg.Record, uuid.UUID | None, list[JobRef]]:
    row = await lock_current(conn, tenant_id, memory_id, reader, expected_version)
    if change.type is not None:
        await check_type(conn, tenant_id, change.type)
    changed = _changed(row, change)
    if not changed:
        return row, None, []
    digest = content_hash(change.content) if "content" in changed else None
    # A new layer, or pinning, moves the expiry: from when the memory was written.
    lifetime = None
    if "layer" in changed or "pinned" in changed:
        rules = await policy.load(conn, tenant_id, settings)
        lifetime = _days(rules.lifetime(changed.get("layer", row["layer"])),
                         changed.get("pinned", row["pinned"]))
    new = await conn.fetchrow(
        Q["memories.update"], tenant_id, memory_id, changed.get("content"), changed.get("type"),
        changed.get("confidence"), changed.get("source"), changed.get("metadata"),
        changed.get("hints"), changed.get("pinned"), changed.get("observed_at"), digest,
        changed.get("layer"), "layer" in changed or "pinned" in changed, lifetime)
    assert new is not None
    shown = {k: _json_safe(v) for k, v in changed.items() if k != "content"}
    await write_history(conn, tenant_id, new, "update", author, row["content"], new["content"],
                   shown, reason)
    notices = await webhooks.emit(conn, tenant_id, "memory.updated",
                                  webhooks.memory_data(new, changed=sorted(changed)))
    if digest is None:
        return new, None, notices
    op, refs = await embed_later(conn, tenant_id, [memory_id], author, settings)
    return new, op, refs + notices


def _days(lifetime: timedelta | None, pinned: bool) -> float | None:
    return None if lifetime is None or pinned else lifetime.total_seconds() / 86400


def _json_safe(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


async def invalidate(conn: asyncpg.Connection, *, tenant_id: int, memory_id: uuid.UUID,
                     reader: Scope, expected_version: int | None, reason: str,
                     author: Author, valid_until: datetime | None = None,
                     superseded_by: uuid.UUID | None = None) -> asyncpg.Record:
    """Soft invalidation: the memory stays, with its history, and searches that ask for
    valid memories (the default) stop returning it from `valid_until` on."""
    row = await lock_current(conn, tenant_id, memory_id, reader, expected_version)
    new = await conn.fetchrow(Q["memories.invalidate"], tenant_id, memory_id, valid_until,
                              reason, superseded_by)
    assert new is not None
    operation = "supersede" if superseded_by else "invalidate"
    if superseded_by is not None:
        await conn.execute(Q["relations.insert"], tenant_id, superseded_by, "supersedes",
                           memory_id, None, author.operation_id)
    changes = {"valid_until": new["valid_until"].isoformat()}
    if superseded_by:
        changes["superseded_by"] = str(superseded_by)
    await write_history(conn, tenant_id, new, operation, author, row["content"], row["content"],
                   changes, reason)
    if superseded_by is None:
        # A superseding one is announced by its caller, who holds the new memory too (the
        # extraction). No caller enqueues these: the next sweep does.
        await webhooks.emit(conn, tenant_id, "memory.updated", webhooks.memory_data(
            new, changed=["valid_until"], reason=reason))
    return new


async def delete(conn: asyncpg.Connection, *, tenant_id: int, memory_id: uuid.UUID,
                 reader: Scope, expected_version: int | None) -> list[JobRef]:
    """Removes the memory with its history, vector and text index entries; returns the
    webhook jobs announcing it, to enqueue after the commit."""
    row = await lock_current(conn, tenant_id, memory_id, reader, expected_version)
    await conn.execute(Q["memories.delete_one"], tenant_id, memory_id)
    return await webhooks.emit(conn, tenant_id, "memory.deleted", {
        "memory_ids": [memory_id], "user_id": row["user_id"], "agent_id": row["agent_id"],
        "session_id": row["session_id"]})


async def register_type(pool: asyncpg.Pool, tenant_id: int, name: str,
                        description: str | None) -> asyncpg.Record:
    if not TYPE_NAME.fullmatch(name) or len(name) > MAX_TYPE_CHARS:
        raise BadInput(f"name: a memory type is lowercase letters, digits and _, starting with a "
                       f"letter, at most {MAX_TYPE_CHARS} characters")
    if name in BUILTIN_TYPES:
        raise BadInput(f"name: {name!r} is a built-in type already")
    return await pool.fetchrow(Q["memories.register_type"], tenant_id, name, description)
