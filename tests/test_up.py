"""`memmill up` as a user runs it: a real process tree, embedded servers, the CLI as a client.

Start, put an HTML page, a PDF and a note and search each back, stop with SIGTERM (nothing left
running), start again on the same data directory (same key, data still there), run against
external servers, and stop loudly, once, when a worker cannot even import."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
import psutil
import pytest

from memmill.embedded import default_buffers_mb
from tests.conftest import free_port
from tests.test_formats import make_pdf

KEY = "mm_test_bootstrap_key_0123456789"


class Up:
    def __init__(self, data_dir: Path, port: int, env: dict[str, str]) -> None:
        self.port = port
        self.env = env
        self.process = subprocess.Popen(
            [sys.executable, "-m", "memmill", "up", "--port", str(port), "--workers", "1",
             "--data-dir", str(data_dir)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                pytest.fail("memmill up exited:\n" + "".join(self.lines))
            self.lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                return
        pytest.fail("memmill up did not start:\n" + "".join(self.lines))

    def printed(self, label: str) -> str:
        line = next(ln for ln in self.lines if ln.strip().startswith(label))
        return line.split(":", 1)[1].strip()

    def stop(self) -> list[psutil.Process]:
        children = psutil.Process(self.process.pid).children(recursive=True)
        self.process.send_signal(signal.SIGTERM)
        self.process.communicate(timeout=60)
        assert self.process.returncode == 0
        psutil.wait_procs(children, timeout=10)
        return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


HTML = (b"<html><head><title>Tides</title></head><body><nav>Home | About</nav><article>"
        b"<h1>Tides</h1><p>Tides are the rise and fall of sea levels caused by the combined "
        b"gravitational forces of the Moon and the Sun on the rotating Earth.</p></article>"
        b"</body></html>")
PDF = make_pdf([["Basalt is a fine-grained volcanic rock", "formed from rapidly cooled lava."]])


def documents_round_trip(api_url: str, key: str) -> None:
    """An HTML page and a PDF (uploaded) and a text note (JSON) all reach `ready` through the
    real workers, and a search finds each by what only it says."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=30) as http:
        files = [("file", ("docs/tides.html", HTML, "text/html")),
                 ("file", ("docs/basalt.pdf", PDF, "application/pdf"))]
        answer = http.post("/v1/items/upload", files=files)
        assert answer.status_code == 202, answer.text
        assert not answer.json()["refused"], answer.text
        note = {"id": "notes/ferns", "content": "Ferns reproduce by spores, not seeds."}
        assert http.post("/v1/items", json=note).status_code == 202
        ids = ["docs/tides.html", "docs/basalt.pdf", "notes/ferns"]
        deadline = time.monotonic() + 120
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            looked = http.post("/v1/items/lookup", json={"ids": ids}).json()
            states = {entry["id"]: entry["status"] for entry in looked["items"]}
            if all(states.get(i) in ("ready", "failed") for i in ids):
                break
            time.sleep(0.3)
        assert states == dict.fromkeys(ids, "ready"), states
        for query, wanted in [("gravitational pull of the Moon on the sea", "docs/tides.html"),
                              ("volcanic rock from cooled lava", "docs/basalt.pdf"),
                              ("how ferns reproduce", "notes/ferns")]:
            found = http.post("/v1/search", json={"query": query, "group_by": "item"}).json()
            assert found["results"][0]["item"]["id"] == wanted, (query, found["results"][:2])


def worker_restarts_after_a_crash(up: Up, database_url: str) -> None:
    """A worker killed after start-up is restarted (one line says so), and the new one beats
    and counts in /readyz."""
    workers = [p for p in psutil.Process(up.process.pid).children()
               if p.cmdline()[-1:] == ["worker"]]
    assert len(workers) == 1
    workers[0].kill()
    assert up.process.stdout is not None
    line = up.process.stdout.readline()
    while line and "restarting in" not in line:
        line = up.process.stdout.readline()
    assert line.startswith("worker-1 exited with status -9"), line
    url = f"http://127.0.0.1:{up.port}/readyz"
    deadline = time.monotonic() + 120
    replaced = False
    while time.monotonic() < deadline and not replaced:
        alive = [p for p in psutil.Process(up.process.pid).children()
                 if p.cmdline()[-1:] == ["worker"]]
        replaced = bool(alive) and alive[0].pid != workers[0].pid and beats(database_url,
                                                                             alive[0].pid)
        time.sleep(0.3)
    assert httpx.get(url).json()["ready"] is True
    assert replaced, "no new worker after the crash"


def beats(database_url: str, pid: int) -> bool:
    """Whether the worker process `pid` has written its heartbeat."""
    async def read() -> bool:
        conn = await asyncpg.connect(database_url)
        try:
            return bool(await conn.fetchval(
                "SELECT count(*) FROM workers WHERE pid = $1 AND stopped_at IS NULL", pid))
        finally:
            await conn.close()

    return asyncio.run(read())


def buffers_mb(database_url: str) -> int:
    async def read() -> int:
        conn = await asyncpg.connect(database_url)
        try:
            return await conn.fetchval("SELECT setting::bigint * 8 / 1024 FROM pg_settings"
                                       " WHERE name = 'shared_buffers'")
        finally:
            await conn.close()

    return asyncio.run(read())


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "memmill", *args], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
    env.update(HF_HUB_OFFLINE="1", MEMMILL_LOG_LEVEL="WARNING", COLUMNS="200")
    return env


