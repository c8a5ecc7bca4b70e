"""Every bad input gets a clear 4xx whose `detail` says what is wrong, and writes nothing.

Each case runs against the real API with an item already stored, and the database is compared
before and after: no table gains a row and the stored item is exactly as it was. A missing or
wrong key is a 401 whatever else is wrong with the request.

The cases are tables, grouped by what they get wrong; each group is one test (a fresh database
and server per test is what makes a test cost), and a group reports every case that fails.
Text Postgres cannot store and integers past int64 are thrown at every parameter and JSON body
field the served OpenAPI document names, so a new route or field is covered without a new case.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from api.roles import role_needed
from pipeline import tenants

TABLES = ("items", "sources", "jobs", "item_versions", "parts")
ADMIN_TABLES = ("tenants", "api_keys", "audit_log", "tenant_limits", "webhooks", "memories")
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
        # What the admin and operator routes write: nothing, for a bad request.
        "admin": {t: await pool.fetchval(f"SELECT count(*) FROM {t}") for t in ADMIN_TABLES},
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
        Case("id with NUL", body(id="notes/\x00existing"), 422, ("id", "NUL")),
        Case("id with newline", body(id="notes/\nexisting"), 422, ("id", "control")),
        Case("id with escape", body(id="notes/\x1b[31mexisting"), 422, ("id", "control")),
        Case("id with zero-width space", body(id="notes/\u200bx"), 422, ("id", "control")),
        Case("id lone surrogate", body(id="notes/\ud800"), 422, ("id", "Unicode")),
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
        Case("tag value with NUL", body(tags={"k": "a\x00"}), 422, ("tags.k", "NUL")),
        Case("tag value surrogate", body(tags={"k": "\ud800"}), 422, ("tags.k", "Unicode")),
        Case("tag key with NUL", body(tags={"a\x00": "v"}), 422, ("tags", "[key]", "NUL")),
        Case("tag key surrogate", body(tags={"\udfff": "v"}), 422, ("tags", "[key]", "Unicode")),
        Case("field name surrogate", body(**{"a\ud800": "v"}), 422,
             ("unknown field 'a\\ud800'",)),
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
             422, ("created_after", "ISO 8601")),
        Case("date without zone",
             {"query": "b", "filters": {"updated_before": "2026-01-01T00:00:00"}}, 422,
             ("updated_before", "timezone")),
        Case("date a number", {"query": "b", "filters": {"created_before": 1700000000}}, 422,
             ("created_before",)),
        Case("date the text of a number", {"query": "b", "filters": {"created_before": "3295"}},
             422, ("created_before", "ISO 8601")),
        Case("date before year 1 in UTC",
             {"query": "b", "filters": {"updated_after": "0001-01-01T00:01:00+00:07"}}, 422,
             ("updated_after", "years 1 to 9999")),
        Case("date after year 9999 in UTC",
             {"query": "b", "filters": {"created_before": "9999-12-31T23:59:00-01:00"}}, 422,
             ("created_before", "years 1 to 9999")),
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
    Case("item id with NUL", "/v1/items/notes%00existing", 422, ("item_id", "NUL")),
    Case("jobs after a number", "/v1/jobs?created_after=3295", 422, ("created_after", "ISO")),
    Case("jobs before year 1 in UTC", "/v1/jobs?created_before=0001-01-01T00:00:00%2B01:00", 422,
         ("created_before", "years 1 to 9999")),
    Case("item id with escape", "/v1/items/notes%1Bexisting", 404, ("no item",)),
]


async def test_bad_lookups(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any]
) -> None:
    async def send(case: Case) -> httpx.Response:
        return await http.get(case.payload)

    await run_cases(LOOKUP_CASES, send, pool, stored)


# --- Every parameter and body field of every route, read from the OpenAPI document.
#
# Text Postgres cannot store (a NUL; a lone surrogate, which JSON can carry as "\ud800") and
# integers past int64 (asyncpg cannot send them) each used to end in a 500 deep inside a
# query. Each must be a 422 naming the field, and write nothing. The probes are made from the
# document the API serves, so a route or field added later is probed without a new case.

BAD_TEXT = {"NUL": "a\x00b", "a lone surrogate": "a\ud800b"}
BAD_TEXT_WORDS = {"NUL": "NUL", "a lone surrogate": "Unicode"}
BAD_INTEGERS = {"past int64": 2**63, "below int64": -(2**63) - 1, "far past int64": 10**30}
SAMPLE_PATH_VALUES = {"uuid": str(uuid.UUID(int=1)), "integer": "1", "string": "notes%2Fexisting"}


@dataclass(frozen=True)
class Probe:
    name: str
    method: str
    url: str
    field: str  # the detail must name it
    words: tuple[str, ...] = ()  # and say these (case-insensitive)
    body: bytes | None = None


def resolve(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def variants(schema: dict[str, Any], doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a schema (`X | None`, `str | list[str]`), resolved."""
    schema = resolve(schema, doc)
    options = schema.get("anyOf") or schema.get("oneOf") or [schema]
    resolved = [resolve(option, doc) for option in options]
    return [option for option in resolved if option.get("type") != "null"]


