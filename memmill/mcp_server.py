"""memmill's MCP server: the tools of `memmill.mcp_tools` and two resources, built on the
official `mcp` package, for any transport.

`build_server` takes where each call's `AsyncMemmill` comes from, so the same server runs over
stdio (`memmill mcp`: one client, with the user's key, on the user's machine; see
`serve_stdio`) and over streamable HTTP (`/mcp` on the API: a client per request, with that
request's key; see `api.mcp`). Only the stdio server reads local files for `ingest`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator

from mcp.server.mcpserver import Context, MCPServer, ResourceSecurity
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp_types import ToolAnnotations

from memmill.client import AsyncMemmill, MemmillError, NotFound
from memmill.mcp_tools import CALL_TIMEOUT_S, PATH_OVER_HTTP, ClientSource, Tools

INSTRUCTIONS = (
    "memmill is long-term memory. Before answering anything that may depend on the past, call "
    "recall (or get_context at the start of a conversation or task). When the user states a "
    "lasting fact, preference, decision or plan, call remember with one self-contained "
    "statement. When something remembered stops being true, call forget with a reason. "
    "Documents go to ingest. Scope every call with the same user_id (the person) and "
    "agent_id (you), unless the key is bound to them.")
# Ids are the caller's and only ever reach the API as one encoded path segment, never a file
# system, so the SDK's path checks (no "..", no leading "/") would only refuse valid ids.
IDS_AS_GIVEN = ResourceSecurity(exempt_params={"item_id", "memory_id"})
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def build_server(clients: ClientSource, *, local_files: bool, user_id: str | None = None,
                 agent_id: str | None = None) -> MCPServer:
    """The server. `local_files`: whether `ingest` may read a path (stdio only);
    `user_id`/`agent_id`: the scope of calls that name none."""
    tools = Tools(clients, local_files=local_files, user_id=user_id, agent_id=agent_id)
    server: MCPServer = MCPServer("memmill", instructions=INSTRUCTIONS, log_level="WARNING")
    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    for tool, hints in (
            (tools.remember, writes), (tools.recall, READS), (tools.get_context, READS),
            (tools.forget, ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                           open_world_hint=False)),
            (tools.ingest, ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                           open_world_hint=True)),
            (tools.status, READS)):
        description = inspect.cleandoc(tool.__doc__ or "")
        if tool == tools.ingest:
            description += _path_rule(local_files)
        server.add_tool(tool, description=description, annotations=hints)
    _add_resources(server, tools)
    return server


def _path_rule(local_files: bool) -> str:
    if local_files:
        return ("\n\nA `path` is read on the user's machine, where this server runs, and "
                "uploaded; hidden files and credentials are never read.")
    return f"\n\nNo `path` here: {PATH_OVER_HTTP}."


def _add_resources(server: MCPServer, tools: Tools) -> None:
    async def item(item_id: str, ctx: Context) -> str:
        async with _reading(tools, ctx) as mm:
            return (await mm.items.get(item_id)).model_dump_json()

    async def memory(memory_id: str, ctx: Context, user_id: str | None = None,
                     agent_id: str | None = None) -> str:
        async with _reading(tools, ctx) as mm:
            found = await mm.memories.get(memory_id, **tools.scope(user_id, agent_id))
        return found.model_dump_json()

    server.resource(
        "memmill://items/{item_id}", name="item", mime_type="application/json",
        security=IDS_AS_GIVEN,
        description="A document: status, title, summary, tags, version and jobs. Encode a "
                    "slash in the id as %2F.")(item)
    server.resource(
        "memmill://memories/{memory_id}{?user_id,agent_id}", name="memory",
        mime_type="application/json", security=IDS_AS_GIVEN,
        description="A memory with every field, read as user_id/agent_id (a bound key "
                    "reads as its binding).")(memory)


@contextlib.asynccontextmanager
async def _reading(tools: Tools, ctx: Context) -> AsyncIterator[AsyncMemmill]:
    """The caller's client for a resource; a refusal is a resource error with the API's
    message (not found as such, so a client can tell)."""
    async with tools.clients(ctx) as client:
        try:
            yield client
        except NotFound as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        except MemmillError as exc:
            raise ResourceError(str(exc)) from exc


def one_client(client: AsyncMemmill) -> ClientSource:
    """Every call with the same client: the stdio server's, which has one user and one key."""

    @contextlib.asynccontextmanager
    async def source(_: Context) -> AsyncIterator[AsyncMemmill]:
        yield client

    return source


async def serve_stdio(url: str, key: str | None, *, user_id: str | None = None,
                      agent_id: str | None = None) -> None:
    """`memmill mcp`: serve on stdin/stdout until the client closes them."""
    async with AsyncMemmill(url, key, timeout_s=CALL_TIMEOUT_S) as client:
        server = build_server(one_client(client), local_files=True, user_id=user_id,
                              agent_id=agent_id)
        await server.run_stdio_async()
