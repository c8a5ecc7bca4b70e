"""`memmill memory …`, `memmill sessions …` and `memmill context`: the agent-memory API from
the shell. Each command prints readable lines by default and the server's response with
`--json`; when the server refuses, its message goes to stderr and the command exits 1."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # imported where it is used: `memmill doctor` runs without httpx
    from api.memory_schemas import (
        EventPublic,
        HistoryEntry,
        OperationAccepted,
        OperationPublic,
        RecallHit,
        SessionPublic,
    )
    from memmill.client import Memmill

console = Console()
err = Console(stderr=True)
T = TypeVar("T")
R = TypeVar("R", covariant=True)

memory_app = typer.Typer(no_args_is_help=True,
                         help="Add, search, read, invalidate and delete agent memories.")
sessions_app = typer.Typer(no_args_is_help=True, help="Sessions and their events.")

# The options of the top-level client commands: memmill/cli.py imports this module to register
# it, so this module cannot import them from there.
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="MEMMILL_URL", help="API URL (default: the local memmill)."),
]
KeyOpt = Annotated[
    str | None,
    typer.Option("--key", envvar="MEMMILL_API_KEY",
                 help="API key (default: the local instance's key)."),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="MEMMILL_DATA_DIR",
                 help="Talk to the `memmill up` of this data directory (--url and --key win)."),
]
UserOpt = Annotated[str | None, typer.Option("--user", help="The scope's user id.")]
AgentOpt = Annotated[str | None, typer.Option("--agent", help="The scope's agent id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw response.")]

FINISHED = ("done", "failed", "cancelled")
POLL_S = 10.0  # how long one GET /v1/operations/{id}?wait= may hold; below the client's 30 s
SESSIONS_PAGE = 500  # the most GET /v1/sessions gives at once
EVENTS_PAGE = 1000  # the most GET /v1/sessions/{id}/events gives at once


def _call(target: tuple[str | None, str | None, Path | None], fn: Callable[[Memmill], T]) -> T:
    """Run `fn` with a client of the instance the user means (memmill.cli.make_client); a
    refusal is the server's message on stderr and exit 1."""
    from memmill.cli import make_client
    from memmill.client import MemmillError

    with make_client(*target) as client:
        try:
            return fn(client)
        except MemmillError as exc:
            err.print(f"error: {exc.detail}", markup=False, style="red")
            raise typer.Exit(1) from None


def _usage(message: str) -> typer.Exit:
    """A command line that is refused before anything is sent: exit 2, as in memmill.cli."""
    err.print(f"error: {message}", markup=False, style="red")
    return typer.Exit(2)


def _scope(user: str | None, agent: str | None, session: str | None = None) -> dict[str, str]:
    scope = {"user_id": user, "agent_id": agent, "session_id": session}
    return {k: v for k, v in scope.items() if v is not None}


