"""Export and import of a tenant (GET /v1/export, POST /v1/import) over the real API, with real
workers: a tenant exported and imported into another gives the same export and the same
search answers; a bad line is a 422 naming it, with nothing written; a conflict is a 409 or a
skip; a tenant's export holds nothing of another's; an export is one snapshot."""

from __future__ import annotations

import copy
import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import docx
import httpx
import pytest

from api.transfer_schemas import LINE
from pipeline import quotas
from pipeline.settings import Settings
from tests.conftest import drain

NDJSON = {"Content-Type": "application/x-ndjson"}
U1 = {"user_id": "u1", "agent_id": "a1"}
# What legitimately differs between a tenant's export and the export of its import, once the
# importing installation has processed it: when each was made, and when processing touched
# an item. Everything else (ids, contents, tags, summaries, versions, history, timestamps of
# the data) must be equal.
DIFFERING = {"header": {"exported_at"}, "item": {"updated_at"}}
# The rows of a tenant an import may write, to check that a refused one wrote nothing.
TABLES = ("items", "item_versions", "sources", "memory_types", "memories", "memory_history",
          "sessions", "events", "jobs", "operations")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Small limits, so that a line too long and a body too large are cheap to send: a line
    may be 1.7 MB here (a 100 kB file in base64 or 100 kB of escaped text, and room)."""
    return settings.model_copy(update={"max_upload_bytes": 100_000,
                                       "max_content_bytes": 100_000,
                                       "max_import_request_bytes": 4_000_000})


def client(api_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {key}"},
                             timeout=60)


def ndjson(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


async def export(c: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    r = await c.get("/v1/export", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-ndjson"
    raw = r.content.split(b"\n")
    assert raw[-1] == b""  # every line ends with a newline
    for line in raw[:-1]:
        LINE.validate_json(line)  # what an export writes, an import reads
    return [json.loads(line) for line in raw[:-1]]


async def import_(c: httpx.AsyncClient, body: bytes | list[dict[str, Any]],
                  **params: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else ndjson(body)
    return await c.post("/v1/import", content=content, headers=NDJSON, params=params)


def comparable(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in line.items() if k not in DIFFERING.get(line["type"], ())}
            for line in lines]


async def stored(pool: asyncpg.Pool, tenant_id: int) -> dict[str, int]:
    return {t: await pool.fetchval(f"SELECT count(*) FROM {t} WHERE tenant_id = $1", tenant_id)
            for t in TABLES}


def keys(value: Any) -> set[str]:
    """Every key of every object in `value`, however deep."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


def docx_bytes() -> bytes:
    document = docx.Document()
    document.add_heading("Analytical engine", level=1)
    document.add_paragraph("The engine weaves algebraic patterns as the loom weaves flowers.")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


