"""Hybrid search: BM25 full-text and vector candidates, each scored on both sides, fused into
[0, 1] (normalized scores by default, or Reciprocal Rank Fusion), then blended with rerank
signals (recency, access). The SQL is in sql/queries/search.sql."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
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
Fusion = Literal["score", "rrf"]
GroupBy = Literal["part", "item"]
MAX_QUERY_CHARS = 2000
MAX_CANDIDATES = 1000
# How search.hybrid applies a filter ($16): not at all, to the items listed, to each
# candidate's item, or to the tags the parts carry (decided in the statement, see `tagged`).
FILTER_NONE, FILTER_LISTED, FILTER_CHECKED, FILTER_TAGGED = 0, 1, 2, 3


@dataclass(frozen=True)
class SearchFilters:
    """What a result's item must match; every field set narrows, an empty filter keeps all.
    `tags` maps a key to the values any one of which it may have."""

    tags: dict[str, str | list[str]] = field(default_factory=dict)
    kinds: list[str] | None = None
    item_ids: list[str] | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    valid_only: bool = False

    @property
    def active(self) -> bool:
        return self != SearchFilters()

    @property
    def tags_only(self) -> bool:
        """Whether the parts' own tags decide the filter, with no item to look up."""
        return bool(self.tags) and self == SearchFilters(tags=self.tags)

    def sql_args(self) -> tuple[Any, ...]:
        """The filter as search_item_matches() takes it (after the item)."""
        return (tags_predicate(self.tags), self.kinds, self.item_ids, self.created_after,
                self.created_before, self.updated_after, self.updated_before, self.valid_only)


def tags_predicate(tags: Mapping[str, str | list[str]], tenant_id: int | None = None) -> str | None:
    """A jsonpath predicate that holds when every key has one of its values, e.g.
    `($."lang" == "en" || $."lang" == "fr") && $."team" == "core"`. Keys and values are
    written as JSON strings, whose escapes jsonpath reads the same way, so no text of the
    caller's can change the predicate's shape; Postgres answers it from the GIN index. With
    `tenant_id`, the paths start under the tenant's key, as parts store their tags
    (`parts.tenant_tags`, migration 0008)."""
    if not tags:
        return None
    root = "$" if tenant_id is None else f'$."{int(tenant_id)}"'
    clauses = []
    for key, values in tag_options(tags).items():
        path = f"{root}.{json.dumps(key, ensure_ascii=False)}"
        options = [f"{path} == {json.dumps(v, ensure_ascii=False)}" for v in values]
        clauses.append(options[0] if len(options) == 1 else f"({' || '.join(options)})")
    return " && ".join(clauses)


def tag_options(tags: Mapping[str, str | list[str]]) -> dict[str, list[str]]:
    """Each key's accepted values: one value, or any of these."""
    return {key: [wanted] if isinstance(wanted, str) else wanted for key, wanted in tags.items()}


@dataclass(frozen=True)
class SearchParams:
    query: str
    mode: Mode = "hybrid"
    limit: int = 10
    offset: int = 0
    alpha: float | None = None
    k: int | None = None
    blend: float | None = None
    fusion: Fusion | None = None
    group_by: GroupBy = "part"
    filters: SearchFilters = field(default_factory=SearchFilters)


FilterPath = Literal["exact", "checked"]


@dataclass
class SearchOutcome:
    results: list[dict[str, Any]]
    mode: str
    warnings: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    # How a filter was applied: its parts ranked exactly, or HNSW candidates checked; None
    # without a filter, or for a tag filter that found nothing (the statement decides).
    filter_path: FilterPath | None = None


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
    filter_pool: asyncpg.Pool,
) -> SearchOutcome:
    """One round trip to Postgres for a search without a filter or with tags alone, two for
    any other filter. `pool` should plan generically (`db.create_pool(...,
    generic_plans=True)`): the statement is written so that one plan fits every combination
    of options, and planning it anew would cost about 2 ms a search. `filter_pool` lists the
    items a filter passes and should plan each call for its values (a default pool), so the
    GIN index on tags or the key answers."""
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
    alpha = _alpha_for(mode, settings.search_alpha if params.alpha is None else params.alpha)
    started = time.perf_counter()
    filter_mode, listed = FILTER_NONE, None
    if params.filters.tags_only:
        filter_mode = FILTER_TAGGED
    elif params.filters.active:
        filter_mode, listed = await filtered_items(filter_pool, tenant_id, params.filters,
                                                    settings.search_exact_items)
    args = hybrid_args(tenant_id, text, vector, mode, alpha, params, settings, filter_mode,
                       listed)
    async with pool.acquire() as conn:
        rows = await conn.fetch(Q["search.hybrid"], *args)
    timings["sql"] = (time.perf_counter() - started) * 1000
    return SearchOutcome(
        results=[_result(r) for r in rows], mode=mode, warnings=warnings, timings_ms=timings,
        filter_path=_filter_path(filter_mode, rows),
    )


