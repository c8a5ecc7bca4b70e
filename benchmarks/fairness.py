"""Fair queueing: how long tenant B's single item takes while tenant A's bulk load runs.

Two runs of a real `memmill up` (embedded Postgres + pgvector, Valkey, the API and one
worker), each in a temporary data directory on a free port, as benchmarks/ingest.py starts
it: the first with fair queueing on (the default), the second with `MEMMILL_FAIR_QUEUEING=0`.
Each run makes two tenants with a key each (A and B, in the database directly, as `memmill keys
create` does), waits for `/readyz` and warms the worker up with a few of B's items, then:

1. **idle**: B puts P small items (`POST /v1/items`), one at a time, one every I seconds,
   nothing else running;
2. **loaded**: A puts N small items through the bulk API (`POST /v1/items/batch`, 1,000 a
   request: the whole load is queued before the first probe), then B puts P items as in 1.
   The run ends when B's last item is ready (with fair queueing off, that is about when A's
   load is done; with it on, A's load is left unfinished).

A probe's time is from the moment the client sends its put to the item's `updated_at` when it
turned `ready` (split, summarized, embedded and indexed), read back from the API: server and
client share this machine's clock, and no polling interval is added. Puts do not wait for
earlier probes. Printed: p50, p95 and the worst of each figure, the ratios loaded/idle of
each run (target: p95 within 2x idle with fair queueing on), how many of A's items were ready
when B's first probe was put and when its last was ready (A's load was still running, and at
what rate), and where B's time went: each of its jobs' median time from due to on the queue,
in the queue, and running (the ledger's `enqueued_at` is the last time a job was put on the
queue: the sweeper stamps it again for a job that waited longer than its grace, 30 s, so
for such waits the first two figures share the time between them arbitrarily).

    .venv/bin/python benchmarks/fairness.py [--bulk 20000] [--probes 30] [--interval 1.0]
        [--batch 1000] [--workers 1] [--max-jobs N] [--modes on,off]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue`. Putting the
# repository root first instead makes `benchmarks.ingest` importable (see memory_latency.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import asyncio
import json
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx

from benchmarks.ingest import wait_for_api
from benchmarks.memory_latency import free_port, load, pct, until
from pipeline import tenants

REPO_ROOT = Path(__file__).resolve().parent.parent
WORDS = ("river", "glacier", "harbour", "orchard", "meadow", "canyon", "lagoon", "summit",
         "prairie", "delta", "fjord", "tundra")


@dataclass
class Figure:
    fair: bool
    label: str
    ms: list[float] = field(default_factory=list)
    # A's items ready when B's first probe was put and when its last was ready.
    bulk_before: int = 0
    bulk_ready: int | None = None
    bulk_total: int = 0
    seconds: float = 0.0
    # p50 ms of each of B's jobs: from due to on the queue, waiting there, and running.
    stages: dict[str, tuple[float, float, float]] = field(default_factory=dict)


STAGES = """
SELECT j.kind,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM
           j.enqueued_at - greatest(j.run_after, j.created_at)) * 1000) AS enqueue_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM
           j.started_at - j.enqueued_at) * 1000) AS waited_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM
           j.finished_at - j.started_at) * 1000) AS ran_ms
FROM jobs j JOIN tenants t ON t.id = j.tenant_id
WHERE t.name = 'bench-probe-b' AND j.item_id LIKE $1 AND j.status = 'done'
GROUP BY j.kind ORDER BY j.kind"""


async def stages(dsn: str, prefix: str) -> dict[str, tuple[float, float, float]]:
    """Where B's time went: each job kind's median time from due to on the queue (the ledger
    stamps `enqueued_at` once Redis took it), in the queue, and running."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(STAGES, f"{prefix}/%")
        return {r["kind"]: (float(r["enqueue_ms"]), float(r["waited_ms"]), float(r["ran_ms"]))
                for r in rows}
    finally:
        await conn.close()


