"""Search over what a reader may see of memories and events (sql/queries/recall.sql).

Beyond the fused BM25 and vector scores, three signals lift a row. Each says something true of
any conversation, not of one benchmark, and each was measured on the LoCoMo development half
(benchmarks/locomo.py) alone and together:
- people: a question about a person is most often answered by what that person said, or by a
  memory about them. A row spoken by, or naming, someone the query names gains 20%.
- time: "what did she do in May 2023?" is answered by what was said (or observed) in May 2023.
  A row of a month or year the query names gains 20%.
- session: a conversation is about a few things at a time; where one turn matches well, its
  neighbours are likely to hold the rest of the story. An event gains a quarter of the best
  relevance in its session.
The two sides are weighted equally (alpha 0.5, where the document search uses 0.7): a turn is
short, and its exact words carry more than a vector of it does.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import numpy as np

from pipeline import reindex
from pipeline.db import Q
from pipeline.errors import BadInput
from pipeline.memory.scopes import Scope
from pipeline.providers.embeddings import QueryCache
from pipeline.settings import Settings

MAX_QUERY_CHARS = 2000
ALPHA = 0.5
PEOPLE_LIFT = 0.2
TIME_LIFT = 0.2
SESSION_SHARE = 0.25
# The full-text side weighs the query's first this many distinct words (a question has fewer;
# a context's default query, the latest user turns, may have many more).
MAX_WORDS = 24
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")


@dataclass(frozen=True)
class RecallQuery:
    query: str
    reader: Scope
    limit: int = 10
    offset: int = 0
    memories: bool = True
    events: bool = False
    session_id: str | None = None
    types: list[str] | None = None
    valid_only: bool = True
    as_of: datetime | None = None
    min_confidence: float | None = None
    after: datetime | None = None
    before: datetime | None = None
    metadata: dict[str, Any] | None = None  # JSON a row's metadata must contain
    include_expired: bool = False  # memories past their layer's lifetime, not yet pruned


@dataclass
class RecallOutcome:
    results: list[dict[str, Any]]
    mode: str
    warnings: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)


def query_times(text: str) -> tuple[list[int] | None, list[int] | None]:
    """The months and years a query names ("in May 2023", "last summer" names none). "May"
    counts as a month only before a year or after "in"/"of": "may" is also a verb."""
    lowered = text.lower()
    months = [i + 1 for i, name in enumerate(MONTHS)
              if re.search(rf"\b{name}\b", lowered) and (name != "may" or re.search(
                  r"\b(in|of|early|late|mid)\s+may\b|\bmay\s+\d{4}\b", lowered))]
    years = [int(y) for y in re.findall(r"\b(1[89]\d\d|2[01]\d\d)\b", lowered)]
    return months or None, sorted(set(years)) or None


def query_words(text: str) -> str:
    """The query as words_of() (migration 0011) writes text, padded with spaces."""
    return " " + " ".join(re.findall(r"[^\W_]+", text.lower())) + " "


async def search(pool: asyncpg.Pool, queries: QueryCache, settings: Settings, *,
                 tenant_id: int, params: RecallQuery) -> RecallOutcome:
    text = params.query.strip()
    if not text:
        raise BadInput("query must not be empty")
    if len(text) > MAX_QUERY_CHARS:
        raise BadInput(f"query is longer than {MAX_QUERY_CHARS} characters")
    warnings: list[str] = []
    timings: dict[str, float] = {}
    mode = "hybrid"
    vector = np.zeros(settings.embedding_dim, dtype=np.float32)
    started = time.perf_counter()
    try:
        vector = await queries.embed_query(text)
    except Exception as exc:  # noqa: BLE001 - full text still answers
        warnings.append(f"embedder unavailable ({type(exc).__name__}); fell back to fts")
        mode = "fts"
    timings["embed"] = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    rows = await pool.fetch(
        Q["recall.search"], tenant_id, text, vector, params.reader.user_id,
        params.reader.agent_id, params.memories, params.events, params.session_id,
        params.types, params.valid_only, params.as_of, params.min_confidence, params.after,
        params.before, ALPHA if mode == "hybrid" else 0.0,
        reindex.model_key(settings), mode == "hybrid", query_words(text), PEOPLE_LIFT,
        SESSION_SHARE, params.limit, params.offset, *query_times(text), TIME_LIFT, MAX_WORDS,
        params.metadata, params.include_expired)
    timings["sql"] = (time.perf_counter() - started) * 1000
    return RecallOutcome([result(r) for r in rows], mode, warnings, timings)


def result(row: asyncpg.Record) -> dict[str, Any]:
    scores = {"vector": row["vector_score"], "fts": row["fts_score"],
              "relevance": float(row["relevance"]), "names_person": row["names_person"],
              "names_time": row["names_time"]}
    if row["kind"] == "memory":
        return {"kind": "memory", "id": str(row["memory_id"]), "score": float(row["score"]),
                "type": row["type"], "content": row["memory_content"],
                "confidence": row["confidence"], "observed_at": row["observed_at"],
                "valid_until": row["valid_until"], "version": row["version"],
                "pinned": row["pinned"], "created_at": row["memory_created_at"],
                "source_events": row["source_events"], "metadata": row["metadata"],
                "layer": row["layer"], "source": row["source"], "scores": scores}
    return {"kind": "event", "id": row["id"], "score": float(row["score"]),
            "session_id": row["session_id"], "event_id": row["event_id"], "role": row["role"],
            "sender_name": row["sender_name"], "content": row["event_content"],
            "created_at": row["event_created_at"], "metadata": row["metadata"],
            "scores": scores}
