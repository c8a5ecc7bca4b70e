"""Upkeep at scale: a prune and consolidation run over one tenant of N memories (default
1,000,000) among 10, how long each step takes, and what it does to the other tenants' search.

One run of a real `memmill up` (embedded Postgres + pgvector, Valkey, the API and one worker)
in a temporary data directory on a free port, as benchmarks/ingest.py starts it (with the
consolidation schedule moved to 1 January, so that no scheduled run joins in). Ten tenants,
each with an admin key, made in the database as `memmill keys create` does:

- **the big tenant**: N memories over U users (default 1,000 of 1,000 memories each), COPYed
  straight into Postgres (the data loading is setup, timed apart from the run). Synthetic but
  shaped like a live tenant's: 384-dim unit vectors (random, so unrelated memories are at
  cosine ~0 +- 0.05), of which ~3% are rewordings of an earlier memory of the same user
  (cosine 0.93-0.985: merged) and ~5% are related to one (cosine 0.86-0.90: linked), several
  of them often around one memory; content of 6-14 words from a word list of 200 (a rewording
  changes one word of its original, a related memory half of them); created over 90 days,
  rows landing in time order with every user's interleaved; types and layers mixed: 3%
  `conversation`, 2% `tool` and 8% `group` layer memories expire 30, 14 and 60 days after
  they were written (the default lifetimes), so ~6% are expired by now for the prune, and
  the unexpired `group` ones unused for 30 days decay (the other layers are permanent, and
  neither decays nor expires); the rest `observation` (what extraction writes); 0.5% pinned;
  confidence 0.5-0.95 with 2% at the floor (0.2), access counts mostly 0 and some up to ~20,
  a few with uses since the last decay; each memory its `add` history row and one of its
  user's S sessions (default 10, ended, half with a summary: the link step writes an
  observation of 200 of them a run); `embedding_model` the server's model key. The tenant's policy
  caps memories at 2N (`--memory-cap` to change), since a tenant that holds N memories has a
  cap above N: the default cap (50,000) would make the prune remove 100,000 of them a run.
- **9 small tenants**: 10 users x 200 memories each (`--small-users`, `--small-memories`):
  2,000 sentences of the BEIR SciFact abstracts (40-160 characters), the same in each tenant
  but dealt to its users differently, embedded by the real model (the server's, encoded once
  here and kept in ~/.cache/memmill-bench/), so that their searches work as a real tenant's:
  the query is embedded by the API (a SciFact test query, its vector cached by the API's
  query LRU after a warm-up pass) and matched on both the vector and the words.

Measured: `POST /v1/memories/search` (limit 10) of the small tenants, round robin over tenants,
users and queries, from C concurrent clients (default 4) at a fixed total rate (default 20/s:
a client sends its next search at its next turn, or at once when it is late):

1. **idle**: S searches (default 400) with nothing else of memmill's running (other
   processes of this machine may be: every phase prints the load average);
2. **during the run**: `POST /v1/consolidation/runs {"steps": ["prune", "merge", "decay",
   "link"]}` with the big tenant's key, searches going on until its last step is done; p50/p99
   over the whole run and per step, and the p99 ratio during/idle (target <= 1.5x);
3. **idle after**: once the jobs the run left are done, S searches again (how much the
   machine drifted, and what the run left behind: checkpoints, autovacuum).

Each step's time comes from the job ledger: `started_at` (its claim) to the commit of its
transaction, which this script sees by polling the ledger every 0.25 s (`finished_at` is the
transaction's `now()`, the start of the write: it splits a step into reading and computing,
and writing). Where the time went: every second, pg_stat_activity's busy sessions (the
statement named after sql/queries when it is one, its state and wait; autovacuum; a
checkpoint in progress), counted per phase and step, and the WAL written and checkpoints
begun in each; the CPU seconds the worker, the API and Postgres used during the run, and the
worker's peak RSS; with `--explain`, EXPLAIN (ANALYZE, BUFFERS) of the steps' big reads
after the run. `--worker-nice N` renices the worker's threads before the run (an experiment:
does CPU priority keep the search within its target?).

    .venv/bin/python benchmarks/upkeep_scale.py [--memories 1000000] [--users 1000]
        [--sessions 10] [--small-users 10] [--small-memories 200] [--searches 400]
        [--clients 4] [--rate 20] [--queries 100] [--memory-cap N] [--job-timeout S]
        [--worker-nice N] [--explain] [--port N]
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
import contextlib
import hashlib
import itertools
import json
import re
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np
import psutil
from pgvector.asyncpg import register_vector

from benchmarks.ingest import load_model, wait_for_api
from benchmarks.memory_latency import free_port, load, pct, sentences, test_queries
from pipeline import tenants
from pipeline.db import Q
from pipeline.settings import Settings, model_key

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = Path.home() / ".cache" / "memmill-bench"
DIM = 384
AGENT = "assistant-1"
DAY_S = 86_400.0
SPAN_DAYS = 90
STEPS = ("prune", "merge", "decay", "link")
TARGET = 1.5
CHUNK = 20_000  # rows per COPY
POLL_S = 0.25
SAMPLE_S = 1.0
APP_NAME = "upkeep-bench"
_WORD_LIST = """
apple anchor archive autumn badge bakery balcony banner basket battery beacon bicycle blanket
border bottle bracket breeze bridge bucket budget cabin cable camera candle canvas canyon carpet
castle cellar chapter charger cherry circuit citrus clinic closet cloud coffee comet compass
concert cookie copper cottage counter crystal cursor cushion dentist desert diary dinner doctor
dragon drawer engine envelope festival fiddle filter forest fountain garage garden garlic glacier
guitar hammer harbour helmet highway holiday honey hotel island jacket journal kettle kitchen
ladder lagoon lantern laptop lemon letter library lizard lobster locker magnet mango marble
market meadow medal meeting melody mirror monday monitor mountain museum napkin needle noodle
notebook oasis office orchard oven paddle palace pancake paper parcel pasta pebble pencil pepper
piano pillow pilot planet pocket poetry potato printer puzzle quartz rabbit radio rainbow recipe
ribbon river rocket saddle salmon sandal scarf school scooter shadow shelter signal silver sketch
soccer sofa spinach spoon stadium station summit sunset sweater table tablet teacher tennis
ticket tiger timber tomato tractor trumpet tunnel turtle umbrella valley velvet violin voyage
wallet walnut window winter yogurt zebra prefers visited booked moved started finished likes
dislikes bought sold planned cancelled moved reads writes avoids needs wants tuesday friday
"""
WORDS = tuple(dict.fromkeys(_WORD_LIST.split()))
# The default lifetimes of the impermanent layers (Settings.memory_lifetime_days), in days.
LIFETIMES = {"conversation": 30.0, "tool": 14.0, "group": 60.0}
TYPES = ("fact", "preference", "event", "decision", "project_state", "procedure",
         "self_assessment")
TYPE_SHARE = (0.42, 0.16, 0.12, 0.10, 0.10, 0.06, 0.04)
MEMORY_COLUMNS = ["tenant_id", "id", "user_id", "agent_id", "session_id", "visibility", "type",
                  "content", "confidence", "source", "pinned", "observed_at", "version",
                  "created_at", "updated_at", "access_count", "accessed_at", "content_hash",
                  "embedding", "embedding_model", "layer", "expires_at", "accesses_seen"]
HISTORY_COLUMNS = ["tenant_id", "memory_id", "version", "operation", "agent_id", "new_content",
                   "at"]
SESSION_COLUMNS = ["tenant_id", "id", "user_id", "agent_id", "visibility", "created_at",
                   "first_event_at", "last_event_at", "last_write_at", "events", "ended_at",
                   "summary"]
Row = tuple[Any, ...]


# the big tenant's data ----------------------------------------------------------------------


def near_duplicates(rng: np.random.Generator, user: np.ndarray, starts: np.ndarray,
                    position: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which memories reword (3%) or relate to (5%) an earlier one of their user: their row
    numbers, the row each derives from, and whether it is a rewording. Row 0 of each user is
    an original; several derived memories often share one, which makes clusters."""
    draw = rng.random(len(user))
    reword = (draw < 0.03) & (position > 0)
    derived = np.flatnonzero((draw < 0.08) & (position > 0))
    base = np.flatnonzero(~((draw < 0.08) & (position > 0)))
    before = np.searchsorted(base, derived)  # originals before it, in the whole table
    first = np.searchsorted(base, starts[user[derived]])  # its user's first original
    anchor = base[first + (rng.random(len(derived)) * (before - first)).astype(np.int64)]
    return derived, anchor, reword[derived]


