"""Request and response models of memory upkeep: relations, the tenant's memory policy and
consolidation runs. Requests are strict like the rest of the API (api/schemas.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field, StrictBool

from api.memory_schemas import Layer, MemoryPublic, ScopeIn
from api.schemas import SafeStr, Strict, json_int

RelationKind = Literal["supersedes", "related_to", "derived_from"]
Step = Literal["prune", "promote", "merge", "decay", "link"]
Similarity = Annotated[float, Field(gt=0, le=1)]
Days = Annotated[float, Field(gt=0, le=36_500)]


# relations ---------------------------------------------------------------------------------


class RelationCreate(Strict):
    scope: ScopeIn
    kind: RelationKind = Field(description=(
        "`supersedes`: this memory replaces `to_id`; `related_to`: they are about the same "
        "thing; `derived_from`: this memory was concluded from `to_id`."))
    to_id: Annotated[UUID, Field(strict=False)]


class RelationPublic(BaseModel):
    from_id: UUID
    kind: RelationKind
    to_id: UUID
    score: float | None = Field(description="The similarity a consolidation linked them at.")
    run_id: UUID | None = Field(description="The consolidation run that wrote it, if one did.")
    created_at: datetime


class ReferenceCreate(Strict):
    scope: ScopeIn
    item_id: SafeStr = Field(min_length=1, max_length=512)
    position: json_int(ge=0, le=10_000_000) | None = Field(  # type: ignore[valid-type]
        default=None, description="A part of the item's current version; none: the item.")


class ReferencePublic(BaseModel):
    item_id: str
    position: int | None


class RelatedNode(BaseModel):
    depth: int = Field(description="Relations between it and the memory walked from.")
    memory: MemoryPublic


class RelatedWalk(BaseModel):
    memory_id: UUID
    depth: int
    nodes: list[RelatedNode] = Field(description="Nearest first, at most 200.")
    edges: list[RelationPublic] = Field(description="The relations among these memories.")
    references: list[ReferencePublic] = Field(description="The items the memory references.")
    truncated: bool


# policy ------------------------------------------------------------------------------------


class PolicyUpdate(Strict):
    lifetimes: dict[Layer, Days | None] | None = Field(default=None, description=(
        "Days each layer lives; null: permanent (pinned, observation and profile always are). "
        "A layer left out keeps its lifetime. Every memory of a changed layer gets its new "
        "expiry, counted from when it was written."))
    memory_cap: json_int(ge=1, le=10**12) | None = None  # type: ignore[valid-type]
    schedule: SafeStr | None = Field(default=None, max_length=200, description=(
        "When consolidation runs: a cron expression of five fields, in UTC "
        "(`0 3 * * *`: daily at 03:00)."))
    merge_similarity: Similarity | None = None
    link_similarity: Similarity | None = None


class PolicyPublic(BaseModel):
    lifetimes: dict[str, float | None]
    memory_cap: int
    schedule: str
    merge_similarity: float
    link_similarity: float
    overrides: dict[str, Any] = Field(description=(
        "What the tenant set itself; the rest is the installation's default."))
    next_consolidation: datetime | None
    next_prune: datetime | None
    expiries_moved: int | None = Field(default=None, description=(
        "How many memories' expiry this change moved."))


# runs --------------------------------------------------------------------------------------


class RunCreate(Strict):
    scope: ScopeIn | None = Field(default=None, description=(
        "Only these memories (a user's, an agent's); none: the whole tenant. The cap on "
        "memories is the tenant's, so a prune over a scope removes only expired memories."))
    dry_run: StrictBool = Field(default=False, description=(
        "Record what each step would change, and change nothing."))
    steps: list[Step] = Field(default=["promote", "merge", "decay", "link"], min_length=1,
                              max_length=5, description=(
                                  "Run in the order prune, promote, merge, decay, link."))
    merge_similarity: Similarity | None = Field(default=None, description=(
        "For this run only; default: the tenant's policy."))
    link_similarity: Similarity | None = None


class RunPublic(BaseModel):
    id: UUID
    status: Literal["pending", "running", "done", "failed", "cancelled", "undone"]
    steps: list[str]
    dry_run: bool
    trigger: Literal["request", "schedule"]
    scope: dict[str, str]
    options: dict[str, float]
    counts: dict[str, dict[str, Any]] = Field(description="Each finished step's counts.")
    changes: dict[str, dict[str, int]] = Field(description=(
        "Changes recorded, by step and action (GET …/changes lists them)."))
    created_at: datetime
    finished_at: datetime | None
    undone_at: datetime | None
    undo: dict[str, Any] | None
    error: str | None


class RunAccepted(BaseModel):
    run_id: UUID
    operation_id: UUID = Field(description="The same id, as an operation.")
    run: RunPublic


class RunsPage(BaseModel):
    data: list[RunPublic]
    next_cursor: str | None


class ChangePublic(BaseModel):
    seq: int
    step: Step
    action: Literal["expire", "cap", "promote", "drop", "merge", "keep", "decay", "reinforce",
                    "invalidate", "link", "observe"]
    memory_id: UUID
    other_id: UUID | None
    detail: dict[str, Any]
    after_version: int | None


class ChangesPage(BaseModel):
    data: list[ChangePublic]
    next_after: int | None = Field(description="Pass as `after` for the next page.")


class UndoSkip(BaseModel):
    memory_id: UUID
    reason: str


class UndoReport(BaseModel):
    restored: int
    reinserted: int
    observations_deleted: int
    promotions_deleted: int
    inbox_reopened: int
    relations_removed: int
    skipped: list[UndoSkip]
    at: datetime


# inbox -------------------------------------------------------------------------------------


class InboxEntry(BaseModel):
    id: UUID
    user_id: str | None
    agent_id: str | None
    session_id: str | None
    visibility: str
    type: str
    content: str
    confidence: float = Field(description="What extraction gave it.")
    attention: float = Field(description=(
        "Its confidence, raised each time the same observation was heard again."))
    heard: int
    observed_at: datetime | None
    source_events: list[dict[str, str]]
    status: Literal["waiting", "promoted", "dropped"]
    memory_id: UUID | None = Field(description="The memory it was promoted to.")
    created_at: datetime
    last_heard_at: datetime
    decided_at: datetime | None


class InboxPage(BaseModel):
    data: list[InboxEntry] = Field(description="Most attention first.")
