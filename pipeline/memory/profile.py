"""A user's knowledge profile: the topics they have told an agent about, each with a comfort
level (`beginner`, `learning`, `expert`) and a one-line summary. Context shows it first, so an
agent pitches its answers right from the first turn.

Extraction keeps it current: every user turn it reads passes through `detect`, first-person
statements of how well the speaker knows something ("I'm new to Rust", "I've been learning
Spanish", "I've been writing Python for ten years"), found by patterns like the offline
extractor's, whatever extractor made the memories. A later statement about a topic replaces
the earlier one (people move from beginner to expert); a caller may set or remove a topic.

What it misses: comfort said in other words than the patterns ("Rust? piece of cake"), levels
implied by what someone does, and third-person statements. Topics are the words after the
pattern, up to the first clause break and at most five words, so "I'm new to Rust and its
borrow checker" gives the topic "rust"."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import asyncpg

from pipeline.db import Q
from pipeline.errors import BadInput, NotFound
from pipeline.memory.extraction.model import Turn

Level = Literal["beginner", "learning", "expert"]
LEVELS: tuple[str, ...] = get_args(Level)
MAX_TOPIC_CHARS = 80
MAX_TOPIC_WORDS = 5
MAX_SUMMARY_CHARS = 300
# Topics shown in context at most, most recently updated first.
CONTEXT_TOPICS = 20

_TOPIC = r"(?P<topic>[^.,;:!?()]+)"
_PATTERNS: tuple[tuple[Level, re.Pattern[str]], ...] = tuple(
    (level, re.compile(pattern, re.IGNORECASE)) for level, pattern in (
        ("beginner", r"\bi(?:'m|\s+am)\s+(?:completely\s+|totally\s+|pretty\s+|very\s+)?"
                     r"new\s+(?:to|at|with)\s+" + _TOPIC),
        ("beginner", r"\bi(?:'m|\s+am)\s+(?:a|an|just\s+a|still\s+a)\s+"
                     r"(?:complete\s+|total\s+|absolute\s+)?(?:beginner|novice|newbie)\s+"
                     r"(?:at|in|with)\s+" + _TOPIC),
        ("beginner", r"\bi(?:'ve|\s+have)\s+never\s+(?:used|tried|done|learned|written)\s+"
                     + _TOPIC),
        ("beginner", r"\bi\s+(?:don't|do\s+not)\s+know\s+(?:much|anything)\s+about\s+" + _TOPIC),
        ("learning", r"\bi(?:'m|\s+am)\s+(?:currently\s+|still\s+|slowly\s+)?"
                     r"(?:learning|studying|getting\s+into|taking\s+(?:a\s+)?classes\s+in)\s+"
                     + _TOPIC),
        ("learning", r"\bi(?:'ve|\s+have)\s+(?:just\s+)?(?:been\s+learning|started\s+learning|"
                     r"been\s+studying|started\s+studying)\s+" + _TOPIC),
        ("expert", r"\bi(?:'m|\s+am)\s+(?:an?\s+)?(?:expert|specialist|professional)\s+"
                   r"(?:in|at|on|with)\s+" + _TOPIC),
        ("expert", r"\bi(?:'m|\s+am)\s+fluent\s+in\s+" + _TOPIC),
        ("expert", r"\bi(?:'ve|\s+have)\s+been\s+(?:doing|using|writing|coding\s+in|"
                   r"working\s+with|teaching|practi[cs]ing)\s+(?P<topic>[^.,;:!?()]+?)\s+"
                   r"(?:for\s+(?:over\s+|more\s+than\s+|about\s+)?(?:\d+|two|three|four|five|"
                   r"six|seven|eight|nine|ten|many|several|fifteen|twenty)\s+years|"
                   r"professionally|for\s+a\s+living)"),
        ("expert", r"\bi\s+(?:know|understand)\s+(?P<topic>[^.,;:!?()]+?)\s+"
                   r"(?:inside\s+out|really\s+well|very\s+well|like\s+the\s+back\s+of)"),
        ("expert", r"\bi\s+teach\s+" + _TOPIC),
    ))
# Where the topic ends: a conjunction, a preposition, or a word of time or manner.
_CLAUSE = re.compile(r"\s+(?:and|but|so|because|since|though|although|which|that|when|"
                     r"while|if|as|for|from|at|in|on|with|now|yet|anymore|really|at\s+all|"
                     r"every|each|daily|weekly|lately|recently|these\s+days|this\s+\w+|"
                     r"last|next|online|again|more|a\s+bit|a\s+lot|too|right\s+now|"
                     r"myself|by\s+myself|properly)\b.*$", re.IGNORECASE)
_LEADING = re.compile(r"^(?:the|a|an|some|my|this|these|those|using|how\s+to|to)\s+",
                      re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    topic: str
    level: Level
    summary: str
    source_event: tuple[str, str]


def topic_of(text: str) -> str | None:
    """The topic named after a pattern: lowercase, cut at the first clause break, without a
    leading article, at most five words; None when nothing meaningful is left."""
    topic = _CLAUSE.sub("", " ".join(text.split()))
    while (shorter := _LEADING.sub("", topic)) != topic:
        topic = shorter
    words = topic.lower().strip(" '\"").split()
    if not words or len(words) > MAX_TOPIC_WORDS or words[0] in ("it", "that", "this", "them"):
        return None
    return " ".join(words)[:MAX_TOPIC_CHARS]


def detect(turns: Sequence[Turn], session_id: str, user_name: str | None) -> list[Finding]:
    """What the user's turns say about their comfort with topics, latest statement last."""
    found: list[Finding] = []
    for turn in turns:
        if turn.role != "user":
            continue
        for level, pattern in _PATTERNS:
            for match in pattern.finditer(turn.content):
                topic = topic_of(match.group("topic"))
                if topic is None:
                    continue
                who = turn.sender_name or user_name or "The user"
                summary = f"{who}: {match.group(0).strip()}"[:MAX_SUMMARY_CHARS]
                found.append(Finding(topic, level, summary, (session_id, turn.event_id)))
    return found


