"""Tenants never see each other's agent memory.

Tenant A writes memories (one of them readable by every agent of A: `tenant` visibility),
registers a memory type, writes a session of events with a trace, extracts it and deletes by
scope. Tenant B, with the SAME user, agent, session and trace ids, then calls every route of the
agent memory API naming A's ids: each answers 404 or an empty result, and no response body holds
a byte of A's content. B writing to a session id A also uses makes B's own session (sessions are
namespaced per tenant) and leaves A's as it was.

The routes are read from the served OpenAPI document: a new path under the agent memory
prefixes that this test does not call fails it, so a new route cannot skip the check.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from pipeline.settings import Settings
from tests.conftest import drain

pytestmark = pytest.mark.asyncio

SECRET = "zanzibar"  # every text of A's holds it (compared case-insensitively)
SCOPE = {"user_id": "u1", "agent_id": "a1"}
SESSION, TRACE, TYPE = "s1", "trace-1", "a_only_kind"
PREFIXES = ("/v1/memories", "/v1/memory-types", "/v1/sessions", "/v1/traces",
            "/v1/operations", "/v1/context")


class Caller:
    """An HTTP client that remembers which route (method and path template) each call took."""

    def __init__(self, api_url: str, key: str) -> None:
        self.http = httpx.AsyncClient(base_url=api_url, timeout=60,
                                      headers={"Authorization": f"Bearer {key}"})
        self.routes: set[tuple[str, str]] = set()
        self.bodies: list[tuple[str, str]] = []

    async def __call__(self, method: str, template: str, *, json: Any = None,
                       params: dict[str, Any] | None = None, **ids: str) -> httpx.Response:
        path = template.format(**ids)
        r = await self.http.request(method, path, json=json, params=params)
        self.routes.add((method, template))
        self.bodies.append((f"{method} {path} {params or ''}", r.text))
        assert r.status_code < 500, f"{method} {path}: {r.status_code} {r.text}"
        return r


async def settled_rows(pool: asyncpg.Pool, tenant_id: int) -> dict[str, Any]:
    """A's rows once A's own searches have written their access counts, which the API does
    after the response (so that B's calls are all the rows can change by afterwards)."""
    rows = await tenant_rows(pool, tenant_id)
    for _ in range(50):
        await asyncio.sleep(0.1)
        again = await tenant_rows(pool, tenant_id)
        if again == rows:
            return rows
        rows = again
    return rows


async def tenant_rows(pool: asyncpg.Pool, tenant_id: int) -> dict[str, Any]:
    """Everything of one tenant's agent memory, to compare before and after."""
    async def rows(sql: str) -> list[dict[str, Any]]:
        return [dict(r) for r in await pool.fetch(sql, tenant_id)]

    return {
        "memories": await rows(
            "SELECT id, user_id, agent_id, session_id, visibility, type, content, metadata, "
            "version, valid_until, updated_at, access_count, accessed_at, embedding IS NOT NULL "
            "AS embedded FROM memories WHERE tenant_id = $1 ORDER BY id"),
        "history": await rows("SELECT memory_id, version, operation FROM memory_history "
                              "WHERE tenant_id = $1 ORDER BY memory_id, version"),
        "sessions": await rows("SELECT id, user_id, agent_id, visibility, events, last_write_at,"
                               " ended_at, extracted_seq, summary FROM sessions "
                               "WHERE tenant_id = $1 ORDER BY id"),
        "events": await rows("SELECT seq, session_id, event_id, content, trace_id FROM events "
                             "WHERE tenant_id = $1 ORDER BY seq"),
        "types": await rows("SELECT name, description FROM memory_types WHERE tenant_id = $1"),
        "operations": await rows("SELECT id, kind, result, finished_at FROM operations "
                                 "WHERE tenant_id = $1 ORDER BY id"),
    }


async def write_tenant_a(a: Caller, settings: Settings, pool: asyncpg.Pool) -> dict[str, Any]:
    """A's memories, type, session, extraction and delete by scope, all processed."""
    r = await a("POST", "/v1/memory-types", json={"name": TYPE,
                                                   "description": f"{SECRET} kind of A"})
    assert r.status_code == 201, r.text
    memories, ops = {}, []
    for visibility, scope, extra in [
        ("user", SCOPE, {}), ("private", SCOPE, {"pinned": True}),
        ("tenant", {}, {"type": TYPE}), ("user", {"user_id": "u1"}, {"session_id": SESSION}),
        ("user", {"user_id": "u-gone"}, {}),
    ]:
        r = await a("POST", "/v1/memories", json={
            "scope": scope, "visibility": visibility, "type": "fact",
            "content": f"{SECRET} {visibility} memory of A", "metadata": {"note": SECRET},
            **extra})
        assert r.status_code == 201, r.text
        memories[visibility + str(len(memories))] = r.json()["memory"]["id"]
        ops.append(r.json()["operation_id"])
    r = await a("POST", "/v1/memories/{m}/relations", m=memories["user0"], json={
        "scope": SCOPE, "kind": "related_to", "to_id": memories["tenant2"]})
    assert r.status_code == 201, r.text
    r = await a("POST", "/v1/sessions/{s}/events", s=SESSION, json={"scope": SCOPE, "events": [
        {"event_id": "e1", "role": "user", "sender_name": "Ana", "trace_id": TRACE,
         "span_id": "root", "content": f"I love {SECRET} beaches and hiking in the Alps.",
         "created_at": "2024-03-01T10:00:00Z"},
        {"event_id": "e2", "role": "assistant", "trace_id": TRACE, "span_id": "child",
         "parent_span_id": "root", "content": f"Noted: {SECRET} it is.",
         "created_at": "2024-03-01T10:01:00Z"}]})
    assert r.status_code == 202, r.text
    ops += [r.json()["operation_id"], r.json()["extraction_operation_id"]]
    r = await a("POST", "/v1/sessions/{s}/extract", s=SESSION, json={"scope": SCOPE})
    assert r.status_code == 202, r.text
    ops.append(r.json()["operation_id"])
    r = await a("POST", "/v1/memories/delete", json={"scope": {"user_id": "u-gone"}})
    assert r.status_code == 202, r.text
    ops.append(r.json()["operation_id"])
    await drain(settings, pool)
    # A sees its own work (the test of B means nothing if A's rows are not there).
    r = await a("GET", "/v1/operations/{o}", o=ops[-1])
    assert r.json()["status"] == "done" and r.json()["result"]["deleted"] == 1, r.text
    r = await a("GET", "/v1/traces/{t}", t=TRACE, params=SCOPE)
    assert r.status_code == 200 and SECRET in r.text.lower(), r.text
    r = await a("POST", "/v1/memories/search", json={"query": SECRET, "scope": SCOPE})
    assert SECRET in r.text.lower(), r.text
    return {"memories": memories, "operations": ops}


async def test_tenant_b_sees_nothing_of_tenant_a(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        settings: Settings, pool: asyncpg.Pool) -> None:
    a, b = Caller(api_url, tenant[1]), Caller(api_url, other_tenant[1])
    try:
        written = await write_tenant_a(a, settings, pool)
        before = await settled_rows(pool, tenant[0])
        await b_reads_and_changes(b, written)
        await b_writes_its_own(b, a, settings, pool, written)
        after = await tenant_rows(pool, tenant[0])
        assert after == before, "B's calls changed A's rows"
        leaks = [where for where, text in b.bodies if SECRET in text.lower()]
        assert not leaks, f"A's content in B's responses: {leaks}"
        await assert_every_route_called(a, b)
    finally:
        await a.http.aclose()
        await b.http.aclose()


async def b_reads_and_changes(b: Caller, written: dict[str, Any]) -> None:
    """Every route, naming A's ids, before B has written anything."""
    for scope in (SCOPE, {"user_id": "u1"}, {"agent_id": "a1"}, {}):
        r = await b("GET", "/v1/memories", params=scope)
        assert r.status_code == 200 and r.json()["data"] == [], r.text
        r = await b("POST", "/v1/memories/search", json={
            "query": f"{SECRET} memory beaches", "scope": scope, "include_events": True,
            "valid_only": False, "limit": 100})
        assert r.status_code == 200 and r.json()["results"] == [], r.text
        r = await b("GET", "/v1/sessions", params=scope)
        assert r.status_code == 200 and r.json()["data"] == [], r.text
        r = await b("POST", "/v1/context", json={"scope": scope, "query": SECRET})
        assert r.status_code == 200 and r.json()["included"] == [], r.text
    for memory_id in written["memories"].values():
        for scope in (SCOPE, {}, {"user_id": "u1"}):
            for template in ("/v1/memories/{m}", "/v1/memories/{m}/history"):
                r = await b("GET", template, m=memory_id, params=scope)
                assert r.status_code == 404, r.text
            r = await b("DELETE", "/v1/memories/{m}", m=memory_id, params=scope)
            assert r.status_code == 404, r.text
        r = await b("PATCH", "/v1/memories/{m}", m=memory_id, json={
            "scope": SCOPE, "expected_version": 1, "content": "overwritten by B"})
        assert r.status_code == 404, r.text
        r = await b("POST", "/v1/memories/{m}/invalidate", m=memory_id, json={
            "scope": SCOPE, "reason": "B says so"})
        assert r.status_code == 404, r.text
        others = [m for m in written["memories"].values() if m != memory_id]
        r = await b("GET", "/v1/memories/{m}/related", m=memory_id,
                    params={**SCOPE, "depth": 5})
        assert r.status_code == 404, r.text
        r = await b("POST", "/v1/memories/{m}/relations", m=memory_id, json={
            "scope": SCOPE, "kind": "related_to", "to_id": others[0]})
        assert r.status_code == 404, r.text
        r = await b("DELETE", "/v1/memories/{m}/relations/{kind}/{to_id}", m=memory_id,
                    kind="related_to", to_id=others[0], params=SCOPE)
        assert r.status_code == 404, r.text
        r = await b("POST", "/v1/memories/{m}/references", m=memory_id, json={
            "scope": SCOPE, "item_id": "doc-1"})
        assert r.status_code == 404, r.text
        r = await b("DELETE", "/v1/memories/{m}/references/{item_id}", m=memory_id,
                    item_id="doc-1", params=SCOPE)
        assert r.status_code == 404, r.text
    for op in written["operations"]:
        for params in (SCOPE, {}, {"wait": 0.05}):
            r = await b("GET", "/v1/operations/{o}", o=op, params=params)
            assert r.status_code == 404, r.text
    for scope in (SCOPE, {}):
        for template in ("/v1/sessions/{s}", "/v1/sessions/{s}/events"):
            r = await b("GET", template, s=SESSION, params=scope)
            assert r.status_code == 404, r.text
        r = await b("GET", "/v1/traces/{t}", t=TRACE, params=scope)
        assert r.status_code == 404, r.text
        r = await b("POST", "/v1/context", json={"scope": scope, "session_id": SESSION})
        assert r.status_code == 404, r.text
        r = await b("POST", "/v1/sessions/{s}/extract", s=SESSION, json={"scope": scope})
        assert r.status_code == 404, r.text
        r = await b("DELETE", "/v1/sessions/{s}", s=SESSION, params=scope)
        assert r.status_code == 404, r.text
    r = await b("GET", "/v1/memory-types")
    assert r.status_code == 200 and TYPE not in r.text, r.text
    r = await b("POST", "/v1/memories", json={"scope": SCOPE, "type": TYPE, "content": "x"})
    assert r.status_code == 422 and "type" in r.json()["detail"], r.text


async def b_writes_its_own(b: Caller, a: Caller, settings: Settings, pool: asyncpg.Pool,
                           written: dict[str, Any]) -> None:
    """B's writes with A's ids land in B's tenant: its own type, memory, session and trace;
    its delete by scope removes only its own memories."""
    r = await b("POST", "/v1/memory-types", json={"name": TYPE, "description": "B's kind"})
    assert r.status_code == 201, r.text
    r = await b("POST", "/v1/memories", json={"scope": SCOPE, "type": TYPE,
                                              "content": "B's own memory"})
    assert r.status_code == 201, r.text
    mine = r.json()["memory"]["id"]
    assert mine not in written["memories"].values()
    # Another scope than A's session has: no 409, which would tell B that A's session exists.
    r = await b("POST", "/v1/sessions/{s}/events", s=SESSION, json={
        "scope": {"user_id": "u2", "agent_id": "a2"}, "events": [
            {"event_id": "e1", "role": "user", "content": "B's own turn", "trace_id": TRACE,
             "span_id": "root", "ending": True}]})
    assert r.status_code == 202, r.text
    assert (r.json()["stored"], r.json()["duplicates"]) == (1, 0), r.text
    r = await b("POST", "/v1/memories/delete", json={"scope": {"user_id": "u1"}})
    assert r.status_code == 202, r.text
    forget = r.json()["operation_id"]
    await drain(settings, pool)
    r = await b("GET", "/v1/operations/{o}", o=forget)
    assert r.status_code == 200 and r.json()["result"]["deleted"] == 1, r.text
    r = await b("GET", "/v1/memories/{m}", m=mine, params=SCOPE)
    assert r.status_code == 404, r.text

    b_scope = {"user_id": "u2", "agent_id": "a2"}
    r = await b("GET", "/v1/sessions/{s}", s=SESSION, params=b_scope)
    assert r.status_code == 200 and r.json()["events"] == 1, r.text
    r = await b("GET", "/v1/sessions/{s}/events", s=SESSION, params=b_scope)
    assert [e["content"] for e in r.json()["data"]] == ["B's own turn"], r.text
    r = await b("GET", "/v1/traces/{t}", t=TRACE, params=b_scope)
    assert r.status_code == 200, r.text
    assert [e["content"] for s in r.json()["spans"] for e in s["events"]] == ["B's own turn"]
    r = await b("POST", "/v1/context", json={"scope": b_scope, "session_id": SESSION,
                                             "query": f"{SECRET} beaches"})
    assert r.status_code == 200 and "B's own turn" in r.json()["context"], r.text
    r = await b("POST", "/v1/memories/search", json={
        "query": f"{SECRET} beaches own turn", "scope": b_scope, "include_events": True})
    assert [h["content"] for h in r.json()["results"] if h["kind"] == "event"] == [
        "B's own turn"], r.text
    r = await b("GET", "/v1/memory-types")
    assert [t["description"] for t in r.json()["data"] if t["name"] == TYPE] == ["B's kind"]

    # A's session is still A's alone.
    r = await a("GET", "/v1/sessions/{s}/events", s=SESSION, params=SCOPE)
    assert [e["event_id"] for e in r.json()["data"]] == ["e1", "e2"], r.text
    assert "B's own" not in r.text
    r = await a("GET", "/v1/traces/{t}", t=TRACE, params=SCOPE)
    assert "B's own" not in r.text, r.text
    sessions = await pool.fetch("SELECT tenant_id, user_id FROM sessions WHERE id = $1 "
                                "ORDER BY tenant_id", SESSION)
    assert [s["user_id"] for s in sessions] == ["u1", "u2"]


async def assert_every_route_called(a: Caller, b: Caller) -> None:
    """Every agent memory route of the served document was called by B."""
    r = await b.http.get("/openapi.json")
    assert r.status_code == 200, r.text
    served = {(method.upper(), path) for path, item in r.json()["paths"].items()
              if path.startswith(PREFIXES) for method in item
              if method in ("get", "post", "put", "patch", "delete")}
    called = {(m, p.replace("{m}", "{memory_id}").replace("{s}", "{session_id}")
               .replace("{t}", "{trace_id}").replace("{o}", "{operation_id}"))
              for m, p in b.routes}
    missing = served - called
    assert not missing, f"routes tenant B never called (add them to this test): {missing}"
    assert called <= served, f"called routes the document does not list: {called - served}"
    assert len(served) >= 17, served


async def test_same_ids_in_two_tenants_are_two_rows(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        pool: asyncpg.Pool) -> None:
    """Both tenants write the same session and event ids with the same scope at once; each
    reads back exactly its own, and a repeat in one tenant is a duplicate only there."""
    a, b = Caller(api_url, tenant[1]), Caller(api_url, other_tenant[1])
    try:
        for caller, who in ((a, "A"), (b, "B"), (a, "A")):
            r = await caller("POST", "/v1/sessions/{s}/events", s=SESSION, json={
                "scope": SCOPE, "events": [{"event_id": "e1", "role": "user",
                                            "content": f"said in {who}"}]})
            assert r.status_code == 202, r.text
        for caller, who in ((a, "A"), (b, "B")):
            r = await caller("GET", "/v1/sessions/{s}/events", s=SESSION, params=SCOPE)
            assert [e["content"] for e in r.json()["data"]] == [f"said in {who}"], r.text
            r = await caller("GET", "/v1/sessions/{s}", s=SESSION, params=SCOPE)
            assert r.json()["events"] == 1, r.text
        counts = await pool.fetch("SELECT tenant_id, count(*) FROM events GROUP BY 1 "
                                  "ORDER BY 1")
        assert [c["count"] for c in counts] == [1, 1]
        # A memory id is a uuid, unique everywhere: B cannot reach A's by guessing the id.
        r = await a("POST", "/v1/memories", json={"scope": SCOPE, "type": "fact",
                                                  "content": "A's note"})
        memory_id = r.json()["memory"]["id"]
        assert uuid.UUID(memory_id)
        r = await b("GET", "/v1/memories/{m}", m=memory_id, params=SCOPE)
        assert r.status_code == 404 and "A's note" not in r.text
    finally:
        await a.http.aclose()
        await b.http.aclose()
