"""Request and response models. Requests forbid unknown fields and use strict types, so a
typo or a number where a string belongs is a 422 rather than a silent coercion."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from pipeline.search import Mode


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ItemCreate(Strict):
    id: StrictStr
    content: StrictStr
    title: StrictStr | None = None
    tags: dict[StrictStr, StrictStr] = Field(default_factory=dict)


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


class SearchRequest(Strict):
    query: StrictStr = Field(min_length=1)
    mode: Mode = "hybrid"
    limit: int = Field(default=10, ge=1, le=100)
    offset: int = Field(default=0, ge=0, le=1000)
    alpha: float | None = Field(default=None, ge=0, le=1)
    k: int | None = Field(default=None, ge=1, le=1000)
    blend: float | None = Field(default=None, ge=0, le=1)


class SearchItem(BaseModel):
    id: str
    title: str | None
    summary: str | None
    tags: dict[str, str]
    version: int
    kind: str


class SearchScores(BaseModel):
    fts_rank: int | None
    vector_rank: int | None
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


class ErrorBody(BaseModel):
    detail: Any