def kind(schema: dict[str, Any], doc: dict[str, Any]) -> str | None:
    types = {option.get("type") for option in variants(schema, doc)}
    return next((t for t in ("string", "integer") if t in types), None)


def sample(schema: dict[str, Any], doc: dict[str, Any]) -> Any:
    """A small valid value: required properties only, an item per array."""
    option = variants(schema, doc)[0]
    if "enum" in option:
        return option["enum"][0]
    if option.get("format") == "date-time":
        return "2026-01-01T00:00:00Z"
    match option.get("type"):
        case "object":
            properties = option.get("properties", {})
            return {name: sample(properties[name], doc) for name in option.get("required", [])}
        case "array":
            return [sample(option.get("items", {}), doc)] if option.get("items") else []
        case "integer":
            return option.get("minimum", 1)
        case "number":
            return option.get("minimum", 0)
        case "boolean":
            return True
        case _:
            return "x"


Leaf = tuple[tuple[str | int, ...], str, dict[str, Any]]  # where, what ("value", "key"), schema


def leaves(schema: dict[str, Any], doc: dict[str, Any], where: tuple[str | int, ...] = (),
           depth: int = 0) -> list[Leaf]:
    """Every place in a JSON body where a client puts text or an integer: values, map keys
    and field names."""
    found: list[Leaf] = []
    for option in variants(schema, doc):
        if option.get("type") in ("string", "integer"):
            found.append((where, "value", option))
        elif option.get("type") == "array" and option.get("items") and depth < 6:
            found += leaves(option["items"], doc, (*where, 0), depth + 1)
        elif option.get("type") == "object" and depth < 6:
            for name, field in option.get("properties", {}).items():
                found += leaves(field, doc, (*where, name), depth + 1)
            extra = option.get("additionalProperties")
            if isinstance(extra, dict):
                # Keys from a fixed set (a dict keyed by a Literal) are refused as not one of
                # them, which is the clear error for any stray key, NUL or not.
                fixed = "propertyNames" in option
                found.append((where, "listed key" if fixed else "key", extra))
                found += leaves(extra, doc, (*where, "k"), depth + 1)
            if extra is False:
                found.append((where, "field name", option))
    return found


def put(body: Any, where: tuple[str | int, ...], value: Any) -> Any:
    """`body` with `value` at `where`, making the objects and lists on the way."""
    if not where:
        return value
    head, rest = where[0], where[1:]
    if isinstance(head, int):
        container = body if isinstance(body, list) and body else [None]
        return [put(container[0], rest, value)]
    container = dict(body) if isinstance(body, dict) else {}
    container[head] = put(container.get(head), rest, value)
    return container


def named(where: tuple[str | int, ...]) -> str:
    """How the detail names a place: the dotted path to it, up to a list index."""
    names = []
    for part in where:
        if isinstance(part, int):
            break
        names.append(part)
    return ".".join(names)


def parameter_probes(doc: dict[str, Any]) -> list[Probe]:
    probes = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            parameters = operation.get("parameters", [])
            samples = {}
            for p in parameters:
                if p["in"] == "path":
                    option = variants(p["schema"], doc)[0]
                    samples[p["name"]] = SAMPLE_PATH_VALUES.get(
                        option.get("format", option["type"]), SAMPLE_PATH_VALUES[option["type"]])
                    if not path.startswith("/v1/item"):  # only item ids may hold a slash
                        samples[p["name"]] = samples[p["name"]].replace("%2F", "-")
            for p in parameters:
                if p["in"] == "header":  # HTTP cannot carry a NUL in a header
                    continue
                bad: dict[str, Any] = {}
                words: tuple[str, ...] = ()
                if kind(p["schema"], doc) == "string":
                    # A URL cannot carry a lone surrogate: percent-decoding makes it U+FFFD.
                    bad = {"NUL": BAD_TEXT["NUL"]}
                    plain = not any({"enum", "format"} & set(v) for v in variants(p["schema"], doc))
                    words = ("NUL",) if plain else ()
                elif kind(p["schema"], doc) == "integer":
                    bad = BAD_INTEGERS
                for what, value in bad.items():
                    encoded = quote(str(value), safe="")
                    if p["in"] == "path":
                        url = path.format(**{**samples, p["name"]: encoded})
                    else:
                        url = f"{path.format(**samples)}?{p['name']}={encoded}"
                    probes.append(Probe(f"{method.upper()} {path} {p['name']} {what}",
                                        method.upper(), url, p["name"], words))
    return probes


