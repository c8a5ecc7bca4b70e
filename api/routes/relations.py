"""Relations between memories and references from memories to items: write, remove, and walk
(GET /v1/memories/{id}/related). Both ends of a relation must be memories the caller sees."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.binding import Reader, acting_as
from api.deps import CurrentPrincipal, PoolDep
from api.routes.items import ItemId
from api.routes.memories import public
from api.upkeep_schemas import (
    ReferenceCreate,
    ReferencePublic,
    RelatedNode,
    RelatedWalk,
    RelationCreate,
    RelationKind,
    RelationPublic,
)
from pipeline.memory import relations

router = APIRouter(tags=["memories"])


@router.post("/v1/memories/{memory_id}/relations", status_code=201,
             response_model=RelationPublic)
async def add_relation(memory_id: uuid.UUID, body: RelationCreate, principal: CurrentPrincipal,
                       pool: PoolDep) -> RelationPublic:
    """Relate this memory to another one the scope sees. Writing it again changes nothing."""
    reader = acting_as(principal, body.scope.user_id, body.scope.agent_id)
    async with pool.acquire() as conn, conn.transaction():
        row = await relations.add(conn, principal.tenant_id, reader, memory_id, body.kind,
                                  body.to_id)
    return RelationPublic(**dict(row))


@router.delete("/v1/memories/{memory_id}/relations/{kind}/{to_id}", status_code=204,
               response_class=Response)
async def remove_relation(memory_id: uuid.UUID, kind: RelationKind, to_id: uuid.UUID,
                          principal: CurrentPrincipal, pool: PoolDep,
                          reader: Reader) -> Response:
    """Remove one relation (a consolidation's too)."""
    async with pool.acquire() as conn, conn.transaction():
        await relations.remove(conn, principal.tenant_id, reader, memory_id, kind, to_id)
    return Response(status_code=204)


@router.get("/v1/memories/{memory_id}/related", response_model=RelatedWalk)
async def related(
    memory_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep, reader: Reader,
    depth: Annotated[int, Query(ge=1, le=relations.MAX_DEPTH, description=(
        "How many relations away, in either direction."))] = 1,
    kind: Annotated[list[RelationKind], Query(max_length=3, description=(
        "Only along these kinds (repeat for several); default: all."))] = [],  # noqa: B006
) -> RelatedWalk:
    """The memories related to this one, up to `depth` relations away either way, nearest
    first, with the relations among them and the items it references. Cycles are safe; a
    memory the scope does not see is neither shown nor walked through."""
    walk = await relations.walk(pool, principal.tenant_id, reader, memory_id, depth,
                                list(kind) or None)
    return RelatedWalk(
        memory_id=memory_id, depth=depth, truncated=walk.truncated,
        nodes=[RelatedNode(depth=n["depth"], memory=public(n)) for n in walk.nodes],
        edges=[RelationPublic(**e) for e in walk.edges],
        references=[ReferencePublic(**r) for r in await relations.references(
            pool, principal.tenant_id, memory_id)])


@router.post("/v1/memories/{memory_id}/references", status_code=201,
             response_model=ReferencePublic)
async def add_reference(memory_id: uuid.UUID, body: ReferenceCreate,
                        principal: CurrentPrincipal, pool: PoolDep) -> ReferencePublic:
    """Say that this memory refers to an item, or to one part (`position`) of it."""
    reader = acting_as(principal, body.scope.user_id, body.scope.agent_id)
    async with pool.acquire() as conn, conn.transaction():
        row = await relations.add_reference(conn, principal.tenant_id, reader, memory_id,
                                            body.item_id, body.position)
    return ReferencePublic(item_id=row["item_id"],
                           position=None if row["position"] < 0 else row["position"])


@router.delete("/v1/memories/{memory_id}/references/{item_id:path}", status_code=204,
               response_class=Response)
async def remove_reference(
    memory_id: uuid.UUID, item_id: ItemId, principal: CurrentPrincipal, pool: PoolDep,
    reader: Reader,
    position: Annotated[int | None, Query(ge=0, le=10_000_000)] = None,
) -> Response:
    async with pool.acquire() as conn, conn.transaction():
        await relations.remove_reference(conn, principal.tenant_id, reader, memory_id, item_id,
                                         position)
    return Response(status_code=204)
