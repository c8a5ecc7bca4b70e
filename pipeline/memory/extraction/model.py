"""What extraction works on and what it produces; shared by the extractors, the deciders and
the `extract` job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

Action = Literal["ADD", "UPDATE", "SUPERSEDE", "NOOP_DUPLICATE"]
ACTIONS: tuple[Action, ...] = ("ADD", "UPDATE", "SUPERSEDE", "NOOP_DUPLICATE")


@dataclass(frozen=True)
class Turn:
    """One event of a session, as extraction reads it."""

    session_id: str
    event_id: str
    role: str  # user, assistant, tool, system
    sender_name: str | None
    content: str
    created_at: datetime  # timezone-aware: the client's timestamp of the event


@dataclass(frozen=True)
class Proposal:
    """A memory an extractor proposes; `observed_at` is when it became true, with relative
    dates ("yesterday", "last week") resolved against the source events' timestamps."""

    type: str
    content: str
    confidence: float
    observed_at: datetime | None
    source_events: tuple[tuple[str, str], ...]  # (session_id, event_id)
    hints: tuple[str, ...] = field(default=())


class Extractor(Protocol):
    name: str

    async def extract(self, turns: Sequence[Turn], *, types: Sequence[str]) -> list[Proposal]:
        """Proposals from the turns; `types` are the memory types the tenant may use."""
        ...


@dataclass(frozen=True)
class Similar:
    """A memory of the proposal's scope that resembles it. `index` is all a model is shown of
    it (never its id), so a model cannot name a memory that was not offered."""

    index: int
    type: str
    content: str
    similarity: float
    observed_at: datetime | None


@dataclass(frozen=True)
class Decision:
    action: Action
    target: int | None  # the Similar.index acted on: UPDATE, SUPERSEDE, NOOP_DUPLICATE
    reason: str
    content: str  # what to store: the proposal's text, or for UPDATE the merged text


class Decider(Protocol):
    name: str

    async def decide(self, proposal: Proposal, similar: Sequence[Similar]) -> Decision: ...
