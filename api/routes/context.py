"""`POST /v1/context`: the text an agent should see now, within a token budget."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentPrincipal, PoolDep, QueryCacheDep, SearchPoolDep, SettingsDep
from api.memory_schemas import ContextRequest, ContextResponse
from api.routes.memories import scope_of
from pipeline.memory import assemble
from pipeline.memory.tokens import TOKENIZER_NAME

router = APIRouter(tags=["context"])


@router.post("/v1/context", response_model=ContextResponse)
async def context(body: ContextRequest, principal: CurrentPrincipal, pool: PoolDep,
                  search_pool: SearchPoolDep, queries: QueryCacheDep,
                  settings: SettingsDep) -> ContextResponse:
    """Pinned memories, the memories and past turns most relevant to the query (default: the
    session's latest user turns), the session's summary and its last 6 turns, in a stable
    order of sections so that a caller can cache the prefix; each section with its token
    count, `truncated` when something was left out, and the ids of everything included."""
    packed = await assemble.build(pool, search_pool, queries, settings,
                                  tenant_id=principal.tenant_id,
                                  ask=assemble.ContextAsk(scope_of(principal, body.scope),
                                                          body.session_id, body.query,
                                                          body.max_tokens))
    return ContextResponse(
        context=packed.context, sections=[{"name": s.name, "tokens": s.tokens}
                                          for s in packed.sections],
        truncated=packed.truncated, included=packed.included,
        tokens=sum(s.tokens for s in packed.sections), tokenizer=TOKENIZER_NAME)
