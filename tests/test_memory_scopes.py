"""The visibility table, every cell, over every read path of the agent memory API.

A row written by a user and an agent with a visibility is read by seven readers, and each read
path (search, get, list, history, change, invalidate, delete; sessions, their events, search
with events, context, traces, operations) must show it exactly when the rule of the README
(pipeline/memory/scopes.py) says so:

| visibility | a reader (user U, agent A) sees it when |
|---|---|
| private | the row's agent is A, and the row has no user or its user is U |
| user    | the row's user is U |
| tenant  | always |

The rule is written here once more, on its own (`sees`), so the tests never check the server
against itself. Rows are written once per test and the readers looped over inside it: a fresh
database and server per test is what costs.
"""

from __future__ import annotations

import itertools
import re
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from pipeline.memory.scopes import Scope, can_read

pytestmark = pytest.mark.asyncio

U1, U2, A1, A2 = "u1", "u2", "a1", "a2"
READERS: list[tuple[str | None, str | None]] = [
    (U1, A1), (U1, A2), (U2, A1), (U2, A2), (U1, None), (None, A1), (None, None)]
# (visibility, writer user, writer agent): the brief's three by (U1, A1), and the narrower
# writers the rule's other clauses are about (a private row with no user, a user row with no
# agent, a tenant row with neither).
WRITERS: list[tuple[str, str | None, str | None]] = [
    ("private", U1, A1), ("user", U1, A1), ("tenant", U1, A1),
    ("private", None, A1), ("user", U1, None), ("tenant", None, None)]
WORD = "marmalade"


def sees(visibility: str, row_user: str | None, row_agent: str | None,
         reader_user: str | None, reader_agent: str | None) -> bool:
    """The README's rule, written independently of the server's."""
    if visibility == "tenant":
        return True
    if visibility == "user":
        return row_user is not None and row_user == reader_user
    if visibility == "private":
        return (row_agent is not None and row_agent == reader_agent
                and (row_user is None or row_user == reader_user))
    raise AssertionError(visibility)


def params(reader: tuple[str | None, str | None]) -> dict[str, str]:
    user, agent = reader
    return {k: v for k, v in (("user_id", user), ("agent_id", agent)) if v is not None}


def client(api_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {key}"},
                             timeout=30)


def label(writer: tuple[str, str | None, str | None]) -> str:
    visibility, user, agent = writer
    return f"{visibility}:{user or '-'}/{agent or '-'}"


async def write_memory(c: httpx.AsyncClient, writer: tuple[str, str | None, str | None],
                       content: str, **fields: Any) -> dict[str, Any]:
    visibility, user, agent = writer
    r = await c.post("/v1/memories", json={
        "scope": params((user, agent)), "visibility": visibility, "type": "fact",
        "content": content, **fields})
    assert r.status_code == 201, r.text
    memory = r.json()["memory"]
    assert (memory["visibility"], memory["user_id"], memory["agent_id"]) == writer
    return memory


def report(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} cells wrong:\n" + "\n".join(failures)


# --- the rule itself: Python and SQL agree on every combination -------------------------------

IDS = (None, U1, U2)
AGENTS = (None, A1, A2)
COMBOS = list(itertools.product(("private", "user", "tenant"), IDS, AGENTS, IDS, AGENTS))


async def test_can_read_agrees_with_scope_visible_on_every_combination(
        pool: asyncpg.Pool) -> None:
    rows = await pool.fetch(
        "SELECT ord, scope_visible(v, ru, ra, qu, qa) IS TRUE AS visible "
        "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) "
        "WITH ORDINALITY AS c(v, ru, ra, qu, qa, ord) ORDER BY ord",
        *[list(column) for column in zip(*COMBOS, strict=True)])
    assert len(rows) == len(COMBOS) == 243
    failures = []
    for (vis, ru, ra, qu, qa), row in zip(COMBOS, rows, strict=True):
        python = can_read(vis, ru, ra, Scope(qu, qa))
        rule = sees(vis, ru, ra, qu, qa)
        if not python == row["visible"] == rule:
            failures.append(f"{vis} row {ru}/{ra} reader {qu}/{qa}: can_read={python} "
                            f"scope_visible={row['visible']} README={rule}")
    report(failures)


