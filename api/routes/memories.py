"""Memories: write, read, change with a version check, invalidate, delete (one, or by scope
as a job), history, search, and the tenant's memory types."""

from __future__ import annotations

import base64
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Header, Query, Response

from api.binding import Reader, acting_as
from api.deps import (
    CurrentPrincipal,
    PoolDep,
    QueryCacheDep,
    QueueDep,
    SearchPoolDep,
    SettingsDep,
)
from api.memory_schemas import (
    MAX_METADATA_BYTES,
    HistoryEntry,
    Layer,
    MemoriesPage,
    MemoryCreate,
    MemoryHistory,
    MemoryInvalidate,
    MemoryPublic,
    MemoryTypeCreate,
    MemoryTypePublic,
    MemoryTypes,
    MemoryUpdate,
    MemoryWritten,
    OperationAccepted,
    OperationPublic,
    RecallResults,
    RecallSearch,
    ScopedDelete,
    ScopeIn,
    WaitSeconds,
    metadata_filter,
)
from api.schemas import SafeStr
from pipeline import jobs, quotas
from pipeline.db import Q
from pipeline.errors import BadInput, NotFound
from pipeline.jobs import JobSpec
from pipeline.memory import memories, operations, recall, relations
from pipeline.memory.memories import Author, Change, NewMemory
from pipeline.memory.scopes import Scope
from pipeline.tenants import Principal

router = APIRouter(tags=["memories"])
WaitQuery = Annotated[WaitSeconds | None, Query(description=(
    "Seconds to wait for the operation to finish before answering."))]
IfMatch = Annotated[str | None, Header(alias="If-Match", description=(
    "The version the change was made from, as the ETag of a read gave it (\"3\" or 3)."))]


def scope_of(principal: Principal, body: ScopeIn) -> Scope:
    """A body's scope, as the key's binding allows (api/binding.py)."""
    return acting_as(principal, body.user_id, body.agent_id)


def public(row: Any) -> MemoryPublic:
    fields = {k: row[k] for k in MemoryPublic.model_fields if k != "embedded"}
    return MemoryPublic(**fields, embedded=row["embedding"] is not None)


def author_of(principal: Principal, scope: Scope) -> Author:
    return Author(principal.key_id, scope.agent_id)


def expected(body_version: int | None, if_match: str | None, *, required: bool) -> int | None:
    """The version a change was made from: the body's `expected_version` or If-Match."""
    if if_match is not None:
        text = if_match.strip().removeprefix("W/").strip('"')
        if not re.fullmatch(r"[0-9]{1,9}", text):
            raise BadInput(f"If-Match: {if_match!r} is not a version number (send \"3\")")
        if body_version is not None and int(text) != body_version:
            raise BadInput("If-Match and expected_version name different versions")
        return int(text)
    if body_version is None and required:
        raise BadInput("expected_version: send the version you read (or an If-Match header), "
                       "so that a change made meanwhile is never overwritten")
    return body_version


def _etag(response: Response, row: Any) -> None:
    response.headers["ETag"] = f'"{row["version"]}"'


@router.post("/v1/memories", status_code=201, response_model=MemoryWritten)
async def add_memory(body: MemoryCreate, principal: CurrentPrincipal, pool: PoolDep,
                     queue: QueueDep, settings: SettingsDep, response: Response) -> MemoryWritten:
    """Store a memory now (searchable by its words at once) and queue its embedding."""
    scope = scope_of(principal, body.scope)
    new = NewMemory(
        type=body.type, content=body.content, confidence=body.confidence, source=body.source,
        metadata=body.metadata, hints=tuple(body.hints), pinned=body.pinned,
        observed_at=body.observed_at, session_id=body.session_id,
        source_events=tuple((r.session_id, r.event_id) for r in body.source_events),
        id=body.memory_id, valid_until=body.valid_until, layer=body.layer)
    await quotas.check(pool, principal.tenant_id, memories=1, bytes=len(new.content.encode()),
                       jobs=1, settings=settings)
    async with pool.acquire() as conn, conn.transaction():
        row, op, refs = await memories.add(
            conn, tenant_id=principal.tenant_id, scope=scope, visibility=body.visibility,
            memory=new, author=author_of(principal, scope), settings=settings)
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    _etag(response, row)
    return MemoryWritten(memory=public(row), operation_id=op)


