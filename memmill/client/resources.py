"""Every operation of the API, once, as a `Call` builder (see `memmill.client.calls`).

Answers are read into the API's own response models, so a client always agrees with the
server it ships with. Arguments are keyword-only past the first one or two; an argument left
as None is not sent, so the server's default applies. Scoped reads and writes of agent memory
take `user_id` and `agent_id` (a key bound to a user or an agent supplies its own).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar
from uuid import UUID

from pydantic import BaseModel, TypeAdapter

from api.admin_schemas import (
    AuditPage,
    KeyMade,
    KeyPublic,
    KeyRotated,
    KeysPage,
    TenantDeleting,
    TenantMade,
    TenantPublic,
    TenantsPage,
)
from api.memory_schemas import (
    ContextResponse,
    EventPublic,
    EventsAccepted,
    EventsPage,
    MemoriesPage,
    MemoryHistory,
    MemoryPublic,
    MemoryTypePublic,
    MemoryTypes,
    MemoryWritten,
    OperationAccepted,
    OperationPublic,
    RecallResults,
    SessionDeleted,
    SessionPublic,
    SessionsPage,
    TraceTree,
)
from api.schemas import (
    BatchResult,
    DeadLetterPublic,
    DeadLettersPublic,
    ItemAccepted,
    ItemDeleted,
    ItemPublic,
    ItemStates,
    ItemVersionPublic,
    JobPublic,
    JobsPublic,
    JobStats,
    QueueChanged,
    QueuesPublic,
    Replayed,
    SearchResponse,
)
from api.usage_schemas import TenantLimitsPublic, UsagePublic
from memmill.client.calls import (
    Call,
    Mode,
    PageCall,
    Resource,
    Wait,
    cursor_pages,
    endpoint,
    offset_pages,
    pages,
    segment,
)

M = TypeVar("M", bound=BaseModel)
# How long a `wait=True` waits, unless the caller gives seconds instead of True.
DEFAULT_WAIT_S = 120.0


def model(cls: type[M]) -> Any:
    return cls.model_validate


def nothing(_: Any) -> None:
    return None


def fields(**values: Any) -> dict[str, Any]:
    """A request body of the values that are set."""
    return {k: v for k, v in values.items() if v is not None}


def scope_of(user_id: str | None, agent_id: str | None) -> dict[str, str]:
    return fields(user_id=user_id, agent_id=agent_id)


def wait_s(wait: bool | float) -> float | None:
    if wait is True:
        return DEFAULT_WAIT_S
    return float(wait) if wait else None


def if_match(version: int | None) -> dict[str, str] | None:
    return None if version is None else {"If-Match": f'"{version}"'}


def iso(at: datetime | str | None) -> str | None:
    return at.isoformat() if isinstance(at, datetime) else at


def contains(metadata: Mapping[str, Any] | None) -> str | None:
    """A metadata filter as the `metadata` query parameter takes it: JSON text."""
    return None if metadata is None else json.dumps(dict(metadata))


class Items(Resource[Mode]):
    """Documents, files, notes and URLs, and their versions."""

    @endpoint
    def put(self, item_id: str, content: str | None = None, *, uri: str | None = None,
            title: str | None = None, tags: Mapping[str, str] | None = None,
            wait: bool | float = False) -> Call[ItemAccepted]:
        """Store text (`content`) or a URL to fetch (`uri`) under `item_id`; a new version if
        the content changed. `wait`: until it is ready (True, or seconds), raising
        `OperationFailed` if it failed."""
        timeout = wait_s(wait)
        return Call("POST", "/v1/items", model(ItemAccepted),
                    json=fields(id=item_id, content=content, uri=uri, title=title,
                                tags=dict(tags) if tags else None),
                    wait=Wait(timeout, item_ids=lambda r: [r.item.id]) if timeout else None)

    @endpoint
    def batch(self, entries: Sequence[Mapping[str, Any]], *,
              wait: bool | float = False) -> Call[BatchResult]:
        """Up to 1000 items as `put` takes them (`{"id", "content" or "uri", "title"?,
        "tags"?}`), each accepted or refused on its own. `wait`: until every accepted one
        finished, ready or failed (see `lookup`)."""
        timeout = wait_s(wait)
        return Call("POST", "/v1/items/batch", model(BatchResult), json={"items": list(entries)},
                    wait=Wait(timeout, item_ids=lambda r: [a.id for a in r.accepted],
                              raise_on_failure=False) if timeout else None)

    @endpoint
    def upload(self, files: Sequence[tuple[str, bytes]], *, prefix: str | None = None,
               tags: Mapping[str, str] | None = None,
               wait: bool | float = False) -> Call[BatchResult]:
        """Files as (item id, bytes), the id sent as each part's file name; their type is
        found from their bytes."""
        import json

        data = fields(prefix=prefix, tags=json.dumps(dict(tags)) if tags else None)
        parts = [("file", (name, content, "application/octet-stream")) for name, content in files]
        timeout = wait_s(wait)
        return Call("POST", "/v1/items/upload", model(BatchResult), files=parts, data=data or None,
                    wait=Wait(timeout, item_ids=lambda r: [a.id for a in r.accepted],
                              raise_on_failure=False) if timeout else None)

    @endpoint
    def get(self, item_id: str, *, version: int = 0) -> Call[ItemPublic]:
        """The item with its status, summary and jobs; `version` 1 the previous one, and so on."""
        return Call("GET", f"/v1/items/{segment(item_id)}", model(ItemPublic),
                    params={"version": version or None})

    @endpoint
    def versions(self, item_id: str) -> Call[list[ItemVersionPublic]]:
        return Call("GET", f"/v1/item-versions/{segment(item_id)}",
                    TypeAdapter(list[ItemVersionPublic]).validate_python)

    @endpoint
    def delete(self, item_id: str, *, purge: bool = False) -> Call[ItemDeleted]:
        """Revert to the previous version, or delete the item when it has none; `purge`
        deletes every version."""
        return Call("DELETE", f"/v1/items/{segment(item_id)}", model(ItemDeleted),
                    params={"purge": purge or None})

    @endpoint
    def lookup(self, item_ids: Sequence[str]) -> Call[ItemStates]:
        """Version, content hash, status and error of up to 1000 items, and those missing."""
        return Call("POST", "/v1/items/lookup", model(ItemStates), json={"ids": list(item_ids)})


class Memories(Resource[Mode]):
    """An agent's memories, in scopes of user, agent and visibility."""

    @endpoint
    def add(self, content: str, *, user_id: str | None = None, agent_id: str | None = None,
            type: str = "fact", visibility: Literal["private", "user", "tenant"] | None = None,
            confidence: float | None = None, source: str | None = None,
            metadata: Mapping[str, Any] | None = None, hints: Sequence[str] | None = None,
            pinned: bool | None = None, observed_at: datetime | str | None = None,
            valid_until: datetime | str | None = None, session_id: str | None = None,
            memory_id: UUID | str | None = None,
            wait: bool | float = False) -> Call[MemoryWritten]:
        """Write a memory (a `fact` unless `type` names another built-in or registered type);
        searchable by its words at once, by meaning once embedded (`wait` for that: True, or
        seconds). `memory_id` makes the write safe to send again: an id the tenant holds
        already is a `Conflict`. `valid_until`: reads of valid memories leave it out from then."""
        timeout = wait_s(wait)
        return Call("POST", "/v1/memories", model(MemoryWritten),
                    json=fields(memory_id=str(memory_id) if memory_id is not None else None,
                                content=content, scope=scope_of(user_id, agent_id), type=type,
                                visibility=visibility, confidence=confidence, source=source,
                                metadata=dict(metadata) if metadata is not None else None,
                                hints=list(hints) if hints is not None else None, pinned=pinned,
                                observed_at=iso(observed_at), valid_until=iso(valid_until),
                                session_id=session_id),
                    wait=Wait(timeout, operation_ids=lambda r: [str(r.operation_id)],
                              scope=scope_of(user_id, agent_id)) if timeout else None)

    @endpoint
    def get(self, memory_id: str, *, user_id: str | None = None,
            agent_id: str | None = None) -> Call[MemoryPublic]:
        return Call("GET", f"/v1/memories/{segment(memory_id)}", model(MemoryPublic),
                    params=scope_of(user_id, agent_id))

    @endpoint
    def list(self, *, user_id: str | None = None, agent_id: str | None = None,
             type: str | None = None, valid_only: bool | None = None, limit: int | None = None,
             cursor: str | None = None,
             metadata: Mapping[str, Any] | None = None) -> Call[MemoriesPage]:
        """One page of the memories the scope sees; `next_cursor` asks for the next.
        `metadata`: only those whose metadata contains it (jsonb @>)."""
        return Call("GET", "/v1/memories", model(MemoriesPage),
                    params=fields(user_id=user_id, agent_id=agent_id, type=type,
                                  valid_only=valid_only, limit=limit, cursor=cursor,
                                  metadata=contains(metadata)))

    @pages
    def iterate(self, *, user_id: str | None = None, agent_id: str | None = None,
                type: str | None = None, valid_only: bool | None = None,
                metadata: Mapping[str, Any] | None = None,
                page_size: int = 100) -> PageCall[MemoryPublic]:
        """Every memory the scope sees, a page at a time."""
        first = Call("GET", "/v1/memories", model(MemoriesPage),
                     params=fields(user_id=user_id, agent_id=agent_id, type=type,
                                   valid_only=valid_only, limit=page_size,
                                   metadata=contains(metadata)))
        return PageCall(first, lambda page: page.data, cursor_pages)

    @endpoint
    def update(self, memory_id: str, *, expected_version: int, user_id: str | None = None,
               agent_id: str | None = None, content: str | None = None, type: str | None = None,
               confidence: float | None = None, source: str | None = None,
               metadata: Mapping[str, Any] | None = None, hints: Sequence[str] | None = None,
               pinned: bool | None = None, observed_at: datetime | str | None = None,
               wait: bool | float = False) -> Call[MemoryWritten]:
        """Change a memory if it is still at `expected_version` (else `Conflict`, naming the
        current one)."""
        timeout = wait_s(wait)
        return Call("PATCH", f"/v1/memories/{segment(memory_id)}", model(MemoryWritten),
                    json=fields(scope=scope_of(user_id, agent_id),
                                expected_version=expected_version, content=content, type=type,
                                confidence=confidence, source=source,
                                metadata=dict(metadata) if metadata is not None else None,
                                hints=list(hints) if hints is not None else None, pinned=pinned,
                                observed_at=iso(observed_at)),
                    wait=Wait(timeout, operation_ids=lambda r: [str(r.operation_id)]
                              if r.operation_id else [],
                              scope=scope_of(user_id, agent_id)) if timeout else None)

    @endpoint
    def invalidate(self, memory_id: str, *, reason: str | None = None,
                   user_id: str | None = None, agent_id: str | None = None,
                   expected_version: int | None = None,
                   valid_until: datetime | str | None = None) -> Call[MemoryPublic]:
        """Mark a memory no longer valid (kept, with its history, and out of default reads),
        from `valid_until` (default now: a fact can be known to have ended earlier)."""
        return Call("POST", f"/v1/memories/{segment(memory_id)}/invalidate", model(MemoryPublic),
                    json=fields(scope=scope_of(user_id, agent_id), reason=reason,
                                valid_until=iso(valid_until)),
                    headers=if_match(expected_version))

    @endpoint
    def delete(self, memory_id: str, *, user_id: str | None = None, agent_id: str | None = None,
               expected_version: int | None = None) -> Call[None]:
        """Delete a memory; with `expected_version`, only if it is still that version."""
        return Call("DELETE", f"/v1/memories/{segment(memory_id)}", nothing,
                    params=scope_of(user_id, agent_id), headers=if_match(expected_version))

    @endpoint
    def history(self, memory_id: str, *, user_id: str | None = None,
                agent_id: str | None = None) -> Call[MemoryHistory]:
        return Call("GET", f"/v1/memories/{segment(memory_id)}/history", model(MemoryHistory),
                    params=scope_of(user_id, agent_id))

    @endpoint
    def search(self, query: str, *, user_id: str | None = None, agent_id: str | None = None,
               limit: int | None = None, offset: int | None = None,
               include_events: bool | None = None, include_memories: bool | None = None,
               session_id: str | None = None, types: Sequence[str] | None = None,
               valid_only: bool | None = None, as_of: str | None = None,
               min_confidence: float | None = None, after: str | None = None,
               before: str | None = None,
               metadata: Mapping[str, Any] | None = None) -> Call[RecallResults]:
        """Hybrid search over the scope's memories (and, with `include_events`, its events);
        `metadata`: only rows whose metadata contains it (jsonb @>)."""
        return Call("POST", "/v1/memories/search", model(RecallResults),
                    json=fields(query=query, scope=scope_of(user_id, agent_id), limit=limit,
                                offset=offset, include_events=include_events,
                                include_memories=include_memories, session_id=session_id,
                                types=list(types) if types is not None else None,
                                valid_only=valid_only, as_of=as_of,
                                min_confidence=min_confidence, after=after, before=before,
                                metadata=dict(metadata) if metadata is not None else None))

    @endpoint
    def delete_scope(self, *, user_id: str | None = None, agent_id: str | None = None,
                     session_id: str | None = None,
                     wait: bool | float = False) -> Call[OperationAccepted]:
        """Delete everything of a scope (memories, sessions, events) in the background;
        `session_id` narrows it to what was learnt in that session (it alone is a scope)."""
        timeout = wait_s(wait)
        return Call("POST", "/v1/memories/delete", model(OperationAccepted),
                    json={"scope": fields(user_id=user_id, agent_id=agent_id,
                                          session_id=session_id)},
                    wait=Wait(timeout, operation_ids=lambda r: [str(r.operation_id)],
                              scope=scope_of(user_id, agent_id)) if timeout else None)

    @endpoint
    def types(self) -> Call[MemoryTypes]:
        """The built-in memory types and the tenant's own."""
        return Call("GET", "/v1/memory-types", model(MemoryTypes))

    @endpoint
    def add_type(self, name: str, *, description: str | None = None) -> Call[MemoryTypePublic]:
        return Call("POST", "/v1/memory-types", model(MemoryTypePublic),
                    json=fields(name=name, description=description))