def unit_vectors(rng: np.random.Generator, n: int, derived: np.ndarray, anchor: np.ndarray,
                 reworded: np.ndarray) -> np.ndarray:
    """Random unit vectors, a derived one at an exact cosine from its original: 0.93-0.985
    for a rewording (above the merge similarity), 0.86-0.90 for a related one (linked)."""
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cosine = np.where(reworded, rng.uniform(0.93, 0.985, len(derived)),
                      rng.uniform(0.86, 0.90, len(derived))).astype(np.float32)
    for lo in range(0, len(derived), 50_000):  # in blocks: no N x 384 temporaries
        d, a, c = derived[lo:lo + 50_000], anchor[lo:lo + 50_000], cosine[lo:lo + 50_000]
        g = vectors[d] - np.sum(vectors[d] * vectors[a], axis=1, keepdims=True) * vectors[a]
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        vectors[d] = c[:, None] * vectors[a] + np.sqrt(1 - c * c)[:, None] * g
    return vectors


def word_rows(rng: np.random.Generator, n: int, derived: np.ndarray, anchor: np.ndarray,
              reworded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each memory's words (indexes into WORDS) and how many it has: a rewording changes one
    word of its original's, a related memory the first seven."""
    words = rng.integers(0, len(WORDS), (n, 14), dtype=np.int16)
    length = rng.integers(6, 15, n)
    words[derived], length[derived] = words[anchor], length[anchor]
    swap = rng.integers(0, 6, len(derived))
    words[derived[reworded], swap[reworded]] = rng.integers(0, len(WORDS), int(reworded.sum()))
    words[derived[~reworded], :7] = rng.integers(0, len(WORDS), (int((~reworded).sum()), 7))
    return words, length


class BigTenant:
    """Every memory of the big tenant as columns (numpy), in time order over all users; `rows`
    makes COPY records of a slice of them. Deterministic for a given shape."""

    def __init__(self, *, memories: int, users: int, sessions: int, now: datetime) -> None:
        rng = np.random.default_rng(20_251_127)
        self.n, self.now = memories, now
        per_user = np.full(users, memories // users)
        per_user[: memories % users] += 1
        self.user = np.repeat(np.arange(users), per_user)
        starts = np.concatenate([[0], np.cumsum(per_user)[:-1]])
        position = np.arange(memories) - np.repeat(starts, per_user)
        # Within a user, row order is time order: what a memory derives from is older.
        ages = rng.uniform(3600, SPAN_DAYS * DAY_S, memories)
        self.age_s = ages[np.lexsort((-ages, self.user))]
        derived, anchor, reworded = near_duplicates(rng, self.user, starts, position)
        self.reworded, self.related_n = int(reworded.sum()), int((~reworded).sum())
        self.vectors = unit_vectors(rng, memories, derived, anchor, reworded)
        self.words, self.length = word_rows(rng, memories, derived, anchor, reworded)
        self.session = np.minimum(position * sessions // np.repeat(per_user, per_user),
                                  sessions - 1)
        self._attributes(rng)
        # Rows land in the table in time order, every user's memories interleaved.
        self.order = np.argsort(-self.age_s, kind="stable")

    def _attributes(self, rng: np.random.Generator) -> None:
        """Layer, type, confidence and use of each memory."""
        n = self.n
        layer_draw = rng.random(n)
        self.pinned = layer_draw < 0.005
        self.layer = np.select(
            [self.pinned, layer_draw < 0.035, layer_draw < 0.055, layer_draw < 0.135],
            ["pinned", "conversation", "tool", "group"], "observation")
        self.type = np.where(self.layer == "conversation", "conversation",
                             rng.choice(TYPES, n, p=TYPE_SHARE))
        confidence = np.round(rng.uniform(0.5, 0.95, n), 2)
        self.confidence = np.where(rng.random(n) < 0.02, 0.2, confidence)
        used = rng.random(n) < 0.3
        self.access_count = np.where(used, rng.geometric(0.25, n), 0)
        fresh = used & (rng.random(n) < 0.15)  # used since the last decay
        self.accesses_seen = np.where(
            fresh, np.maximum(0, self.access_count - rng.integers(1, 6, n)), self.access_count)
        self.accessed_age_s = self.age_s * rng.random(n)
        lifetimes = np.full(n, np.inf)
        for layer, days in LIFETIMES.items():
            lifetimes[self.layer == layer] = days
        self.expired = int(np.sum(self.age_s > lifetimes * DAY_S))

    def content(self, i: int) -> str:
        return " ".join(WORDS[w] for w in self.words[i, :self.length[i]])

    def rows(self, tenant_id: int, key: str, lo: int, hi: int) -> tuple[list[Row], list[Row]]:
        """COPY records of memories lo..hi-1 (in load order) and of their history rows."""
        memories: list[Row] = []
        history: list[Row] = []
        for i in self.order[lo:hi]:
            i = int(i)
            user = f"u{self.user[i]}"
            created = self.now - timedelta(seconds=float(self.age_s[i]))
            layer = str(self.layer[i])
            lifetime = LIFETIMES.get(layer)
            expires = created + timedelta(days=lifetime) if lifetime else None
            count = int(self.access_count[i])
            accessed = (self.now - timedelta(seconds=float(self.accessed_age_s[i]))
                        if count else None)
            text = self.content(i)
            memory_id = uuid.UUID(bytes=hashlib.md5(f"{tenant_id}/{i}".encode()).digest(),
                                  version=4)
            memories.append((
                tenant_id, memory_id, user, AGENT, f"{user}-s{self.session[i]}", "user",
                str(self.type[i]), text, float(self.confidence[i]), "extraction",
                bool(self.pinned[i]), created, 1, created, created, count, accessed,
                hashlib.sha256(text.encode()).hexdigest(), self.vectors[i], key, layer,
                expires, int(self.accesses_seen[i])))
            history.append((tenant_id, memory_id, 1, "add", AGENT, text, created))
        return memories, history

    def session_rows(self, tenant_id: int) -> list[Row]:
        """Each user's sessions, ended, spanning the times of the memories written in them."""
        first: dict[tuple[int, int], float] = {}
        last: dict[tuple[int, int], float] = {}
        for u, s, age in zip(self.user.tolist(), self.session.tolist(), self.age_s.tolist(),
                             strict=True):
            first[(u, s)] = max(first.get((u, s), 0.0), age)
            last[(u, s)] = min(last.get((u, s), float("inf")), age)
        rows: list[Row] = []
        for (u, s), oldest in first.items():
            began = self.now - timedelta(seconds=oldest + 600)
            ended = self.now - timedelta(seconds=last[(u, s)] - 60)
            summary = (f"u{u} talked about {WORDS[(u * 31 + s) % len(WORDS)]} and "
                       f"{WORDS[(u * 17 + s * 7) % len(WORDS)]}") if (u + s) % 2 else None
            rows.append((tenant_id, f"u{u}-s{s}", f"u{u}", AGENT, "user", began, began, ended,
                         ended, 20, ended, summary))
        return rows


# setup --------------------------------------------------------------------------------------


def start_memmill(data_dir: Path, port: int,
                  job_timeout_s: float | None) -> subprocess.Popen[bytes]:
    """benchmarks/ingest.py's start, with no scheduled consolidation during the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
    env.update(MEMMILL_LOG_LEVEL="WARNING", MEMMILL_MEMORY_SCHEDULE="0 3 1 1 *")
    if job_timeout_s is not None:
        env["MEMMILL_JOB_TIMEOUT_S"] = str(job_timeout_s)
    return subprocess.Popen(
        [sys.executable, "-m", "memmill", "up", "--data-dir", str(data_dir), "--port", str(port),
         "--workers", "1"],
        env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=open(data_dir / "up.log", "wb"),
        start_new_session=True)


@dataclass
class Tenant:
    name: str
    id: int
    key: str


async def connect(dsn: str, **settings: str) -> asyncpg.Connection:
    """A connection of this script's, named so that its own statements are not sampled."""
    return await asyncpg.connect(dsn, server_settings={
        "application_name": APP_NAME, "jit": "off", **settings})


async def make_tenants(dsn: str, small: int) -> tuple[Tenant, list[Tenant]]:
    conn = await connect(dsn)
    try:
        made = []
        for name in ["bench-big", *(f"bench-small-{n}" for n in range(1, small + 1))]:
            tenant_id = await tenants.ensure_tenant(conn, name)
            key = tenants.new_key()
            await tenants.add_key(conn, tenant_id, key, name="bench")
            made.append(Tenant(name, tenant_id, key))
        return made[0], made[1:]
    finally:
        await conn.close()


async def loader(dsn: str) -> asyncpg.Connection:
    conn = await connect(dsn, synchronous_commit="off", maintenance_work_mem="512MB")
    await register_vector(conn)
    return conn


async def load_big(dsn: str, big: BigTenant, tenant: Tenant, key: str,
                   connections: int) -> float:
    """COPY the big tenant's memories and history, chunk by chunk on `connections`
    connections (each its own server process); its sessions last. Returns seconds."""
    started = time.perf_counter()
    conns = [await loader(dsn) for _ in range(connections)]
    chunks = list(range(0, big.n, CHUNK))
    done = 0

    async def copy(conn: asyncpg.Connection, share: Sequence[int]) -> None:
        nonlocal done
        for lo in share:
            memories, history = await asyncio.to_thread(big.rows, tenant.id, key, lo,
                                                        min(lo + CHUNK, big.n))
            async with conn.transaction():
                await conn.copy_records_to_table("memories", records=memories,
                                                 columns=MEMORY_COLUMNS)
                await conn.copy_records_to_table("memory_history", records=history,
                                                 columns=HISTORY_COLUMNS)
            done += len(memories)
            if done // CHUNK % 10 == 0 or done == big.n:
                rate = done / (time.perf_counter() - started)
                print(f"  {done:,} of {big.n:,} memories in {time.perf_counter() - started:.0f}s"
                      f" ({rate:,.0f}/s; {load()})", flush=True)

    try:
        await asyncio.gather(*(copy(c, chunks[i::connections]) for i, c in enumerate(conns)))
        await conns[0].copy_records_to_table("sessions", records=big.session_rows(tenant.id),
                                             columns=SESSION_COLUMNS)
    finally:
        for conn in conns:
            await conn.close()
    return time.perf_counter() - started


def small_vectors(texts: list[str]) -> np.ndarray:
    """The model's vectors of the small tenants' memories, from the cache when these texts
    were encoded before."""
    settings = Settings()
    digest = hashlib.sha256(settings.embedding_model.encode())
    for text in texts:
        digest.update(text.encode() + b"\0")
    path = CACHE_DIR / f"upkeep-small-{digest.hexdigest()[:16]}.npy"
    if path.exists():
        return np.load(path)
    print(f"  encoding {len(texts):,} sentences with the model (once; cached in {path})",
          flush=True)
    model = load_model(os.cpu_count() or 1)
    vectors = model.encode(texts, normalize_embeddings=True, show_progress_bar=False,
                           batch_size=settings.embedding_batch_size).astype(np.float32)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


async def load_small(dsn: str, small: list[Tenant], texts: list[str], vectors: np.ndarray,
                     users: int, key: str, now: datetime) -> None:
    """The sentences in every small tenant, dealt out to `users` users (differently in each
    tenant), created over 90 days, with their `add` history."""
    conn = await loader(dsn)
    try:
        for n, tenant in enumerate(small):
            memories: list[Row] = []
            history: list[Row] = []
            for i in range(len(texts)):
                user = f"u{(i + i // users * n) % users}"
                created = now - timedelta(days=SPAN_DAYS * ((i * 7919 + n) % 1000) / 1000)
                memory_id = uuid.uuid4()
                memories.append((
                    tenant.id, memory_id, user, AGENT, None, "user", TYPES[i % len(TYPES)],
                    texts[i], 0.8, "extraction", False, created, 1, created, created, 0, None,
                    hashlib.sha256(texts[i].encode()).hexdigest(), vectors[i], key,
                    "observation", None, 0))
                history.append((tenant.id, memory_id, 1, "add", AGENT, texts[i], created))
            await conn.copy_records_to_table("memories", records=memories,
                                             columns=MEMORY_COLUMNS)
            await conn.copy_records_to_table("memory_history", records=history,
                                             columns=HISTORY_COLUMNS)
    finally:
        await conn.close()


SIZES_SQL = """
SELECT pg_total_relation_size('memories') AS memories,
       pg_total_relation_size('memory_history') AS memory_history,
       pg_total_relation_size('memory_relations') AS memory_relations,
       pg_total_relation_size('upkeep_changes') AS upkeep_changes,
       (SELECT avg(pg_column_size(before)) FROM upkeep_changes WHERE action = 'expire')
           AS prune_snapshot
"""


async def sizes_after(dsn: str) -> str:
    conn = await connect(dsn)
    try:
        r = await conn.fetchrow(SIZES_SQL)
    finally:
        await conn.close()
    snapshot = f"{r['prune_snapshot']:,.0f}" if r["prune_snapshot"] is not None else "-"
    return (f"tables after the run (with indexes and TOAST): memories"
            f" {r['memories'] / 2**30:.2f} GiB, memory_history"
            f" {r['memory_history'] / 2**20:,.0f} MiB, memory_relations"
            f" {r['memory_relations'] / 2**20:,.0f} MiB, upkeep_changes"
            f" {r['upkeep_changes'] / 2**20:,.0f} MiB (a pruned memory's undo snapshot:"
            f" {snapshot} bytes on average)")


def log_warnings(data_dir: Path) -> list[str]:
    """What memmill up logged at WARNING and above (the level the benchmark runs it at)."""
    found: Counter[str] = Counter()
    for line in (data_dir / "up.log").read_text(errors="replace").splitlines():
        if "WARNING" in line or "ERROR" in line:
            found[re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+(\.\d+)?", "#", line)[-160:]] += 1
    if not found:
        return ["memmill up logged no warnings"]
    return ["memmill up's warnings and errors (ids and numbers as #):",
            *(f"  {n:>4} x {line}" for line, n in found.most_common(8))]


async def finish_load(dsn: str) -> tuple[float, dict[str, int]]:
    started = time.perf_counter()
    conn = await connect(dsn)
    try:
        await conn.execute("VACUUM (ANALYZE) memories, memory_history, sessions")
        await conn.execute("CHECKPOINT")
        sizes = dict(await conn.fetchrow(
            "SELECT pg_total_relation_size('memories') AS memories,"
            " pg_total_relation_size('memory_history') AS memory_history"))
    finally:
        await conn.close()
    return time.perf_counter() - started, sizes


async def set_cap(url: str, tenant: Tenant, cap: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 headers={"Authorization": f"Bearer {tenant.key}"}) as http:
        answer = await http.put("/v1/memory-policy", json={"memory_cap": cap})
        answer.raise_for_status()


# searching ----------------------------------------------------------------------------------


@dataclass
class Sample:
    at: float  # time.time() when sent
    ms: float
    ok: bool


@dataclass
class Searcher:
    """Round robin over the small tenants, their users and the queries, at a fixed rate."""

    url: str
    small: list[Tenant]
    users: int
    queries: list[str]
    clients: int
    rate: float
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    def body(self, i: int) -> tuple[Tenant, dict[str, Any]]:
        tenant = self.small[i % len(self.small)]
        user = f"u{(i // len(self.small)) % self.users}"
        query = self.queries[(i * 7) % len(self.queries)]
        return tenant, {"query": query, "scope": {"user_id": user}, "limit": 10}

    async def run(self, *, count: int | None = None,
                  stop: asyncio.Event | None = None) -> list[Sample]:
        """`count` searches, or until `stop` is set."""
        samples: list[Sample] = []
        start = time.perf_counter()
        interval_s = 1 / self.rate
        limits = httpx.Limits(max_connections=self.clients)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as http:

            async def client(c: int) -> None:
                n = c
                while (count is None or n < count) and not (stop and stop.is_set()):
                    due = start + n * interval_s
                    if due > time.perf_counter():
                        await asyncio.sleep(due - time.perf_counter())
                    tenant, body = self.body(self.sent + n)
                    at, t0 = time.time(), time.perf_counter()
                    answer = await http.post("/v1/memories/search", json=body, headers={
                        "Authorization": f"Bearer {tenant.key}"})
                    ms = (time.perf_counter() - t0) * 1000
                    ok = answer.status_code == 200
                    if not ok and len(self.errors) < 5:
                        self.errors.append(f"{answer.status_code} {answer.text[:200]}")
                    samples.append(Sample(at, ms, ok))
                    n += self.clients

            await asyncio.gather(*(client(c) for c in range(self.clients)))
        self.sent += len(samples)
        return samples

    async def warm(self) -> None:
        """Every query once (the API's LRU keeps its vector), then every tenant and user."""
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as http:
            for i, query in enumerate(self.queries):
                tenant = self.small[i % len(self.small)]
                answer = await http.post("/v1/memories/search", json={
                    "query": query, "scope": {"user_id": "u0"}}, headers={
                    "Authorization": f"Bearer {tenant.key}"})
                answer.raise_for_status()
        await self.run(count=len(self.small) * self.users * 2)


# watching the run ---------------------------------------------------------------------------


@dataclass
class StepTime:
    kind: str
    status: str = "waiting"
    attempts: int = 0
    started: float | None = None  # epoch s, the claim (last attempt)
    write_from: float | None = None  # the write transaction's now()
    committed: float | None = None  # first poll that saw it done, or the next step's claim
    error: str | None = None


@dataclass
class Phases:
    """When each phase ran (epoch s) and each step of the run."""

    steps: dict[str, StepTime] = field(default_factory=lambda: {s: StepTime(s) for s in STEPS})
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)

    def of(self, at: float) -> str:
        for name, (start, end) in self.spans.items():
            if start <= at < end and name != "run":
                return name
        if "run" in self.spans and self.spans["run"][0] <= at < self.spans["run"][1]:
            for name, s in self.steps.items():
                if s.started is not None and s.started <= at < (s.committed or float("inf")):
                    return name
            return "between steps"
        return "other"


ACTIVITY_SQL = """
SELECT backend_type, state, wait_event_type, wait_event, query
FROM pg_stat_activity
WHERE application_name <> 'upkeep-bench'
  AND ((backend_type IN ('client backend', 'parallel worker') AND state <> 'idle'
        AND datname = current_database())
       OR backend_type = 'autovacuum worker'
       OR (backend_type = 'checkpointer' AND wait_event IS DISTINCT FROM 'CheckpointerMain'))
"""
# The WAL insert position moves as WAL is written (pg_stat_wal counts a statement's only
# when its transaction ends).
COUNTERS_SQL = """
SELECT extract(epoch FROM clock_timestamp()) AS at,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint AS wal,
       (SELECT num_timed + num_requested FROM pg_stat_checkpointer) AS checkpoints
"""
SHOWN_CHARS = 900  # pg_stat_activity keeps the first 1024 bytes of a statement


def query_names() -> dict[str, str]:
    """Named queries (sql/queries) by their text, to name what pg_stat_activity shows."""
    return {" ".join(sql.split())[:SHOWN_CHARS]: name for name, sql in Q.items()}


def label(row: asyncpg.Record, names: dict[str, str]) -> str:
    if row["backend_type"] in ("autovacuum worker", "checkpointer"):
        what = row["query"] if row["backend_type"] == "autovacuum worker" else "checkpoint"
        return f"{row['backend_type']}: {what} [{row['wait_event']}]"
    text = " ".join((row["query"] or "").split())
    name = names.get(text[:SHOWN_CHARS])
    if name is None and len(text) > 200:  # cut short by pg_stat_activity
        name = next((n for k, n in names.items() if k.startswith(text[:SHOWN_CHARS])), None)
    what = name or (text[:70] + ("..." if len(text) > 70 else ""))
    wait = f" [{row['wait_event_type']}:{row['wait_event']}]" if row["wait_event"] else ""
    parallel = " (parallel worker)" if row["backend_type"] == "parallel worker" else ""
    return f"{row['state']}: {what}{wait}{parallel}"


@dataclass
class Sampler:
    """Every second, from the first idle searches to the last: what Postgres's sessions are
    doing, WAL written and checkpoints so far, and the worker's RSS."""

    dsn: str
    worker: list[psutil.Process]
    activity: list[tuple[float, str]] = field(default_factory=list)
    counters: list[tuple[float, int, int]] = field(default_factory=list)
    peak_rss: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        names = query_names()
        conn = await connect(self.dsn)
        try:
            while not self.stop.is_set():
                now = time.time()
                for r in await conn.fetch(ACTIVITY_SQL):
                    self.activity.append((now, label(r, names)))
                c = await conn.fetchrow(COUNTERS_SQL)
                self.counters.append((float(c["at"]), int(c["wal"]), int(c["checkpoints"])))
                for p in self.worker:
                    with contextlib.suppress(psutil.Error):
                        self.peak_rss = max(self.peak_rss, p.memory_info().rss)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), SAMPLE_S)
        finally:
            await conn.close()

    def between(self, start: float, end: float) -> tuple[int, int]:
        """WAL bytes written and checkpoints begun between two times (to a second)."""
        before = [c for c in self.counters if c[0] <= start] or self.counters[:1]
        after = [c for c in self.counters if c[0] <= end] or self.counters[:1]
        return after[-1][1] - before[-1][1], after[-1][2] - before[-1][2]


