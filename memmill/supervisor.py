"""`memmill up`: embedded servers (unless URLs are set), migrations, the API and N workers as
child processes, a restart for any child that dies, and a clean stop on Ctrl-C or SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from memmill.bootstrap import bootstrap
from memmill.embedded import start_postgres, start_valkey
from pipeline.settings import Settings

RUNTIME_FILE = "runtime.json"
STOP_GRACE_S = 30.0
HEALTH_TIMEOUT_S = 120.0


def runtime_file(settings: Settings) -> Path:
    return settings.data_dir / RUNTIME_FILE


def read_runtime(settings: Settings) -> dict[str, str] | None:
    """What a running `memmill up` published: URLs for extra workers and for the CLI."""
    path = runtime_file(settings)
    try:
        info = json.loads(path.read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return info


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, env=self.env)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class StopRequested(Exception):
    pass


def _raise_stop(signum: int, _frame: object) -> None:
    raise StopRequested(signal.Signals(signum).name)


def embedding_threads(settings: Settings, workers: int) -> int:
    """Cores per worker for the model, unless the operator chose: N workers each running torch
    on every core would spend their time waiting on each other's threads."""
    if settings.embedding_threads:
        return settings.embedding_threads
    return max(1, (os.cpu_count() or 1) // workers)


def run_up(settings: Settings, *, workers: int) -> int:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if read_runtime(settings):
        print(f"memmill is already running with data in {settings.data_dir}", file=sys.stderr)
        return 1
    if not _port_free(settings.api_host, settings.api_port):
        print(
            f"port {settings.api_port} on {settings.api_host} is in use; pass --port",
            file=sys.stderr,
        )
        return 1
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    valkey = None
    children: list[Child] = []
    try:
        started = time.monotonic()
        database_url = settings.database_url or start_postgres(
            settings.data_dir, settings.embedded_pg_buffers_mb)
        redis_url = settings.redis_url
        if redis_url is None:
            valkey = start_valkey(settings.data_dir)
            redis_url = valkey.connection_url
        key = bootstrap(database_url, settings)
        env = {
            **os.environ,
            "MEMMILL_DATABASE_URL": database_url,
            "MEMMILL_REDIS_URL": redis_url,
            "MEMMILL_DATA_DIR": str(settings.data_dir),
            "MEMMILL_API_HOST": settings.api_host,
            "MEMMILL_API_PORT": str(settings.api_port),
        }
        cli = [sys.executable, "-m", "memmill"]
        # The API runs one model copy by itself (api.main): a query is one text.
        children = [Child("api", [*cli, "api"], env)]
        worker_env = {**env, "MEMMILL_EMBEDDING_THREADS": str(embedding_threads(settings, workers))}
        children += [
            Child(f"worker-{i + 1}", [*cli, "worker"], worker_env) for i in range(workers)
        ]
        for child in children:
            child.start()
        runtime_file(settings).write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "api_url": settings.api_url,
                    "database_url": database_url,
                    "redis_url": redis_url,
                }
            )
        )
        _wait_healthy(settings, children[0])
        print(f"memmill is up ({time.monotonic() - started:.1f}s)", flush=True)
        print(f"  API:       {settings.api_url}", flush=True)
        print(f"  API docs:  {settings.api_url}/docs", flush=True)
        print(f"  API key:   {key}", flush=True)
        print(f"  workers:   {workers}", flush=True)
        print(f"  data:      {settings.data_dir}", flush=True)
        print("Ctrl-C stops everything.", flush=True)
        _supervise(children)
    except StopRequested as stop:
        print(f"stopping ({stop})…", flush=True)
    except RuntimeError as exc:
        print(f"memmill up failed: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_children(children)
        if valkey is not None:
            valkey.stop()
        runtime_file(settings).unlink(missing_ok=True)
    return 0


def _wait_healthy(settings: Settings, api: Child) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if not api.alive():
            raise RuntimeError("the API process exited during start-up (see its log above)")
        try:
            if httpx.get(f"{settings.api_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the API did not become healthy within {HEALTH_TIMEOUT_S:.0f}s")


def _supervise(children: list[Child]) -> None:
    """Restart a child that died, at most 5 times a minute, so one crash is not an outage."""
    while True:
        time.sleep(0.5)
        for child in children:
            if child.alive():
                continue
            now = time.monotonic()
            child.restarts = [t for t in child.restarts if now - t < 60] + [now]
            if len(child.restarts) > 5:
                raise RuntimeError(f"{child.name} keeps exiting; giving up")
            code = child.process.returncode if child.process else None
            print(f"{child.name} exited with {code}; restarting", file=sys.stderr, flush=True)
            child.start()


def _stop_children(children: list[Child]) -> None:
    for child in children:
        if child.alive():
            child.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        if child.process is None:
            continue
        try:
            child.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