async def test_scope_visible_answers_true_or_false_never_null(pool: asyncpg.Pool) -> None:
    """A visibility test that answers NULL for a reader without a user or agent is false in a
    WHERE, but true under NOT (NOT NULL is NULL, and `IS NOT TRUE`/`= false` differ): any
    future query that negates it ("rows this reader cannot see") would silently go wrong."""
    nulls = await pool.fetch(
        "SELECT v, ru, ra, qu, qa FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], "
        "$5::text[]) AS c(v, ru, ra, qu, qa) WHERE scope_visible(v, ru, ra, qu, qa) IS NULL",
        *[list(column) for column in zip(*COMBOS, strict=True)])
    assert nulls == [], f"{len(nulls)} combinations answer NULL, e.g. {dict(nulls[0])}"


# --- memories ---------------------------------------------------------------------------------


async def test_memory_reads_follow_the_table(
        api_url: str, tenant: tuple[int, str]) -> None:
    """Search, get, list, history and context, for every writer and every reader."""
    async with client(api_url, tenant[1]) as c:
        written = {}
        for i, writer in enumerate(WRITERS):
            m = await write_memory(c, writer, f"{WORD} note {i} {label(writer)}",
                                   pinned=i % 2 == 0)
            written[m["id"]] = writer
        failures: list[str] = []
        for reader in READERS:
            visible = {i for i, (v, u, a) in written.items() if sees(v, u, a, *reader)}
            who = f"reader {reader}"

            r = await c.post("/v1/memories/search", json={
                "query": f"{WORD} note", "scope": params(reader), "limit": 100,
                "include_events": False})
            assert r.status_code == 200, r.text
            got = {h["id"] for h in r.json()["results"] if h["kind"] == "memory"}
            if got != visible:
                failures.append(f"search {who}: {sorted(map(written.get, got))} "
                                f"!= {sorted(map(written.get, visible))}")

            r = await c.get("/v1/memories", params={**params(reader), "limit": 500})
            assert r.status_code == 200, r.text
            got = {m["id"] for m in r.json()["data"]}
            if got != visible:
                failures.append(f"list {who}: {sorted(map(written.get, got))} "
                                f"!= {sorted(map(written.get, visible))}")

            r = await c.post("/v1/context", json={"scope": params(reader), "query": WORD,
                                                  "max_tokens": 100_000})
            assert r.status_code == 200, r.text
            got = {i["id"] for i in r.json()["included"] if i["kind"] == "memory"}
            if got != visible:
                failures.append(f"context {who}: {sorted(map(written.get, got))} "
                                f"!= {sorted(map(written.get, visible))}")
            for memory_id, writer in written.items():
                if memory_id not in visible:
                    leaked = [line for line in r.json()["context"].splitlines()
                              if label(writer) in line]
                    if leaked:
                        failures.append(f"context text {who} shows {label(writer)}: {leaked}")

            for memory_id, writer in written.items():
                want = 200 if memory_id in visible else 404
                for path in (f"/v1/memories/{memory_id}", f"/v1/memories/{memory_id}/history"):
                    r = await c.get(path, params=params(reader))
                    if r.status_code != want:
                        failures.append(f"GET {path.split(memory_id)[-1] or 'one'} "
                                        f"{label(writer)} {who}: {r.status_code} != {want}")
                    elif want == 404 and label(writer) in r.text:
                        failures.append(f"404 body names the memory: {r.text}")
        report(failures)