def test_up_embedded_round_trip_stop_and_restart(tmp_path: Path, base_env: dict[str, str]) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    env = {**base_env, "MEMMILL_BOOTSTRAP_API_KEY": KEY, "MEMMILL_DATA_DIR": str(data_dir)}
    up = Up(data_dir, port, env)
    try:
        up.wait_ready()
        assert up.printed("API:") == f"http://127.0.0.1:{port}"
        assert up.printed("API key:") == KEY
        runtime = json.loads((data_dir / "runtime.json").read_text())
        assert runtime["database_url"].startswith("postgresql://")
        assert runtime["redis_url"].startswith("redis://")
        assert buffers_mb(runtime["database_url"]) == default_buffers_mb()
        # The client commands find the local instance and its key by themselves.
        out = cli(env, "put", "Lichens are a symbiosis of a fungus and an alga.", "--id",
                  "bio/lichen", "--tag", "topic=biology", "--wait")
        assert "bio/lichen  v1  ready  (created)" in out
        item = json.loads(cli(env, "get", "bio/lichen"))
        assert item["status"] == "ready" and item["tags"] == {"topic": "biology"}
        out = cli(env, "search", "fungus and alga partnership", "--json")
        assert json.loads(out)["results"][0]["item"]["id"] == "bio/lichen"
        documents_round_trip(up.printed("API:"), KEY)
        # The dashboard it prints takes the printed key, as an operator's.
        dashboard = up.printed("dashboard:").split()[0]
        with httpx.Client() as browser:
            signed_in = browser.post(f"{dashboard}/login", data={"key": KEY})
            assert signed_in.status_code == 303
            overview = browser.get(dashboard)
            assert overview.status_code == 200 and "operator" in overview.text
            assert 'data-testid="count-done">0<' not in overview.text  # the items ran
    finally:
        leftovers = up.stop()
    assert leftovers == [], f"still running after stop: {leftovers}"
    assert not (data_dir / "runtime.json").exists()

    # Second start: same data directory, no bootstrap variable; the same key still works, and
    # a changed buffer size restarts the embedded Postgres with it.
    env.pop("MEMMILL_BOOTSTRAP_API_KEY")
    env["MEMMILL_EMBEDDED_PG_BUFFERS_MB"] = "160"
    up = Up(data_dir, port, env)
    try:
        up.wait_ready()
        assert up.printed("API key:") == KEY
        runtime = json.loads((data_dir / "runtime.json").read_text())
        assert buffers_mb(runtime["database_url"]) == 160
        item = json.loads(cli(env, "get", "bio/lichen", "--key", KEY,
                              "--url", f"http://127.0.0.1:{port}"))
        assert item["summary"] == "Lichens are a symbiosis of a fungus and an alga."
    finally:
        assert up.stop() == []


def test_up_with_external_servers(
    tmp_path: Path, base_env: dict[str, str], db_url: str, redis_url: str
) -> None:
    """With both URLs set, nothing embedded starts: the given Postgres and Redis are used."""
    data_dir = tmp_path / "data"
    env = {**base_env, "MEMMILL_DATABASE_URL": db_url, "MEMMILL_REDIS_URL": redis_url,
           "MEMMILL_DATA_DIR": str(data_dir), "MEMMILL_QUEUE_NAME": f"memmill:up:{os.getpid()}"}
    up = Up(data_dir, free_port(), env)
    try:
        up.wait_ready()
        assert not (data_dir / "postgres").exists() and not (data_dir / "valkey").exists()
        out = cli(env, "put", "Granite is an igneous rock.", "--id", "geo/granite", "--wait")
        assert "ready" in out
        out = cli(env, "search", "igneous", "--mode", "fts", "--json")
        assert json.loads(out)["results"][0]["item"]["id"] == "geo/granite"
        worker_restarts_after_a_crash(up, db_url)
    finally:
        assert up.stop() == []


def test_up_stops_once_and_plainly_when_a_worker_cannot_import(
    tmp_path: Path, base_env: dict[str, str], db_url: str, redis_url: str
) -> None:
    """What a fresh install without lxml_html_clean did: every worker died at import and the
    supervisor printed the same traceback until it gave up. (HTML extraction's packages are
    now imported by the jobs that need them; a worker still cannot start without the package
    of the embedding model it loads before taking jobs.) Now: one retry, then exit 1 with the
    error's last line and the install command, and nothing left running."""
    shim = tmp_path / "shim" / "sentence_transformers"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        'raise ImportError("sentence_transformers is missing from this environment")\n')
    data_dir = tmp_path / "data"
    env = {**base_env, "MEMMILL_DATABASE_URL": db_url, "MEMMILL_REDIS_URL": redis_url,
           "MEMMILL_DATA_DIR": str(data_dir), "MEMMILL_QUEUE_NAME": f"memmill:up:{os.getpid()}",
           "PYTHONPATH": str(shim.parent)}
    up = Up(data_dir, free_port(), env)
    children: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    while up.process.poll() is None and time.monotonic() < deadline:
        children = psutil.Process(up.process.pid).children(recursive=True) or children
        time.sleep(0.2)
    output, _ = up.process.communicate(timeout=60)
    assert up.process.returncode == 1, output
    assert "the worker-1 process cannot start" in output
    assert "last line: ImportError: sentence_transformers is missing from this environment" \
        in output
    assert "./dev setup" in output
    # Its traceback twice at most: the first start and the one retry, never a loop.
    assert output.count("Traceback (most recent call last)") <= 2, output
    assert "Ctrl-C stops everything" not in output
    psutil.wait_procs(children, timeout=10)
    assert [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []
