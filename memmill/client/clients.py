"""`Memmill` and `AsyncMemmill`: the same operations (`memmill.client.resources`), blocking
or awaited."""

from __future__ import annotations

import os
from typing import Any, Generic

import httpx

from memmill.client.calls import Async, Mode, Sync
from memmill.client.resources import (
    Audit,
    DeadLetters,
    Items,
    Jobs,
    Keys,
    Memories,
    Operations,
    Queues,
    Root,
    Sessions,
    Tenants,
)
from memmill.client.transport import AsyncRunner, RetryPolicy, SyncRunner

DEFAULT_URL = "http://127.0.0.1:8700"
DEFAULT_TIMEOUT_S = 30.0


def resolve(url: str | None, key: str | None) -> tuple[str, str | None]:
    """The server and key: as given, else `MEMMILL_URL` and `MEMMILL_API_KEY`, else the
    local default (`memmill up`'s port) and no key."""
    return (url or os.environ.get("MEMMILL_URL") or DEFAULT_URL).rstrip("/"), (
        key or os.environ.get("MEMMILL_API_KEY"))


def headers_for(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


class _Groups(Root[Mode], Generic[Mode]):
    items: Items[Mode]
    memories: Memories[Mode]
    sessions: Sessions[Mode]
    operations: Operations[Mode]
    jobs: Jobs[Mode]
    dead_letters: DeadLetters[Mode]
    queues: Queues[Mode]
    tenants: Tenants[Mode]
    keys: Keys[Mode]
    audit: Audit[Mode]

    def _attach(self, runner: SyncRunner | AsyncRunner) -> None:
        self._runner = runner
        for name, group in (("items", Items), ("memories", Memories), ("sessions", Sessions),
                            ("operations", Operations), ("jobs", Jobs),
                            ("dead_letters", DeadLetters), ("queues", Queues),
                            ("tenants", Tenants), ("keys", Keys), ("audit", Audit)):
            setattr(self, name, group(runner))


class Memmill(_Groups[Sync]):
    """The memmill API, blocking.

        with Memmill("http://127.0.0.1:8700", key) as mm:
            mm.memories.add("Ana prefers window seats", user_id="ana", wait=True)
            hits = mm.memories.search("where does Ana like to sit", user_id="ana")

    Each method returns the API's own response model and raises a `MemmillError` subclass
    for a refusal (`NotFound`, `Conflict`, `RateLimited`, ...), carrying the server's message.
    A 429 or 503 is retried, after `Retry-After` when the server gives one (see
    `RetryPolicy`); `timeout_s` bounds each request. `transport` replaces the network (an
    `httpx.MockTransport`, or `httpx.WSGITransport`)."""

    def __init__(self, url: str | None = None, key: str | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        base_url, key = resolve(url, key)
        self.http = httpx.Client(base_url=base_url, headers=headers_for(key), timeout=timeout_s,
                                 transport=transport)
        self._attach(SyncRunner(self.http, retry or RetryPolicy()))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Memmill:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncMemmill(_Groups[Async]):
    """The memmill API, awaited; everything as `Memmill` has it.

        async with AsyncMemmill(url, key) as mm:
            await mm.sessions.add_events("s1", [{"role": "user", "content": "hi"}],
                                         user_id="ana")
            async for memory in mm.memories.iterate(user_id="ana"):
                ...

    `transport` may be an `httpx.ASGITransport` of memmill's own app, which is how the API's
    MCP endpoint calls the API in process."""

    def __init__(self, url: str | None = None, key: str | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 headers: dict[str, str] | None = None) -> None:
        base_url, key = resolve(url, key)
        self.http = httpx.AsyncClient(base_url=base_url, headers={**headers_for(key),
                                                                  **(headers or {})},
                                      timeout=timeout_s, transport=transport)
        self._attach(AsyncRunner(self.http, retry or RetryPolicy()))

    async def close(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncMemmill:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()