JOBS_SQL = """
SELECT kind, status, attempts, extract(epoch FROM started_at) AS started,
       extract(epoch FROM finished_at) AS finished, last_error,
       extract(epoch FROM clock_timestamp()) AS now
FROM jobs WHERE tenant_id = $1 AND payload ->> 'run_id' = $2
"""
KIND_STEP = {"prune_memories": "prune", "merge_memories": "merge", "decay_memories": "decay",
             "link_memories": "link"}


async def watch(dsn: str, tenant: Tenant, run_id: str, phases: Phases,
                timeout_s: float) -> None:
    """Poll the run's jobs until the last is done, dead or cancelled."""
    conn = await connect(dsn)
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < timeout_s:
            for r in await conn.fetch(JOBS_SQL, tenant.id, run_id):
                s = phases.steps[KIND_STEP[r["kind"]]]
                if s.attempts and r["attempts"] > s.attempts:
                    print(f"  {s.kind}: attempt {r['attempts']} ({r['last_error']})", flush=True)
                s.status, s.attempts, s.error = r["status"], r["attempts"], r["last_error"]
                s.started = float(r["started"]) if r["started"] is not None else None
                if r["status"] == "done" and s.committed is None:
                    s.write_from, s.committed = float(r["finished"]), float(r["now"])
                    print(f"  {s.kind} done: {s.committed - s.started:.1f}s; {load()}",
                          flush=True)
            if all(s.status in ("done", "dead", "cancelled") for s in phases.steps.values()):
                break
            await asyncio.sleep(POLL_S)
        else:
            print(f"  the run did not finish within {timeout_s:.0f}s", flush=True)
    finally:
        await conn.close()
    # A step committed before the next one was claimed: a tighter bound than the poll.
    for s, after in itertools.pairwise(phases.steps.values()):
        if s.committed is not None and after.started is not None:
            s.committed = min(s.committed, after.started)


