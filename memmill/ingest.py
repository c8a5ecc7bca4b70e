"""`memmill ingest`: folders, files, URL lists and JSONL dumps, through the HTTP API.

It is a client like any other, so it works the same against a local `memmill up` and a hosted
server. What it adds is what a person ingesting 100k documents needs: only what changed is
sent again (the server's content hashes decide), a live progress bar, `--wait` to follow the
jobs to the end, and a summary that names every failure with its reason and sets the exit code.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

if TYPE_CHECKING:
    from api.schemas import BatchResult, ItemState
    from memmill.client import Memmill

# Never sent: credentials, keys and build junk. Hidden files and folders are skipped as well.
SKIPPED_NAMES = (
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "id_rsa*", "id_dsa*", "id_ecdsa*",
    "id_ed25519*", "*.kdbx", "credentials", "credentials.*", "secrets.*", "*.env", "env.local",
    "*.pyc", "*.pyo", "*.o", "*.so", "*.dylib", "*.dll", "*.exe", "*.class", "*.jar", "*.whl",
    "*.egg", "*.db", "*.sqlite", "*.sqlite3", "*.lock", "*.log", "*.tmp", "*.swp", "*.bak",
    "*.iso", "*.dmg", "*.bin", "*.dat", "Thumbs.db", "desktop.ini",
)
SKIPPED_DIRS = {"node_modules", "__pycache__", "venv", "site-packages", "dist", "build"}
UPLOAD_BATCH_BYTES = 8_000_000
UPLOAD_BATCH_FILES = 100
ENTRY_BATCH = 500
LOOKUP_BATCH = 1000


def content_hash_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def content_hash_uri(uri: str) -> str:
    """Mirrors the server: a URL item's content is its address until a job fetches it."""
    return content_hash_text(f"uri\n{uri}")


def skip_reason(path: Path) -> str | None:
    name = path.name
    if name.startswith("."):
        return "hidden"
    if any(fnmatch(name.lower(), pattern.lower()) for pattern in SKIPPED_NAMES):
        return "credentials or build files are never sent"
    return None


@dataclass
class Work:
    """One item to send: a file (bytes read when it is sent) or a JSON entry (text or URL)."""

    id: str
    path: Path | None = None
    entry: dict[str, Any] | None = None
    digest: str = ""
    size: int = 0


@dataclass
class Tally:
    found: int = 0
    skipped: int = 0
    unchanged: int = 0
    submitted: int = 0
    ready: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)

    @property
    def failed(self) -> int:
        return len(self.failures)


def walk(paths: Iterable[Path], prefix: str, max_bytes: int, tally: Tally) -> Iterator[Work]:
    """Files under each path; a folder's files get ids relative to it, so that a second run
    of the same command addresses the same items. A `.jsonl` path is a dump of entries."""
    for root in paths:
        if root.is_file() and root.suffix == ".jsonl":
            yield from read_jsonl(root, prefix, tally)
            continue
        if root.is_file():
            candidates: Iterable[tuple[Path, str]] = [(root, root.name)]
        elif root.is_dir():
            candidates = _files_under(root, tally)
        else:
            tally.failures[str(root)] = "no such file or folder"
            continue
        for path, relative in candidates:
            reason = skip_reason(path)
            if reason:
                tally.skipped += 1
                continue
            tally.found += 1
            size = path.stat().st_size
            item_id = f"{prefix}{relative}"
            if size == 0:
                tally.failures[item_id] = "the file is empty"
            elif size > max_bytes:
                tally.failures[item_id] = f"the file is {size} bytes, over the {max_bytes} limit"
            else:
                yield Work(id=item_id, path=path, size=size)


def _files_under(root: Path, tally: Tally) -> Iterator[tuple[Path, str]]:
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in relative.parts[:-1]):
            continue
        if path.is_file() and not path.is_symlink():
            yield path, relative.as_posix()


