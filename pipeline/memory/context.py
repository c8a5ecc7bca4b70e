"""Packing memories, a session summary and turns into one text within a token budget: the pure
part of `POST /v1/context`, so every budget rule is testable without a database.

Sections always come in the same order (the user's profile, working memory, pinned, memories,
summary, relevant turns, recent turns), most stable first, so a caller can cache the prompt
prefix across calls. They are filled in a different order, by priority: the latest turns are
reserved first (an agent that loses the last thing said is lost), then the profile, the
working memory and pinned memories, then memories and relevant past turns taken alternately
in relevance order, so neither kind can starve the other, then the summary.

Relevant past turns are shown under a line of their day ("On 8 May 2023:") rather than each
with its date and time: a date costs about eight tokens, and a day's turns share one, so a
budget holds a fifth more turns (on LoCoMo, context recall at 1000 tokens rose from 0.84 to
0.85 this way).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import zip_longest
from typing import Any

from pipeline.memory.tokens import count_many, truncate_to_tokens

HEADERS = {
    "profile": "## About the user",
    "working_memory": "## Working memory",
    "pinned": "## Pinned",
    "memories": "## Memories",
    "summary": "## Summary",
    "relevant_turns": "## Relevant past turns",
    "recent_turns": "## Recent turns",
}
SECTION_ORDER = tuple(HEADERS)
# WordPiece counts no whitespace, but the model the context is for usually does: each line is
# charged for its newline and each section for the blank line around it, so the estimate is an
# upper bound of the real count and leaves room for a BPE tokenizer's newlines.
NEWLINE_TOKENS = 1
SECTION_GAP_TOKENS = 2
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class MemoryLine:
    """A memory as the context shows it; `source_events` are (session_id, event_id) pairs."""

    id: str
    type: str
    content: str
    observed_at: datetime | None
    source_events: tuple[tuple[str, str], ...]
    pinned: bool = False


@dataclass(frozen=True)
class TurnLine:
    """One event of a session as the context shows it."""

    session_id: str
    event_id: str
    role: str
    sender_name: str | None
    content: str
    created_at: datetime


@dataclass(frozen=True)
class Section:
    """Where the budget went, so a caller can see what crowded out what."""

    name: str
    tokens: int  # the header included


@dataclass
class PackedContext:
    """The rendered text plus what it holds, so the API can cite sources without parsing it."""

    context: str
    sections: list[Section]
    truncated: bool  # something given was left out or cut short to fit the budget
    included: list[dict[str, Any]]  # what the context shows, in the order it shows it


@dataclass
class _Item:
    section: str
    text: str
    entry: dict[str, Any]
    tokens: int = 0
    created_at: datetime | None = None  # orders relevant turns once they are chosen
    day: str | None = None  # the day line a relevant turn is shown under


def _one_line(text: str) -> str:
    """One item per line keeps the context compact and lets a reader (or a model) tell items
    apart without any markup."""
    return _SPACES.sub(" ", text).strip()


def _memory_item(section: str, memory: MemoryLine) -> _Item:
    date = f"[{memory.observed_at:%Y-%m-%d}] " if memory.observed_at else ""
    text = f"- {date}({memory.type}) {_one_line(memory.content)}"
    sources = [{"session_id": s, "event_id": e} for s, e in memory.source_events]
    return _Item(section, text, {"kind": "memory", "id": memory.id, "source_events": sources})


def _turn_key(turn: TurnLine) -> str:
    return f"{turn.session_id}/{turn.event_id}"


def _turn_item(section: str, turn: TurnLine) -> _Item:
    speaker = turn.sender_name or turn.role
    entry = {"kind": "event", "id": _turn_key(turn), "session_id": turn.session_id,
             "event_id": turn.event_id}
    if section == "relevant_turns":
        day = f"On {turn.created_at.day} {turn.created_at:%B %Y}:"
        return _Item(section, f"{speaker}: {_one_line(turn.content)}", entry,
                     created_at=turn.created_at, day=day)
    text = f"[{turn.created_at:%Y-%m-%d %H:%M}] {speaker}: {_one_line(turn.content)}"
    return _Item(section, text, entry, created_at=turn.created_at)


def _interleave(first: Sequence[_Item], second: Sequence[_Item]) -> Iterator[_Item]:
    for a, b in zip_longest(first, second):
        if a is not None:
            yield a
        if b is not None:
            yield b


def _unique(items: Sequence[_Item], seen: set[tuple[str, str]]) -> list[_Item]:
    """Items not in `seen`, adding theirs: the same memory or turn is shown once."""
    kept = []
    for item in items:
        key = (item.entry["kind"], item.entry["id"])
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


class _Budget:
    """Tokens left, charging a section's header and gap with its first item."""

    def __init__(self, max_tokens: int, header_tokens: dict[str, int]) -> None:
        self.left = max_tokens
        self.header_tokens = header_tokens  # sections' headers and relevant turns' day lines
        self.opened: set[str] = set()
        self.chosen: list[_Item] = []
        self.truncated = False

    def cost(self, items: Sequence[_Item]) -> int:
        new = {item.section for item in items} - self.opened
        days = {item.day for item in items if item.day} - self.opened
        lines = sum(item.tokens + NEWLINE_TOKENS for item in items)
        return (lines + sum(self.header_tokens[s] + SECTION_GAP_TOKENS for s in new)
                + sum(self.header_tokens[d] + NEWLINE_TOKENS for d in days))

    def add(self, item: _Item) -> bool:
        """Take `item` if it fits; a miss marks the context truncated but smaller items
        after it may still fit."""
        cost = self.cost([item])
        if cost > self.left:
            self.truncated = True
            return False
        self.left -= cost
        self.opened.add(item.section)
        if item.day:
            self.opened.add(item.day)
        self.chosen.append(item)
        return True


