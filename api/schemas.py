"""Request and response models. Requests forbid unknown fields and use strict types, so a
typo or a number where a string belongs is a 422 rather than a silent coercion."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
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

from pipeline import search
from pipeline.search import Fusion, GroupBy, Mode


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ItemCreate(Strict):
    """Text in `content`, or a URL in `uri` that a job fetches; never both."""

    id: StrictStr
    content: StrictStr | None = None
    uri: StrictStr | None = None
    title: StrictStr | None = None
    tags: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class ItemBatch(Strict):
    # Entries stay loose here and are validated one by one, so one bad entry is reported by
    # its index instead of refusing the other 999.
    items: list[Any]


class BatchAccepted(BaseModel):
    index: int
    id: str
    change: Literal["created", "content", "metadata", "unchanged"]
    version: int
    jobs: list[UUID]


class BatchRefused(BaseModel):
    index: int
    id: str | None
    status: int
    error: str


class BatchResult(BaseModel):
    accepted: list[BatchAccepted]
    refused: list[BatchRefused]


class ItemLookup(Strict):
    ids: list[StrictStr] = Field(max_length=1000)


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


def _iso_text(value: object) -> object:
    # JSON has no time type: a time is text. A bare number would pass as Unix seconds.
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 date-time string with a time zone")
    return value


# Parsed from text even though requests are strict, with a time zone required.
IsoTime = Annotated[AwareDatetime, BeforeValidator(_iso_text), Field(strict=False)]


class SearchFilters(Strict):
    """What a result's item must match. Every field narrows; an unknown field is a 422."""

    tags: dict[StrictStr, StrictStr | list[StrictStr]] = Field(
        default_factory=dict,
        description='{"key": "value"} for that value, {"key": ["a", "b"]} for any of them;'
        " every key must match; system tags (_media_type, ...) too",
    )
    kinds: list[StrictStr] | None = Field(default=None, min_length=1, max_length=100)
    item_ids: list[StrictStr] | None = Field(
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
    query: StrictStr = Field(min_length=1)
    mode: Mode = "hybrid"
    limit: int = Field(default=10, ge=1, le=100)
    offset: int = Field(default=0, ge=0, le=1000)
    alpha: float | None = Field(
        default=None, ge=0, le=1, description="the vector side's weight in the fusion")
    k: int | None = Field(default=None, ge=1, le=1000, description="RRF's k")
    blend: float | None = Field(
        default=None, ge=0, le=1, description="weight of recency and use against relevance")
    fusion: Fusion | None = Field(
        default=None, description="score (normalized scores, the default) or rrf (ranks)")
    group_by: GroupBy = Field(
        default="part", description="part: every matching part; item: each item's best part")
    filters: SearchFilters = Field(default_factory=SearchFilters)
    track: StrictBool = Field(
        default=True, description="count the results as accessed (the use signal)")

    @field_validator("query")
    @classmethod
    def _no_nul(cls, query: str) -> str:
        # Postgres refuses a NUL in any text parameter; say so instead of failing with a 500.
        if "\x00" in query:
            raise ValueError("query must not contain NUL characters")
        return query

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
    by_status: dict[str, int]
    by_kind: dict[str, dict[str, int]]
    queue_depth: int | None
    oldest_queued_at: datetime | None
    oldest_queued_age_s: float | None
    workers: list[WorkerPublic]
    embedding_index: EmbeddingIndexPublic
    text_stats: TextStatsPublic


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
    kind: StrictStr | None = None
    item_id: StrictStr | None = None
    permanent: bool | None = None
    limit: int = Field(default=1000, ge=1, le=10_000)


class Replayed(BaseModel):
    replayed: int
    jobs: list[UUID]
