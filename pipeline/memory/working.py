"""Working memory: a small scratchpad per user and session (or thread) that an agent reads and
writes whole: the plan it is following, what it is waiting for, the open questions.

A read falls back from the session's scratchpad to the user's (the session_id '' row), so an
agent starting a new session finds what it kept across sessions. A write carries the version it
read (0 for a new one): a stale version is a 409 naming the current one, so two agents of a
user never overwrite each other's notes unseen. The scratchpad goes into context, after the
profile and before the memories."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from pipeline.db import Q
from pipeline.errors import BadInput, Conflict, NotFound

MAX_CHARS = 8_000
USER_LEVEL = ""  # the session_id of a user's own scratchpad


@dataclass(frozen=True)
class Pad:
    user_id: str
    session_id: str | None  # None: the user's own
    content: str
    version: int
    updated_at: datetime | None
    agent_id: str | None


def _pad(row: asyncpg.Record | None, user_id: str, session_id: str | None) -> Pad:
    if row is None:
        return Pad(user_id, session_id, "", 0, None, None)
    return Pad(row["user_id"], row["session_id"] or None, row["content"], row["version"],
               row["updated_at"], row["agent_id"])


async def read(pool: asyncpg.Pool | asyncpg.Connection, tenant_id: int, user_id: str,
               session_id: str | None) -> Pad:
    """The session's scratchpad, else the user's, else an empty one at version 0."""
    row = await pool.fetchrow(Q["working.read"], tenant_id, user_id, session_id or USER_LEVEL)
    return _pad(row, user_id, None if row is None or not row["session_id"] else session_id)


async def write(conn: asyncpg.Connection, tenant_id: int, user_id: str, session_id: str | None,
                content: str, expected_version: int, agent_id: str | None,
                key_id: int | None) -> Pad:
    """Replace the scratchpad of exactly this level (the session's, or the user's without a
    session): version 0 creates it, the current version replaces it."""
    if len(content) > MAX_CHARS:
        raise BadInput(f"content: a scratchpad holds at most {MAX_CHARS} characters; keep "
                       "what the agent needs now and store the rest as memories")
    level = session_id or USER_LEVEL
    if expected_version == 0:
        row = await conn.fetchrow(Q["working.create"], tenant_id, user_id, level, content,
                                  agent_id, key_id)
    else:
        row = await conn.fetchrow(Q["working.replace"], tenant_id, user_id, level, content,
                                  agent_id, key_id, expected_version)
    if row is None:
        current = await conn.fetchval(Q["working.version"], tenant_id, user_id, level)
        raise Conflict(f"version {expected_version} is stale: the scratchpad is at version "
                       f"{current or 0}; read it again and send that version")
    return _pad(row, user_id, session_id)


async def delete(conn: asyncpg.Connection, tenant_id: int, user_id: str,
                 session_id: str | None) -> None:
    if await conn.fetchval(Q["working.delete"], tenant_id, user_id,
                           session_id or USER_LEVEL) is None:
        raise NotFound("no scratchpad at this level"
                       + (f" (session {session_id})" if session_id else " (the user's)"))
