"""Sessions and their events: write a batch (202 in milliseconds), read the timeline a page at
a time, a trace's span tree, delete a session, extract it now; and operations."""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Path, Query

from api.binding import Reader
from api.deps import CurrentPrincipal, PoolDep, QueueDep, SettingsDep
from api.memory_schemas import (
    EventPublic,
    EventsAccepted,
    EventsPage,
    EventsWrite,
    ExtractRequest,
    OperationAccepted,
    OperationPublic,
    ScopeId,
    SessionDeleted,
    SessionIdText,
    SessionPublic,
    SessionsPage,
    SpanNode,
    TraceTree,
    WaitSeconds,
)
from api.routes.memories import WaitQuery, accepted, cursor_time, scope_of
from api.schemas import QueryTime, SafeStr
from pipeline import jobs, quotas
from pipeline.db import Q
from pipeline.errors import BadInput, NotFound
from pipeline.memory import events, extraction_schedule, operations
from pipeline.memory.scopes import Scope, can_read

router = APIRouter(tags=["sessions"])
SessionId = Annotated[SessionIdText, Path(
    description="The caller's session id, unique per tenant (no `/`).")]


def _event(row: Any) -> EventPublic:
    fields = {k: row[k] for k in EventPublic.model_fields if k != "embedded"}
    return EventPublic(**fields, embedded=row["embedding"] is not None)


def _session(row: Any, *, detail: bool = False) -> SessionPublic:
    fields = {k: row[k] for k in SessionPublic.model_fields if k != "embedded"}
    return SessionPublic(**fields, embedded=row["unembedded"] == 0 if detail else None)


def _encode(*parts: object) -> str:
    return base64.urlsafe_b64encode("|".join(str(p) for p in parts).encode()).decode()


def _decode(cursor: str, count: int) -> list[str]:
    try:
        parts = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
    except ValueError:
        parts = []
    if len(parts) != count:
        raise BadInput("cursor: not a cursor this API gave out")
    return parts


async def _visible_session(pool: Any, tenant_id: int, session_id: str, reader: Scope) -> Any:
    row = await pool.fetchrow(Q["events.get_session"], tenant_id, session_id, reader.user_id,
                              reader.agent_id)
    if row is None:
        raise NotFound(f"no session {session_id!r}")
    return row


@router.post("/v1/sessions/{session_id}/events", status_code=202, response_model=EventsAccepted)
async def write_events(
    session_id: SessionId, body: EventsWrite, principal: CurrentPrincipal, pool: PoolDep,
    queue: QueueDep, settings: SettingsDep, background: BackgroundTasks,
    wait: Annotated[WaitSeconds | None, Query(description=(
        "Seconds to wait for the events' embedding (searchable from then on) before answering."
    ))] = None,
) -> EventsAccepted:
    """Store up to 500 events of a session at once (a repeated `event_id` is not stored twice)
    and queue their indexing (vectors and term weights: searchable once it ran) and, once the
    session is quiet, its extraction. The session is
    created by its first write, with that write's scope; later writes must carry the same."""
    now = datetime.now(UTC)
    batch = [events.NewEvent(
        event_id=e.event_id, role=e.role, content=e.content, created_at=e.created_at or now,
        type=e.type, sender_id=e.sender_id, sender_name=e.sender_name,
        media_item_id=e.media_item_id, trace_id=e.trace_id, span_id=e.span_id,
        parent_span_id=e.parent_span_id, metadata=e.metadata, ending=e.ending)
        for e in body.events]
    # At most two jobs: the events' embedding and the session's extraction.
    await quotas.check(pool, principal.tenant_id, bytes=sum(len(e.content.encode()) for e in batch),
                       jobs=2, settings=settings)
    async with pool.acquire() as conn, conn.transaction():
        written = await events.write(conn, tenant_id=principal.tenant_id,
                                     key_id=principal.key_id, session_id=session_id,
                                     scope=scope_of(principal, body.scope), events=batch,
                                     settings=settings)
    op = None
    if not wait:
        # The jobs are in the ledger already: putting them on the queue after the response
        # keeps two Redis and Postgres round trips out of the write's latency, and a failure
        # there loses nothing (the sweeper enqueues what Redis never got).
        background.add_task(jobs.enqueue, pool, queue, written.refs,
                            queue_name=settings.queue_name)
    else:
        await jobs.enqueue(pool, queue, written.refs, queue_name=settings.queue_name)
    if wait and written.operation_id:
        found = await operations.wait(pool, principal.tenant_id, written.operation_id, wait)
        op = OperationPublic(**found) if found else None
    return EventsAccepted(session_id=session_id, stored=written.stored,
                          duplicates=written.duplicates, operation_id=written.operation_id,
                          extraction_operation_id=written.extraction_operation_id,
                          operation=op)