def hybrid_args(tenant_id: int, text: str, vector: np.ndarray, mode: str, alpha: float,
                params: SearchParams, settings: Settings, filter_mode: int,
                listed: list[str] | None) -> tuple[Any, ...]:
    """search.hybrid's parameters, $1 to $29, in order (the statement's header says what each
    is); apart from search(), tests read the statement's plan with them."""
    return (
        tenant_id,
        text,
        vector,
        _candidates(params, settings),
        alpha,
        mode != "fts",
        mode != "semantic",
        settings.rrf_k if params.k is None else params.k,
        settings.rerank_blend if params.blend is None else params.blend,
        settings.recency_half_life_days,
        params.limit,
        params.offset,
        reindex.model_key(settings),
        params.fusion or settings.search_fusion,
        fts_postings(params, mode, settings),
        filter_mode,
        listed,
        *params.filters.sql_args(),
        params.group_by == "item",
        tags_predicate(params.filters.tags, tenant_id) if filter_mode == FILTER_TAGGED else None,
        settings.search_exact_parts,
        tag_options(params.filters.tags),
    )


def _filter_path(filter_mode: int, rows: list[asyncpg.Record]) -> FilterPath | None:
    if filter_mode == FILTER_TAGGED:  # decided in the statement, told on every row
        exact = rows[0]["filter_exact"] if rows else None
    else:
        exact = {FILTER_LISTED: True, FILTER_CHECKED: False}.get(filter_mode)
    return None if exact is None else "exact" if exact else "checked"


async def filtered_items(pool: asyncpg.Pool, tenant_id: int, filters: SearchFilters,
                          exact_items: int) -> tuple[int, list[str] | None]:
    """How the search applies a filter: with the list of items that pass when they are few
    (at least `exact_items`, more in a large tenant: see search.filtered_items), by checking
    each candidate's item otherwise."""
    row = await pool.fetchrow(Q["search.filtered_items"], tenant_id, *filters.sql_args(),
                              exact_items)
    assert row is not None  # one row always
    if len(row["ids"]) <= row["few"]:
        return FILTER_LISTED, row["ids"]
    return FILTER_CHECKED, None


def _parts_for(params: SearchParams, results: int) -> int:
    """The parts it takes to fill `results` places: twice as many when results are items,
    since an item's several parts can fill several candidate places."""
    return results * (2 if params.group_by == "item" else 1)


def _candidates(params: SearchParams, settings: Settings) -> int:
    """Candidates per side: enough for the page asked for and those before it."""
    wanted = _parts_for(params, params.limit + params.offset)
    return min(max(settings.search_candidates, wanted), MAX_CANDIDATES)


def fts_postings(params: SearchParams, mode: str, settings: Settings) -> int:
    """How many postings of the query's rarest words the full-text side may read ($15).

    Alone, that side finds every result, so it gets the whole budget. In a hybrid search
    every vector candidate is BM25-scored as well, and the full-text side only adds parts
    that hold the query's rarest words; postings in proportion to the page size are enough
    for the page's ranking (SciFact: the same nDCG@10 from 20 to 1000 postings at limit 10),
    while the deepest pages need more (Recall@100 of 100 items: 0.962 with 1000 postings,
    0.952 with 300). The page's size sets it, not its offset, so that paging through results
    with one page size walks one ranking. A hybrid search whose rarest word alone has more
    postings than this reads the parts holding both of its two rarest words (`pair_keys` in
    search.sql)."""
    if mode == "fts":
        return settings.fts_candidate_postings
    page = _parts_for(params, params.limit)
    return min(settings.fts_candidate_postings, settings.hybrid_postings_per_result * page)


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
            "fts": row["fts_score"],
            "vector": row["vector_score"],
            "fused": float(row["fused"]),
            "final": float(row["final"]),
        },
    }


async def touch(pool: asyncpg.Pool, tenant_id: int, item_ids: list[str]) -> None:
    """Record that these items were returned; one batched statement, run after the response."""
    if item_ids:
        await pool.execute(Q["search.touch_items"], tenant_id, sorted(set(item_ids)))