class Sessions(Resource[Mode]):
    """Sessions of events (an agent's transcript), from which memories are extracted."""

    @endpoint
    def add_events(self, session_id: str, events: Sequence[Mapping[str, Any]], *,
                   user_id: str | None = None, agent_id: str | None = None,
                   wait: bool | float = False) -> Call[EventsAccepted]:
        """Append events (`{"role", "content", "event_id"?, "created_at"?, ...}`) to a
        session; `wait`: until they are searchable by meaning."""
        timeout = wait_s(wait)
        return Call("POST", f"/v1/sessions/{segment(session_id)}/events", model(EventsAccepted),
                    json={"scope": scope_of(user_id, agent_id), "events": list(events)},
                    wait=Wait(timeout, operation_ids=lambda r: [str(r.operation_id)]
                              if r.operation_id else [],
                              scope=scope_of(user_id, agent_id)) if timeout else None)

    @endpoint
    def events(self, session_id: str, *, user_id: str | None = None,
               agent_id: str | None = None, since: str | None = None, limit: int | None = None,
               cursor: str | None = None) -> Call[EventsPage]:
        return Call("GET", f"/v1/sessions/{segment(session_id)}/events", model(EventsPage),
                    params=fields(user_id=user_id, agent_id=agent_id, since=since, limit=limit,
                                  cursor=cursor))

    @pages
    def iterate_events(self, session_id: str, *, user_id: str | None = None,
                       agent_id: str | None = None, since: str | None = None,
                       page_size: int = 100) -> PageCall[EventPublic]:
        """Every event of the session, in the order written."""
        first = Call("GET", f"/v1/sessions/{segment(session_id)}/events", model(EventsPage),
                     params=fields(user_id=user_id, agent_id=agent_id, since=since,
                                   limit=page_size))
        return PageCall(first, lambda page: page.data, cursor_pages)

    @endpoint
    def get(self, session_id: str, *, user_id: str | None = None,
            agent_id: str | None = None) -> Call[SessionPublic]:
        return Call("GET", f"/v1/sessions/{segment(session_id)}", model(SessionPublic),
                    params=scope_of(user_id, agent_id))

    @endpoint
    def list(self, *, user_id: str | None = None, agent_id: str | None = None,
             limit: int | None = None, cursor: str | None = None) -> Call[SessionsPage]:
        return Call("GET", "/v1/sessions", model(SessionsPage),
                    params=fields(user_id=user_id, agent_id=agent_id, limit=limit, cursor=cursor))

    @pages
    def iterate(self, *, user_id: str | None = None, agent_id: str | None = None,
                page_size: int = 100) -> PageCall[SessionPublic]:
        first = Call("GET", "/v1/sessions", model(SessionsPage),
                     params=fields(user_id=user_id, agent_id=agent_id, limit=page_size))
        return PageCall(first, lambda page: page.data, cursor_pages)

    @endpoint
    def delete(self, session_id: str, *, user_id: str | None = None,
               agent_id: str | None = None) -> Call[SessionDeleted]:
        return Call("DELETE", f"/v1/sessions/{segment(session_id)}", model(SessionDeleted),
                    params=scope_of(user_id, agent_id))

    @endpoint
    def extract(self, session_id: str, *, user_id: str | None = None,
                agent_id: str | None = None,
                wait: bool | float = False) -> Call[OperationAccepted]:
        """Extract memories from the session's unread events now, not when it goes quiet."""
        timeout = wait_s(wait)
        return Call("POST", f"/v1/sessions/{segment(session_id)}/extract",
                    model(OperationAccepted), json={"scope": scope_of(user_id, agent_id)},
                    wait=Wait(timeout, operation_ids=lambda r: [str(r.operation_id)],
                              scope=scope_of(user_id, agent_id)) if timeout else None)

    @endpoint
    def trace(self, trace_id: str, *, user_id: str | None = None,
              agent_id: str | None = None) -> Call[TraceTree]:
        return Call("GET", f"/v1/traces/{segment(trace_id)}", model(TraceTree),
                    params=scope_of(user_id, agent_id))


