"""A key bound to a user and/or an agent acts as them, whatever a request names.

Every route that reads or writes memories, sessions or events takes its scope through here:
`Reader` for the `user_id`/`agent_id` query parameters, `acting_as` for a body's scope. A
bound key that names nobody acts as its binding; one that names someone else gets a 403, so
an agent's key can never read another agent's private memories by asking for them."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from api.deps import CurrentPrincipal
from api.memory_schemas import ScopeId
from pipeline.errors import Forbidden
from pipeline.memory.scopes import Scope
from pipeline.tenants import Principal


def _bound(what: str, bound_to: str | None, asked: str | None) -> str | None:
    if bound_to is None:
        return asked
    if asked is not None and asked != bound_to:
        raise Forbidden(f"this key is bound to {what} {bound_to!r}: it cannot act as "
                        f"{what} {asked!r}")
    return bound_to


def acting_as(principal: Principal, user_id: str | None, agent_id: str | None) -> Scope:
    """The scope a request acts in: what it named, overridden by the key's binding."""
    return Scope(_bound("user", principal.user_id, user_id),
                 _bound("agent", principal.agent_id, agent_id))


async def _reader(
    principal: CurrentPrincipal,
    user_id: Annotated[ScopeId | None, Query(description=(
        "Read as this user (a key bound to a user always reads as it)."))] = None,
    agent_id: Annotated[ScopeId | None, Query(description=(
        "Read as this agent (a key bound to an agent always reads as it)."))] = None,
) -> Scope:
    return acting_as(principal, user_id, agent_id)


Reader = Annotated[Scope, Depends(_reader)]
