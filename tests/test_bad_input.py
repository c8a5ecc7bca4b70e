"""Every bad input gets a clear 4xx whose `detail` says what is wrong, and writes nothing.

Each case runs against the real API with an item already stored, and the database is compared
before and after: no table gains a row and the stored item is exactly as it was. A missing or
wrong key is a 401 whatever else is wrong with the request.

The cases are tables, grouped by what they get wrong; each group is one test (a fresh database
and server per test is what makes a test cost), and a group reports every case that fails.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest

TABLES = ("items", "sources", "jobs", "item_versions", "parts")
EXISTING = "notes/existing"
GOOD = {"id": EXISTING, "content": "The existing note, stored before each bad request."}


@dataclass(frozen=True)
class Case:
    name: str
    payload: Any  # bytes are sent as they are, anything else as JSON
    status: int
    words: tuple[str, ...]  # each must appear in the detail (case-insensitive)
    content_type: str = "application/json"

    def content(self) -> bytes:
        """JSON with \\u escapes, so lone surrogates and control characters survive the trip."""
        if isinstance(self.payload, bytes):
            return self.payload
        return json.dumps(self.payload).encode()


def body(**fields: Any) -> dict[str, Any]:
    """The good body with some fields replaced; a field set to `...` is left out."""
    return {k: v for k, v in {**GOOD, **fields}.items() if v is not ...}


async def snapshot(pool: asyncpg.Pool) -> dict[str, Any]:
    async def rows(sql: str) -> list[dict[str, Any]]:
        return [dict(r) for r in await pool.fetch(sql)]

    return {
        "counts": {t: await pool.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES},
        "items": await rows("SELECT * FROM items ORDER BY tenant_id, id"),
        "sources": await rows("SELECT * FROM sources ORDER BY tenant_id, item_id, version"),
        "jobs": await rows("SELECT * FROM jobs ORDER BY id"),
    }


async def empty_counts(pool: asyncpg.Pool) -> dict[str, int]:
    return {t: await pool.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES}


def detail_problem(r: httpx.Response, status: int, words: tuple[str, ...]) -> str | None:
    """What is wrong with a refusal, or None when it has the status and a useful detail."""
    if r.status_code != status:
        return f"status {r.status_code}, expected {status}: {r.text[:300]}"
    try:
        detail = r.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return f"no JSON detail: {r.text[:300]}"
    if not isinstance(detail, str) or not detail:
        return f"detail is not a message: {detail!r}"
    missing = [w for w in words if w.lower() not in detail.lower()]
    return f"detail {detail!r} does not mention {missing}" if missing else None


async def run_cases(
    cases: list[Case],
    send: Callable[[Case], Awaitable[httpx.Response]],
    pool: asyncpg.Pool,
    expected_state: dict[str, Any],
) -> None:
    """Send every case; after each, the database must be exactly `expected_state`."""
    failures = []
    for case in cases:
        problem = detail_problem(await send(case), case.status, case.words)
        if problem is None and await snapshot(pool) != expected_state:
            problem = "the database changed"
        if problem:
            failures.append(f"{case.name}: {problem}")
    assert not failures, "\n".join(failures)


@pytest.fixture
async def http(api_url: str, tenant: tuple[int, str]) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {tenant[1]}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture
async def stored(http: httpx.AsyncClient, pool: asyncpg.Pool) -> dict[str, Any]:
    """One good item, stored (not processed) before the bad requests: the state to keep."""
    r = await http.post("/v1/items", json=GOOD)
    assert r.status_code == 202, r.text
    state = await snapshot(pool)
    assert state["counts"] == {"items": 1, "sources": 1, "jobs": 3, "item_versions": 0, "parts": 0}
    return state


# --- POST /v1/items

ITEM_CASES: dict[str, list[Case]] = {
    "body": [
        Case("malformed JSON", b'{"id": "notes/existing", "content": ', 422, ("JSON",)),
        Case("trailing garbage", json.dumps(GOOD).encode() + b" }", 422, ("JSON",)),
        Case("not UTF-8", b'{"id": "notes/existing", "content": "caf\xe9"}', 422, ("UTF-8",)),
        Case("empty body", b"", 422, ("JSON",)),
        Case("a JSON list", [GOOD], 422, ("JSON object",)),
        Case("a JSON string", "notes", 422, ("JSON object",)),
        Case("a JSON null", None, 422, ("JSON object",)),
        Case(
            "not sent as JSON",
            json.dumps(GOOD).encode(),
            422,
            ("Content-Type",),
            content_type="application/x-www-form-urlencoded",
        ),
        Case("unknown field", body(summary="mine"), 422, ("unknown field", "summary")),
        Case("two unknown fields", body(a=1, b=2), 422, ("'a'", "'b'")),
    ],
    "id": [
        Case("missing id", body(id=...), 422, ("id", "required")),
        Case("id a number", body(id=5), 422, ("id", "string")),
        Case("id null", body(id=None), 422, ("id", "string")),
        Case("id empty", body(id=""), 422, ("id", "empty")),
        Case("id whitespace", body(id="   "), 422, ("id", "empty")),
        Case("id too long", body(id="x" * 513), 422, ("id", "512")),
        Case("id with NUL", body(id="notes/\x00existing"), 422, ("id", "control")),
        Case("id with newline", body(id="notes/\nexisting"), 422, ("id", "control")),
        Case("id with escape", body(id="notes/\x1b[31mexisting"), 422, ("id", "control")),
        Case("id with zero-width space", body(id="notes/\u200bx"), 422, ("id", "control")),
        Case("id lone surrogate", body(id="notes/\ud800"), 422, ("id", "control")),
    ],
    "content": [
        Case("missing content", body(content=...), 422, ("exactly one of content", "uri")),
        Case("content a number", body(content=42), 422, ("content", "string")),
        Case("content null", body(content=None), 422, ("exactly one of content", "uri")),
        Case("content and uri", body(uri="https://example.com/"), 422,
             ("exactly one of content", "uri")),
        Case("uri not http", body(content=..., uri="file:///etc/passwd"), 422, ("http",)),
        Case("uri with credentials", body(content=..., uri="https://u:p@example.com/"), 422,
             ("credentials",)),
        Case("content a list", body(content=["a"]), 422, ("content", "string")),
        Case("content empty", body(content=""), 422, ("content", "empty")),
        Case("content whitespace", body(content=" \n\t\u00a0 "), 422, ("content", "empty")),
        Case("content with NUL", body(content="a\x00b"), 422, ("content", "NUL")),
        Case("content lone surrogate", body(content="a\ud800b"), 422, ("content", "Unicode")),
    ],
    "title": [
        Case("title a number", body(title=7), 422, ("title", "string")),
        Case("title too long", body(title="t" * 1001), 422, ("title", "1000")),
        Case("title with NUL", body(title="a\x00"), 422, ("title", "NUL")),
        Case("title lone surrogate", body(title="\udfff"), 422, ("title", "Unicode")),
    ],
    "tags": [
        Case("tags a list", body(tags=["a", "b"]), 422, ("tags", "dictionary")),
        Case("tags a string", body(tags="topic=x"), 422, ("tags", "dictionary")),
        Case("tags null", body(tags=None), 422, ("tags", "dictionary")),
        Case("tag value a number", body(tags={"n": 1}), 422, ("tags.n", "string")),
        Case("tag value an object", body(tags={"n": {"deep": "x"}}), 422, ("tags.n", "string")),
        Case("tag value a list", body(tags={"n": ["x"]}), 422, ("tags.n", "string")),
        Case("tag value null", body(tags={"n": None}), 422, ("tags.n", "string")),
        Case("system tag", body(tags={"_source": "me"}), 422, ("'_source'", "system")),
        Case("empty tag key", body(tags={"": "x"}), 422, ("tag key",)),
        Case("tag key too long", body(tags={"k" * 129: "x"}), 422, ("tag key", "128")),
        Case("tag key with newline", body(tags={"a\nb": "x"}), 422, ("tag key",)),
        Case("tag value too long", body(tags={"k": "v" * 1025}), 422, ("tag 'k'", "1024")),
        Case("tag value with NUL", body(tags={"k": "a\x00"}), 422, ("tag 'k'", "printable")),
        Case("tag value surrogate", body(tags={"k": "\ud800"}), 422, ("tag 'k'", "printable")),
        Case("too many tags", body(tags={f"k{i}": "v" for i in range(65)}), 422, ("64 tags",)),
    ],
    "size": [
        # 1,000,001 characters but 2,000,002 bytes: the limit counts bytes; the body is < 4 MB.
        Case(
            "content over the limit",
            json.dumps(body(content="é" * 1_000_001), ensure_ascii=False).encode(),
            413,
            ("2000002 bytes", "limit of 2000000"),
        ),
        Case(
            "body over the limit",
            b'{"id": "x", "content": "' + b"x" * 4_000_000 + b'"}',
            413,
            ("larger than the limit of 4000000 bytes",),
        ),
    ],
}
ALL_ITEM_CASES = [case for cases in ITEM_CASES.values() for case in cases]


@pytest.mark.parametrize("group", list(ITEM_CASES))
async def test_bad_item_is_refused_and_writes_nothing(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any], group: str
) -> None:
    async def send(case: Case) -> httpx.Response:
        return await http.post(
            "/v1/items", content=case.content(), headers={"content-type": case.content_type}
        )

    await run_cases(ITEM_CASES[group], send, pool, stored)


async def test_bad_items_write_nothing_into_an_empty_database(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    for case in ALL_ITEM_CASES:
        r = await http.post(
            "/v1/items", content=case.content(), headers={"content-type": case.content_type}
        )
        assert r.status_code == case.status, (case.name, r.text)
    assert await empty_counts(pool) == dict.fromkeys(TABLES, 0)


async def test_a_body_streamed_past_the_limit_is_refused(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any]
) -> None:
    """No Content-Length to check up front: the limit holds while the body streams in."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"id": "notes/existing", "content": "'
        for _ in range(41):
            yield b"x" * 100_000
        yield b'"}'

    r = await http.post("/v1/items", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert detail_problem(r, 413, ("larger than the limit of 4000000 bytes",)) is None, r.text
    assert await snapshot(pool) == stored


async def test_a_refused_change_leaves_the_item_as_it_was(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any]
) -> None:
    """Bad puts of the existing id change nothing of it: the API still shows version 1."""
    for bad in (body(content=""), body(tags={"_x": "y"}), body(content="new", title="\ud800")):
        r = await http.post(
            "/v1/items",
            content=json.dumps(bad).encode(),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 422, r.text
    assert await snapshot(pool) == stored
    item = (await http.get(f"/v1/items/{EXISTING}")).json()
    assert (item["version"], item["tags"], item["title"]) == (1, {}, None)
    assert item["content_hash"] == stored["items"][0]["content_hash"]


# --- Authentication: a 401 comes first, whatever else is wrong with the request.

BAD_AUTH: dict[str, dict[str, str]] = {
    "no header": {},
    "wrong key": {"Authorization": "Bearer mm_" + "x" * 43},
    "empty bearer": {"Authorization": "Bearer"},
    "basic scheme": {"Authorization": "Basic dXNlcjpwYXNz"},
    "token scheme": {"Authorization": "Token mm_" + "x" * 43},
    "no space after Bearer": {"Authorization": "Bearermm_" + "x" * 43},
    "wrong X-API-Key": {"X-API-Key": "mm_" + "y" * 43},
    "empty X-API-Key": {"X-API-Key": ""},
}

# (method, path, body): good requests and bad ones; without a valid key all are the same 401.
UNAUTHENTICATED: list[tuple[str, str, bytes | None]] = [
    ("POST", "/v1/items", json.dumps(GOOD).encode()),
    ("POST", "/v1/items", b'{"id": '),
    ("POST", "/v1/items", b'{"id": "\xff"}'),
    ("POST", "/v1/items", b""),
    ("POST", "/v1/items", json.dumps(body(content=42, tags=[1])).encode()),
    ("POST", "/v1/items", json.dumps(body(content="")).encode()),
    ("POST", "/v1/items", json.dumps(body(tags={"_x": "y"})).encode()),
    ("POST", "/v1/search", json.dumps({"query": "bread"}).encode()),
    ("POST", "/v1/search", b'{"query": '),
    ("POST", "/v1/search", json.dumps({"query": "", "limit": 0, "filters": {}}).encode()),
    ("GET", "/v1/items/notes/unknown", None),
    ("GET", f"/v1/jobs/{uuid.UUID(int=7)}", None),
    ("GET", "/v1/jobs/not-a-uuid", None),
]


@pytest.mark.parametrize("auth", list(BAD_AUTH))
async def test_without_a_valid_key_everything_is_401(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str], auth: str
) -> None:
    failures = []
    async with httpx.AsyncClient(base_url=api_url, timeout=60) as anon:
        for method, path, payload in UNAUTHENTICATED:
            r = await anon.request(
                method,
                path,
                content=payload,
                headers={**BAD_AUTH[auth], "content-type": "application/json"},
            )
            problem = detail_problem(r, 401, ("API key",))
            if problem is None and r.headers.get("www-authenticate") != "Bearer":
                problem = "no WWW-Authenticate: Bearer header"
            if problem:
                failures.append(f"{method} {path} {payload!r:.40}: {problem}")
    assert not failures, "\n".join(failures)
    assert await empty_counts(pool) == dict.fromkeys(TABLES, 0)