class Operations(Resource[Mode]):
    """Background work a write started: embeddings, extractions, deletes by scope."""

    @endpoint
    def get(self, operation_id: str, *, user_id: str | None = None,
            agent_id: str | None = None, wait_s: float | None = None) -> Call[OperationPublic]:
        """An operation; with `wait_s` (at most 60) the server answers once it finished or
        when that time ran out, whichever comes first."""
        return Call("GET", f"/v1/operations/{segment(operation_id)}", model(OperationPublic),
                    params=fields(user_id=user_id, agent_id=agent_id, wait=wait_s))

    @endpoint
    def wait(self, operation_id: str, *, timeout_s: float = DEFAULT_WAIT_S,
             user_id: str | None = None, agent_id: str | None = None) -> Call[OperationPublic]:
        """The operation once it finished (raising `OperationFailed` if it failed, and
        `WaitTimedOut` after `timeout_s`)."""
        scope = scope_of(user_id, agent_id)
        return Call("GET", f"/v1/operations/{segment(operation_id)}", model(OperationPublic),
                    params=scope, wait=Wait(timeout_s, operation_ids=lambda r: [str(r.id)],
                                            scope=scope))


class Jobs(Resource[Mode]):
    """The job ledger: what runs, waits, retries and failed."""

    @endpoint
    def list(self, *, status: str | None = None, kind: str | None = None,
             item_id: str | None = None, created_after: str | None = None,
             created_before: str | None = None, limit: int | None = None,
             offset: int | None = None) -> Call[JobsPublic]:
        return Call("GET", "/v1/jobs", model(JobsPublic),
                    params=fields(status=status, kind=kind, item_id=item_id,
                                  created_after=created_after, created_before=created_before,
                                  limit=limit, offset=offset))

    @pages
    def iterate(self, *, status: str | None = None, kind: str | None = None,
                item_id: str | None = None, page_size: int = 100) -> PageCall[JobPublic]:
        first = Call("GET", "/v1/jobs", model(JobsPublic),
                     params=fields(status=status, kind=kind, item_id=item_id, limit=page_size,
                                   offset=0))
        return PageCall(first, lambda page: page.data, offset_pages)

    @endpoint
    def get(self, job_id: str) -> Call[JobPublic]:
        return Call("GET", f"/v1/jobs/{segment(job_id)}", model(JobPublic))

    @endpoint
    def stats(self) -> Call[JobStats]:
        return Call("GET", "/v1/jobs/stats", model(JobStats))

    @endpoint
    def retry(self, job_id: str) -> Call[JobPublic]:
        return Call("POST", f"/v1/jobs/{segment(job_id)}/retry", model(JobPublic))

    @endpoint
    def cancel(self, job_id: str) -> Call[JobPublic]:
        return Call("POST", f"/v1/jobs/{segment(job_id)}/cancel", model(JobPublic))


