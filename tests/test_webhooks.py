"""Webhooks end to end: the real API, real workers (`drain`) and a real HTTP receiver on
127.0.0.1, which the SSRF guard refuses unless MEMMILL_FETCH_ALLOW lets it through (as in
tests/test_fetch.py). Every delivery the receiver gets is checked with the verification
snippet read from README.md, so the documented receiver is the one tested."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from arq import create_pool as create_arq_pool
from arq.connections import RedisSettings

from pipeline import webhooks
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from pipeline.sweeper import sweep_once
from tests.conftest import drain

README = Path(__file__).resolve().parent.parent / "README.md"
WEBHOOK_TABLES = ("webhooks", "webhook_deliveries", "audit_log")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The receiver listens on loopback, which only the allow list lets deliveries reach."""
    return settings.model_copy(update={"fetch_allow": ["127.0.0.1"]})


def readme_verifier() -> Callable[[str, bytes, str, str], bool]:
    """The `verify` function of README.md's "Verifying a delivery", run as it is printed."""
    text = README.read_text()
    section = text[text.index("### Verifying a delivery"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None, "README.md lost its verification snippet"
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), "README.md", "exec"), namespace)
    return namespace["verify"]


# --- The receiver ----------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


# What a path answers when its script is empty; any other path answers 200.
ANSWERS = {"/down": 500, "/gone": 410, "/missing": 404, "/moved": 302}


