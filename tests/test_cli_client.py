"""The CLI on the typed client (`memmill.Memmill`), against the real API, Postgres and queue:
the JSON it prints is the server's answer exactly as the server sent it (its nulls, its number
forms, its key order), the options that reach the client's newer arguments (`--until`, a
delete by `--session`) work end to end, and a server that says "come back later" is retried
briefly, or shown at once when later is far off."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import uvicorn
from typer.testing import CliRunner, Result

from memmill.cli import CLI_ATTEMPTS, CLI_MAX_WAIT_S, app
from pipeline import quotas
from pipeline.settings import Settings
from tests.conftest import drain, free_port

runner = CliRunner()


async def cli(api_url: str, key: str, *args: str) -> Result:
    """The CLI in a thread (the API answers from this test's event loop)."""
    env = {"MEMMILL_URL": api_url, "MEMMILL_API_KEY": key, "MEMMILL_DATA_DIR": None,
           "COLUMNS": "200"}
    return await asyncio.to_thread(runner.invoke, app, list(args), env=env)


async def answer(response: Any) -> Any:
    r = await response
    assert r.status_code < 300, r.text
    return r.json()


def same_json(result: Result, raw: Any, *, varying: tuple[str, ...] = ()) -> None:
    """What the command printed is `raw`, compared as JSON text, so that 1 and 1.0, a null
    and a missing key, or another key order all count as a difference. `varying` names the
    top-level keys that change from one call to the next (timings)."""
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    printed = json.loads(result.stdout)
    for name in varying:
        del printed[name], raw[name]
    assert json.dumps(printed) == json.dumps(raw)


async def test_printed_json_is_the_servers_answer(
    api_url: str, http: httpx.AsyncClient, tenant: tuple[int, str], settings: Settings,
    pool: asyncpg.Pool,
) -> None:
    key = tenant[1]
    await answer(http.post("/v1/items", json={"id": "tides", "title": "Tides",
                                              "content": "Spring tides follow the full moon."}))
    # A private address: regularize refuses it for good, which leaves a dead letter.
    await answer(http.post("/v1/items", json={"id": "inside", "uri": "http://127.0.0.1:9/x"}))
    added = await answer(http.post("/v1/memories", json={
        "content": "Ana sails at spring tide", "scope": {"user_id": "u1"}, "type": "fact"}))
    await answer(http.post("/v1/sessions/s1/events", json={"scope": {"user_id": "u1"}, "events": [
        {"event_id": "e1", "role": "user", "content": "When is the spring tide?"}]}))
    await drain(settings, pool)
    memory_id = added["memory"]["id"]
    u1 = {"user_id": "u1"}

    item = await answer(http.get("/v1/items/tides"))
    assert item["accessed_at"] is None and item["summary"] is not None
    same_json(await cli(api_url, key, "get", "tides"), item)
    job = await answer(http.get(f"/v1/jobs/{item['jobs'][0]['id']}"))
    same_json(await cli(api_url, key, "jobs", "show", job["id"]), job)
    (letter,) = (await answer(http.get("/v1/dead-letters")))["data"]
    same_json(await cli(api_url, key, "dead-letters", "show", str(letter["id"])),
              await answer(http.get(f"/v1/dead-letters/{letter['id']}")))

    memory = await answer(http.get(f"/v1/memories/{memory_id}", params=u1))
    assert memory["valid_until"] is None and memory["superseded_by"] is None
    same_json(await cli(api_url, key, "memory", "get", memory_id, "--user", "u1", "--json"),
              memory)
    same_json(await cli(api_url, key, "memory", "history", memory_id, "--user", "u1",
                        "--json"),
              await answer(http.get(f"/v1/memories/{memory_id}/history", params=u1)))
    same_json(await cli(api_url, key, "sessions", "show", "s1", "--user", "u1", "--json"),
              await answer(http.get("/v1/sessions/s1", params=u1)))
    same_json(await cli(api_url, key, "sessions", "events", "s1", "--user", "u1", "--json"),
              await answer(http.get("/v1/sessions/s1/events", params=u1)))
    same_json(await cli(api_url, key, "sessions", "list", "--user", "u1", "--json"),
              await answer(http.get("/v1/sessions", params=u1)))
    asked = {"scope": u1, "session_id": "s1", "query": "tide", "max_tokens": 200}
    same_json(await cli(api_url, key, "context", "--user", "u1", "--session", "s1", "--query",
                        "tide", "--max-tokens", "200", "--json"),
              await answer(http.post("/v1/context", json=asked)))

    # Without the blend, whose recency term moves with the clock, the scores stay put.
    same_json(await cli(api_url, key, "search", "spring tides", "--blend", "0", "--no-track",
                        "--json"),
              await answer(http.post("/v1/search", json={"query": "spring tides", "blend": 0,
                                                         "track": False})),
              varying=("timings_ms",))
    same_json(await cli(api_url, key, "memory", "search", "spring tide", "--user", "u1",
                        "--events", "--json"),
              await answer(http.post("/v1/memories/search", json={
                  "query": "spring tide", "scope": u1, "include_events": True})),
              varying=("timings_ms",))


async def test_invalidate_until_and_delete_by_session(
    api_url: str, http: httpx.AsyncClient, tenant: tuple[int, str], settings: Settings,
    pool: asyncpg.Pool,
) -> None:
    key = tenant[1]
    ids = {}
    for text, session in (("Bo rows at dawn", "s9"), ("Bo rows at dusk", "s8")):
        result = await cli(api_url, key, "memory", "add", text, "--type", "fact", "--user",
                           "bo", "--session", session)
        assert result.exit_code == 0, result.output
        ids[session] = result.stdout.split()[0]
    await drain(settings, pool)

    result = await cli(api_url, key, "memory", "invalidate", ids["s8"], "--user", "bo",
                       "--reason", "moved inland", "--until", "2024-05-01T12:00:00Z",
                       "--version", "1")
    assert result.exit_code == 0, result.output
    assert "invalid from 2024-05-01 12:00:00: moved inland" in result.stdout
    memory = await answer(http.get(f"/v1/memories/{ids['s8']}", params={"user_id": "bo"}))
    assert memory["valid_until"] == "2024-05-01T12:00:00Z"

    async def worker() -> None:
        while True:
            await drain(settings, pool)
            await asyncio.sleep(0.1)

    draining = asyncio.create_task(worker())
    try:
        result = await cli(api_url, key, "memory", "delete", "--session", "s9", "--yes")
    finally:
        draining.cancel()
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == ("deleted 1 memories of session s9 in 1 batch(es); "
                                     "0 remaining")
    left = await pool.fetch("SELECT id::text FROM memories")
    assert [row["id"] for row in left] == [ids["s8"]]


class Refusing:
    """A real HTTP server that refuses `GET /v1/queues` with a status and a Retry-After as
    many times as scripted, then answers it as memmill does."""

    def __init__(self, refusals: list[tuple[int, str]]) -> None:
        self.refusals = refusals
        self.seen: list[float] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.seen.append(time.monotonic())
        if self.refusals:
            status, retry_after = self.refusals.pop(0)
            body = json.dumps({"detail": f"busy; come back in {retry_after} s"}).encode()
            headers = [(b"retry-after", retry_after.encode())]
        else:
            status, body, headers = 200, b'{"data": []}', []
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def refusing(app_: Refusing) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app_, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_a_short_retry_after_is_waited_for_a_few_times() -> None:
    assert CLI_ATTEMPTS <= 3 and CLI_MAX_WAIT_S <= 10
    server = Refusing([(429, "1"), (503, "1")])
    async with refusing(server) as url:
        result = await cli(url, "k", "queues", "list")
    assert result.exit_code == 0, result.output
    assert len(server.seen) == 3 and server.seen[1] - server.seen[0] >= 0.95

    server = Refusing([(503, "0")] * (CLI_ATTEMPTS + 1))
    async with refusing(server) as url:
        result = await cli(url, "k", "queues", "list")
    assert result.exit_code == 1 and "busy; come back in 0 s" in result.stderr
    assert len(server.seen) == CLI_ATTEMPTS


async def test_a_long_retry_after_is_shown_at_once(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    assert CLI_MAX_WAIT_S < 20
    server = Refusing([(429, "20")])
    started = time.monotonic()
    async with refusing(server) as url:
        result = await cli(url, "k", "queues", "list")
    assert time.monotonic() - started < 5
    assert result.exit_code == 1 and "come back in 20 s" in result.stderr
    assert len(server.seen) == 1

    # memmill's own rate limit: a minute's window, so its Retry-After is far past 10 s.
    await quotas.set_limits(pool, tenant[0], requests_per_minute=1)
    assert (await cli(api_url, tenant[1], "queues", "list")).exit_code == 0
    started = time.monotonic()
    result = await cli(api_url, tenant[1], "queues", "list")
    assert time.monotonic() - started < 5
    assert result.exit_code == 1 and "requests_per_minute" in result.stderr, result.output
