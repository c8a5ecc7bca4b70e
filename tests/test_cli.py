"""The CLI's client commands against the real API: how they find the URL and key of an
instance (--url/--key, the environment, a data directory's runtime.json and api_key), and
`memmill ingest` sending only what changed, with a summary that counts each file once."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from typer.testing import CliRunner, Result

from api.schemas import BatchResult
from memmill import Memmill
from memmill.cli import app
from memmill.client.calls import Sync
from memmill.client.resources import Items
from memmill.client.transport import SyncRunner
from memmill.ingest import Ingest, Tally, walk
from pipeline.settings import Settings
from tests.conftest import drain, free_port
from tests.test_formats import ARTICLE_HTML, make_pdf

runner = CliRunner()
UNSET = {"MEMMILL_URL": None, "MEMMILL_API_KEY": None, "MEMMILL_DATA_DIR": None,
         "COLUMNS": "200"}


async def memmill(*args: str, **env: str) -> Result:
    """The CLI in this process, in a thread: the API answers from this test's event loop.
    Only the MEMMILL_ variables given are set."""
    return await asyncio.to_thread(runner.invoke, app, list(args), env={**UNSET, **env})


def instance_dir(root: Path, api_url: str, key: str | None, *, pid: int | None = None) -> Path:
    """A data directory as `memmill up` leaves it while it runs: runtime.json and api_key."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "runtime.json").write_text(json.dumps({
        "pid": pid or os.getpid(), "api_url": api_url,
        "database_url": "postgresql://unused", "redis_url": "redis://unused"}))
    if key is not None:
        (root / "api_key").write_text(key + "\n")
    return root


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


async def test_client_commands_find_the_instance_of_a_data_directory(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str], tmp_path: Path
) -> None:
    data = str(instance_dir(tmp_path / "instance", api_url, tenant[1]))
    result = await memmill("put", "Kelp forests shelter sea otters.", "--id", "kelp",
                           "--data-dir", data)
    assert result.exit_code == 0, result.output
    assert await pool.fetchval("SELECT count(*) FROM items WHERE id = 'kelp'") == 1
    result = await memmill("get", "kelp", MEMMILL_DATA_DIR=data)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["id"] == "kelp"
    for command in (("versions", "kelp", "--data-dir", data),
                    ("search", "kelp", "--mode", "fts", "--data-dir", data),
                    ("jobs", "--data-dir", data, "list", "--item", "kelp"),
                    ("dead-letters", "--data-dir", data, "list")):
        result = await memmill(*command)
        assert result.exit_code == 0, (command, result.output)
    assert "kelp" in (await memmill("jobs", "list", "--item", "kelp",
                                    MEMMILL_DATA_DIR=data)).output


async def test_url_and_key_win_over_the_environment_and_the_data_directory(
    api_url: str, tenant: tuple[int, str], tmp_path: Path
) -> None:
    data = str(instance_dir(tmp_path / "instance", api_url, tenant[1]))
    nowhere = f"http://127.0.0.1:{free_port()}"
    cases = [  # (arguments, environment, what the command then talks to)
        (("--url", nowhere), {}, "cannot reach"),
        ((), {"MEMMILL_URL": nowhere}, "cannot reach"),
        (("--url", nowhere), {"MEMMILL_URL": api_url}, "cannot reach"),
        (("--key", "mm_wrong"), {}, "key"),
        ((), {"MEMMILL_API_KEY": "mm_wrong"}, "key"),
        (("--url", api_url), {}, None),  # the key still comes from the data directory
        ((), {"MEMMILL_URL": api_url, "MEMMILL_API_KEY": tenant[1]}, None),
    ]
    for args, env, error in cases:
        result = await memmill("jobs", "--data-dir", data, "list", *args, **env)
        if error is None:
            assert result.exit_code == 0, (args, env, result.output)
        else:
            assert result.exit_code == 1 and error in result.output.lower(), (
                args, env, result.output)


