"""What a tenant uses against its limits (`GET /v1/usage`, for every key of the tenant), and
the operator's routes that read and set a tenant's limits (`/v1/tenants/{id}/limits`; every
`/v1/tenants` path is an operator's, api/roles.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from api.deps import CurrentPrincipal, PoolDep, SettingsDep
from api.rate_limit import limiter_of
from api.schemas import INT64_MAX, Strict, json_int
from pipeline import actions, quotas

router = APIRouter(tags=["usage"])
TenantId = Annotated[int, Path(ge=1, le=INT64_MAX, description="The tenant's id.")]
# 2**53: the largest integer every JSON reader keeps exact (a float past it rounds up).
LimitValue = json_int(ge=0, le=2**53)


class LimitValues(BaseModel):
    requests_per_minute: int | None
    items: int | None
    memories: int | None
    bytes: int | None
    jobs: int | None


class LimitsUpdate(Strict):
    """All of a tenant's limits at once: a whole number from 0 (0 refuses everything the
    limit counts), or null (the same as leaving it out) for the installation's default."""

    requests_per_minute: LimitValue | None = Field(
        default=None, description="requests in any 60 s (an operator's keys are not counted)")
    items: LimitValue | None = Field(default=None, description="items stored")
    memories: LimitValue | None = Field(default=None, description="memories stored")
    bytes: LimitValue | None = Field(default=None, description=(
        "bytes stored: every version's source, and the content of memories and events"))
    jobs: LimitValue | None = Field(default=None, description=(
        "jobs waiting, queued (retries included) or running"))


class TenantLimitsPublic(BaseModel):
    tenant_id: int
    limits: LimitValues = Field(description="as set for the tenant; null: the default")
    effective: LimitValues = Field(description=(
        "what applies: the tenant's own, else the installation's default; null: no limit"))
    updated_at: datetime | None = Field(description="when the tenant's limits were last set")


class LimitUse(BaseModel):
    limit: int | None = Field(description="null: no limit")
    used: int | None = Field(description=(
        "for requests_per_minute, the requests of the last 60 s; null when the tenant has no "
        "limit of them (they are not counted) or Redis does not answer (they are then not "
        "limited)"))
    remaining: int | None = Field(description="what may still be added; null: no limit")


class UsagePublic(BaseModel):
    requests_per_minute: LimitUse
    items: LimitUse
    memories: LimitUse
    bytes: LimitUse
    jobs: LimitUse


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