class DeadLetters(Resource[Mode]):
    """Jobs that failed for good, and their replay."""

    @endpoint
    def list(self, *, kind: str | None = None, item_id: str | None = None,
             replayed: bool | None = None, permanent: bool | None = None,
             limit: int | None = None, offset: int | None = None) -> Call[DeadLettersPublic]:
        return Call("GET", "/v1/dead-letters", model(DeadLettersPublic),
                    params=fields(kind=kind, item_id=item_id, replayed=replayed,
                                  permanent=permanent, limit=limit, offset=offset))

    @endpoint
    def get(self, dead_letter_id: int) -> Call[DeadLetterPublic]:
        return Call("GET", f"/v1/dead-letters/{dead_letter_id}", model(DeadLetterPublic))

    @endpoint
    def replay(self, dead_letter_id: int) -> Call[Replayed]:
        return Call("POST", f"/v1/dead-letters/{dead_letter_id}/replay", model(Replayed))

    @endpoint
    def replay_all(self, *, kind: str | None = None, item_id: str | None = None,
                   permanent: bool | None = None, limit: int | None = None) -> Call[Replayed]:
        """Replay every dead letter not yet replayed that matches."""
        return Call("POST", "/v1/dead-letters/replay", model(Replayed),
                    json=fields(kind=kind, item_id=item_id, permanent=permanent, limit=limit))


