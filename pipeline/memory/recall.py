"""Search over what a reader may see of memories and events (sql/queries/recall.sql).

Beyond the fused BM25 and vector scores, two signals lift a row; each says something true of
any conversation, not of a benchmark:
- people: a question about a person is most often answered by what that person said, or by a
  memory about them. A row spoken by, or naming, someone the query names gains `people`.
- neighbours: an answer follows its question. An event gains `neighbours` times the best
  relevance of the turns beside it, so a reply ("Adoption agencies.") is found through the
  question it answers, and a question through its answer.
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
PEOPLE_WEIGHT = 0.1
NEIGHBOUR_WEIGHT = 0.3


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


@dataclass
class RecallOutcome:
    results: list[dict[str, Any]]
    mode: str
    warnings: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)


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
        params.before, settings.search_alpha if mode == "hybrid" else 0.0,
        reindex.model_key(settings), mode == "hybrid", query_words(text), PEOPLE_WEIGHT,
        NEIGHBOUR_WEIGHT, params.limit, params.offset)
    timings["sql"] = (time.perf_counter() - started) * 1000
    return RecallOutcome([result(r) for r in rows], mode, warnings, timings)


def result(row: asyncpg.Record) -> dict[str, Any]:
    scores = {"vector": row["vector_score"], "fts": row["fts_score"],
              "relevance": float(row["relevance"]), "names_person": row["names_person"]}
    if row["kind"] == "memory":
        return {"kind": "memory", "id": str(row["memory_id"]), "score": float(row["score"]),
                "type": row["type"], "content": row["memory_content"],
                "confidence": row["confidence"], "observed_at": row["observed_at"],
                "valid_until": row["valid_until"], "version": row["version"],
                "pinned": row["pinned"], "created_at": row["memory_created_at"],
                "source_events": row["source_events"], "scores": scores}
    return {"kind": "event", "id": row["id"], "score": float(row["score"]),
            "session_id": row["session_id"], "event_id": row["event_id"], "role": row["role"],
            "sender_name": row["sender_name"], "content": row["event_content"],
            "created_at": row["event_created_at"], "scores": scores}
