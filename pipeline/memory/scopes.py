"""Scopes: who a memory, a session or an event belongs to, and who may read it.

A row's scope is the tenant of the key that wrote it plus `user_id`, `agent_id` and (for
memories) `session_id`, written once (a trigger refuses any change, migration 0011). Its
`visibility` says who reads it:

| visibility | a reader (user U, agent A) sees it when |
|---|---|
| private | the row's agent is A, and the row has no user or its user is U |
| user    | the row's user is U (whichever agent wrote it) |
| tenant  | always |

The rule lives once, in SQL (`scope_visible`), and every read passes the reader through it.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Literal

from pipeline.errors import BadInput

Visibility = Literal["private", "user", "tenant"]
VISIBILITIES: tuple[Visibility, ...] = ("private", "user", "tenant")
MAX_ID_CHARS = 256


def id_problem(value: str) -> str | None:
    """Why a caller's user, agent or session id is refused, or None. Whitespace and control
    characters are refused because ids are compared exactly: "u1" and "u1 " would be two
    users that look like one in every log and dashboard."""
    if not 1 <= len(value) <= MAX_ID_CHARS:
        return f"must be 1 to {MAX_ID_CHARS} characters long"
    for ch in value:
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            return f"must not contain whitespace or control characters (found {ch!r})"
    return None


@dataclass(frozen=True)
class Scope:
    """The user and agent a write belongs to, or a read is made for."""

    user_id: str | None = None
    agent_id: str | None = None

    @property
    def empty(self) -> bool:
        return self.user_id is None and self.agent_id is None

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in (("user_id", self.user_id), ("agent_id", self.agent_id)) if v}


def visibility_for(scope: Scope, asked: Visibility | None) -> Visibility:
    """The visibility a write gets: the one asked for, else `user` when the scope names a user,
    else `private` to its agent. A write with neither must ask for `tenant` in so many words:
    a forgotten scope never makes a row readable by every agent of the tenant."""
    if asked is None:
        if scope.user_id is not None:
            return "user"
        if scope.agent_id is not None:
            return "private"
        raise BadInput("scope: name a user_id or an agent_id, or set visibility to 'tenant' "
                       "for a row every agent of the tenant may read")
    if asked == "user" and scope.user_id is None:
        raise BadInput("visibility 'user' needs scope.user_id: the user whose agents read it")
    if asked == "private" and scope.agent_id is None:
        raise BadInput("visibility 'private' needs scope.agent_id: the agent that alone reads it")
    return asked


def can_read(visibility: str, row_user: str | None, row_agent: str | None,
             reader: Scope) -> bool:
    """The rule in Python, for rows already in hand (the SQL function scope_visible is the
    one reads use; a test checks both agree on every cell)."""
    if visibility == "tenant":
        return True
    if visibility == "user":
        return row_user is not None and row_user == reader.user_id
    return (row_agent is not None and row_agent == reader.agent_id
            and (row_user is None or row_user == reader.user_id))