def _json(value: BaseModel | dict[str, Any]) -> None:
    """The server's answer as it sent it: a model as the API serializes it."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    console.print_json(json.dumps(value))


def _line(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _when(value: datetime | None, width: int = 19) -> str:
    """A server timestamp (UTC) as `2024-03-01 10:00:00`, or `-`."""
    return value.isoformat()[:width].replace("T", " ") if value else "-"


def _one_line(text: str | None, width: int | None = None) -> str:
    text = " ".join((text or "").split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _fields(rows: list[tuple[str, str | Text]]) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(name, value)
    return table


def _text(value: str | None) -> Text:
    """Server text in a rich table cell: shown as it is, never read as markup."""
    return Text(value or "-")


def _who(user_id: str | None = None, agent_id: str | None = None,
         session_id: str | None = None) -> str:
    parts = [f"{name} {value}" for name, value in
             (("user", user_id), ("agent", agent_id), ("session", session_id)) if value]
    return ", ".join(parts) or "-"


def _refs(refs: list[dict[str, str]] | None) -> str:
    return ", ".join(f"{r['session_id']}/{r['event_id']}" for r in refs or []) or "-"


# memory ------------------------------------------------------------------------------------


@memory_app.command("add")
def memory_add(
    content: Annotated[str, typer.Argument(help="The memory's text, or - for stdin.")],
    type_: Annotated[str, typer.Option("--type", help=(
        "fact, decision, preference, event, … or a type the tenant registered."))],
    user: UserOpt = None,
    agent: AgentOpt = None,
    visibility: Annotated[str | None, typer.Option(help=(
        "private, user or tenant (default: user with --user, else private)."))] = None,
    confidence: Annotated[float, typer.Option(help="0 to 1.")] = 0.8,
    pinned: Annotated[bool, typer.Option("--pinned", help="Always in the context.")] = False,
    observed_at: Annotated[str | None, typer.Option(
        "--observed-at", help="When it was true or said: ISO 8601 with a time zone.")] = None,
    session: Annotated[str | None, typer.Option(
        "--session", help="The session it was learnt in.")] = None,
    source: Annotated[str | None, typer.Option(help="Where it came from.")] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Store a memory; prints its id and version."""
    text = sys.stdin.read() if content == "-" else content
    # visibility goes as given: the server's 422 names the values it takes
    written = _call((url, key, data_dir), lambda c: c.memories.add(
        text, user_id=user, agent_id=agent, type=type_, visibility=visibility,
        confidence=confidence, pinned=pinned, observed_at=observed_at, session_id=session,
        source=source))
    if as_json:
        _json(written)
        return
    m = written.memory
    _line(f"{m.id}  v{m.version}  {m.type}  {m.visibility}")


def _hit_line(hit: RecallHit) -> str:
    """`score  kind  date  id  text`: a memory's id and (if it has one) the end of its
    validity; a turn's session/event id and its speaker."""
    text = _one_line(hit.content)
    if hit.kind == "memory":
        ref, when = hit.id, hit.observed_at or hit.created_at
        if hit.valid_until:
            ref += f" (valid until {_when(hit.valid_until, 16)})"
    else:
        ref, when = f"{hit.session_id}/{hit.event_id}", hit.created_at
        speaker = hit.sender_name or hit.role
        text = f"{speaker}: {text}" if speaker else text
    return f"{hit.score:.3f}  {hit.kind:<6}  {_when(when, 16):<16}  {ref}  {text}"


