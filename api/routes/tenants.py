"""Tenants, for the installation's operator (api/roles.py refuses every other key): made with
a first admin key, listed, suspended and resumed, and deleted by an erasure job whose report
the tenant keeps as a tombstone."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from api.admin_schemas import (
    TenantCreate,
    TenantDeleting,
    TenantMade,
    TenantPublic,
    TenantsPage,
    TenantStatus,
)
from api.deps import CurrentPrincipal, PoolDep, QueueDep, SettingsDep
from api.routes.keys import key_public, read_cursor
from api.schemas import INT64_MAX, SafeStr
from pipeline import jobs, tenant_admin

router = APIRouter(prefix="/v1/tenants", tags=["tenants"])
TenantId = Annotated[int, Path(ge=1, le=INT64_MAX)]


def tenant_public(row: Any) -> TenantPublic:
    return TenantPublic(**{k: row[k] for k in TenantPublic.model_fields})


@router.post("", status_code=201, response_model=TenantMade)
async def create_tenant(body: TenantCreate, principal: CurrentPrincipal,
                        pool: PoolDep) -> TenantMade:
    """Make a tenant and its first admin key, which this answer shows once."""
    async with pool.acquire() as conn, conn.transaction():
        tenant, row, key = await tenant_admin.create(conn, principal, body.name,
                                                     key_name=body.admin_key_name)
    return TenantMade(tenant=tenant_public(tenant), key=key, key_info=key_public(row))


@router.get("", response_model=TenantsPage)
async def list_tenants(
    principal: CurrentPrincipal, pool: PoolDep,
    status: TenantStatus | None = None,
    name: Annotated[SafeStr | None, Query(min_length=1, max_length=200, description=(
        "Only the live tenant of this name."))] = None,
    cursor: Annotated[SafeStr | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> TenantsPage:
    """Tenants in the order they were made, with their status and active keys."""
    if name is not None:
        rows = [await tenant_admin.get(pool, await tenant_admin.by_name(pool, name))]
        return TenantsPage(data=[tenant_public(r) for r in rows], next_cursor=None)
    rows = await tenant_admin.list_page(pool, status=status, after=read_cursor(cursor),
                                        limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return TenantsPage(data=[tenant_public(r) for r in rows],
                       next_cursor=str(rows[-1]["id"]) if more else None)


@router.get("/{tenant_id}", response_model=TenantPublic)
async def get_tenant(tenant_id: TenantId, principal: CurrentPrincipal,
                     pool: PoolDep) -> TenantPublic:
    """A tenant; once deleted, with its erasure's report."""
    return tenant_public(await tenant_admin.get(pool, tenant_id))


@router.post("/{tenant_id}/suspend", response_model=TenantPublic)
async def suspend_tenant(tenant_id: TenantId, principal: CurrentPrincipal,
                         pool: PoolDep) -> TenantPublic:
    """Refuse every key of the tenant at once, keeping its data."""
    async with pool.acquire() as conn, conn.transaction():
        row = await tenant_admin.set_status(conn, principal, tenant_id, "suspended")
    return tenant_public(row)


@router.post("/{tenant_id}/resume", response_model=TenantPublic)
async def resume_tenant(tenant_id: TenantId, principal: CurrentPrincipal,
                        pool: PoolDep) -> TenantPublic:
    """Accept the tenant's keys again."""
    async with pool.acquire() as conn, conn.transaction():
        row = await tenant_admin.set_status(conn, principal, tenant_id, "active")
    return tenant_public(row)


@router.delete("/{tenant_id}", status_code=202, response_model=TenantDeleting)
async def delete_tenant(tenant_id: TenantId, principal: CurrentPrincipal, pool: PoolDep,
                        queue: QueueDep, settings: SettingsDep) -> TenantDeleting:
    """Refuse the tenant's keys now and erase everything of it in a job: every row, vector
    and Redis key, then a recount. The tenant stays as a tombstone with the report
    (`GET /v1/tenants/{id}`: status `deleted`, `erasure`)."""
    async with pool.acquire() as conn, conn.transaction():
        row, refs = await tenant_admin.delete(conn, principal, tenant_id, settings)
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    return TenantDeleting(tenant=tenant_public(row), job_id=str(refs[0].id))
