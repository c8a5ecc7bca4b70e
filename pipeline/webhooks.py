"""Webhooks: a tenant's endpoints hear when its work is done, instead of polling.

**Emission is an outbox.** Where an event happens, in the same transaction, `emit` writes one
`webhook_deliveries` row per active endpoint subscribed to it and a `webhook` job per row in
the ledger. The event is announced if and only if its transaction commits, and the delivery
survives any restart: the caller enqueues the returned refs after the commit like any job, and
the sweeper enqueues whatever it could not. A tenant without webhooks pays one indexed lookup
per event, a plain read that finds no endpoint (about one round trip, 0.2 ms). Nothing is kept
in Redis or in process memory, so no cache can miss an endpoint created a moment ago.

**Delivery is a job.** The `webhook` task POSTs the event as JSON, signed, to the endpoint's
URL as it is at that attempt, through the fetch's SSRF guard (`pipeline.stages.fetch`: every
address the host resolves to is checked and the request goes to the checked address, so DNS
rebinding cannot turn it inward), with a short timeout and no redirects followed. A 2xx is
delivered. Anything else raises, and the job wrapper does what it does for every job: backoff
and retry, then a dead letter. What is retried:

- a network error, a timeout, 408, 425, 429, 5xx (429 and 503 no sooner than Retry-After);
- not another 4xx, nor a 3xx: the endpoint understood the request and refused it, and the same
  signed body will be refused again. Such a delivery fails at once; once the receiver is fixed,
  `POST /v1/webhooks/{id}/deliveries/{delivery_id}/replay` sends it again.

Each attempt's status code, error, response time and the start of the answer's body (never
more than `SNIPPET_CHARS`) are written on the delivery row. A dead `webhook` job marks its
delivery failed and announces nothing (no `job.dead`): a broken endpoint subscribed to
`job.dead` would otherwise be fed a new delivery by each of its own failures, forever.

**Signing.** `Memmill-Signature: v1=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>`, the
timestamp in `Memmill-Timestamp`, so a receiver can refuse a replayed old request; README.md
shows the receiver's check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import BadInput, MemmillError, PermanentError, RetryLater, TransientError
from pipeline.jobs import JobRef, JobSpec
from pipeline.providers.http import parse_retry_after
from pipeline.settings import Settings, get_settings
from pipeline.stages import fetch

if TYPE_CHECKING:
    from pipeline.tasks import Deps, Writer

EVENTS = ("item.ready", "item.failed", "job.dead", "memory.added", "memory.updated",
          "memory.superseded", "memory.deleted", "operation.completed")
# Sent by POST /v1/webhooks/{id}/test whatever the endpoint subscribes to.
PING = "ping"
SECRET_PREFIX = "whsec_"
SNIPPET_CHARS = 200
USER_AGENT = "memmill-webhooks/0.1"
# The kinds of job an operation (pipeline/memory/operations.py) is carried out by.
OPERATION_KINDS = frozenset({jobs.EMBED_MEMORY, jobs.EXTRACT, jobs.FORGET, *jobs.UPKEEP_KINDS})
# A receiver asking to be left alone longer than this is asked again after this long.
MAX_RETRY_AFTER_S = 3600.0


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `Memmill-Signature` header's value for a body sent at `timestamp` (unix seconds)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1={digest.hexdigest()}"


def policy(settings: Settings) -> fetch.FetchPolicy:
    """The fetch's guard, allow list and all, with the webhook's timeout and no redirects."""
    return dataclasses.replace(fetch.fetch_policy(settings), timeout_s=settings.webhook_timeout_s,
                               max_redirects=0, user_agent=USER_AGENT)


async def check_url(url: str, guard: fetch.FetchPolicy) -> None:
    """Refuse, as a 422 naming why, a URL that no delivery could be sent to: not http(s), with
    credentials, or naming or resolving to an address the guard refuses. A resolver that fails
    or is slow passes here: every delivery checks the address again anyway."""
    try:
        parsed = fetch._parse(url)
        async with asyncio.timeout(guard.timeout_s):
            await fetch._vet(parsed, guard)
    except fetch._Refused as exc:
        raise BadInput(f"url: {exc.reason}") from None
    except PermanentError as exc:  # no such host
        raise BadInput(f"url: {exc}") from None
    except (TransientError, TimeoutError):
        return


# --- Emission ------------------------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _jsonable(data: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=_json_default))


async def emit(conn: asyncpg.Connection, tenant_id: int, event: str,
               data: Mapping[str, Any]) -> list[JobRef]:
    """Announce `event` to the tenant's endpoints that listen to it, in the caller's
    transaction; returns the jobs to enqueue after the commit (none without webhooks)."""
    hooks = [r["id"] for r in await conn.fetch(Q["webhooks.subscribers"], tenant_id, event)]
    if not hooks:
        return []
    rows = await conn.fetch(Q["webhooks.insert_deliveries"], tenant_id, hooks, event,
                            _jsonable(data))
    return await _queue(conn, tenant_id, [r["id"] for r in rows])


async def listened(conn: asyncpg.Connection, tenant_id: int) -> frozenset[str]:
    """The events the tenant's active endpoints listen to (one lookup): what a caller that
    announces several events, or must read more to announce one, asks first."""
    return frozenset(r["event"] for r in await conn.fetch(Q["webhooks.listened"], tenant_id))


async def _queue(conn: asyncpg.Connection, tenant_id: int,
                 delivery_ids: Sequence[uuid.UUID]) -> list[JobRef]:
    # The budget of attempts comes from the process's settings (MEMMILL_MAX_ATTEMPTS, or
    # MEMMILL_JOB_OVERRIDES for "webhook"): emit is called where no Settings object is at hand.
    budget = get_settings().max_attempts_for
    created: list[dict[str, Any]] = []
    for delivery_id in delivery_ids:
        created += await jobs.create_jobs(
            conn, tenant_id=tenant_id, item_id=None, version=None,
            specs=[JobSpec(jobs.WEBHOOK)], max_attempts=budget,
            payload={"delivery_id": str(delivery_id)})
    if created:
        await conn.executemany(Q["webhooks.link_job"],
                               [(d, row["id"]) for d, row in zip(delivery_ids, created,
                                                                strict=True)])
    return jobs.refs_to_enqueue(created)


async def deliver_once(conn: asyncpg.Connection, tenant_id: int, webhook_id: uuid.UUID,
                       event: str, data: Mapping[str, Any], *, event_at: datetime | None = None,
                       replay_of: uuid.UUID | None = None) -> tuple[uuid.UUID, list[JobRef]]:
    """One delivery to one endpoint, whatever it listens to: a test ping or a replay."""
    delivery_id = await conn.fetchval(Q["webhooks.insert_delivery"], tenant_id, webhook_id,
                                      event, _jsonable(data), event_at, replay_of)
    return delivery_id, await _queue(conn, tenant_id, [delivery_id])


def memory_data(row: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A memory as its events show it: enough to act on without reading it back."""
    fields = ("type", "content", "user_id", "agent_id", "session_id", "visibility",
              "confidence", "pinned", "version", "valid_until", "superseded_by")
    return {"memory_id": row["id"], **{k: row[k] for k in fields}, **extra}


