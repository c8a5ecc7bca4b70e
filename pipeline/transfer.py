"""A tenant's data out and in: the export file's lines, read from one snapshot, and an import
that checks every line before it writes anything, then writes all of it in one transaction.

The file is NDJSON (the format is described in README.md, "Export and import", and validated
by `api/transfer_schemas.py`): a header, then memory types, items (each right after its
archived versions, oldest first), memories (each followed by its history), and sessions
(each followed by its events, in the order they were written). Nothing in it names the
installation or the tenant: no tenant id, key id, operation id, sequence number, host or path.
Vectors are not exported: the importing installation embeds again, with its own model.

An import re-ingests items through the put path (`pipeline.items.put_item`), which writes
their ledger jobs, so parts, summaries and vectors are rebuilt exactly as for a put; memories,
sessions and events are written as they were, ids kept, and their embedding jobs queued. Every
id is unique per tenant only (a memory's primary key is (tenant_id, id)), so an import into
another tenant of the same installation keeps the ids too."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import asyncpg

from pipeline import items, jobs, quotas
from pipeline.db import Q
from pipeline.errors import BadInput, Conflict, MemmillError
from pipeline.memory import extraction_schedule, memories
from pipeline.memory.indexing import CONTEXT_TURNS, Neighbour, event_texts
from pipeline.memory.memories import Author
from pipeline.settings import Settings

log = logging.getLogger(__name__)

FORMAT = "memmill-export"
VERSION = 1
# Every type of line but the header, in the order an export writes them.
TYPES = ("memory_type", "item_version", "item", "memory", "memory_history", "session", "event")
# A line of these types follows its parent's line; an export of the child needs the parent.
PARENTS = {"item_version": "item", "memory_history": "memory", "event": "session"}
OnConflict = Literal["fail", "skip"]
Line = dict[str, Any]

PAGE_ROWS = 200  # rows a cursor fetches at a time
SOURCE_BATCH_BYTES = 8_000_000  # sources fetched together, unless one alone is larger
BATCH = 500  # events written together; memories or events per embedding job
SHOWN_IDS = 10  # ids a 409 names, of each type


def check_types(types: Iterable[str]) -> tuple[str, ...]:
    """The types of an export, in file order; a child without its parent is refused."""
    asked = set(types)
    unknown = sorted(asked - set(TYPES))
    if unknown:
        raise BadInput(f"types: unknown type {unknown[0]!r}; the types are {', '.join(TYPES)}")
    for child, parent in PARENTS.items():
        if child in asked and parent not in asked:
            raise BadInput(f"types: {child} lines follow their {parent}: ask for {parent} too")
    return tuple(t for t in TYPES if t in asked)


# export ------------------------------------------------------------------------------------


async def export_lines(conn: asyncpg.Connection, tenant_id: int,
                       types: Sequence[str] = TYPES) -> AsyncGenerator[Line, None]:
    """The tenant's lines, header first. `conn` must be in a REPEATABLE READ transaction, so
    the counts and every row come from one snapshot; rows are read through cursors a page at a
    time, and sources a bounded batch at a time, so memory does not grow with the tenant."""
    counted = await conn.fetchrow(Q["transfer.counts"], tenant_id)
    yield {"type": "header", "format": FORMAT, "version": VERSION,
           "exported_at": datetime.now(UTC), "counts": {t: counted[t] for t in types}}
    if "memory_type" in types:
        async for page in _pages(conn, Q["transfer.memory_types"], tenant_id):
            for row in page:
                yield {"type": "memory_type", **dict(row)}
    if "item" in types:
        async for line in _items(conn, tenant_id, versions="item_version" in types):
            yield line
    if "memory" in types:
        async for line in _memories(conn, tenant_id, history="memory_history" in types):
            yield line
    if "session" in types:
        async for line in _sessions(conn, tenant_id, events="event" in types):
            yield line


async def _pages(conn: asyncpg.Connection, query: str, *args: Any,
                 rows: int = PAGE_ROWS) -> AsyncIterator[list[asyncpg.Record]]:
    cursor = await conn.cursor(query, *args)
    while page := await cursor.fetch(rows):
        yield page


def _source_line(row: asyncpg.Record | None) -> Line | None:
    if row is None:
        return None
    data = row["data"]
    return {"media_type": row["media_type"], "content": row["content"],
            "data": base64.b64encode(data).decode() if data is not None else None,
            "uri": row["uri"], "filename": row["filename"]}


async def _items(conn: asyncpg.Connection, tenant_id: int, *,
                 versions: bool) -> AsyncIterator[Line]:
    async for page in _pages(conn, Q["transfer.items"], tenant_id):
        archived: dict[str, list[asyncpg.Record]] = {}
        older = [r["id"] for r in page if r["version"] > 1] if versions else []
        for row in await conn.fetch(Q["transfer.item_versions"], tenant_id, older) if older \
                else []:
            archived.setdefault(row["item_id"], []).append(row)
        ordered: list[tuple[str, str, asyncpg.Record]] = []
        for row in page:
            ordered += [("item_version", row["id"], v) for v in archived.get(row["id"], [])]
            ordered.append(("item", row["id"], row))
        start = 0
        while start < len(ordered):
            end, size = start + 1, ordered[start][2]["source_bytes"]
            while end < len(ordered) and size + ordered[end][2]["source_bytes"] <= \
                    SOURCE_BATCH_BYTES:
                size += ordered[end][2]["source_bytes"]
                end += 1
            batch = ordered[start:end]
            found = await conn.fetch(Q["transfer.sources"], tenant_id, [b[1] for b in batch],
                                     [b[2]["version"] for b in batch])
            sources = {(r["item_id"], r["version"]): r for r in found}
            for kind, item_id, row in batch:
                fields = {k: v for k, v in dict(row).items() if k != "source_bytes"}
                yield {"type": kind, **fields,
                       "source": _source_line(sources.get((item_id, row["version"])))}
            start = end


async def _memories(conn: asyncpg.Connection, tenant_id: int, *,
                    history: bool) -> AsyncIterator[Line]:
    async for page in _pages(conn, Q["transfer.memories"], tenant_id):
        changes: dict[uuid.UUID, list[asyncpg.Record]] = {}
        if history:
            for row in await conn.fetch(Q["transfer.memory_history"], tenant_id,
                                        [r["id"] for r in page]):
                changes.setdefault(row["memory_id"], []).append(row)
        for row in page:
            yield {"type": "memory", **dict(row)}
            for change in changes.get(row["id"], []):
                yield {"type": "memory_history", **dict(change)}


async def _sessions(conn: asyncpg.Connection, tenant_id: int, *,
                    events: bool) -> AsyncIterator[Line]:
    async for page in _pages(conn, Q["transfer.sessions"], tenant_id):
        for row in page:
            yield {"type": "session", **dict(row)}
            if not events:
                continue
            async for rows in _pages(conn, Q["transfer.events"], tenant_id, row["id"],
                                     rows=BATCH):
                for event in rows:
                    yield {"type": "event", "session_id": row["id"], **dict(event)}


# import, first pass: check the file ----------------------------------------------------------


def new_item(item_id: str, line: Mapping[str, Any]) -> items.NewItem:
    """What the put path is given for an item or an archived version: the caller's tags only
    (system tags come back from extraction), the source as it was sent, and the title. A
    title longer than a put allows was extraction's (a document's first heading): extraction
    finds it again."""
    source, title = line["source"], line["title"]
    if source is None:
        raise BadInput(f"item {item_id!r} has no source: nothing to ingest it from")
    if title is not None and len(title) > items.MAX_TITLE_CHARS:
        title = None
    return items.NewItem(
        id=item_id, content=source["content"], data=source["data"], uri=source["uri"],
        media_type=source["media_type"] if source["data"] is not None else None,
        filename=source["filename"], title=title, tags=items.caller_tags(line["tags"]))


def _columns(lines: Sequence[Line], *names: str) -> list[list[Any]]:
    """Lines as one list per field, for a statement that inserts or updates from unnest()."""
    return [[line[name] for line in lines] for name in names]


def _size(new: items.NewItem) -> int:
    return len(new.content.encode()) if new.content is not None else len(new.data or b"")


@dataclass
class Adding:
    """What an item, a memory or a session (with its events) adds to the tenant's usage."""

    bytes: int = 0
    jobs: int = 0


