"""The MCP tools: each one a call or two of the memmill API through `AsyncMemmill`.

No tool touches the database: every one goes through the API with the caller's key, so roles,
key bindings, quotas and tenant isolation apply to a tool call exactly as to an HTTP call, and
a refusal comes back as a tool error carrying the API's own message. Where the client comes
from is the transport's business (`ClientSource`): over stdio one client for the process, over
HTTP one per request, made from that request's key.

Each tool's docstring is its description for the model, and each parameter's `description`
is what the model sees of it, so both say when to use what, not how it works inside.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult
from pydantic import Field

from api.schemas import ItemPublic
from memmill.client import AsyncMemmill, MemmillError
from memmill.client.calls import Async
from memmill.client.resources import Items
from memmill.mcp_files import read_local
from memmill.mcp_params import (
    MAX_WAIT_S,
    AgentId,
    Confidence,
    ExtractNow,
    MemoryText,
    MemoryType,
    Metadata,
    Pinned,
    SessionId,
    Turn,
    Turns,
    UserId,
    Visibility,
    WaitS,
)
from memmill.mcp_views import (
    compact,
    context_view,
    hit_view,
    item_view,
    memory_view,
    operation_view,
    reply,
)

ClientSource = Callable[[Context], AbstractAsyncContextManager[AsyncMemmill]]
ITEM_POLL_S = 0.25  # between looks at an item someone waits for
# Each API call of a tool may be held that long by the server, and then some.
CALL_TIMEOUT_S = MAX_WAIT_S + 30.0

PATH_OVER_HTTP = (
    "ingest over HTTP takes text (`content`) or a `url` that memmill fetches; a `path` can "
    "only be read by the stdio server (`memmill mcp`) on the user's own machine: this server "
    "never reads its own files for a caller")


def exactly_one(**given: object) -> str:
    """The name of the one argument given, or a ToolError naming the choices."""
    named = [name for name, value in given.items() if value is not None]
    if len(named) != 1:
        choices = ", ".join(f"`{name}`" for name in given)
        raise ToolError(f"give exactly one of {choices} (got {len(named)})")
    return named[0]


class Tools:
    """The tools of one server. `user_id`/`agent_id` are the scope a call uses when it names
    none (`memmill mcp --user U --agent A`); a bound key's binding wins over both in the API."""

    def __init__(self, clients: ClientSource, *, local_files: bool,
                 user_id: str | None = None, agent_id: str | None = None) -> None:
        self.clients = clients
        self.local_files = local_files
        self.default_user = user_id
        self.default_agent = agent_id

    def scope(self, user_id: str | None, agent_id: str | None) -> dict[str, str | None]:
        return {"user_id": user_id or self.default_user,
                "agent_id": agent_id or self.default_agent}

    @asynccontextmanager
    async def api(self, ctx: Context) -> AsyncIterator[AsyncMemmill]:
        """The caller's client; a refusal of the API becomes a tool error with its message."""
        async with self.clients(ctx) as client:
            try:
                yield client
            except MemmillError as exc:
                raise ToolError(str(exc)) from exc

    async def remember(
        self, ctx: Context,
        content: MemoryText = None, turns: Turns = None, type: MemoryType = None,
        user_id: UserId = None, agent_id: AgentId = None, session_id: SessionId = None,
        confidence: Confidence = None, metadata: Metadata = None,
        visibility: Visibility = None, pinned: Pinned = None, extract_now: ExtractNow = False,
        wait_s: WaitS = 0,
    ) -> CallToolResult:
        """Store a memory, or append conversation turns to a session.

        Use `content` for one thing worth keeping across conversations (a fact, preference,
        decision or plan of the user, or something the agent learned). Use `turns` with
        `session_id` to log the conversation itself: memmill extracts memories from it in the
        background, and the turns are searchable with recall(include_events=true). The scope
        (user_id, agent_id) decides who may read it. Returns the stored memory (its id, for
        forget) or the count of turns stored, with operation ids to follow with `status`.
        """
        scope = self.scope(user_id, agent_id)
        exactly_one(content=content, turns=turns)
        memory_only = compact(type=type, confidence=confidence, metadata=metadata,
                              visibility=visibility, pinned=pinned)
        if turns is not None and memory_only:
            names = ", ".join(f"`{name}`" for name in memory_only)
            raise ToolError(f"turns take no {names}: that describes a memory given as `content`")
        if turns is None and extract_now:
            raise ToolError("`extract_now` goes with `turns`")
        async with self.api(ctx) as mm:
            if turns is not None:
                return await self._append(mm, turns, session_id, scope, extract_now, wait_s)
            written = await mm.memories.add(
                content or "", **scope, type=type or "fact", visibility=visibility,
                confidence=confidence, metadata=metadata, pinned=pinned, session_id=session_id)
            operation = str(written.operation_id) if written.operation_id else None
            return reply(compact(
                memory=memory_view(written.memory, **scope), operation_id=operation,
                indexing=await self._settled(mm, operation, scope, wait_s)))

    async def _append(self, mm: AsyncMemmill, turns: list[Turn], session_id: str | None,
                      scope: dict[str, str | None], extract_now: bool,
                      wait_s: float) -> CallToolResult:
        if not session_id:
            raise ToolError("turns go to a session: give `session_id`")
        if not turns:
            raise ToolError("`turns` is empty: give at least one turn")
        events = [turn.event(ending=extract_now and i == len(turns) - 1)
                  for i, turn in enumerate(turns)]
        accepted = await mm.sessions.add_events(session_id, events, **scope)
        operation = str(accepted.operation_id) if accepted.operation_id else None
        return reply(compact(
            session_id=accepted.session_id, stored=accepted.stored,
            duplicates=accepted.duplicates, operation_id=operation,
            extraction_operation_id=str(accepted.extraction_operation_id)
            if accepted.extraction_operation_id else None,
            indexing=await self._settled(mm, operation, scope, wait_s)))

    async def _settled(self, mm: AsyncMemmill, operation_id: str | None,
                       scope: dict[str, str | None], wait_s: float) -> str | None:
        """The operation's status after waiting up to `wait_s` (the server holds the request
        until it finishes), or None when nobody waits."""
        if not operation_id or not wait_s:
            return None
        return (await mm.operations.get(operation_id, **scope, wait_s=wait_s)).status

    async def recall(
        self, ctx: Context,
        query: Annotated[str, Field(description=(
            "What to look for, in words: a question or a topic."))],
        user_id: UserId = None, agent_id: AgentId = None,
        session_id: Annotated[str | None, Field(description=(
            "Only this session's memories and turns."))] = None,
        include_events: Annotated[bool, Field(description=(
            "Also search past conversation turns (what was said, word for word), not only "
            "the memories extracted from them."))] = False,
        types: Annotated[list[str] | None, Field(description=(
            "Only memories of these types, e.g. [\"preference\"]."))] = None,
        include_invalidated: Annotated[bool, Field(description=(
            "Also memories that were forgotten by invalidation."))] = False,
        limit: Annotated[int, Field(ge=1, le=50, description="How many results.")] = 10,
    ) -> CallToolResult:
        """Search what is remembered about a user or by an agent, by meaning and by words.

        Use before answering anything that may depend on the past: the user's preferences,
        facts they told, earlier decisions. Results are the memories the scope may read, best
        first, each with its id, score (0-1), type and text; with include_events also past
        turns with their session and time.
        """
        async with self.api(ctx) as mm:
            found = await mm.memories.search(
                query, **self.scope(user_id, agent_id), session_id=session_id, limit=limit,
                include_events=include_events or None, types=types,
                valid_only=False if include_invalidated else None)
        return reply({"results": [hit_view(hit) for hit in found.results],
                      **compact(warnings=found.warnings)})

    async def get_context(
        self, ctx: Context,
        user_id: UserId = None, agent_id: AgentId = None,
        session_id: Annotated[str | None, Field(description=(
            "The current conversation: its summary and latest turns are included."))] = None,
        query: Annotated[str | None, Field(description=(
            "What the context should bear on; default: the session's latest user turns."))
                         ] = None,
        max_tokens: Annotated[int, Field(ge=16, le=100_000, description=(
            "The budget for the whole text."))] = 1000,
    ) -> CallToolResult:
        """The text an agent should see now, ready to read: pinned memories, the memories and
        past turns most relevant to `query`, and the session's summary and latest turns,
        within `max_tokens`.

        Use at the start of a conversation or a task, instead of several recalls. Returns
        `context` (the text), its token count and whether anything was left out.
        """
        async with self.api(ctx) as mm:
            answer = await mm.context(**self.scope(user_id, agent_id), session_id=session_id,
                                      query=query, max_tokens=max_tokens)
        return reply(context_view(answer))

    async def forget(
        self, ctx: Context,
        memory_id: Annotated[str, Field(description="The memory's id (from remember or recall).")],
        mode: Annotated[Literal["invalidate", "delete"], Field(description=(
            "`invalidate` (default): no longer true, kept in history with the reason and left "
            "out of recall and context. `delete`: gone for good, with its history."))
                        ] = "invalidate",
        reason: Annotated[str | None, Field(description=(
            "Why it no longer holds; required to invalidate."))] = None,
        user_id: UserId = None, agent_id: AgentId = None,
        expected_version: Annotated[int | None, Field(ge=1, description=(
            "Only if the memory is still at this version (from recall or remember)."))
                                    ] = None,
    ) -> CallToolResult:
        """Forget a memory that is wrong or no longer true, by its id.

        Prefer `invalidate` with a reason when something changed ("moved to Lisbon"): the
        old memory stays in its history. `delete` removes it entirely, for what should never
        have been stored. Returns the memory as it now stands, or that it was deleted.
        """
        scope = self.scope(user_id, agent_id)
        async with self.api(ctx) as mm:
            if mode == "delete":
                await mm.memories.delete(memory_id, **scope, expected_version=expected_version)
                return reply({"deleted": memory_id})
            if not reason:
                raise ToolError("invalidating needs a `reason` (or use mode `delete`)")
            memory = await mm.memories.invalidate(memory_id, reason=reason, **scope,
                                                  expected_version=expected_version)
        return reply({"memory": memory_view(memory, **scope)})

    async def ingest(
        self, ctx: Context,
        content: Annotated[str | None, Field(description="The document's text.")] = None,
        url: Annotated[str | None, Field(description=(
            "An http(s) URL that memmill fetches and extracts (HTML, PDF, DOCX, ...)."))
                       ] = None,
        path: Annotated[str | None, Field(description=(
            "A file on the user's machine (stdio server only)."))] = None,
        item_id: Annotated[str | None, Field(description=(
            "The document's id; storing the same id again makes a new version. Default: the "
            "URL, the file's name, or one derived from the text."))] = None,
        title: Annotated[str | None, Field(description="A title (text and URL only).")] = None,
        tags: Annotated[dict[str, str] | None, Field(description=(
            "Labels to filter by later, e.g. {\"project\": \"apollo\"}."))] = None,
        wait_s: WaitS = 0,
    ) -> CallToolResult:
        """Store a document in memmill's document store: text, a URL or a file.

        memmill splits, summarizes and indexes it in the background; `status` with the
        item_id tells when it is ready. Use for reference material (notes, pages, papers),
        not for facts about the user (use remember). Returns the item with its status.
        """
        source = exactly_one(content=content, url=url, path=path)
        async with self.api(ctx) as mm:
            if source == "path":
                item_id, change = await self._upload(mm, path or "", item_id, title, tags)
            else:
                item_id = item_id or url or "notes/" + hashlib.sha256(
                    (content or "").encode()).hexdigest()[:16]
                accepted = await mm.items.put(item_id, content, uri=url, title=title, tags=tags)
                item_id, change = accepted.item.id, accepted.change
            item = await settle(mm.items, item_id, wait_s)
        return reply({"item": item_view(item), "change": change})

    async def _upload(self, mm: AsyncMemmill, path: str, item_id: str | None,
                      title: str | None, tags: dict[str, str] | None) -> tuple[str, str]:
        if not self.local_files:
            raise ToolError(PATH_OVER_HTTP)
        if title is not None:
            raise ToolError("a file's title comes from the file itself: leave out `title`")
        name, data = await asyncio.to_thread(read_local, path)
        answer = await mm.items.upload([(item_id or name, data)], tags=tags)
        if answer.refused:
            raise ToolError(f"memmill refused {path}: {answer.refused[0].error}")
        return answer.accepted[0].id, answer.accepted[0].change

    async def status(
        self, ctx: Context,
        item_id: Annotated[str | None, Field(description="A document's id (from ingest).")
                           ] = None,
        operation_id: Annotated[str | None, Field(description=(
            "An operation's id (from remember: indexing or extracting memories)."))] = None,
        user_id: UserId = None, agent_id: AgentId = None,
        wait_s: WaitS = 0,
    ) -> CallToolResult:
        """Where background work stands: a document's status (pending, ready or failed, with
        its summary once ready, or the error) or an operation's (pending, running, done,
        failed; an extraction lists the memories it added or changed).

        Give item_id or operation_id; wait_s waits for it to finish.
        """
        kind = exactly_one(item_id=item_id, operation_id=operation_id)
        async with self.api(ctx) as mm:
            if kind == "item_id":
                return reply(item_view(await settle(mm.items, item_id or "", wait_s)))
            operation = await mm.operations.get(operation_id or "", **self.scope(
                user_id, agent_id), wait_s=wait_s or None)
        return reply(operation_view(operation))


async def settle(items: Items[Async], item_id: str, wait_s: float) -> ItemPublic:
    """The item once it is no longer pending, or as it is when `wait_s` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        item = await items.get(item_id)
        if item.status != "pending" or time.monotonic() + ITEM_POLL_S > deadline:
            return item
        await asyncio.sleep(ITEM_POLL_S)