def _reserve_recent(budget: _Budget, recent: list[_Item], *, max_tokens: int) -> None:
    """The latest turns go first. One pasted document must not eat the whole budget, so each
    turn is cut to an eighth of it; if they still do not fit, the oldest go."""
    cap = max(1, max_tokens // 8)
    long = [item for item in recent if item.tokens > cap]
    for item in long:
        item.text = truncate_to_tokens(item.text, cap)
    for item, tokens in zip(long, count_many([item.text for item in long]), strict=True):
        item.tokens = tokens
    if long:
        budget.truncated = True
    while recent and budget.cost(recent) > budget.left:
        recent = recent[1:]
        budget.truncated = True
    for item in recent:
        budget.add(item)


def _render(
    chosen: Sequence[_Item], header_tokens: dict[str, int]
) -> tuple[str, list[Section], list[dict[str, Any]]]:
    by_section: dict[str, list[_Item]] = {name: [] for name in SECTION_ORDER}
    for item in chosen:
        by_section[item.section].append(item)
    # Found by relevance, read in time order: a conversation makes sense forwards.
    by_section["relevant_turns"].sort(key=lambda item: (item.created_at, item.entry["id"]))
    blocks, sections, included = [], [], []
    for name, items in by_section.items():
        if items:
            lines, tokens, day = [HEADERS[name]], header_tokens[name], None
            for item in items:
                if item.day and item.day != day:
                    day = item.day
                    lines.append(day)
                    tokens += header_tokens[day]
                lines.append(item.text)
                tokens += item.tokens
            blocks.append("\n".join(lines))
            sections.append(Section(name, tokens))
            included.extend(item.entry for item in items)
    return "\n\n".join(blocks), sections, included


def pack_context(
    *,
    pinned: Sequence[MemoryLine],
    memories: Sequence[MemoryLine],
    summary: str | None,
    relevant_turns: Sequence[TurnLine],
    recent_turns: Sequence[TurnLine],
    max_tokens: int,
    keep_recent: int = 6,
    session_id: str | None = None,
    profile: Sequence[tuple[str, str]] = (),
    working_memory: tuple[str, str] | None = None,
    observations: Sequence[MemoryLine] = (),
) -> PackedContext:
    """The context for an agent's next call, never over `max_tokens` by our tokenizer.

    `memories` and `relevant_turns` come best first, `recent_turns` oldest first; `session_id`
    names the session `summary` belongs to; `profile` holds (topic, line) pairs and
    `working_memory` (level, text). `observations` (consolidation's summaries of sessions,
    best first) are shown with the memories but take only what the budget has left at the
    end: they restate memories and turns, which say it more exactly (on LoCoMo, taken like
    memories they cost 0.7 points of context recall). Every candidate line is counted once,
    in one batch.
    """
    if max_tokens < 0 or keep_recent < 0:
        raise ValueError("max_tokens and keep_recent must not be negative")
    window = list(recent_turns)[-keep_recent:] if keep_recent else []
    recent = [_turn_item("recent_turns", turn) for turn in window]
    pinned_items = [_memory_item("pinned", m) for m in pinned]
    memory_items = [_memory_item("memories", m) for m in memories]
    observation_items = [_memory_item("memories", m) for m in observations]
    turn_items = [_turn_item("relevant_turns", t) for t in relevant_turns]
    summary_items: list[_Item] = []
    if summary and summary.strip():
        entry = {"kind": "summary", "id": session_id}
        summary_items.append(_Item("summary", summary.strip(), entry))

    profile_items = [_Item("profile", _one_line(line), {"kind": "profile", "id": topic})
                     for topic, line in profile]
    working_items: list[_Item] = []
    if working_memory and working_memory[1].strip():
        level, text = working_memory
        working_items.append(_Item("working_memory", text.strip(),
                                   {"kind": "working_memory", "id": level}))

    candidates = [*recent, *profile_items, *working_items, *pinned_items, *memory_items,
                  *turn_items, *summary_items, *observation_items]
    labels = [*(HEADERS[name] for name in SECTION_ORDER),
              *sorted({item.day for item in turn_items if item.day})]
    counts = count_many(labels + [i.text for i in candidates])
    header_tokens = dict(zip(labels, counts, strict=False))
    header_tokens.update({name: header_tokens[HEADERS[name]] for name in SECTION_ORDER})
    for item, tokens in zip(candidates, counts[len(labels):], strict=True):
        item.tokens = tokens

    budget = _Budget(max_tokens, header_tokens)
    _reserve_recent(budget, recent, max_tokens=max_tokens)
    seen = {(item.entry["kind"], item.entry["id"]) for item in budget.chosen}
    for item in [*profile_items, *working_items]:
        budget.add(item)
    for item in _unique(pinned_items, seen):
        budget.add(item)
    for item in _interleave(_unique(memory_items, seen), _unique(turn_items, seen)):
        budget.add(item)
    for item in [*summary_items, *_unique(observation_items, seen)]:
        budget.add(item)

    # No recount of the whole text (it took 4 ms of a 1000-token context): WordPiece splits
    # at whitespace first, so the lines' counts add up to the text's, and each line is charged
    # a newline besides (tests/test_context_pack.py checks the sum on random contexts).
    context, sections, included = _render(budget.chosen, header_tokens)
    return PackedContext(context, sections, budget.truncated, included)