async def test_memory_changes_follow_the_table(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    """PATCH, invalidate and DELETE: a reader who may not see a memory gets a 404 and changes
    nothing; one who may changes it. A fresh memory per cell, so each cell starts alike."""
    async with client(api_url, tenant[1]) as c:
        failures: list[str] = []
        for writer, reader in itertools.product(WRITERS, READERS):
            m = await write_memory(c, writer, f"{WORD} cell {label(writer)} {reader}")
            visible = sees(*writer, *reader)
            cell = f"{label(writer)} reader {reader}"
            scope = params(reader)

            r = await c.patch(f"/v1/memories/{m['id']}", json={
                "scope": scope, "expected_version": 1, "content": f"{WORD} changed"})
            row = await pool.fetchrow("SELECT version, content, valid_until FROM memories "
                                      "WHERE id = $1", uuid.UUID(m["id"]))
            want = (200, 2) if visible else (404, 1)
            if (r.status_code, row["version"]) != want:
                failures.append(f"PATCH {cell}: {r.status_code} v{row['version']} != {want}")

            r = await c.post(f"/v1/memories/{m['id']}/invalidate", json={
                "scope": scope, "reason": "cell test"})
            row = await pool.fetchrow("SELECT version, valid_until FROM memories WHERE id = $1",
                                      uuid.UUID(m["id"]))
            if visible != (r.status_code == 200) or visible != (row["valid_until"] is not None):
                failures.append(f"invalidate {cell}: {r.status_code}, valid_until "
                                f"{row['valid_until']}, visible={visible}")
            if r.status_code == 404 and "cell" in r.text:
                failures.append(f"invalidate 404 shows content: {r.text}")

            r = await c.delete(f"/v1/memories/{m['id']}", params=scope)
            left = await pool.fetchval("SELECT count(*) FROM memories WHERE id = $1",
                                       uuid.UUID(m["id"]))
            want = (204, 0) if visible else (404, 1)
            if (r.status_code, left) != want:
                failures.append(f"DELETE {cell}: {r.status_code}, {left} left != {want}")
        report(failures)


async def test_metadata_never_changes_scope(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    claims = {"user_id": "x", "agent_id": "y", "visibility": "tenant", "tenant_id": 999,
              "scope": {"user_id": "x"}}
    async with client(api_url, tenant[1]) as c:
        m = await write_memory(c, ("private", U1, A1), f"{WORD} claims", metadata=claims)
        assert m["metadata"] == claims
        r = await c.patch(f"/v1/memories/{m['id']}", json={
            "scope": {"user_id": U1, "agent_id": A1}, "expected_version": 1,
            "metadata": {**claims, "user_id": "z"}})
        assert r.status_code == 200, r.text
        row = await pool.fetchrow("SELECT user_id, agent_id, visibility, session_id "
                                  "FROM memories WHERE id = $1", uuid.UUID(m["id"]))
        assert dict(row) == {"user_id": U1, "agent_id": A1, "visibility": "private",
                             "session_id": None}
        for reader in (("x", "y"), ("z", "y"), ("x", None), (None, None)):
            r = await c.get(f"/v1/memories/{m['id']}", params=params(reader))
            assert r.status_code == 404, (reader, r.text)
            found = await c.post("/v1/memories/search", json={
                "query": WORD, "scope": params(reader), "valid_only": False})
            assert found.json()["results"] == [], reader

        r = await c.post("/v1/sessions/meta/events", json={"scope": {"user_id": U1}, "events": [
            {"event_id": "e1", "role": "user", "content": f"{WORD} claim", "metadata": claims}]})
        assert r.status_code == 202, r.text
        row = await pool.fetchrow("SELECT user_id, agent_id, visibility FROM sessions "
                                  "WHERE id = 'meta'")
        assert dict(row) == {"user_id": U1, "agent_id": None, "visibility": "user"}
        row = await pool.fetchrow("SELECT user_id, agent_id, visibility FROM events "
                                  "WHERE session_id = 'meta'")
        assert dict(row) == {"user_id": U1, "agent_id": None, "visibility": "user"}
        for reader in (("x", "y"), ("x", None)):
            r = await c.get("/v1/sessions/meta/events", params=params(reader))
            assert r.status_code == 404, r.text
            # The same session id with the claimed scope is refused: the session is U1's.
            r = await c.post("/v1/sessions/meta/events", json={
                "scope": params(reader), "events": [
                    {"event_id": "e2", "role": "user", "content": "hi"}]})
            assert r.status_code == 409, r.text


async def test_scope_is_immutable_in_sql(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        pool: asyncpg.Pool) -> None:
    """No UPDATE, from any code path, moves a memory, event or session into another scope."""
    async with client(api_url, tenant[1]) as c:
        m = await write_memory(c, ("user", U1, A1), f"{WORD} fixed", session_id="s-fixed")
        r = await c.post("/v1/sessions/s-fixed/events", json={
            "scope": {"user_id": U1, "agent_id": A1},
            "events": [{"event_id": "e1", "role": "user", "content": f"{WORD} fixed"}]})
        assert r.status_code == 202, r.text
    memory_id = uuid.UUID(m["id"])
    other = other_tenant[0]
    changes = [
        ("memories", "user_id = 'u2'"), ("memories", "user_id = NULL"),
        ("memories", "agent_id = 'a2'"), ("memories", "agent_id = NULL"),
        ("memories", "session_id = 's-other'"), ("memories", "session_id = NULL"),
        ("memories", "visibility = 'tenant'"), ("memories", f"tenant_id = {other}"),
        ("memories", "user_id = 'u2', content = 'innocent'"),
        ("events", "user_id = 'u2'"), ("events", "agent_id = 'a2'"),
        ("events", "agent_id = NULL"), ("events", "visibility = 'tenant'"),
        ("events", "session_id = 's-other'"), ("events", f"tenant_id = {other}"),
        ("sessions", "user_id = 'u2'"), ("sessions", "user_id = NULL"),
        ("sessions", "agent_id = 'a2'"), ("sessions", "visibility = 'tenant'"),
        ("sessions", f"tenant_id = {other}"), ("sessions", "id = 's-other'"),
    ]
    where = {"memories": "id = $1", "events": "session_id = 's-fixed' AND $1::uuid IS NOT NULL",
             "sessions": "id = 's-fixed' AND $1::uuid IS NOT NULL"}
    failures = []
    for table, change in changes:
        try:
            status = await pool.execute(f"UPDATE {table} SET {change} WHERE {where[table]}",
                                        memory_id)
        except asyncpg.PostgresError as exc:
            # A session's own id is held by its events' foreign key rather than the trigger.
            if not change.startswith("id =") and not isinstance(
                    exc, asyncpg.CheckViolationError):
                failures.append(f"{table} SET {change}: {type(exc).__name__}: {exc}")
            continue
        failures.append(f"{table} SET {change}: allowed ({status})")
    # What is not scope still changes, and writing a scope column with its own value is no
    # change at all.
    for table, change in [("memories", "content = 'still mine', user_id = 'u1'"),
                          ("events", "content = 'edited', visibility = 'user'"),
                          ("sessions", "summary = 'ok', agent_id = 'a1'")]:
        await pool.execute(f"UPDATE {table} SET {change} WHERE {where[table]}", memory_id)
    report(failures)
    row = await pool.fetchrow("SELECT user_id, agent_id, session_id, visibility, tenant_id "
                              "FROM memories WHERE id = $1", memory_id)
    assert dict(row) == {"user_id": U1, "agent_id": A1, "session_id": "s-fixed",
                         "visibility": "user", "tenant_id": tenant[0]}


# --- sessions and events ----------------------------------------------------------------------

# (session id, writer scope, the visibility the write gets): a session's visibility follows
# its scope (`user` when it names a user, else `private` to its agent).
SESSIONS = [("s-ua", U1, A1, "user"), ("s-u", U1, None, "user"), ("s-a", None, A1, "private"),
            ("s-u2", U2, A2, "user"), ("s-a2", None, A2, "private")]


async def write_sessions(c: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    ops = {}
    for session_id, user, agent, _ in SESSIONS:
        r = await c.post(f"/v1/sessions/{session_id}/events", json={
            "scope": params((user, agent)), "events": [
                {"event_id": "q", "role": "user", "sender_name": "Ana",
                 "content": f"{WORD} question in {session_id}", "trace_id": f"t-{session_id}",
                 "span_id": "root", "created_at": "2024-05-01T10:00:00Z"},
                {"event_id": "a", "role": "assistant",
                 "content": f"{WORD} answer in {session_id}", "trace_id": "t-shared",
                 "span_id": f"sp-{session_id}", "created_at": "2024-05-01T10:01:00Z"},
            ]})
        assert r.status_code == 202, r.text
        ops[session_id] = r.json()
    return ops


def visible_sessions(reader: tuple[str | None, str | None]) -> set[str]:
    return {s for s, u, a, vis in SESSIONS if sees(vis, u, a, *reader)}


async def test_session_reads_follow_the_table(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        ops = await write_sessions(c)
        stored = {r["id"]: (r["user_id"], r["agent_id"], r["visibility"])
                  for r in await pool.fetch("SELECT id, user_id, agent_id, visibility "
                                            "FROM sessions")}
        assert stored == {s: (u, a, v) for s, u, a, v in SESSIONS}
        failures: list[str] = []
        for reader in READERS:
            visible = visible_sessions(reader)
            who = f"reader {reader}"
            r = await c.get("/v1/sessions", params={**params(reader), "limit": 500})
            assert r.status_code == 200, r.text
            got = {s["id"] for s in r.json()["data"]}
            if got != visible:
                failures.append(f"list sessions {who}: {sorted(got)} != {sorted(visible)}")

            r = await c.post("/v1/memories/search", json={
                "query": f"{WORD} question answer", "scope": params(reader), "limit": 100,
                "include_events": True})
            assert r.status_code == 200, r.text
            hits = [h for h in r.json()["results"] if h["kind"] == "event"]
            got = {h["session_id"] for h in hits}
            if got != visible or len(hits) != 2 * len(visible):
                failures.append(f"search events {who}: {sorted(got)} ({len(hits)} hits) "
                                f"!= {sorted(visible)}")

            r = await c.post("/v1/memories/search", json={
                "query": f"{WORD} question answer", "scope": params(reader), "limit": 100})
            if r.status_code != 200 or r.json()["results"]:
                failures.append(f"search without events {who}: {r.text[:300]}")

            r = await c.post("/v1/context", json={"scope": params(reader), "query": WORD,
                                                  "max_tokens": 100_000})
            assert r.status_code == 200, r.text
            got = {i["session_id"] for i in r.json()["included"] if i["kind"] == "event"}
            if got != visible:
                failures.append(f"context by query {who}: {sorted(got)} != {sorted(visible)}")
            hidden = [s for s, *_ in SESSIONS if s not in visible
                      and re.search(rf"in {s}$", r.json()["context"], re.M)]
            if hidden:
                failures.append(f"context text {who} shows {hidden}")

            r = await c.get("/v1/traces/t-shared", params=params(reader))
            if visible:
                got = {e["session_id"] for e in _trace_events(r.json().get("spans", []))}
                if r.status_code != 200 or got != visible:
                    failures.append(f"trace t-shared {who}: {r.status_code} {sorted(got)} "
                                    f"!= {sorted(visible)}")
            elif r.status_code != 404:
                failures.append(f"trace t-shared {who}: {r.status_code} != 404")

            for session_id, *_ in SESSIONS:
                want = 200 if session_id in visible else 404
                cell = f"{session_id} {who}"
                for path in (f"/v1/sessions/{session_id}", f"/v1/sessions/{session_id}/events",
                             f"/v1/traces/t-{session_id}"):
                    r = await c.get(path, params=params(reader))
                    if r.status_code != want:
                        failures.append(f"GET {path} {who}: {r.status_code} != {want}")
                    elif want == 404 and WORD in r.text:
                        failures.append(f"GET {path} {who}: 404 shows content: {r.text}")
                    elif want == 200 and path.endswith("/events") and [
                            e["event_id"] for e in r.json()["data"]] != ["q", "a"]:
                        failures.append(f"events of {cell}: {r.text[:200]}")
                r = await c.post("/v1/context", json={
                    "scope": params(reader), "session_id": session_id, "max_tokens": 100_000})
                if r.status_code != want:
                    failures.append(f"context session {cell}: {r.status_code} != {want}")
                elif want == 200:
                    got = {i["session_id"] for i in r.json()["included"]
                           if i["kind"] == "event"}
                    if not got <= visible or session_id not in got:
                        failures.append(f"context session {cell}: {sorted(got)}")
                for op in ("operation_id", "extraction_operation_id"):
                    r = await c.get(f"/v1/operations/{ops[session_id][op]}",
                                    params=params(reader))
                    if r.status_code != want:
                        failures.append(f"operation {op} {cell}: {r.status_code} != {want}")
                r = await c.post(f"/v1/sessions/{session_id}/extract",
                                 json={"scope": params(reader)})
                if r.status_code != (202 if want == 200 else 404):
                    failures.append(f"extract {cell}: {r.status_code}")
        report(failures)


def _trace_events(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for s in spans for e in [*s["events"], *_trace_events(s["children"])]]


async def test_session_delete_follows_the_table(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    """A reader who may not see a session cannot delete it, and one who may, does: fresh
    sessions for each reader, so every cell is tried."""
    async with client(api_url, tenant[1]) as c:
        failures: list[str] = []
        for n, reader in enumerate(READERS):
            for session_id, user, agent, _ in SESSIONS:
                sid = f"{session_id}-{n}"
                r = await c.post(f"/v1/sessions/{sid}/events", json={
                    "scope": params((user, agent)), "events": [
                        {"event_id": "q", "role": "user", "content": f"{WORD} q"},
                        {"event_id": "a", "role": "assistant", "content": f"{WORD} a"}]})
                assert r.status_code == 202, r.text
                r = await c.delete(f"/v1/sessions/{sid}", params=params(reader))
                left = await pool.fetchval("SELECT count(*) FROM events WHERE session_id = $1",
                                           sid)
                if session_id in visible_sessions(reader):
                    if (r.status_code, left) != (200, 0) or r.json()["deleted_events"] != 2:
                        failures.append(f"delete {session_id} reader {reader}: "
                                        f"{r.status_code} {r.text} {left} left")
                elif (r.status_code, left) != (404, 2):
                    failures.append(f"delete {session_id} reader {reader}: {r.status_code}, "
                                    f"{left} left, should be hidden")
        report(failures)
