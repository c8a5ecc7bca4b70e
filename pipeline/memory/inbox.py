"""The inbox: observations extraction was not sure enough of to make memories ("maybe I'll
try climbing", said once). A memory store that keeps every such guess fills with noise; one
that drops them loses what turns out to matter. So they wait here, each with an attention
score: its confidence at first, raised by `memory_inbox_boost` each time the same observation
(cosine at least `dedup_similarity` in its scope) is heard again. Consolidation's promote step
(pipeline/memory/upkeep/steps.py) makes memories of those whose attention reached
`memory_inbox_promote`, and drops those that waited `memory_inbox_days` without."""

from __future__ import annotations

from typing import Any

import asyncpg

from pipeline.db import Q
from pipeline.memory import memories
from pipeline.memory.extraction.model import Proposal
from pipeline.settings import Settings


def waits(proposal: Proposal, settings: Settings) -> bool:
    """Whether extraction sends a proposal here rather than to its decisions."""
    return proposal.confidence < settings.memory_inbox_below


async def hear(conn: asyncpg.Connection, *, tenant_id: int, session: asyncpg.Record,
               proposal: Proposal, vector: Any, model: str, settings: Settings) -> str:
    """Put a proposal in the inbox of its session's scope, or raise the attention of the
    waiting observation that says the same; returns which ("added" or "heard")."""
    raised = await conn.fetchval(
        Q["inbox.hear_again"], tenant_id, session["user_id"], session["agent_id"],
        session["visibility"], model, vector, settings.dedup_similarity,
        settings.memory_inbox_boost,
        memories.source_events_json(proposal.source_events))
    if raised is not None:
        return "heard"
    await conn.execute(
        Q["inbox.add"], tenant_id, session["user_id"], session["agent_id"], session["id"],
        session["visibility"], proposal.type, proposal.content, proposal.confidence,
        list(proposal.hints), proposal.observed_at,
        memories.source_events_json(proposal.source_events), vector, model)
    return "added"
