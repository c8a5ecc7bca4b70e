"""Three small features of the memory API, each on its own, over HTTP against the real server:
a caller's own memory id (a write safe to send again), `valid_until` set when a memory is
written, and the `metadata` containment filter of listing and search (whose results now carry
their metadata). The LangGraph store is built on them (memmill/integrations)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
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


async def add(c: httpx.AsyncClient, content: str, **fields: Any) -> httpx.Response:
    return await c.post("/v1/memories", json={"scope": fields.pop("scope", U1), "type": "fact",
                                              "content": content, **fields})


def listed(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [m["content"] for m in r.json()["data"]]


async def test_a_callers_id_is_kept_and_a_second_write_of_it_is_a_409(
        api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str],
        pool: asyncpg.Pool) -> None:
    mine = str(uuid.uuid4())
    async with client(api_url, tenant[1]) as c, client(api_url, other_tenant[1]) as other:
        first = await add(c, "Ana flies on Friday", memory_id=mine)
        assert first.status_code == 201, first.text
        assert first.json()["memory"]["id"] == mine
        again = await add(c, "Ana flies on Saturday", memory_id=mine)
        assert again.status_code == 409, again.text
        assert again.json()["detail"].startswith("memory_id") and mine in again.json()["detail"]
        # Nothing of the refused write was kept: neither a row nor a job nor history.
        assert await pool.fetchval("SELECT count(*) FROM memories") == 1
        assert await pool.fetchval("SELECT count(*) FROM memory_history") == 1
        assert (await c.get(f"/v1/memories/{mine}", params=U1)).json()["content"] == (
            "Ana flies on Friday")
        # Ids are unique in a tenant, not across tenants: another tenant learns nothing.
        theirs = await add(other, "Their own memory", memory_id=mine)
        assert theirs.status_code == 201, theirs.text
        assert (await c.get(f"/v1/memories/{mine}", params=U1)).json()["content"] == (
            "Ana flies on Friday")
        bad = await add(c, "x", memory_id="not-a-uuid")
        assert bad.status_code == 422 and "memory_id" in bad.json()["detail"]


async def test_valid_until_on_write(
        api_url: str, tenant: tuple[int, str]) -> None:
    now = datetime.now(UTC)
    async with client(api_url, tenant[1]) as c:
        later = await add(c, "Ana is in Lisbon this week",
                          valid_until=(now + timedelta(days=5)).isoformat())
        gone = await add(c, "Ana was in Porto", valid_until=(now - timedelta(days=1)).isoformat())
        assert later.status_code == 201 and gone.status_code == 201, (later.text, gone.text)
        assert later.json()["memory"]["valid_until"] is not None
        assert listed(await c.get("/v1/memories", params=U1)) == ["Ana is in Lisbon this week"]
        assert len(listed(await c.get("/v1/memories", params={**U1, "valid_only": "false"}))) == 2
        found = await c.post("/v1/memories/search", json={"query": "Ana", "scope": U1})
        assert [h["content"] for h in found.json()["results"]] == ["Ana is in Lisbon this week"]

        # Its validity ends as any memory's does: invalidate moves it, with a reason.
        memory = later.json()["memory"]
        ended = await c.post(f"/v1/memories/{memory['id']}/invalidate", json={
            "scope": U1, "reason": "she left early",
            "valid_until": (now - timedelta(seconds=1)).isoformat()})
        assert ended.status_code == 200, ended.text
        assert listed(await c.get("/v1/memories", params=U1)) == []
        for body in ({"valid_until": 12}, {"valid_until": "tomorrow"}):
            r = await add(c, "x", **body)
            assert r.status_code == 422 and "valid_until" in r.json()["detail"], r.text


async def test_listing_keeps_the_memories_whose_metadata_contains_the_filter(
        api_url: str, tenant: tuple[int, str]) -> None:
    async with client(api_url, tenant[1]) as c:
        for content, metadata in (
                ("apollo plan", {"project": "apollo", "tags": ["a", "b"], "n": 1}),
                ("apollo note", {"project": "apollo", "nested": {"depth": 2, "x": "y"}}),
                ("gemini plan", {"project": "gemini", "tags": ["b"]})):
            assert (await add(c, content, metadata=metadata)).status_code == 201

        async def having(metadata: Any) -> list[str]:
            r = await c.get("/v1/memories", params={**U1, "metadata": json.dumps(metadata)})
            return sorted(listed(r))

        assert await having({"project": "apollo"}) == ["apollo note", "apollo plan"]
        assert await having({"tags": ["b"]}) == ["apollo plan", "gemini plan"]
        assert await having({"tags": ["a", "b"], "n": 1}) == ["apollo plan"]
        assert await having({"nested": {"depth": 2}}) == ["apollo note"]
        assert await having({"project": "mercury"}) == []
        assert await having({}) == ["apollo note", "apollo plan", "gemini plan"]
        # Another reader's scope still applies: the filter never widens what it may read.
        other = await c.get("/v1/memories", params={
            "user_id": "u2", "agent_id": "a2", "metadata": json.dumps({"project": "apollo"})})
        assert listed(other) == []

        for text, words in (("not json", "not JSON"), ("[1, 2]", "object"),
                            ('{"a": "\\u0000"}', "NUL"), ('{"a": NaN}', "NaN"),
                            ("[" * 5000, "not JSON"),
                            (json.dumps({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {
                                "i": {"j": {"k": {"l": {"m": {"n": {"o": {"p": {"q": 1}}}}}}}}}
                                }}}}}}}}), "16 levels")):
            r = await c.get("/v1/memories", params={**U1, "metadata": text})
            assert r.status_code == 422, (text, r.text)
            detail = r.json()["detail"]
            assert detail.startswith("metadata") and words in detail, detail


async def test_search_keeps_the_rows_whose_metadata_contains_the_filter_and_shows_it(
        api_url: str, tenant: tuple[int, str], settings: Settings,
        pool: asyncpg.Pool) -> None:
    async with client(api_url, tenant[1]) as c:
        for content, project in (("The apollo launch slipped to May", "apollo"),
                                 ("The gemini launch slipped to June", "gemini")):
            assert (await add(c, content, metadata={"project": project})).status_code == 201
        events = await c.post("/v1/sessions/s1/events", json={"scope": U1, "events": [
            {"event_id": "1", "role": "user", "content": "When is the apollo launch?",
             "metadata": {"project": "apollo"}},
            {"event_id": "2", "role": "user", "content": "When is the gemini launch?"}]})
        assert events.status_code == 202, events.text
        await drain(settings, pool)

        async def search(metadata: Any) -> list[tuple[str, Any]]:
            r = await c.post("/v1/memories/search", json={
                "query": "launch", "scope": U1, "include_events": True, "metadata": metadata})
            assert r.status_code == 200, r.text
            return sorted((h["content"], h["metadata"]) for h in r.json()["results"])

        assert await search({"project": "apollo"}) == [
            ("The apollo launch slipped to May", {"project": "apollo"}),
            ("When is the apollo launch?", {"project": "apollo"})]
        assert len(await search(None)) == 4
        assert await search({"project": "mercury"}) == []
        for bad, words in (([1], "dictionary"), ({"a": "\u0000"}, "NUL"), ("x", "dictionary")):
            r = await c.post("/v1/memories/search", json={"query": "launch", "scope": U1,
                                                          "metadata": bad})
            assert r.status_code == 422 and "metadata" in r.json()["detail"], r.text
            assert words in r.json()["detail"], r.text