async def fill(c: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool) -> None:
    """A tenant with something of everything: text and a file, an item with versions (one
    archived after processing, one before), tags, a registered memory type, memories of every
    visibility, pinned, updated and invalidated ones, and sessions whose events were
    extracted into memories."""
    async def put(body: dict[str, Any]) -> None:
        r = await c.post("/v1/items", json=body)
        assert r.status_code == 202, r.text

    await put({"id": "notes/bread", "content": "Sourdough rises thanks to wild yeast. The "
               "yeast eats sugars and breathes out gas that lifts the dough.",
               "tags": {"topic": "baking"}, "title": "Bread"})
    await put({"id": "notes/glacier", "content": "Glaciers carve valleys as they move. Their "
               "ice grinds rock into fine flour.", "tags": {"topic": "ice", "lang": "en"}})
    await put({"id": "doc/delta", "content": "A first draft about river deltas."})
    r = await c.post("/v1/items/upload", data={"tags": json.dumps({"kind": "notes"})}, files=[
        ("file", ("files/engine.docx", docx_bytes(), "application/octet-stream"))])
    assert r.status_code == 202 and not r.json()["refused"], r.text
    assert (await c.post("/v1/memory-types", json={
        "name": "recipe", "description": "how to cook something"})).status_code == 201
    await drain(settings, pool)
    await put({"id": "doc/delta", "content": "River deltas grow as sediments settle where "
               "the river meets the sea."})
    await put({"id": "doc/delta", "content": "River deltas grow as sediments settle where "
               "the river meets the sea.", "tags": {"topic": "rivers"}})

    async def remember(scope: dict[str, str], content: str, **fields: Any) -> str:
        r = await c.post("/v1/memories", json={"scope": scope, "content": content,
                                               "type": fields.pop("type", "fact"), **fields})
        assert r.status_code == 201, r.text
        return r.json()["memory"]["id"]

    await remember(U1, "Ana prefers green tea", type="preference", hints=["drinks"],
                   metadata={"from": "onboarding", "score": 3})
    await remember({"agent_id": "a1"}, "The deploy key rotates every month", pinned=True,
                   confidence=0.6)
    await remember({}, "Bake the sourdough at 240 degrees", type="recipe",
                   visibility="tenant", observed_at="2024-03-01T10:00:00Z")
    moved = await remember(U1, "Ana lives in Porto")
    r = await c.post(f"/v1/memories/{moved}/invalidate",
                     json={"scope": U1, "reason": "she moved to Lisbon", "expected_version": 1})
    assert r.status_code == 200, r.text
    edited = await remember(U1, "Ana has a cat")
    r = await c.patch(f"/v1/memories/{edited}", json={
        "scope": U1, "expected_version": 1, "content": "Ana has a black cat named Miso"})
    assert r.status_code == 200, r.text

    r = await c.post("/v1/sessions/s1/events", json={"scope": U1, "events": [
        {"event_id": "e1", "role": "user", "sender_name": "Ana",
         "content": "I love hiking in the mountains.", "created_at": "2024-05-08T10:00:00Z"},
        {"event_id": "e2", "role": "assistant", "content": "That sounds wonderful.",
         "created_at": "2024-05-08T10:00:05Z", "metadata": {"model": "m1"}},
        {"event_id": "e3", "role": "user", "sender_name": "Ana",
         "content": "I work as a nurse in Lisbon.", "created_at": "2024-05-08T10:01:00Z",
         "ending": True}]})
    assert r.status_code == 202, r.text
    r = await c.post("/v1/sessions/s2/events", json={"scope": {"agent_id": "a2"}, "events": [
        {"event_id": "t1", "role": "tool", "content": "fetched the weather: sunny",
         "trace_id": "tr1", "span_id": "sp1", "created_at": "2024-05-09T08:00:00Z"},
        {"event_id": "t2", "role": "assistant", "content": "It will be sunny tomorrow.",
         "trace_id": "tr1", "span_id": "sp2", "parent_span_id": "sp1",
         "created_at": "2024-05-09T08:00:01Z"}]})
    assert r.status_code == 202, r.text
    await drain(settings, pool)


DOCUMENT_QUERIES = {"what makes bread rise": "notes/bread", "river delta sediments": "doc/delta",
                    "algebraic loom": "files/engine.docx", "valleys of ice": "notes/glacier"}


async def searches(c: httpx.AsyncClient) -> list[Any]:
    """What a tenant's searches find (tracking off: a search changes nothing): the document
    each query is about, and the memories and events of each scope, in order. (Below the
    best document, items that do not match at all are ordered by scores too close to tell
    apart, which moved with the seconds between their updates.)"""
    found: list[Any] = []
    for query in DOCUMENT_QUERIES:
        r = await c.post("/v1/search", json={"query": query, "group_by": "item",
                                             "track": False, "limit": 1})
        assert r.status_code == 200, r.text
        found.append([hit["item"]["id"] for hit in r.json()["results"]])
    for query, scope in (("what does Ana drink", U1), ("hiking mountains", U1),
                         ("deploy key", {"agent_id": "a1"}), ("sunny weather", {"agent_id": "a2"}),
                         ("sourdough oven temperature", {"user_id": "u9"})):
        r = await c.post("/v1/memories/search", json={"query": query, "scope": scope,
                                                      "include_events": True, "limit": 5})
        assert r.status_code == 200, r.text
        found.append([(hit["kind"], hit["id"]) for hit in r.json()["results"]])
    return found