async def record(conn: asyncpg.Connection, tenant_id: int, user_id: str,
                 findings: Sequence[Finding]) -> int:
    """Upsert what extraction found, in its transaction; returns how many topics changed."""
    changed = 0
    for f in findings:
        if await conn.fetchval(Q["profile.upsert"], tenant_id, user_id, f.topic, f.level,
                               f.summary, "extraction",
                               [{"session_id": f.source_event[0],
                                 "event_id": f.source_event[1]}]) is not None:
            changed += 1
    return changed


def check_topic(topic: str) -> str:
    cleaned = " ".join(topic.lower().split())
    if not 1 <= len(cleaned) <= MAX_TOPIC_CHARS:
        raise BadInput(f"topic: 1 to {MAX_TOPIC_CHARS} characters")
    return cleaned


async def set_topic(conn: asyncpg.Connection, tenant_id: int, user_id: str, topic: str,
                    level: str, summary: str) -> asyncpg.Record:
    row = await conn.fetchrow(Q["profile.set"], tenant_id, user_id, check_topic(topic), level,
                              summary)
    assert row is not None
    return row


async def remove_topic(conn: asyncpg.Connection, tenant_id: int, user_id: str,
                       topic: str) -> None:
    if await conn.fetchval(Q["profile.delete"], tenant_id, user_id,
                           check_topic(topic)) is None:
        raise NotFound(f"no topic {topic!r} in the profile of {user_id!r}")


async def topics(pool: asyncpg.Pool | asyncpg.Connection, tenant_id: int, user_id: str,
                 limit: int = 200) -> list[asyncpg.Record]:
    return await pool.fetch(Q["profile.topics"], tenant_id, user_id, limit)


def context_lines(rows: Sequence[asyncpg.Record]) -> list[str]:
    """The profile as context shows it: one line per topic."""
    return [f"- {r['topic']}: {r['level']} ({r['summary']})" for r in rows]
