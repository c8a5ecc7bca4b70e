"""memmill's MCP server, driven by the `mcp` package's own client against the real API: over
streamable HTTP at `/mcp` (in process, behind the API's keys) and over stdio (`memmill mcp` as
a subprocess, calling the API served in this test's event loop). Jobs run in a real worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from pipeline import quotas, tenants
from pipeline.settings import Settings
from tests.test_auth_first import send_head_only

TOOLS = {"remember", "recall", "get_context", "forget", "ingest", "status"}


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[None]:
    """A real worker, polling, for the tools that wait for background work."""
    from workers.main import build_worker

    running = build_worker(settings, sweep=False, poll_delay_s=0.02)
    task = asyncio.create_task(running.main())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await running.close()


@contextlib.asynccontextmanager
async def over_http(api_url: str, key: str, *, mode: str = "auto") -> AsyncIterator[Client]:
    """The mcp package's client on `/mcp`, sending `key` with every request. `auto` speaks
    the newest protocol the server offers; `legacy` the initialize handshake that clients
    of the 2025 protocol (Claude Desktop, IDEs) still send."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120)
    transport = streamable_http_client(f"{api_url}/mcp", http_client=http)
    async with http, Client(transport, mode=mode) as client:
        yield client


async def key_for(pool: asyncpg.Pool, tenant_id: int, **options: Any) -> str:
    key = tenants.new_key()
    await tenants.add_key(pool, tenant_id, key, **options)
    return key


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's result, which must not be an error; the JSON text and the structured content
    must say the same."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    assert json.loads(text_of(result)) == result.structured_content
    assert result.structured_content is not None
    return result.structured_content