def body_probes(doc: dict[str, Any]) -> list[Probe]:
    probes = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" not in content or "{" in path:
                continue
            schema = content["application/json"]["schema"]
            base = sample(schema, doc)
            for where, what, leaf in leaves(schema, doc):
                field = named(where)
                label = f"{method.upper()} {path} {'.'.join(map(str, where)) or 'body'} {what}"
                if what == "value" and kind(leaf, doc) == "integer":
                    for name, number in BAD_INTEGERS.items():
                        probes.append(Probe(f"{label} {name}", method.upper(), path, field,
                                            body=json.dumps(put(base, where, number)).encode()))
                    continue
                for name, text in BAD_TEXT.items():
                    if what == "value":
                        plain = not ({"enum", "format", "pattern"} & set(leaf))
                        words = (BAD_TEXT_WORDS[name],) if plain else ()
                        bad = put(base, where, text)
                    elif what in ("key", "listed key"):
                        words = ("[key]", BAD_TEXT_WORDS[name]) if what == "key" else ("[key]",)
                        bad = put(base, where, {text: sample(leaf, doc)})
                    else:
                        words = ("unknown field",)
                        bad = put(put(base, where, sample(leaf, doc)), (*where, text), "x")
                    probes.append(Probe(f"{label} {name}", method.upper(), path, field, words,
                                        json.dumps(bad).encode()))
    return probes


async def run_probes(http: httpx.AsyncClient, pool: asyncpg.Pool, probes: list[Probe],
                     expected_state: dict[str, Any]) -> None:
    """Each probe with the default tenant's admin key, or an operator's for the routes only
    an operator may call (another key's 403 comes before any validation)."""
    operator = tenants.new_key()
    await tenants.add_key(pool, await tenants.ensure_tenant(pool, "default"), operator,
                          name="probe-operator", role="operator")
    expected_state = {**expected_state, "admin": (await snapshot(pool))["admin"]}
    failures = []
    for probe in probes:
        headers = {"content-type": "application/json"}
        if role_needed(probe.method, probe.url.split("?")[0]) == "operator":
            headers["Authorization"] = f"Bearer {operator}"
        r = await http.request(probe.method, probe.url, content=probe.body, headers=headers)
        problem = detail_problem(r, 422, (probe.field, *probe.words))
        if problem is None and not isinstance(r.json().get("errors"), list):
            problem = f"no errors list: {r.text[:300]}"
        if problem is None and await snapshot(pool) != expected_state:
            problem = "the database changed"
        if problem:
            failures.append(f"{probe.name}: {problem}")
    assert not failures, f"{len(failures)} of {len(probes)} probes failed:\n" + "\n".join(
        failures)


async def served_document(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


async def test_every_parameter_refuses_text_postgres_cannot_store_and_huge_integers(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any]
) -> None:
    probes = parameter_probes(await served_document(http))
    names = {(p.url.split("?")[0].split("/")[2], p.field) for p in probes}
    # The probes reach what the issue found: offsets, dead-letter ids, item ids, item_id filters.
    assert {("jobs", "offset"), ("dead-letters", "offset"), ("dead-letters", "dead_letter_id"),
            ("items", "item_id"), ("item-versions", "item_id"), ("jobs", "item_id"),
            ("dead-letters", "item_id")} <= names
    await run_probes(http, pool, probes, stored)


async def test_every_json_body_field_refuses_nul_surrogates_and_huge_integers(
    http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any]
) -> None:
    probes = body_probes(await served_document(http))
    fields = {(p.url, p.field) for p in probes}
    assert {("/v1/search", "filters.tags.k"), ("/v1/search", "filters.tags"),
            ("/v1/search", "filters.kinds"), ("/v1/search", "filters.item_ids"),
            ("/v1/search", "offset"), ("/v1/items", "tags.k"), ("/v1/items", "tags"),
            ("/v1/items/lookup", "ids"), ("/v1/dead-letters/replay", "item_id")} <= fields
    await run_probes(http, pool, probes, stored)


# --- Many items in one request: the bad entry is refused by its index, the others written.