@router.post("/v1/memories/search", response_model=RecallResults)
async def search_memories(body: RecallSearch, principal: CurrentPrincipal, pool: PoolDep,
                          search_pool: SearchPoolDep, queries: QueryCacheDep,
                          settings: SettingsDep, background: BackgroundTasks) -> RecallResults:
    """Hybrid search over the memories the scope may read and, with `include_events`, the
    events of its sessions. Each result says its kind; a memory lists its source events."""
    params = recall.RecallQuery(
        query=body.query, reader=scope_of(principal, body.scope), limit=body.limit,
        offset=body.offset,
        memories=body.include_memories, events=body.include_events, session_id=body.session_id,
        types=body.types, valid_only=body.valid_only, as_of=body.as_of,
        min_confidence=body.min_confidence, after=body.after, before=body.before,
        metadata=body.metadata, include_expired=body.include_expired)
    outcome = await recall.search(search_pool, queries, settings,
                                  tenant_id=principal.tenant_id, params=params)
    hit = [uuid.UUID(r["id"]) for r in outcome.results if r["kind"] == "memory"]
    if body.expand:
        around = await relations.neighbours(search_pool, principal.tenant_id, params.reader, hit)
        for r in outcome.results:
            if r["kind"] == "memory":
                r["related"] = around[uuid.UUID(r["id"])]
    if hit:  # the access counts are written after the response is sent
        background.add_task(pool.execute, Q["memories.touch"], principal.tenant_id, hit)
    return RecallResults(results=outcome.results, mode=outcome.mode, warnings=outcome.warnings,
                         timings_ms=outcome.timings_ms)


def cursor_of(row: Any) -> str:
    text = f"{row['created_at'].isoformat()}|{row['id']}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def cursor_time(text: str) -> datetime:
    """A time read back from a cursor: one this API wrote, or a 422 (never a time the
    database cannot take)."""
    try:
        at = datetime.fromisoformat(text)
        if at.tzinfo is None:
            raise ValueError(text)
        at.astimezone(UTC)
    except (ValueError, OverflowError):
        raise BadInput("cursor: not a cursor this API gave out") from None
    return at


def read_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, _, ident = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        return cursor_time(at), uuid.UUID(ident)
    except ValueError:
        raise BadInput("cursor: not a cursor this API gave out") from None