async def test_a_data_directory_with_nothing_running_is_a_clear_error(
    api_url: str, tenant: tuple[int, str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    stale = instance_dir(tmp_path / "stale", api_url, tenant[1], pid=dead_pid())
    for data in (empty, stale, tmp_path / "missing"):
        for command in (("get", "x", "--data-dir", str(data)),
                        ("dead-letters", "--data-dir", str(data), "list")):
            result = await memmill(*command)
            assert result.exit_code == 2, (command, result.output)
            assert "nothing is running from the data directory" in result.output
            assert f"memmill up --data-dir {data}" in result.output.replace("\n", "")
        result = await memmill("get", "x", MEMMILL_DATA_DIR=str(data))
        assert result.exit_code == 2 and "nothing is running" in result.output
        # --url names the instance; the key it needs is not there either.
        result = await memmill("get", "x", "--data-dir", str(data), "--url", api_url)
        if data == stale:
            assert result.exit_code == 1 and "no item" in result.output, result.output
        else:
            assert result.exit_code == 2 and "no API key" in result.output, result.output
    keyless = instance_dir(tmp_path / "keyless", api_url, None)
    result = await memmill("get", "x", "--data-dir", str(keyless))
    assert result.exit_code == 2 and "no API key" in result.output, result.output


async def test_put_stores_a_text_too_long_to_be_a_file_name(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    text = "Glaciers carve valleys. " * 200
    result = await memmill("put", text, "--id", "long", "--url", api_url, "--key", tenant[1])
    assert result.exit_code == 0, (result.output, result.exception)
    stored = await pool.fetchval("SELECT content FROM sources WHERE item_id = 'long'")
    assert stored == text


def summary(output: str) -> dict[str, str]:
    """The summary table `memmill ingest` ends with, as {column: value}."""
    lines = output[output.index("memmill ingest"):].splitlines()
    header = next(n for n, line in enumerate(lines) if "found" in line)
    names = [c.strip() for c in re.split(r"[┃│]", lines[header]) if c.strip()]
    values = [c.strip() for c in re.split(r"[┃│]", lines[header + 2]) if c.strip()]
    return dict(zip(names, values, strict=True))


async def test_ingest_twice_sends_nothing_and_counts_each_file_once(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    tmp_path: Path,
) -> None:
    """The server extracts titles from the HTML and the PDF; the second run must not take
    them for a change. A dump line that repeats a file is sent, found unchanged by the
    server, and counted as unchanged only."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "otters.html").write_bytes(ARTICLE_HTML)
    (folder / "rocks.pdf").write_bytes(make_pdf(
        [["Basalt is a fine-grained volcanic rock"]], info={"Title": "Rocks", "Author": "Ada"}))
    (folder / "note.txt").write_text("Tides follow the moon.")
    (folder / "empty.txt").write_text("")
    dump = tmp_path / "dump.jsonl"
    dump.write_text(json.dumps({"id": "note.txt", "text": "Tides follow the moon."}) + "\n")
    data = str(instance_dir(tmp_path / "instance", api_url, tenant[1]))

    first = await memmill("ingest", str(folder), str(dump), "--data-dir", data)
    assert first.exit_code == 1, first.output  # empty.txt
    assert summary(first.output) == {"found": "5", "skipped": "0", "unchanged": "1",
                                     "submitted": "3", "processed": "-", "pending": "-",
                                     "failed": "1"}
    await drain(settings, pool)
    titles = dict(await pool.fetch("SELECT id, title FROM items"))
    assert titles == {"otters.html": "Otters of the River", "rocks.pdf": "Rocks",
                      "note.txt": None}
    jobs_before = await pool.fetchval("SELECT count(*) FROM jobs")

    second = await memmill("ingest", str(folder), str(dump), "--data-dir", data)
    assert summary(second.output) == {"found": "5", "skipped": "0", "unchanged": "4",
                                      "submitted": "0", "processed": "-", "pending": "-",
                                      "failed": "1"}
    with Recording(api_url, tenant[1]) as client:
        tally = Tally()
        works = list(walk([folder], "", settings.max_upload_bytes, tally))
        await asyncio.to_thread(Ingest(client, {}, Console(quiet=True), tally).run, works,
                                wait=False, timeout_s=10)
    assert client.sent == [] and (tally.unchanged, tally.submitted) == (3, 0)

    (folder / "note.txt").write_text("Tides follow the moon and the sun.")
    worker = asyncio.create_task(_keep_draining(settings, pool))
    try:
        third = await memmill("ingest", str(folder), "--data-dir", data, "--wait",
                              "--timeout", "120")
    finally:
        worker.cancel()
    assert summary(third.output) == {"found": "4", "skipped": "0", "unchanged": "2",
                                     "submitted": "1", "processed": "1", "pending": "0",
                                     "failed": "1"}
    new_jobs = await pool.fetch("SELECT item_id, count(*) FROM jobs GROUP BY item_id")
    assert sum(n for _, n in new_jobs) == jobs_before + 4  # a file: regularize and 3 more
    assert dict(new_jobs)["note.txt"] == 8


async def _keep_draining(settings: Settings, pool: asyncpg.Pool) -> None:
    while True:
        await drain(settings, pool)
        await asyncio.sleep(0.2)


class RecordingItems(Items[Sync]):
    """The real item operations, remembering the ids sent for writing in `sent`."""

    def __init__(self, runner: SyncRunner, sent: list[str]) -> None:
        super().__init__(runner)
        self.sent = sent

    def upload(self, files: Sequence[tuple[str, bytes]], **options: Any) -> BatchResult:
        self.sent += [name for name, _ in files]
        return super().upload(files, **options)

    def batch(self, entries: Sequence[Mapping[str, Any]], **options: Any) -> BatchResult:
        self.sent += [entry["id"] for entry in entries]
        return super().batch(entries, **options)


class Recording(Memmill):
    """A real client that remembers the ids it sent for writing."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(url, key)
        self.sent: list[str] = []
        self.items = RecordingItems(self._runner, self.sent)