@dataclass
class Receiver:
    """A raw HTTP/1.1 server: each path answers a scripted list of statuses, then its default
    (200 unless the path says otherwise), and every request is kept."""

    port: int = 0
    requests: list[Request] = field(default_factory=list)
    script: dict[str, list[int]] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def posts(self, path: str | None = None) -> list[Request]:
        return [r for r in self.requests
                if r.method == "POST" and (path is None or r.path == path)]

    def events(self, path: str) -> list[str]:
        return [r.json()["event"] for r in self.posts(path)]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            method, path = request_line.split(" ")[:2]
            headers = {k.strip().lower(): v.strip()
                       for k, _, v in (line.partition(":") for line in lines if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Request(method, path, headers, body))
            queued = self.script.get(path)
            status = queued.pop(0) if queued else ANSWERS.get(path, 200)
            answer = b"thanks" if status < 300 else b"no: " + b"x" * 1000
            extra = "Location: /elsewhere\r\n" if status == 302 else ""
            writer.write(f"HTTP/1.1 {status} Status\r\nContent-Length: {len(answer)}\r\n{extra}"
                         "Connection: close\r\n\r\n".encode() + answer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    state = Receiver()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    yield state
    server.close()
    await server.wait_closed()


# --- Helpers ---------------------------------------------------------------------------------


async def create(http: httpx.AsyncClient, url: str, events: list[str],
                 **fields: Any) -> dict[str, Any]:
    r = await http.post("/v1/webhooks", json={"url": url, "events": events, **fields})
    assert r.status_code == 201, r.text
    return r.json()


async def deliveries(http: httpx.AsyncClient, hook: dict[str, Any]) -> list[dict[str, Any]]:
    r = await http.get(f"/v1/webhooks/{hook['id']}/deliveries", params={"limit": 200})
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def sweep(settings: Settings, pool: asyncpg.Pool) -> None:
    """Enqueue what no route enqueued (an invalidation, a single delete), as a worker's sweeper
    does every few seconds; drain() runs its workers without one."""
    assert settings.redis_url
    queue = await create_arq_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        await sweep_once(pool, queue, settings)
    finally:
        await queue.aclose()


def check_signed(request: Request, secret: str, event: str | None = None) -> dict[str, Any]:
    """A delivery as the README tells a receiver to check it; returns its body."""
    verify = readme_verifier()
    headers = request.headers
    assert verify(secret, request.body, headers["memmill-timestamp"],
                  headers["memmill-signature"]), headers
    body = request.json()
    assert headers["content-type"] == "application/json"
    assert headers["memmill-delivery"] == body["id"]
    assert headers["memmill-event"] == body["event"]
    assert set(body) == {"id", "event", "created_at", "tenant", "data"}
    assert body["tenant"] == "default"
    if event is not None:
        assert body["event"] == event
    return body


# --- Tests -----------------------------------------------------------------------------------


async def test_every_event_is_delivered_signed_as_the_readme_says(
        http: httpx.AsyncClient, receiver: Receiver, settings: Settings,
        pool: asyncpg.Pool) -> None:
    hook = await create(http, receiver.url("/all"), list(webhooks.EVENTS),
                        description="everything")
    secret = hook["secret"]
    assert secret.startswith("whsec_") and len(secret) >= 6 + 43

    # item.ready; item.failed and job.dead (a URL that answers 404: a permanent failure).
    assert (await http.post("/v1/items", json={"id": "notes/bread", "content":
                                               "Sourdough rises thanks to wild yeast."})
            ).status_code == 202
    assert (await http.post("/v1/items", json={"id": "web/missing",
                                               "uri": receiver.url("/missing")})
            ).status_code == 202
    # memory.added and operation.completed (its embedding), then memory.updated (PATCH).
    scope = {"user_id": "ana"}
    r = await http.post("/v1/memories", json={"scope": scope, "type": "fact",
                                              "content": "Ana keeps bees."})
    assert r.status_code == 201, r.text
    memory = r.json()["memory"]
    r = await http.patch(f"/v1/memories/{memory['id']}", json={
        "scope": scope, "expected_version": 1, "content": "Ana keeps two hives of bees."})
    assert r.status_code == 200, r.text
    await drain(settings, pool)
    # memory.superseded (and memory.added) by extraction: a contradiction of what was said.
    for event_id, text, at in (("1", "I live in Denver.", "2024-01-01T10:00:00Z"),
                               ("2", "I live in Boston.", "2024-06-01T10:00:00Z")):
        r = await http.post("/v1/sessions/moves/events", json={"scope": scope, "events": [
            {"event_id": event_id, "role": "user", "sender_name": "Ana", "ending": True,
             "content": text, "created_at": at}]})
        assert r.status_code == 202, r.text
        await drain(settings, pool)
    # memory.deleted: one by DELETE (enqueued by the sweep), the rest by scope (a forget job).
    r = await http.delete(f"/v1/memories/{memory['id']}", params=scope)
    assert r.status_code == 204, r.text
    await sweep(settings, pool)
    r = await http.post("/v1/memories/delete", json={"scope": scope})
    assert r.status_code == 202, r.text
    await drain(settings, pool)

    bodies = [check_signed(p, secret) for p in receiver.posts("/all")]
    by_event: dict[str, list[dict[str, Any]]] = {}
    for body in bodies:
        by_event.setdefault(body["event"], []).append(body["data"])
    assert set(by_event) == set(webhooks.EVENTS), sorted(by_event)
    assert len({b["id"] for b in bodies}) == len(bodies)  # one delivery, one id
    ready = [d for d in by_event["item.ready"] if d["item_id"] == "notes/bread"]
    assert ready == [{"item_id": "notes/bread", "version": 1, "status": "ready"}]
    failed = by_event["item.failed"][0]
    assert failed["item_id"] == "web/missing" and "404" in failed["error"]
    dead = by_event["job.dead"][0]
    assert (dead["kind"], dead["item_id"], dead["permanent"]) == ("regularize", "web/missing",
                                                                  True)
    added = [d["content"] for d in by_event["memory.added"]]
    assert "Ana keeps bees." in added and any("Boston" in c for c in added)
    updated = by_event["memory.updated"][0]
    assert updated["memory_id"] == memory["id"] and updated["changed"] == ["content"]
    superseded = by_event["memory.superseded"][0]
    assert "Denver" in superseded["content"] and superseded["valid_until"] is not None
    assert superseded["superseded_by"] in {d["memory_id"] for d in by_event["memory.added"]}
    deleted = [i for d in by_event["memory.deleted"] for i in d["memory_ids"]]
    assert memory["id"] in deleted and len(deleted) >= 3
    kinds = {(d["kind"], d["status"]) for d in by_event["operation.completed"]}
    assert {("embed", "done"), ("extract", "done"), ("forget", "done")} <= kinds

    logged = await deliveries(http, hook)
    assert len(logged) == len(bodies)
    assert {d["status"] for d in logged} == {"delivered"}
    assert all(d["last_status_code"] == 200 and d["last_response"] == "thanks"
               and d["response_ms"] > 0 for d in logged)
    assert [d["created_at"] for d in logged] == sorted((d["created_at"] for d in logged),
                                                       reverse=True)


async def test_a_tampered_or_stale_delivery_fails_the_readme_check(
        http: httpx.AsyncClient, receiver: Receiver, settings: Settings,
        pool: asyncpg.Pool) -> None:
    hook = await create(http, receiver.url("/hook"), ["item.ready"])
    r = await http.post(f"/v1/webhooks/{hook['id']}/test")
    assert r.status_code == 202 and r.json()["event"] == "ping", r.text
    await drain(settings, pool)
    (request,) = receiver.posts("/hook")
    body = check_signed(request, hook["secret"], "ping")
    assert body["data"]["webhook_id"] == hook["id"]
    verify = readme_verifier()
    stamp, signature = request.headers["memmill-timestamp"], request.headers["memmill-signature"]
    assert not verify(hook["secret"], request.body + b" ", stamp, signature)
    assert not verify("whsec_" + "x" * 43, request.body, stamp, signature)
    old = str(int(stamp) - 301)
    resigned = webhooks.sign(hook["secret"], int(old), request.body)
    assert not verify(hook["secret"], request.body, old, resigned)  # five minutes old
    assert verify(hook["secret"], request.body, str(int(time.time()) - 200),
                  webhooks.sign(hook["secret"], int(time.time()) - 200, request.body))


async def test_a_failing_endpoint_is_retried_then_dead_lettered_without_a_loop(
        http: httpx.AsyncClient, receiver: Receiver, settings: Settings,
        pool: asyncpg.Pool) -> None:
    flaky = await create(http, receiver.url("/flaky"), ["item.ready"])
    receiver.script["/flaky"] = [500, 503]
    # Listens to job.dead and never answers well: its own deaths must not feed it.
    broken = await create(http, receiver.url("/down"), ["job.dead"])
    gone = await create(http, receiver.url("/gone"), ["item.ready"])
    moved = await create(http, receiver.url("/moved"), ["item.ready"])
    await http.post("/v1/items", json={"id": "a", "content": "Bees make honey."})
    await http.post("/v1/items", json={"id": "web/missing", "uri": receiver.url("/missing")})
    # A loop would keep the queue busy forever, and drain() with it: bounded, it fails instead.
    async with asyncio.timeout(60):
        await drain(settings, pool)

    (delivered,) = await deliveries(http, flaky)
    assert (delivered["status"], delivered["attempts"], delivered["last_status_code"]) == (
        "delivered", 3, 200)
    assert len(receiver.posts("/flaky")) == 3
    assert len({r.headers["memmill-delivery"] for r in receiver.posts("/flaky")}) == 1
    attempts = (await http.get(f"/v1/jobs/{delivered['job_id']}")).json()["history"]
    assert [a["outcome"] for a in attempts] == ["retry", "retry", "done"]
    assert "answered 500" in attempts[0]["error"] and "answered 503" in attempts[1]["error"]
    detail = (await http.get(f"/v1/webhooks/{flaky['id']}/deliveries/{delivered['id']}")).json()
    assert [(a["status_code"], a["error"] is None) for a in detail["history"]] == [
        (500, False), (503, False), (200, True)]
    assert all(a["response_ms"] > 0 for a in detail["history"])

    (failed,) = await deliveries(http, broken)
    assert (failed["status"], failed["attempts"], failed["last_status_code"]) == (
        "failed", settings.max_attempts, 500)
    assert "answered 500" in failed["last_error"]
    assert failed["last_response"].startswith("no: ") and len(failed["last_response"]) == 200
    assert len(receiver.posts("/down")) == settings.max_attempts
    dead = (await http.get("/v1/dead-letters", params={"kind": "webhook"})).json()["data"]
    assert {d["job_id"] for d in dead} >= {failed["job_id"]}
    # The regularize job's death was announced once; the webhook job's death was not.
    assert await pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1",
                               uuid.UUID(broken["id"])) == 1
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'webhook' AND status "
                               "NOT IN ('done', 'dead')") == 0

    for hook, words in ((gone, "answered 410"), (moved, "redirects are not followed")):
        (refused,) = await deliveries(http, hook)
        assert (refused["status"], refused["attempts"]) == ("failed", 1), refused
        assert words in refused["last_error"]


