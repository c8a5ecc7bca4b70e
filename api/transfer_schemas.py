"""The lines of an export file (`GET /v1/export`, `POST /v1/import`), one model per `type`, and
the import's answer. An import validates every line with these, strictly like the rest of the
API: an unknown field, a wrong type or a string Postgres cannot store is a 422 naming the line.

Fields an installation computes (an item's kind, status, summary and error; its `updated_at`)
are exported for the reader's benefit and ignored by an import, which computes them again.
Bounds are the API's where the API writes the field, and wider where a job writes it (an
extraction's reasons), so that every export of memmill imports."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    RootModel,
    StrictBool,
    TypeAdapter,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from api.memory_schemas import (  # _storable_json: the one rule of what jsonb stores
    MAX_CONTENT_CHARS,
    MAX_METADATA_BYTES,
    Confidence,
    Content,
    EventRef,
    Metadata,
    ScopeId,
    SessionIdText,
    Visibility,
    _storable_json,
)
from api.schemas import IsoTime, SafeStr, Strict, json_int
from pipeline.transfer import FORMAT, TYPES, VERSION

DataType = Literal["memory_type", "item_version", "item", "memory", "memory_history",
                   "session", "event"]
assert set(get_args(DataType)) == set(TYPES)
# Counts a file may hold: bounded where a JSON Schema's number is still exact (2^53 - 1).
Count = json_int(ge=0, le=2**53 - 1)
Version = json_int(ge=1, le=2**31 - 1)
Tags = dict[SafeStr, SafeStr]
Text = Annotated[SafeStr, Field(max_length=MAX_CONTENT_CHARS)]
MAX_CHANGES_BYTES = 4 * MAX_METADATA_BYTES


def _base64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("base64", "must be base64 (RFC 4648, with padding)") from None


def _changes(value: dict[str, Any]) -> dict[str, Any]:
    # What a change of a memory changed: its new metadata (up to the API's bound) and a few
    # more fields beside it, so a bound of its own, storable like metadata.
    _storable_json(value)
    if len(json.dumps(value)) > MAX_CHANGES_BYTES:
        raise PydanticCustomError("changes_size",
                                  f"must be at most {MAX_CHANGES_BYTES} bytes as JSON")
    return value


Changes = Annotated[dict[str, Any], AfterValidator(_changes)]
# Text in the file, the bytes once read.
Base64Data = Annotated[bytes, PlainValidator(_base64),
                       WithJsonSchema({"type": "string", "contentEncoding": "base64"})]


class Line(Strict):
    # One schema for reading and writing: what an export writes is what an import reads.
    model_config = ConfigDict(json_schema_mode_override="validation")


def _scope_fits(visibility: str, user_id: str | None, agent_id: str | None) -> None:
    """The rules of migration 0011's CHECKs, so a row the database would refuse is a 422."""
    if visibility == "user" and user_id is None:
        raise ValueError("visibility 'user' needs a user_id")
    if visibility == "private" and agent_id is None:
        raise ValueError("visibility 'private' needs an agent_id")


class Header(Line):
    """The first line: which format, and how many lines of each type follow (an import
    refuses a file whose counts differ: it was cut short or edited)."""

    type: Literal["header"]
    format: Literal["memmill-export"] = Field(description=f"always `{FORMAT}`")
    version: Version = Field(description=f"the format's version: {VERSION}")
    exported_at: IsoTime
    counts: dict[DataType, Count]

    @model_validator(mode="after")
    def _readable(self) -> Header:
        if self.version != VERSION:
            raise ValueError(f"format version {self.version}: this installation reads version "
                             f"{VERSION}")
        return self


class Source(Line):
    """What was ingested: exactly one of `content` (text), `data` (a file's bytes, base64) or
    `uri` (a URL, fetched again by the importing installation)."""

    media_type: SafeStr = Field(min_length=1, max_length=255)
    content: SafeStr | None = None
    data: Base64Data | None = None
    uri: SafeStr | None = None
    filename: SafeStr | None = Field(default=None, max_length=1024)

    @model_validator(mode="after")
    def _one(self) -> Source:
        if sum(v is not None for v in (self.content, self.data, self.uri)) != 1:
            raise ValueError("give exactly one of content, data or uri")
        return self


class MemoryTypeLine(Line):
    type: Literal["memory_type"]
    name: SafeStr = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")
    description: SafeStr | None = Field(default=None, max_length=1000)
    created_at: IsoTime | None = None


class ItemFields(Line):
    """What processing made of an item (its kind, summary and system tags `_…`) is made
    again for the current version, and kept as it was for an archived one (its history)."""

    kind: SafeStr | None = Field(default=None, description="made by extraction")
    uri: SafeStr | None = Field(default=None, description="informative: the source's is used")
    title: SafeStr | None = None
    summary: SafeStr | None = Field(default=None, description="made by summarize")
    tags: Tags = Field(default_factory=dict, description="the caller's, and system tags (`_…`) "
                                                         "made by extraction")
    content_hash: SafeStr | None = Field(default=None, description=(
        "SHA-256 of what was ingested; when given, it must match the source"))
    created_at: IsoTime | None = None
    source: Source | None