async def refusal(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, text_of(result)
    return text_of(result)


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def read(client: Client, uri: str) -> dict[str, Any]:
    result = await client.read_resource(uri)
    return json.loads(getattr(result.contents[0], "text", ""))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_endpoint_lists_its_tools_and_resources_and_calls_them(
    api_url: str, tenant: tuple[int, str], mode: str
) -> None:
    async with over_http(api_url, tenant[1], mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        templates = (await client.list_resource_templates()).resource_templates
        written = await call(client, "remember", content="Ana grows tomatoes", user_id="ana")
        found = await call(client, "recall", query="tomatoes", user_id="ana")
    assert [hit["id"] for hit in found["results"]] == [written["memory"]["id"]]
    assert set(tools) == TOOLS
    assert {t.uri_template for t in templates} == {
        "memmill://items/{item_id}", "memmill://memories/{memory_id}{?user_id,agent_id}"}
    assert "stdio server" in (tools["ingest"].description or "")
    assert tools["recall"].annotations and tools["recall"].annotations.read_only_hint
    assert tools["forget"].annotations and tools["forget"].annotations.destructive_hint
    for tool in tools.values():
        assert tool.description and len(tool.description) > 200, tool.name


async def test_remember_recall_get_context_and_forget(
    api_url: str, tenant: tuple[int, str], worker: None
) -> None:
    async with over_http(api_url, tenant[1]) as client:
        written = await call(client, "remember", content="Ana prefers the window seat",
                             user_id="ana", type="preference", wait_s=30)
        memory = written["memory"]
        assert (memory["type"], memory["user_id"], written["indexing"]) == (
            "preference", "ana", "done")
        found = await call(client, "recall", query="where does Ana like to sit on a plane",
                           user_id="ana")
        assert found["results"][0]["id"] == memory["id"]
        assert found["results"][0]["content"] == "Ana prefers the window seat"
        context = await call(client, "get_context", user_id="ana", query="seating",
                             max_tokens=200)
        assert "window seat" in context["context"] and context["tokens"] <= 200
        assert "needs a `reason`" in await refusal(
            client, "forget", memory_id=memory["id"], user_id="ana")
        gone = await call(client, "forget", memory_id=memory["id"], user_id="ana",
                          reason="she now prefers the aisle")
        assert gone["memory"]["invalid_reason"] == "she now prefers the aisle"
        assert (await call(client, "recall", query="window seat", user_id="ana"))[
            "results"] == []
        kept = await call(client, "recall", query="window seat", user_id="ana",
                          include_invalidated=True)
        assert [hit["id"] for hit in kept["results"]] == [memory["id"]]
        assert await call(client, "forget", memory_id=memory["id"], user_id="ana",
                          mode="delete") == {"deleted": memory["id"]}
        assert "404" in await refusal(client, "forget", memory_id=memory["id"],
                                      user_id="ana", mode="delete")


async def test_turns_appended_to_a_session_are_recalled_and_extracted(
    api_url: str, tenant: tuple[int, str], worker: None
) -> None:
    turns = [{"role": "user", "content": "I am going to visit Lisbon on Friday.",
              "sender_name": "Ana"},
             {"role": "assistant", "content": "Noted, have a good trip!"}]
    async with over_http(api_url, tenant[1]) as client:
        appended = await call(client, "remember", turns=turns, session_id="trip-1",
                              user_id="ana", extract_now=True, wait_s=30)
        assert (appended["stored"], appended["duplicates"], appended["indexing"]) == (
            2, 0, "done")
        found = await call(client, "recall", query="Lisbon trip", user_id="ana",
                            include_events=True)
        events = {hit["content"]: hit for hit in found["results"] if hit["kind"] == "event"}
        said = events["I am going to visit Lisbon on Friday."]
        assert (said["session_id"], said["role"], said["sender_name"]) == (
            "trip-1", "user", "Ana")
        extraction = await call(client, "status", operation_id=appended[
            "extraction_operation_id"], user_id="ana", wait_s=30)
        assert extraction["status"] == "done", extraction
        assert any("Lisbon" in d["content"] for d in extraction.get("decisions", [])), extraction
        context = await call(client, "get_context", user_id="ana", session_id="trip-1")
        assert "Lisbon" in context["context"]
        assert "turns take no `type`" in await refusal(client, "remember", turns=turns,
                                            session_id="trip-1", user_id="ana",
                                            type="fact")
        assert "session_id" in await refusal(client, "remember", turns=turns, user_id="ana")


async def test_ingest_text_then_status_and_both_resources(
    api_url: str, tenant: tuple[int, str], worker: None
) -> None:
    async with over_http(api_url, tenant[1]) as client:
        ingested = await call(client, "ingest", item_id="notes/bread",
                              content="Sourdough rises thanks to wild yeast and bacteria.",
                              tags={"topic": "baking"})
        assert ingested["change"] == "created"
        assert ingested["item"]["resource"] == "memmill://items/notes%2Fbread"
        state = await call(client, "status", item_id="notes/bread", wait_s=60)
        assert state["status"] == "ready" and "yeast" in state["summary"]
        item = await read(client, state["resource"])
        assert (item["id"], item["status"], item["tags"]) == (
            "notes/bread", "ready", {"topic": "baking"})
        written = await call(client, "remember", content="The build runs on Python 3.11",
                             agent_id="ci-bot")
        memory = await read(client, written["memory"]["resource"])
        assert (memory["content"], memory["visibility"]) == (
            "The build runs on Python 3.11", "private")
        with pytest.raises(MCPError, match="404"):
            await read(client, f"memmill://memories/{written['memory']['id']}")
        assert "exactly one" in await refusal(client, "ingest", content="x",
                                              url="https://example.com/")


async def test_stdio_server_calls_the_api_with_its_key_and_reads_local_files(
    api_url: str, tenant: tuple[int, str], worker: None, tmp_path: Path
) -> None:
    note = tmp_path / "tides.md"
    note.write_text("# Tides\n\nThe moon's pull makes the tides.\n")
    secret = tmp_path / ".env"
    secret.write_text("TOKEN=hunter2\n")
    server = StdioServerParameters(command=sys.executable, args=[
        "-m", "memmill", "mcp", "--url", api_url, "--key", tenant[1], "--user", "ana"])
    async with Client(server, mode="legacy") as client:
        written = await call(client, "remember", content="Ana keeps bees", wait_s=30)
        assert written["memory"]["user_id"] == "ana"
        found = await call(client, "recall", query="bees")
        assert found["results"][0]["id"] == written["memory"]["id"]
        ingested = await call(client, "ingest", path=str(note), wait_s=60)
        assert (ingested["item"]["id"], ingested["item"]["status"]) == ("tides.md", "ready")
        assert "hidden" in await refusal(client, "ingest", path=str(secret))
        assert "not a file" in await refusal(client, "ingest", path=str(tmp_path / "none"))


async def test_no_key_or_a_wrong_one_is_refused_before_the_body(
    api_url: str, tenant: tuple[int, str]
) -> None:
    for headers in ({}, {"Authorization": "Bearer mm_not_a_key_at_all"},
                    {"X-API-Key": "mm_not_a_key_either"}):
        status, _ = await send_head_only(api_url, "/mcp", headers)
        assert status == 401, headers
    # With the key, the declared size is checked next, still before the body.
    status, _ = await send_head_only(api_url, "/mcp", {"Authorization": f"Bearer {tenant[1]}"})
    assert status == 413
    async with httpx.AsyncClient(base_url=api_url, timeout=10) as http:
        answer = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert answer.status_code == 401 and "API key" in answer.json()["detail"]
        assert "/mcp" not in (await http.get("/openapi.json")).json()["paths"]
        # Stateless: no event stream to hold open, no session to end.
        for method in ("GET", "DELETE"):
            answer = await http.request(method, "/mcp", headers={
                "Authorization": f"Bearer {tenant[1]}", "Accept": "text/event-stream"})
            assert (answer.status_code, answer.headers["allow"]) == (405, "POST")


async def test_quotas_and_rate_limits_hold_tool_calls_as_http_calls(
    api_url: str, pool: asyncpg.Pool, other_tenant: tuple[int, str]
) -> None:
    # Each tool call is one API request; the MCP requests around them are not counted.
    await quotas.set_limits(pool, other_tenant[0], memories=1, requests_per_minute=4)
    async with over_http(api_url, other_tenant[1]) as client:
        await call(client, "remember", content="Ana keeps bees", user_id="ana")
        message = await refusal(client, "remember", content="Ana keeps goats", user_id="ana")
        assert "429" in message and "memories" in message
        for _ in range(2):
            await call(client, "recall", query="bees", user_id="ana")
        message = await refusal(client, "recall", query="bees", user_id="ana")
        assert "429" in message and "requests_per_minute" in message


async def test_a_read_only_key_reads_but_its_writes_are_refused_tool_errors(
    api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool
) -> None:
    reader = await key_for(pool, tenant[0], name="reader", role="read")
    async with over_http(api_url, reader) as client:
        assert (await call(client, "recall", query="anything", user_id="ana"))["results"] == []
        message = await refusal(client, "remember", content="Ana likes tea", user_id="ana")
        assert "403" in message and "read-only" in message
        assert "read-only" in await refusal(client, "ingest", content="A note.")
    async with over_http(api_url, tenant[1]) as client:
        assert (await call(client, "recall", query="tea", user_id="ana"))["results"] == []


async def test_another_tenants_memory_is_not_found(
    api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str]
) -> None:
    async with over_http(api_url, tenant[1]) as client:
        written = await call(client, "remember", content="Ana's door code is 4711",
                             visibility="tenant", type="fact")
    memory_id = written["memory"]["id"]
    async with over_http(api_url, other_tenant[1]) as client:
        for mode in ("invalidate", "delete"):
            message = await refusal(client, "forget", memory_id=memory_id, mode=mode,
                                    reason="stale")
            assert f"HTTP 404: no memory {memory_id}" in message
        with pytest.raises(MCPError, match="HTTP 404"):
            await read(client, f"memmill://memories/{memory_id}")
        assert (await call(client, "recall", query="door code"))["results"] == []
    async with over_http(api_url, tenant[1]) as client:
        assert (await read(client, f"memmill://memories/{memory_id}"))["content"] == (
            "Ana's door code is 4711")


async def test_a_key_bound_to_an_agent_cannot_recall_another_agents_private_memories(
    api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool
) -> None:
    planner = await key_for(pool, tenant[0], name="planner", role="write", agent_id="planner")
    critic = await key_for(pool, tenant[0], name="critic", role="write", agent_id="critic")
    async with over_http(api_url, critic) as client:
        written = await call(client, "remember", content="The critic distrusts the budget")
    assert (written["memory"]["agent_id"], written["memory"]["visibility"]) == (
        "critic", "private")
    async with over_http(api_url, planner) as client:
        assert (await call(client, "recall", query="budget"))["results"] == []
        message = await refusal(client, "recall", query="budget", agent_id="critic")
        assert "403" in message and "bound to agent 'planner'" in message
        with pytest.raises(MCPError, match="bound to agent"):
            await read(client, written["memory"]["resource"] + "?agent_id=critic")
    async with over_http(api_url, critic) as client:
        found = await call(client, "recall", query="budget")
        assert [hit["id"] for hit in found["results"]] == [written["memory"]["id"]]


async def test_ingest_of_a_path_over_http_is_refused(
    api_url: str, tenant: tuple[int, str], tmp_path: Path
) -> None:
    target = tmp_path / "server-side.txt"
    target.write_text("What the server holds.")
    async with over_http(api_url, tenant[1]) as client:
        message = await refusal(client, "ingest", path=str(target))
        assert "stdio server" in message and "never reads its own files" in message
        assert "404" in await refusal(client, "status", item_id="server-side.txt")