@dataclass
class Plan:
    """What the first pass learnt of a file: its ids (with the line each is on and what it
    adds), and the non-built-in memory types its memories use (with the first line)."""

    counts: dict[str, int] = field(default_factory=dict)
    item: dict[str, tuple[int, Adding]] = field(default_factory=dict)
    memory: dict[uuid.UUID, tuple[int, Adding]] = field(default_factory=dict)
    session: dict[str, tuple[int, Adding]] = field(default_factory=dict)
    memory_type: dict[str, tuple[int, Adding]] = field(default_factory=dict)
    types_used: dict[str, int] = field(default_factory=dict)


class Checker:
    """The first pass: each line, validated already, against the file's rules (the header
    first, each id once, each child right after its parent, the counts the header promised),
    so that a file that would fail halfway is refused before anything is written."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan = Plan()
        self.seen: Counter[str] = Counter()
        self.line_no = 0
        self.header = False
        self.versions: tuple[str, int] | None = None  # the item whose versions run, the last
        self.version_bytes = 0  # the bytes of their sources
        self.memory: tuple[uuid.UUID, int] | None = None  # the memory and its last history
        self.session: tuple[str, set[str], int, int] | None = None  # id, events, line, extracted

    def fail(self, message: str) -> BadInput:
        return BadInput(f"line {self.line_no}: {message}")

    def add(self, line_no: int, line: Line) -> None:
        self.line_no = line_no
        kind = line["type"]
        if not self.header:
            if kind != "header":
                raise self.fail(f"the first line must be the header, not a {kind} line")
            self.header = True
            self.plan.counts = line["counts"]
            return
        if kind == "header":
            raise self.fail("a second header")
        if kind not in self.plan.counts:
            raise self.fail(f"a {kind} line, but the header counts no {kind} lines")
        self.seen[kind] += 1
        if self.versions is not None and kind != "item_version" and (
                kind != "item" or line["id"] != self.versions[0]):
            raise self.fail(f"the item_version lines of {self.versions[0]!r} must be followed "
                            "by that item's line")
        if kind != "memory_history":
            self.memory = None
        if kind not in ("session", "event"):
            self._close_session()
        getattr(self, f"_{kind}")(line)

    def _once(self, kind: str, key: Any, adding: Adding) -> None:
        ids: dict[Any, tuple[int, Adding]] = getattr(self.plan, kind)
        if key in ids:
            raise self.fail(f"{kind} {str(key)!r} appears twice (first on line {ids[key][0]})")
        ids[key] = (self.line_no, adding)

    def _checked_item(self, item_id: str, line: Line) -> items.NewItem:
        try:
            new = new_item(item_id, line)
            items.check_new_item(new, self.settings)
        except MemmillError as exc:
            raise type(exc)(f"line {self.line_no}: item {item_id!r}: {exc.message}") from None
        if line["content_hash"] is not None and line["content_hash"] != new.content_hash:
            raise self.fail(f"item {item_id!r}: content_hash does not match the source")
        return new

    def _item_version(self, line: Line) -> None:
        item_id, version = line["item_id"], line["version"]
        if item_id in self.plan.item:
            raise self.fail(f"item_version of {item_id!r} after its item: versions come first")
        expected = self.versions[1] + 1 if self.versions else 1
        if self.versions and self.versions[0] != item_id:
            raise self.fail(f"the item_version lines of {self.versions[0]!r} must be followed "
                            "by that item's line")
        if version != expected:
            raise self.fail(f"item {item_id!r}: version {version} where version {expected} "
                            "was due (versions come oldest first, from 1)")
        self.version_bytes += _size(self._checked_item(item_id, line))
        self.versions = (item_id, version)

    def _item(self, line: Line) -> None:
        new = self._checked_item(line["id"], line)
        if self.versions is not None and line["version"] != self.versions[1] + 1:
            raise self.fail(f"item {line['id']!r} is at version {line['version']}, but its "
                            f"archived versions end at {self.versions[1]}")
        pipeline = jobs.DOCUMENT_PIPELINE if new.needs_regularize else jobs.TEXT_PIPELINE
        self._once("item", line["id"], Adding(self.version_bytes + _size(new), len(pipeline)))
        self.versions, self.version_bytes = None, 0

    def _memory_type(self, line: Line) -> None:
        if line["name"] in memories.BUILTIN_TYPES:
            raise self.fail(f"memory type {line['name']!r} is built in: it needs no line")
        self._once("memory_type", line["name"], Adding())

    def _memory(self, line: Line) -> None:
        self._once("memory", line["id"], Adding(len(line["content"].encode())))
        if line["memory_type"] not in memories.BUILTIN_TYPES:
            self.plan.types_used.setdefault(line["memory_type"], self.line_no)
        self.memory = (line["id"], 0)

    def _memory_history(self, line: Line) -> None:
        if self.memory is None or self.memory[0] != line["memory_id"]:
            raise self.fail(f"the history of memory {str(line['memory_id'])!r} must follow "
                            "that memory's line")
        if line["version"] <= self.memory[1]:
            raise self.fail(f"memory {str(line['memory_id'])!r}: history versions must "
                            "increase")
        self.memory = (self.memory[0], line["version"])

    def _session(self, line: Line) -> None:
        self._close_session()
        self._once("session", line["id"], Adding())
        self.session = (line["id"], set(), self.line_no, line["extracted_events"])

    def _event(self, line: Line) -> None:
        if self.session is None or self.session[0] != line["session_id"]:
            raise self.fail(f"the events of session {line['session_id']!r} must follow that "
                            "session's line")
        if line["event_id"] in self.session[1]:
            raise self.fail(f"event {line['event_id']!r} appears twice in session "
                            f"{line['session_id']!r}")
        self.session[1].add(line["event_id"])
        self.plan.session[line["session_id"]][1].bytes += len(line["content"].encode())

    def _close_session(self) -> None:
        if self.session is None:
            return
        session_id, events, line_no, extracted = self.session
        self.session = None
        if "event" in self.plan.counts and extracted > len(events):
            raise BadInput(f"line {line_no}: session {session_id!r} has extracted_events "
                           f"{extracted}, but the file holds {len(events)} of its events")
        adding = self.plan.session[session_id][1]
        adding.jobs = -(-len(events) // BATCH) + (len(events) > extracted)

    def finish(self) -> Plan:
        self.line_no += 1
        if not self.header:
            raise BadInput("the body is empty: send the lines of an export, header first")
        if self.versions is not None:
            raise self.fail(f"the file ends with item_version lines of {self.versions[0]!r} "
                            "and no item line")
        self._close_session()
        for kind, promised in self.plan.counts.items():
            if self.seen[kind] != promised:
                raise BadInput(f"the header counts {promised} {kind} lines, but the file holds "
                               f"{self.seen[kind]}: it is incomplete or was changed")
        return self.plan


# import: before writing, what exists already ---------------------------------------------------


@dataclass
class Skips:
    """Ids of the file the tenant holds already, left as they are (on_conflict=skip)."""

    item: set[str] = field(default_factory=set)
    memory: set[uuid.UUID] = field(default_factory=set)
    session: set[str] = field(default_factory=set)
    memory_type: set[str] = field(default_factory=set)


EXISTING = {"memory_type": "transfer.existing_types", "item": "transfer.existing_items",
            "memory": "transfer.existing_memories", "session": "transfer.existing_sessions"}


async def prepare(conn: asyncpg.Connection, *, tenant_id: int, plan: Plan,
                  on_conflict: OnConflict, settings: Settings) -> Skips:
    """In the import's transaction, before it writes: the ids the tenant holds already (a 409
    naming them, or skipped), memory types that exist nowhere (a 422), and the quotas."""
    existing: dict[str, list[str]] = {}
    for kind, query in EXISTING.items():
        ids = list(getattr(plan, kind))
        found = [r[0] for r in await conn.fetch(Q[query], tenant_id, ids)] if ids else []
        if found:
            existing[kind] = found
    if existing and on_conflict == "fail":
        named = "; ".join(
            f"{kind} {', '.join(repr(i) for i in ids[:SHOWN_IDS])}"
            + (f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")
            for kind, ids in existing.items())
        raise Conflict(f"the tenant already holds {named}; import with on_conflict=skip to "
                       "leave those as they are and write the rest")
    skips = Skips(item=set(existing.get("item", [])),
                  memory={uuid.UUID(i) for i in existing.get("memory", [])},
                  session=set(existing.get("session", [])),
                  memory_type=set(existing.get("memory_type", [])))
    missing = set(plan.types_used) - set(plan.memory_type)
    if missing:
        known = set(await memories.known_types(conn, tenant_id))
        unknown = sorted((plan.types_used[t], t) for t in missing - known)
        if unknown:
            raise BadInput(f"line {unknown[0][0]}: memory type {unknown[0][1]!r} is neither "
                           "built in, nor registered in this tenant, nor in the file")
    await _check_quotas(conn, tenant_id, plan, skips, settings)
    return skips


async def _check_quotas(conn: asyncpg.Connection, tenant_id: int, plan: Plan, skips: Skips,
                        settings: Settings) -> None:
    total = {"items": 0, "memories": 0, "bytes": 0, "jobs": 0}
    for kind, counted in (("item", "items"), ("memory", "memories"), ("session", None)):
        for key, (_, adding) in getattr(plan, kind).items():
            if key in getattr(skips, kind):
                continue
            if counted:
                total[counted] += 1
            total["bytes"] += adding.bytes
            total["jobs"] += adding.jobs
    total["jobs"] += -(-total["memories"] // BATCH)
    await quotas.check(conn, tenant_id, settings=settings, **total)


# import, second pass: write -----------------------------------------------------------------


@dataclass
class Imported:
    """Lines written and skipped per type, the jobs left queued or waiting per kind, the
    operations that follow the memories' and events' embedding and the sessions' extraction,
    and the transaction's start time (every job it made has it as `created_at`)."""

    imported: Counter[str]
    skipped: Counter[str]
    jobs: dict[str, int]
    operation_ids: list[uuid.UUID]
    created_at: datetime


