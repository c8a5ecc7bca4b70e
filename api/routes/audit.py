"""The audit log: every admin and destructive action, who (key), what, target, when, result.
A tenant's admins read their tenant's; operators read everything, or one tenant's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.admin_schemas import AuditEntry, AuditPage
from api.deps import CurrentPrincipal, PoolDep
from api.routes.keys import TenantQuery, read_cursor
from api.schemas import QueryTime, SafeStr
from pipeline.db import Q
from pipeline.errors import NotFound

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("", response_model=AuditPage)
async def audit_log(
    principal: CurrentPrincipal, pool: PoolDep, tenant_id: TenantQuery = None,
    action: Annotated[SafeStr | None, Query(max_length=64, description=(
        "Only this action (e.g. `key.create`, `replay`), or a prefix ending in `.`: "
        "`key.`."))] = None,
    since: QueryTime | None = None,
    cursor: Annotated[SafeStr | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """Newest first. Without `tenant_id` an operator sees every tenant's actions and the
    installation's (tenants made, suspended or deleted; job kinds paused)."""
    if principal.operator:
        scope, everything = tenant_id, tenant_id is None
    elif tenant_id in (None, principal.tenant_id):
        scope, everything = principal.tenant_id, False
    else:
        raise NotFound(f"no tenant {tenant_id}")
    rows = await pool.fetch(Q["admin.audit_page"], scope, everything, action, since,
                            read_cursor(cursor), limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(data=[AuditEntry(**{k: r[k] for k in AuditEntry.model_fields})
                           for r in rows],
                     next_cursor=str(rows[-1]["id"]) if more else None)