async def test_the_log_pages_and_a_replay_resends_the_payload(
        http: httpx.AsyncClient, receiver: Receiver, settings: Settings,
        pool: asyncpg.Pool) -> None:
    hook = await create(http, receiver.url("/log"), ["item.ready"])
    receiver.script["/log"] = [410]
    for n in range(3):
        await http.post("/v1/items", json={"id": f"n/{n}", "content": f"Note number {n}."})
    await drain(settings, pool)
    everything = await deliveries(http, hook)
    assert len(everything) == 3
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await http.get(f"/v1/webhooks/{hook['id']}/deliveries", params=params)).json()
        seen += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [d["id"] for d in seen] == [d["id"] for d in everything]
    failed = [d for d in everything if d["status"] == "failed"]
    assert len(failed) == 1
    only = await http.get(f"/v1/webhooks/{hook['id']}/deliveries",
                          params={"status": "failed", "event": "item.ready"})
    assert [d["id"] for d in only.json()["data"]] == [failed[0]["id"]]

    original = (await http.get(f"/v1/webhooks/{hook['id']}/deliveries/{failed[0]['id']}")
                ).json()
    assert original["payload"]["id"] == original["id"]
    assert original["payload"]["event"] == "item.ready"
    r = await http.post(f"/v1/webhooks/{hook['id']}/deliveries/{original['id']}/replay")
    assert r.status_code == 202, r.text
    replay = r.json()
    assert replay["replay_of"] == original["id"] and replay["id"] != original["id"]
    await drain(settings, pool)
    resent = (await http.get(f"/v1/webhooks/{hook['id']}/deliveries/{replay['id']}")).json()
    assert resent["status"] == "delivered"
    assert resent["payload"]["data"] == original["payload"]["data"]
    assert resent["payload"]["created_at"] == original["payload"]["created_at"]
    sent = check_signed(receiver.posts("/log")[-1], hook["secret"], "item.ready")
    assert sent == resent["payload"]
    still = (await http.get(f"/v1/webhooks/{hook['id']}/deliveries/{original['id']}")).json()
    assert still["status"] == "failed"
    actions = [r["action"] for r in await pool.fetch("SELECT action FROM audit_log ORDER BY id")]
    assert actions == ["webhook.create", "webhook.replay"]