@dataclass
class _Session:
    id: str
    line: Line
    extracted: int
    written: int = 0
    watermark: int = 0
    earlier: list[Neighbour] = field(default_factory=list)
    batch: list[tuple[Line, str, str]] = field(default_factory=list)


class Importer:
    """The second pass, in the caller's transaction: each line as the first pass saw it."""

    def __init__(self, conn: asyncpg.Connection, *, tenant_id: int, key_id: int | None,
                 settings: Settings, skips: Skips) -> None:
        self.conn, self.tenant_id, self.settings, self.skips = conn, tenant_id, settings, skips
        self.author = Author(key_id, None)
        self.imported: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.operations: list[uuid.UUID] = []
        self.line_no = 0
        self.versions: list[Line] = []  # the archived versions of the item being put
        self.restored: list[Line] = []  # items put, and their versions, to restore
        self.restored_versions: list[Line] = []
        self.memories: list[Line] = []
        self.history: list[Line] = []
        self.session: _Session | None = None
        self.event_seqs: list[int] = []

    async def add(self, line_no: int, line: Line) -> None:
        self.line_no = line_no
        kind = line["type"]
        if kind == "header":
            return
        if kind not in ("memory", "memory_history") and (self.memories or self.history):
            await self._flush_memories()
        if kind not in ("session", "event"):
            await self._close_session()
        await getattr(self, f"_{kind}")(line)

    def _skipped(self, kind: str, parent: str, key: Any) -> bool:
        if key in getattr(self.skips, parent):
            self.skipped[kind] += 1
            return True
        self.imported[kind] += 1
        return False

    async def _put(self, item_id: str, line: Line, version: int) -> None:
        result = await items.put_item(self.conn, tenant_id=self.tenant_id,
                                      item=new_item(item_id, line), settings=self.settings)
        if version == 1 and result.change != "created":
            raise Conflict(f"item {item_id!r} was written in this tenant while the import ran")
        if result.item["version"] != version:
            raise BadInput(f"line {self.line_no}: item {item_id!r} version {version} has the "
                           "same content, tags and title as the version before it")

    async def _item_version(self, line: Line) -> None:
        if not self._skipped("item_version", "item", line["item_id"]):
            await self._put(line["item_id"], line, line["version"])
            self.versions.append(line)

    async def _item(self, line: Line) -> None:
        if self._skipped("item", "item", line["id"]):
            return
        await self._put(line["id"], line, len(self.versions) + 1)
        self.restored.append(line)
        self.restored_versions += self.versions
        self.versions = []
        if len(self.restored) >= BATCH or len(self.restored_versions) >= BATCH:
            await self._restore()

    async def _restore(self) -> None:
        """Set what the put path set to now back to what the file says, a batch at a time."""
        if self.restored:
            await self.conn.execute(Q["transfer.restore_items"], self.tenant_id, *_columns(
                self.restored, "id", "created_at", "accessed_at", "access_count"))
        if self.restored_versions:
            await self.conn.execute(Q["transfer.restore_versions"], self.tenant_id, *_columns(
                self.restored_versions, "item_id", "version", "created_at", "archived_at",
                "kind", "summary", "tags"))
        self.restored, self.restored_versions = [], []

    async def _memory_type(self, line: Line) -> None:
        if self._skipped("memory_type", "memory_type", line["name"]):
            return
        if await self.conn.fetchval(Q["transfer.insert_type"], self.tenant_id, line["name"],
                                    line["description"], line["created_at"]) is None:
            raise Conflict(f"memory type {line['name']!r} was registered in this tenant while "
                           "the import ran")

    async def _memory(self, line: Line) -> None:
        if not self._skipped("memory", "memory", line["id"]):
            self.memories.append(line)
            if len(self.memories) >= BATCH:
                await self._flush_memories()

    async def _memory_history(self, line: Line) -> None:
        if not self._skipped("memory_history", "memory", line["memory_id"]):
            self.history.append(line)

    async def _flush_memories(self) -> None:
        rows = [{**m, "content_hash": items.content_hash(m["content"]),
                 "hints": json.dumps(m["hints"]), "source_events": json.dumps(m["source_events"])}
                for m in self.memories]
        columns = _columns(rows, "id", "user_id", "agent_id", "session_id",
                           "visibility", "memory_type", "content", "confidence", "source",
                           "metadata", "hints", "pinned", "observed_at", "valid_until",
                           "invalid_reason", "superseded_by", "source_events", "version",
                           "created_at", "updated_at", "access_count", "accessed_at",
                           "content_hash")
        history = [(self.tenant_id, h["memory_id"], h["version"], h["operation"], h["agent_id"],
                    h["old_content"], h["new_content"], h["changes"], h["reason"], h["at"])
                   for h in self.history]
        if rows:
            try:
                await self.conn.execute(Q["transfer.insert_memories"], self.tenant_id, *columns)
            except asyncpg.UniqueViolationError:
                raise Conflict("a memory of the file was written in this tenant while the "
                               "import ran") from None
            op, _ = await memories.embed_later(self.conn, self.tenant_id,
                                               [m["id"] for m in rows], self.author,
                                               self.settings)
            self.operations.append(op)
        # A memory's history may follow it into the next batch: its memory is written already.
        await self.conn.executemany(Q["transfer.insert_history"], history)
        self.memories, self.history = [], []

    async def _session(self, line: Line) -> None:
        await self._close_session()
        if self._skipped("session", "session", line["id"]):
            return
        if await self.conn.fetchval(
                Q["transfer.insert_session"], self.tenant_id, line["id"], line["user_id"],
                line["agent_id"], line["visibility"], line["created_at"],
                line["first_event_at"], line["last_event_at"], line["last_write_at"],
                line["ended_at"], line["summary"]) is None:
            raise Conflict(f"session {line['id']!r} was written in this tenant while the "
                           "import ran")
        self.session = _Session(line["id"], line, line["extracted_events"])

    async def _event(self, line: Line) -> None:
        if self._skipped("event", "session", line["session_id"]):
            return
        session = self.session
        assert session is not None  # the first pass saw the session right before
        search_text, embed_text = event_texts(line["sender_name"], line["role"],
                                              line["content"], line["created_at"],
                                              session.earlier)
        # The turns before an event, as a write in order would have read them: the latest.
        session.earlier = sorted([*session.earlier, Neighbour(
            line["sender_name"], line["role"], line["content"], line["created_at"])],
            key=lambda n: n.created_at)[-CONTEXT_TURNS:]
        session.batch.append((line, search_text, embed_text))
        if len(session.batch) >= BATCH:
            await self._flush_events(session)

    async def _flush_events(self, session: _Session) -> None:
        if not session.batch:
            return
        events = [{**e, "search_text": search, "embed_text": embed,
                   "content_hash": items.content_hash(embed)} for e, search, embed in session.batch]
        scope = session.line
        rows = await self.conn.fetch(
            Q["transfer.insert_events"], self.tenant_id, session.id, scope["user_id"],
            scope["agent_id"], scope["visibility"], *_columns(
                events, "event_id", "role", "sender_id", "sender_name", "event_type", "content",
                "media_item_id", "created_at", "received_at", "trace_id", "span_id",
                "parent_span_id", "metadata", "search_text", "embed_text", "content_hash"))
        seqs = {r["event_id"]: r["seq"] for r in rows}
        for event, _, _ in session.batch:
            session.written += 1
            if session.written == session.extracted:
                session.watermark = seqs[event["event_id"]]
            self.event_seqs.append(seqs[event["event_id"]])
        session.batch = []
        while len(self.event_seqs) >= BATCH:
            await self._embed_events(self.event_seqs[:BATCH])
            self.event_seqs = self.event_seqs[BATCH:]

    async def _embed_events(self, seqs: list[int]) -> None:
        self.operations.append(await self.conn.fetchval(
            Q["events.embed_job"], uuid.uuid4(), self.tenant_id,
            self.settings.max_attempts_for(jobs.EMBED_MEMORY), {"events": seqs}, None, {},
            self.author.key_id))

    async def _close_session(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        await self._flush_events(session)
        await self.conn.execute(Q["transfer.finish_session"], self.tenant_id, session.id,
                                session.written, session.watermark)
        if session.written > session.extracted:
            line = session.line
            scheduled = await extraction_schedule.schedule(
                self.conn, tenant_id=self.tenant_id, key_id=self.author.key_id,
                session_id=session.id, scope={k: line[k] for k in (
                    "user_id", "agent_id", "visibility") if line[k] is not None},
                now=line["ended_at"] is not None, settings=self.settings)
            self.operations.append(scheduled.operation_id)

    async def finish(self) -> Imported:
        await self._restore()
        if self.memories or self.history:
            await self._flush_memories()
        await self._close_session()
        if self.event_seqs:
            await self._embed_events(self.event_seqs)
            self.event_seqs = []
        counts = await self.conn.fetch(Q["transfer.imported_job_counts"], self.tenant_id)
        return Imported(self.imported, self.skipped, {r["kind"]: r["jobs"] for r in counts},
                        self.operations, await self.conn.fetchval(Q["transfer.started"]))


async def enqueue_imported(pool: asyncpg.Pool, queue: jobs.Enqueuer, *, tenant_id: int,
                           created_at: datetime, queue_name: str) -> int:
    """After the commit, put the import's due jobs on the queue a page at a time: a large
    import makes hundreds of thousands, whose refs are never all in memory at once. A failure
    loses nothing: the sweeper enqueues what is left (and what waits for a later time)."""
    sent = 0
    try:
        async with pool.acquire() as conn, conn.transaction():
            async for page in _pages(conn, Q["transfer.imported_jobs"], tenant_id, created_at,
                                     rows=BATCH):
                refs = jobs.refs_to_enqueue(dict(r) for r in page)
                done = await jobs.enqueue(pool, queue, refs, queue_name=queue_name)
                sent += done
                if done < len(refs):
                    break  # the queue is down: the sweeper takes over
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.warning("could not enqueue an import's jobs, the sweeper will: %s", exc)
    return sent