def read_jsonl(path: Path, prefix: str, tally: Tally) -> Iterator[Work]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                tally.failures[where] = f"not valid JSON: {exc}"
                continue
            tally.found += 1
            if not isinstance(raw, dict) or not isinstance(raw.get("id"), str | int):
                tally.failures[where] = 'each line needs an "id" and a "text" or a "uri"'
                continue
            entry: dict[str, Any] = {"id": f"{prefix}{raw['id']}"}
            text, uri = raw.get("text"), raw.get("uri")
            if isinstance(text, str) and text:
                entry["content"] = text
                digest = content_hash_text(text)
            elif isinstance(uri, str) and uri:
                entry["uri"] = uri
                digest = content_hash_uri(uri)
            else:
                tally.failures[entry["id"]] = 'the line has neither "text" nor "uri"'
                continue
            if isinstance(raw.get("title"), str):
                entry["title"] = raw["title"]
            if isinstance(raw.get("tags"), dict):
                entry["tags"] = {str(k): str(v) for k, v in raw["tags"].items()}
            yield Work(id=entry["id"], entry=entry, digest=digest)


def read_urls(path: Path, prefix: str, tally: Tally) -> Iterator[Work]:
    for line in path.read_text(encoding="utf-8").splitlines():
        url = line.strip()
        if not url or url.startswith("#"):
            continue
        tally.found += 1
        yield Work(id=f"{prefix}{url}", entry={"id": f"{prefix}{url}", "uri": url},
                   digest=content_hash_uri(url))


def _chunks(works: list[Work], size: int) -> Iterator[list[Work]]:
    for start in range(0, len(works), size):
        yield works[start : start + size]


