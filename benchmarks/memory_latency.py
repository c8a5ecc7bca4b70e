"""Agent memory latency: event writes, how soon a write is searchable, and search and context
at the scale of a hosted tenant, over HTTP against a real `memmill up`.

One run of a real `memmill up` (embedded Postgres + pgvector, Valkey, the API and one worker)
in a temporary data directory on a free port, as benchmarks/ingest.py starts it, with one
change: MEMMILL_EXTRACTION_QUIET_S=3600, so that the background extraction of the written
sessions never runs in the middle of a measurement (a write still schedules it, so its cost is
in every write). One persistent httpx client sends every request, one at a time. Event and
memory texts are sentences of the BEIR SciFact abstracts (/work/shared/data/beir/scifact, read
in place); queries are its test queries.

1. **Event write**: `POST /v1/sessions/{id}/events`, 10 events a batch, ≥ 300 samples after
   a warm-up, each alternating with a `GET /healthz` (the bare HTTP round trip: one
   `SELECT true` and one Redis ping), whose p50 is the baseline of the ratio. Twice: *idle
   worker* (after each write, untimed, the next waits for that write's embedding to finish, so
   the worker's model is not sharing the two cores with the API: the figure the target is
   for) and *back to back* (the worker embedding the backlog meanwhile). Target p50 ≤ 5 ms.
2. **Searchable**: on an idle system (no job due or running before each sample), 30 writes
   of 10 events to one session, each followed from its 202, every 10 ms, by
   `GET /v1/sessions/{id}` (until `embedded: true`) and `POST /v1/memories/search`
   (include_events, the writer's scope, limit 100, query = the 4 longest words of the batch's
   last event, not in the API's query cache at first), until the search returns that event
   by its vector AND its words. Figures: ms from the 202 until it is (a) found by its words
   among the 100 results, (a') among the first 10, the session says embedded, (b) found by
   vector and words. Target p50 of (b) ≤ 2 s.
3. **Scale**: 10 tenants, loaded with SQL straight into the same database: per connection
   (2, one per core), temporary tables of the sentences and of 4096 random unit vectors, then
   `INSERT … SELECT` from generate_series (one statement per day of sessions, or per 5
   memories of every user, the statements shared between the connections), then VACUUM
   ANALYZE; all timed:
   - the big tenant: U users (default 1,000) x 50 sessions x E/(U·50) events (default 20:
     1,000,000 events) and M/U memories per user (default 100: 100,000 memories, 2 of them
     pinned), plus 50 tenant-wide memories; one agent id for all. Rows land in time order,
     every user's sessions of a day interleaved, as a live tenant's do; search_text,
     embed_text, content_hash and terms as a write and its embed job compose them;
     vectors carry the server's embedding model key, so the vector side scores them;
   - 8 small tenants: 10 users x 5 sessions x 20 events, 10 memories per user; and the
     default tenant, which holds parts 1 and 2.
   Then, through a key of the big tenant, in the scope of its user U/2 (1,000 events and 150
   memories visible by default), 20 fixed test queries repeated (their embeddings cached by
   the API's query cache during 2 warm-up rounds) for 15 rounds, the request types taking
   turns: `POST /v1/memories/search` with include_events false and true (target p50 ≤ 10 ms),
   the latter also with the agent in the scope, and `POST /v1/context` on 20 of the user's
   sessions with max_tokens 1000 (its query: the session's latest user turns; target p50 ≤
   25 ms). The search's own `timings_ms.sql` is kept beside the client's time. Last, EXPLAIN
   (ANALYZE, BUFFERS) of the search statement exactly as pipeline/memory/recall.py builds it
   (include_events, a random query vector: every visible row is scored whatever it is): a
   test query planned for its arguments (as the API's pool does) and generically, and the
   query of a context (limit 60): times, the scope indexes and how many rows each read, the
   costliest CTEs and subplans.

Every phase prints `os.getloadavg()`: other processes share the two cores.

    .venv/bin/python benchmarks/memory_latency.py [--users 1000] [--events 1000000]
        [--memories 100000] [--samples 300] [--searchable 30] [--skip-scale] [--show-plan]
        [--connections 2] [--port N]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue` (torch imports
# it). Putting the repository root first instead makes `benchmarks.ingest` importable (see
# benchmarks/retrieval.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import asyncio
import json
import re
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np
from pgvector.asyncpg import register_vector

from benchmarks.ingest import wait_for_api
from pipeline import db, tenants
from pipeline.memory import recall
from pipeline.memory.memories import BUILTIN_TYPES
from pipeline.memory.scopes import Scope
from pipeline.settings import Settings, model_key

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = REPO_ROOT.parent / "shared" / "data" / "beir" / "scifact"
BATCH = 10
ROLES = ("user", "assistant")
AGENT = "assistant-1"
SESSIONS_PER_USER = 50
VECTORS = 4096
BASE_TIME = datetime(2025, 1, 6, 8, tzinfo=UTC)
QUERIES = 20
WARMUP_ROUNDS = 2


@dataclass
class Figure:
    name: str
    ms: list[float]
    target: str = ""
    note: str = ""
    server_ms: list[float] = field(default_factory=list)  # the search's own timings_ms.sql


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def sentences() -> list[str]:
    """The abstracts' sentences of 40-300 characters: turns and memories of a realistic size."""
    found = []
    with (DATA / "corpus.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            for s in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]):
                if 40 <= len(s) <= 300:
                    found.append(s)
    return found


def test_queries(count: int) -> list[str]:
    wanted = {line.split("\t")[0] for line in (DATA / "qrels" / "test.tsv").open()}
    texts = []
    with (DATA / "queries.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            raw = json.loads(line)
            if raw["_id"] in wanted and len(texts) < count:
                texts.append(raw["text"])
    return texts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_memmill(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """benchmarks/ingest.py's start, with extraction deferred past the end of the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
    env.update(MEMMILL_LOG_LEVEL="WARNING", MEMMILL_EXTRACTION_QUIET_S="3600")
    return subprocess.Popen(
        [sys.executable, "-m", "memmill", "up", "--data-dir", str(data_dir), "--port", str(port),
         "--workers", "1"],
        env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=open(data_dir / "up.log", "wb"),
        start_new_session=True)


def timed(call: Callable[..., httpx.Response], *args: Any,
          **kwargs: Any) -> tuple[float, httpx.Response]:
    """Milliseconds of one request, which must succeed."""
    start = time.perf_counter()
    answer = call(*args, **kwargs)
    ms = (time.perf_counter() - start) * 1000
    if answer.status_code >= 400:
        raise RuntimeError(f"{answer.request.method} {answer.request.url}: "
                           f"{answer.status_code} {answer.text[:500]}")
    return ms, answer


def busy_jobs(dsn: str) -> int:
    async def count() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE status = 'running'"
                " OR (status = 'queued' AND run_after <= now())")
        finally:
            await conn.close()
    return asyncio.run(count())


def wait_idle(dsn: str, timeout_s: float = 900) -> float:
    """Seconds until no job is due or running (extraction, deferred an hour, is not due)."""
    start = time.monotonic()
    while busy_jobs(dsn):
        if time.monotonic() - start > timeout_s:
            raise RuntimeError("the worker did not drain its jobs in time")
        time.sleep(0.2)
    return time.monotonic() - start


# 1. event writes --------------------------------------------------------------------------


def batch_of(texts: Sequence[str], start: int, prefix: str) -> list[dict[str, str]]:
    return [{"event_id": f"{prefix}-{n}", "role": ROLES[n % 2],
             "content": texts[n % len(texts)]} for n in range(start, start + BATCH)]


def measure_writes(http: httpx.Client, texts: Sequence[str], *, samples: int, warmup: int,
                   paced: bool, label: str, offset: int) -> tuple[Figure, Figure]:
    """Write and healthz latencies, taking turns so that a drift of the machine hits both.
    `offset` picks texts no other run wrote: a text embedded before is not embedded again."""
    health: list[float] = []
    writes: list[float] = []
    user, session = f"writer-{label}", f"write-{label}"
    for n in range(warmup + samples):
        health_ms, _ = timed(http.get, "/healthz")
        body = {"scope": {"user_id": user}, "events": batch_of(texts, offset + n * BATCH, label)}
        write_ms, answer = timed(http.post, f"/v1/sessions/{session}/events", json=body)
        if n >= warmup:
            health.append(health_ms)
            writes.append(write_ms)
        if paced:
            timed(http.get, f"/v1/operations/{answer.json()['operation_id']}",
                  params={"wait": 60, "user_id": user})
    mode = "idle worker" if paced else "back to back"
    return (Figure(f"GET /healthz ({mode})", health, note="baseline"),
            Figure(f"event write, 10 events ({mode})", writes, "p50 <= 5 ms"))


# 2. searchable ----------------------------------------------------------------------------


def distinctive(text: str, count: int = 4) -> str:
    words = dict.fromkeys(w for w in re.findall(r"[A-Za-z]{4,}", text))
    longest = sorted(words, key=len, reverse=True)[:count]
    return " ".join(w for w in words if w in longest)


def until(check: Callable[[], bool], since: float, timeout_s: float = 60,
          interval_s: float = 0.0) -> float | None:
    """Milliseconds from `since` to the end of the first call of `check` that holds."""
    while time.perf_counter() - since < timeout_s:
        if check():
            return (time.perf_counter() - since) * 1000
        time.sleep(interval_s)
    return None


@dataclass
class Sighting:
    """When (ms after the write's 202) each state of a new event was first seen."""

    embedded: float | None = None  # GET /v1/sessions/{id} says so
    found: float | None = None  # among the 100 results, by its words
    top10: float | None = None  # among the first 10, by its words
    both: float | None = None  # among the 100 results, by its vector and its words
    first_rank: int | None = None  # its rank in the first search that found it


def follow(http: httpx.Client, *, session: str, user: str, event_id: str, query: str,
           timeout_s: float = 60) -> Sighting:
    """Poll the session and the search (limit 100, the API's maximum) every 10 ms until the
    session says embedded and the event is found by both its vector and its words."""
    seen = Sighting()
    body = {"query": query, "scope": {"user_id": user}, "include_events": True, "limit": 100}
    since = time.perf_counter()
    while ((seen.both is None or seen.embedded is None)
           and time.perf_counter() - since < timeout_s):
        if seen.embedded is None:
            _, answer = timed(http.get, f"/v1/sessions/{session}", params={"user_id": user})
            if answer.json()["embedded"]:
                seen.embedded = (time.perf_counter() - since) * 1000
        _, answer = timed(http.post, "/v1/memories/search", json=body)
        now = (time.perf_counter() - since) * 1000
        for rank, r in enumerate(answer.json()["results"]):
            if r["kind"] == "event" and r["event_id"] == event_id and r["scores"]["fts"]:
                if seen.found is None:
                    seen.found, seen.first_rank = now, rank
                if rank < 10 and seen.top10 is None:
                    seen.top10 = now
                if r["scores"]["vector"] is not None:
                    seen.both = now
        time.sleep(0.01)
    return seen


def measure_searchable(http: httpx.Client, dsn: str, texts: Sequence[str], *, samples: int,
                       warmup: int = 2) -> tuple[list[Figure], list[str]]:
    user, session = "searcher", "searchable"
    sightings: list[Sighting] = []
    writes: list[float] = []
    for n in range(warmup + samples):
        wait_idle(dsn)
        events = batch_of(texts, n * BATCH, "found")
        write_ms, _ = timed(http.post, f"/v1/sessions/{session}/events",
                            json={"scope": {"user_id": user}, "events": events})
        seen = follow(http, session=session, user=user, event_id=events[-1]["event_id"],
                      query=distinctive(events[-1]["content"]))
        if n >= warmup:
            writes.append(write_ms)
            sightings.append(seen)

    def times(name: str) -> list[float]:
        return [t for s in sightings if (t := getattr(s, name)) is not None]

    def missed(name: str) -> str:
        lost = len(sightings) - len(times(name))
        return f"{lost} of {len(sightings)} not seen in 60 s" if lost else ""

    ranks = [s.first_rank for s in sightings if s.first_rank is not None]
    early = sum(1 for s in sightings if s.top10 is not None and s.embedded is not None
                and s.top10 < s.embedded)
    notes = [f"part 2: the new event's rank in the first search that found it: median"
             f" {statistics.median(ranks) if ranks else '-'} (0 = first); in the top 10 before"
             f" its session said embedded in {early} of {len(sightings)} writes; the user holds"
             f" up to {(warmup + samples) * BATCH} events"]
    return [Figure("write → found by its words, in 100 results (a)", times("found"),
                   note=missed("found") or "1st search embeds the query"),
            Figure("write → found by its words, in the top 10", times("top10"),
                   note=missed("top10")),
            Figure("write → session says embedded", times("embedded"), note=missed("embedded")),
            Figure("write → found by vector and words (b)", times("both"), "p50 <= 2 s",
                   missed("both")),
            Figure("event write (part 2, idle)", writes, "p50 <= 5 ms")], notes


# 3. scale: the load -----------------------------------------------------------------------

SESSIONS_SQL = """
INSERT INTO sessions (tenant_id, id, user_id, agent_id, visibility, created_at, first_event_at,
                      last_event_at, last_write_at, events)
SELECT $1, 'u' || u || '-s' || s, 'u' || u, $5, 'user', t, t, t + ($4 - 1) * interval '30 s',
       t + ($4 - 1) * interval '30 s', $4
FROM generate_series(0, $2 - 1) s, generate_series(0, $3 - 1) u,
     LATERAL (SELECT $6::timestamptz + make_interval(days => s, secs => u * 50) AS t) x
"""

# One day: the s-th session of every user, in time order. search_text and embed_text as
# pipeline/memory/indexing.py composes them: the turn with its speaker, the turn before it,
# the date ("6 January 2025"); content_hash as pipeline.items.content_hash (sha256 hex).
EVENTS_SQL = """
WITH ev AS (
    SELECT u, k, 'u' || u || '-s' || $2::int AS session_id, ($2::int * $3::bigint + u) * $4 + k
               AS i,
           $6::timestamptz + make_interval(days => $2::int, secs => u * 50 + k * 30) AS at,
           $7::text[] AS roles
    FROM generate_series(0, $4 - 1) k, generate_series(0, $3 - 1) u
), txt AS (
    SELECT ev.*, ev.roles[1 + k % 2] AS role, cur.s AS content,
           ev.roles[1 + k % 2] || ': ' || cur.s AS own,
           CASE WHEN k > 0 THEN ev.roles[1 + (k - 1) % 2] || ': ' || prev.s END AS before
    FROM ev
    JOIN bench_sentences cur ON cur.n = (ev.i * 7919) % $8
    LEFT JOIN bench_sentences prev ON prev.n = ((ev.i - 1) * 7919) % $8
)
INSERT INTO events (tenant_id, session_id, event_id, user_id, agent_id, visibility, role,
                    content, created_at, received_at, search_text, embed_text, content_hash,
                    terms, embedding, embedding_model)
SELECT $1, session_id, 'e' || k, 'u' || u, $5, 'user', role, content, at, at, search_text, own,
       encode(sha256(convert_to(own, 'UTF8')), 'hex'),
       bm25_terms(to_tsvector('english', search_text)), v.v, $9
FROM (SELECT txt.*, '[' || to_char(at, 'FMDD FMMonth YYYY') || '] '
                    || concat_ws(E'\n', before, own, own) AS search_text
      FROM txt) txt
JOIN bench_vectors v ON v.n = txt.i % $10
ORDER BY k, u
"""

MEMORIES_SQL = """
INSERT INTO memories (tenant_id, user_id, agent_id, session_id, visibility, type, content,
                      confidence, source, pinned, observed_at, created_at, updated_at,
                      content_hash, embedding, embedding_model)
SELECT $1, 'u' || u, $5, 'u' || u || '-s' || (j % $4), 'user', ($6::text[])[1 + j % $7],
       s.s, 0.5 + (j % 5) / 10.0, 'bench', j < 2, t.at, t.at, t.at,
       encode(sha256(convert_to(s.s, 'UTF8')), 'hex'), v.v, $9
FROM generate_series($12::int, $13::int - 1) j, generate_series(0, $3 - 1) u,
     LATERAL (SELECT $8::timestamptz + make_interval(days => j % $4, secs => u * 50 + 600)
              AS at) t,
     bench_sentences s, bench_vectors v
WHERE s.n = ((u::bigint * $2 + j) * 104729 + 17) % $10 AND v.n = (u * $2 + j + 7) % $11
ORDER BY j, u
"""

TENANT_WIDE_SQL = """
INSERT INTO memories (tenant_id, visibility, type, content, source, content_hash, embedding,
                      embedding_model)
SELECT $1, 'tenant', 'fact', s.s, 'bench', encode(sha256(convert_to(s.s, 'UTF8')), 'hex'),
       v.v, $3
FROM generate_series(0, $2 - 1) j, bench_sentences s, bench_vectors v
WHERE s.n = (j * 31337 + 5) % $4 AND v.n = j % $5
"""


@dataclass(frozen=True)
class Shape:
    users: int
    sessions: int  # per user
    events: int  # per session
    memories: int  # per user
    tenant_wide: int


async def loader(dsn: str, texts: Sequence[str], vectors: np.ndarray) -> asyncpg.Connection:
    """A connection with the sentences and vectors in temporary tables of its own."""
    conn = await asyncpg.connect(dsn, server_settings={"jit": "off", "TimeZone": "UTC",
                                                       "synchronous_commit": "off",
                                                       "work_mem": "64MB"})
    await register_vector(conn)
    await conn.execute("CREATE TEMP TABLE bench_sentences (n int PRIMARY KEY, s text);"
                       " CREATE TEMP TABLE bench_vectors (n int PRIMARY KEY, v vector(384))")
    await conn.copy_records_to_table("bench_sentences", records=list(enumerate(texts)))
    await conn.copy_records_to_table("bench_vectors", records=list(enumerate(vectors)))
    await conn.execute("ANALYZE bench_sentences; ANALYZE bench_vectors")
    return conn


async def fill_tenant(conns: Sequence[asyncpg.Connection], tenant: int, shape: Shape, *,
                      n_sentences: int, key: str, progress: bool) -> None:
    """Sessions, then a day of events per statement and 5 memories of every user per
    statement, the statements shared between the connections (each its own server process,
    so the cores share the work: the BM25 term weights cost most of it)."""
    await conns[0].execute(SESSIONS_SQL, tenant, shape.sessions, shape.users, shape.events,
                           AGENT, BASE_TIME)
    started = time.perf_counter()
    days_done = 0

    async def days(conn: asyncpg.Connection, share: Sequence[int]) -> None:
        nonlocal days_done
        for day in share:
            await conn.execute(EVENTS_SQL, tenant, day, shape.users, shape.events, AGENT,
                               BASE_TIME, list(ROLES), n_sentences, key, VECTORS)
            days_done += 1
            if progress and days_done % 10 == 0:
                print(f"  {days_done * shape.users * shape.events:,} events in"
                      f" {time.perf_counter() - started:.0f}s ({load()})", flush=True)

    async def memories(conn: asyncpg.Connection, share: Sequence[int]) -> None:
        for first in share:
            await conn.execute(MEMORIES_SQL, tenant, shape.memories, shape.users,
                               shape.sessions, AGENT, list(BUILTIN_TYPES), len(BUILTIN_TYPES),
                               BASE_TIME, key, n_sentences, VECTORS, first,
                               min(first + 5, shape.memories))

    every_day = range(shape.sessions)
    await asyncio.gather(*(days(c, every_day[i::len(conns)]) for i, c in enumerate(conns)))
    chunks = range(0, shape.memories, 5)
    await asyncio.gather(*(memories(c, chunks[i::len(conns)]) for i, c in enumerate(conns)))
    await conns[0].execute(TENANT_WIDE_SQL, tenant, shape.tenant_wide, key, n_sentences,
                           VECTORS)


async def load_scale(dsn: str, texts: Sequence[str], big: Shape,
                     connections: int) -> tuple[str, list[str]]:
    """Fill the big tenant and 8 small ones; returns a key of the big one and timing lines."""
    key = model_key(Settings())
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((VECTORS, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    started = time.perf_counter()
    conns = [await loader(dsn, texts, vectors) for _ in range(connections)]
    try:
        big_id = await tenants.ensure_tenant(conns[0], "bench-big")
        api_key = tenants.new_key()
        await tenants.add_key(conns[0], big_id, api_key, name="bench")
        mark = time.perf_counter()
        await fill_tenant(conns, big_id, big, n_sentences=len(texts), key=key, progress=True)
        big_s = time.perf_counter() - mark
        mark = time.perf_counter()
        small = Shape(users=10, sessions=5, events=20, memories=10, tenant_wide=5)
        for n in range(2, 10):
            tenant = await tenants.ensure_tenant(conns[0], f"bench-small-{n}")
            await fill_tenant(conns, tenant, small, n_sentences=len(texts), key=key,
                              progress=False)
        small_s = time.perf_counter() - mark
        mark = time.perf_counter()
        await conns[0].execute("VACUUM (ANALYZE) sessions, events, memories")
        vacuum_s = time.perf_counter() - mark
        total_s = time.perf_counter() - started
        sizes = await conns[0].fetchrow(
            "SELECT pg_total_relation_size('events') AS events,"
            " pg_total_relation_size('memories') AS memories,"
            " (SELECT count(DISTINCT tenant_id) FROM events) AS tenants")
    finally:
        for conn in conns:
            await conn.close()
    events = big.users * big.sessions * big.events
    rows = events + big.users * big.memories
    return api_key, [
        f"big tenant: {big.users:,} users x {big.sessions} sessions x {big.events} events"
        f" = {events:,} events, {big.users * big.memories:,} memories"
        f" (+{big.tenant_wide} tenant-wide) in {big_s:.0f}s = {rows / big_s:,.0f} rows/s"
        f" on {connections} connections",
        f"8 small tenants (10 users x 5 sessions x 20 events, 10 memories per user)"
        f" in {small_s:.1f}s; VACUUM ANALYZE {vacuum_s:.0f}s; load total {total_s:.0f}s",
        f"tables: events {sizes['events'] / 2**30:.2f} GiB, memories"
        f" {sizes['memories'] / 2**30:.2f} GiB (with indexes and TOAST);"
        f" tenants with events: {sizes['tenants']}",
    ]


# 3. scale: the requests -------------------------------------------------------------------


def measure_scale(http: httpx.Client, user: str, queries: Sequence[str],
                  sessions: Sequence[str], rounds: int) -> list[Figure]:
    """Each request type in turn on each query, so that a drift of the machine hits all."""
    scope = {"user_id": user}
    both = {"user_id": user, "agent_id": AGENT}
    asks: dict[str, Callable[[int], tuple[str, dict[str, Any]]]] = {
        "memory search, memories only": lambda i: (
            "/v1/memories/search", {"query": queries[i], "scope": scope}),
        "memory search, include_events": lambda i: (
            "/v1/memories/search", {"query": queries[i], "scope": scope,
                                    "include_events": True}),
        "memory search, include_events, user+agent scope": lambda i: (
            "/v1/memories/search", {"query": queries[i], "scope": both,
                                    "include_events": True}),
        "context, session, max_tokens 1000": lambda i: (
            "/v1/context", {"scope": scope, "session_id": sessions[i % len(sessions)],
                            "max_tokens": 1000}),
    }
    figures = {name: Figure(name, [], "p50 <= 25 ms" if name.startswith("context")
                            else "p50 <= 10 ms") for name in asks}
    figures["memory search, include_events, user+agent scope"].target = "(beyond the brief)"
    for round_ in range(WARMUP_ROUNDS + rounds):
        for i in range(len(queries)):
            for name, ask in asks.items():
                path, body = ask(i)
                ms, answer = timed(http.post, path, json=body)
                if round_ < WARMUP_ROUNDS:
                    continue
                figures[name].ms.append(ms)
                if path.endswith("search"):
                    figures[name].server_ms.append(answer.json()["timings_ms"]["sql"])
    return list(figures.values())


# 3. scale: the plan -----------------------------------------------------------------------

_ACTUAL = re.compile(r"actual time=[\d.]+\.\.([\d.]+) rows=[\d.]+ loops=(\d+)")


def plan_summary(lines: list[str]) -> list[str]:
    """Times, scope indexes, scans of whole tables, and what each CTE of the search cost."""
    text = "\n".join(lines)
    found = [line.strip() for line in lines
             if "Planning Time" in line or "Execution Time" in line]
    indexes = sorted(set(re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)"
                                    r"(?: Backward)? (?:using|on) (\w+)", text)))
    seq = sorted(set(re.findall(r"Seq Scan on (\w+)", text)))
    found.append(f"indexes: {', '.join(indexes) or 'none'}; BitmapOr: {'BitmapOr' in text};"
                 f" seq scans: {', '.join(seq) or 'none'}")
    found += [ln.strip() for ln in lines if "Buffers:" in ln][:1]
    for n, line in enumerate(lines):  # does each scan of a scope read one user, or the tenant?
        scan = re.search(r"Index(?: Only)? Scan (?:using|on) (\w+)(?: on (events|memories))?",
                         line)
        if scan and scan[1].startswith(("events_", "memories_")) and "pkey" not in scan[1]:
            cond = next((ln.strip() for ln in lines[n + 1:n + 4] if "Index Cond" in ln), "")
            rows = re.search(r"rows=([\d.]+) loops", line)
            found.append(f"  {scan[1]}: {cond} -> {rows[1] if rows else '?'} rows")
    parts = []
    for n, line in enumerate(lines[:-1]):
        name = line.strip()
        if name.startswith(("CTE ", "InitPlan", "SubPlan")):
            match = _ACTUAL.search(lines[n + 1])
            if match:
                node = lines[n + 1].strip().removeprefix("->").split("  (")[0].strip()
                depth = len(line) - len(line.lstrip())
                below = []
                for deeper in lines[n + 1:]:
                    if len(deeper) - len(deeper.lstrip()) <= depth:
                        break
                    below.append(deeper)
                if re.search(r"Group Key: t(?:_\d+)?\.lexeme", "\n".join(below)):
                    node += ": the query words' document frequencies (BM25 idf)"
                parts.append((float(match[1]) * int(match[2]), f"{name} ({node})"))
    found += [f"{ms:8.2f} ms  {what}" for ms, what in sorted(parts, reverse=True)[:8]]
    return found


class _Capture:
    """A pool that keeps the statement and arguments it is asked to run: the search's own
    code builds them, so the EXPLAIN runs exactly what the API runs."""

    sql = ""
    args: tuple[Any, ...] = ()

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        self.sql, self.args = sql, args
        return []


class _FixedVector:
    def __init__(self, vector: np.ndarray) -> None:
        self.vector = vector

    async def embed_query(self, text: str) -> np.ndarray:
        return self.vector


def sql_literal(value: Any, type_name: str) -> str:
    """An argument as a literal of EXECUTE, coerced to the statement's parameter type."""
    if value is None:
        return "NULL"
    if isinstance(value, np.ndarray):
        value = "[" + ",".join(f"{x:.7g}" for x in value) + "]"
    elif isinstance(value, bool):
        value = "true" if value else "false"
    elif isinstance(value, list | tuple):
        value = "{" + ",".join(str(x) for x in value) + "}"
    elif isinstance(value, datetime):
        value = value.isoformat()
    elif type_name.startswith("int"):
        value = int(value)  # as asyncpg sends a float to an integer parameter
    return "'" + str(value).replace("'", "''") + "'"


async def explain_one(conn: asyncpg.Connection, capture: _Capture, *, generic: bool
                      ) -> list[str]:
    """The plan's lines, from the second of two runs (the first warms the caches)."""
    statement, args = "EXPLAIN (ANALYZE, BUFFERS) " + capture.sql, capture.args
    if generic:
        types = [t.name for t in (await conn.prepare(capture.sql)).get_parameters()]
        await conn.execute(f"PREPARE bench_search ({', '.join(types)}) AS {capture.sql}")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        literals = ", ".join(map(sql_literal, capture.args, types))
        statement, args = f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_search({literals})", ()
    try:
        for _ in range(2):
            lines = [r[0] for r in await conn.fetch(statement, *args)]
    finally:
        if generic:
            await conn.execute("DEALLOCATE bench_search; RESET plan_cache_mode")
    return lines


async def explain(dsn: str, api_key: str, user: str, query: str, session: str,
                  show: bool) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the memory search (include_events) as the API runs it, on
    a pool like the API's: a test query planned for its arguments' values (as the API's pool
    does) and generically (PREPARE, then EXECUTE under force_generic_plan); and the search a
    context of `session` makes (its latest user turns as the query, 60 results)."""
    settings = Settings()
    pool = await db.create_pool(dsn, min_size=1, max_size=1, ef_search=settings.hnsw_ef_search)
    out: list[str] = []
    try:
        tenant = (await tenants.authenticate(pool, api_key)).tenant_id
        turns = await pool.fetch(
            "SELECT content FROM (SELECT * FROM events WHERE tenant_id = $1 AND session_id = $2"
            " ORDER BY created_at DESC, seq DESC LIMIT 6) r WHERE role = 'user'"
            " ORDER BY created_at DESC, seq DESC LIMIT 2", tenant, session)
        turns_query = " ".join(r["content"] for r in reversed(turns))
        vector = np.random.default_rng(3).standard_normal(settings.embedding_dim)
        vector = (vector / np.linalg.norm(vector)).astype(np.float32)
        asks = (("test query, custom plan", query, 10, False),
                ("test query, generic plan", query, 10, True),
                (f"a context's query ({len(turns_query.split())} words), limit 60",
                 turns_query, 60, False))
        for label, text, limit, generic in asks:
            capture = _Capture()
            await recall.search(
                capture, _FixedVector(vector), settings,  # type: ignore[arg-type]
                tenant_id=tenant, params=recall.RecallQuery(
                    query=text, reader=Scope(user_id=user), events=True, limit=limit))
            async with pool.acquire() as conn:
                lines = await explain_one(conn, capture, generic=generic)
            out.append(f"EXPLAIN (ANALYZE, BUFFERS) of the memory search, {label}:")
            out += ["  " + ln for ln in plan_summary(lines)]
            if show:
                out += lines
    finally:
        await pool.close()
    return out


# the run ----------------------------------------------------------------------------------


def print_table(figures: Sequence[Figure], baseline: dict[str, float]) -> None:
    print("| figure | n | p50 ms | p95 ms | server sql p50 ms | vs healthz p50 | target | note |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for f in figures:
        if not f.ms:
            print(f"| {f.name} | 0 | - | - | - | - | {f.target} | {f.note} |")
            continue
        p50 = pct(f.ms, 50)
        base = next((b for mode, b in baseline.items() if mode in f.name), None)
        ratio = f"{p50 / base:.1f}x" if base and "healthz" not in f.name else "-"
        server = f"{pct(f.server_ms, 50):.1f}" if f.server_ms else "-"
        print(f"| {f.name} | {len(f.ms)} | {p50:.1f} | {pct(f.ms, 95):.1f} | {server} |"
              f" {ratio} | {f.target} | {f.note} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=1000, help="users of the big tenant")
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the big tenant")
    parser.add_argument("--memories", type=int, default=100_000,
                        help="memories of the big tenant")
    parser.add_argument("--samples", type=int, default=300, help="timed requests per figure")
    parser.add_argument("--searchable", type=int, default=30, help="writes timed in part 2")
    parser.add_argument("--skip-scale", action="store_true", help="parts 1 and 2 only")
    parser.add_argument("--show-plan", action="store_true", help="print the whole EXPLAIN")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--connections", type=int, default=2,
                        help="connections loading at once (default: one per core of 2)")
    args = parser.parse_args()
    per_session = args.events // (args.users * SESSIONS_PER_USER)
    big = Shape(users=args.users, sessions=SESSIONS_PER_USER, events=per_session,
                memories=args.memories // args.users, tenant_wide=50)
    if not args.skip_scale and (per_session < 1 or big.memories < 1):
        parser.error("--events must be at least 50 per user and --memories 1 per user")

    texts = sentences()
    writes_text, found_text = texts[:20_000], texts[20_000:]
    queries = test_queries(QUERIES)
    print(f"{len(texts):,} SciFact sentences, {len(queries)} test queries; {load()}", flush=True)
    figures: list[Figure] = []
    notes: list[str] = []
    baseline: dict[str, float] = {}
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="memmill-memory-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, port)
        try:
            url = f"http://127.0.0.1:{port}"
            key = wait_for_api(url, data_dir)
            dsn = json.loads((data_dir / "runtime.json").read_text())["database_url"]
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                              timeout=120) as http:
                until(lambda: http.get("/readyz").status_code == 200, time.perf_counter(),
                      timeout_s=180, interval_s=0.5)
                # The worker's model loads on its first job: not part of any figure.
                timed(http.post, "/v1/sessions/warm/events", params={"wait": 60},
                      json={"scope": {"user_id": "warm"},
                            "events": batch_of(writes_text, 19_000, "warm")})
                for paced, label, offset in ((True, "idle", 0), (False, "burst", 8000)):
                    wait_idle(dsn)
                    print(f"part 1, {label}: {load()}", flush=True)
                    health, write = measure_writes(http, writes_text, samples=args.samples,
                                                   warmup=30, paced=paced, label=label,
                                                   offset=offset)
                    figures += [health, write]
                    baseline[health.name.split("(")[1].rstrip(")")] = pct(health.ms, 50)
                drained = wait_idle(dsn)
                notes.append(f"after the burst the worker drained its backlog in {drained:.0f}s")
                print(f"part 2: {load()}", flush=True)
                found, lines = measure_searchable(http, dsn, found_text,
                                                  samples=args.searchable)
                figures += found
                notes += lines
            if not args.skip_scale:
                print(f"part 3, load: {load()}", flush=True)
                big_key, lines = asyncio.run(load_scale(dsn, texts, big, args.connections))
                notes += lines
                for line in lines:
                    print(line, flush=True)
                wait_idle(dsn)
                user = f"u{args.users // 2}"
                sessions = [f"{user}-s{s}" for s in range(min(QUERIES, big.sessions))]
                print(f"part 3, requests: {load()}", flush=True)
                with httpx.Client(base_url=url, timeout=120,
                                  headers={"Authorization": f"Bearer {big_key}"}) as http:
                    figures += measure_scale(http, user, queries, sessions,
                                             rounds=-(-args.samples // len(queries)))
                notes.append(f"scale requests ran at {load()}")
                notes += asyncio.run(explain(dsn, big_key, user, queries[0], sessions[0],
                                             args.show_plan))
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=60)

    print()
    python = os.path.relpath(sys.executable)
    print(f"    {' '.join([sys.executable if python.startswith('..') else python, *sys.argv])}")
    print(f"    at the end: {load()}; {os.cpu_count()} cores")
    print()
    print_table(figures, baseline)
    print()
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