async def test_managing_webhooks_never_shows_the_secret_but_rotates_it(
        http: httpx.AsyncClient, receiver: Receiver, settings: Settings,
        pool: asyncpg.Pool) -> None:
    hook = await create(http, receiver.url("/m"), ["item.ready", "item.ready", "job.dead"])
    assert hook["events"] == ["item.ready", "job.dead"] and hook["active"] is True
    shown = [await http.get("/v1/webhooks"), await http.get(f"/v1/webhooks/{hook['id']}"),
             await http.patch(f"/v1/webhooks/{hook['id']}", json={"description": "mine"})]
    for r in shown:
        assert r.status_code == 200, r.text
        assert hook["secret"] not in r.text and "secret\"" not in r.text
    assert shown[0].json()["count"] == 1
    assert shown[2].json()["description"] == "mine"
    cleared = await http.patch(f"/v1/webhooks/{hook['id']}", json={"description": None})
    assert cleared.json()["description"] is None

    rotated = await http.post(f"/v1/webhooks/{hook['id']}/rotate-secret")
    assert rotated.status_code == 200
    new_secret = rotated.json()["secret"]
    assert new_secret != hook["secret"] and rotated.json()["secret_rotated_at"]
    await http.post(f"/v1/webhooks/{hook['id']}/test")
    await drain(settings, pool)
    check_signed(receiver.posts("/m")[-1], new_secret, "ping")

    off = await http.patch(f"/v1/webhooks/{hook['id']}", json={"active": False})
    assert off.json()["active"] is False
    await http.post("/v1/items", json={"id": "quiet", "content": "Nobody hears this."})
    await drain(settings, pool)
    assert len(await deliveries(http, hook)) == 1  # the ping only
    assert (await http.post(f"/v1/webhooks/{hook['id']}/test")).status_code == 409

    r = await http.delete(f"/v1/webhooks/{hook['id']}")
    assert r.status_code == 204
    assert (await http.get(f"/v1/webhooks/{hook['id']}")).status_code == 404
    assert await pool.fetchval("SELECT count(*) FROM webhook_deliveries") == 0
    actions = [r["action"] for r in await pool.fetch("SELECT action FROM audit_log ORDER BY id")]
    assert actions == ["webhook.create", "webhook.update", "webhook.update",
                       "webhook.rotate_secret", "webhook.update", "webhook.delete"]
    row = await pool.fetchrow("SELECT key_id, target, via FROM audit_log ORDER BY id LIMIT 1")
    assert (row["target"], row["via"]) == (hook["id"], "api") and row["key_id"] is not None