def processes(up: subprocess.Popen[bytes], data_dir: Path) -> dict[str, list[psutil.Process]]:
    """memmill up's processes by role: the worker, the API, Postgres (the postmaster, found by
    its data directory, and its backends), other (Valkey)."""
    found: dict[str, list[psutil.Process]] = {}
    mine = psutil.Process(up.pid).children(recursive=True)
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.name().startswith("postgres") and str(data_dir) in " ".join(p.cmdline()):
                mine += [p, *p.children(recursive=True)]
    for p in {p.pid: p for p in mine}.values():
        try:
            line = " ".join(p.cmdline())
            name = p.name()
        except psutil.Error:
            continue
        role = ("postgres" if "postgres" in name or "postgres" in line else
                "worker" if line.endswith(" worker") else
                "api" if line.endswith(" api") else "other")
        found.setdefault(role, []).append(p)
    return found


def renice(procs: Sequence[psutil.Process], nice: int) -> None:
    """Every thread of these processes at least this nice (Linux's nice is per thread)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for t in p.threads():
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, t.id,
                                   max(nice, os.getpriority(os.PRIO_PROCESS, t.id)))


def cpu_seconds(up: subprocess.Popen[bytes], data_dir: Path) -> dict[str, float]:
    """CPU seconds so far of each role's live processes (Postgres backends come and go: a
    backend that exited between two readings is missed, so it is a lower bound)."""
    used: dict[str, float] = {}
    for role, procs in processes(up, data_dir).items():
        for p in procs:
            try:
                t = p.cpu_times()
                used[role] = used.get(role, 0.0) + t.user + t.system
            except psutil.Error:
                continue
    me = psutil.Process().cpu_times()
    used["benchmark"] = me.user + me.system
    return used


async def wait_idle(dsn: str, timeout_s: float = 1800) -> float:
    """Seconds until no job is due or running."""
    started = time.perf_counter()
    conn = await connect(dsn)
    try:
        while await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'running'"
                                  " OR (status = 'queued' AND run_after <= now())"):
            if time.perf_counter() - started > timeout_s:
                break
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    return time.perf_counter() - started


# EXPLAIN ------------------------------------------------------------------------------------


async def explain(dsn: str, tenant: Tenant, key: str) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the reads merge/link (comparable) and decay (decay_plan)
    make, on the whole big tenant, as the worker's pool runs them (jit off)."""
    s = Settings()
    conn = await connect(dsn)
    out: list[str] = []
    try:
        await register_vector(conn)
        for name, args in (
                ("upkeep.comparable", (tenant.id, None, None, key)),
                ("upkeep.decay_plan", (tenant.id, None, None, s.memory_decay_idle_days,
                                       s.memory_decay_rate, s.memory_confidence_floor,
                                       s.memory_reinforce_uses, s.memory_reinforce_step))):
            lines = [r[0] for r in await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) " + Q[name], *args)]
            out.append(f"EXPLAIN (ANALYZE, BUFFERS) {name}, after the run:")
            out += ["  " + ln for ln in lines]
    finally:
        await conn.close()
    return out


