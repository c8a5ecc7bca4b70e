"""The Python client (`memmill.Memmill`, `memmill.AsyncMemmill`) against the real API and a real
worker; its retries against a small real HTTP server that answers 429 and 503 as memmill does.

The API runs in this test's event loop, so the blocking client runs in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest
import uvicorn

from memmill import AsyncMemmill, Memmill
from memmill.client import (
    AuthenticationFailed,
    Conflict,
    InvalidRequest,
    NotFound,
    OperationFailed,
    PermissionDenied,
    RateLimited,
    RetryPolicy,
    Unavailable,
)
from memmill.client.calls import Call
from pipeline import quotas, tenants
from pipeline.settings import Settings
from tests.conftest import free_port

T = TypeVar("T")
FAST = RetryPolicy(attempts=3, base_s=0.01, max_wait_s=2.0)


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[None]:
    """A real worker, polling, for the writes that wait for their work."""
    from workers.main import build_worker

    running = build_worker(settings, sweep=False, poll_delay_s=0.02)
    task = asyncio.create_task(running.main())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await running.close()


@pytest.fixture
async def amm(api_url: str, tenant: tuple[int, str]) -> AsyncIterator[AsyncMemmill]:
    async with AsyncMemmill(api_url, tenant[1], retry=FAST) as client:
        yield client


async def blocking(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


async def test_items_round_trip_waits_for_ready_and_searches(
    amm: AsyncMemmill, worker: None
) -> None:
    put = await amm.items.put("notes/bread", "Sourdough rises thanks to wild yeast.",
                              tags={"topic": "baking"}, wait=True)
    assert put.change == "created" and put.item.id == "notes/bread"
    item = await amm.items.get("notes/bread")
    assert item.status == "ready" and item.tags["topic"] == "baking" and item.summary
    found = await amm.search("what makes bread rise", filters={"tags": {"topic": "baking"}})
    assert found.results[0].item.id == "notes/bread"
    await amm.items.put("notes/bread", "Sourdough rises thanks to wild yeast and bacteria.",
                        wait=True)
    assert [v.offset for v in await amm.items.versions("notes/bread")] == [0, 1]
    assert (await amm.items.get("notes/bread", version=1)).version == 1
    states = await amm.items.lookup(["notes/bread", "nowhere"])
    assert states.missing == ["nowhere"] and states.items[0].status == "ready"
    assert (await amm.items.delete("notes/bread", purge=True)).outcome == "deleted"
    with pytest.raises(NotFound, match="notes/bread"):
        await amm.items.get("notes/bread")


async def test_a_batch_waits_for_every_item_and_reports_refusals(
    amm: AsyncMemmill, worker: None
) -> None:
    result = await amm.items.batch([{"id": f"b/{i}", "content": f"Note {i} on tides."}
                                    for i in range(5)] + [{"id": "bad"}], wait=30)
    assert [a.id for a in result.accepted] == [f"b/{i}" for i in range(5)]
    assert [r.index for r in result.refused] == [5]
    states = await amm.items.lookup([f"b/{i}" for i in range(5)])
    assert {s.status for s in states.items} == {"ready"}


async def test_the_blocking_client_does_the_same(
    api_url: str, tenant: tuple[int, str], worker: None
) -> None:
    def work() -> tuple[Any, ...]:
        with Memmill(api_url, tenant[1], retry=FAST) as mm:
            mm.items.put("k", "Kelp forests shelter sea otters.", wait=True)
            written = mm.memories.add("Ana prefers the window seat", user_id="ana", wait=True)
            hits = mm.memories.search("where does Ana like to sit", user_id="ana")
            jobs = list(mm.jobs.iterate(item_id="k", page_size=1))
            return mm.items.get("k"), written, hits, jobs

    item, written, hits, jobs = await blocking(work)
    assert item.status == "ready"
    assert hits.results[0].kind == "memory"
    assert hits.results[0].id == str(written.memory.id)
    assert sorted(j.kind for j in jobs) == ["analyze", "embed", "summarize"]


async def test_memories_pages_versions_and_history(amm: AsyncMemmill, worker: None) -> None:
    ids = [(await amm.memories.add(f"Fact number {i} about comets", user_id="u1",
                                   agent_id="a1")).memory.id for i in range(5)]
    seen = [m.id async for m in amm.memories.iterate(user_id="u1", agent_id="a1", page_size=2)]
    assert sorted(seen) == sorted(ids)
    first = await amm.memories.get(str(ids[0]), user_id="u1", agent_id="a1")
    updated = await amm.memories.update(str(ids[0]), expected_version=first.version,
                                        user_id="u1", agent_id="a1",
                                        content="Fact number 0 about comets, corrected",
                                        wait=True)
    assert updated.memory.version == first.version + 1
    with pytest.raises(Conflict) as stale:
        await amm.memories.update(str(ids[0]), expected_version=first.version, user_id="u1",
                                  agent_id="a1", content="again")
    assert str(updated.memory.version) in stale.value.detail
    history = await amm.memories.history(str(ids[0]), user_id="u1", agent_id="a1")
    assert sorted(h.operation for h in history.history) == ["add", "update"]
    await amm.memories.invalidate(str(ids[1]), reason="no longer true", user_id="u1",
                                  agent_id="a1")
    await amm.memories.delete(str(ids[2]), user_id="u1", agent_id="a1")
    with pytest.raises(NotFound):
        await amm.memories.get(str(ids[2]), user_id="u1", agent_id="a1")
    valid = [m.id async for m in amm.memories.iterate(user_id="u1", agent_id="a1",
                                                       valid_only=True)]
    assert ids[1] not in valid and ids[2] not in valid and ids[0] in valid


async def test_sessions_extract_and_context(amm: AsyncMemmill, worker: None) -> None:
    events = [{"role": "user", "content": "I moved to Lisbon last spring.", "event_id": "e1"},
              {"role": "assistant", "content": "Lisbon is lovely.", "event_id": "e2"}]
    accepted = await amm.sessions.add_events("s1", events, user_id="ana", wait=True)
    assert accepted.stored == 2
    extracted = await amm.sessions.extract("s1", user_id="ana", wait=True)
    done = await amm.operations.wait(str(extracted.operation_id), user_id="ana")
    assert done.status == "done"
    assert [e.event_id async for e in amm.sessions.iterate_events(
        "s1", user_id="ana", page_size=1)] == ["e1", "e2"]
    context = await amm.context(user_id="ana", session_id="s1", query="where does Ana live",
                                max_tokens=300)
    assert "Lisbon" in context.context
    assert [s.id async for s in amm.sessions.iterate(user_id="ana")] == ["s1"]


async def test_refusals_are_exceptions_with_the_servers_message(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str], worker: None
) -> None:
    async with AsyncMemmill(api_url, "mm_wrong", retry=FAST) as wrong:
        with pytest.raises(AuthenticationFailed) as caught:
            await wrong.usage()
        assert caught.value.status == 401
    reader_key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], reader_key, name="reader", role="read")
    async with AsyncMemmill(api_url, reader_key, retry=FAST) as reader:
        with pytest.raises(PermissionDenied, match="read-only"):
            await reader.items.put("x", "text")
    async with AsyncMemmill(api_url, tenant[1], retry=FAST) as amm:
        with pytest.raises(InvalidRequest) as invalid:
            await amm.memories.add("text", user_id="has space")
        assert invalid.value.errors and "user_id" in invalid.value.detail
        with pytest.raises(OperationFailed, match="failed"):  # a private address: refused
            await amm.items.put("inside", uri="http://127.0.0.1:9/secret", wait=30)


async def test_a_long_retry_after_is_raised_with_the_limit(
    api_url: str, pool: asyncpg.Pool, other_tenant: tuple[int, str], settings: Settings
) -> None:
    await quotas.set_limits(pool, other_tenant[0], requests_per_minute=2)
    async with AsyncMemmill(api_url, other_tenant[1], retry=FAST) as amm:
        await amm.usage()
        await amm.usage()
        with pytest.raises(RateLimited) as limited:
            await amm.usage()
    assert limited.value.limit == "requests_per_minute"
    assert limited.value.retry_after_s is not None and limited.value.retry_after_s > 2


class Flaky:
    """A real HTTP server answering each path with a script of statuses, then 200."""

    def __init__(self, script: dict[str, list[tuple[int, dict[str, str]]]]) -> None:
        self.script = script
        self.seen: list[tuple[str, str, float]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        loop = asyncio.get_running_loop()
        self.seen.append((scope["method"], scope["path"], loop.time()))
        queue = self.script.get(scope["path"], [])
        status, headers = queue.pop(0) if queue else (200, {})
        body = b'{"detail": "try later"}' if status >= 400 else b'{"status": "ok"}'
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"),
            *((k.encode(), v.encode()) for k, v in headers.items())]})
        await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def flaky(app: Flaky) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_429_and_503_are_retried_after_retry_after() -> None:
    app = Flaky({"/healthz": [(429, {"Retry-After": "1"}), (503, {})],
                 "/v1/usage": [(503, {}), (503, {}), (503, {})]})
    async with flaky(app) as url, AsyncMemmill(url, "k", retry=FAST) as amm:
        assert await amm.health() == {"status": "ok"}
        times = [at for _, path, at in app.seen if path == "/healthz"]
        assert len(times) == 3 and 0.95 <= times[1] - times[0] < 1.5
        with pytest.raises(Unavailable, match="try later"):
            await amm.usage()
    assert [path for _, path, _ in app.seen].count("/v1/usage") == 3  # FAST: 3 attempts


async def test_a_write_is_not_sent_twice_after_a_broken_connection() -> None:
    port = free_port()  # nothing listens: every try fails to connect
    attempts: list[httpx.Request] = []

    def record(request: httpx.Request) -> None:
        attempts.append(request)

    async with AsyncMemmill(f"http://127.0.0.1:{port}", "k", retry=FAST) as amm:
        amm.http.event_hooks["request"] = [_async(record)]
        with pytest.raises(Exception, match="cannot reach"):
            await amm.items.put("x", "text")
        assert len(attempts) == 1
        with pytest.raises(Exception, match="cannot reach"):
            await amm.items.get("x")
        assert len(attempts) == 1 + FAST.attempts


def _async(fn: Callable[[httpx.Request], None]) -> Callable[[httpx.Request], Any]:
    async def hook(request: httpx.Request) -> None:
        fn(request)
    return hook


@pytest.mark.parametrize(("status", "method", "attempt", "retry_after", "expected"), [
    (429, "POST", 1, "2", 2.0),          # told: waited, whatever the method
    (503, "POST", 1, None, 0.25),        # not told: base 0.5 x 2^0 x jitter 0.5
    (503, "GET", 3, None, 1.0),          # 0.5 x 2^2 x 0.5
    (429, "GET", 1, "60", None),         # told to wait past max_wait_s: raise at once
    (502, "GET", 1, None, 0.25),         # a proxy's failure: only for calls sent twice safely
    (502, "POST", 1, None, None),
    (500, "GET", 1, None, None),         # the server's own failure is not retried
    (429, "GET", 4, None, None),         # attempts spent
])
def test_retry_policy_table(status: int, method: str, attempt: int, retry_after: str | None,
                            expected: float | None) -> None:
    policy = RetryPolicy(attempts=4, base_s=0.5, max_wait_s=30)
    headers = {"Retry-After": retry_after} if retry_after else {}
    response = httpx.Response(status, headers=headers)
    call = Call(method, "/x", dict)  # type: ignore[arg-type]
    assert policy.delay_s(attempt, call, response, rand=0.5) == expected


def test_a_connection_error_is_retried_only_for_calls_sent_twice_safely() -> None:
    policy = RetryPolicy(attempts=4, base_s=0.5)
    assert policy.delay_s(1, Call("GET", "/x", dict), None, rand=1.0) == 0.5
    assert policy.delay_s(1, Call("POST", "/x", dict), None, rand=1.0) is None


async def test_an_unknown_tenant_key_is_refused_without_retries(api_url: str) -> None:
    app_key = f"mm_{uuid.uuid4().hex}"
    async with AsyncMemmill(api_url, app_key, retry=FAST) as amm:
        with pytest.raises(AuthenticationFailed):
            await amm.memories.types()