class Ingest:
    """Send works in batches, skipping what the server already holds with the same content and
    tags, then optionally follow the submitted items until none is pending."""

    def __init__(
        self, client: Memmill, tags: dict[str, str], console: Console, tally: Tally
    ) -> None:
        self.client = client
        self.tags = tags
        self.console = console
        self.tally = tally

    def run(self, works: Iterable[Work], *, wait: bool, timeout_s: float) -> Tally:
        columns = (
            TextColumn("[bold]{task.description}"), BarColumn(),
            TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(), TextColumn("{task.fields[counts]}"),
        )
        with Progress(*columns, console=self.console, transient=False) as progress:
            todo = list(works)
            task = progress.add_task("submitting", total=len(todo), rate="", counts="")
            started = time.monotonic()
            for chunk in _chunks(todo, LOOKUP_BATCH):
                self._submit(self._changed(chunk), progress, task, started)
            if wait and self.tally.pending:
                self._follow(progress, timeout_s)
        return self.tally

    def _status(self, done: int, started: float) -> dict[str, str]:
        t = self.tally
        elapsed = max(time.monotonic() - started, 1e-6)
        return {
            "rate": f"{done / elapsed:.1f} docs/s",
            "counts": f"found {t.found} · submitted {t.submitted} · unchanged {t.unchanged}"
                      f" · processed {t.ready} · failed {t.failed}",
        }

    def _changed(self, chunk: list[Work]) -> list[Work]:
        """Hash the files and drop every work whose content and tags the server already has."""
        for work in chunk:
            if work.path is not None:
                work.digest = hashlib.sha256(work.path.read_bytes()).hexdigest()
        states = {s.id: s for s in self.client.items.lookup([w.id for w in chunk]).items}
        changed = []
        for work in chunk:
            state = states.get(work.id)
            if state and self._same(work, state):
                self.tally.unchanged += 1
                if state.status == "failed":
                    self.tally.failures[work.id] = state.error or "failed"
            else:
                changed.append(work)
        return changed

    def _same(self, work: Work, state: ItemState) -> bool:
        """Whether sending `work` would change nothing, judged as the server judges a put:
        the same content hash and caller tags (system tags come from extraction), and the
        same title only where the work gives one. A file gives none, and the title the
        server extracted from its HTML or PDF is no reason to send it again."""
        entry = work.entry or {}
        tags = {**self.tags, **entry.get("tags", {})}
        caller = {k: v for k, v in state.tags.items() if not k.startswith("_")}
        title = entry.get("title")
        return (state.content_hash == work.digest and caller == tags
                and (title is None or state.title == title))

    def _submit(self, works: list[Work], progress: Progress, task: TaskID, started: float) -> None:
        files = [w for w in works if w.path is not None]
        entries = [w for w in works if w.entry is not None]
        for batch in _file_batches(files):
            payload = [(w.id, w.path.read_bytes()) for w in batch if w.path is not None]
            self._record(self.client.items.upload(payload, tags=self.tags or None), batch)
            progress.update(task, advance=len(batch), **self._status(self.tally.submitted,
                                                                    started))
        for batch in _chunks(entries, ENTRY_BATCH):
            bodies = [{**w.entry, "tags": {**self.tags, **w.entry.get("tags", {})}}
                      for w in batch if w.entry is not None]
            self._record(self.client.items.batch(bodies), batch)
            progress.update(task, advance=len(batch), **self._status(self.tally.submitted,
                                                                    started))

    def _record(self, answer: BatchResult, batch: list[Work]) -> None:
        """Count each answer once: an item the server found unchanged (sent earlier in this
        run, say by a dump line repeating a file, or by another client since the lookup) is
        unchanged, not submitted as well."""
        for accepted in answer.accepted:
            if accepted.change == "unchanged":
                self.tally.unchanged += 1
                continue
            self.tally.submitted += 1
            if accepted.jobs:
                self.tally.pending.add(accepted.id)
            else:
                self.tally.ready += 1
        for refused in answer.refused:
            item_id = refused.id or batch[refused.index].id
            self.tally.failures[item_id] = refused.error

    def _follow(self, progress: Progress, timeout_s: float) -> None:
        total = len(self.tally.pending)
        task = progress.add_task("processing", total=total, rate="", counts="")
        started = time.monotonic()
        while self.tally.pending and time.monotonic() - started < timeout_s:
            for chunk in _id_chunks(sorted(self.tally.pending), LOOKUP_BATCH):
                answer = self.client.items.lookup(chunk)
                for state in answer.items:
                    if state.status == "ready":
                        self.tally.ready += 1
                    elif state.status == "failed":
                        self.tally.failures[state.id] = state.error or "failed"
                    else:
                        continue
                    self.tally.pending.discard(state.id)
                for gone in answer.missing:
                    self.tally.failures[gone] = "the item was deleted while it was processed"
                    self.tally.pending.discard(gone)
            done = total - len(self.tally.pending)
            progress.update(task, completed=done, **self._status(done, started))
            if self.tally.pending:
                time.sleep(0.5)


def _file_batches(files: list[Work]) -> Iterator[list[Work]]:
    batch: list[Work] = []
    size = 0
    for work in files:
        if batch and (size + work.size > UPLOAD_BATCH_BYTES or len(batch) >= UPLOAD_BATCH_FILES):
            yield batch
            batch, size = [], 0
        batch.append(work)
        size += work.size
    if batch:
        yield batch


def _id_chunks(ids: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def summary_table(tally: Tally, *, waited: bool) -> Table:
    table = Table("found", "skipped", "unchanged", "submitted", "processed", "pending", "failed",
                  title="memmill ingest")
    table.add_row(
        str(tally.found), str(tally.skipped), str(tally.unchanged), str(tally.submitted),
        str(tally.ready) if waited else "-", str(len(tally.pending)) if waited else "-",
        str(tally.failed),
    )
    return table


def failures_table(tally: Tally, limit: int = 50) -> Table:
    table = Table("item", "reason", title=f"{tally.failed} failed")
    for item_id, reason in sorted(tally.failures.items())[:limit]:
        table.add_row(item_id, reason)
    if tally.failed > limit:
        table.add_row("…", f"and {tally.failed - limit} more")
    return table


__all__ = ["Ingest", "Tally", "Work", "read_urls", "walk"]
