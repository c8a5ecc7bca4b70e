"""Request and response models of the routes that manage tenants, keys and the audit log.
A key appears in a response once, when it is made or rotated; afterwards only its prefix."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from api.memory_schemas import ScopeId
from api.schemas import IsoTime, SafeStr, Strict, json_int
from pipeline.keys import MAX_GRACE_S

RoleName = Literal["operator", "admin", "write", "read"]
TenantStatus = Literal["active", "suspended", "deleting", "deleted"]
KeyName = Annotated[SafeStr, Field(min_length=1, max_length=100)]
# 2**53: the largest integer every JSON reader keeps exact (a float past it rounds up).
TenantId = json_int(ge=1, le=2**53)
GraceSeconds = json_int(ge=0, le=MAX_GRACE_S)


class KeyCreate(Strict):
    name: KeyName = "default"
    role: RoleName = Field(default="write", description=(
        "read: reads only. write: reads and writes the tenant's data. admin: also the "
        "tenant's keys, webhooks, audit log, export and import. operator: every tenant "
        "(only an operator may make one)."))
    user_id: ScopeId | None = Field(default=None, description=(
        "Bind the key to this user: it acts as this user whatever a request names."))
    agent_id: ScopeId | None = Field(default=None, description=(
        "Bind the key to this agent: it acts as this agent, and never reads another agent's "
        "private memories."))
    expires_at: IsoTime | None = Field(default=None, description="Refused from this time on.")
    tenant_id: TenantId | None = Field(default=None, description=(
        "Operators only: the tenant to make the key for (default: the key's own)."))


class KeyRotate(Strict):
    grace_s: GraceSeconds = Field(default=3600, description=(
        "How long the old key keeps working, in seconds (0: refused at once; at most 30 "
        "days)."))


class KeyPublic(BaseModel):
    id: int
    tenant_id: int
    prefix: str = Field(description="The key's first characters, to tell keys apart.")
    name: str
    role: RoleName
    user_id: str | None
    agent_id: str | None
    created_at: datetime
    last_used_at: datetime | None = Field(description="Written at most once a minute.")
    expires_at: datetime | None
    revoked_at: datetime | None
    rotated_to: int | None = Field(description="The key that replaced this one, if rotated.")
    active: bool


class KeyMade(BaseModel):
    key: str = Field(description="The API key. Shown this once; only its hash is kept.")
    key_info: KeyPublic


class KeyRotated(BaseModel):
    key: str = Field(description="The new API key. Shown this once.")
    key_info: KeyPublic
    old: KeyPublic = Field(description="The old key, refused from its `expires_at`.")


class KeysPage(BaseModel):
    data: list[KeyPublic]
    next_cursor: str | None


class TenantCreate(Strict):
    name: SafeStr = Field(min_length=1, max_length=200)
    admin_key_name: KeyName = Field(default="admin", description="The first admin key's name.")


class TenantPublic(BaseModel):
    id: int
    name: str
    status: TenantStatus
    created_at: datetime
    status_at: datetime | None = Field(description="When the status last changed.")
    active_keys: int
    erasure: dict[str, Any] | None = Field(description=(
        "Once deleted: what the erasure removed, and the recount proving nothing is left."))


class TenantMade(BaseModel):
    tenant: TenantPublic
    key: str = Field(description="The tenant's first admin key. Shown this once.")
    key_info: KeyPublic


class TenantsPage(BaseModel):
    data: list[TenantPublic]
    next_cursor: str | None


class TenantDeleting(BaseModel):
    tenant: TenantPublic
    job_id: str = Field(description="The erasure job, in the operator's tenant.")


class AuditEntry(BaseModel):
    id: int
    at: datetime
    tenant_id: int | None = Field(description="None: the installation (tenants, pauses).")
    key_id: int | None
    key_name: str
    action: str
    target: str | None
    filter: dict[str, Any] | None
    affected: int
    skipped: int
    via: str
    result: str


class AuditPage(BaseModel):
    data: list[AuditEntry]
    next_cursor: str | None