def start_memmill(data_dir: Path, port: int, workers: int, fair: bool,
                  max_jobs: int | None) -> subprocess.Popen[bytes]:
    """benchmarks/ingest.py's start, with fair queueing on or off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
    env.update(MEMMILL_LOG_LEVEL="WARNING", MEMMILL_FAIR_QUEUEING="true" if fair else "false")
    if max_jobs is not None:
        env["MEMMILL_WORKER_MAX_JOBS"] = str(max_jobs)
    return subprocess.Popen(
        [sys.executable, "-m", "memmill", "up", "--data-dir", str(data_dir), "--port", str(port),
         "--workers", str(workers)],
        env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=open(data_dir / "up.log", "wb"),
        start_new_session=True)


async def make_keys(dsn: str) -> tuple[str, str]:
    """A key for tenant A (the bulk load) and one for tenant B (the probes)."""
    conn = await asyncpg.connect(dsn)
    try:
        found = []
        for name in ("bench-bulk-a", "bench-probe-b"):
            tenant_id = await tenants.ensure_tenant(conn, name)
            key = tenants.new_key()
            await tenants.add_key(conn, tenant_id, key, name="bench")
            found.append(key)
        return found[0], found[1]
    finally:
        await conn.close()


def text(prefix: str, n: int) -> str:
    """A small text of its own (identical texts would share an embedding from the cache)."""
    return (f"{prefix} note {n}: the {WORDS[n % len(WORDS)]} near site {n * 7919 % 10007} "
            f"was surveyed on day {n % 365}.")


def ready_ms(http: httpx.Client, item_id: str, put_at: float) -> float:
    item = http.get(f"/v1/items/{quote(item_id, safe='/')}").json()
    return (datetime.fromisoformat(item["updated_at"]).timestamp() - put_at) * 1000


def probe(http: httpx.Client, figure: Figure, *, prefix: str, count: int, interval_s: float,
          timeout_s: float) -> None:
    """Put `count` items one every `interval_s`, and time each until it is ready."""
    waiting: dict[str, float] = {}
    started = time.monotonic()
    next_put = started
    put = 0
    while put < count or waiting:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{len(waiting)} probes not ready after {timeout_s:.0f}s")
        if put < count and time.monotonic() >= next_put:
            item_id = f"{prefix}/{put}"
            put_at = time.time()
            answer = http.post("/v1/items", json={"id": item_id, "content": text(prefix, put)})
            answer.raise_for_status()
            waiting[item_id] = put_at
            put += 1
            next_put += interval_s
        if waiting:
            states = http.post("/v1/items/lookup", json={"ids": list(waiting)}).json()["items"]
            for state in states:
                if state["status"] == "failed":
                    raise RuntimeError(f"probe {state['id']} failed: {state['error']}")
                if state["status"] == "ready":
                    figure.ms.append(ready_ms(http, state["id"], waiting.pop(state["id"])))
        time.sleep(0.05)
    figure.seconds = time.monotonic() - started


def bulk_load(http: httpx.Client, count: int, batch: int) -> float:
    """A's whole load, queued through the bulk API; seconds it took to send."""
    started = time.perf_counter()
    for offset in range(0, count, batch):
        items = [{"id": f"bulk/{n}", "content": text("bulk", n)}
                 for n in range(offset, min(offset + batch, count))]
        answer = http.post("/v1/items/batch", json={"items": items})
        answer.raise_for_status()
        if answer.json()["refused"]:
            raise RuntimeError(f"refused: {answer.json()['refused'][:3]}")
    return time.perf_counter() - started


def embedded(http: httpx.Client) -> int:
    """How many of the key's tenant's items have their last job (embed) done."""
    stats = http.get("/v1/jobs/stats").json()
    return int(stats["by_kind"].get("embed", {}).get("done", 0))


def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {key}"})