# report -------------------------------------------------------------------------------------


def stats(samples: Sequence[Sample]) -> str:
    ms = [s.ms for s in samples if s.ok]
    if not ms:
        return f"{len(samples):>6}      -       -       -       -"
    return (f"{len(ms):>6} {pct(ms, 50):>7.1f} {pct(ms, 95):>7.1f} {pct(ms, 99):>7.1f} "
            f"{max(ms):>7.1f}")


def p99(samples: Sequence[Sample]) -> float:
    ms = [s.ms for s in samples if s.ok]
    return pct(ms, 99) if ms else float("nan")


def report_search(idle: list[Sample], during: list[Sample], after: list[Sample],
                  phases: Phases, loads: dict[str, list[float]]) -> list[str]:
    base = p99(idle)
    spans = ", ".join(f"{name} {' -> '.join(f'{x:.1f}' for x in v)}"
                      for name, v in loads.items())
    out = [f"small tenants' POST /v1/memories/search, ms (1-minute load average at the start"
           f" and end of each phase, from all of this machine's processes: {spans}):",
           f"  {'phase':<34} {'n':>6} {'p50':>7} {'p95':>7} {'p99':>7} {'max':>7}"
           f"  p99/idle (target <= {TARGET}x)"]

    def line(name: str, samples: Sequence[Sample], ratio: bool = True) -> None:
        r = p99(samples) / base if ratio and samples else None
        verdict = "" if r is None else f"  {r:.2f}x {'ok' if r <= TARGET else 'OVER'}"
        out.append(f"  {name:<34} {stats(samples)}{verdict}")

    line("idle, before the run", idle, ratio=False)
    line("during the run (all of it)", during)
    for step in [*STEPS, "between steps"]:
        part = [s for s in during if phases.of(s.at) == step]
        if part:
            line(f"  during {step}", part)
    line("idle, after the run", after)
    failed = sum(not s.ok for s in [*idle, *during, *after])
    if failed:
        out.append(f"  {failed} searches failed")
    return out