class ItemVersionLine(ItemFields):
    """An archived version of an item, with its source; they come oldest first, from 1,
    right before their item's line."""

    type: Literal["item_version"]
    item_id: SafeStr
    version: Version
    archived_at: IsoTime | None = None


class ItemLine(ItemFields):
    type: Literal["item"]
    id: SafeStr
    version: Version = 1
    status: SafeStr | None = Field(default=None, description="ignored: processing sets it")
    error: SafeStr | None = Field(default=None, description="ignored")
    updated_at: IsoTime | None = Field(default=None, description="ignored")
    accessed_at: IsoTime | None = None
    access_count: Count = 0


class MemoryLine(Line):
    type: Literal["memory"]
    id: UUID
    user_id: ScopeId | None = None
    agent_id: ScopeId | None = None
    session_id: SessionIdText | None = None
    visibility: Visibility
    memory_type: SafeStr = Field(max_length=64, description=(
        "a built-in type, or one registered in the file or in the importing tenant"))
    content: Content
    confidence: Confidence = 0.8
    source: SafeStr | None = Field(default=None, max_length=256)
    metadata: Metadata = Field(default_factory=dict)
    hints: list[Annotated[SafeStr, Field(max_length=200)]] = Field(default_factory=list,
                                                                   max_length=100)
    pinned: StrictBool = False
    observed_at: IsoTime | None = None
    valid_until: IsoTime | None = None
    invalid_reason: Text | None = None
    superseded_by: UUID | None = None
    source_events: list[EventRef] = Field(default_factory=list, max_length=1000)
    version: Version = 1
    created_at: IsoTime | None = None
    updated_at: IsoTime | None = None
    access_count: Count = 0
    accessed_at: IsoTime | None = None

    @model_validator(mode="after")
    def _scope(self) -> MemoryLine:
        _scope_fits(self.visibility, self.user_id, self.agent_id)
        return self


class MemoryHistoryLine(Line):
    """A change of the memory right before it; who made it (a key, an operation) is the
    exporting installation's and is left out."""

    type: Literal["memory_history"]
    memory_id: UUID
    version: Version
    operation: Literal["add", "update", "invalidate", "supersede"]
    agent_id: ScopeId | None = None
    old_content: Text | None = None
    new_content: Text | None = None
    changes: Changes = Field(default_factory=dict)
    reason: Text | None = None
    at: IsoTime


class SessionLine(Line):
    type: Literal["session"]
    id: SessionIdText
    user_id: ScopeId | None = None
    agent_id: ScopeId | None = None
    visibility: Visibility
    created_at: IsoTime | None = None
    first_event_at: IsoTime | None = None
    last_event_at: IsoTime | None = None
    last_write_at: IsoTime | None = None
    ended_at: IsoTime | None = None
    summary: Text | None = None
    extracted_events: json_int(ge=0, le=2**31 - 1) = Field(  # type: ignore[valid-type]
        default=0, description="how many of the session's first events (in the file's order) "
                               "memories were extracted from already")

    @model_validator(mode="after")
    def _scope(self) -> SessionLine:
        _scope_fits(self.visibility, self.user_id, self.agent_id)
        return self


class EventLine(Line):
    """An event of the session right before it, in the order they were written; it has its
    session's scope."""

    type: Literal["event"]
    session_id: SessionIdText
    event_id: ScopeId
    role: Literal["user", "assistant", "tool", "system"]
    event_type: Literal["TEXT", "AUDIO", "IMAGE", "SYSTEM"] = "TEXT"
    content: Text
    sender_id: ScopeId | None = None
    sender_name: SafeStr | None = Field(default=None, min_length=1, max_length=256)
    media_item_id: SafeStr | None = Field(default=None, max_length=2048)
    created_at: IsoTime
    received_at: IsoTime | None = None
    trace_id: ScopeId | None = None
    span_id: ScopeId | None = None
    parent_span_id: ScopeId | None = None
    metadata: Metadata = Field(default_factory=dict)


AnyLine = Annotated[Header | MemoryTypeLine | ItemVersionLine | ItemLine | MemoryLine
                    | MemoryHistoryLine | SessionLine | EventLine, Field(discriminator="type")]
LINE = TypeAdapter(AnyLine)


class TransferLine(RootModel[AnyLine]):
    """One line of an export file (NDJSON: one such object per line, the header first)."""


class TypeCount(BaseModel):
    imported: int
    skipped: int = Field(description="already in the tenant (on_conflict=skip)")


class ImportResult(BaseModel):
    counts: dict[DataType, TypeCount]
    jobs: dict[str, int] = Field(description="ledger jobs queued (or waiting) by kind: items "
                                             "are processed again, memories and events "
                                             "embedded, unextracted sessions extracted")
    operation_ids: list[UUID] = Field(description="the embedding and extraction operations "
                                                  "(GET /v1/operations/{id})")


def counted(imported: Any, skipped: Any) -> dict[str, TypeCount]:
    return {t: TypeCount(imported=imported[t], skipped=skipped[t]) for t in TYPES}
