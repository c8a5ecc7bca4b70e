"""Webhooks: a tenant's endpoints (create, list, change, delete, rotate the secret, send a test
ping) and each endpoint's log of deliveries, with replay. Another tenant's webhook or delivery
is a 404 like an unknown one. Every change is audited; what is sent, and how, is
pipeline/webhooks.py's."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Query, Response

from api.deps import CurrentPrincipal, PoolDep, QueueDep, SettingsDep
from api.schemas import Problem, SafeStr
from api.webhook_schemas import (
    DeliveredEvent,
    DeliveriesPage,
    DeliveryDetail,
    DeliveryPublic,
    DeliveryStatus,
    WebhookCreate,
    WebhookPublic,
    WebhooksPublic,
    WebhookUpdate,
    WebhookWithSecret,
)
from pipeline import actions, jobs, webhooks
from pipeline.db import Q
from pipeline.errors import BadInput, Conflict, NotFound
from pipeline.tenants import Principal

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

LIMIT_REACHED = {409: {"model": Problem, "description": "The tenant has as many webhooks as "
                                                        "MEMMILL_WEBHOOK_MAX_ENDPOINTS allows."}}
DISABLED = {409: {"model": Problem, "description": "The webhook is disabled: enable it first."}}
# Before every delivery of the first page: where a cursor-less listing starts.
_NEWEST = (datetime.max.replace(tzinfo=UTC), uuid.UUID(int=2**128 - 1))


def _public(row: Any) -> WebhookPublic:
    return WebhookPublic(**{k: row[k] for k in WebhookPublic.model_fields})


def _with_secret(row: Any) -> WebhookWithSecret:
    return WebhookWithSecret(**{k: row[k] for k in WebhookWithSecret.model_fields})


def _delivery(row: Any) -> DeliveryPublic:
    return DeliveryPublic(**{k: row[k] for k in DeliveryPublic.model_fields})


async def _webhook(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int,
                   webhook_id: uuid.UUID) -> asyncpg.Record:
    row = await conn.fetchrow(Q["webhooks.get"], tenant_id, webhook_id)
    if row is None:
        raise NotFound(f"no webhook {webhook_id}")
    return row


async def _audit(conn: asyncpg.Connection, principal: Principal, action: str,
                 target: str) -> None:
    await actions.audit(conn, principal, action, tenant_id=principal.tenant_id, via="api",
                        target=target, affected=1)


@router.post("", status_code=201, response_model=WebhookWithSecret, responses=LIMIT_REACHED)
async def create_webhook(body: WebhookCreate, principal: CurrentPrincipal, pool: PoolDep,
                         settings: SettingsDep) -> WebhookWithSecret:
    """Add an endpoint. Its URL must pass the fetch's SSRF guard; its secret, which signs every
    delivery, is in this answer and no other (rotate it to get a new one)."""
    await webhooks.check_url(body.url, webhooks.policy(settings))
    tenant_id = principal.tenant_id
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(Q["webhooks.lock_tenant"], tenant_id)
        limit = settings.webhook_max_endpoints
        if await conn.fetchval(Q["webhooks.count"], tenant_id) >= limit:
            raise Conflict(f"this tenant has {limit} webhooks, the most it may have "
                           "(MEMMILL_WEBHOOK_MAX_ENDPOINTS): delete one first")
        row = await conn.fetchrow(Q["webhooks.insert"], tenant_id, body.url, body.description,
                                  body.events, body.active, webhooks.new_secret())
        await _audit(conn, principal, "webhook.create", str(row["id"]))
    return _with_secret(row)


@router.get("", response_model=WebhooksPublic)
async def list_webhooks(principal: CurrentPrincipal, pool: PoolDep) -> WebhooksPublic:
    """The tenant's endpoints, newest first (a tenant has a few: no paging)."""
    rows = await pool.fetch(Q["webhooks.list"], principal.tenant_id)
    return WebhooksPublic(data=[_public(r) for r in rows], count=len(rows))


@router.get("/{webhook_id}", response_model=WebhookPublic)
async def get_webhook(webhook_id: uuid.UUID, principal: CurrentPrincipal,
                      pool: PoolDep) -> WebhookPublic:
    """One endpoint, without its secret."""
    return _public(await _webhook(pool, principal.tenant_id, webhook_id))


@router.patch("/{webhook_id}", response_model=WebhookPublic)
async def update_webhook(webhook_id: uuid.UUID, body: WebhookUpdate,
                         principal: CurrentPrincipal, pool: PoolDep,
                         settings: SettingsDep) -> WebhookPublic:
    """Change an endpoint's URL (checked as at create), events, description or active flag.
    Pending deliveries go to the endpoint as it is when they are sent."""
    if body.url is not None:
        await webhooks.check_url(body.url, webhooks.policy(settings))
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            Q["webhooks.update"], principal.tenant_id, webhook_id, body.url,
            "description" in body.model_fields_set, body.description, body.events, body.active)
        if row is None:
            raise NotFound(f"no webhook {webhook_id}")
        await _audit(conn, principal, "webhook.update", str(webhook_id))
    return _public(row)


@router.delete("/{webhook_id}", status_code=204, response_class=Response)
async def delete_webhook(webhook_id: uuid.UUID, principal: CurrentPrincipal,
                         pool: PoolDep) -> Response:
    """Delete an endpoint with its log; its pending deliveries are not sent."""
    async with pool.acquire() as conn, conn.transaction():
        if await conn.fetchval(Q["webhooks.delete"], principal.tenant_id, webhook_id) is None:
            raise NotFound(f"no webhook {webhook_id}")
        await _audit(conn, principal, "webhook.delete", str(webhook_id))
    return Response(status_code=204)


