"""Abuse from a tenant holding a valid key, against the real API served in this process
(`serving()` runs uvicorn in the test's own event loop, so the test process's memory is the
server's): 100 MB bodies, JSON nested 100,000 deep, filters past what the schema allows, and a
burst of 10,000 requests. Each gets a clear 4xx, never a 5xx, the server's memory stays flat,
and the next request, or another tenant's meanwhile, is served.

Keys that are wrong, revoked, of a suspended tenant or in the wrong header are
tests/test_hosting.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import psutil
import pytest

from api.roles import role_needed
from pipeline import tenants
from pipeline.settings import Settings
from tests.test_bad_input import sample

# Hundreds of megabytes sent and a 10,000-request burst: with the slow suites, in CI.
pytestmark = pytest.mark.slow

MB = 1 << 20
HUGE = 100 * MB
# Growth of the server's resident memory that counts as holding a 100 MB body: a fifth of
# it; an import's, two fifths: it keeps up to 16 MB of its body in memory before it spools
# it to disk, and copies those once as it does.
HELD_MB = 20
IMPORT_HELD_MB = 40
DEEP = 100_000
IMPORT_LIMIT = 64 * MB  # what a hosting installation might set; the default is 2 GB


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """An import limit below 100 MB (MEMMILL_MAX_IMPORT_REQUEST_BYTES), as a hosting
    installation sets it: the default, 2 GB, takes a 100 MB import."""
    return settings.model_copy(update={"max_import_request_bytes": IMPORT_LIMIT})


@pytest.fixture
async def admin_key(pool: asyncpg.Pool, tenant: tuple[int, str]) -> str:
    """An admin key: the import, like every route a tenant's admin may call, is in reach."""
    key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], key, name="admin", role="admin")
    return key


@contextlib.contextmanager
def peak_rss() -> Iterator[list[float]]:
    """The growth of this process's resident memory at its peak, in MB (sampled every 2 ms in
    a thread, so a buffer the server fills and frees within a request is seen)."""
    process = psutil.Process()
    start = process.memory_info().rss
    grown = [0.0]
    done = threading.Event()

    def sample_rss() -> None:
        while not done.is_set():
            grown[0] = max(grown[0], (process.memory_info().rss - start) / MB)
            time.sleep(0.002)

    thread = threading.Thread(target=sample_rss, daemon=True)
    thread.start()
    try:
        yield grown
    finally:
        done.set()
        thread.join()


@dataclass
class Answer:
    status: int
    body: bytes
    sent: int  # body bytes written before the status line arrived


