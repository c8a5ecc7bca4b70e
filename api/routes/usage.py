"""What a tenant uses against its limits (`GET /v1/usage`, for every key of the tenant), and
the operator's routes that read and set a tenant's limits (`/v1/tenants/{id}/limits`; every
`/v1/tenants` path is an operator's, api/roles.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from api.deps import CurrentPrincipal, PoolDep, SettingsDep
from api.rate_limit import limiter_of
from api.schemas import INT64_MAX
from api.usage_schemas import (
    LimitsUpdate,
    LimitUse,
    LimitValues,
    TenantLimitsPublic,
    UsagePublic,
)
from pipeline import actions, quotas

router = APIRouter(tags=["usage"])
TenantId = Annotated[int, Path(ge=1, le=INT64_MAX, description="The tenant's id.")]
def _values(limits: quotas.Limits) -> LimitValues:
    return LimitValues(**{name: getattr(limits, name) for name in quotas.LIMITS})


def _use(limit: int | None, used: int | None) -> LimitUse:
    remaining = None if limit is None or used is None else max(0, limit - used)
    return LimitUse(limit=limit, used=used, remaining=remaining)


@router.get("/v1/usage", response_model=UsagePublic)
async def get_usage(principal: CurrentPrincipal, pool: PoolDep, settings: SettingsDep,
                    request: Request) -> UsagePublic:
    """The tenant's use of each of its limits: requests in the last 60 s, items, memories,
    bytes stored and jobs queued, each with its limit and what remains."""
    tenant = principal.tenant_id
    applying, used = await quotas.usage(pool, tenant, settings)
    # Requests are counted only where a limit applies: an unlimited tenant costs Redis nothing.
    requests = (None if applying.requests_per_minute is None
                else await limiter_of(request.app.state).requests_now(tenant))
    return UsagePublic(
        requests_per_minute=_use(applying.requests_per_minute, requests),
        **{name: _use(getattr(applying, name), getattr(used, name))
           for name in ("items", "memories", "bytes", "jobs")})


def _public(limits: quotas.TenantLimits) -> TenantLimitsPublic:
    return TenantLimitsPublic(tenant_id=limits.tenant_id, limits=_values(limits.own),
                              effective=_values(limits.effective), updated_at=limits.updated_at)


@router.get("/v1/tenants/{tenant_id}/limits", response_model=TenantLimitsPublic)
async def get_limits(tenant_id: TenantId, pool: PoolDep,
                     settings: SettingsDep) -> TenantLimitsPublic:
    """A tenant's limits as set (null: the installation's default) and as they apply."""
    return _public(await quotas.tenant_limits(pool, tenant_id, settings))


@router.put("/v1/tenants/{tenant_id}/limits", response_model=TenantLimitsPublic)
async def put_limits(tenant_id: TenantId, body: LimitsUpdate, principal: CurrentPrincipal,
                     pool: PoolDep, settings: SettingsDep,
                     request: Request) -> TenantLimitsPublic:
    """Set all of a tenant's limits (a limit left out or null: the installation's default).
    A lower limit than the tenant uses refuses what would add more, and removes nothing."""
    values = body.model_dump()
    async with pool.acquire() as conn, conn.transaction():
        await quotas.set_limits(conn, tenant_id, **values)
        await actions.audit(conn, principal, "tenant.limits", tenant_id=tenant_id, via="api",
                            target=str(tenant_id), filter=values)
        limits = await quotas.tenant_limits(conn, tenant_id, settings)
    limiter_of(request.app.state).forget(tenant_id)
    return _public(limits)