class Queues(Resource[Mode]):
    @endpoint
    def list(self) -> Call[QueuesPublic]:
        return Call("GET", "/v1/queues", model(QueuesPublic))

    @endpoint
    def pause(self, kind: str) -> Call[QueueChanged]:
        """Stop workers taking a job kind, for every tenant (an operator's key)."""
        return Call("POST", f"/v1/queues/{segment(kind)}/pause", model(QueueChanged))

    @endpoint
    def resume(self, kind: str) -> Call[QueueChanged]:
        return Call("POST", f"/v1/queues/{segment(kind)}/resume", model(QueueChanged))


class Tenants(Resource[Mode]):
    """Tenants of the installation (an operator's key)."""

    @endpoint
    def create(self, name: str) -> Call[TenantMade]:
        """A tenant and its first admin key, shown this once."""
        return Call("POST", "/v1/tenants", model(TenantMade), json={"name": name})

    @endpoint
    def list(self, *, status: str | None = None, name: str | None = None,
             limit: int | None = None, cursor: str | None = None) -> Call[TenantsPage]:
        return Call("GET", "/v1/tenants", model(TenantsPage),
                    params=fields(status=status, name=name, limit=limit, cursor=cursor))

    @endpoint
    def get(self, tenant_id: int) -> Call[TenantPublic]:
        return Call("GET", f"/v1/tenants/{tenant_id}", model(TenantPublic))

    @endpoint
    def suspend(self, tenant_id: int) -> Call[TenantPublic]:
        return Call("POST", f"/v1/tenants/{tenant_id}/suspend", model(TenantPublic))

    @endpoint
    def resume(self, tenant_id: int) -> Call[TenantPublic]:
        return Call("POST", f"/v1/tenants/{tenant_id}/resume", model(TenantPublic))

    @endpoint
    def delete(self, tenant_id: int) -> Call[TenantDeleting]:
        """Erase the tenant: its keys are refused at once, an erasure job removes the rest."""
        return Call("DELETE", f"/v1/tenants/{tenant_id}", model(TenantDeleting))

    @endpoint
    def limits(self, tenant_id: int) -> Call[TenantLimitsPublic]:
        return Call("GET", f"/v1/tenants/{tenant_id}/limits", model(TenantLimitsPublic))

    @endpoint
    def set_limits(self, tenant_id: int, limits: Mapping[str, int | None]) -> Call[
            TenantLimitsPublic]:
        """Set all five limits; one left out or None takes the installation's default."""
        return Call("PUT", f"/v1/tenants/{tenant_id}/limits", model(TenantLimitsPublic),
                    json=dict(limits))


