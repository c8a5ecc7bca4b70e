"""`memmill up`: embedded servers (unless URLs are set), migrations, the API and N workers as
child processes, a restart for any child that dies, and a clean stop on Ctrl-C or SIGTERM.

It says "ready" only when `/readyz` does (a worker has a heartbeat), and it stops with one
plain paragraph, not a loop of tracebacks, when a child cannot start."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from memmill.bootstrap import bootstrap
from memmill.child import Child, advice
from memmill.embedded import start_postgres, start_valkey
from memmill.private import write_private
from memmill.runtime import read_runtime, runtime_file
from pipeline.settings import Settings

STOP_GRACE_S = 30.0
READY_TIMEOUT_S = 300.0
# A child that dies this many times during start-up with the same last line cannot start.
STARTUP_SAME_DEATHS = 2


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


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
        write_private(runtime_file(settings), json.dumps({
            "pid": os.getpid(),
            "api_url": settings.api_url,
            "database_url": database_url,
            "redis_url": redis_url,
        }))
        _wait_ready(settings, children)
        print(f"memmill is ready ({time.monotonic() - started:.1f}s)", flush=True)
        print(f"  API:       {settings.api_url}", flush=True)
        print(f"  API docs:  {settings.api_url}/docs", flush=True)
        print(f"  dashboard: {settings.api_url}/dashboard (sign in with the key)", flush=True)
        print(f"  metrics:   {settings.api_url}/metrics", flush=True)
        print(f"  API key:   {key}", flush=True)
        print(f"  workers:   {workers}", flush=True)
        print(f"  data:      {settings.data_dir}", flush=True)
        print("Ctrl-C stops everything.", flush=True)
        _supervise(children)
    except StopRequested as stop:
        print(f"stopping ({stop})…", flush=True)
    except StartupFailed as failed:
        print(f"\nmemmill up failed: {failed}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_children(children)
        if valkey is not None:
            valkey.stop()
        runtime_file(settings).unlink(missing_ok=True)
    return 0


class StartupFailed(Exception):
    """A child cannot start; the message is the paragraph the user reads."""


def _readiness(settings: Settings) -> dict | None:
    # httpx logs every request at INFO; four polls a second would bury the children's output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return httpx.get(f"{settings.api_url}/readyz", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None


def _wait_ready(settings: Settings, children: list[Child]) -> None:
    """Wait until `/readyz` answers ready, restarting a child that dies once; a child that dies
    again with the same last line stops the start with `StartupFailed`."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    deaths: dict[str, list[str]] = {}
    said_waiting = False
    while time.monotonic() < deadline:
        for child in children:
            if child.alive():
                continue
            last = child.last_error_line()
            seen = deaths.setdefault(child.name, [])
            seen.append(last)
            if seen.count(last) >= STARTUP_SAME_DEATHS:
                raise StartupFailed(
                    f"the {child.name} process cannot start: it exited twice during start-up "
                    f"with the same error.\n  last line: {last}\n  {advice(last)}")
            print(f"{child.name} exited during start-up ({last}); starting it once more",
                  file=sys.stderr, flush=True)
            child.start()
        report = _readiness(settings)
        if report is not None and report.get("ready"):
            return
        if report is not None and not said_waiting and report.get("missing") == ["workers"]:
            print("the API is up and accepts writes; waiting for a worker to start "
                  "(loading the embedding model)…", flush=True)
            said_waiting = True
        time.sleep(0.25)
    missing = ", ".join((_readiness(settings) or {}).get("missing", ["the API"]))
    raise StartupFailed(
        f"memmill did not become ready within {READY_TIMEOUT_S:.0f}s; still missing: {missing}.\n"
        f"  {advice('')}")


def _supervise(children: list[Child]) -> None:
    """Restart any child that dies, with backoff, one line per restart, for as long as it
    runs; say plainly when no worker is left, since writes are still accepted then."""
    workers = [c for c in children if c.name.startswith("worker")]
    warned_no_worker = False
    while True:
        time.sleep(0.25)
        now = time.monotonic()
        for child in children:
            if child.alive():
                continue
            if child.restart_at is None:
                last = child.last_error_line()
                delay = child.schedule_restart(now)
                print(f"{child.name} exited with status {child.exit_code()} ({last}); "
                      f"restarting in {delay:.0f}s", file=sys.stderr, flush=True)
            elif now >= child.restart_at:
                child.start()
        running = any(w.alive() for w in workers)
        if not running and not warned_no_worker:
            print("no worker is running: writes are still accepted and kept in the job ledger, "
                  "and nothing is processed until a worker is back", file=sys.stderr, flush=True)
        elif running and warned_no_worker:
            print("a worker is running again", file=sys.stderr, flush=True)
        warned_no_worker = not running


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
