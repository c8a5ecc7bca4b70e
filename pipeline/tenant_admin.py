"""Tenants, managed by the installation's operator: made (with a first admin key), listed,
suspended and resumed, and deleted by an erasure job (pipeline/erasure.py). Each change is
audited under no tenant (it concerns the installation), and a suspension or deletion refuses
the tenant's keys at once in every API process: the key cache hears the status change
(migration 0013)."""

from __future__ import annotations

import asyncpg

from pipeline import actions, jobs
from pipeline.db import Q
from pipeline.errors import BadInput, Conflict, NotFound
from pipeline.keys import KeySpec
from pipeline.keys import create as create_key
from pipeline.settings import Settings
from pipeline.tenants import Principal

MAX_NAME_CHARS = 200


def check_name(name: str) -> str:
    if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable() or name != name.strip():
        raise BadInput(f"name: a tenant name is 1-{MAX_NAME_CHARS} printable characters, "
                       "without leading or trailing spaces")
    return name


async def create(conn: asyncpg.Connection, actor: Principal, name: str,
                 *, key_name: str = "admin") -> tuple[asyncpg.Record, asyncpg.Record, str]:
    """A new tenant and its first admin key (shown once): (tenant, key row, key)."""
    tenant_id = await conn.fetchval(Q["admin.insert_tenant"], check_name(name))
    if tenant_id is None:
        raise Conflict(f"a tenant named {name!r} exists already")
    await actions.audit(conn, actor, "tenant.create", tenant_id=None, via="api",
                        target=f"tenant {tenant_id} {name!r}", affected=1)
    row, key = await create_key(conn, actor, tenant_id, KeySpec(key_name, "admin"))
    return await get(conn, tenant_id), row, key


async def get(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int) -> asyncpg.Record:
    row = await conn.fetchrow(Q["admin.tenant"], tenant_id)
    if row is None:
        raise NotFound(f"no tenant {tenant_id}")
    return row


async def by_name(pool: asyncpg.Pool, name: str) -> int:
    tenant_id = await pool.fetchval(Q["admin.tenant_by_name"], name)
    if tenant_id is None:
        raise NotFound(f"no tenant named {name!r}")
    return tenant_id


async def list_page(pool: asyncpg.Pool, *, status: str | None, after: int | None,
                    limit: int) -> list[asyncpg.Record]:
    return await pool.fetch(Q["admin.list_tenants"], status, after, limit)


async def _lock(conn: asyncpg.Connection, actor: Principal, tenant_id: int,
                doing: str) -> asyncpg.Record:
    row = await conn.fetchrow(Q["admin.lock_tenant"], tenant_id)
    if row is None or row["status"] == "deleted":
        raise NotFound(f"no tenant {tenant_id}")
    if row["status"] == "deleting":
        raise Conflict(f"tenant {tenant_id} is being deleted")
    if tenant_id == actor.tenant_id:
        raise Conflict(f"this key belongs to tenant {tenant_id}: {doing} it would lock its "
                       "own operator out; use an operator key of another tenant")
    return row


async def set_status(conn: asyncpg.Connection, actor: Principal, tenant_id: int,
                     status: str) -> asyncpg.Record:
    """Suspend ('suspended') or resume ('active') a tenant; doing it twice changes nothing."""
    row = await _lock(conn, actor, tenant_id, "suspending" if status == "suspended"
                      else "resuming")
    if row["status"] != status:
        await conn.execute(Q["admin.set_tenant_status"], tenant_id, status)
        await actions.audit(conn, actor, "tenant.suspend" if status == "suspended"
                            else "tenant.resume", tenant_id=None, via="api",
                            target=f"tenant {tenant_id} {row['name']!r}", affected=1)
    return await get(conn, tenant_id)


async def delete(conn: asyncpg.Connection, actor: Principal, tenant_id: int,
                 settings: Settings) -> tuple[asyncpg.Record, list[jobs.JobRef]]:
    """Refuse the tenant's keys now and queue its erasure, under the operator's own tenant."""
    row = await _lock(conn, actor, tenant_id, "deleting")
    await conn.execute(Q["admin.set_tenant_status"], tenant_id, "deleting")
    created = await jobs.create_jobs(
        conn, tenant_id=actor.tenant_id, item_id=None, version=None,
        specs=[jobs.JobSpec(jobs.ERASE_TENANT)], max_attempts=settings.max_attempts_for,
        payload={"tenant_id": tenant_id, "key_id": actor.key_id, "key_name": actor.key_name})
    await actions.audit(conn, actor, "tenant.delete", tenant_id=None, via="api",
                        target=f"tenant {tenant_id} {row['name']!r}",
                        filter={"job_id": str(created[0]["id"])}, affected=1)
    return await get(conn, tenant_id), jobs.refs_to_enqueue(created)