class Keys(Resource[Mode]):
    """API keys of the tenant (an admin's key; an operator's with `tenant_id`)."""

    @endpoint
    def create(self, *, name: str | None = None,
               role: Literal["read", "write", "admin", "operator"] | None = None,
               user_id: str | None = None, agent_id: str | None = None,
               tenant_id: int | None = None) -> Call[KeyMade]:
        """A new key, shown this once."""
        return Call("POST", "/v1/keys", model(KeyMade),
                    json=fields(name=name, role=role, user_id=user_id, agent_id=agent_id,
                                tenant_id=tenant_id))

    @endpoint
    def list(self, *, tenant_id: int | None = None, include_inactive: bool | None = None,
             limit: int | None = None, cursor: str | None = None) -> Call[KeysPage]:
        return Call("GET", "/v1/keys", model(KeysPage),
                    params=fields(tenant_id=tenant_id, include_inactive=include_inactive,
                                  limit=limit, cursor=cursor))

    @endpoint
    def get(self, key_id: int, *, tenant_id: int | None = None) -> Call[KeyPublic]:
        return Call("GET", f"/v1/keys/{key_id}", model(KeyPublic),
                    params=fields(tenant_id=tenant_id))

    @endpoint
    def revoke(self, key_id: int, *, tenant_id: int | None = None) -> Call[KeyPublic]:
        return Call("DELETE", f"/v1/keys/{key_id}", model(KeyPublic),
                    params=fields(tenant_id=tenant_id))

    @endpoint
    def rotate(self, key_id: int, *, grace_s: int = 3600,
               tenant_id: int | None = None) -> Call[KeyRotated]:
        """A new key like this one; this one keeps working for `grace_s` seconds."""
        return Call("POST", f"/v1/keys/{key_id}/rotate", model(KeyRotated),
                    params=fields(tenant_id=tenant_id), json={"grace_s": grace_s})


