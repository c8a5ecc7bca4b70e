"""What the MCP tools hand back: the API's answers cut down to what a model reads.

A model pays for every token of a tool's result, and the API's models carry what a program
wants (access counts, timings, both ranks of a score) more than what an agent does. Each view
keeps the fields an agent acts on, drops the empty ones, and names the resource to read the
whole thing from (`memmill://items/…`, `memmill://memories/…`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from mcp_types import CallToolResult, TextContent

from api.memory_schemas import ContextResponse, MemoryPublic, OperationPublic, RecallHit
from api.schemas import ItemPublic
from memmill.client.calls import segment


def compact(**values: Any) -> dict[str, Any]:
    """The values that say something: None, empty lists and empty maps are left out."""
    return {k: _plain(v) for k, v in values.items() if v is not None and v != [] and v != {}}


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def reply(data: Mapping[str, Any]) -> CallToolResult:
    """The result as compact JSON text (what most clients show the model) and as structured
    content (what programs read), without the SDK's default indentation."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=dict(data))


def item_uri(item_id: str) -> str:
    return f"memmill://items/{segment(item_id)}"


def memory_uri(memory_id: str, *, user_id: str | None, agent_id: str | None) -> str:
    """The memory's resource as this reader reads it: a key bound to nobody must say whom it
    reads for, exactly as `GET /v1/memories/{id}?user_id=&agent_id=` does."""
    query = urlencode(compact(user_id=user_id, agent_id=agent_id))
    return f"memmill://memories/{segment(memory_id)}" + (f"?{query}" if query else "")


def memory_view(memory: MemoryPublic, *, user_id: str | None,
                agent_id: str | None) -> dict[str, Any]:
    return compact(
        id=str(memory.id), type=memory.type, content=memory.content,
        user_id=memory.user_id, agent_id=memory.agent_id, session_id=memory.session_id,
        visibility=memory.visibility, confidence=memory.confidence,
        pinned=memory.pinned or None, version=memory.version, observed_at=memory.observed_at,
        valid_until=memory.valid_until, invalid_reason=memory.invalid_reason,
        superseded_by=str(memory.superseded_by) if memory.superseded_by else None,
        created_at=memory.created_at, metadata=memory.metadata,
        source_events=memory.source_events,
        resource=memory_uri(str(memory.id), user_id=user_id, agent_id=agent_id))


def hit_view(hit: RecallHit) -> dict[str, Any]:
    """A search result: a memory with its type and confidence, or a past turn with who said
    it and when."""
    return compact(
        kind=hit.kind, id=hit.id, score=round(hit.score, 3), content=hit.content,
        type=hit.type, confidence=hit.confidence, session_id=hit.session_id,
        event_id=hit.event_id, role=hit.role, sender_name=hit.sender_name,
        when=hit.observed_at or hit.created_at, valid_until=hit.valid_until,
        source_events=hit.source_events)


def context_view(answer: ContextResponse) -> dict[str, Any]:
    return compact(context=answer.context, tokens=answer.tokens, truncated=answer.truncated,
                   sections={s.name: s.tokens for s in answer.sections},
                   included=len(answer.included))


def item_view(item: ItemPublic) -> dict[str, Any]:
    """An item's state; its jobs only while it is not ready, since then they say why."""
    jobs = [] if item.status == "ready" else [
        {"kind": job.kind, "status": job.status} for job in item.jobs]
    return compact(
        id=item.id, status=item.status, kind=item.kind, title=item.title,
        summary=item.summary, uri=item.uri, tags=item.tags, version=item.version,
        error=item.error, updated_at=item.updated_at, jobs=jobs, resource=item_uri(item.id))


def operation_view(operation: OperationPublic) -> dict[str, Any]:
    decisions = [compact(action=d.action, content=d.new_content, reason=d.reason,
                         memory_id=str(d.memory_id) if d.memory_id else None)
                 for d in operation.decisions or []]
    return compact(id=str(operation.id), kind=operation.kind, status=operation.status,
                   session_id=operation.session_id, error=operation.error,
                   result=operation.result, decisions=decisions,
                   finished_at=operation.finished_at)