async def test_a_tenant_exported_and_imported_into_another_is_the_same_tenant(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b:
        await fill(a, settings, pool)
        exported = await export(a)
        header = exported[0]
        assert header["format"] == "memmill-export" and header["version"] == 1
        kinds = [line["type"] for line in exported[1:]]
        assert {t: kinds.count(t) for t in header["counts"]} == header["counts"]
        assert header["counts"]["item_version"] == 2 and header["counts"]["item"] == 4
        assert header["counts"]["memory_type"] == 1 and header["counts"]["session"] == 2
        extracted = [m for m in exported if m["type"] == "memory" and m["source"] == "extraction"]
        assert extracted, "the sessions' extraction made memories: they travel too"
        # Nothing of the installation: no tenant, key or operation id, sequence number,
        # vector, host or path.
        assert not keys(exported) & {"tenant_id", "key_id", "operation_id", "seq", "embedding",
                                     "embedding_model", "terms", "extracted_seq", "meta"}
        assert "127.0.0.1" not in json.dumps(exported) and str(settings.data_dir) not in \
            json.dumps(exported)
        delta = [line for line in exported if "delta" in line.get("id", line.get("item_id", ""))]
        assert [(d["type"], d["version"]) for d in delta] == [
            ("item_version", 1), ("item_version", 2), ("item", 3)]
        assert delta[0]["summary"]  # archived after its processing: history, kept as it was
        engine = next(line for line in exported if line.get("id") == "files/engine.docx")
        assert engine["source"]["data"] and engine["source"]["content"] is None
        assert engine["tags"]["kind"] == "notes" and "_media_type" in engine["tags"]

        r = await import_(b, exported)
        assert r.status_code == 202, r.text
        answer = r.json()
        assert {t: c["imported"] for t, c in answer["counts"].items()} == header["counts"]
        assert not any(c["skipped"] for c in answer["counts"].values())
        assert answer["jobs"]["embed_memory"] == 2 and "extract" not in answer["jobs"]
        assert answer["jobs"]["analyze"] == 4 and answer["jobs"]["regularize"] == 1
        await drain(settings, pool)

        again = await export(b)
        assert comparable(again) == comparable(exported)
        found_b, found_a = await searches(b), await searches(a)
        assert found_b == found_a, (found_a, found_b)
        assert found_a[:len(DOCUMENT_QUERIES)] == [[i] for i in DOCUMENT_QUERIES.values()]
        assert all(found_a)
        audit = await pool.fetch("SELECT tenant_id, action, affected FROM audit_log "
                                 "WHERE action IN ('export', 'import') ORDER BY id")
        total = sum(header["counts"].values())
        assert [tuple(r) for r in audit] == [(tenant[0], "export", total),
                                             (other_tenant[0], "import", total),
                                             (other_tenant[0], "export", total)]


def small_file() -> list[dict[str, Any]]:
    """A valid file of each type but items with files (kept small for the cases below)."""
    memory = str(uuid.uuid4())
    return [
        {"type": "header", "format": "memmill-export", "version": 1,
         "exported_at": "2026-01-01T00:00:00Z",
         "counts": {"memory_type": 1, "item_version": 1, "item": 2, "memory": 1,
                    "memory_history": 1, "session": 1, "event": 2}},
        {"type": "memory_type", "name": "recipe", "description": None},
        {"type": "item", "id": "a", "title": None, "tags": {"t": "1"},
         "source": {"media_type": "text/plain", "content": "Alpha text."}},
        {"type": "item_version", "item_id": "b", "version": 1, "title": None, "tags": {},
         "source": {"media_type": "text/plain", "content": "Beta one."}},
        {"type": "item", "id": "b", "version": 2, "title": None, "tags": {},
         "source": {"media_type": "text/plain", "content": "Beta two."}},
        {"type": "memory", "id": memory, "user_id": "u1", "visibility": "user",
         "memory_type": "recipe", "content": "Toast the bread"},
        {"type": "memory_history", "memory_id": memory, "version": 1, "operation": "add",
         "new_content": "Toast the bread", "at": "2026-01-01T00:00:00Z"},
        {"type": "session", "id": "s1", "user_id": "u1", "visibility": "user"},
        {"type": "event", "session_id": "s1", "event_id": "e1", "role": "user",
         "content": "hello", "created_at": "2026-01-01T00:00:00Z"},
        {"type": "event", "session_id": "s1", "event_id": "e2", "role": "assistant",
         "content": "hi", "created_at": "2026-01-01T00:00:01Z"},
    ]


def changed(lines: list[dict[str, Any]], index: int, **fields: Any) -> list[dict[str, Any]]:
    lines = copy.deepcopy(lines)
    lines[index].update(fields)
    return lines


def raw_lines(lines: list[dict[str, Any]], index: int, raw: bytes) -> bytes:
    encoded = [json.dumps(line).encode() for line in lines]
    encoded[index] = raw
    return b"\n".join(encoded) + b"\n"


async def test_bad_lines_are_422_naming_their_line_and_nothing_is_written(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    good = small_file()
    counts = good[0]["counts"]
    same_version = changed(good, 4, source={"media_type": "text/plain", "content": "Beta one."})
    cases: list[tuple[str, bytes | list[dict[str, Any]], str]] = [
        ("bad JSON", raw_lines(good, 2, b'{"type": "item", "id": '), "line 3: not valid JSON"),
        ("not an object", raw_lines(good, 2, b"[1, 2]"), "line 3: each line must be"),
        ("unknown type", changed(good, 1, type="widget"), "line 2: unknown type 'widget'"),
        ("unknown field", changed(good, 1, colour="red"), "line 2: memory_type: unknown field"),
        ("tags as a list", changed(good, 2, tags=["t"]), "line 3: item: tags"),
        ("confidence as text", changed(good, 5, confidence="high"), "line 6: memory: confidence"),
        ("a time as a number", changed(good, 8, created_at=1700000000), "line 9: event: "),
        ("a NUL", changed(good, 2, title="a\u0000b"), "line 3: item: title"),
        ("bad base64", changed(good, 2, source={"media_type": "x/y", "data": "!!"}),
         "line 3: item: source.data"),
        ("two sources", changed(good, 2, source={"media_type": "text/plain", "content": "x",
                                                 "uri": "https://example.com/"}),
         "line 3: item: source"),
        ("line too long", changed(good, 2, source={"media_type": "text/plain",
                                                   "content": "x" * 1_800_000}),
         "line 3 is longer than the limit"),
        ("no header", good[1:], "line 1: the first line must be the header"),
        ("two headers", [good[0], *good], "line 2: a second header"),
        ("another version", changed(good, 0, version=2),
         "line 1: header: Value error, format version 2: this installation reads version 1"),
        ("counts short", [changed(good, 0, counts={**counts, "event": 1})[0], *good[1:]],
         "the header counts 1 event lines, but the file holds 2"),
        ("truncated", good[:-1], "the header counts 2 event lines, but the file holds 1"),
        ("empty line", raw_lines(good, 3, b""), "line 4 is empty"),
        ("duplicate item", [changed(good, 0, counts={**counts, "item": 3})[0], *good[1:3],
                            *good[2:]], "line 4: item 'a' appears twice (first on line 3)"),
        ("version out of order", changed(good, 3, version=2), "line 4: item 'b': version 2"),
        ("event of another session", changed(good, 9, session_id="s2"),
         "line 10: the events of session 's2'"),
        ("history of another memory", changed(good, 6, memory_id=str(uuid.uuid4())),
         "line 7: the history of memory"),
        ("unknown memory type", changed(good, 5, memory_type="poem"),
         "line 6: memory type 'poem'"),
        ("private without an agent", changed(good, 5, visibility="private"),
         "line 6: memory: Value error, visibility 'private' needs an agent_id"),
        ("content hash differs", changed(good, 2, content_hash="0" * 64),
         "line 3: item 'a': content_hash does not match"),
        ("same content twice", same_version, "line 5: item 'b' version 2 has the same"),
        ("empty body", b"", "the body is empty"),
    ]
    before = await stored(pool, tenant[0])
    async with client(api_url, tenant[1]) as c:
        failures = []
        for name, body, words in cases:
            r = await import_(c, body)
            if r.status_code != 422 or words not in r.json()["detail"]:
                failures.append(f"{name}: {r.status_code} {r.text[:300]}")
            elif await stored(pool, tenant[0]) != before:
                failures.append(f"{name}: something was written")
        assert not failures, "\n".join(failures)
        wrong_type = await c.post("/v1/import", content=ndjson(good),
                                  headers={"Content-Type": "application/json"})
        assert wrong_type.status_code == 422 and "application/x-ndjson" in wrong_type.text
        too_large = await import_(c, b"x" * 4_100_000)
        assert too_large.status_code == 413, too_large.text
        assert await stored(pool, tenant[0]) == before
        # System tags are extraction's: dropped on the way in, not refused.
        r = await import_(c, changed(good, 2, tags={"_author": "x", "t": "1"}))
        assert r.status_code == 202, r.text
        assert await pool.fetchval("SELECT tags FROM items WHERE id = 'a'") == {"t": "1"}


async def test_ids_the_tenant_holds_are_a_409_or_skipped(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b:
        r = await import_(a, small_file())
        assert r.status_code == 202, r.text
        exported = await export(a)
        before = await stored(pool, tenant[0])
        r = await import_(a, exported)
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert "item 'a', 'b'" in detail and "session 's1'" in detail
        assert "memory_type 'recipe'" in detail and "on_conflict=skip" in detail
        r = await import_(a, exported, on_conflict="skip")
        assert r.status_code == 202, r.text
        counts = r.json()["counts"]
        assert all(c["imported"] == 0 for c in counts.values())
        assert {t: c["skipped"] for t, c in counts.items()} == exported[0]["counts"]
        assert await stored(pool, tenant[0]) == before

        # Into another tenant of the same installation: the same memory ids are free there.
        partly = [line for line in exported if line.get("id") != "a"]
        partly[0] = {**partly[0], "counts": {**partly[0]["counts"], "item": 1}}
        assert (await import_(b, partly)).status_code == 202
        r = await import_(b, exported, on_conflict="skip")
        assert r.status_code == 202, r.text
        counts = r.json()["counts"]
        assert (counts["item"], counts["memory"], counts["event"]) == (
            {"imported": 1, "skipped": 1}, {"imported": 0, "skipped": 1},
            {"imported": 0, "skipped": 2})
        assert comparable(await export(b)) == comparable(exported)
        assert await stored(pool, tenant[0]) == before


async def test_a_tenants_export_holds_nothing_of_another_tenant(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str]) -> None:
    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b:
        empty = await export(b)
        assert len(empty) == 1 and set(empty[0]["counts"].values()) == {0}
        assert len(empty[0]["counts"]) == 7
        r = await import_(a, empty)
        assert r.status_code == 202, r.text
        assert r.json()["jobs"] == {} and r.json()["operation_ids"] == []
        assert not any(c["imported"] for c in r.json()["counts"].values())

        assert (await import_(a, small_file())).status_code == 202
        r = await a.post("/v1/items", json={"id": "secret/plans", "content": "A's secret plans"})
        assert r.status_code == 202
        r = await b.post("/v1/items", json={"id": "b/own", "content": "B's own note"})
        assert r.status_code == 202
        r = await b.post("/v1/sessions/s9/events", json={"scope": {"user_id": "u2"}, "events": [
            {"event_id": "e1", "role": "user", "content": "B's own turn"}]})
        assert r.status_code == 202
        theirs = json.dumps(await export(b))
        assert "B's own note" in theirs and "B's own turn" in theirs
        for secret in ("secret", "Alpha", "Beta", "Toast", "hello", "recipe"):
            assert secret not in theirs, secret
        assert "B's own" not in json.dumps(await export(a))


async def test_an_export_of_some_types_only(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str]) -> None:
    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b:
        assert (await import_(a, small_file())).status_code == 202
        some = await export(a, types="memory,memory_history, memory_type")
        assert some[0]["counts"] == {"memory_type": 1, "memory": 1, "memory_history": 1}
        assert [line["type"] for line in some[1:]] == ["memory_type", "memory",
                                                       "memory_history"]
        r = await import_(b, some)
        assert r.status_code == 202, r.text
        for types, words in (("event", "event lines follow their session"),
                             ("item,thing", "unknown type 'thing'"), ("", "unknown type ''")):
            r = await a.get("/v1/export", params={"types": types})
            assert r.status_code == 422 and words in r.json()["detail"], r.text
        # An item exported without its versions starts again at version 1.
        items = await export(a, types="item")
        assert [(line["id"], line["version"]) for line in items[1:]] == [("a", 1), ("b", 2)]
        r = await import_(b, items)
        assert r.status_code == 202, r.text
        assert [(line["id"], line["version"]) for line in (await export(b, types="item"))[1:]] \
            == [("a", 1), ("b", 1)]


def big_file(memories: int, events: int, extracted: int) -> list[dict[str, Any]]:
    at = datetime(2025, 1, 1, tzinfo=UTC)
    lines: list[dict[str, Any]] = [{"type": "header", "format": "memmill-export", "version": 1,
                                    "exported_at": at.isoformat(),
                                    "counts": {"memory": memories, "memory_history": memories,
                                               "session": 1, "event": events}}]
    for n in range(memories):
        memory = str(uuid.UUID(int=n + 1))
        lines.append({"type": "memory", "id": memory, "agent_id": "a1",
                      "visibility": "private", "memory_type": "fact",
                      "content": f"fact number {n}", "hints": [f"h{n}", "fact"],
                      "source_events": [{"session_id": "long", "event_id": f"e{n}"}],
                      "created_at": at.isoformat(), "updated_at": at.isoformat()})
        lines.append({"type": "memory_history", "memory_id": memory, "version": 1,
                      "operation": "add", "agent_id": "a1", "new_content": f"fact number {n}",
                      "at": at.isoformat()})
    lines.append({"type": "session", "id": "long", "user_id": "u1", "agent_id": "a1",
                  "visibility": "user", "created_at": at.isoformat(),
                  "last_write_at": at.isoformat(), "extracted_events": extracted})
    for n in range(events):
        lines.append({"type": "event", "session_id": "long", "event_id": f"e{n}",
                      "role": "user" if n % 2 else "assistant", "content": f"turn {n}",
                      # Out of order by time: the file's order is the order written.
                      "created_at": (at + timedelta(seconds=(n * 7) % events)).isoformat()})
    return lines


async def test_a_large_import_is_written_in_batches_with_its_jobs(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    # 1000 memories: the last one fills a batch, and its history line comes after it.
    file = big_file(memories=1000, events=1100, extracted=600)
    async with client(api_url, tenant[1]) as c:
        r = await import_(c, file)
        assert r.status_code == 202, r.text
        answer = r.json()
        # Memories and events embedded 500 a job; the unread events extracted.
        assert answer["jobs"] == {"embed_memory": 5, "extract": 1}
        assert len(answer["operation_ids"]) == 6
        assert answer["counts"]["memory_history"] == {"imported": 1000, "skipped": 0}
        assert await pool.fetchval("SELECT count(*) FROM memory_history WHERE tenant_id = $1",
                                   tenant[0]) == 1000
        session = await pool.fetchrow("SELECT events, extracted_seq FROM sessions "
                                      "WHERE tenant_id = $1", tenant[0])
        seqs = [r["seq"] for r in await pool.fetch(
            "SELECT seq FROM events WHERE tenant_id = $1 ORDER BY seq", tenant[0])]
        order = [r["event_id"] for r in await pool.fetch(
            "SELECT event_id FROM events WHERE tenant_id = $1 ORDER BY seq", tenant[0])]
        assert session["events"] == 1100 and session["extracted_seq"] == seqs[599]
        assert order == [f"e{n}" for n in range(1100)]
        again = await export(c)
        assert len(again) == len(file)
        for sent, back in zip(file[1:], again[1:], strict=True):
            for name, value in sent.items():
                if name.endswith("_at"):
                    assert datetime.fromisoformat(back[name]) == datetime.fromisoformat(value)
                else:
                    assert back[name] == value, (name, sent, back)
        assert again[-1101]["extracted_events"] == 600


async def test_an_export_is_one_snapshot(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    # Enough rows that the export is still reading when the write below lands.
    await pool.execute(
        "INSERT INTO memories (tenant_id, agent_id, visibility, type, content, content_hash) "
        "SELECT $1, 'a1', 'private', 'fact', 'fact ' || n, md5(n::text) "
        "FROM generate_series(1, 3000) n", tenant[0])
    async with client(api_url, tenant[1]) as c, client(api_url, tenant[1]) as writer, \
            c.stream("GET", "/v1/export") as r:
        assert r.status_code == 200
        w = await writer.post("/v1/sessions/late/events", json={
            "scope": {"user_id": "u1"}, "events": [
                {"event_id": "e1", "role": "user", "content": "written meanwhile"}]})
        assert w.status_code == 202, w.text
        body = await r.aread()
    lines = [json.loads(line) for line in body.splitlines()]
    assert lines[0]["counts"]["memory"] == 3000 and lines[0]["counts"]["session"] == 0
    assert len(lines) == 3001 and b"written meanwhile" not in body


async def test_an_import_past_the_tenants_limits_is_a_429_and_writes_nothing(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await quotas.set_limits(conn, tenant[0], items=1)
    before = await stored(pool, tenant[0])
    async with client(api_url, tenant[1]) as c:
        r = await import_(c, small_file())
        assert r.status_code == 429, r.text
        assert r.json()["limit"] == "items" and "Retry-After" in r.headers
        assert await stored(pool, tenant[0]) == before
        # Within the limit: the same file without its second item.
        one = [line for line in small_file() if line.get("id", line.get("item_id")) != "b"]
        one[0]["counts"] = {**one[0]["counts"], "item": 1, "item_version": 0}
        r = await import_(c, one)
        assert r.status_code == 202, r.text