def report_run(phases: Phases, posted: float, run: dict[str, Any],
               sampler: Sampler) -> list[str]:
    out = ["the run, per step (s): queued = from the step before it committing (or the POST)"
           " to its claim; read+compute = claim to its write transaction; write = that"
           f" transaction to its commit (seen by polling every {POLL_S} s, or the next step's"
           " claim); WAL written meanwhile (by every process) and checkpoints begun",
           f"  {'step':<6} {'status':<9} {'attempts':>8} {'queued':>7} {'read+compute':>13}"
           f" {'write':>7} {'total':>7} {'WAL MiB':>8} {'ckpts':>6}"]
    previous = posted

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    for s in phases.steps.values():
        if s.started is None:
            out.append(f"  {s.kind:<6} {s.status:<9} {s.attempts:>8}")
            continue
        plan = (s.write_from - s.started) if s.write_from else None
        write = (s.committed - s.write_from) if s.committed and s.write_from else None
        total = (s.committed - s.started) if s.committed else None
        wal, ckpts = sampler.between(s.started, s.committed or time.time())
        out.append(f"  {s.kind:<6} {s.status:<9} {s.attempts:>8} {s.started - previous:>7.1f}"
                   f" {cell(plan):>13} {cell(write):>7} {cell(total):>7}"
                   f" {wal / 2**20:>8,.0f} {ckpts:>6}")
        if s.error:
            out.append(f"         last error: {s.error[:300]}")
        previous = s.committed or previous
    ends = [s.committed for s in phases.steps.values() if s.committed]
    if ends:
        out.append(f"  run total, POST to the last commit: {max(ends) - posted:.1f}s")
    out.append(f"  run status {run.get('status')}; counts: {json.dumps(run.get('counts'))}")
    out.append(f"  changes: {json.dumps(run.get('changes'))}")
    return out