@router.post("/{webhook_id}/rotate-secret", response_model=WebhookWithSecret)
async def rotate_secret(webhook_id: uuid.UUID, principal: CurrentPrincipal,
                        pool: PoolDep) -> WebhookWithSecret:
    """A new secret, in this answer only. It signs every delivery sent from now on, retries
    of earlier events included; the old one signs nothing more."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(Q["webhooks.rotate_secret"], principal.tenant_id, webhook_id,
                                  webhooks.new_secret())
        if row is None:
            raise NotFound(f"no webhook {webhook_id}")
        await _audit(conn, principal, "webhook.rotate_secret", str(webhook_id))
    return _with_secret(row)


@router.post("/{webhook_id}/test", status_code=202, response_model=DeliveryPublic,
             responses=DISABLED)
async def test_webhook(webhook_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep,
                       queue: QueueDep, settings: SettingsDep) -> DeliveryPublic:
    """Send the endpoint a `ping` delivery, whatever it listens to; follow it in its log."""
    async with pool.acquire() as conn, conn.transaction():
        hook = await _enabled(conn, principal.tenant_id, webhook_id)
        delivery_id, refs = await webhooks.deliver_once(
            conn, principal.tenant_id, webhook_id, webhooks.PING,
            {"webhook_id": hook["id"], "message": "a test delivery from memmill"})
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    return await _get_delivery(pool, principal.tenant_id, webhook_id, delivery_id)


async def _enabled(conn: asyncpg.Connection, tenant_id: int,
                   webhook_id: uuid.UUID) -> asyncpg.Record:
    hook = await _webhook(conn, tenant_id, webhook_id)
    if not hook["active"]:
        raise Conflict(f"webhook {webhook_id} is disabled: enable it (PATCH active: true) "
                       "before sending it anything")
    return hook


def _cursor(row: Any) -> str:
    text = f"{row['created_at'].isoformat()}|{row['id']}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def _read_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, _, ident = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError(at)
        return when, uuid.UUID(ident)
    except (ValueError, UnicodeDecodeError):
        raise BadInput("cursor: not a cursor this API gave out") from None


@router.get("/{webhook_id}/deliveries", response_model=DeliveriesPage)
async def list_deliveries(
    webhook_id: uuid.UUID, principal: CurrentPrincipal, pool: PoolDep,
    status: DeliveryStatus | None = None,
    event: DeliveredEvent | None = None,
    cursor: Annotated[SafeStr | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> DeliveriesPage:
    """The endpoint's deliveries, newest first, a page at a time (`next_cursor`)."""
    await _webhook(pool, principal.tenant_id, webhook_id)
    after = _read_cursor(cursor) if cursor else _NEWEST
    rows = await pool.fetch(Q["webhooks.deliveries"], principal.tenant_id, webhook_id, *after,
                            status, event, limit + 1)
    page = rows[:limit]
    return DeliveriesPage(data=[_delivery(r) for r in page],
                          next_cursor=_cursor(page[-1]) if len(rows) > limit else None)


async def _get_delivery(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int,
                        webhook_id: uuid.UUID, delivery_id: uuid.UUID) -> DeliveryDetail:
    row = await conn.fetchrow(Q["webhooks.delivery"], tenant_id, webhook_id, delivery_id)
    if row is None:
        raise NotFound(f"no delivery {delivery_id} of webhook {webhook_id}")
    return DeliveryDetail(**_delivery(row).model_dump(), payload=webhooks.envelope(row),
                          history=row["history"])


@router.get("/{webhook_id}/deliveries/{delivery_id}", response_model=DeliveryDetail)
async def get_delivery(webhook_id: uuid.UUID, delivery_id: uuid.UUID,
                       principal: CurrentPrincipal, pool: PoolDep) -> DeliveryDetail:
    """One delivery, with the body it sends."""
    return await _get_delivery(pool, principal.tenant_id, webhook_id, delivery_id)


@router.post("/{webhook_id}/deliveries/{delivery_id}/replay", status_code=202,
             response_model=DeliveryPublic, responses=DISABLED)
async def replay_delivery(webhook_id: uuid.UUID, delivery_id: uuid.UUID,
                          principal: CurrentPrincipal, pool: PoolDep, queue: QueueDep,
                          settings: SettingsDep) -> DeliveryPublic:
    """Send a delivery's payload again, as a new delivery (a new id, the event's time kept)
    with a fresh budget of attempts; the original stays as it was in the log."""
    tenant_id = principal.tenant_id
    async with pool.acquire() as conn, conn.transaction():
        await _enabled(conn, tenant_id, webhook_id)
        old = await conn.fetchrow(Q["webhooks.delivery"], tenant_id, webhook_id, delivery_id)
        if old is None:
            raise NotFound(f"no delivery {delivery_id} of webhook {webhook_id}")
        new_id, refs = await webhooks.deliver_once(
            conn, tenant_id, webhook_id, old["event"], old["payload"], event_at=old["event_at"],
            replay_of=delivery_id)
        await _audit(conn, principal, "webhook.replay",
                     f"{webhook_id}/deliveries/{delivery_id}")
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    return await _get_delivery(pool, tenant_id, webhook_id, new_id)
