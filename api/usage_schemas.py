"""What `GET /v1/usage` and the operator's `/v1/tenants/{id}/limits` routes take and answer."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from api.schemas import Strict, json_int

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