async def test_a_batch_refuses_its_bad_entries_by_index_and_writes_the_rest(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    raw = (b'{"items": [{"id": "good/1", "content": "first"},'
           b' {"id": "bad\\u0000", "content": "x"},'
           b' {"id": "bad/2", "content": "a\\ud800"},'
           b' {"id": "bad/3", "content": "x", "tags": {"\\udfff": "v"}},'
           b' {"id": "bad/4", "content": "x", "tags": {"k": "v\\u0000"}},'
           b' {"id": "bad/5", "content": "x", "b\\ud800": 1},'
           b' {"id": "good/2", "content": "second"}]}')
    r = await http.post("/v1/items/batch", content=raw,
                        headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text
    answer = r.json()
    assert [(a["index"], a["id"], a["change"]) for a in answer["accepted"]] == [
        (0, "good/1", "created"), (6, "good/2", "created")]
    refused = {e["index"]: (e["id"], e["status"], e["error"]) for e in answer["refused"]}
    assert refused[1][:2] == ("bad\x00", 422) and refused[1][2].startswith("id: ")
    assert refused[2][:2] == ("bad/2", 422) and refused[2][2].startswith("content: ")
    assert refused[3][:2] == ("bad/3", 422) and refused[3][2].startswith("tags.")
    assert refused[4][:2] == ("bad/4", 422) and refused[4][2].startswith("tags.k: ")
    assert refused[5][1] == 422 and "'b\\ud800'" in refused[5][2]
    assert set(refused) == {1, 2, 3, 4, 5}
    ids = [r["id"] for r in await pool.fetch("SELECT id FROM items ORDER BY id")]
    assert ids == ["good/1", "good/2"]


def multipart(parts: list[tuple[str, bytes | None, bytes]]) -> tuple[bytes, str]:
    """A multipart body written by hand, so names and values carry raw bytes (NUL, bytes
    that are not UTF-8) that a client library would escape."""
    boundary = "memmill-boundary"
    chunks = []
    for name, filename, value in parts:
        disposition = b'form-data; name="' + name.encode() + b'"'
        if filename is not None:
            disposition += b'; filename="' + filename + b'"'
        chunks.append(b"--" + boundary.encode() + b"\r\nContent-Disposition: " + disposition
                      + b"\r\n\r\n" + value + b"\r\n")
    body = b"".join(chunks) + b"--" + boundary.encode() + b"--\r\n"
    return body, f"multipart/form-data; boundary={boundary}"


UPLOAD_CASES: dict[str, tuple[list[tuple[str, bytes | None, bytes]], dict[int, str]]] = {
    # name: (parts, {index of a refused file: a word its error must say}); the others are written
    "file name with NUL": ([("file", b"good.txt", b"one"), ("file", b"a\x00b.txt", b"two")],
                           {1: "id"}),
    # Read as Latin-1, so the surrogate's bytes become C1 control characters.
    "file name not UTF-8": ([("file", b"caf\xed\xa0\x80.txt", b"one"),
                             ("file", b"caf\xc3\xa9.txt", b"two")], {0: "id"}),
}


@pytest.mark.parametrize("case", list(UPLOAD_CASES))
async def test_an_upload_refuses_bad_text_by_file_and_writes_the_rest(
    http: httpx.AsyncClient, pool: asyncpg.Pool, case: str
) -> None:
    parts, refused = UPLOAD_CASES[case]
    content, content_type = multipart(parts)
    r = await http.post("/v1/items/upload", content=content,
                        headers={"content-type": content_type})
    assert r.status_code == 202, r.text
    answer = r.json()
    assert {e["index"] for e in answer["refused"]} == set(refused), answer
    for entry in answer["refused"]:
        assert entry["status"] == 422 and refused[entry["index"]] in entry["error"], entry
    written = {r["id"] for r in await pool.fetch("SELECT id FROM items")}
    assert written == {a["id"] for a in answer["accepted"]}
    assert all("\x00" not in i and i.encode() for i in written)


FORM_FIELD_CASES: dict[str, tuple[list[tuple[str, bytes | None, bytes]], str]] = {
    # name: (parts, what the 422's detail must start with); the whole request is refused
    "prefix with NUL": ([("prefix", None, b"p\x00/"), ("file", b"a.txt", b"one")], "prefix:"),
    "tag value with NUL": ([("tags", None, b'{"k": "v\\u0000"}'), ("file", b"a.txt", b"one")],
                           "tags.k:"),
    "tag key with a lone surrogate": ([("tags", None, b'{"\\ud800": "v"}'),
                                       ("file", b"a.txt", b"one")], "tags."),
    "tags not an object": ([("tags", None, b'["k"]'), ("file", b"a.txt", b"one")],
                           "tags must be a JSON object of strings"),
}


@pytest.mark.parametrize("case", list(FORM_FIELD_CASES))
async def test_an_upload_with_a_bad_prefix_or_tags_is_a_422_naming_the_field(
    http: httpx.AsyncClient, pool: asyncpg.Pool, case: str
) -> None:
    parts, detail = FORM_FIELD_CASES[case]
    content, content_type = multipart(parts)
    r = await http.post("/v1/items/upload", content=content,
                        headers={"content-type": content_type})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(detail), r.json()
    assert await pool.fetchval("SELECT count(*) FROM items") == 0
