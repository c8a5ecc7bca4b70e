"""Request and response models of the agent memory routes: memories, sessions and events,
search, context and operations. Requests are strict like the rest of the API (api/schemas.py):
an unknown field, a wrong type or an id with whitespace is a 422 naming the field."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from api.schemas import INT64_MAX, IsoTime, SafeStr, Strict, json_int
from pipeline.errors import BadInput
from pipeline.memory.events import MAX_EVENTS_PER_CALL
from pipeline.memory.scopes import id_problem

MAX_CONTENT_CHARS = 20_000
MAX_METADATA_BYTES = 16_000


def _scope_id(value: str) -> str:
    problem = id_problem(value)
    if problem:
        raise PydanticCustomError("scope_id", problem)
    return value


ScopeId = Annotated[SafeStr, AfterValidator(_scope_id)]
"""A user, agent, session or event id: 1-256 characters, no whitespace or control characters."""


def _session_id(value: str) -> str:
    # A session is addressed by its id as one path segment (/v1/sessions/{id}/events), and a
    # server decodes %2F before routing: an id with a slash could never be reached.
    if "/" in value:
        raise PydanticCustomError("session_id", "must not contain '/'")
    return value


SessionIdText = Annotated[ScopeId, AfterValidator(_session_id)]


def _storable_json(value: Any, depth: int = 0) -> None:
    if depth > 16:
        raise PydanticCustomError("json_depth", "must not nest deeper than 16 levels")
    if isinstance(value, float) and not math.isfinite(value):
        # Python's JSON reader takes NaN and Infinity; JSON and Postgres' jsonb do not.
        raise PydanticCustomError("number_finite", "must not hold NaN or Infinity")
    if isinstance(value, str):
        if "\x00" in value:
            raise PydanticCustomError("string_nul", "must not contain the NUL character (\\u0000)")
        try:
            value.encode()
        except UnicodeEncodeError:
            raise PydanticCustomError("string_surrogate", "must be valid Unicode") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable_json(key, depth + 1)
            _storable_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _storable_json(item, depth + 1)


def _metadata(value: dict[str, Any]) -> dict[str, Any]:
    # Postgres' jsonb refuses \u0000 anywhere in a document, nested strings and keys included.
    _storable_json(value)
    if len(json.dumps(value)) > MAX_METADATA_BYTES:
        raise PydanticCustomError("metadata_size",
                                  f"must be at most {MAX_METADATA_BYTES} bytes as JSON")
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(_metadata)]


def metadata_filter(text: str) -> dict[str, Any]:
    """A `metadata` query parameter: JSON a memory's metadata must contain. It is held to the
    rules of metadata itself, so that it can only ever name what could have been stored."""
    example = 'send a JSON object, such as {"project": "apollo"}'
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise BadInput(f"metadata: not JSON; {example}") from None
    if not isinstance(value, dict):
        raise BadInput(f"metadata: must be a JSON object; {example}")
    try:
        return _metadata(value)
    except PydanticCustomError as exc:
        raise BadInput(f"metadata: {exc.message()}") from None
def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank", "must not be empty or only whitespace")
    return value


Content = Annotated[SafeStr, Field(min_length=1, max_length=MAX_CONTENT_CHARS),
                    AfterValidator(_not_blank)]
Visibility = Literal["private", "user", "tenant"]
Layer = Literal["conversation", "tool", "group", "pinned", "observation", "profile"]
LAYER_HELP = (
    "How long the memory lives, by the tenant's policy (GET /v1/memory-policy; defaults: "
    "conversation 30 days, tool 14, group 60; pinned, observation and profile permanent). "
    "Default: `pinned` when pinned, `conversation` for that type, else `observation`.")
Confidence = Annotated[float, Field(ge=0, le=1)]
Version = json_int(ge=1, le=2**31 - 1)


class ScopeIn(Strict):
    """Who a write belongs to, or who a read is made for. Never taken from metadata."""

    user_id: ScopeId | None = None
    agent_id: ScopeId | None = None


class ScopeFilter(ScopeIn):
    """What a delete by scope removes: every memory whose scope has these values."""

    session_id: SessionIdText | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> ScopeFilter:
        if self.user_id is None and self.agent_id is None and self.session_id is None:
            raise ValueError("scope must name a user_id, an agent_id or a session_id: an empty "
                             "scope would delete every memory of the tenant")
        return self


class EventRef(Strict):
    session_id: SessionIdText
    event_id: ScopeId


class MemoryCreate(Strict):
    memory_id: Annotated[UUID, Field(strict=False)] | None = Field(default=None, description=(
        "The caller's id for the memory (default: a new one). Sending the same write again "
        "is then safe: an id the tenant holds already is a 409."))
    scope: ScopeIn
    visibility: Visibility | None = Field(
        default=None, description="Default: `user` when scope.user_id is set, else `private`.")
    type: SafeStr = Field(description="A built-in type or one the tenant registered.")
    content: Content
    confidence: Confidence = 0.8
    source: SafeStr | None = Field(default=None, max_length=256)
    metadata: Metadata = Field(default_factory=dict)
    hints: list[Annotated[SafeStr, Field(max_length=200)]] = Field(default_factory=list,
                                                                   max_length=20)
    pinned: StrictBool = False
    observed_at: IsoTime | None = None
    valid_until: IsoTime | None = Field(default=None, description=(
        "Valid until then (default: until invalidated); from then on, reads of valid "
        "memories (the default) leave it out."))
    session_id: SessionIdText | None = None
    source_events: list[EventRef] = Field(default_factory=list, max_length=100)
    layer: Layer | None = Field(default=None, description=LAYER_HELP)


class MemoryPublic(BaseModel):
    id: UUID
    user_id: str | None
    agent_id: str | None
    session_id: str | None
    visibility: str
    type: str
    content: str
    confidence: float
    source: str | None
    metadata: dict[str, Any]
    hints: list[str]
    pinned: bool
    observed_at: datetime | None
    valid_until: datetime | None
    invalid_reason: str | None
    superseded_by: UUID | None
    source_events: list[dict[str, str]]
    version: int
    created_at: datetime
    updated_at: datetime
    access_count: int
    accessed_at: datetime | None
    layer: str
    expires_at: datetime | None
    embedded: bool


class MemoryWritten(BaseModel):
    memory: MemoryPublic
    operation_id: UUID | None = Field(description="The embedding of the new content.")


class MemoryUpdate(Strict):
    scope: ScopeIn
    expected_version: Version | None = Field(
        default=None, description="The version the change was made from (or send If-Match); "
                                  "one of the two is required.")
    content: Content | None = None
    type: SafeStr | None = None
    confidence: Confidence | None = None
    source: SafeStr | None = Field(default=None, max_length=256)
    metadata: Metadata | None = None
    hints: list[Annotated[SafeStr, Field(max_length=200)]] | None = Field(default=None,
                                                                          max_length=20)
    pinned: StrictBool | None = None
    observed_at: IsoTime | None = None
    layer: Layer | None = Field(default=None, description=(
        "A new layer: the expiry moves to its lifetime, counted from when the memory was "
        "written."))


class MemoryInvalidate(Strict):
    scope: ScopeIn
    expected_version: Version | None = None
    reason: SafeStr = Field(min_length=1, max_length=1000)
    valid_until: IsoTime | None = Field(default=None, description="Default: now.")


class HistoryEntry(BaseModel):
    version: int
    operation: str
    key_id: int | None
    agent_id: str | None
    operation_id: UUID | None
    old_content: str | None
    new_content: str | None
    changes: dict[str, Any]
    reason: str | None
    at: datetime


class MemoryHistory(BaseModel):
    memory_id: UUID
    history: list[HistoryEntry]


class MemoriesPage(BaseModel):
    data: list[MemoryPublic]
    next_cursor: str | None


class MemoryTypeCreate(Strict):
    name: SafeStr = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")
    description: SafeStr | None = Field(default=None, max_length=1000)


class MemoryTypePublic(BaseModel):
    name: str
    builtin: bool
    description: str | None = None


class MemoryTypes(BaseModel):
    data: list[MemoryTypePublic]


class ScopedDelete(Strict):
    scope: ScopeFilter


class OperationAccepted(BaseModel):
    operation_id: UUID
    status: str
    operation: OperationPublic | None = Field(default=None, description=(
        "With ?wait=: the operation as it stood when the wait ended."))


# search ------------------------------------------------------------------------------------


class RecallSearch(Strict):
    query: SafeStr = Field(min_length=1, max_length=2000)
    scope: ScopeIn
    limit: json_int(ge=1, le=100) = 10  # type: ignore[valid-type]
    offset: json_int(ge=0, le=10_000) = 0  # type: ignore[valid-type]
    include_events: StrictBool = False
    include_memories: StrictBool = True
    session_id: SessionIdText | None = None
    types: list[SafeStr] | None = Field(default=None, max_length=50)
    valid_only: StrictBool = True
    as_of: IsoTime | None = Field(default=None, description=(
        "Memories as they stood then: created by then and valid at that time."))
    min_confidence: Confidence | None = None
    after: IsoTime | None = Field(default=None, description="Observed (or said) at or after.")
    before: IsoTime | None = Field(default=None, description="Observed (or said) before.")
    metadata: Metadata | None = Field(default=None, description=(
        'Only rows whose metadata contains this JSON (`{"project": "apollo"}`: that key with '
        "that value; nested objects and arrays match as Postgres' jsonb @> does)."))
    include_expired: StrictBool = Field(default=False, description=(
        "Also memories past their layer's lifetime that the daily prune has not removed yet."))
    expand: StrictBool = Field(default=False, description=(
        "Add to each memory found the memories one relation away (at most 5), as `related`."))


class RelatedHit(BaseModel):
    id: UUID
    kind: Literal["supersedes", "related_to", "derived_from"]
    direction: Literal["out", "in"] = Field(description=(
        "`out`: the hit is the relation's subject (it supersedes, is derived from, ...)."))
    type: str
    content: str


class RecallScores(BaseModel):
    vector: float | None
    fts: float | None
    relevance: float
    names_person: bool
    names_time: bool


class RecallHit(BaseModel):
    kind: Literal["memory", "event"]
    id: str
    score: float
    content: str
    session_id: str | None = None
    event_id: str | None = None
    role: str | None = None
    sender_name: str | None = None
    created_at: datetime | None = None
    type: str | None = None
    confidence: float | None = None
    observed_at: datetime | None = None
    valid_until: datetime | None = None
    version: int | None = None
    pinned: bool | None = None
    source_events: list[dict[str, str]] | None = None
    metadata: dict[str, Any] | None = None
    layer: str | None = None
    source: str | None = None
    related: list[RelatedHit] | None = None
    scores: RecallScores


class RecallResults(BaseModel):
    results: list[RecallHit]
    mode: str
    warnings: list[str]
    timings_ms: dict[str, float]


# sessions and events -----------------------------------------------------------------------


class EventIn(Strict):
    event_id: ScopeId = Field(description="The caller's id, unique within the session; a "
                                          "repeat is not stored twice.")
    role: Literal["user", "assistant", "tool", "system"]
    content: Annotated[SafeStr, Field(max_length=MAX_CONTENT_CHARS)]
    type: Literal["TEXT", "AUDIO", "IMAGE", "SYSTEM"] = "TEXT"
    sender_id: ScopeId | None = None
    sender_name: SafeStr | None = Field(default=None, min_length=1, max_length=256)
    media_item_id: SafeStr | None = Field(default=None, max_length=2048)
    created_at: IsoTime | None = Field(default=None, description="Default: when received.")
    trace_id: ScopeId | None = None
    span_id: ScopeId | None = None
    parent_span_id: ScopeId | None = None
    metadata: Metadata = Field(default_factory=dict)
    ending: StrictBool = Field(default=False, description="The session ends here: extract now.")


class EventsWrite(Strict):
    scope: ScopeIn
    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS_PER_CALL)


class EventsAccepted(BaseModel):
    session_id: str
    stored: int
    duplicates: int
    operation_id: UUID | None = Field(description="The embedding of the stored events.")
    extraction_operation_id: UUID | None
    operation: OperationPublic | None = Field(default=None, description="With ?wait=: the "
                                              "embedding operation as it stood at the end.")


class EventPublic(BaseModel):
    session_id: str
    event_id: str
    seq: int
    role: str
    sender_id: str | None
    sender_name: str | None
    type: str
    content: str
    media_item_id: str | None
    created_at: datetime
    received_at: datetime
    trace_id: str | None
    span_id: str | None
    parent_span_id: str | None
    metadata: dict[str, Any]
    embedded: bool


class EventsPage(BaseModel):
    data: list[EventPublic]
    next_cursor: str | None


class SessionPublic(BaseModel):
    id: str
    user_id: str | None
    agent_id: str | None
    visibility: str
    created_at: datetime
    first_event_at: datetime | None
    last_event_at: datetime | None
    last_write_at: datetime
    events: int
    ended_at: datetime | None
    summary: str | None
    embedded: bool | None = Field(default=None, description="Every event has its vector "
                                  "(shown on a single session).")


class SessionsPage(BaseModel):
    data: list[SessionPublic]
    next_cursor: str | None


class SessionDeleted(BaseModel):
    session_id: str
    deleted_events: int


class SpanNode(BaseModel):
    span_id: str | None
    parent_span_id: str | None
    events: list[EventPublic]
    children: list[SpanNode]


class TraceTree(BaseModel):
    trace_id: str
    spans: list[SpanNode]


class ExtractRequest(Strict):
    scope: ScopeIn


# context -----------------------------------------------------------------------------------


class ContextRequest(Strict):
    scope: ScopeIn
    session_id: SessionIdText | None = None
    query: SafeStr | None = Field(default=None, min_length=1, max_length=2000, description=(
        "Default: the session's latest user turns."))
    max_tokens: json_int(ge=16, le=100_000) = 1000  # type: ignore[valid-type]


class ContextSection(BaseModel):
    name: str
    tokens: int


class ContextIncluded(BaseModel):
    kind: Literal["memory", "event", "summary", "profile", "working_memory"] = Field(
        description="`profile`: a topic of the user's profile (`id` the topic); "
                    "`working_memory`: the scratchpad (`id` `session` or `user`).")
    id: str
    session_id: str | None = None
    event_id: str | None = None
    source_events: list[dict[str, str]] | None = None


class ContextResponse(BaseModel):
    context: str
    sections: list[ContextSection]
    truncated: bool
    included: list[ContextIncluded]
    tokens: int
    tokenizer: str


# operations --------------------------------------------------------------------------------


class DecisionPublic(BaseModel):
    position: int
    action: str
    reason: str
    type: str
    confidence: float
    similarity: float | None
    memory_id: UUID | None
    target_id: UUID | None
    old_content: str | None
    new_content: str
    observed_at: datetime | None
    source_events: list[dict[str, str]]


class OperationPublic(BaseModel):
    id: UUID
    kind: str
    status: Literal["pending", "running", "done", "failed", "cancelled"]
    session_id: str | None
    created_at: datetime
    finished_at: datetime | None
    attempts: int | None
    error: str | None
    result: dict[str, Any]
    decisions: list[DecisionPublic] | None = None


WaitSeconds = Annotated[float, Field(ge=0, le=60)]
MAX_INT = INT64_MAX
