"""Memory that keeps itself, over HTTP against the real server, Postgres and queue: relations
and their walk, layers with lifetimes and the policy, and consolidation runs (prune, merge,
decay, link), dry and applied, scheduled, and undone."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from pipeline import tenants
from pipeline.memory.upkeep import schedule
from pipeline.settings import Settings
from tests.conftest import drain
from tests.test_memory_api import client

pytestmark = pytest.mark.asyncio

U1 = {"user_id": "u1"}


async def add(c: httpx.AsyncClient, content: str, scope: dict[str, str] = U1,
              **fields: Any) -> dict[str, Any]:
    r = await c.post("/v1/memories", json={"scope": scope, "type": fields.pop("type", "fact"),
                                           "content": content, **fields})
    assert r.status_code == 201, r.text
    return r.json()["memory"]


async def run(c: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
              **body: Any) -> dict[str, Any]:
    """Start a run, let the workers carry it out, and read its report."""
    r = await c.post("/v1/consolidation/runs", json=body)
    assert r.status_code == 202, r.text
    run_id = r.json()["run_id"]
    await drain(settings, pool)
    got = await c.get(f"/v1/consolidation/runs/{run_id}")
    assert got.status_code == 200, got.text
    return got.json()


async def changes(c: httpx.AsyncClient, run_id: str, **params: Any) -> list[dict[str, Any]]:
    r = await c.get(f"/v1/consolidation/runs/{run_id}/changes", params=params)
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def memory(c: httpx.AsyncClient, memory_id: str,
                 scope: dict[str, str] = U1) -> dict[str, Any]:
    r = await c.get(f"/v1/memories/{memory_id}", params=scope)
    assert r.status_code == 200, r.text
    return r.json()


# relations ----------------------------------------------------------------------------------


async def _chain(c: httpx.AsyncClient) -> list[dict[str, Any]]:
    return [await add(c, f"Fact number {n} about the garden") for n in range(4)]


async def test_relations_walk_depth_cycles_visibility_and_delete(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        m0, m1, m2, m3 = await _chain(c)
        hidden = await add(c, "Agent B's own note", {"agent_id": "b"}, visibility="private")

        async def relate(x: dict[str, Any], kind: str, y: dict[str, Any],
                         scope: dict[str, str] = U1) -> httpx.Response:
            return await c.post(f"/v1/memories/{x['id']}/relations",
                                json={"scope": scope, "kind": kind, "to_id": y["id"]})

        # m0 -> m1 -> m2 -> m3 -> m0 (a cycle), each edge in its own direction.
        for x, kind, y in ((m0, "related_to", m1), (m1, "derived_from", m2),
                           (m3, "supersedes", m2), (m3, "related_to", m0)):
            made = await relate(x, kind, y)
            assert made.status_code == 201, made.text
        assert (await relate(m0, "related_to", m1)).status_code == 201  # again: harmless
        # A memory the writer does not see cannot be an end.
        assert (await relate(m0, "related_to", hidden)).status_code == 404
        assert (await relate(m0, "related_to", m0)).status_code == 422
        assert (await relate(m0, "likes", m1)).status_code == 422

        one = (await c.get(f"/v1/memories/{m0['id']}/related", params=U1)).json()
        assert {n["memory"]["id"]: n["depth"] for n in one["nodes"]} == {m1["id"]: 1, m3["id"]: 1}
        deep = (await c.get(f"/v1/memories/{m0['id']}/related",
                            params={**U1, "depth": 5})).json()
        assert {n["memory"]["id"]: n["depth"] for n in deep["nodes"]} == {
            m1["id"]: 1, m3["id"]: 1, m2["id"]: 2}
        assert len(deep["edges"]) == 4 and deep["truncated"] is False
        only = (await c.get(f"/v1/memories/{m0['id']}/related",
                            params={**U1, "depth": 5, "kind": "related_to"})).json()
        assert {n["memory"]["id"] for n in only["nodes"]} == {m1["id"], m3["id"]}
        for bad in (0, 6):
            r = await c.get(f"/v1/memories/{m0['id']}/related", params={**U1, "depth": bad})
            assert r.status_code == 422

        # Agent b, reading as u1, relates its private note to m2: only b walks onto it.
        as_b = {"user_id": "u1", "agent_id": "b"}
        assert (await relate(hidden, "related_to", m2, as_b)).status_code == 201
        seen = (await c.get(f"/v1/memories/{m0['id']}/related",
                            params={**U1, "depth": 5})).json()
        assert hidden["id"] not in {n["memory"]["id"] for n in seen["nodes"]}
        assert len(seen["edges"]) == 4
        seen = (await c.get(f"/v1/memories/{m0['id']}/related",
                            params={**as_b, "depth": 5})).json()
        assert {n["memory"]["id"]: n["depth"] for n in seen["nodes"]}[hidden["id"]] == 3
        # A reader who cannot see m1 does not walk through it.
        other = await c.get(f"/v1/memories/{m0['id']}/related", params={"user_id": "u2"})
        assert other.status_code == 404

        # Search expands its hits by one hop.
        found = (await c.post("/v1/memories/search", json={
            "query": "Fact number 0 garden", "scope": U1, "expand": True})).json()["results"]
        hit = next(r for r in found if r["id"] == m0["id"])
        assert {(r["id"], r["kind"], r["direction"]) for r in hit["related"]} == {
            (m1["id"], "related_to", "out"), (m3["id"], "related_to", "in")}

        # Deleting a memory removes the relations at both ends.
        assert (await c.delete(f"/v1/memories/{m1['id']}", params=U1)).status_code == 204
        left = await pool.fetchval(
            "SELECT count(*) FROM memory_relations WHERE from_id = $1 OR to_id = $1",
            uuid.UUID(m1["id"]))
        assert left == 0
        gone = await c.delete(f"/v1/memories/{m3['id']}/relations/related_to/{m0['id']}",
                              params=U1)
        assert gone.status_code == 204
        again = await c.delete(f"/v1/memories/{m3['id']}/relations/related_to/{m0['id']}",
                               params=U1)
        assert again.status_code == 404


async def test_references_to_items_and_parts(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        put = await c.post("/v1/items", json={"id": "docs/guide", "content": "A short guide."})
        assert put.status_code == 202, put.text
        await drain(settings, pool)
        m = await add(c, "The guide explains setup")
        ref = await c.post(f"/v1/memories/{m['id']}/references",
                           json={"scope": U1, "item_id": "docs/guide"})
        assert ref.status_code == 201 and ref.json() == {"item_id": "docs/guide", "position": None}
        part = await c.post(f"/v1/memories/{m['id']}/references",
                            json={"scope": U1, "item_id": "docs/guide", "position": 0})
        assert part.status_code == 201, part.text
        missing = await c.post(f"/v1/memories/{m['id']}/references",
                               json={"scope": U1, "item_id": "docs/guide", "position": 99})
        assert missing.status_code == 404 and "position 99" in missing.json()["detail"]
        nothing = await c.post(f"/v1/memories/{m['id']}/references",
                               json={"scope": U1, "item_id": "no/such"})
        assert nothing.status_code == 404
        walk = (await c.get(f"/v1/memories/{m['id']}/related", params=U1)).json()
        assert walk["references"] == [{"item_id": "docs/guide", "position": None},
                                      {"item_id": "docs/guide", "position": 0}]
        # Deleting the item removes the references to it.
        assert (await c.delete("/v1/items/docs/guide")).status_code == 200
        walk = (await c.get(f"/v1/memories/{m['id']}/related", params=U1)).json()
        assert walk["references"] == []


# layers and the policy ----------------------------------------------------------------------


async def test_layers_give_expiry_and_the_policy_moves_it(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        fact = await add(c, "Ana lives in Lisbon")
        chat = await add(c, "We talked about the weather", type="conversation")
        tool = await add(c, "ls returned 3 files", layer="tool")
        pinned = await add(c, "Always answer in Portuguese", layer="tool", pinned=True)
        assert (fact["layer"], fact["expires_at"]) == ("observation", None)
        assert chat["layer"] == "conversation"
        assert pinned["expires_at"] is None
        made = datetime.fromisoformat(tool["created_at"])
        assert datetime.fromisoformat(tool["expires_at"]) - made == timedelta(days=14)
        assert datetime.fromisoformat(chat["expires_at"]) - made == pytest.approx(
            timedelta(days=30), abs=timedelta(seconds=5))

        policy = await c.put("/v1/memory-policy", json={"lifetimes": {"tool": 2}})
        assert policy.status_code == 200, policy.text
        assert policy.json()["lifetimes"]["tool"] == 2 and policy.json()["expiries_moved"] == 1
        assert policy.json()["overrides"] == {"lifetimes": {"tool": 2.0}}
        moved = await memory(c, tool["id"])
        assert datetime.fromisoformat(moved["expires_at"]) - made == timedelta(days=2)

        # Moving a memory to a permanent layer makes it permanent.
        r = await c.patch(f"/v1/memories/{tool['id']}", json={
            "scope": U1, "expected_version": 1, "layer": "profile"})
        assert r.status_code == 200 and r.json()["memory"]["expires_at"] is None

        # Expired memories are left out unless asked for.
        await pool.execute("UPDATE memories SET expires_at = now() - interval '1 hour' "
                           "WHERE id = $1::uuid", chat["id"])
        listed = (await c.get("/v1/memories", params=U1)).json()["data"]
        assert chat["id"] not in {m["id"] for m in listed}
        listed = (await c.get("/v1/memories", params={**U1, "include_expired": True})).json()
        assert chat["id"] in {m["id"] for m in listed["data"]}
        found = (await c.post("/v1/memories/search", json={
            "query": "weather", "scope": U1})).json()["results"]
        assert chat["id"] not in {r["id"] for r in found}
        found = (await c.post("/v1/memories/search", json={
            "query": "weather", "scope": U1, "include_expired": True})).json()["results"]
        assert chat["id"] in {r["id"] for r in found}

        for bad, why in (({"schedule": "every day"}, "five fields"),
                         ({"schedule": "61 3 * * *"}, "not a valid cron"),
                         ({"lifetimes": {"pinned": 3}}, "permanent"),
                         ({"lifetimes": {"forever": 3}}, "forever"),
                         ({"lifetimes": {"tool": 0}}, "tool"),
                         ({"link_similarity": 0.99}, "must not be above"),
                         ({"memory_cap": 0}, "memory_cap")):
            r = await c.put("/v1/memory-policy", json=bad)
            assert r.status_code == 422 and why in r.text, (bad, r.text)
        assert (await c.get("/v1/memory-policy")).json()["lifetimes"]["tool"] == 2
        reset = await c.delete("/v1/memory-policy")
        assert reset.status_code == 200 and reset.json()["overrides"] == {}


# prune --------------------------------------------------------------------------------------


async def test_prune_removes_expired_and_over_cap_and_undo_brings_them_back(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        old = await add(c, "A tool said something", layer="tool")
        keep = await add(c, "Ana's birthday is in May")
        weak = [await add(c, f"Tool output {n}", layer="tool", confidence=0.1 * (n + 1))
                for n in range(3)]
        await c.patch(f"/v1/memories/{old['id']}", json={
            "scope": U1, "expected_version": 1, "content": "A tool said something else"})
        await drain(settings, pool)
        await pool.execute("UPDATE memories SET expires_at = now() - interval '1 day' "
                           "WHERE id = $1::uuid", old["id"])
        assert (await c.put("/v1/memory-policy", json={"memory_cap": 3})).status_code == 200

        dry = await run(c, settings, pool, steps=["prune"], dry_run=True)
        assert dry["status"] == "done" and dry["counts"]["prune"]["expired"] == 1
        assert dry["counts"]["prune"]["capped"] == 1  # 5 - 1 expired - cap 3
        assert await pool.fetchval("SELECT count(*) FROM memories") == 5

        done = await run(c, settings, pool, steps=["prune"])
        assert done["counts"]["prune"] == {"expired": 1, "over_cap": 1, "capped": 1, "cap": 3,
                                           "cap_unmet": 0}
        pruned = await changes(c, done["id"])
        assert [(p["action"], p["memory_id"]) for p in pruned] == [
            ("expire", old["id"]), ("cap", weak[0]["id"])]  # the least confident tool output
        ids = {r["id"] for r in await pool.fetch("SELECT id::text FROM memories")}
        assert ids == {keep["id"], weak[1]["id"], weak[2]["id"]}
        history_before = await pool.fetchval("SELECT count(*) FROM memory_history")

        longer = await c.put("/v1/memory-policy", json={"lifetimes": {"tool": 400}})
        assert longer.status_code == 200
        undone = await c.post(f"/v1/consolidation/runs/{done['id']}/undo")
        assert undone.status_code == 200, undone.text
        assert undone.json()["reinserted"] == 2 and undone.json()["skipped"] == []
        back = await memory(c, old["id"])
        assert back["content"] == "A tool said something else" and back["version"] == 2
        assert back["embedded"] is True  # its vector came back with it
        assert datetime.fromisoformat(back["expires_at"]) > datetime.now(UTC)  # today's policy
        history = (await c.get(f"/v1/memories/{old['id']}/history", params=U1)).json()
        assert [h["operation"] for h in history["history"]] == ["add", "update"]
        assert await pool.fetchval("SELECT count(*) FROM memory_history") == history_before + 3
        twice = await c.post(f"/v1/consolidation/runs/{done['id']}/undo")
        assert twice.status_code == 409 and "undone already" in twice.json()["detail"]
        dry_undo = await c.post(f"/v1/consolidation/runs/{dry['id']}/undo")
        assert dry_undo.status_code == 409 and "dry run" in dry_undo.json()["detail"]
        assert (await c.get(f"/v1/consolidation/runs/{done['id']}")).json()["status"] == "undone"
        audit = (await c.get("/v1/audit", params={"action": "consolidation."})).json()["data"]
        assert {a["action"] for a in audit} == {"consolidation.run", "consolidation.undo"}


# merge --------------------------------------------------------------------------------------


async def test_merge_supersedes_duplicates_in_a_scope_and_undo_restores_them(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        first = await add(c, "Ana prefers green tea in the morning.", confidence=0.95,
                          hints=["tea"], source_events=[{"session_id": "s0", "event_id": "e1"}])
        again = await add(c, "Ana prefers green tea in the morning", confidence=0.6)
        # Two named people: alike in words, two facts.
        await add(c, "Sam thanks Evan for all his support this year.")
        await add(c, "Evan thanks Sam for all his support this year.")
        other_user = await add(c, "Ana prefers green tea in the morning.", {"user_id": "u2"})
        distinct = await add(c, "Ana's brother lives in Porto")
        await drain(settings, pool)

        dry = await run(c, settings, pool, steps=["merge"], dry_run=True)
        assert dry["counts"]["merge"]["merged"] == 1
        planned = await changes(c, dry["id"])
        assert len(planned) == 1 and planned[0]["action"] == "merge"
        assert planned[0]["memory_id"] == first["id"] and planned[0]["other_id"] == again["id"]
        assert (await memory(c, first["id"]))["valid_until"] is None  # nothing applied

        done = await run(c, settings, pool, steps=["merge"])
        assert done["counts"]["merge"]["merged"] == 1 and done["changes"] == {
            "merge": {"keep": 1, "merge": 1}}
        assert done["counts"]["merge"]["different_subjects"] == 1
        lost, kept = await memory(c, first["id"]), await memory(c, again["id"])
        assert lost["superseded_by"] == again["id"] and lost["valid_until"] is not None
        assert kept["confidence"] == 0.95 and kept["hints"] == ["tea"]
        assert kept["source_events"] == [{"session_id": "s0", "event_id": "e1"}]
        assert (await memory(c, other_user["id"], {"user_id": "u2"}))["valid_until"] is None
        assert (await memory(c, distinct["id"]))["valid_until"] is None
        walk = (await c.get(f"/v1/memories/{again['id']}/related", params=U1)).json()
        assert [(e["from_id"], e["kind"], e["to_id"]) for e in walk["edges"]] == [
            (again["id"], "supersedes", first["id"])]

        # A change made after the run is never overwritten by its undo.
        await c.patch(f"/v1/memories/{again['id']}", json={
            "scope": U1, "expected_version": kept["version"], "source": "user"})
        undone = (await c.post(f"/v1/consolidation/runs/{done['id']}/undo")).json()
        assert undone["restored"] == 1 and undone["relations_removed"] == 1
        assert [s["memory_id"] for s in undone["skipped"]] == [again["id"]]
        back = await memory(c, first["id"])
        assert back["valid_until"] is None and back["superseded_by"] is None
        assert (await c.get(f"/v1/memories/{again['id']}/related", params=U1)).json()["edges"] == []
        history = (await c.get(f"/v1/memories/{first['id']}/history", params=U1)).json()
        assert [h["operation"] for h in history["history"]] == ["add", "supersede", "update"]


# decay --------------------------------------------------------------------------------------


async def test_decay_lowers_unused_raises_used_and_invalidates_at_the_floor(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        idle = await add(c, "Ana once mentioned a cat", layer="conversation", confidence=0.5)
        floor = await add(c, "A stale tool result", layer="tool", confidence=0.2)
        used = await add(c, "Ana likes hiking", layer="conversation", confidence=0.5)
        permanent = await add(c, "Ana is a nurse", confidence=0.5)
        await pool.execute("UPDATE memories SET created_at = now() - interval '60 days'")
        await pool.execute("UPDATE memories SET access_count = 4, accessed_at = now() "
                           "WHERE id = $1::uuid", used["id"])
        done = await run(c, settings, pool, steps=["decay"])
        assert done["counts"]["decay"] == {"reinforce": 1, "decay": 1, "invalidate": 1,
                                           "skipped_changed": 0}
        assert (await memory(c, idle["id"]))["confidence"] == pytest.approx(0.45)
        assert (await memory(c, used["id"]))["confidence"] == pytest.approx(0.55)
        gone = await memory(c, floor["id"])
        assert gone["valid_until"] is not None and "confidence floor" in gone["invalid_reason"]
        assert (await memory(c, permanent["id"]))["confidence"] == 0.5
        # The uses are counted once: a second run does not reinforce again.
        second = await run(c, settings, pool, steps=["decay"])
        assert second["counts"]["decay"]["reinforce"] == 0

        undone = (await c.post(f"/v1/consolidation/runs/{done['id']}/undo")).json()
        # idle changed again in the second run: it is skipped, the others come back.
        assert undone["restored"] == 2 and [s["memory_id"] for s in undone["skipped"]] == [
            idle["id"]]
        assert (await memory(c, floor["id"]))["valid_until"] is None
        assert (await memory(c, used["id"]))["confidence"] == 0.5


# link ---------------------------------------------------------------------------------------


async def test_link_relates_similar_memories_and_observes_finished_sessions(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        a = await add(c, "Ana is training for the Lisbon marathon in October")
        b = await add(c, "Ana runs 40 kilometres a week to prepare for the Lisbon marathon")
        await add(c, "The office printer is broken")
        events = [{"event_id": "e1", "role": "user", "content": "I adopted a dog named Rex",
                   "created_at": "2024-05-01T10:00:00Z", "sender_name": "Ana"},
                  {"event_id": "e2", "role": "user", "content": "Rex loves the beach",
                   "created_at": "2024-05-01T10:01:00Z", "sender_name": "Ana", "ending": True}]
        r = await c.post("/v1/sessions/s1/events", json={"scope": U1, "events": events})
        assert r.status_code in (200, 201, 202), r.text
        await drain(settings, pool)

        dry = await run(c, settings, pool, steps=["link"], dry_run=True, link_similarity=0.6)
        assert dry["counts"]["link"]["observations"] == 1
        assert await pool.fetchval("SELECT count(*) FROM memory_relations") == 0

        done = await run(c, settings, pool, steps=["link"], link_similarity=0.6)
        linked = await changes(c, done["id"], step="link")
        links = [(x["memory_id"], x["other_id"]) for x in linked if x["action"] == "link"]
        assert (a["id"], b["id"]) in links
        observed = [x for x in linked if x["action"] == "observe"]
        assert len(observed) == 1 and observed[0]["detail"]["session_id"] == "s1"
        note = await memory(c, observed[0]["memory_id"])
        assert note["layer"] == "observation" and note["session_id"] == "s1"
        assert note["content"].startswith("Session s1 (2024-05-01)")
        # A second run neither links again nor observes the session twice.
        await drain(settings, pool)
        second = await run(c, settings, pool, steps=["link"], link_similarity=0.6)
        assert second["counts"]["link"]["observations"] == 0
        assert (a["id"], b["id"]) not in [(x["memory_id"], x["other_id"]) for x in
                                          await changes(c, second["id"])]
        undone = (await c.post(f"/v1/consolidation/runs/{done['id']}/undo")).json()
        assert undone["observations_deleted"] == 1 and undone["relations_removed"] >= 1
        assert (await c.get(f"/v1/memories/{observed[0]['memory_id']}",
                            params=U1)).status_code == 404


# schedule, scope and isolation --------------------------------------------------------------


async def test_a_due_schedule_starts_one_run_however_many_sweep(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    from arq.connections import RedisSettings, create_pool

    from pipeline.queue_codec import ARQ_CODEC

    async with client(api_url, tenant[1]) as c:
        await add(c, "Something to keep")
        bad = await c.put("/v1/memory-policy", json={"schedule": "*/5 * * *"})
        assert bad.status_code == 422
        ok = await c.put("/v1/memory-policy", json={"schedule": "30 2 * * 1"})
        assert ok.status_code == 200
    queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        assert await schedule.start_due(pool, queue, settings) == 0  # rows made, none due
        due = await pool.fetchrow("SELECT * FROM memory_schedules WHERE tenant_id = $1",
                                  tenant[0])
        assert due["next_consolidation"].weekday() == 0 and due["next_consolidation"].hour == 2
        await pool.execute("UPDATE memory_schedules SET next_consolidation = now() - "
                           "interval '1 minute', next_prune = now() - interval '1 minute'")
        started = await asyncio.gather(*(schedule.start_due(pool, queue, settings)
                                         for _ in range(4)))
        assert sum(started) == 1
    finally:
        await queue.aclose()
    await drain(settings, pool)
    rows = await pool.fetch("SELECT steps, trigger, finished_at FROM upkeep_runs")
    assert [(r["steps"], r["trigger"]) for r in rows] == [
        (["prune", "promote", "merge", "decay", "link"], "schedule")]
    assert rows[0]["finished_at"] is not None


async def test_runs_are_the_tenants_own_and_a_bound_key_sees_only_its_scope(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        settings: Settings, pool: asyncpg.Pool) -> None:
    bound = tenants.new_key()
    await tenants.add_key(pool, tenant[0], bound, role="write", user_id="u1")
    async with client(api_url, tenant[1]) as c, client(api_url, other_tenant[1]) as o, \
            client(api_url, bound) as b:
        await add(c, "Tenant A's memory")
        wide = await run(c, settings, pool, steps=["merge"], dry_run=True)
        for path in (f"/v1/consolidation/runs/{wide['id']}",
                     f"/v1/consolidation/runs/{wide['id']}/changes"):
            assert (await o.get(path)).status_code == 404
            assert (await b.get(path)).status_code == 404  # a tenant-wide run: other users
        assert (await o.post(f"/v1/consolidation/runs/{wide['id']}/undo")).status_code == 404
        assert (await o.get("/v1/consolidation/runs")).json()["data"] == []
        mine = await b.post("/v1/consolidation/runs", json={"steps": ["merge"],
                                                            "dry_run": True})
        assert mine.status_code == 202 and mine.json()["run"]["scope"] == {"user_id": "u1"}
        # One run at a time per tenant.
        busy = await c.post("/v1/consolidation/runs", json={"steps": ["merge"]})
        assert busy.status_code == 409 and mine.json()["run_id"] in busy.json()["detail"]
        listed = (await b.get("/v1/consolidation/runs")).json()["data"]
        assert [r["id"] for r in listed] == [mine.json()["run_id"]]
        refused = await b.post("/v1/consolidation/runs", json={
            "scope": {"user_id": "u2"}, "steps": ["merge"]})
        assert refused.status_code == 403
        assert (await b.put("/v1/memory-policy", json={"memory_cap": 5})).status_code == 403
        for body in ({"steps": []}, {"steps": ["dream"]}, {"merge_similarity": 0.5,
                     "link_similarity": 0.9}, {"dry_run": "yes"},
                     {"merge_similarity": 0.8}):  # under the policy's link similarity, 0.85
            r = await c.post("/v1/consolidation/runs", json=body)
            assert r.status_code == 422, (body, r.text)
        assert await pool.fetchval("SELECT count(*) FROM upkeep_runs") == 2  # nothing half-made


async def test_the_dashboard_shows_runs_with_their_counts_and_changes(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        settings: Settings, pool: asyncpg.Pool) -> None:
    from tests.test_dashboard import sign_in

    async with client(api_url, tenant[1]) as c:
        await add(c, "Ana prefers green tea in the morning.")
        await add(c, "Ana prefers green tea in the morning")
        await drain(settings, pool)
        done = await run(c, settings, pool, steps=["merge"], dry_run=True)
    browser = await sign_in(api_url, tenant[1])
    other = await sign_in(api_url, other_tenant[1])
    try:
        listed = await browser.get("/dashboard/memory-runs")
        assert listed.status_code == 200 and done["id"][:8] in listed.text
        assert "merged 1" in listed.text and "dry run" in listed.text
        page = await browser.get(f"/dashboard/memory-runs/{done['id']}")
        assert page.status_code == 200 and "Ana prefers green tea" in page.text
        assert "1 of 1" in page.text
        # Another tenant's admin neither lists it nor opens it.
        assert done["id"][:8] not in (await other.get("/dashboard/memory-runs")).text
        assert (await other.get(f"/dashboard/memory-runs/{done['id']}")).status_code == 404
    finally:
        await browser.aclose()
        await other.aclose()


# profiles and working memory ----------------------------------------------------------------


async def test_extraction_keeps_a_profile_that_context_shows_first(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        assert (await c.get("/v1/profiles/u1")).status_code == 404
        events = [{"event_id": "e1", "role": "user", "sender_name": "Ana",
                   "content": "I'm new to Rust and its borrow checker.",
                   "created_at": "2024-05-01T10:00:00Z"},
                  {"event_id": "e2", "role": "user", "sender_name": "Ana",
                   "content": "I have been writing Python for ten years.",
                   "created_at": "2024-05-01T10:01:00Z", "ending": True}]
        assert (await c.post("/v1/sessions/s1/events",
                             json={"scope": U1, "events": events})).status_code == 202
        await drain(settings, pool)
        got = (await c.get("/v1/profiles/u1")).json()
        assert {(t["topic"], t["level"]) for t in got["topics"]} == {
            ("rust", "beginner"), ("python", "expert")}
        rust = next(t for t in got["topics"] if t["topic"] == "rust")
        assert rust["source"] == "extraction" and rust["source_events"] == [
            {"session_id": "s1", "event_id": "e1"}]
        # Later, Ana is learning Rust: the later statement replaces the earlier one.
        later = [{"event_id": "e3", "role": "user", "sender_name": "Ana",
                  "content": "I've been learning Rust every evening.",
                  "created_at": "2024-06-01T10:00:00Z", "ending": True}]
        await c.post("/v1/sessions/s2/events", json={"scope": U1, "events": later})
        await drain(settings, pool)
        rust = next(t for t in (await c.get("/v1/profiles/u1")).json()["topics"]
                    if t["topic"] == "rust")
        assert rust["level"] == "learning" and rust["evidence"] == 2

        set_ = await c.put("/v1/profiles/u1/topics/Spanish",
                           json={"level": "beginner", "summary": "Ana starts Spanish lessons"})
        assert set_.status_code == 200 and set_.json()["topic"] == "spanish"
        assert (await c.put("/v1/profiles/u1/topics/x", json={"level": "guru",
                                                            "summary": "?"})).status_code == 422
        context = (await c.post("/v1/context", json={"scope": U1, "query": "help with code",
                                                     "max_tokens": 500})).json()
        assert context["sections"][0]["name"] == "profile"
        assert context["context"].startswith("## About the user\n- spanish: beginner")
        assert {"kind": "profile", "id": "rust"} in [
            {k: v for k, v in i.items() if v is not None} for i in context["included"]]
        assert (await c.delete("/v1/profiles/u1/topics/spanish")).status_code == 204
        assert (await c.delete("/v1/profiles/u1/topics/spanish")).status_code == 404


async def test_working_memory_is_written_whole_with_versions_and_falls_back_to_the_user(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool) -> None:
    bound = tenants.new_key()
    await tenants.add_key(pool, tenant[0], bound, role="write", user_id="u2")
    async with client(api_url, tenant[1]) as c, client(api_url, bound) as b:
        empty = (await c.get("/v1/working-memory", params={"user_id": "u1"})).json()
        assert (empty["version"], empty["level"], empty["content"]) == (0, None, "")
        made = await c.put("/v1/working-memory", json={
            "scope": {"user_id": "u1", "agent_id": "planner"}, "content": "Goal: book Lisbon",
            "expected_version": 0})
        assert made.status_code == 200 and made.json()["version"] == 1
        again = await c.put("/v1/working-memory", json={
            "scope": U1, "content": "Goal: other", "expected_version": 0})
        assert again.status_code == 409 and "version 1" in again.json()["detail"]
        # A session without its own falls back to the user's.
        fallback = (await c.get("/v1/working-memory",
                                params={"user_id": "u1", "session_id": "s9"})).json()
        assert (fallback["level"], fallback["content"], fallback["agent_id"]) == (
            "user", "Goal: book Lisbon", "planner")
        own = await c.put("/v1/working-memory", json={
            "scope": U1, "session_id": "s9", "content": "Step 2: compare flights",
            "expected_version": 0})
        assert own.status_code == 200
        read = (await c.get("/v1/working-memory",
                            params={"user_id": "u1", "session_id": "s9"})).json()
        assert (read["level"], read["content"]) == ("session", "Step 2: compare flights")
        stale = await c.put("/v1/working-memory", json={
            "scope": U1, "session_id": "s9", "content": "x", "expected_version": 7})
        assert stale.status_code == 409
        newer = await c.put("/v1/working-memory", json={
            "scope": U1, "session_id": "s9", "content": "Step 3: pay", "expected_version": 1})
        assert newer.json()["version"] == 2
        context = (await c.post("/v1/context", json={
            "scope": U1, "query": "flights", "max_tokens": 300})).json()
        assert "## Working memory\nGoal: book Lisbon" in context["context"]
        too_long = await c.put("/v1/working-memory", json={
            "scope": U1, "content": "x" * 8001, "expected_version": 1})
        assert too_long.status_code == 422
        assert (await c.get("/v1/working-memory")).status_code == 422  # whose?
        # A key bound to another user neither reads nor writes u1's.
        assert (await b.get("/v1/working-memory", params={"user_id": "u1"})).status_code == 403
        mine = (await b.get("/v1/working-memory")).json()
        assert mine["user_id"] == "u2" and mine["version"] == 0
        assert (await c.delete("/v1/working-memory",
                               params={"user_id": "u1", "session_id": "s9"})).status_code == 204
        after = (await c.get("/v1/working-memory",
                             params={"user_id": "u1", "session_id": "s9"})).json()
        assert after["level"] == "user"


async def test_the_inbox_promotes_what_is_heard_again_and_drops_what_waited_too_long(
        api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        async def say(session: str, text: str) -> None:
            r = await c.post(f"/v1/sessions/{session}/events", json={"scope": U1, "events": [
                {"event_id": "e1", "role": "user", "sender_name": "Ana", "content": text,
                 "created_at": "2024-05-01T10:00:00Z", "ending": True}]})
            assert r.status_code == 202, r.text
            await drain(settings, pool)

        await say("s1", "Maybe I will visit Japan.")
        await say("s2", "I think maybe I'm going to learn the cello someday.")
        waiting = (await c.get("/v1/inbox", params=U1)).json()["data"]
        assert len(waiting) == 2 and all(w["status"] == "waiting" for w in waiting)
        assert all(w["attention"] < 0.5 for w in waiting)
        assert (await c.get("/v1/memories", params=U1)).json()["data"] == []
        await say("s3", "Maybe I will visit Japan.")
        japan = next(w for w in (await c.get("/v1/inbox", params=U1)).json()["data"]
                     if "Japan" in w["content"])
        assert japan["heard"] == 2 and japan["attention"] == pytest.approx(0.65)
        assert {e["session_id"] for e in japan["source_events"]} == {"s1", "s3"}
        await pool.execute("UPDATE memory_inbox SET created_at = now() - interval '8 days' "
                           "WHERE content LIKE '%cello%'")
        assert (await c.get("/v1/inbox", params={"user_id": "u2"})).json()["data"] == []

        done = await run(c, settings, pool, steps=["promote"])
        assert done["counts"]["promote"] == {"promoted": 1, "dropped": 1, "skipped_changed": 0}
        made = (await c.get("/v1/memories", params=U1)).json()["data"]
        assert len(made) == 1 and "Japan" in made[0]["content"]
        assert made[0]["source"] == "inbox" and made[0]["embedded"] is True
        assert {w["status"] for w in (await c.get("/v1/inbox", params=U1)).json()["data"]} == {
            "promoted", "dropped"}
        undone = (await c.post(f"/v1/consolidation/runs/{done['id']}/undo")).json()
        assert undone["promotions_deleted"] == 1 and undone["inbox_reopened"] == 2
        assert (await c.get("/v1/memories", params=U1)).json()["data"] == []
        assert {w["status"] for w in (await c.get("/v1/inbox", params=U1)).json()["data"]} == {
            "waiting"}