# --- POST /v1/search and lookups.

SEARCH_CASES: dict[str, list[Case]] = {
    "query": [
        Case("malformed JSON", b'{"query": "bread"', 422, ("JSON",)),
        Case("a JSON list", ["bread"], 422, ("JSON object",)),
        Case("missing query", {"mode": "fts"}, 422, ("query", "required")),
        Case("empty query", {"query": ""}, 422, ("query",)),
        Case("whitespace query", {"query": "  \t "}, 422, ("query", "empty")),
        Case("query a number", {"query": 3}, 422, ("query", "string")),
        Case("query too long", {"query": "bread " * 400}, 422, ("query", "2000")),
        Case("query with NUL", {"query": "bread\x00"}, 422, ("query", "NUL")),
        Case("query lone surrogate", {"query": "bread\ud800"}, 422, ("query", "unicode")),
    ],
    "options": [
        Case("unknown field", {"query": "bread", "where": {"topic": "x"}}, 422,
             ("unknown field", "where")),
        Case("limit 0", {"query": "bread", "limit": 0}, 422, ("limit", "greater than")),
        Case("limit 101", {"query": "bread", "limit": 101}, 422, ("limit", "100")),
        Case("limit a string", {"query": "bread", "limit": "10"}, 422, ("limit", "integer")),
        Case("limit a float", {"query": "bread", "limit": 2.5}, 422, ("limit", "integer")),
        Case("offset -1", {"query": "bread", "offset": -1}, 422, ("offset", "greater than")),
        Case("alpha 1.5", {"query": "bread", "alpha": 1.5}, 422, ("alpha", "less than")),
        Case("alpha negative", {"query": "bread", "alpha": -0.1}, 422, ("alpha",)),
        Case("alpha NaN", b'{"query": "bread", "alpha": NaN}', 422, ("alpha",)),
        Case("blend 2", {"query": "bread", "blend": 2}, 422, ("blend",)),
        Case("k 0", {"query": "bread", "k": 0}, 422, ("k:",)),
        Case("mode bogus", {"query": "bread", "mode": "bogus"}, 422, ("mode", "'hybrid'")),
        Case("fusion bogus", {"query": "bread", "fusion": "sum"}, 422, ("fusion", "'score'")),
        Case("group_by bogus", {"query": "bread", "group_by": "doc"}, 422, ("group_by",)),
        Case("k 1001", {"query": "bread", "k": 1001}, 422, ("k:", "1000")),
        Case("offset 1001", {"query": "bread", "offset": 1001}, 422, ("offset", "1000")),
        Case("track a string", {"query": "bread", "track": "no"}, 422, ("track", "boolean")),
    ],
    "filters": [
        Case("filters a list", {"query": "b", "filters": ["x"]}, 422, ("filters",)),
        Case("unknown filter key", {"query": "b", "filters": {"namespace": "x"}}, 422,
             ("unknown field", "filters.namespace")),
        Case("tag value a number", {"query": "b", "filters": {"tags": {"lang": 3}}}, 422,
             ("tags", "lang")),
        Case("tag value a map", {"query": "b", "filters": {"tags": {"lang": {"a": "b"}}}},
             422, ("tags", "lang")),
        Case("tags a list", {"query": "b", "filters": {"tags": ["lang"]}}, 422, ("tags",)),
        Case("empty any-of", {"query": "b", "filters": {"tags": {"lang": []}}}, 422,
             ("lang", "1 to 1000")),
        Case("any-of with a number", {"query": "b", "filters": {"tags": {"l": ["en", 2]}}},
             422, ("tags",)),
        Case("too many tag keys",
             {"query": "b", "filters": {"tags": {f"k{i}": "v" for i in range(51)}}}, 422,
             ("at most 50",)),
        Case("kinds a string", {"query": "b", "filters": {"kinds": "text"}}, 422, ("kinds",)),
        Case("kinds empty", {"query": "b", "filters": {"kinds": []}}, 422, ("kinds", "1")),
        Case("item_ids of numbers", {"query": "b", "filters": {"item_ids": [1]}}, 422,
             ("item_ids",)),
        Case("too many item_ids",
             {"query": "b", "filters": {"item_ids": [str(i) for i in range(1001)]}}, 422,
             ("item_ids", "1000")),
        Case("date not a date", {"query": "b", "filters": {"created_after": "yesterday"}},
             422, ("created_after", "datetime")),
        Case("date without zone",
             {"query": "b", "filters": {"updated_before": "2026-01-01T00:00:00"}}, 422,
             ("updated_before", "timezone")),
        Case("date a number", {"query": "b", "filters": {"created_before": 1700000000}}, 422,
             ("created_before",)),
        Case("empty range",
             {"query": "b", "filters": {"created_after": "2026-02-01T00:00:00Z",
                                        "created_before": "2026-01-01T00:00:00Z"}},
             422, ("created_after must be earlier",)),
        Case("valid_only a string", {"query": "b", "filters": {"valid_only": "yes"}}, 422,
             ("valid_only", "boolean")),
    ],
}


