"""Sessions of events: the timeline of what was said. A write stores its events at once (they
are full-text searchable when the call returns), and leaves their embedding to a job and their
extraction to another that runs when the session goes quiet; the caller gets operation ids to
follow both."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import Conflict
from pipeline.items import content_hash
from pipeline.jobs import JobRef
from pipeline.memory import extraction_schedule
from pipeline.memory.indexing import CONTEXT_TURNS, Neighbour, event_texts
from pipeline.memory.scopes import Scope, visibility_for
from pipeline.settings import Settings

MAX_EVENTS_PER_CALL = 500


@dataclass(frozen=True)
class NewEvent:
    event_id: str
    role: str
    content: str
    created_at: datetime
    type: str = "TEXT"
    sender_id: str | None = None
    sender_name: str | None = None
    media_item_id: str | None = None
    trace_id: str | None = None
    span_id: str | None = None
    parent_span_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    ending: bool = False


@dataclass
class Written:
    stored: int
    duplicates: int
    operation_id: uuid.UUID | None
    extraction_operation_id: uuid.UUID | None
    refs: list[JobRef]


async def write(conn: asyncpg.Connection, *, tenant_id: int, key_id: int | None,
                session_id: str, scope: Scope, events: Sequence[NewEvent],
                settings: Settings) -> Written:
    """Store a batch of events in the caller's transaction, with the jobs that embed them and
    extract the session. An event id already stored in the session is skipped, so a client
    may resend a batch it is unsure about. Enqueue the returned refs after the commit."""
    visibility = visibility_for(scope, None)
    session = await conn.fetchrow(Q["events.upsert_session"], tenant_id, session_id,
                                  scope.user_id, scope.agent_id, visibility)
    assert session is not None
    if (session["user_id"], session["agent_id"]) != (scope.user_id, scope.agent_id):
        raise Conflict(f"session {session_id!r} belongs to another scope: write it with the "
                       "user_id and agent_id it was created with, or use another session id")
    ordered = sorted(events, key=lambda e: e.created_at)
    earlier = [] if session["created"] else [
        Neighbour(r["sender_name"], r["role"], r["content"], r["created_at"])
        for r in reversed(await conn.fetch(Q["events.latest"], tenant_id, session_id,
                                           CONTEXT_TURNS))]
    columns: list[list[Any]] = [[] for _ in range(15)]
    for event in ordered:
        search_text, embed_text = event_texts(event.sender_name, event.role, event.content,
                                              event.created_at, earlier[-CONTEXT_TURNS:])
        earlier.append(Neighbour(event.sender_name, event.role, event.content,
                                 event.created_at))
        values = (event.event_id, event.role, event.sender_id, event.sender_name, event.type,
                  event.content, event.media_item_id, event.created_at, event.trace_id,
                  event.span_id, event.parent_span_id, event.metadata, search_text, embed_text,
                  content_hash(embed_text))
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    ending = any(e.ending for e in events)
    inserted = await conn.fetch(Q["events.insert_many"], tenant_id, session_id, scope.user_id,
                                scope.agent_id, visibility, *columns, ordered[0].created_at,
                                ordered[-1].created_at, ending)
    refs: list[JobRef] = []
    operation_id = None
    if inserted:
        job_id = uuid.uuid4()
        operation_id = await conn.fetchval(
            Q["events.embed_job"], job_id, tenant_id,
            settings.max_attempts_for(jobs.EMBED_MEMORY),
            {"events": [r["seq"] for r in inserted]}, session_id,
            {**scope.as_dict(), "visibility": visibility}, key_id)
        refs.append(JobRef(job_id, jobs.EMBED_MEMORY, tenant_id=tenant_id))
    extraction = None
    if inserted or ending:
        extraction = await extraction_schedule.schedule(
            conn, tenant_id=tenant_id, key_id=key_id, session_id=session_id,
            scope={**scope.as_dict(), "visibility": visibility},
            now=ending, settings=settings)
        refs += extraction.refs
    return Written(stored=len(inserted), duplicates=len(events) - len(inserted),
                   operation_id=operation_id,
                   extraction_operation_id=extraction.operation_id if extraction else None,
                   refs=refs)
