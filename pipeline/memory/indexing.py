"""What an event is indexed by. A turn alone often is not enough to find it: an answer
("Adoption agencies.") says nothing of the question it answers, and "yesterday" means nothing
without the day it was said. So each event is indexed with its speaker, its date, and the turns
it follows in its session, as they stand when it is written (a later turn is not known yet).
The stored content stays the turn itself; only the index sees the context."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Neighbour:
    sender_name: str | None
    role: str
    content: str
    created_at: datetime


def speaker(sender_name: str | None, role: str) -> str:
    return sender_name or role


def date_words(at: datetime) -> str:
    """The date as words a query may use: "8 May 2023" ("May", "2023" and the day)."""
    return f"{at.day} {at:%B %Y}"


def event_texts(sender_name: str | None, role: str, content: str, created_at: datetime,
                earlier: Sequence[Neighbour]) -> tuple[str, str]:
    """(search_text, embed_text) of an event: the full-text side reads the turn, its
    speaker, date and the turns before it; the vector side embeds the turn with the one
    before it, so that a question and the answer that follows land near each other."""
    own = f"{speaker(sender_name, role)}: {content}"
    before = [f"{speaker(n.sender_name, n.role)}: {n.content}" for n in earlier]
    search_text = "\n".join([own, *before[-1:], date_words(created_at)])
    embed_text = "\n".join([*before[-1:], own])
    return search_text, embed_text
