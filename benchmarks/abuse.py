"""A tenant's burst and its neighbour: tenant B's latency while tenant A floods the API.

A real `memmill up` (embedded Postgres + pgvector, Valkey, the API in its own process and one
worker) in a temporary data directory on a free port, started as benchmarks/ingest.py does.
With the operator's key it registers, the run makes tenants A and B (`POST /v1/tenants`, an
admin key each) and limits A to --limit requests a minute (`PUT /v1/tenants/{id}/limits`).
B stores a few items and waits for them to be ready, and warms its query up. Then:

1. **idle**: B sends --probes small searches (`POST /v1/search`, hybrid, limit 5, its query
   embedding cached after the first), one at a time, nothing else running;
2. **burst**: A sends --burst tiny requests (`GET /v1/memory-types`), --concurrency at a
   time over as many kept-alive connections, from a process of its own (so that A's client
   shares neither an event loop nor a GIL with B's), while B searches as in 1, one at a
   time, until A's burst is over;
3. **idle again**: B's searches as in 1, after the burst (other jobs on the machine change
   its load: a baseline on both sides of the burst is fairer).

Printed: B's p50 and p99 in each phase and their ratios burst/idle; A's answers by status
(200, 429, 5xx, and requests that got no answer) and their latency, whether every 429
carried `Retry-After`, how long the burst took and at what rate; and how often the API
logged that it served requests unlimited because Redis did not answer within its timeout
(api/rate_limit.py). Timing is reported, never asserted.

    .venv/bin/python benchmarks/abuse.py [--burst 10000] [--concurrency 50] [--limit 600]
        [--probes 200] [--port P]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue`. Putting the
# repository root first instead makes `benchmarks.ingest` importable (see fairness.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import asyncio
import multiprocessing
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks.ingest import start_memmill, wait_for_api
from benchmarks.memory_latency import free_port, load, pct, until

QUERY = "what makes bread rise"
TEXTS = ("Sourdough rises thanks to wild yeast.", "Rye bread needs a sour starter.",
         "Green tea is steeped for two minutes.", "Baguettes are baked in a steamy oven.",
         "A levain is fed flour and water daily.", "Brioche is rich with butter and eggs.",
         "Focaccia is dimpled and drizzled with olive oil.", "Pita puffs in a hot oven.")
FLOOD_PATH = "/v1/memory-types"


@dataclass
class Burst:
    statuses: Counter[int] = field(default_factory=Counter)
    ms: dict[int, list[float]] = field(default_factory=dict)  # A's latency, by status
    no_answer: Counter[str] = field(default_factory=Counter)
    without_retry_after: int = 0
    seconds: float = 0.0


async def flood(url: str, key: str, count: int, concurrency: int) -> Burst:
    """A's burst: `count` GETs over `concurrency` kept-alive connections, written and read by
    hand. httpx's connection pool costs the client about a millisecond of its own CPU a
    request: on a shared 2-core machine that made A's client, not the API, the bottleneck
    (34 requests/s, each waiting a second in the client, while B's searches took 21 ms)."""
    tally = Burst()
    left = iter(range(count))
    where = urlsplit(url)
    request = (f"GET {FLOOD_PATH} HTTP/1.1\r\nHost: {where.netloc}\r\n"
               f"Authorization: Bearer {key}\r\n\r\n").encode()

    async def sender() -> None:
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        try:
            for _ in left:
                sent = time.perf_counter()
                try:
                    writer.write(request)
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                except (OSError, asyncio.IncompleteReadError) as exc:
                    tally.no_answer[type(exc).__name__] += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(where.hostname, where.port)
                    continue
                status_line, *lines = head.split("\r\n")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in lines if line)}
                await reader.readexactly(int(headers.get("content-length", "0")))
                status = int(status_line.split()[1])
                tally.statuses[status] += 1
                tally.ms.setdefault(status, []).append((time.perf_counter() - sent) * 1000)
                if status == 429 and not headers.get("retry-after", "").isdigit():
                    tally.without_retry_after += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    tally.seconds = time.perf_counter() - started
    return tally


def flood_process(url: str, key: str, count: int, concurrency: int, started: Any,
                  results: multiprocessing.Queue[Burst]) -> None:
    """The burst in a process of its own; `started` is set as its first request goes out."""
    started.set()
    results.put(asyncio.run(flood(url, key, count, concurrency)))


def search_ms(http: httpx.Client) -> float:
    started = time.perf_counter()
    r = http.post("/v1/search", json={"query": QUERY, "limit": 5})
    elapsed = (time.perf_counter() - started) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"B's search answered {r.status_code}: {r.text[:200]}")
    return elapsed


def make_tenant(ops: httpx.Client, name: str) -> tuple[int, str]:
    made = ops.post("/v1/tenants", json={"name": name})
    made.raise_for_status()
    return made.json()["tenant"]["id"], made.json()["key"]


def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"})