@router.get("/v1/memories", response_model=MemoriesPage)
async def list_memories(
    principal: CurrentPrincipal, pool: PoolDep, reader: Reader,
    type: Annotated[list[SafeStr], Query(max_length=50, description=(
        "Only these types (repeat the parameter for several)."))] = [],  # noqa: B006
    valid_only: bool = True,
    cursor: Annotated[SafeStr | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    metadata: Annotated[SafeStr | None, Query(max_length=MAX_METADATA_BYTES, description=(
        'Only memories whose metadata contains this JSON object (`{"project": "apollo"}`), '
        "as Postgres' jsonb @> does."))] = None,
    include_expired: Annotated[bool, Query(description=(
        "Also memories past their layer's lifetime that the prune has not removed yet."))] = False,
    layer: Annotated[list[Layer], Query(max_length=6, description=(
        "Only these layers (repeat the parameter for several)."))] = [],  # noqa: B006
) -> MemoriesPage:
    """The memories the scope may read, newest first, a page at a time."""
    after = read_cursor(cursor) if cursor else (None, None)
    contains = metadata_filter(metadata) if metadata is not None else None
    rows = await pool.fetch(Q["memories.list"], principal.tenant_id, reader.user_id,
                            reader.agent_id,
                            type or None,
                            valid_only, after[0], after[1], limit + 1, contains,
                            include_expired, layer or None)
    more = len(rows) > limit
    rows = rows[:limit]
    return MemoriesPage(data=[public(r) for r in rows],
                        next_cursor=cursor_of(rows[-1]) if more else None)


@router.get("/v1/memories/{memory_id}", response_model=MemoryPublic)
async def get_memory(memory_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep,
                     response: Response, reader: Reader) -> MemoryPublic:
    """One memory, if the scope (`user_id`, `agent_id`) may read it. The ETag is its version."""
    row = await pool.fetchrow(Q["memories.get"], principal.tenant_id, memory_id,
                              reader.user_id, reader.agent_id)
    if row is None:
        raise NotFound(f"no memory {memory_id}")
    _etag(response, row)
    return public(row)


@router.patch("/v1/memories/{memory_id}", response_model=MemoryWritten)
async def update_memory(memory_id: uuid.UUID, body: MemoryUpdate, principal: CurrentPrincipal,
                        pool: PoolDep, queue: QueueDep, settings: SettingsDep,
                        response: Response, if_match: IfMatch = None) -> MemoryWritten:
    """Change a memory's fields (never its scope), from the version the writer read: a stale
    version is a 409 that names the current one."""
    version = expected(body.expected_version, if_match, required=True)
    scope = scope_of(principal, body.scope)
    change = Change(content=body.content, type=body.type, confidence=body.confidence,
                    source=body.source, metadata=body.metadata,
                    hints=tuple(body.hints) if body.hints is not None else None,
                    pinned=body.pinned, observed_at=body.observed_at, layer=body.layer)
    if body.content is not None:  # new content: its bytes, and a job to embed it
        await quotas.check(pool, principal.tenant_id, bytes=len(body.content.encode()), jobs=1,
                           settings=settings)
    async with pool.acquire() as conn, conn.transaction():
        row, op, refs = await memories.update(
            conn, tenant_id=principal.tenant_id, memory_id=memory_id, reader=scope,
            expected_version=version, change=change, author=author_of(principal, scope),
            settings=settings)
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    _etag(response, row)
    return MemoryWritten(memory=public(row), operation_id=op)


@router.post("/v1/memories/{memory_id}/invalidate", response_model=MemoryPublic)
async def invalidate_memory(memory_id: uuid.UUID, body: MemoryInvalidate,
                            principal: CurrentPrincipal, pool: PoolDep, response: Response,
                            if_match: IfMatch = None) -> MemoryPublic:
    """Mark a memory no longer valid (from `valid_until`, default now), with a reason. It
    stays, with its history; searches for valid memories (the default) leave it out."""
    version = expected(body.expected_version, if_match, required=False)
    scope = scope_of(principal, body.scope)
    async with pool.acquire() as conn, conn.transaction():
        row = await memories.invalidate(
            conn, tenant_id=principal.tenant_id, memory_id=memory_id, reader=scope,
            expected_version=version, reason=body.reason, author=author_of(principal, scope),
            valid_until=body.valid_until)
    _etag(response, row)
    return public(row)


@router.delete("/v1/memories/{memory_id}", status_code=204, response_class=Response)
async def delete_memory(memory_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep,
                        reader: Reader, if_match: IfMatch = None) -> Response:
    """Delete a memory with its history, vector and text index entries."""
    version = expected(None, if_match, required=False)
    async with pool.acquire() as conn, conn.transaction():
        await memories.delete(conn, tenant_id=principal.tenant_id, memory_id=memory_id,
                              reader=reader, expected_version=version)
    return Response(status_code=204)


@router.get("/v1/memories/{memory_id}/history", response_model=MemoryHistory)
async def memory_history(memory_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep,
                         reader: Reader) -> MemoryHistory:
    """Every change of the memory: who (key and agent), which operation, old and new content."""
    if await pool.fetchrow(Q["memories.get"], principal.tenant_id, memory_id, reader.user_id,
                           reader.agent_id) is None:
        raise NotFound(f"no memory {memory_id}")
    rows = await pool.fetch(Q["memories.history"], principal.tenant_id, memory_id)
    return MemoryHistory(memory_id=memory_id, history=[HistoryEntry(**dict(r)) for r in rows])


@router.post("/v1/memories/delete", status_code=202, response_model=OperationAccepted)
async def delete_by_scope(body: ScopedDelete, principal: CurrentPrincipal, pool: PoolDep,
                          queue: QueueDep, settings: SettingsDep,
                          wait: WaitQuery = None) -> OperationAccepted:
    """Delete every memory of a scope (a non-empty one: an empty scope is refused) as a job,
    a batch per transaction, then count again; the operation reports the counts."""
    bound = acting_as(principal, body.scope.user_id, body.scope.agent_id)
    scope = {**body.scope.model_dump(exclude_none=True), **bound.as_dict()}
    async with pool.acquire() as conn, conn.transaction():
        rows = await jobs.create_jobs(
            conn, tenant_id=principal.tenant_id, item_id=None, version=None,
            specs=[JobSpec(jobs.FORGET)], max_attempts=settings.max_attempts_for,
            payload={"scope": scope})
        op = await operations.create(conn, tenant_id=principal.tenant_id, kind="forget",
                                     job_id=rows[0]["id"], key_id=principal.key_id, scope=scope)
    await jobs.enqueue(pool, queue, jobs.refs_to_enqueue(rows), queue_name=settings.queue_name)
    return await accepted(pool, principal.tenant_id, op, wait)


async def accepted(pool: Any, tenant_id: int, operation_id: uuid.UUID,
                   wait: float | None) -> OperationAccepted:
    """The answer of a write that started an operation; with `wait`, once it finished (or the
    wait ran out)."""
    if not wait:
        return OperationAccepted(operation_id=operation_id, status="pending")
    op = await operations.wait(pool, tenant_id, operation_id, wait)
    assert op is not None  # written by this request
    return OperationAccepted(operation_id=operation_id, status=op["status"],
                             operation=OperationPublic(**op))


@router.get("/v1/memory-types", response_model=MemoryTypes)
async def memory_types(principal: CurrentPrincipal, pool: PoolDep) -> MemoryTypes:
    """The built-in memory types and those the tenant registered."""
    rows = await pool.fetch(Q["memories.types"], principal.tenant_id)
    return MemoryTypes(data=[
        *(MemoryTypePublic(name=n, builtin=True) for n in memories.BUILTIN_TYPES),
        *(MemoryTypePublic(name=r["name"], builtin=False, description=r["description"])
          for r in rows)])


@router.post("/v1/memory-types", status_code=201, response_model=MemoryTypePublic)
async def register_memory_type(body: MemoryTypeCreate, principal: CurrentPrincipal,
                               pool: PoolDep) -> MemoryTypePublic:
    """Register a memory type for this tenant (lowercase, digits and _, ≤ 64 characters)."""
    row = await memories.register_type(pool, principal.tenant_id, body.name, body.description)
    return MemoryTypePublic(name=row["name"], builtin=False, description=row["description"])
