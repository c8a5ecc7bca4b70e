"""A tenant's API keys: made (shown once), listed, revoked and rotated with a grace period.
Admin keys manage their own tenant's keys; operators name any tenant with `tenant_id`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from api.admin_schemas import KeyCreate, KeyMade, KeyPublic, KeyRotate, KeyRotated, KeysPage
from api.deps import CurrentPrincipal, PoolDep
from api.schemas import INT64_MAX, SafeStr
from pipeline import keys
from pipeline.errors import BadInput, NotFound
from pipeline.keys import KeySpec
from pipeline.tenants import Principal

router = APIRouter(prefix="/v1/keys", tags=["keys"])
TenantQuery = Annotated[int | None, Query(ge=1, le=INT64_MAX, description=(
    "Operators only: the tenant whose keys these are (default: the key's own)."))]
KeyId = Annotated[int, Path(ge=1, le=INT64_MAX)]


def tenant_of(principal: Principal, tenant_id: int | None) -> int:
    """The tenant a request acts on: its own, or for an operator the one it names. Anyone
    else naming another tenant learns nothing: the same 404 whether it exists or not."""
    if tenant_id is None or tenant_id == principal.tenant_id:
        return principal.tenant_id
    if not principal.operator:
        raise NotFound(f"no tenant {tenant_id}")
    return tenant_id


def key_public(row: Any) -> KeyPublic:
    fields = {k: row[k] for k in KeyPublic.model_fields if k != "active"}
    active = row["revoked_at"] is None and (row["expires_at"] is None
                                            or row["expires_at"] > datetime.now(UTC))
    return KeyPublic(**fields, active=active)


def read_cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not cursor.isdigit() or len(cursor) > 18:
        raise BadInput("cursor: not a cursor this API gave out")
    return int(cursor)


@router.post("", status_code=201, response_model=KeyMade)
async def create_key(body: KeyCreate, principal: CurrentPrincipal, pool: PoolDep) -> KeyMade:
    """Make a key with a role, optionally bound to a user and/or an agent. The key is in this
    answer and nowhere else, ever."""
    tenant_id = tenant_of(principal, body.tenant_id)
    spec = KeySpec(body.name, body.role, body.user_id, body.agent_id, body.expires_at)
    async with pool.acquire() as conn, conn.transaction():
        row, key = await keys.create(conn, principal, tenant_id, spec)
    return KeyMade(key=key, key_info=key_public(row))


@router.get("", response_model=KeysPage)
async def list_keys(
    principal: CurrentPrincipal, pool: PoolDep, tenant_id: TenantQuery = None,
    include_inactive: Annotated[bool, Query(description=(
        "Also revoked and expired keys."))] = False,
    cursor: Annotated[SafeStr | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> KeysPage:
    """The tenant's keys, newest first, without the keys themselves."""
    rows = await keys.list_page(pool, tenant_of(principal, tenant_id),
                                before=read_cursor(cursor), include_inactive=include_inactive,
                                limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return KeysPage(data=[key_public(r) for r in rows],
                    next_cursor=str(rows[-1]["id"]) if more else None)


@router.get("/{key_id}", response_model=KeyPublic)
async def get_key(key_id: KeyId, principal: CurrentPrincipal, pool: PoolDep,
                  tenant_id: TenantQuery = None) -> KeyPublic:
    return key_public(await keys.get(pool, tenant_of(principal, tenant_id), key_id))


@router.delete("/{key_id}", response_model=KeyPublic)
async def revoke_key(key_id: KeyId, principal: CurrentPrincipal, pool: PoolDep,
                     tenant_id: TenantQuery = None) -> KeyPublic:
    """Revoke a key: refused at once by every API process. The row stays for the audit log."""
    async with pool.acquire() as conn, conn.transaction():
        row = await keys.revoke(conn, principal, tenant_of(principal, tenant_id), key_id)
    return key_public(row)


@router.post("/{key_id}/rotate", status_code=201, response_model=KeyRotated)
async def rotate_key(key_id: KeyId, body: KeyRotate, principal: CurrentPrincipal, pool: PoolDep,
                     tenant_id: TenantQuery = None) -> KeyRotated:
    """A new key with the same name, role and binding; the old one keeps working for
    `grace_s` seconds, then is refused."""
    async with pool.acquire() as conn, conn.transaction():
        old, new, key = await keys.rotate(conn, principal, tenant_of(principal, tenant_id),
                                          key_id, grace_s=body.grace_s)
    return KeyRotated(key=key, key_info=key_public(new), old=key_public(old))