def prepare(url: str, operator: str, limit: int) -> tuple[str, str]:
    """Tenants A (limited) and B (with a few ready items and its query warm): their keys."""
    with client(url, operator) as ops:
        until(lambda: ops.get("/readyz").status_code == 200, time.perf_counter(),
              timeout_s=300, interval_s=0.5)
        a_id, a_key = make_tenant(ops, "bench-burst-a")
        _, b_key = make_tenant(ops, "bench-quiet-b")
        ops.put(f"/v1/tenants/{a_id}/limits",
                json={"requests_per_minute": limit}).raise_for_status()
    with client(url, b_key) as b:
        batch = b.post("/v1/items/batch", json={"items": [
            {"id": f"bread/{n}", "content": text} for n, text in enumerate(TEXTS)]})
        batch.raise_for_status()
        ids = [entry["id"] for entry in batch.json()["accepted"]]
        if until(lambda: all(i["status"] == "ready" for i in b.post(
                "/v1/items/lookup", json={"ids": ids}).json()["items"]),
                time.perf_counter(), timeout_s=300, interval_s=0.5) is None:
            raise RuntimeError("B's items were not ready within 300 s")
        for _ in range(10):
            search_ms(b)
    return a_key, b_key


def measure(url: str, a_key: str, b_key: str, args: argparse.Namespace
            ) -> tuple[list[float], list[float], list[float], Burst]:
    with client(url, b_key) as b:
        print(f"idle: {load()}", flush=True)
        idle = [search_ms(b) for _ in range(args.probes)]
        spawn = multiprocessing.get_context("spawn")
        results: multiprocessing.Queue[Burst] = spawn.Queue()
        started = spawn.Event()
        burster = spawn.Process(target=flood_process, args=(
            url, a_key, args.burst, args.concurrency, started, results))
        burster.start()
        if not started.wait(timeout=120):
            raise RuntimeError("A's burst did not start within 120 s")
        print(f"burst started: {load()}", flush=True)
        during: list[float] = []
        while burster.is_alive() and results.empty():
            during.append(search_ms(b))
        tally = results.get(timeout=600)
        burster.join(timeout=60)
        print(f"burst over: {load()}", flush=True)
        after = [search_ms(b) for _ in range(args.probes)]
    return idle, during, after, tally


def unlimited_warnings(data_dir: Path) -> int:
    """How often the API logged that it served requests unlimited (at most once a minute)."""
    logs = "".join(p.read_text(errors="replace") for p in data_dir.rglob("*.log"))
    return logs.count("rate limits are not enforced")


def report(idle: list[float], during: list[float], after: list[float], tally: Burst,
           warned: int, args: argparse.Namespace) -> None:
    python = os.path.relpath(sys.executable)
    print()
    print(f"    {' '.join([sys.executable if python.startswith('..') else python, *sys.argv])}")
    print(f"    at the end: {load()}; {os.cpu_count()} cores")
    print()
    print(f"B's search (POST /v1/search, one at a time)   {'n':>5} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  idle                                        {len(idle):>5} {pct(idle, 50):>8.1f} "
          f"{pct(idle, 99):>8.1f}")
    print(f"  during A's burst                            {len(during):>5} "
          f"{pct(during, 50):>8.1f} {pct(during, 99):>8.1f}")
    print(f"  idle again, after it                        {len(after):>5} "
          f"{pct(after, 50):>8.1f} {pct(after, 99):>8.1f}")
    print(f"  ratio burst/idle (idle: before)                   "
          f"{pct(during, 50) / pct(idle, 50):>8.2f} {pct(during, 99) / pct(idle, 99):>8.2f}")
    both = idle + after
    print(f"  ratio burst/idle (idle: before and after)         "
          f"{pct(during, 50) / pct(both, 50):>8.2f} {pct(during, 99) / pct(both, 99):>8.2f}")
    print()
    five = sum(n for status, n in tally.statuses.items() if status >= 500)
    print(f"A's burst: {args.burst:,} x GET {FLOOD_PATH}, {args.concurrency} at a time, limit "
          f"{args.limit}/min: {tally.seconds:.1f} s ({args.burst / tally.seconds:.0f} requests/s)")
    print(f"  answers: {dict(sorted(tally.statuses.items()))}; 5xx: {five}; no answer: "
          f"{dict(tally.no_answer) or 0}; 429 without Retry-After: {tally.without_retry_after}")
    for status, ms in sorted(tally.ms.items()):
        print(f"  A's {status}s: p50 {pct(ms, 50):.1f} ms, p99 {pct(ms, 99):.1f} ms")
    print(f"  API log lines 'rate limits are not enforced' (Redis too slow): {warned}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=10_000, help="A's requests")
    parser.add_argument("--concurrency", type=int, default=50, help="A's requests at a time")
    parser.add_argument("--limit", type=int, default=600, help="A's requests a minute")
    parser.add_argument("--probes", type=int, default=200, help="B's idle searches")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args()

    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="memmill-abuse-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, port, 1)
        try:
            operator = wait_for_api(url, data_dir)
            a_key, b_key = prepare(url, operator, args.limit)
            idle, during, after, tally = measure(url, a_key, b_key, args)
            warned = unlimited_warnings(data_dir)
        except BaseException:
            for log in sorted(data_dir.rglob("*.log")):  # why, before the directory goes
                print(f"--- the end of {log.name}:", *log.read_text(
                    errors="replace").splitlines()[-40:], sep="\n", file=sys.stderr)
            raise
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=120)
    report(idle, during, after, tally, warned, args)


if __name__ == "__main__":
    main()