def report_where(phases: Phases, sampler: Sampler, cpu: dict[str, float]) -> list[str]:
    out = ["where the time went: pg_stat_activity every second (non-idle client sessions and"
           " parallel workers, autovacuum, a checkpoint in progress), per phase; a sample is"
           " about a second of one session:"]
    by_phase: dict[str, Counter[str]] = {}
    for at, what in sampler.activity:
        by_phase.setdefault(phases.of(at), Counter())[what] += 1
    for name in ["idle before", *STEPS, "between steps", "drain", "idle after"]:
        if name in by_phase:
            seconds = ""
            if name in phases.spans:
                start, end = phases.spans[name]
                wal, ckpts = sampler.between(start, end)
                seconds = (f" ({end - start:.0f}s, WAL {wal / 2**20:,.0f} MiB, {ckpts}"
                           f" checkpoints)")
            out.append(f"  {name}{seconds}:")
            for what, n in by_phase[name].most_common(10):
                out.append(f"    {n:>5}  {what}")
    out.append("  CPU seconds used during the run: " + ", ".join(
        f"{role} {seconds:.1f}" for role, seconds in sorted(cpu.items())))
    out.append(f"  worker peak RSS: {sampler.peak_rss / 2**20:,.0f} MiB")
    return out


# the run ------------------------------------------------------------------------------------


async def setup(args: argparse.Namespace, url: str,
                dsn: str) -> tuple[Tenant, list[Tenant], list[str]]:
    """The ten tenants and their memories; what was loaded, and how long it took."""
    key = model_key(Settings())
    now = datetime.now(UTC)
    big_tenant, small = await make_tenants(dsn, 9)
    await set_cap(url, big_tenant, args.memory_cap or 2 * args.memories)
    print(f"setup: generating {args.memories:,} memories; {load()}", flush=True)
    mark = time.perf_counter()
    big = BigTenant(memories=args.memories, users=args.users, sessions=args.sessions, now=now)
    gen_s = time.perf_counter() - mark
    texts = [t for t in sentences() if len(t) <= 160][: args.small_users * args.small_memories]
    print(f"setup: the small tenants' {len(texts):,} sentences; {load()}", flush=True)
    vectors = small_vectors(texts)
    print(f"setup: loading; {load()}", flush=True)
    big_s = await load_big(dsn, big, big_tenant, key, args.connections)
    mark = time.perf_counter()
    await load_small(dsn, small, texts, vectors, args.small_users, key, now)
    small_s = time.perf_counter() - mark
    vacuum_s, sizes = await finish_load(dsn)
    lines = [
        f"big tenant: {args.memories:,} memories over {args.users:,} users, {big.reworded:,}"
        f" rewordings (cosine 0.93-0.985) and {big.related_n:,} related (0.86-0.90) of an"
        f" earlier memory, {big.expired:,} expired ({big.expired / args.memories:.1%}),"
        f" {args.users * args.sessions:,} sessions; memory cap"
        f" {args.memory_cap or 2 * args.memories:,}",
        f"small tenants: 9 x {args.small_users} users x {args.small_memories} memories"
        f" ({len(texts):,} SciFact sentences of 40-160 characters, the same in each tenant,"
        f" dealt to its users differently; real vectors)",
        f"setup (not measured): generated in {gen_s:.0f}s, big tenant COPYed in {big_s:.0f}s"
        f" ({args.memories / big_s:,.0f} memories/s with history, {args.connections}"
        f" connections), small in {small_s:.0f}s, VACUUM ANALYZE + CHECKPOINT {vacuum_s:.0f}s;"
        f" memories {sizes['memories'] / 2**30:.2f} GiB, memory_history"
        f" {sizes['memory_history'] / 2**30:.2f} GiB (with indexes and TOAST)"]
    for line in lines:
        print(line, flush=True)
    return big_tenant, small, lines