async def test_another_tenants_webhooks_and_deliveries_are_404(
        api_url: str, http: httpx.AsyncClient, receiver: Receiver,
        other_tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    hook = await create(http, receiver.url("/mine"), ["item.ready"])
    await http.post(f"/v1/webhooks/{hook['id']}/test")
    await drain(settings, pool)
    (delivery,) = await deliveries(http, hook)
    base = f"/v1/webhooks/{hook['id']}"
    one = f"{base}/deliveries/{delivery['id']}"
    async with httpx.AsyncClient(base_url=api_url, timeout=30, headers={
            "Authorization": f"Bearer {other_tenant[1]}"}) as other:
        assert (await other.get("/v1/webhooks")).json() == {"data": [], "count": 0}
        calls = [other.get(base), other.patch(base, json={"active": False}),
                 other.post(f"{base}/rotate-secret"), other.post(f"{base}/test"),
                 other.get(f"{base}/deliveries"), other.get(one), other.post(f"{one}/replay"),
                 other.delete(base)]
        for call in calls:
            r = await call
            assert r.status_code == 404, (r.request.url, r.text)
            assert hook["secret"] not in r.text
        # Its own webhook does not see the first tenant's delivery either.
        theirs = (await other.post("/v1/webhooks", json={
            "url": receiver.url("/theirs"), "events": ["item.ready"]})).json()
        r = await other.get(f"/v1/webhooks/{theirs['id']}/deliveries/{delivery['id']}")
        assert r.status_code == 404
    # Events of one tenant reach only its own endpoints.
    await http.post("/v1/items", json={"id": "x", "content": "Only mine."})
    await drain(settings, pool)
    assert receiver.posts("/theirs") == []
    assert (await http.get(base)).json()["active"] is True


BAD_CREATES: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"url": "URL", "events": ["item.readdy"]}, ("unknown event", "item.readdy")),
    ({"url": "URL", "events": []}, ("at least one event",)),
    ({"url": "URL"}, ("events", "required")),
    ({"url": "URL", "events": "item.ready"}, ("events", "list")),
    ({"events": ["item.ready"]}, ("url", "required")),
    ({"url": "ftp://127.0.0.1/x", "events": ["item.ready"]}, ("url", "http")),
    ({"url": "http://user:pw@127.0.0.1/x", "events": ["item.ready"]}, ("url", "credentials")),
    ({"url": "http://10.1.2.3/hook", "events": ["item.ready"]}, ("url", "private address")),
    ({"url": "http://169.254.169.254/latest", "events": ["item.ready"]},
     ("url", "metadata service")),
    ({"url": "http://metadata.google.internal/", "events": ["item.ready"]}, ("url", "metadata")),
    ({"url": "http://[::1]:9/", "events": ["item.ready"]}, ("url", "loopback")),
    ({"url": "http://127.0.0.2:9/", "events": ["item.ready"]}, ("url", "loopback")),
    ({"url": "http://no-such-host.invalid/", "events": ["item.ready"]},
     ("url", "does not exist")),
    ({"url": "http://" + "a" * 2050, "events": ["item.ready"]}, ("url", "2048")),
    ({"url": "URL", "events": ["item.ready"], "secret": "whsec_mine"},
     ("unknown field", "secret")),
    ({"url": "URL", "events": ["item.ready"], "active": "yes"}, ("active", "boolean")),
    ({"url": "URL", "events": ["item.ready"], "description": "d" * 501}, ("description", "500")),
]


async def test_bad_inputs_are_422_and_write_nothing(
        http: httpx.AsyncClient, receiver: Receiver, pool: asyncpg.Pool) -> None:
    failures = []
    for payload, words in BAD_CREATES:
        body = {k: (receiver.url("/x") if v == "URL" else v) for k, v in payload.items()}
        r = await http.post("/v1/webhooks", json=body)
        detail = r.json().get("detail", "") if r.status_code == 422 else r.text
        if r.status_code != 422 or not all(w.lower() in detail.lower() for w in words):
            failures.append(f"{payload}: {r.status_code} {detail}")
    assert not failures, "\n".join(failures)
    hook = await create(http, receiver.url("/ok"), ["item.ready"])
    for patch, words in (({"url": None}, ("url", "null")), ({"events": ["nope"]}, ("nope",)),
                         ({"url": "http://10.0.0.1/"}, ("private",)),
                         ({"active": None}, ("active", "null"))):
        r = await http.patch(f"/v1/webhooks/{hook['id']}", json=patch)
        assert r.status_code == 422 and all(w in r.json()["detail"] for w in words), r.text
    for path in ("/v1/webhooks/not-a-uuid", f"/v1/webhooks/{hook['id']}/deliveries/x"):
        assert (await http.get(path)).status_code == 422
    r = await http.get(f"/v1/webhooks/{hook['id']}/deliveries", params={"cursor": "garbage"})
    assert r.status_code == 422 and "cursor" in r.json()["detail"]
    counts = {t: await pool.fetchval(f"SELECT count(*) FROM {t}") for t in WEBHOOK_TABLES}
    assert counts == {"webhooks": 1, "webhook_deliveries": 0, "audit_log": 1}
    row = await pool.fetchrow("SELECT url, events FROM webhooks")
    assert (row["url"], row["events"]) == (receiver.url("/ok"), ["item.ready"])