async def post_until_answered(api_url: str, key: str, path: str, content_type: str,
                              chunks: AsyncIterator[bytes], *, declared: int | None) -> Answer:
    """POST a body over a raw connection, a chunk at a time, and stop writing as soon as the
    server answers: `sent` is how much of the body the server needed to refuse it. With
    `declared`, Content-Length says so many bytes, and the server is given a moment to answer
    from the headers alone before any byte of the body goes out."""
    where = urlsplit(api_url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    length = (f"Content-Length: {declared}" if declared is not None
              else "Transfer-Encoding: chunked")
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {key}"
                 f"\r\nContent-Type: {content_type}\r\n{length}\r\n\r\n".encode())
    await writer.drain()
    head = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
    sent = 0
    try:
        if declared is not None:
            await asyncio.wait({head}, timeout=2)
        async for chunk in chunks:
            if head.done():
                break
            writer.write(chunk if declared is not None
                         else f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            try:
                await asyncio.wait_for(writer.drain(), 10)
            except (ConnectionError, TimeoutError):
                break
            sent += len(chunk)
            await asyncio.wait({head}, timeout=0.005)  # the server runs in this loop
        status_line, *headers = (await asyncio.wait_for(head, 30)).decode().split("\r\n")
        size = next(int(h.split(":")[1]) for h in headers if h.lower().startswith(
            "content-length:"))
        return Answer(int(status_line.split()[1]), await reader.readexactly(size), sent)
    finally:
        head.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def repeated(first: bytes, chunk: bytes, total: int) -> AsyncIterator[bytes]:
    """`first`, then `chunk` again and again up to `total` bytes: the same object each time,
    so the sender holds no more than one chunk."""
    yield first
    for _ in range((total - len(first)) // len(chunk)):
        yield chunk


def item_body() -> AsyncIterator[bytes]:
    """100 MB of one item's content."""
    return repeated(b'{"id": "huge", "content": "', b"x" * MB, HUGE)


def import_body() -> AsyncIterator[bytes]:
    """100 MB of an export: a header, then items of 1 MB each, every line valid on its own,
    so nothing but the size refuses it."""
    header = json.dumps({"type": "header", "format": "memmill-export", "version": 1,
                         "exported_at": "2026-01-01T00:00:00Z", "counts": {"item": 100}})

    async def lines() -> AsyncIterator[bytes]:
        yield header.encode() + b"\n"
        text = "y" * (MB - 200)
        for n in range(100):
            yield json.dumps({"type": "item", "id": f"big-{n}", "source": {
                "media_type": "text/plain", "content": text}}).encode() + b"\n"
    return lines()


async def warm_up(api_url: str, key: str) -> None:
    """What the first requests load (the query model, loaded in the background from the
    start, and each route's code) is not the body's: load it before measuring."""
    async with httpx.AsyncClient(base_url=api_url, timeout=120,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        assert (await http.post("/v1/search", json={"query": "warm up"})).status_code == 200
        await http.post("/v1/items", json={"id": "warm", "content": "Warm."})
        await http.post("/v1/import", content=b"{}\n",
                        headers={"Content-Type": "application/x-ndjson"})


BODIES = {"/v1/items": ("application/json", item_body, 4_000_000, HELD_MB),
          "/v1/import": ("application/x-ndjson", import_body, IMPORT_LIMIT, IMPORT_HELD_MB)}


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", sorted(BODIES))
async def test_a_100_mb_body_is_refused_without_being_held(
        api_url: str, admin_key: str, pool: asyncpg.Pool, path: str, declared: bool) -> None:
    content_type, body, limit, held = BODIES[path]
    await warm_up(api_url, admin_key)
    with peak_rss() as grown:
        answer = await post_until_answered(api_url, admin_key, path, content_type, body(),
                                           declared=HUGE if declared else None)
    assert answer.status == 413, answer
    assert f"limit of {limit} bytes" in json.loads(answer.body)["detail"]
    if declared:
        assert answer.sent == 0, "a declared size over the limit is refused from the headers"
    else:  # refused at the limit, give or take what the sockets buffer
        assert answer.sent < limit + 16 * MB, answer.sent
    assert grown[0] < held, f"the server's memory grew by {grown[0]:.0f} MB"
    assert await pool.fetchval("SELECT count(*) FROM items WHERE id <> 'warm'") == 0
    async with httpx.AsyncClient(base_url=api_url, timeout=30,
                                 headers={"Authorization": f"Bearer {admin_key}"}) as http:
        assert (await http.get("/v1/jobs")).status_code == 200
        put = await http.post("/v1/items", json={"id": "after", "content": "Still served."})
        assert put.status_code == 202, put.text


def nested(depth: int) -> str:
    """JSON arrays nested `depth` deep: far past what any reader should follow."""
    return "[" * depth + "]" * depth


NUMERIC_IDS = ("key_id", "tenant_id", "dead_letter_id")
UUID_IDS = ("memory_id", "operation_id", "webhook_id", "delivery_id", "job_id")


def _path_value(name: str) -> str:
    if name in NUMERIC_IDS:
        return "1"
    return str(uuid.uuid4()) if name in UUID_IDS else "x"


def json_operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every operation that takes a JSON body: its method, a URL with its path parameters
    filled in, and its body's schema."""
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                url = re.sub(r"\{([^}]+)\}", lambda m: _path_value(m.group(1)), path)
                yield method.upper(), url, content["application/json"]["schema"]


async def test_json_nested_100000_deep_is_a_422_on_every_route(
        api_url: str, admin_key: str, pool: asyncpg.Pool) -> None:
    """As a whole body and inside a field, on every route that takes JSON, and in an
    import's line: a 422 saying so, never a 5xx."""
    deep = nested(DEEP)
    problems = []
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {admin_key}"}) as http:
        doc = (await http.get("/openapi.json")).json()
        for method, url, schema in json_operations(doc):
            inside = json.dumps(sample(schema, doc))
            inside = inside[:-1] + (", " if inside != "{}" else "") + f'"deep": {deep}}}' \
                if inside.startswith("{") else deep
            for what, body in (("body", deep), ("field", inside)):
                r = await http.request(method, url, content=body.encode(),
                                       headers={"Content-Type": "application/json"})
                if role_needed(method, url) == "operator" and r.status_code == 403:
                    continue  # refused from the headers, before the body is read
                if r.status_code != 422 or "nested too deeply" not in r.json()["detail"]:
                    problems.append(f"{method} {url} ({what}): {r.status_code} {r.text[:200]}")
        header = json.dumps({"type": "header", "format": "memmill-export", "version": 1,
                             "exported_at": "2026-01-01T00:00:00Z", "counts": {"item": 1}})
        r = await http.post("/v1/import", content=f"{header}\n{deep}\n".encode(),
                            headers={"Content-Type": "application/x-ndjson"})
        if r.status_code != 422 or "line 2" not in r.json()["detail"]:
            problems.append(f"POST /v1/import (line): {r.status_code} {r.text[:200]}")
        assert not problems, "\n".join(problems)
        assert await pool.fetchval("SELECT count(*) FROM items") == 0
        assert (await http.post("/v1/items", json={"id": "after", "content": "Fine."})
                ).status_code == 202


async def test_an_upload_whose_tags_nest_100000_deep_is_a_422(
        http: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    r = await http.post("/v1/items/upload", files={"file": ("deep.txt", b"Deep.")},
                        data={"tags": nested(DEEP)})
    assert r.status_code == 422 and "tags" in r.json()["detail"], r.text[:300]
    assert await pool.fetchval("SELECT count(*) FROM items") == 0


async def test_filters_past_the_schema_are_refused_and_at_the_schema_served(
        http: httpx.AsyncClient) -> None:
    """10,000 values where the schema allows 1,000 (and 1,001): a 422 naming the bound. The
    most the schema allows, 50 tag keys of 1,000 values each (50,000 values), is served."""
    many = [f"v{n}" for n in range(10_000)]
    refused = {
        "10,000 tag values": ({"tags": {"lang": many}}, "1 to 1000"),
        "1,001 tag values": ({"tags": {"lang": many[:1001]}}, "1 to 1000"),
        "51 tag keys": ({"tags": {f"k{n}": "v" for n in range(51)}}, "50 tag keys"),
        "10,000 item ids": ({"item_ids": many}, "1000"),
        "101 kinds": ({"kinds": many[:101]}, "100"),
    }
    for what, (filters, words) in refused.items():
        r = await http.post("/v1/search", json={"query": "bread", "filters": filters})
        assert r.status_code == 422 and words in r.json()["detail"], (what, r.text[:300])
    r = await http.post("/v1/memories/search", json={"query": "tea", "scope": {"user_id": "u"},
                                                     "types": many[:51]})
    assert r.status_code == 422 and "51" in r.json()["detail"], r.text[:300]
    assert (await http.post("/v1/items", json={"id": "doc", "content": "Bread and tea.",
                                               "tags": {"k0": "v999"}})).status_code == 202
    widest = {f"k{n}": many[n * 1000:(n + 1) * 1000] for n in range(10)} | {
        f"k{n}": many[:1000] for n in range(10, 50)}
    for filters in ({"tags": widest}, {"item_ids": many[:1000]},
                    {"tags": widest, "item_ids": many[:1000], "kinds": many[:100]}):
        r = await http.post("/v1/search", json={"query": "bread", "mode": "fts",
                                                "filters": filters})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["results"] == []
    assert (await http.post("/v1/search", json={"query": "bread", "mode": "fts"})
            ).status_code == 200


# --- A burst of requests ---------------------------------------------------------------------


@dataclass
class Tally:
    statuses: dict[int, int]
    errors: dict[str, int]  # requests that got no answer at all
    retry_after: set[str]
    bodies_named_the_limit: bool
    elapsed_s: float


async def get_once_more(http: httpx.AsyncClient, path: str) -> httpx.Response:
    """A GET, sent again once if the kept-alive connection it went out on was closed under
    it: uvicorn closes a connection idle for 5 s, and a client busy with 49 others may send
    on it just as it does (a client's usual retry of an idempotent request)."""
    try:
        return await http.get(path)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await http.get(path)


async def burst(api_url: str, key: str, *, requests: int, concurrency: int) -> Tally:
    """`requests` small GETs, `concurrency` at a time, from one tenant's key."""
    statuses: dict[int, int] = {}
    errors: dict[str, int] = {}
    retry_after: set[str] = set()
    named = True
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        queue.put_nowait(n)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=api_url, timeout=60, limits=limits,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        async def worker() -> None:
            nonlocal named
            while not queue.empty():
                queue.get_nowait()
                try:
                    r = await get_once_more(http, "/v1/memory-types")
                except httpx.TransportError as exc:  # counted, as a 5xx would be
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code == 429:
                    retry_after.add(r.headers.get("Retry-After", ""))
                    named = named and r.json().get("limit") == "requests_per_minute"

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Tally(statuses, errors, retry_after, named, time.monotonic() - started)


async def test_a_burst_of_10000_requests_is_limited_and_never_slows_another_tenant(
        api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str],
        other_tenant: tuple[int, str]) -> None:
    """Tenant A (600 requests a minute) sends 10,000 requests, 50 at a time: exactly the
    limit is served and the rest get 429 with Retry-After, none a 5xx; meanwhile tenant B's
    requests are all served."""
    operator = tenants.new_key()
    await tenants.add_key(pool, tenant[0], operator, name="ops", role="operator")
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {operator}"}) as ops:
        r = await ops.put(f"/v1/tenants/{other_tenant[0]}/limits",
                          json={"requests_per_minute": 600})
        assert r.status_code == 200, r.text
    noisy_key, quiet_key = other_tenant[1], tenant[1]
    quiet: list[int] = []
    bursting = asyncio.Event()

    async def neighbour() -> None:
        async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                     headers={"Authorization": f"Bearer {quiet_key}"}) as http:
            while not bursting.is_set():
                quiet.append((await http.get("/v1/memory-types")).status_code)
                await asyncio.sleep(0.02)

    beside = asyncio.create_task(neighbour())
    try:
        tally = await burst(api_url, noisy_key, requests=10_000, concurrency=50)
    finally:
        bursting.set()
        await beside
    assert not tally.errors and set(tally.statuses) <= {200, 429}, tally
    served = tally.statuses.get(200, 0)
    if tally.elapsed_s < 60:  # one window: exactly the limit
        assert served == 600, tally
    else:
        assert 600 <= served <= 600 * (1 + tally.elapsed_s / 60), tally
    assert tally.statuses[429] == 10_000 - served
    assert tally.bodies_named_the_limit
    assert tally.retry_after and all(v.isdigit() and 1 <= int(v) <= 60
                                     for v in tally.retry_after), tally.retry_after
    assert len(quiet) >= 10 and set(quiet) == {200}, quiet