@router.get("/v1/sessions", response_model=SessionsPage)
async def list_sessions(
    principal: CurrentPrincipal, pool: PoolDep, reader: Reader,
    cursor: Annotated[SafeStr | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> SessionsPage:
    """Sessions the scope may read, most recently written first."""
    before_at, before_id = None, None
    if cursor:
        at, before_id = _decode(cursor, 2)
        before_at = cursor_time(at)
    rows = await pool.fetch(Q["events.list_sessions"], principal.tenant_id, reader.user_id,
                            reader.agent_id,
                            before_at, before_id, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return SessionsPage(data=[_session(r) for r in rows],
                        next_cursor=_encode(rows[-1]["last_write_at"].isoformat(),
                                            rows[-1]["id"]) if more else None)


@router.get("/v1/sessions/{session_id}", response_model=SessionPublic)
async def get_session(session_id: SessionId, principal: CurrentPrincipal, pool: PoolDep,
                      reader: Reader) -> SessionPublic:
    """A session, with whether all its events are embedded yet."""
    row = await _visible_session(pool, principal.tenant_id, session_id, reader)
    return _session(row, detail=True)


@router.get("/v1/sessions/{session_id}/events", response_model=EventsPage)
async def session_events(
    session_id: SessionId, principal: CurrentPrincipal, pool: PoolDep, reader: Reader,
    since: QueryTime | None = None,
    cursor: Annotated[SafeStr | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventsPage:
    """The session's events in order (by their timestamps), from `since`, a page at a time."""
    await _visible_session(pool, principal.tenant_id, session_id, reader)
    after_at, after_seq = None, None
    if cursor:
        at, seq = _decode(cursor, 2)
        if not re.fullmatch(r"[0-9]{1,18}", seq):
            raise BadInput("cursor: not a cursor this API gave out")
        after_at, after_seq = cursor_time(at), int(seq)
    rows = await pool.fetch(Q["events.page"], principal.tenant_id, session_id, since, after_at,
                            after_seq, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return EventsPage(data=[_event(r) for r in rows],
                      next_cursor=_encode(rows[-1]["created_at"].isoformat(), rows[-1]["seq"])
                      if more else None)


@router.delete("/v1/sessions/{session_id}", response_model=SessionDeleted)
async def delete_session(session_id: SessionId, principal: CurrentPrincipal, pool: PoolDep,
                         reader: Reader) -> SessionDeleted:
    """Delete a session with its events, their vectors and text index entries. Memories
    extracted from it stay (they are the user's now); delete those by scope with
    `session_id`."""
    deleted = await pool.fetchval(Q["events.delete_session"], principal.tenant_id, session_id,
                                  reader.user_id, reader.agent_id)
    if deleted is None:
        raise NotFound(f"no session {session_id!r}")
    return SessionDeleted(session_id=session_id, deleted_events=deleted)


@router.post("/v1/sessions/{session_id}/extract", status_code=202,
             response_model=OperationAccepted)
async def extract_now(session_id: SessionId, body: ExtractRequest, principal: CurrentPrincipal,
                      pool: PoolDep, queue: QueueDep, settings: SettingsDep,
                      wait: WaitQuery = None) -> OperationAccepted:
    """Extract memories from the session's unread events now, without waiting for it to go
    quiet. A waiting extraction is replaced, never doubled."""
    reader = scope_of(principal, body.scope)
    await quotas.check(pool, principal.tenant_id, jobs=1, settings=settings)
    async with pool.acquire() as conn, conn.transaction():
        row = await _visible_session(conn, principal.tenant_id, session_id, reader)
        scheduled = await extraction_schedule.schedule(
            conn, tenant_id=principal.tenant_id, key_id=principal.key_id, session_id=session_id,
            scope={"user_id": row["user_id"], "agent_id": row["agent_id"],
                   "visibility": row["visibility"]}, now=True, settings=settings)
    await jobs.enqueue(pool, queue, scheduled.refs, queue_name=settings.queue_name)
    return await accepted(pool, principal.tenant_id, scheduled.operation_id, wait)


def _span_tree(rows: Sequence[Any]) -> list[SpanNode]:
    nodes: dict[str | None, SpanNode] = {}
    for row in rows:
        span = row["span_id"]
        node = nodes.get(span)
        if node is None:
            node = nodes[span] = SpanNode(span_id=span, parent_span_id=row["parent_span_id"],
                                          events=[], children=[])
        node.events.append(_event(row))
    roots = []
    for node in nodes.values():
        parent = nodes.get(node.parent_span_id) if node.parent_span_id else None
        if parent is not None and parent is not node:
            parent.children.append(node)
        else:
            roots.append(node)
    return roots


@router.get("/v1/traces/{trace_id}", response_model=TraceTree)
async def trace(trace_id: Annotated[ScopeId, Path()], principal: CurrentPrincipal,
                pool: PoolDep, reader: Reader) -> TraceTree:
    """The events of a trace as a tree of spans (a span whose parent is not in the trace is a
    root), each span's events in order."""
    rows = await pool.fetch(Q["events.trace"], principal.tenant_id, trace_id, reader.user_id,
                           reader.agent_id)
    if not rows:
        raise NotFound(f"no trace {trace_id!r}")
    return TraceTree(trace_id=trace_id, spans=_span_tree(rows))


@router.get("/v1/operations/{operation_id}", response_model=OperationPublic)
async def get_operation(
    operation_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep, reader: Reader,
    wait: Annotated[WaitSeconds | None, Query(description=(
        "Seconds to wait for the operation to finish before answering."))] = None,
) -> OperationPublic:
    """An operation: its state, its result, and for an extraction each decision with its
    reason, similarity, old and new text and source events."""
    op = await (operations.wait(pool, principal.tenant_id, operation_id, wait) if wait
                else operations.get(pool, principal.tenant_id, operation_id))
    scope = op["scope"] if op else None
    if op is None or (scope.get("visibility") and not can_read(
            scope["visibility"], scope.get("user_id"), scope.get("agent_id"),
            reader)):
        raise NotFound(f"no operation {operation_id}")
    return OperationPublic(**op)