async def benchmark(args: argparse.Namespace, up: subprocess.Popen[bytes], data_dir: Path,
                    url: str, dsn: str) -> list[str]:
    big_tenant, small, lines = await setup(args, url, dsn)
    searcher = Searcher(url, small, args.small_users, test_queries(args.queries),
                        args.clients, args.rate)
    await wait_idle(dsn)
    await searcher.warm()
    phases = Phases()
    sampler = Sampler(dsn, processes(up, data_dir).get("worker", []))
    if args.worker_nice:
        renice(sampler.worker, args.worker_nice)
    sampling = asyncio.create_task(sampler.run())
    loads: dict[str, list[float]] = {}

    async def idle_phase(name: str) -> list[Sample]:
        print(f"{name} searches: {load()}", flush=True)
        loads[name] = [os.getloadavg()[0]]
        start = time.time()
        samples = await searcher.run(count=args.searches)
        phases.spans[name] = (start, time.time())
        loads[name].append(os.getloadavg()[0])
        print(f"  p50 {pct([s.ms for s in samples], 50):.1f} ms, p99 {p99(samples):.1f} ms",
              flush=True)
        return samples

    idle = await idle_phase("idle before")
    print(f"the run: {load()}", flush=True)
    stop = asyncio.Event()
    cpu_before = cpu_seconds(up, data_dir)
    async with httpx.AsyncClient(base_url=url, timeout=120, headers={
            "Authorization": f"Bearer {big_tenant.key}"}) as http:
        loads["during"] = [os.getloadavg()[0]]
        posted = time.time()
        answer = await http.post("/v1/consolidation/runs",
                                 json={"steps": list(STEPS), "dry_run": False})
        answer.raise_for_status()
        run_id = answer.json()["run_id"]
        during_task = asyncio.create_task(searcher.run(stop=stop))
        try:
            await watch(dsn, big_tenant, run_id, phases, args.run_timeout)
        finally:
            stop.set()
        during = await during_task
        ended = time.time()
        phases.spans["run"] = (posted, ended)
        loads["during"].append(os.getloadavg()[0])
        cpu_after = cpu_seconds(up, data_dir)
        cpu = {role: cpu_after.get(role, 0.0) - cpu_before.get(role, 0.0) for role in cpu_after}
        run = (await http.get(f"/v1/consolidation/runs/{run_id}")).json()
    drained_s = await wait_idle(dsn)
    phases.spans["drain"] = (ended, time.time())
    after = await idle_phase("idle after")
    sampler.stop.set()
    await sampling
    lines += ["", *report_search(idle, during, after, phases, loads), "",
              *report_run(phases, posted, run, sampler),
              f"  after the run, the jobs it left (the observations' embedding) took"
              f" {drained_s:.0f}s more", "  " + await sizes_after(dsn), "",
              *report_where(phases, sampler, cpu), *log_warnings(data_dir)]
    if searcher.errors:
        lines.append(f"search errors (first): {searcher.errors}")
    if args.explain:
        print(f"EXPLAIN: {load()}", flush=True)
        lines += ["", *await explain(dsn, big_tenant, model_key(Settings()))]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=1_000_000,
                        help="memories of the big tenant")
    parser.add_argument("--users", type=int, default=1000, help="users of the big tenant")
    parser.add_argument("--sessions", type=int, default=10, help="sessions per big-tenant user")
    parser.add_argument("--small-users", type=int, default=10, help="users per small tenant")
    parser.add_argument("--small-memories", type=int, default=200,
                        help="memories per small-tenant user")
    parser.add_argument("--searches", type=int, default=400, help="searches per idle figure")
    parser.add_argument("--clients", type=int, default=4, help="concurrent search clients")
    parser.add_argument("--rate", type=float, default=20.0, help="searches a second, in all")
    parser.add_argument("--queries", type=int, default=100, help="SciFact test queries used")
    parser.add_argument("--memory-cap", type=int, default=None,
                        help="the big tenant's memory cap (default: twice --memories)")
    parser.add_argument("--job-timeout", type=float, default=None,
                        help="MEMMILL_JOB_TIMEOUT_S (default: the server's, 600)")
    parser.add_argument("--worker-nice", type=int, default=0,
                        help="renice the worker's threads (an experiment; default: as is)")
    parser.add_argument("--run-timeout", type=float, default=7200,
                        help="seconds to wait for the run")
    parser.add_argument("--connections", type=int, default=2, help="connections loading")
    parser.add_argument("--explain", action="store_true",
                        help="EXPLAIN ANALYZE the steps' big reads after the run")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args()
    if args.memories < args.users or args.users < 1:
        parser.error("--memories must be at least --users (1 or more)")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # `memmill up` runs in a session of its own: on SIGTERM (a `timeout`), stop it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="memmill-upkeep-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, port, args.job_timeout)
        try:
            url = f"http://127.0.0.1:{port}"
            operator = wait_for_api(url, data_dir)
            dsn = json.loads((data_dir / "runtime.json").read_text())["database_url"]
            with httpx.Client(base_url=url, timeout=10,
                              headers={"Authorization": f"Bearer {operator}"}) as http:
                deadline = time.monotonic() + 180
                while http.get("/readyz").status_code != 200:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"not ready in 180 s; see {data_dir}/up.log")
                    time.sleep(0.5)
            lines = asyncio.run(benchmark(args, up, data_dir, url, dsn))
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=120)

    print()
    python = os.path.relpath(sys.executable)
    print(f"    {' '.join([sys.executable if python.startswith('..') else python, *sys.argv])}")
    print(f"    at the end: {load()}; {os.cpu_count()} cores;"
          f" whole benchmark {time.perf_counter() - started:.0f}s")
    print()
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