def run(args: argparse.Namespace, fair: bool) -> list[Figure]:
    name = "on" if fair else "off"
    figures = [Figure(fair, "idle"), Figure(fair, f"A's {args.bulk:,} items queued")]
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="memmill-fair-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, port, args.workers, fair, args.max_jobs)
        try:
            url = f"http://127.0.0.1:{port}"
            operator = wait_for_api(url, data_dir)
            dsn = json.loads((data_dir / "runtime.json").read_text())["database_url"]
            key_a, key_b = asyncio.run(make_keys(dsn))
            with client(url, operator) as http:
                until(lambda: http.get("/readyz").status_code == 200, time.perf_counter(),
                      timeout_s=180, interval_s=0.5)
            with client(url, key_a) as a, client(url, key_b) as b:
                probe(b, Figure(fair, "warm-up"), prefix="warm", count=5, interval_s=0.2,
                      timeout_s=120)
                print(f"fair queueing {name}, idle: {load()}", flush=True)
                probe(b, figures[0], prefix="idle", count=args.probes,
                      interval_s=args.interval, timeout_s=args.timeout)
                figures[0].stages = asyncio.run(stages(dsn, "idle"))
                print(f"fair queueing {name}, A's load: {load()}", flush=True)
                sent_s = bulk_load(a, args.bulk, args.batch)
                figures[1].bulk_before = embedded(a)
                print(f"  A's {args.bulk:,} items queued in {sent_s:.1f}s "
                      f"({figures[1].bulk_before:,} ready); {load()}", flush=True)
                probe(b, figures[1], prefix="loaded", count=args.probes,
                      interval_s=args.interval, timeout_s=args.timeout)
                figures[1].bulk_ready, figures[1].bulk_total = embedded(a), args.bulk
                figures[1].stages = asyncio.run(stages(dsn, "loaded"))
                print(f"  B's last probe ready after {figures[1].seconds:.0f}s; A's items "
                      f"ready: {figures[1].bulk_ready:,}; {load()}", flush=True)
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=120)
    return figures


def print_table(figures: list[Figure]) -> None:
    idle = {f.fair: f for f in figures if f.label == "idle"}
    print(f"{'fair queueing':<14} {'B puts an item at a time':<26} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'max ms':>8} {'p50/idle':>9} {'p95/idle':>9}  A's items ready meanwhile")
    for f in figures:
        base = idle[f.fair]
        p50, p95 = pct(f.ms, 50), pct(f.ms, 95)
        ratios = ("" if f is base else
                  f"{p50 / pct(base.ms, 50):>9.2f} {p95 / pct(base.ms, 95):>9.2f}")
        bulk = ("" if f.bulk_ready is None else
                f"  {f.bulk_before:,} -> {f.bulk_ready:,} of {f.bulk_total:,} in "
                f"{f.seconds:.0f}s ({(f.bulk_ready - f.bulk_before) / f.seconds:.1f}/s)")
        print(f"{'on' if f.fair else 'off':<14} {f.label:<26} {p50:>8.0f} {p95:>8.0f} "
              f"{max(f.ms):>8.0f} {ratios:>19}{bulk}")
    print()
    print("B's jobs, p50 ms from due to on the queue / waiting there / running:")
    for f in figures:
        parts = ", ".join(f"{kind} {enqueue:.0f} / {waited:.0f} / {ran:.0f}"
                          for kind, (enqueue, waited, ran) in f.stages.items())
        print(f"  fair queueing {'on' if f.fair else 'off'}, {f.label}: {parts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bulk", type=int, default=20_000, help="A's items, queued first")
    parser.add_argument("--probes", type=int, default=30, help="B's items per figure")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between B's puts")
    parser.add_argument("--batch", type=int, default=1000, help="A's items per batch request")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-jobs", type=int, default=None,
                        help="MEMMILL_WORKER_MAX_JOBS (default: the server's, 128)")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds B's probes may take, per figure")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--modes", default="on,off",
                        help="fair queueing on, off or both (off waits for A's whole load)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not modes or set(modes) - {"on", "off"}:
        parser.error("--modes takes on, off or on,off")

    figures = [f for mode in modes for f in run(args, fair=mode == "on")]
    print()
    python = os.path.relpath(sys.executable)
    print(f"    {' '.join([sys.executable if python.startswith('..') else python, *sys.argv])}")
    print(f"    at the end: {load()}; {os.cpu_count()} cores")
    print()
    print_table(figures)


if __name__ == "__main__":
    main()
