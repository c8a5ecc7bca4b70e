"""Agent memory over HTTP against the real server, Postgres and queue: memories with versions
and history, sessions of events, extraction with its decisions, search and context."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import httpx
import pytest

from pipeline.settings import Settings
from tests.conftest import drain

pytestmark = pytest.mark.asyncio

U1 = {"user_id": "u1", "agent_id": "a1"}


def client(api_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {key}"},
                             timeout=30)


async def add(c: httpx.AsyncClient, content: str, scope: dict[str, str] = U1,
              **fields: Any) -> dict[str, Any]:
    r = await c.post("/v1/memories", json={"scope": scope, "type": fields.pop("type", "fact"),
                                           "content": content, **fields})
    assert r.status_code == 201, r.text
    return r.json()["memory"]


async def test_memory_round_trip_with_versions_and_history(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        m = await add(c, "Ana prefers tea over coffee", type="preference", confidence=0.9,
                      metadata={"user_id": "someone-else"})
        assert (m["user_id"], m["agent_id"], m["visibility"], m["version"]) == (
            "u1", "a1", "user", 1)
        await drain(settings, pool)
        got = await c.get(f"/v1/memories/{m['id']}", params=U1)
        assert got.status_code == 200 and got.json()["embedded"] is True
        assert got.headers["etag"] == '"1"'

        changed = await c.patch(f"/v1/memories/{m['id']}", json={
            "scope": U1, "expected_version": 1, "content": "Ana prefers green tea"})
        assert changed.status_code == 200, changed.text
        assert changed.json()["memory"]["version"] == 2
        stale = await c.patch(f"/v1/memories/{m['id']}", json={
            "scope": U1, "expected_version": 1, "content": "Ana prefers coffee"})
        assert stale.status_code == 409 and "version 2" in stale.json()["detail"]
        no_version = await c.patch(f"/v1/memories/{m['id']}", json={
            "scope": U1, "content": "x"})
        assert no_version.status_code == 422 and "expected_version" in no_version.json()["detail"]
        by_header = await c.patch(f"/v1/memories/{m['id']}", headers={"If-Match": '"2"'},
                                  json={"scope": U1, "confidence": 0.5})
        assert by_header.status_code == 200 and by_header.json()["memory"]["version"] == 3

        inv = await c.post(f"/v1/memories/{m['id']}/invalidate",
                           json={"scope": U1, "reason": "she switched to coffee"})
        assert inv.status_code == 200 and inv.json()["valid_until"] is not None
        history = (await c.get(f"/v1/memories/{m['id']}/history", params=U1)).json()["history"]
        assert [h["operation"] for h in history] == ["add", "update", "update", "invalidate"]
        assert history[1]["old_content"] == "Ana prefers tea over coffee"
        assert history[1]["new_content"] == "Ana prefers green tea"
        assert history[0]["key_id"] is not None and history[0]["agent_id"] == "a1"

        found = await c.post("/v1/memories/search", json={"query": "tea", "scope": U1})
        assert found.json()["results"] == []  # invalid memories are left out by default
        found = await c.post("/v1/memories/search",
                             json={"query": "tea", "scope": U1, "valid_only": False})
        assert [r["id"] for r in found.json()["results"]] == [m["id"]]


async def test_events_are_stored_idempotently_and_searchable(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    events = [
        {"event_id": "e1", "role": "user", "sender_name": "Caroline",
         "content": "What did you research last week?", "created_at": "2023-05-08T13:56:00Z"},
        {"event_id": "e2", "role": "assistant", "sender_name": "Melanie",
         "content": "Adoption agencies, mostly.", "created_at": "2023-05-08T13:57:00Z"},
    ]
    async with client(api_url, tenant[1]) as c:
        r = await c.post("/v1/sessions/s1/events", json={"scope": {"user_id": "u1"},
                                                          "events": events})
        assert r.status_code == 202, r.text
        assert (r.json()["stored"], r.json()["duplicates"]) == (2, 0)
        again = await c.post("/v1/sessions/s1/events", json={"scope": {"user_id": "u1"},
                                                              "events": events})
        assert (again.json()["stored"], again.json()["duplicates"]) == (0, 2)
        other_scope = await c.post("/v1/sessions/s1/events", json={
            "scope": {"user_id": "u2"}, "events": events})
        assert other_scope.status_code == 409
        await drain(settings, pool)
        op = (await c.get(f"/v1/operations/{r.json()['operation_id']}",
                          params={"user_id": "u1"})).json()
        assert op["status"] == "done" and op["result"] == {"embedded": 2}

        found = await c.post("/v1/memories/search", json={
            "query": "what did they research", "scope": {"user_id": "u1"}, "limit": 5,
            "include_events": True})
        assert found.status_code == 200, found.text
        ids = [(h["kind"], h.get("event_id")) for h in found.json()["results"]]
        assert ("event", "e2") in ids
        page = (await c.get("/v1/sessions/s1/events", params={"user_id": "u1", "limit": 1})).json()
        assert [e["event_id"] for e in page["data"]] == ["e1"] and page["next_cursor"]
        rest = (await c.get("/v1/sessions/s1/events", params={
            "user_id": "u1", "cursor": page["next_cursor"]})).json()
        assert [e["event_id"] for e in rest["data"]] == ["e2"] and rest["next_cursor"] is None
        hidden = await c.get("/v1/sessions/s1/events", params={"user_id": "u2"})
        assert hidden.status_code == 404

        ctx = await c.post("/v1/context", json={"scope": {"user_id": "u1"}, "session_id": "s1",
                                                "query": "research", "max_tokens": 200})
        assert ctx.status_code == 200, ctx.text
        body = ctx.json()
        assert "Adoption agencies" in body["context"]
        assert body["tokens"] <= 200
        assert {"kind": "event", "id": "s1/e2", "session_id": "s1", "event_id": "e2",
                "source_events": None} in body["included"]


async def test_extraction_decides_visibly(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    scope = {"user_id": "u1", "agent_id": "a1"}
    async with client(api_url, tenant[1]) as c:
        r = await c.post("/v1/sessions/s2/events", json={"scope": scope, "events": [
            {"event_id": "1", "role": "user", "sender_name": "Ana",
             "content": "I love hiking in the Alps.", "created_at": "2024-03-01T10:00:00Z"},
            {"event_id": "2", "role": "user", "sender_name": "Ana", "ending": True,
             "content": "I went to Lisbon yesterday.", "created_at": "2024-03-01T10:01:00Z"},
        ]})
        assert r.status_code == 202
        await drain(settings, pool)
        op = (await c.get(f"/v1/operations/{r.json()['extraction_operation_id']}",
                          params=scope)).json()
        assert op["status"] == "done", op
        actions = {d["action"] for d in op["decisions"]}
        assert actions == {"ADD"}, op
        lisbon = next(d for d in op["decisions"] if "Lisbon" in d["new_content"])
        assert lisbon["observed_at"].startswith("2024-02-29")
        assert lisbon["source_events"] == [{"session_id": "s2", "event_id": "2"}]
        # The same again is a duplicate, not a second memory.
        await c.post("/v1/sessions/s2/events", json={"scope": scope, "events": [
            {"event_id": "3", "role": "user", "sender_name": "Ana", "ending": True,
             "content": "I love hiking in the Alps.", "created_at": "2024-03-02T10:00:00Z"}]})
        await drain(settings, pool)
        ops = await pool.fetch("SELECT id FROM operations WHERE kind = 'extract' "
                               "ORDER BY created_at")
        last = (await c.get(f"/v1/operations/{ops[-1]['id']}", params=scope)).json()
        assert [d["action"] for d in last["decisions"]] == ["NOOP_DUPLICATE"], last
        found = await c.post("/v1/memories/search", json={"query": "hiking", "scope": scope})
        hit = found.json()["results"][0]
        assert hit["kind"] == "memory"
        assert hit["source_events"] == [{"session_id": "s2", "event_id": "1"}]


async def test_delete_by_scope_leaves_nothing_searchable(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        for i in range(3):
            await add(c, f"Bob owns {i} red bicycles", scope={"user_id": "bob"})
        keep = await add(c, "Carol owns red bicycles", scope={"user_id": "carol"})
        await drain(settings, pool)
        refused = await c.post("/v1/memories/delete", json={"scope": {}})
        assert refused.status_code == 422 and "empty scope" in refused.json()["detail"]
        r = await c.post("/v1/memories/delete", json={"scope": {"user_id": "bob"}})
        assert r.status_code == 202
        await drain(settings, pool)
        op = (await c.get(f"/v1/operations/{r.json()['operation_id']}")).json()
        assert op["status"] == "done"
        assert op["result"] == {"deleted": 3, "batches": 1, "remaining": 0, "verified": True}
        for mode_scope in ({"user_id": "bob"}, {"user_id": "carol"}):
            found = await c.post("/v1/memories/search", json={
                "query": "red bicycles", "scope": mode_scope, "valid_only": False})
            ids = [h["id"] for h in found.json()["results"]]
            assert ids == ([keep["id"]] if mode_scope["user_id"] == "carol" else [])
        left = await pool.fetchval("SELECT count(*) FROM memories WHERE user_id = 'bob'")
        assert left == 0


async def test_many_writes_wait(api_url: str, tenant: tuple[int, str]) -> None:
    async with client(api_url, tenant[1]) as c:
        results = await asyncio.gather(*(
            c.post(f"/v1/sessions/p{i}/events", json={"scope": {"user_id": "u"}, "events": [
                {"event_id": "x", "role": "user", "content": "hello there"}]})
            for i in range(5)))
        assert all(r.status_code == 202 for r in results)


async def test_a_query_naming_a_speaker_lifts_their_turns(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    scope = {"user_id": "u9"}
    async with client(api_url, tenant[1]) as c:
        await c.post("/v1/sessions/talk/events", json={"scope": scope, "events": [
            {"event_id": "1", "role": "user", "sender_name": "Jon",
             "content": "I painted a lake at sunrise.", "created_at": "2023-05-08T10:00:00Z"},
            {"event_id": "2", "role": "user", "sender_name": "Gina",
             "content": "I painted a lake at sunset.", "created_at": "2023-05-08T10:01:00Z"},
            {"event_id": "3", "role": "system",
             "content": "A painting of a lake was shared.", "created_at": "2023-06-08T10:02:00Z"},
        ]})
        await drain(settings, pool)
        for who in ("Jon", "Gina"):
            found = (await c.post("/v1/memories/search", json={
                "query": f"What lake did {who} paint?", "scope": scope, "limit": 3,
                "include_events": True, "include_memories": False})).json()["results"]
            assert found[0]["sender_name"] == who, found
            assert found[0]["scores"]["names_person"] is True
            # A fused score is at most 1: above it only by the fifth a named speaker adds.
            assert found[0]["scores"]["relevance"] > 1.1, found
            assert [r["scores"]["names_person"] for r in found[1:]] == [False, False]
        in_june = (await c.post("/v1/memories/search", json={
            "query": "lake painting in June 2023", "scope": scope, "limit": 1,
            "include_events": True, "include_memories": False})).json()["results"]
        assert in_june[0]["event_id"] == "3" and in_june[0]["scores"]["names_time"] is True


async def test_wait_returns_the_operation_as_it_stands(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        await add(c, "Dora keeps bees", scope={"user_id": "dora"})
        # No worker runs during the wait: it ends at its timeout with the operation pending.
        r = await c.post("/v1/memories/delete", params={"wait": 0.3},
                         json={"scope": {"user_id": "dora"}})
        assert r.status_code == 202
        assert r.json()["status"] == "pending" and r.json()["operation"]["kind"] == "forget"
        await drain(settings, pool)
        done = await c.get(f"/v1/operations/{r.json()['operation_id']}", params={"wait": 1})
        assert done.json()["status"] == "done" and done.json()["result"]["deleted"] == 1
        too_long = await c.post("/v1/memories/delete", params={"wait": 61},
                                json={"scope": {"user_id": "dora"}})
        assert too_long.status_code == 422 and "wait" in too_long.json()["detail"]


async def test_a_contradiction_supersedes_and_keeps_the_old_memory(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    scope = {"user_id": "ana"}
    async with client(api_url, tenant[1]) as c:
        async def say(event_id: str, text: str, at: str) -> dict[str, Any]:
            r = await c.post("/v1/sessions/moves/events", json={"scope": scope, "events": [
                {"event_id": event_id, "role": "user", "sender_name": "Ana", "ending": True,
                 "content": text, "created_at": at}]})
            await drain(settings, pool)
            op = await c.get(f"/v1/operations/{r.json()['extraction_operation_id']}",
                             params=scope)
            return op.json()

        first = await say("1", "I live in Denver.", "2024-01-01T10:00:00Z")
        assert [d["action"] for d in first["decisions"]] == ["ADD"], first
        old_id = first["decisions"][0]["memory_id"]
        second = await say("2", "I live in Boston.", "2024-06-01T10:00:00Z")
        decision = second["decisions"][0]
        assert decision["action"] == "SUPERSEDE", second
        assert decision["target_id"] == old_id and "Denver" in decision["old_content"]
        old = (await c.get(f"/v1/memories/{old_id}", params=scope)).json()
        assert old["valid_until"] is not None and old["superseded_by"] == decision["memory_id"]
        history = (await c.get(f"/v1/memories/{old_id}/history", params=scope)).json()
        assert [h["operation"] for h in history["history"]] == ["add", "supersede"]
        assert history["history"][1]["operation_id"] == second["id"]
        found = (await c.post("/v1/memories/search", json={
            "query": "where does Ana live", "scope": scope})).json()["results"]
        assert [r["id"] for r in found] == [decision["memory_id"]]


async def test_an_extraction_waits_for_the_session_to_go_quiet(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    from workers.main import build_worker

    async with client(api_url, tenant[1]) as c:
        r = await c.post("/v1/sessions/chatty/events", json={"scope": {"user_id": "u"}, "events": [
            {"event_id": "1", "role": "user", "content": "I love long walks by the river."}]})
    op = r.json()["extraction_operation_id"]
    # The API's settings made the job due at once; a worker that wants 60 quiet seconds finds
    # the session spoke just now, and hands the operation over to a job due a minute later.
    patient = settings.model_copy(update={"extraction_quiet_s": 60.0})
    worker = build_worker(patient, burst=False, sweep=False, poll_delay_s=0)
    running = asyncio.create_task(worker.main())
    try:
        for _ in range(300):  # the worker holds the handed-over job a minute: stop it before
            if await pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'extract' "
                                   "AND status = 'done'"):
                break
            await asyncio.sleep(0.05)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await worker.close()
    rows = await pool.fetch("SELECT j.status, j.run_after - s.last_write_at AS wait, o.id AS op "
                            "FROM jobs j JOIN sessions s ON s.id = 'chatty' "
                            "LEFT JOIN operations o ON o.job_id = j.id "
                            "WHERE j.kind = 'extract' ORDER BY j.created_at")
    assert [r["status"] for r in rows] == ["done", "queued"]
    assert 59 <= rows[1]["wait"].total_seconds() <= 61
    assert str(rows[1]["op"]) == op and rows[0]["op"] is None
    assert await pool.fetchval("SELECT extracted_seq FROM sessions WHERE id = 'chatty'") == 0