# --- Where the ledger announces what its jobs did (pipeline/runner.py, pipeline/ledger.py) ----


async def job_done(conn: asyncpg.Connection, job: Mapping[str, Any], *,
                   item_ready: bool) -> list[JobRef]:
    """In a job's completion transaction: `item.ready` when this job made its item ready, and
    `operation.completed` when it carried out an operation. Other jobs cost nothing here."""
    refs = []
    if item_ready:
        refs += await emit(conn, job["tenant_id"], "item.ready", {
            "item_id": job["item_id"], "version": job["version"], "status": "ready"})
    if job["kind"] in OPERATION_KINDS:
        refs += await _operation_completed(conn, job, "done", None)
    return refs


async def job_dead(conn: asyncpg.Connection, job: Mapping[str, Any], reason: str, *,
                   permanent: bool) -> list[JobRef]:
    """In a job's dead-lettering transaction: `job.dead`, `item.failed` for an item's job and
    `operation.completed` for an operation's. A `webhook` job's death only fails its delivery:
    announcing it would feed a broken endpoint a delivery per failure, forever."""
    if job["kind"] == jobs.WEBHOOK:
        await _give_up(conn, job, f"gave up: {reason}")
        return []
    wanted = await listened(conn, job["tenant_id"])
    refs = []
    if "job.dead" in wanted:
        refs += await emit(conn, job["tenant_id"], "job.dead", {
            "job_id": job["id"], "kind": job["kind"], "item_id": job["item_id"],
            "version": job["version"], "attempts": job["attempts"], "permanent": permanent,
            "reason": reason})
    if "item.failed" in wanted and job["item_id"] is not None:
        refs += await _item_failed(conn, job, f"{job['kind']}: {reason}")
    if "operation.completed" in wanted:
        refs += await _operation_completed(conn, job, "failed", reason)
    return refs