@memory_app.command("search")
def memory_search(
    query: str,
    user: UserOpt = None,
    agent: AgentOpt = None,
    limit: Annotated[int, typer.Option(help="At most this many results (1-100).")] = 10,
    events: Annotated[bool, typer.Option("--events", help="Search past turns too.")] = False,
    type_: Annotated[list[str], typer.Option("--type", help="Only this memory type; "
                                             "repeatable.")] = [],  # noqa: B006
    session: Annotated[str | None, typer.Option("--session", help="Only this session.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Invalidated memories too.")] = False,
    as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Search memories (and with --events past turns): one line per hit with its score, kind,
    date, id (session/event for a turn) and text."""
    found = _call((url, key, data_dir), lambda c: c.memories.search(
        query, user_id=user, agent_id=agent, limit=limit, include_events=events,
        valid_only=not all_, types=type_ or None, session_id=session or None))
    if as_json:
        _json(found)
        return
    for warning in found.warnings:
        err.print(f"warning: {warning}", markup=False, style="yellow")
    for hit in found.results:
        _line(_hit_line(hit))
    if not found.results:
        err.print("no results")


@memory_app.command("get")
def memory_get(
    memory_id: str, user: UserOpt = None, agent: AgentOpt = None, as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Show a memory the scope may read."""
    m = _call((url, key, data_dir), lambda c: c.memories.get(memory_id, user_id=user,
                                                               agent_id=agent))
    if as_json:
        _json(m)
        return
    valid = "yes" if not m.valid_until else (
        f"until {_when(m.valid_until)}: {m.invalid_reason or 'no reason given'}")
    console.print(_fields([
        ("id", str(m.id)), ("type", m.type), ("content", _text(m.content)),
        ("scope", _text(_who(m.user_id, m.agent_id, m.session_id))),
        ("visibility", m.visibility), ("version", str(m.version)),
        ("confidence", f"{m.confidence:g}"), ("pinned", "yes" if m.pinned else "no"),
        ("observed", _when(m.observed_at)), ("valid", _text(valid)),
        ("superseded by", str(m.superseded_by) if m.superseded_by else "-"),
        ("source", _text(m.source)), ("hints", _text(", ".join(m.hints))),
        ("source events", _text(_refs(m.source_events))),
        ("metadata", _text(json.dumps(m.metadata, ensure_ascii=False))),
        ("created", _when(m.created_at)), ("updated", _when(m.updated_at)),
        ("accessed", f"{m.access_count} times, last {_when(m.accessed_at)}"),
        ("embedded", "yes" if m.embedded else "not yet"),
    ]))


def _change(entry: HistoryEntry) -> str:
    if entry.old_content is not None and entry.new_content != entry.old_content:
        return f"{_one_line(entry.old_content, 40)} → {_one_line(entry.new_content, 40)}"
    if entry.operation == "add":
        return _one_line(entry.new_content, 80)
    return _one_line(json.dumps(entry.changes, ensure_ascii=False), 80) \
        if entry.changes else ""


@memory_app.command("history")
def memory_history(
    memory_id: str, user: UserOpt = None, agent: AgentOpt = None, as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Every change of a memory: version, operation, when, by which agent, why and what."""
    found = _call((url, key, data_dir), lambda c: c.memories.history(
        memory_id, user_id=user, agent_id=agent))
    if as_json:
        _json(found)
        return
    table = Table("version", "operation", "at", "agent", "reason", "change")
    for h in found.history:
        table.add_row(str(h.version), h.operation, _when(h.at), _text(h.agent_id),
                      _text(h.reason), _text(_change(h)))
    console.print(table)


@memory_app.command("invalidate")
def memory_invalidate(
    memory_id: str,
    reason: Annotated[str, typer.Option("--reason", help="Why it no longer holds.")],
    version: Annotated[int | None, typer.Option(
        "--version", help="Only if it is still this version.")] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Invalid from then (ISO 8601; default now).")] = None,
    user: UserOpt = None, agent: AgentOpt = None, as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Mark a memory no longer valid. It stays, with its history; searches leave it out
    unless asked with --all."""
    m = _call((url, key, data_dir), lambda c: c.memories.invalidate(
        memory_id, reason=reason, user_id=user, agent_id=agent, expected_version=version,
        valid_until=until))
    if as_json:
        _json(m)
        return
    _line(f"{m.id}  v{m.version}  invalid from {_when(m.valid_until)}: {m.invalid_reason}")


def _interactive() -> bool:
    """Whether a person can be asked (stdin is a terminal)."""
    return sys.stdin.isatty()


@memory_app.command("delete")
def memory_delete(
    memory_id: Annotated[str | None, typer.Argument(
        help="One memory's id; omit it to delete every memory of a scope.")] = None,
    user: UserOpt = None,
    agent: AgentOpt = None,
    session: Annotated[str | None, typer.Option(
        "--session", help="Delete by scope: the memories learnt in this session.")] = None,
    version: Annotated[int | None, typer.Option(
        "--version", help="Only if the memory is still this version.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete by scope without asking.")
                   ] = False,
    wait: Annotated[bool, typer.Option(help="Wait for a delete by scope to finish.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait at most.")] = 600,
    as_json: Annotated[bool, typer.Option("--json", help="Print the operation of a delete by "
                                          "scope as the server reports it.")] = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Delete one memory with its history, or (without ID) every memory of a scope: --user,
    --agent and --session narrow it, at least one is required; it runs as a job."""
    target = (url, key, data_dir)
    if memory_id is not None:
        if session is not None:
            raise _usage("--session selects a delete by scope: give an ID or --session, "
                         "not both")
        _call(target, lambda c: c.memories.delete(memory_id, user_id=user, agent_id=agent,
                                                  expected_version=version))
        _line(f"{memory_id}  deleted")
        return
    scope = _scope(user, agent, session)
    if version is not None:
        raise _usage("--version is for deleting one memory: give its ID")
    if not scope:
        raise _usage("name the memory to delete, or the scope with --user, --agent or "
                      "--session (an empty scope would be every memory of the tenant)")
    what = f"every memory of {_who(**scope)}"
    if not yes:
        if not _interactive():
            raise _usage(f"refusing to delete {what} without --yes (stdin is not a terminal, "
                         "so there is no one to ask)")
        if not typer.confirm(f"Delete {what}?", default=False, err=True):
            err.print("nothing deleted")
            raise typer.Exit(1)

    def start(client: Memmill) -> OperationAccepted:
        return client.memories.delete_scope(user_id=user, agent_id=agent, session_id=session)

    if not wait:
        accepted = _call(target, start)
        if as_json:
            _json(accepted)
        else:
            _line(str(accepted.operation_id))
        return
    op = _call(target, lambda c: _follow(c, start(c), what, timeout_s=timeout))
    if as_json:
        _json(op)
    _report_delete(op, what, timeout, counts=not as_json)


def _follow(client: Memmill, accepted: OperationAccepted, what: str, *,
            timeout_s: float) -> OperationPublic:
    """Follow a delete by scope's operation (a long poll at a time) until it finishes or
    `timeout_s` runs out, and return it as it then stands. The client's own `wait=` is not
    used: it raises on a timeout, and this shows the progress meanwhile."""
    op_id = str(accepted.operation_id)
    started = time.monotonic()
    with err.status(f"deleting {what}…") as status:
        while True:
            left = timeout_s - (time.monotonic() - started)
            op = client.operations.get(op_id, wait_s=min(POLL_S, left) if left > 0 else None)
            if op.status in FINISHED or left <= 0:
                return op
            status.update(f"deleting {what}… {op.status}, {time.monotonic() - started:.0f}s")


def _report_delete(op: OperationPublic, what: str, timeout_s: float, *, counts: bool) -> None:
    """The counts on stdout (unless `counts` is off: --json printed them); exit 1 unless
    the operation finished and nothing of the scope is left."""
    if op.status not in FINISHED:
        err.print(f"still {op.status} after {timeout_s:.0f}s: operation {op.id}",
                  markup=False, style="yellow")
        raise typer.Exit(1)
    if op.status != "done":
        err.print(f"error: deleting {what} {op.status}: {op.error or 'no reason given'}"
                  f" (operation {op.id})", markup=False, style="red")
        raise typer.Exit(1)
    r = op.result
    if counts:
        _line(f"deleted {r['deleted']} memories of {what.removeprefix('every memory of ')} "
              f"in {r['batches']} batch(es); {r['remaining']} remaining")
    if not r.get("verified"):
        err.print(f"warning: {r['remaining']} memories of the scope are still there (written "
                  f"or held by a job meanwhile): run the delete again; operation {op.id}",
                  markup=False, style="yellow")
        raise typer.Exit(1)


# sessions ----------------------------------------------------------------------------------


class Page(Protocol[R]):
    """A page of a cursor listing (SessionsPage, EventsPage)."""

    @property
    def data(self) -> list[R]: ...

    @property
    def next_cursor(self) -> str | None: ...


def _pages(fetch: Callable[[str | None, int], Page[R]], limit: int | None,
           page_max: int) -> tuple[list[R], str | None]:
    """Rows from page after page (following next_cursor) until `limit` (None: all); with the
    cursor of what is left, if anything is. The client's own page iterators are not used:
    they cannot stop at `limit` and say whether more is left."""
    rows: list[R] = []
    cursor: str | None = None
    while True:
        want = page_max if limit is None else min(page_max, limit - len(rows))
        page = fetch(cursor, want)
        rows += page.data
        cursor = page.next_cursor
        if cursor is None or (limit is not None and len(rows) >= limit):
            return rows, cursor


def _more(shown: int, cursor: str | None) -> None:
    if cursor is not None:
        err.print(f"{shown} shown; there are more (raise --limit)")


@sessions_app.command("list")
def sessions_list(
    user: UserOpt = None, agent: AgentOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 50,
    as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Sessions the scope may read, most recently written first."""
    rows: list[SessionPublic]
    rows, cursor = _call((url, key, data_dir), lambda c: _pages(
        lambda at, n: c.sessions.list(user_id=user, agent_id=agent, cursor=at, limit=n),
        limit, SESSIONS_PAGE))
    if as_json:
        _json({"data": [s.model_dump(mode="json") for s in rows], "next_cursor": cursor})
        return
    table = Table("id", "user", "agent", "visibility", "events", "first event", "last event",
                  "ended", "summary")
    for s in rows:
        table.add_row(_text(s.id), _text(s.user_id), _text(s.agent_id), s.visibility,
                      str(s.events), _when(s.first_event_at), _when(s.last_event_at),
                      _when(s.ended_at), _text(_one_line(s.summary, 60)))
    console.print(table)
    _more(len(rows), cursor)


@sessions_app.command("show")
def sessions_show(
    session_id: str, user: UserOpt = None, agent: AgentOpt = None, as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """A session: its scope, counts, times, summary and whether every event is embedded."""
    s = _call((url, key, data_dir), lambda c: c.sessions.get(session_id, user_id=user,
                                                               agent_id=agent))
    if as_json:
        _json(s)
        return
    console.print(_fields([
        ("id", _text(s.id)), ("scope", _text(_who(s.user_id, s.agent_id))),
        ("visibility", s.visibility), ("events", str(s.events)),
        ("first event", _when(s.first_event_at)), ("last event", _when(s.last_event_at)),
        ("last write", _when(s.last_write_at)), ("ended", _when(s.ended_at)),
        ("embedded", {True: "yes", False: "not yet", None: "-"}[s.embedded]),
        ("summary", _text(s.summary)),
    ]))


@sessions_app.command("events")
def sessions_events(
    session_id: str, user: UserOpt = None, agent: AgentOpt = None,
    since: Annotated[str | None, typer.Option(help="From this time (ISO 8601).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many (default: all)."
                                              )] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """A session's events in order, one per line: event id, time, speaker and text."""
    rows: list[EventPublic]
    rows, cursor = _call((url, key, data_dir), lambda c: _pages(
        lambda at, n: c.sessions.events(session_id, user_id=user, agent_id=agent, since=since,
                                        cursor=at, limit=n),
        limit, EVENTS_PAGE))
    if as_json:
        _json({"data": [e.model_dump(mode="json") for e in rows], "next_cursor": cursor})
        return
    for e in rows:
        speaker = e.role + (f" {e.sender_name}" if e.sender_name else "")
        text = e.content.replace("\n", "\n    ")
        _line(f"[{e.event_id}] {_when(e.created_at)}  {speaker}: {text}")
    _more(len(rows), cursor)


# context -----------------------------------------------------------------------------------


def context(
    user: UserOpt = None, agent: AgentOpt = None,
    session: Annotated[str | None, typer.Option("--session", help="The current session.")
                       ] = None,
    query: Annotated[str | None, typer.Option(help=(
        "What to recall for (default: the session's latest user turns)."))] = None,
    max_tokens: Annotated[int, typer.Option(help="The budget (16-100000).")] = 1000,
    as_json: JsonOpt = False,
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """The text an agent should see now, within a token budget: on stdout, so that it can be
    piped to a model; its sections with their token counts on stderr."""
    packed = _call((url, key, data_dir), lambda c: c.context(
        user_id=user, agent_id=agent, session_id=session, query=query, max_tokens=max_tokens))
    if as_json:
        _json(packed)
        return
    text = packed.context
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    else:
        err.print("the context is empty: nothing of this scope matches")
    for section in packed.sections:
        err.print(f"  {section.name:<20} {section.tokens:>6} tokens", markup=False,
                  highlight=False)
    err.print(f"{packed.tokens} of {max_tokens} tokens ({packed.tokenizer}), "
              f"{len(packed.included)} entries"
              + (", truncated: something was left out" if packed.truncated else ""),
              markup=False, highlight=False)