async def test_a_tenant_has_a_limited_number_of_webhooks(
        receiver: Receiver, settings: Settings, tenant: tuple[int, str],
        pool: asyncpg.Pool) -> None:
    from tests.conftest import serving

    few = settings.model_copy(update={"webhook_max_endpoints": 2})
    async with serving(few) as url, httpx.AsyncClient(base_url=url, timeout=30, headers={
            "Authorization": f"Bearer {tenant[1]}"}) as http:
        made = await asyncio.gather(*(http.post("/v1/webhooks", json={
            "url": receiver.url(f"/{n}"), "events": ["item.ready"]}) for n in range(4)))
        statuses = sorted(r.status_code for r in made)
        assert statuses == [201, 201, 409, 409], [r.text for r in made]
        refused = next(r for r in made if r.status_code == 409)
        assert "MEMMILL_WEBHOOK_MAX_ENDPOINTS" in refused.json()["detail"]
    assert await pool.fetchval("SELECT count(*) FROM webhooks") == 2


async def test_a_delivery_checks_the_address_again_when_it_is_sent(
        http: httpx.AsyncClient, receiver: Receiver, settings: Settings,
        pool: asyncpg.Pool) -> None:
    """Allowed when it was made, refused when sent: the guard runs at every delivery."""
    hook = await create(http, receiver.url("/late"), ["item.ready"])
    await http.post(f"/v1/webhooks/{hook['id']}/test")
    await drain(settings.model_copy(update={"fetch_allow": []}), pool)
    (refused,) = await deliveries(http, hook)
    assert (refused["status"], refused["attempts"]) == ("failed", 1)
    assert "127.0.0.1 is a loopback address" in refused["last_error"]
    assert refused["last_status_code"] is None
    assert receiver.requests == []


async def test_changes_whose_route_enqueues_nothing_are_sent_by_the_next_sweep(
        http: httpx.AsyncClient, receiver: Receiver, settings: Settings,
        pool: asyncpg.Pool) -> None:
    """A cancel (its item fails, its operation is cancelled) and an invalidation are written
    with their deliveries; nothing enqueues those, so the sweeper does."""
    hook = await create(http, receiver.url("/swept"),
                        ["item.failed", "operation.completed", "memory.updated"])
    item = (await http.post("/v1/items", json={"id": "c", "content": "Cancel me."})).json()
    scope = {"user_id": "bo"}
    written = (await http.post("/v1/memories", json={"scope": scope, "type": "fact",
                                                     "content": "Bo likes tea."})).json()
    embed_job = await pool.fetchval("SELECT job_id FROM operations WHERE id = $1",
                                    uuid.UUID(written["operation_id"]))
    for job_id in (item["jobs"][0]["id"], embed_job):
        r = await http.post(f"/v1/jobs/{job_id}/cancel")
        assert r.status_code == 200, r.text
    r = await http.post(f"/v1/memories/{written['memory']['id']}/invalidate",
                        json={"scope": scope, "reason": "Bo switched to coffee"})
    assert r.status_code == 200, r.text
    # Written with the changes, and not enqueued by anyone (drain() would wait for them).
    assert len(await deliveries(http, hook)) == 3
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'webhook' AND "
                               "status = 'queued' AND enqueued_at IS NULL") == 3
    await sweep(settings, pool)
    await drain(settings, pool)
    bodies = [check_signed(p, hook["secret"]) for p in receiver.posts("/swept")]
    data = {b["event"]: b["data"] for b in bodies}
    assert len(bodies) == 3 and set(data) == {"item.failed", "operation.completed",
                                              "memory.updated"}
    assert data["item.failed"]["error"].endswith("cancelled by an operator")
    assert (data["operation.completed"]["operation_id"], data["operation.completed"]["status"]
            ) == (written["operation_id"], "cancelled")
    assert data["memory.updated"]["changed"] == ["valid_until"]
    assert data["memory.updated"]["reason"] == "Bo switched to coffee"