async def job_cancelled(conn: asyncpg.Connection, job: Mapping[str, Any]) -> list[JobRef]:
    """In the transaction that cancels a job: its item failed, its operation cancelled."""
    if job["kind"] == jobs.WEBHOOK:
        await _give_up(conn, job, "its job was cancelled")
        return []
    wanted = await listened(conn, job["tenant_id"])
    refs = []
    if "item.failed" in wanted and job["item_id"] is not None:
        refs += await _item_failed(conn, job, f"{job['kind']}: cancelled by an operator")
    if "operation.completed" in wanted:
        refs += await _operation_completed(conn, job, "cancelled", None)
    return refs


async def _item_failed(conn: asyncpg.Connection, job: Mapping[str, Any],
                       error: str) -> list[JobRef]:
    return await emit(conn, job["tenant_id"], "item.failed", {
        "item_id": job["item_id"], "version": job["version"], "status": "failed",
        "error": error})


async def _operation_completed(conn: asyncpg.Connection, job: Mapping[str, Any], status: str,
                               error: str | None) -> list[JobRef]:
    if job["kind"] not in OPERATION_KINDS:
        return []
    if status == "done" and "operation.completed" not in await listened(conn, job["tenant_id"]):
        return []
    op = await conn.fetchrow(Q["webhooks.operation_of_job"], job["tenant_id"], job["id"])
    if op is None:  # none, or an extraction handed it to a later job (it completes there)
        return []
    return await emit(conn, job["tenant_id"], "operation.completed", {
        "operation_id": op["id"], "kind": op["kind"], "status": status, "result": op["result"],
        "error": error})


async def _give_up(conn: asyncpg.Connection, job: Mapping[str, Any], why: str) -> None:
    await conn.execute(Q["webhooks.give_up"], job["tenant_id"],
                       uuid.UUID(job["payload"]["delivery_id"]), why)


# --- Delivery ------------------------------------------------------------------------------


def envelope(row: Mapping[str, Any]) -> dict[str, Any]:
    """The body of a delivery: its id, the event, when it happened, the tenant's name (never its
    id, nor anything of the installation) and the event's data."""
    at = row["event_at"].astimezone(UTC).isoformat(timespec="milliseconds")
    return {"id": str(row["id"]), "event": row["event"], "created_at": at.replace("+00:00", "Z"),
            "tenant": row["tenant_name"], "data": row["payload"]}


def body_of(row: Mapping[str, Any]) -> bytes:
    return json.dumps(envelope(row), separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Attempt:
    """What one POST came to; `failure` is what the job raises when it was not a 2xx."""

    status_code: int | None
    snippet: str | None
    response_ms: float
    failure: MemmillError | None = None


async def _nothing(conn: asyncpg.Connection) -> None:
    return None


async def deliver(job: asyncpg.Record, deps: Deps) -> Writer:
    """The `webhook` task: send one delivery. Success is written with the job's `done`; a
    failed attempt is written first, then raised for the job wrapper to retry or dead-letter."""
    tenant_id = job["tenant_id"]
    delivery_id = uuid.UUID(job["payload"]["delivery_id"])
    row = await deps.pool.fetchrow(Q["webhooks.to_send"], tenant_id, delivery_id)
    if row is None or row["status"] == "delivered":
        return _nothing  # deleted with its endpoint, or sent by an attempt whose `done` was lost
    if not row["active"]:
        async def disabled(conn: asyncpg.Connection) -> None:
            await conn.execute(Q["webhooks.give_up"], tenant_id, delivery_id,
                               "not sent: the webhook was disabled")
        return disabled
    attempt = await send(row["url"], row["secret"], row["event"], delivery_id, body_of(row),
                         policy(deps.settings))
    if attempt.failure is not None:
        await deps.pool.execute(Q["webhooks.attempt_failed"], tenant_id, delivery_id,
                                attempt.status_code, str(attempt.failure), attempt.snippet,
                                attempt.response_ms)
        raise attempt.failure

    async def delivered(conn: asyncpg.Connection) -> None:
        await conn.execute(Q["webhooks.delivered"], tenant_id, delivery_id, attempt.status_code,
                           attempt.snippet, attempt.response_ms)

    return delivered


async def send(url: str, secret: str, event: str, delivery_id: uuid.UUID, body: bytes,
               guard: fetch.FetchPolicy) -> Attempt:
    """POST one signed body to `url` under the guard; never raises for what the endpoint or
    the network did: the returned attempt says it."""
    timestamp = int(time.time())
    headers = {"Content-Type": "application/json", "User-Agent": guard.user_agent,
               "Memmill-Event": event, "Memmill-Delivery": str(delivery_id),
               "Memmill-Timestamp": str(timestamp),
               "Memmill-Signature": sign(secret, timestamp, body)}
    started = time.monotonic()
    try:
        async with asyncio.timeout(guard.timeout_s):
            hop = await _vet(url, guard)
            answer = await _post(hop, body, headers, guard)
    except TimeoutError:
        failure: MemmillError = TransientError(
            f"POST {fetch._shown(url)} got no answer within {guard.timeout_s:g} s "
            "(MEMMILL_WEBHOOK_TIMEOUT_S)")
        return Attempt(None, None, _ms_since(started), failure)
    except (TransientError, PermanentError) as exc:
        return Attempt(None, None, _ms_since(started), exc)
    return Attempt(answer.status_code, answer.snippet, _ms_since(started),
                   _judge(answer, fetch._shown(url)))


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)


