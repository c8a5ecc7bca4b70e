from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks

from api.deps import CurrentTenant, PoolDep, QueryCacheDep, SearchPoolDep, SettingsDep
from api.schemas import SearchRequest, SearchResponse
from pipeline import search as search_mod

router = APIRouter(prefix="/v1", tags=["search"])


@router.post("/search", response_model=SearchResponse)
async def search(
    body: SearchRequest,
    tenant: CurrentTenant,
    pool: PoolDep,
    search_pool: SearchPoolDep,
    queries: QueryCacheDep,
    settings: SettingsDep,
    background: BackgroundTasks,
) -> SearchResponse:
    """Hybrid search over parts; each result says why it ranked (ranks and scores on both
    sides, fused and final)."""
    outcome = await search_mod.search(
        search_pool, queries, settings, tenant_id=tenant, params=body.to_pipeline(),
        filter_pool=pool,
    )
    if body.track:
        # Access tracking runs after the response is sent, in one batched statement.
        background.add_task(
            search_mod.touch, pool, tenant, [r["item"]["id"] for r in outcome.results]
        )
    return SearchResponse(
        query=body.query,
        mode=outcome.mode,
        results=outcome.results,
        warnings=outcome.warnings,
        timings_ms=outcome.timings_ms,
    )
