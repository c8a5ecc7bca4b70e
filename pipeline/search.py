"""Hybrid search: full-text and vector candidates fused by normalized Reciprocal Rank Fusion,
then blended with rerank signals (recency, access). The SQL is in sql/queries/search.sql."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import asyncpg
import numpy as np

from pipeline import reindex
from pipeline.db import Q
from pipeline.errors import BadInput
from pipeline.providers.embeddings import QueryCache
from pipeline.settings import Settings

log = logging.getLogger(__name__)

Mode = Literal["hybrid", "fts", "semantic"]
MAX_QUERY_CHARS = 2000


@dataclass(frozen=True)
class SearchParams:
    query: str
    mode: Mode = "hybrid"
    limit: int = 10
    offset: int = 0
    alpha: float | None = None
    k: int | None = None
    blend: float | None = None


@dataclass
class SearchOutcome:
    results: list[dict[str, Any]]
    mode: str
    warnings: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)


def _alpha_for(mode: str, alpha: float) -> float:
    """A single-list mode puts all the weight on its list, so its scores still span [0, 1]."""
    return {"semantic": 1.0, "fts": 0.0}.get(mode, alpha)


async def search(
    pool: asyncpg.Pool,
    queries: QueryCache,
    settings: Settings,
    *,
    tenant_id: int,
    params: SearchParams,
) -> SearchOutcome:
    text = params.query.strip()
    if not text:
        raise BadInput("query must not be empty")
    if len(text) > MAX_QUERY_CHARS:
        raise BadInput(f"query is longer than {MAX_QUERY_CHARS} characters")
    mode: str = params.mode
    warnings: list[str] = []
    timings: dict[str, float] = {}
    vector = np.zeros(settings.embedding_dim, dtype=np.float32)
    if mode in ("hybrid", "semantic"):
        started = time.perf_counter()
        try:
            vector = await queries.embed_query(text)
        except Exception as exc:
            if mode == "semantic":
                raise
            log.warning("query embedding failed, falling back to full-text search: %s", exc)
            warnings.append(f"embedder unavailable ({type(exc).__name__}); fell back to fts")
            mode = "fts"
        timings["embed"] = (time.perf_counter() - started) * 1000
    alpha = _alpha_for(mode, settings.rrf_alpha if params.alpha is None else params.alpha)
    started = time.perf_counter()
    rows = await pool.fetch(
        Q["search.hybrid"],
        tenant_id,
        text,
        vector,
        max(settings.search_candidates, params.limit + params.offset),
        alpha,
        mode != "fts",
        mode != "semantic",
        settings.rrf_k if params.k is None else params.k,
        settings.rerank_blend if params.blend is None else params.blend,
        settings.recency_half_life_days,
        params.limit,
        params.offset,
        reindex.model_key(settings),
    )
    timings["sql"] = (time.perf_counter() - started) * 1000
    return SearchOutcome(
        results=[_result(r) for r in rows], mode=mode, warnings=warnings, timings_ms=timings
    )


def _result(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "part_id": row["id"],
        "position": row["position"],
        "text": row["text"],
        "snippet": row["snippet"],
        "item": {
            "id": row["item_id"],
            "title": row["title"],
            "summary": row["summary"],
            "tags": row["tags"],
            "version": row["version"],
            "kind": row["kind"],
        },
        "scores": {
            "fts_rank": row["fts_rank"],
            "vector_rank": row["vector_rank"],
            "fused": float(row["fused"]),
            "final": float(row["final"]),
        },
    }


async def touch(pool: asyncpg.Pool, tenant_id: int, item_ids: list[str]) -> None:
    """Record that these items were returned; one batched statement, run after the response."""
    if item_ids:
        await pool.execute(Q["search.touch_items"], tenant_id, sorted(set(item_ids)))