async def _vet(url: str, guard: fetch.FetchPolicy) -> fetch._Hop:
    """The fetch's check of a URL and of every address its host resolves to, now."""
    try:
        return await fetch._vet(fetch._parse(url), guard)
    except fetch._Refused as exc:
        raise PermanentError(f"not sent: {exc.reason}") from None


@dataclass(frozen=True)
class _Answer:
    status_code: int
    snippet: str
    location: str | None
    retry_after: str | None


async def _post(hop: fetch._Hop, body: bytes, headers: dict[str, str],
                guard: fetch.FetchPolicy) -> _Answer:
    """One POST to the hop's checked addresses, tried in order until one connects (nothing
    was sent before a connection), as the fetch does its GET."""
    shown = fetch._shown(hop.url)
    headers = {**headers, "Host": hop.url.netloc.decode("ascii")}
    extensions = {}
    if hop.url.scheme == "https" and fetch._literal_ip(hop.host) is None:
        extensions["sni_hostname"] = hop.host  # TLS names the host, not the address
    failure: httpx.TransportError | None = None
    for ip in hop.addresses:
        async with httpx.AsyncClient(verify=fetch._tls_context(), trust_env=False,
                                     follow_redirects=False, timeout=guard.timeout_s) as client:
            try:
                async with client.stream("POST", hop.pinned(ip), content=body, headers=headers,
                                         extensions=extensions) as response:
                    return _Answer(response.status_code, await _snippet(response),
                                   response.headers.get("location"),
                                   response.headers.get("retry-after"))
            except httpx.ConnectError as exc:
                if cert := fetch._cert_problem(exc):
                    raise PermanentError(f"POST {shown}: the TLS certificate of {hop.host} "
                                         f"does not check out: {cert.verify_message or cert}"
                                         ) from None
                failure = exc
            except httpx.TimeoutException as exc:
                raise TransientError(f"POST {shown} timed out ({type(exc).__name__})") from None
            except httpx.TransportError as exc:
                raise TransientError(f"POST {shown} failed: {exc or type(exc).__name__}"
                                     ) from None
    addresses = ", ".join(map(str, hop.addresses))
    raise TransientError(f"cannot connect to {shown} ({addresses}): {failure}")


async def _snippet(response: httpx.Response) -> str:
    """The start of the answer's body, as text Postgres can store; the rest is never read."""
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= SNIPPET_CHARS * 4:
            break
    text = data.decode("utf-8", "replace").replace("\x00", "\ufffd")
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS - 1] + "…"


def _judge(answer: _Answer, shown: str) -> MemmillError | None:
    """None for a 2xx; else what the job raises: retried, or failed at once (module doc)."""
    status = answer.status_code
    if 200 <= status < 300:
        return None
    said = f"POST {shown} answered {status}"
    if status in (429, 503):
        wait = parse_retry_after(answer.retry_after)
        wait = min(wait, MAX_RETRY_AFTER_S) if wait is not None else None
        return RetryLater(said + (f"; retry after {wait:g} s" if wait is not None else ""),
                          retry_after_s=wait)
    if status in (408, 425) or status >= 500:
        return TransientError(said)
    if 300 <= status < 400:
        where = f" to {answer.location[:200]}" if answer.location else ""
        return PermanentError(f"{said}{where}; redirects are not followed: give the webhook "
                              "the URL that answers")
    if 400 <= status < 500:
        return PermanentError(f"{said}: the endpoint refused the delivery, and would refuse "
                              "it again; replay it once the endpoint is fixed")
    return TransientError(said)
