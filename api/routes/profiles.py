"""A user's knowledge profile (topics with a comfort level) and working memory (a scratchpad
per user and session). Both belong to a user: a key bound to a user reaches only its own."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from api.binding import acting_as
from api.deps import CurrentPrincipal, PoolDep
from api.memory_schemas import ScopeId, SessionIdText
from api.profile_schemas import (
    ProfilePublic,
    TopicPublic,
    TopicSet,
    WorkingMemoryPublic,
    WorkingMemoryWrite,
)
from api.schemas import SafeStr
from pipeline.errors import BadInput, NotFound
from pipeline.memory import profile, working
from pipeline.memory.working import Pad
from pipeline.tenants import Principal

router = APIRouter(tags=["memories"])
Topic = Annotated[SafeStr, Path(min_length=1, max_length=profile.MAX_TOPIC_CHARS)]
UserQuery = Annotated[ScopeId | None, Query(description=(
    "Whose (a key bound to a user is always its own)."))]
SessionQuery = Annotated[SessionIdText | None, Query(description=(
    "The session's scratchpad (falling back to the user's on a read); none: the user's."))]


def _user(principal: Principal, user_id: str | None) -> str:
    user = acting_as(principal, user_id, None).user_id
    if user is None:
        raise BadInput("user_id: a profile and a working memory belong to a user; name one")
    return user


def _topic(row: object) -> TopicPublic:
    return TopicPublic(**{k: row[k] for k in TopicPublic.model_fields})  # type: ignore[index]


@router.get("/v1/profiles/{user_id}", response_model=ProfilePublic)
async def get_profile(user_id: ScopeId, principal: CurrentPrincipal,
                      pool: PoolDep) -> ProfilePublic:
    """The user's topics, each with a comfort level and a one-line summary."""
    user = _user(principal, user_id)
    rows = await profile.topics(pool, principal.tenant_id, user)
    if not rows:
        raise NotFound(f"no profile of {user!r} yet: nothing was heard or set about it")
    return ProfilePublic(user_id=user, topics=[_topic(r) for r in rows])


@router.put("/v1/profiles/{user_id}/topics/{topic}", response_model=TopicPublic)
async def set_topic(user_id: ScopeId, topic: Topic, body: TopicSet,
                    principal: CurrentPrincipal, pool: PoolDep) -> TopicPublic:
    """Set a topic's level and summary (extraction replaces it when it hears something new)."""
    user = _user(principal, user_id)
    async with pool.acquire() as conn, conn.transaction():
        row = await profile.set_topic(conn, principal.tenant_id, user, topic, body.level,
                                      body.summary)
    return _topic(row)


@router.delete("/v1/profiles/{user_id}/topics/{topic}", status_code=204,
               response_class=Response)
async def remove_topic(user_id: ScopeId, topic: Topic, principal: CurrentPrincipal,
                       pool: PoolDep) -> Response:
    user = _user(principal, user_id)
    async with pool.acquire() as conn, conn.transaction():
        await profile.remove_topic(conn, principal.tenant_id, user, topic)
    return Response(status_code=204)


def _pad(pad: Pad, found: bool) -> WorkingMemoryPublic:
    level = None if not found else "session" if pad.session_id else "user"
    return WorkingMemoryPublic(user_id=pad.user_id, session_id=pad.session_id, level=level,
                               content=pad.content, version=pad.version,
                               updated_at=pad.updated_at, agent_id=pad.agent_id)


@router.get("/v1/working-memory", response_model=WorkingMemoryPublic)
async def read_working_memory(principal: CurrentPrincipal, pool: PoolDep,
                              user_id: UserQuery = None,
                              session_id: SessionQuery = None) -> WorkingMemoryPublic:
    """The session's scratchpad, else the user's, else an empty one at version 0."""
    pad = await working.read(pool, principal.tenant_id, _user(principal, user_id), session_id)
    return _pad(pad, pad.version > 0)


@router.put("/v1/working-memory", response_model=WorkingMemoryPublic)
async def write_working_memory(body: WorkingMemoryWrite, principal: CurrentPrincipal,
                               pool: PoolDep) -> WorkingMemoryPublic:
    """Replace a scratchpad whole, from the version read (0 creates it)."""
    scope = acting_as(principal, body.scope.user_id, body.scope.agent_id)
    user = _user(principal, scope.user_id)
    async with pool.acquire() as conn, conn.transaction():
        pad = await working.write(conn, principal.tenant_id, user, body.session_id,
                                  body.content, body.expected_version, scope.agent_id,
                                  principal.key_id)
    return _pad(pad, True)


@router.delete("/v1/working-memory", status_code=204, response_class=Response)
async def delete_working_memory(principal: CurrentPrincipal, pool: PoolDep,
                                user_id: UserQuery = None,
                                session_id: SessionQuery = None) -> Response:
    """Remove the scratchpad of exactly this level (the session's, or the user's)."""
    async with pool.acquire() as conn, conn.transaction():
        await working.delete(conn, principal.tenant_id, _user(principal, user_id), session_id)
    return Response(status_code=204)