class Audit(Resource[Mode]):
    @endpoint
    def list(self, *, tenant_id: int | None = None, action: str | None = None,
             since: str | None = None, limit: int | None = None,
             cursor: str | None = None) -> Call[AuditPage]:
        """Admin and destructive actions, newest first."""
        return Call("GET", "/v1/audit", model(AuditPage),
                    params=fields(tenant_id=tenant_id, action=action, since=since, limit=limit,
                                  cursor=cursor))


class Root(Resource[Mode]):
    """The operations that belong to no group: search, context, usage and health."""

    @endpoint
    def search(self, query: str, *, mode: Literal["hybrid", "fts", "semantic"] | None = None,
               limit: int | None = None, offset: int | None = None,
               group_by: Literal["part", "item"] | None = None,
               filters: Mapping[str, Any] | None = None, alpha: float | None = None,
               k: int | None = None, blend: float | None = None,
               fusion: Literal["score", "rrf"] | None = None,
               track: bool | None = None) -> Call[SearchResponse]:
        """Hybrid search over the tenant's documents; `filters` as `POST /v1/search` takes
        them (`tags`, `kinds`, `item_ids`, `created_after`, ...)."""
        return Call("POST", "/v1/search", model(SearchResponse),
                    json=fields(query=query, mode=mode, limit=limit, offset=offset,
                                group_by=group_by, filters=dict(filters) if filters else None,
                                alpha=alpha, k=k, blend=blend, fusion=fusion, track=track))

    @endpoint
    def context(self, *, user_id: str | None = None, agent_id: str | None = None,
                session_id: str | None = None, query: str | None = None,
                max_tokens: int | None = None) -> Call[ContextResponse]:
        """What an agent should know now, within `max_tokens`: the session's recent turns,
        the memories and past turns that bear on `query` (or on the latest turns)."""
        return Call("POST", "/v1/context", model(ContextResponse),
                    json=fields(scope=scope_of(user_id, agent_id), session_id=session_id,
                                query=query, max_tokens=max_tokens))

    @endpoint
    def usage(self) -> Call[UsagePublic]:
        """The tenant's use of each of its limits."""
        return Call("GET", "/v1/usage", model(UsagePublic))

    @endpoint
    def health(self) -> Call[dict[str, Any]]:
        return Call("GET", "/healthz", dict)
