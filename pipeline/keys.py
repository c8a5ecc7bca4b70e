"""A tenant's API keys: made, listed, revoked and rotated by its admins (and by operators for
any tenant), each change audited. A key is shown once, when made; only its hash is kept.

Who may do what: an admin manages its own tenant's keys, but never an operator's key (the
installation's, which may live in any tenant); only an operator makes operator keys. Only
read and write keys can be bound: an admin or operator key acts for the whole tenant (its
keys, webhooks, export) or the installation, never as one user or agent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from pipeline import actions
from pipeline.db import Q
from pipeline.errors import BadInput, Conflict, Forbidden, NotFound
from pipeline.tenants import Principal, Role, add_key, new_key

MAX_GRACE_S = 30 * 24 * 3600


@dataclass(frozen=True)
class KeySpec:
    name: str
    role: Role
    user_id: str | None = None
    agent_id: str | None = None
    expires_at: datetime | None = None


def _may_manage(actor: Principal, role: str) -> None:
    if role == "operator" and not actor.operator:
        raise Forbidden("only an operator's key may make, revoke or rotate an operator's key")


async def _live_tenant(conn: asyncpg.Connection, tenant_id: int) -> None:
    row = await conn.fetchrow(Q["admin.lock_tenant"], tenant_id)
    if row is None or row["status"] == "deleted":
        raise NotFound(f"no tenant {tenant_id}")
    if row["status"] == "deleting":
        raise Conflict(f"tenant {tenant_id} is being deleted")


async def create(conn: asyncpg.Connection, actor: Principal, tenant_id: int,
                 spec: KeySpec) -> tuple[asyncpg.Record, str]:
    """A new key of `tenant_id` (inside the caller's transaction); the row and the key."""
    _may_manage(actor, spec.role)
    if spec.role in ("operator", "admin") and (spec.user_id or spec.agent_id):
        raise BadInput(f"role: a bound key acts as one user or agent, so it may be 'read' or "
                       f"'write'; an {spec.role!r} key manages the whole tenant and cannot be "
                       "bound")
    await _live_tenant(conn, tenant_id)
    key = new_key()
    key_id = await add_key(conn, tenant_id, key, name=spec.name, role=spec.role,
                           user_id=spec.user_id, agent_id=spec.agent_id,
                           expires_at=spec.expires_at, created_by=actor.key_id)
    await actions.audit(conn, actor, "key.create", tenant_id=tenant_id, via="api",
                        target=f"key {key_id} {spec.name!r} ({spec.role})", affected=1)
    return await conn.fetchrow(Q["admin.get_key"], tenant_id, key_id), key


async def get(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int,
              key_id: int) -> asyncpg.Record:
    row = await conn.fetchrow(Q["admin.get_key"], tenant_id, key_id)
    if row is None:
        raise NotFound(f"no key {key_id}")
    return row


async def list_page(pool: asyncpg.Pool, tenant_id: int, *, before: int | None,
                    include_inactive: bool, limit: int) -> list[asyncpg.Record]:
    return await pool.fetch(Q["admin.list_keys"], tenant_id, before, include_inactive, limit)


async def _locked(conn: asyncpg.Connection, actor: Principal, tenant_id: int,
                  key_id: int) -> asyncpg.Record:
    row = await conn.fetchrow(Q["admin.lock_key"], tenant_id, key_id)
    if row is None:
        raise NotFound(f"no key {key_id}")
    _may_manage(actor, row["role"])
    return row


async def revoke(conn: asyncpg.Connection, actor: Principal, tenant_id: int,
                 key_id: int) -> asyncpg.Record:
    """Refuse the key from now on (at once in every API: the key cache hears it). Revoking a
    revoked key changes nothing and is not an error."""
    row = await _locked(conn, actor, tenant_id, key_id)
    await conn.execute(Q["admin.revoke_key"], tenant_id, key_id)
    await actions.audit(conn, actor, "key.revoke", tenant_id=tenant_id, via="api",
                        target=f"key {key_id} {row['name']!r}",
                        affected=0 if row["revoked_at"] else 1)
    return await get(conn, tenant_id, key_id)


async def rotate(conn: asyncpg.Connection, actor: Principal, tenant_id: int, key_id: int,
                 *, grace_s: int) -> tuple[asyncpg.Record, asyncpg.Record, str]:
    """A new key with the old one's name, role and binding; the old one keeps working for
    `grace_s` (so every client can switch), then is refused. Returns (old, new, new key)."""
    if not 0 <= grace_s <= MAX_GRACE_S:
        raise BadInput(f"grace_s: must be 0 to {MAX_GRACE_S} seconds (30 days)")
    old = await _locked(conn, actor, tenant_id, key_id)
    if old["revoked_at"] is not None or old["expired"]:
        raise Conflict(f"key {key_id} is revoked or expired: make a new key instead")
    key = new_key()
    new_id = await add_key(conn, tenant_id, key, name=old["name"], role=old["role"],
                           user_id=old["user_id"], agent_id=old["agent_id"],
                           created_by=actor.key_id)
    await conn.execute(Q["admin.retire_key"], tenant_id, key_id, grace_s, new_id)
    await actions.audit(conn, actor, "key.rotate", tenant_id=tenant_id, via="api",
                        target=f"key {key_id} {old['name']!r} -> key {new_id}, "
                               f"grace {grace_s} s", affected=1)
    return await get(conn, tenant_id, key_id), await get(conn, tenant_id, new_id), key
