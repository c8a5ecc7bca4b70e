"""Request and response models. Requests forbid unknown fields and use strict types, so a
typo or a number where a string belongs is a 422 rather than a silent coercion.

Every string a client sends is a `SafeStr` and every integer that reaches SQL is bounded to
int64: Postgres refuses a NUL or a lone surrogate in text and asyncpg cannot send an integer
past int64, and either used to surface as a 500 from deep inside a query."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pipeline import search
from pipeline.search import Fusion, GroupBy, Mode

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _storable(value: str) -> str:
    # A JSON "\u0000" or "\ud800" escape decodes to a Python string that Postgres cannot
    # take as text (and a lone surrogate cannot even be encoded to send it): refuse both at
    # the edge, naming the field, instead of failing inside the query.
    try:
        value.encode()
    except UnicodeEncodeError:
        raise PydanticCustomError(
            "string_surrogate",
            "must be valid Unicode: a lone surrogate (\\ud800-\\udfff) has no UTF-8 form",
        ) from None
    if "\x00" in value:
        raise PydanticCustomError("string_nul", "must not contain the NUL character (\\u0000)")
    return value


SafeStr = Annotated[StrictStr, AfterValidator(_storable)]
"""Every string a client sends (body fields, tag keys and values, filter values, query and
path parameters): a string Postgres can store."""


def _integral(value: object) -> object:
    # JSON Schema calls 642.0 an integer, and clients built from the document may send it:
    # accept a float with no fractional part as that integer; 2.5 is still refused.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def json_int(*, ge: int, le: int) -> Any:
    """The type of an integer in a JSON body, from `ge` to `le`: strict (no strings, no
    booleans), but 642.0 is 642. Bounds are required: past int64 asyncpg cannot send an
    integer to Postgres. (Query and path integers are parsed from text, where "642.0" already
    reads as 642; they take `INT64_MIN`/`INT64_MAX` where nothing narrower applies.)"""
    # The bounds go before the validator: after it, pydantic leaves them out of the schema of
    # an optional field.
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


def _escaped(value: str | None) -> str | None:
    # What echoes a client's text back (a refused entry's id) must be valid UTF-8: a lone
    # surrogate is shown as its \\udXXX escape, where JSON encoders write U+FFFD or fail.
    return None if value is None else value.encode("utf-8", "backslashreplace").decode()


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _names_are_unicode(cls, data: Any) -> Any:
        # pydantic cannot compare a field name holding a lone surrogate with its own and
        # reports only that the object is bad: name the field instead.
        if isinstance(data, dict):
            for name in data:
                if isinstance(name, str) and _escaped(name) != name:
                    raise PydanticCustomError(
                        "string_surrogate",
                        "unknown field {name}: a lone surrogate (\\ud800-\\udfff) is not"
                        " valid Unicode",
                        {"name": f"'{_escaped(name)}'"},
                    )
        return data


class ItemCreate(Strict):
    """Text in `content`, or a URL in `uri` that a job fetches; never both."""

    id: SafeStr
    content: SafeStr | None = None
    uri: SafeStr | None = None
    title: SafeStr | None = None
    tags: dict[SafeStr, SafeStr] = Field(default_factory=dict)


class ItemBatch(Strict):
    # Entries stay loose here and are validated one by one, so one bad entry is reported by
    # its index instead of refusing the other 999.
    items: list[Any] = Field(
        description="Each entry an item as `POST /v1/items` takes it, validated on its own: a"
                    " bad entry is refused by its index in the answer, the others are written.")


class BatchAccepted(BaseModel):
    index: int
    id: str
    change: Literal["created", "content", "metadata", "unchanged"]
    version: int
    jobs: list[UUID]


class BatchRefused(BaseModel):
    index: int
    id: Annotated[str | None, AfterValidator(_escaped)] = Field(
        description="the entry's id as sent, a lone surrogate escaped as \\udXXX")
    status: int
    error: Annotated[str, AfterValidator(_escaped)]


class BatchResult(BaseModel):
    accepted: list[BatchAccepted]
    refused: list[BatchRefused]


class ItemLookup(Strict):
    ids: list[SafeStr] = Field(max_length=1000)


class ItemState(BaseModel):
    id: str
    version: int
    content_hash: str
    title: str | None
    tags: dict[str, str]
    status: str
    error: str | None


class ItemStates(BaseModel):
    items: list[ItemState]
    missing: list[str]


class ItemVersionPublic(BaseModel):
    offset: int
    version: int
    kind: str
    uri: str | None
    title: str | None
    summary: str | None
    tags: dict[str, str]
    content_hash: str
    created_at: datetime
    archived_at: datetime | None


class ItemDeleted(BaseModel):
    id: str
    outcome: Literal["reverted", "deleted"]
    version: int | None
    jobs: list[JobBrief] = Field(default_factory=list)


class JobBrief(BaseModel):
    id: UUID
    kind: str
    status: str
    attempts: int = 0


class ItemPublic(BaseModel):
    id: str
    kind: str
    uri: str | None
    title: str | None
    summary: str | None
    tags: dict[str, str]
    content_hash: str
    version: int
    status: str
    error: str | None
    created_at: datetime
    updated_at: datetime
    accessed_at: datetime | None
    access_count: int
    jobs: list[JobBrief] = Field(default_factory=list)


class ItemAccepted(BaseModel):
    item: ItemPublic
    jobs: list[JobBrief]
    change: Literal["created", "content", "metadata", "unchanged"]


class AttemptPublic(BaseModel):
    attempt: int
    worker_id: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str | None
    retry_delay_s: float | None = None


class JobPublic(BaseModel):
    id: UUID
    kind: str
    item_id: str | None
    version: int | None
    status: str
    attempts: int
    max_attempts: int
    last_error: str | None
    depends_on: UUID | None
    run_after: datetime
    lease_until: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: float | None
    history: list[AttemptPublic]


MAX_FILTER_VALUES = 1000


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_text(value: object) -> object:
    # JSON has no time type: a time is text. A bare number, or the text of one (as a query
    # string always is), would pass as Unix seconds where the document promises ISO 8601.
    if not isinstance(value, str) or not _ISO_DATE.match(value):
        raise ValueError("must be an ISO 8601 date-time string, such as 2026-01-31T12:00:00Z")
    return value


def _in_utc_range(value: datetime) -> datetime:
    # The database driver sends a time as UTC: one whose UTC form leaves years 1-9999 (the
    # first hours of year 1 east of Greenwich) raised OverflowError inside the query.
    if value.tzinfo is not None:
        try:
            value.astimezone(UTC)
        except OverflowError:
            raise PydanticCustomError(
                "datetime_range", "must fall within the years 1 to 9999 in UTC") from None
    return value


# Parsed from text even though requests are strict, with a time zone required.
IsoTime = Annotated[AwareDatetime, BeforeValidator(_iso_text), AfterValidator(_in_utc_range),
                    Field(strict=False)]
# A query parameter's time: ISO 8601 too; without a time zone it is UTC, as before.
QueryTime = Annotated[datetime, BeforeValidator(_iso_text), AfterValidator(_in_utc_range)]


class SearchFilters(Strict):
    """What a result's item must match. Every field narrows; an unknown field is a 422."""

    tags: dict[SafeStr, SafeStr | list[SafeStr]] = Field(
        default_factory=dict,
        description='{"key": "value"} for that value, {"key": ["a", "b"]} for any of them;'
        " every key must match; system tags (_media_type, ...) too",
    )
    kinds: list[SafeStr] | None = Field(default=None, min_length=1, max_length=100)
    item_ids: list[SafeStr] | None = Field(
        default=None, min_length=1, max_length=MAX_FILTER_VALUES)
    created_after: IsoTime | None = None
    created_before: IsoTime | None = None
    updated_after: IsoTime | None = None
    updated_before: IsoTime | None = None
    valid_only: StrictBool = Field(
        default=False, description="only items whose every job is done (status ready)")

    @field_validator("tags")
    @classmethod
    def _tag_values(cls, tags: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        if len(tags) > 50:
            raise ValueError("at most 50 tag keys")
        for key, value in tags.items():
            if isinstance(value, list) and not 1 <= len(value) <= MAX_FILTER_VALUES:
                raise ValueError(
                    f"tag {key!r}: a list of values needs 1 to {MAX_FILTER_VALUES} of them")
        return tags

    @model_validator(mode="after")
    def _ranges(self) -> SearchFilters:
        for name in ("created", "updated"):
            after, before = getattr(self, f"{name}_after"), getattr(self, f"{name}_before")
            if after is not None and before is not None and after >= before:
                raise ValueError(f"{name}_after must be earlier than {name}_before")
        return self

    def to_pipeline(self) -> search.SearchFilters:
        return search.SearchFilters(**self.model_dump())


class SearchRequest(Strict):
    query: SafeStr = Field(min_length=1)
    mode: Mode = "hybrid"
    limit: json_int(ge=1, le=100) = 10
    offset: json_int(ge=0, le=1000) = 0
    alpha: float | None = Field(
        default=None, ge=0, le=1, description="the vector side's weight in the fusion")
    k: json_int(ge=1, le=1000) | None = Field(default=None, description="RRF's k")
    blend: float | None = Field(
        default=None, ge=0, le=1, description="weight of recency and use against relevance")
    fusion: Fusion | None = Field(
        default=None, description="score (normalized scores, the default) or rrf (ranks)")
    group_by: GroupBy = Field(
        default="part", description="part: every matching part; item: each item's best part")
    filters: SearchFilters = Field(default_factory=SearchFilters)
    track: StrictBool = Field(
        default=True, description="count the results as accessed (the use signal)")

    def to_pipeline(self) -> search.SearchParams:
        return search.SearchParams(**self.model_dump(exclude={"filters", "track"}),
                                   filters=self.filters.to_pipeline())


class SearchItem(BaseModel):
    id: str
    title: str | None
    summary: str | None
    tags: dict[str, str]
    version: int
    kind: str


class SearchScores(BaseModel):
    """Why a result ranked where it did: its rank and score on each side among the
    candidates (null where that side did not score it), the fused relevance in [0, 1], and
    the final score after the blend with recency and use."""

    fts_rank: int | None
    vector_rank: int | None
    fts: float | None = Field(description="BM25")
    vector: float | None = Field(description="cosine similarity")
    fused: float
    final: float


class SearchResult(BaseModel):
    part_id: int
    position: int
    text: str
    snippet: str
    item: SearchItem
    scores: SearchScores


class SearchResponse(BaseModel):
    query: str
    mode: str
    results: list[SearchResult]
    warnings: list[str]
    timings_ms: dict[str, float]


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class WorkerPublic(BaseModel):
    id: str
    hostname: str
    pid: int
    queue_name: str
    started_at: datetime
    last_seen_at: datetime


class EmbeddingIndexPublic(BaseModel):
    """Which embedder made the index's vectors, and the progress of a reindex to another."""

    model: str | None = Field(description="provider:model of the vectors searched now")
    reindexing_to: str | None = Field(description="provider:model a reindex is building")
    parts: int = Field(description="this tenant's parts")
    reindexed_parts: int = Field(description="this tenant's parts with a vector of the new model")


class TextStatsPublic(BaseModel):
    """BM25's word statistics, recounted in the background as parts change."""

    parts: int | None = Field(description="parts counted at the last recount")
    refreshed_at: datetime | None
    fresh: bool = Field(description="no part arrived since the last recount")


class JobStats(BaseModel):
    """The asking tenant's jobs, and, for an operator's key only, the installation's: every
    tenant's queue and the workers' hosts. The operator-only fields are null for a tenant's
    key; the others count the key's own tenant only, whoever asks."""

    by_status: dict[str, int] = Field(description="this tenant's jobs by status")
    by_kind: dict[str, dict[str, int]] = Field(
        description="this tenant's jobs by kind, then status")
    due: int = Field(description="this tenant's queued jobs whose time has come (not backing "
                                 "off): its share of the work waiting for a worker")
    oldest_queued_at: datetime | None = Field(
        description="when this tenant's longest-waiting due job became due")
    oldest_queued_age_s: float | None = Field(description="how long ago that was")
    workers_alive: int = Field(description="workers of this queue with a fresh heartbeat, as "
                                           "`/readyz` counts them")
    embedding_index: EmbeddingIndexPublic
    text_stats: TextStatsPublic
    queue_depth: int | None = Field(
        default=None, description="operator keys only: deliveries in the Redis queue, every "
        "tenant's, deferred retries included; null for a tenant's key or when Redis is down")
    workers: list[WorkerPublic] | None = Field(
        default=None, description="operator keys only: the live workers with their host, pid "
        "and last heartbeat; null for a tenant's key")


class AttemptDetail(AttemptPublic):
    traceback: str | None


class DeadLetterPublic(BaseModel):
    id: int
    job_id: UUID
    kind: str
    item_id: str | None
    payload: dict[str, Any]
    reason: str
    permanent: bool
    attempts: int
    created_at: datetime
    replayed_at: datetime | None
    last_error: str | None
    history: list[AttemptDetail] = Field(default_factory=list)


class DeadLettersPublic(BaseModel):
    data: list[DeadLetterPublic]
    count: int


class ReplayFilter(Strict):
    kind: SafeStr | None = None
    item_id: SafeStr | None = None
    permanent: bool | None = None
    limit: json_int(ge=1, le=10_000) = 1000


class Replayed(BaseModel):
    replayed: int
    jobs: list[UUID]


class Problem(BaseModel):
    """The body of every error but a 422: 401, 404, 409, 413, 503."""

    detail: str = Field(description="what is wrong, in a sentence")


class QuotaProblem(BaseModel):
    """The body of every 429 (`api.errors.quota_response`), sent with `Retry-After` in whole
    seconds: the schema the OpenAPI document gives the 429 of every `/v1/` route."""

    detail: str = Field(description="what is exceeded, in a sentence")
    limit: str = Field(description="requests_per_minute, items, memories, bytes or jobs")
    limit_value: int
    used: int
    adding: int = Field(description="what the refused request would have added")
    retry_after_s: int = Field(description="the same as Retry-After")


class FieldProblem(BaseModel):
    loc: list[str | int] = Field(
        description='where: ["body", "filters", "tags", "lang"], ["query", "offset"]; empty'
                    " when the request as a whole is wrong")
    msg: str
    type: str = Field(description="a machine-readable kind: missing, string_nul, ...")


class ValidationProblem(BaseModel):
    """The body of every 422: a readable summary and each problem with its place."""

    detail: str = Field(description="the first problems, each naming its field")
    errors: list[FieldProblem]


class QueuePublic(BaseModel):
    """One job kind: whether workers take it, and this tenant's jobs of it."""

    kind: str
    paused: bool = Field(description="workers do not take this kind (every tenant's)")
    paused_at: datetime | None
    queued: int = Field(description="this tenant's queued jobs, due or not")
    retrying: int = Field(description="this tenant's jobs waiting out a backoff")
    waiting: int = Field(description="this tenant's jobs waiting on another job")
    running: int
    oldest_due_age_s: float | None = Field(
        description="age of this tenant's oldest due job of this kind")


class QueuesPublic(BaseModel):
    data: list[QueuePublic]


class QueueChanged(BaseModel):
    kind: str
    paused: bool
    changed: bool = Field(description="false when the kind already was in that state")
