"""`POST /v1/context`: what an agent should see now, within a token budget. Gathers the
user's profile and working memory, the reader's pinned memories, the memories and past turns
most relevant to the query, the session's summary and its latest turns, and packs them
(pipeline/memory/context.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from pipeline.db import Q
from pipeline.errors import BadInput, NotFound
from pipeline.memory import profile, recall, working
from pipeline.memory.context import MemoryLine, PackedContext, TurnLine, pack_context
from pipeline.memory.scopes import Scope
from pipeline.providers.embeddings import QueryCache
from pipeline.settings import Settings

KEEP_RECENT = 6
MAX_PINNED = 50
# Relevant rows asked of the search: more than fit any budget up to a few thousand tokens;
# the packer takes them best first until the budget is spent.
CANDIDATES = 60
# The default query: the session's latest user turns.
QUERY_TURNS = 2
# What consolidation's session observations are written by (pipeline/memory/upkeep/steps.py),
# and how many more rows the search is asked for, so that they need not displace others.
OBSERVATION_SOURCE = "consolidation"
OBSERVATIONS = 10


@dataclass(frozen=True)
class ContextAsk:
    reader: Scope
    session_id: str | None
    query: str | None
    max_tokens: int


def _memory(row: dict[str, Any] | asyncpg.Record, pinned: bool) -> MemoryLine:
    return MemoryLine(
        id=str(row["id"]), type=row["type"], content=row["content"],
        observed_at=row["observed_at"] or row["created_at"],
        source_events=tuple((s["session_id"], s["event_id"]) for s in row["source_events"]),
        pinned=pinned)


def _turn(row: dict[str, Any] | asyncpg.Record) -> TurnLine:
    return TurnLine(session_id=row["session_id"], event_id=row["event_id"], role=row["role"],
                    sender_name=row["sender_name"], content=row["content"],
                    created_at=row["created_at"])


async def build(pool: asyncpg.Pool, search_pool: asyncpg.Pool, queries: QueryCache,
                settings: Settings, *, tenant_id: int, ask: ContextAsk) -> PackedContext:
    """`search_pool` plans generically (see pipeline/search.py): the recall statement takes
    5 ms to plan, and one plan serves every reader."""
    reader = ask.reader
    summary = None
    recent: list[asyncpg.Record] = []
    if ask.session_id is not None:
        session = await pool.fetchrow(Q["events.get_session"], tenant_id, ask.session_id,
                                      reader.user_id, reader.agent_id)
        if session is None:
            raise NotFound(f"no session {ask.session_id!r}")
        summary = session["summary"]
        recent = list(await pool.fetch(Q["events.recent"], tenant_id, ask.session_id,
                                       KEEP_RECENT))
    query = ask.query
    if query is None:
        # The latest turn first: the search weighs a query's first words (recall.MAX_WORDS).
        users = [r["content"] for r in recent if r["role"] == "user"][-QUERY_TURNS:]
        query = " ".join(reversed(users)).strip() or None
        if query is None and ask.session_id is None:
            raise BadInput("query: give a query, or a session_id whose latest turns say what "
                           "the context is for")
    pinned = await pool.fetch(Q["memories.pinned"], tenant_id, reader.user_id, reader.agent_id,
                              MAX_PINNED)
    memories: list[MemoryLine] = []
    observations: list[MemoryLine] = []
    turns: list[TurnLine] = []
    if query:
        found = await recall.search(search_pool, queries, settings, tenant_id=tenant_id,
                                    params=recall.RecallQuery(
                                        query=query[:recall.MAX_QUERY_CHARS], reader=reader,
                                        limit=CANDIDATES + OBSERVATIONS, events=True))
        pinned_ids = {str(r["id"]) for r in pinned}
        # Observations are set aside, and do not take the places of the memories and turns
        # that say what they restate: the candidates are the first CANDIDATES others.
        taken = 0
        for hit in found.results:
            if hit["kind"] == "memory" and hit["source"] == OBSERVATION_SOURCE:
                observations.append(_memory(hit, pinned=False))
                continue
            if taken == CANDIDATES:
                continue
            taken += 1
            if hit["kind"] == "memory" and hit["id"] not in pinned_ids:
                memories.append(_memory(hit, pinned=False))
            elif hit["kind"] == "event":
                turns.append(_turn(hit))
    about: list[tuple[str, str]] = []
    scratch = None
    if reader.user_id is not None:
        rows = await profile.topics(pool, tenant_id, reader.user_id, profile.CONTEXT_TOPICS)
        about = [(r["topic"], line)
                 for r, line in zip(rows, profile.context_lines(rows), strict=True)]
        pad = await working.read(pool, tenant_id, reader.user_id, ask.session_id)
        if pad.content:
            scratch = ("session" if pad.session_id else "user", pad.content)
    return pack_context(
        pinned=[_memory(r, pinned=True) for r in pinned], memories=memories, summary=summary,
        relevant_turns=turns, recent_turns=[_turn(r) for r in recent],
        max_tokens=ask.max_tokens, keep_recent=KEEP_RECENT, session_id=ask.session_id,
        profile=about, working_memory=scratch, observations=observations)