@pytest.mark.parametrize("group", list(SEARCH_CASES))
async def test_bad_search_is_422(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any], group: str
) -> None:
    async def send(case: Case) -> httpx.Response:
        return await http.post(
            "/v1/search", content=case.content(), headers={"content-type": case.content_type}
        )

    await run_cases(SEARCH_CASES[group], send, pool, stored)


LOOKUP_CASES = [
    Case("job id not a uuid", "/v1/jobs/not-a-uuid", 422, ("job_id", "UUID")),
    Case("job id a number", "/v1/jobs/12345", 422, ("job_id", "UUID")),
    Case("unknown job", f"/v1/jobs/{uuid.UUID(int=1)}", 404, ("no job", str(uuid.UUID(int=1)))),
    Case("unknown item", "/v1/items/unknown", 404, ("no item", "'unknown'")),
    Case("below an item", "/v1/items/notes/existing/more", 404, ("no item",)),
    Case("item id with NUL", "/v1/items/notes%00existing", 404, ("no item",)),
    Case("item id with escape", "/v1/items/notes%1Bexisting", 404, ("no item",)),
]


async def test_bad_lookups(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any]
) -> None:
    async def send(case: Case) -> httpx.Response:
        return await http.get(case.payload)

    await run_cases(LOOKUP_CASES, send, pool, stored)
