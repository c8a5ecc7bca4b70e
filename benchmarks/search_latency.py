"""Search latency: memmill's search against the bare SQL floor, on BEIR SciFact grown to N parts.

For each size N (default 10,000 then 100,000 parts) one tenant holds exactly N parts: the
SciFact abstracts split as memmill splits them (11,444 parts), repeated under new item ids
until there are N, each repeat's vectors perturbed (Gaussian noise, sigma 0.02 a component,
renormalized) so that HNSW never meets exact duplicates. Item number n carries the tag
shard=s{n % 100:02}, so the filter {"shard": "s07"} keeps 1% of the rows. The rows are
COPYed into the database of a real `memmill up` (temporary data directory), the HNSW index is
built once after the load, then, over the SciFact test queries (limit 10), at concurrency 1
and 8 (asyncio tasks sharing one pool or one HTTP client), p50/p95/p99 and queries/s of:

- **function**: `pipeline.search.search` in this process, query embeddings cached, on a pool
  that plans generically, as the API's search pool does;
- **HTTP**: `POST /v1/search` end to end, after a warm-up pass filled the API's query LRU;
- **floor**: hand-written statements on the same table: RRF of HNSW top 100 and full-text
  top 100 (1/(60+rank) terms), top 10, the figure memmill must stay within 1.5x of, sent as
  is (Postgres plans it for each call), and the same on the generic-plan pool; HNSW top 10
  alone; full-text top 10 alone;

for hybrid, hybrid with the 1% tag filter, and fts. This machine's speed drifts over seconds
and minutes, so at concurrency 1 the targets take turns query by query (each on a different
query at a time), and at concurrency 8 each runs alone, the targets alternating round by
round. Also: the query embedding time uncached
(the model) and cached (LRU hit); Recall@10 of filtered semantic search against exact filtered
kNN in numpy; and the p50 per size, with 1M parts extrapolated unless measured.

The part vectors come from the real model, encoded once and kept in ~/.cache/memmill-bench/
(about 5 minutes on 2 idle cores the first time, far longer on busy ones), never in the
repository.

With --neighbour-parts N a second tenant first gets N parts of the same corpus, so that the
measured tenant shares its tables and indexes the way a hosted tenant does.

    .venv/bin/python benchmarks/search_latency.py [--sizes 10000,100000] [--queries 300]
        [--rounds 2] [--port 8793] [--neighbour-parts N]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue` (torch imports
# it). Putting the repository root first instead also makes `benchmarks.ingest` importable, so
# memmill is started and the corpus read exactly as the ingest benchmark does (see retrieval.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import asyncio
import hashlib
import json
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np
from pgvector.asyncpg import register_vector

from benchmarks.ingest import load_corpus, load_model, start_memmill, wait_for_api
from pipeline import db, tenants, text_stats
from pipeline import search as search_mod
from pipeline.items import content_hash
from pipeline.providers.embeddings import QueryCache, get_embedder
from pipeline.reindex import model_key
from pipeline.settings import Settings
from pipeline.stages.analyze import split_text

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "beir" / "scifact"
CACHE_DIR = Path.home() / ".cache" / "memmill-bench"
NOISE_SIGMA = 0.02
SHARDS, SHARD = 100, 7
FILTER = {"shard": f"s{SHARD:02d}"}
LIMIT = 10
LANES = (1, 8)
ISSUE = "issue, same machine, 100k parts: floor RRF p50 3.9 / p99 10.5 ms, HNSW top 10 p50 2.0 ms"

FLOOR_RRF = """
WITH vec AS (
    SELECT id, row_number() OVER (ORDER BY distance) AS rank
    FROM (SELECT id, embedding <=> $2 AS distance FROM parts
          WHERE tenant_id = $1 ORDER BY embedding <=> $2 LIMIT 100) v
), fts AS (
    SELECT id, row_number() OVER (ORDER BY score DESC) AS rank
    FROM (SELECT id, ts_rank_cd(tsv, query) AS score
          FROM parts, websearch_to_tsquery('english', $3) query
          WHERE tenant_id = $1 AND tsv @@ query ORDER BY score DESC LIMIT 100) f
)
SELECT coalesce(vec.id, fts.id) AS id,
       coalesce(1.0 / (60 + vec.rank), 0) + coalesce(1.0 / (60 + fts.rank), 0) AS score
FROM vec FULL OUTER JOIN fts ON vec.id = fts.id
ORDER BY score DESC LIMIT 10"""
FLOOR_HNSW = "SELECT id FROM parts WHERE tenant_id = $1 ORDER BY embedding <=> $2 LIMIT 10"
FLOOR_FTS = """SELECT id FROM parts, websearch_to_tsquery('english', $2) query
WHERE tenant_id = $1 AND tsv @@ query ORDER BY ts_rank_cd(tsv, query) DESC LIMIT 10"""
HNSW_INDEX = "CREATE INDEX parts_embedding ON parts USING hnsw (embedding vector_cosine_ops)"
# memmill's own full-text index is keyed by tenant and word (migration 0007), which the
# floor's `tsv @@ query` cannot use: the floor gets the plain word index it was written for
# (migration 0001's, before 0007 replaced it). memmill's statement has no `tsv @@`, so this
# index is the floor's alone.
FLOOR_TEXT_INDEX = "CREATE INDEX IF NOT EXISTS bench_floor_tsv ON parts USING gin (tsv)"
ITEM_COLUMNS = ["tenant_id", "id", "kind", "title", "tags", "content_hash", "version", "status",
                "created_at", "updated_at"]
Row = tuple[Any, ...]
PART_COLUMNS = ["tenant_id", "item_id", "version", "position", "text", "content_hash",
                "embedding"]


class Corpus:
    """SciFact's parts, their vectors, and the deterministic repeats that grow it to N parts.

    Part g (0-based, in load order) is part g % P of repeat g // P; repeat 0 keeps the model's
    vectors, repeat r > 0 adds noise seeded by r, so every size and the exact kNN below see
    the same vectors without keeping N of them in memory."""

    def __init__(self, docs: list[dict[str, str]], texts: list[str], doc_of: list[int],
                 position: list[int], vectors: np.ndarray) -> None:
        self.docs, self.texts, self.vectors = docs, texts, vectors
        self.doc_of, self.position = np.array(doc_of), np.array(position)
        self.part_hashes = [content_hash(t) for t in texts]
        self.doc_hashes = [content_hash(d["content"]) for d in docs]
        self._repeat: tuple[int, np.ndarray] | None = None

    @property
    def size(self) -> int:
        return len(self.texts)

    def item_id(self, repeat: int, doc: int) -> str:
        return f"{self.docs[doc]['id']}/r{repeat}"

    def shards(self, repeat: int) -> np.ndarray:
        """Each part's shard number: its item's number (repeat * docs + doc) modulo 100."""
        return (repeat * len(self.docs) + self.doc_of) % SHARDS

    def repeat_vectors(self, repeat: int) -> np.ndarray:
        if self._repeat is None or self._repeat[0] != repeat:
            vectors = self.vectors
            if repeat:
                noise = np.random.default_rng(repeat).normal(0, NOISE_SIGMA, vectors.shape)
                vectors = vectors + noise.astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            self._repeat = (repeat, vectors)
        return self._repeat[1]

    def rows(self, tenant: int, lo: int, hi: int) -> tuple[list[Row], list[Row]]:
        """COPY records for parts lo..hi-1, and for the items whose first part is among them."""
        stamp = datetime.now(UTC)  # one timestamp, so recency ties and never reorders
        items: list[tuple[Any, ...]] = []
        parts: list[tuple[Any, ...]] = []
        for repeat in range(lo // self.size, (hi - 1) // self.size + 1):
            base = repeat * self.size
            vectors, shards = self.repeat_vectors(repeat), self.shards(repeat)
            for i in range(max(lo, base) - base, min(hi, base + self.size) - base):
                doc, position = int(self.doc_of[i]), int(self.position[i])
                item_id = self.item_id(repeat, doc)
                if position == 0:
                    tags = json.dumps({"shard": f"s{shards[i]:02d}"})
                    items.append((tenant, item_id, "text", self.docs[doc]["title"], tags,
                                  self.doc_hashes[doc], 1, "ready", stamp, stamp))
                parts.append((tenant, item_id, 1, position, self.texts[i], self.part_hashes[i],
                              vectors[i]))
        return items, parts


def load_scifact() -> Corpus:
    docs = load_corpus(10**9)
    settings = Settings()
    texts: list[str] = []
    doc_of: list[int] = []
    position: list[int] = []
    for n, doc in enumerate(docs):
        for part in split_text(doc["content"], max_words=settings.part_max_words,
                               overlap_words=settings.part_overlap_words):
            texts.append(part.text)
            doc_of.append(n)
            position.append(part.position)
    return Corpus(docs, texts, doc_of, position, part_vectors(texts, settings))


def part_vectors(texts: list[str], settings: Settings) -> np.ndarray:
    """The model's vectors for the parts, from the cache when these exact texts were encoded
    before: encoding 11k parts takes minutes, the measurements seconds."""
    digest = hashlib.sha256(settings.embedding_model.encode())
    for text in texts:
        digest.update(text.encode() + b"\0")
    path = CACHE_DIR / f"scifact-parts-{digest.hexdigest()[:16]}.npy"
    if path.exists():
        return np.load(path)
    print(f"encoding {len(texts)} parts with the model (once; cached in {path})", flush=True)
    model = load_model(os.cpu_count() or 1)
    chunks = []
    for start in range(0, len(texts), 2000):
        chunks.append(model.encode(texts[start:start + 2000], normalize_embeddings=True,
                                   batch_size=settings.embedding_batch_size,
                                   show_progress_bar=False).astype(np.float32))
        print(f"  {start + len(chunks[-1])}/{len(texts)}", flush=True)
    vectors = np.concatenate(chunks)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def load_queries(limit: int) -> list[str]:
    """The test queries (those judged in qrels/test.tsv), in the qrels' order."""
    texts = {}
    with (DATA / "queries.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            raw = json.loads(line)
            texts[raw["_id"]] = raw["text"]
    ids = [row.split("\t")[0] for row in (DATA / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    return [texts[i] for i in dict.fromkeys(ids)][:limit]


async def grow(dsn: str, corpus: Corpus, tenant: int, have: int, want: int) -> tuple[float, float]:
    """COPY parts have..want-1 (and their items) with the HNSW index dropped, then build it
    again in one pass: inserting 100k vectors one by one into the graph is far slower."""
    conn = await asyncpg.connect(dsn)
    try:
        await register_vector(conn)
        started = time.perf_counter()
        await conn.execute("DROP INDEX IF EXISTS parts_embedding")
        items, parts = corpus.rows(tenant, have, want)
        await conn.copy_records_to_table("items", records=items, columns=ITEM_COLUMNS)
        await conn.copy_records_to_table("parts", records=parts, columns=PART_COLUMNS)
        loaded = time.perf_counter()
        await conn.execute("SET maintenance_work_mem = '1GB'")
        await conn.execute(HNSW_INDEX)
        indexed = time.perf_counter()
        await conn.execute("VACUUM ANALYZE parts")
        await conn.execute("VACUUM ANALYZE items")
        return loaded - started, indexed - loaded
    finally:
        await conn.close()


@dataclass
class Stats:
    p50: float
    p95: float
    p99: float
    qps: float

    @classmethod
    def of(cls, latencies_ms: list[float], wall_s: float) -> Stats:
        p50, p95, p99 = np.percentile(latencies_ms, [50, 95, 99])
        return cls(float(p50), float(p95), float(p99), len(latencies_ms) / wall_s)

    def cells(self) -> str:
        return f"{self.p50:7.2f} {self.p95:7.2f} {self.p99:7.2f} {self.qps:7.1f}"


Call = Callable[[int], Awaitable[Any]]  # runs query number i


async def run_lanes(call: Call, count: int, lanes: int) -> tuple[list[float], float]:
    """Every query once, `lanes` at a time; each query's latency (ms) and the wall time (s)."""
    latencies: list[float] = []
    pending = iter(range(count))

    async def lane() -> None:
        for i in pending:  # one shared iterator: each lane takes the next query when free
            started = time.perf_counter()
            await call(i)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(lanes)))
    return latencies, time.perf_counter() - started


async def take_turns(calls: dict[str, Call], count: int) -> dict[str, tuple[list[float], float]]:
    """Every query once through every target, one call at a time, the targets taking turns:
    at step s target k runs query (s + k·count/targets) % count. A slow second of this shared
    machine then falls on all targets alike, and no target follows another on the query whose
    pages that one has just brought into the CPU's caches. Each target's latencies (ms), and
    their sum as its wall time (s)."""
    stride = max(1, count // len(calls))
    latencies: dict[str, list[float]] = {name: [] for name in calls}
    for step in range(count):
        for k, (name, call) in enumerate(calls.items()):
            started = time.perf_counter()
            await call((step + k * stride) % count)
            latencies[name].append((time.perf_counter() - started) * 1000)
    return {name: (times, sum(times) / 1000) for name, times in latencies.items()}


async def measure(targets: dict[str, Call], count: int, rounds: int,
                  results: dict[tuple[str, int], Stats | str]) -> None:
    """Each target at each concurrency: one at a time, taking turns query by query (see
    take_turns); concurrently, each target alone, alternating round by round, so a slow
    minute falls on all of them. A target that fails its first query is reported with the
    reason instead of timed."""
    live: dict[str, Call] = {}
    for name, call in targets.items():
        try:
            await call(0)
            live[name] = call
        except Exception as exc:  # noqa: BLE001 - reported, and the rest still runs
            for lanes in LANES:
                results[(name, lanes)] = f"not run: {type(exc).__name__}: {str(exc)[:150]}"
    samples: dict[tuple[str, int], tuple[list[float], float]] = {}

    def add(key: tuple[str, int], latencies: list[float], wall: float) -> None:
        before = samples.get(key, ([], 0.0))
        samples[key] = (before[0] + latencies, before[1] + wall)

    for _ in range(rounds):
        for name, (latencies, wall) in (await take_turns(live, count)).items():
            add((name, 1), latencies, wall)
        for name, call in live.items():
            for lanes in LANES[1:]:
                add((name, lanes), *await run_lanes(call, count, lanes))
    for key, (latencies, wall) in samples.items():
        results[key] = Stats.of(latencies, wall)


def filtered_params(query: str, mode: str) -> search_mod.SearchParams:
    """SearchParams with the 1% tag filter."""
    return search_mod.SearchParams(query=query, mode=mode, limit=LIMIT,
                                   filters=search_mod.SearchFilters(tags=dict(FILTER)))


async def refresh_text_stats(pool: asyncpg.Pool, tenant: int) -> str:
    """Recount the words' document frequencies (BM25's idf) before measuring: the workers'
    sweeper would do it during the first seconds of the runs, and until then every query word
    counts as rare, so the full-text side ranks far more parts."""
    started = time.perf_counter()
    while await text_stats.refresh(pool, tenant) is None:  # a sweeper holds it: wait, redo
        await asyncio.sleep(0.5)
    return f", word statistics {time.perf_counter() - started:.1f} s"


def exact_top(corpus: Corpus, size: int, queries: np.ndarray, shard: int | None) -> list[set]:
    """The true top 10 (item id, position) per query by cosine over all `size` parts (or only
    the shard's), repeat by repeat so that 1M parts never sit in memory at once."""
    best_scores = np.empty((len(queries), 0), dtype=np.float32)
    best_ids = np.empty((len(queries), 0), dtype=np.int64)
    for repeat in range(-(-size // corpus.size)):
        count = min(corpus.size, size - repeat * corpus.size)
        ids = np.arange(count) + repeat * corpus.size
        vectors = corpus.repeat_vectors(repeat)[:count]
        if shard is not None:
            keep = corpus.shards(repeat)[:count] == shard
            ids, vectors = ids[keep], vectors[keep]
        scores = np.concatenate([best_scores, queries @ vectors.T], axis=1)
        ids = np.concatenate([best_ids, np.broadcast_to(ids, (len(queries), len(ids)))], axis=1)
        top = np.argsort(-scores, axis=1)[:, :LIMIT]
        best_scores = np.take_along_axis(scores, top, axis=1)
        best_ids = np.take_along_axis(ids, top, axis=1)
    return [{(corpus.item_id(int(g) // corpus.size, int(corpus.doc_of[g % corpus.size])),
              int(corpus.position[g % corpus.size])) for g in row} for row in best_ids]


async def recall(search: Callable[[int, bool], Awaitable[Any]], corpus: Corpus, size: int,
                 vectors: np.ndarray) -> dict[str, str]:
    """Recall@10 of semantic search against exact kNN, without and with the filter; the
    filtered results must also all carry the filter's tag."""
    report = {}
    for filtered in (False, True):
        label = "semantic + 1% filter" if filtered else "semantic, no filter"
        try:
            outcomes = [await search(i, filtered) for i in range(len(vectors))]
        except Exception as exc:  # noqa: BLE001 - reported, and the rest still runs
            report[label] = f"not run: {type(exc).__name__}: {str(exc)[:150]}"
            continue
        truth = exact_top(corpus, size, vectors, SHARD if filtered else None)
        found = [{(r["item"]["id"], r["position"]) for r in o.results} for o in outcomes]
        value = np.mean([len(f & t) / LIMIT for f, t in zip(found, truth, strict=True)])
        wrong = sum(r["item"]["tags"] != FILTER for o in outcomes for r in o.results)
        short = sum(len(o.results) < LIMIT for o in outcomes)
        report[label] = (f"Recall@10 {value:.3f}" + (f"; {wrong} results outside the filter"
                         if filtered else "") + f"; {short} queries with < {LIMIT} results")
    return report


def stats_table(title: str, results: dict[tuple[str, int], Stats | str], names: list[str]) -> None:
    columns = f"{'p50':>7} {'p95':>7} {'p99':>7} {'q/s':>7}"
    print(f"\n{title}\n  {'':32}" + "  ".join(f"{f'concurrency {n}':^31}" for n in LANES))
    print(f"  {'(ms; queries/s)':32}" + "  ".join(columns for _ in LANES))
    for name in names:
        cells = [results.get((name, lanes), "missing") for lanes in LANES]
        if isinstance(cells[0], str):
            print(f"  {name:32}{cells[0]}")
        else:
            print(f"  {name:32}" + "  ".join(c.cells() for c in cells))  # type: ignore[union-attr]


def extrapolate(sizes: list[int], p50s: list[float], target: int) -> str:
    """Two least-squares fits in ln N through the measured p50s: log-linear (a + b ln N, how
    a graph index grows) and power law (c N^e, how a scan grows). Through two sizes both are
    exact; they differ only in how they continue, which brackets the guess."""
    if len(sizes) < 2:
        return "needs two sizes"
    x = np.log(sizes)
    b, a = np.polyfit(x, p50s, 1)
    e, c = np.polyfit(x, np.log(p50s), 1)
    return (f"{a + b * np.log(target):6.2f} (a+b·lnN) / {np.exp(c) * target ** e:6.2f} "
            f"(c·N^{e:.2f})")


def report_size(size: int, load: tuple[float, float], results: dict, recalls: dict[str, str],
                tables: dict[str, list[str]]) -> None:
    print(f"\n=== {size:,} parts (COPY {load[0]:.1f} s, HNSW build {load[1]:.1f} s); ms ===")
    for title, names in tables.items():
        stats_table(title, results, names)
    print("\nfiltered correctness (function, mode semantic, vs exact kNN in numpy):")
    for label, text in recalls.items():
        print(f"  {label:32}{text}")


def stat(results: dict, name: str, lanes: int = 1) -> Stats | None:
    value = results.get((name, lanes))
    return value if isinstance(value, Stats) else None


def summary(all_results: dict[int, dict], recalls: dict[int, dict[str, str]],
            embedding: dict[str, Stats], measured: list[int]) -> None:
    print("\n=== summary (goals from the issue in brackets) ===")
    for size in measured:
        results = all_results[size]
        fn, floor = stat(results, "function hybrid"), stat(results, "floor RRF")
        generic = stat(results, "floor RRF, generic plan")
        flt, http = stat(results, "function hybrid + 1% filter"), stat(results, "HTTP hybrid")
        print(f"{size:,} parts:")
        if fn and floor:
            print(f"  function / floor, c=1: p50 {fn.p50:.2f} / {floor.p50:.2f} ms ="
                  f" {fn.p50 / floor.p50:.2f}x, p99 {fn.p99:.2f} / {floor.p99:.2f} ms ="
                  f" {fn.p99 / floor.p99:.2f}x  [<= 1.5x]")
        if fn and generic:
            print(f"  function / floor on the generic-plan pool, c=1:"
                  f" p50 {fn.p50 / generic.p50:.2f}x, p99 {fn.p99 / generic.p99:.2f}x")
        for lanes in LANES[1:]:
            fn8, floor8 = stat(results, "function hybrid", lanes), stat(results, "floor RRF", lanes)
            if fn8 and floor8:
                print(f"  function / floor, c={lanes}: p50 {fn8.p50 / floor8.p50:.2f}x,"
                      f" p99 {fn8.p99 / floor8.p99:.2f}x, q/s {fn8.qps:.0f} vs {floor8.qps:.0f}")
        if http:
            print(f"  HTTP hybrid p50, c=1, cached query embedding: {http.p50:.2f} ms  [<= 10 ms]")
        if fn and flt:
            print(f"  filtered / unfiltered function p50, c=1: {flt.p50 / fn.p50:.2f}x  [<= 2x]")
        else:
            print("  filtered / unfiltered: filtered runs did not run (see above)")
        print(f"  filtered {recalls[size].get('semantic + 1% filter', '?')}  [Recall@10 >= 0.95]")
    for name, value in embedding.items():
        print(f"{name}: p50 {value.p50:.2f}, p95 {value.p95:.2f},"
              f" p99 {value.p99:.2f} ms")
    print(ISSUE)
    print("(the floor's full-text side, as the issue defines it, keeps parts holding every query"
          " word: websearch_to_tsquery)")
    names = ["function hybrid", "function hybrid + 1% filter", "function fts", "floor RRF",
             "floor HNSW top 10", "HTTP hybrid"]
    header = "".join(f"{s:>10,}" for s in measured)
    extra = "" if 1_000_000 in measured else "   1,000,000 EXTRAPOLATED from the measured sizes"
    print(f"\ngrowth of c=1 p50 (ms){'':12}{header}{extra}")
    for name in names:
        p50s = [s.p50 if (s := stat(all_results[n], name)) else float("nan") for n in measured]
        line = "".join(f"{p:10.2f}" for p in p50s)
        if not extra or any(np.isnan(p50s)):
            print(f"  {name:32}{line}")
        else:
            print(f"  {name:32}{line}   {extrapolate(measured, p50s, 1_000_000)}")


async def embedding_times(embedder: Any, queries: list[str]) -> dict[str, Stats]:
    """The model on queries a fresh cache has not seen, then the same queries as LRU hits."""
    cache = QueryCache(embedder, size=max(1024, len(queries)))

    async def one(i: int) -> None:
        await cache.embed_query(queries[i])

    return {label: Stats.of(*await run_lanes(one, len(queries), 1))
            for label in ("query embedding, uncached (the model)",
                          "query embedding, cached (LRU hit)")}


@dataclass
class Targets:
    """What the runs call: query i through the search function, a floor statement or HTTP."""

    pool: asyncpg.Pool
    search_pool: asyncpg.Pool
    cache: QueryCache
    http: httpx.AsyncClient
    settings: Settings
    tenant: int
    queries: list[str]
    vectors: np.ndarray

    def function(self, mode: str, filtered: bool = False) -> Call:
        async def call(i: int) -> Any:
            query = self.queries[i]
            params = (filtered_params(query, mode) if filtered else
                      search_mod.SearchParams(query=query, mode=mode, limit=LIMIT))
            return await search_mod.search(self.search_pool, self.cache, self.settings,
                                           tenant_id=self.tenant, params=params,
                                           filter_pool=self.pool)
        return call

    def floor(self, sql: str, *use: str, generic: bool = False) -> Call:
        pool = self.search_pool if generic else self.pool

        async def call(i: int) -> Any:
            given = {"vector": self.vectors[i], "text": self.queries[i]}
            return await pool.fetch(sql, self.tenant, *(given[u] for u in use))
        return call

    def post(self, mode: str, filtered: bool = False) -> Call:
        async def call(i: int) -> Any:
            body: dict[str, Any] = {"query": self.queries[i], "mode": mode, "limit": LIMIT}
            if filtered:
                body["filters"] = {"tags": FILTER}
            answer = await self.http.post("/v1/search", json=body)
            if answer.status_code != 200:
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
            return answer.json()
        return call


async def benchmark(args: argparse.Namespace, corpus: Corpus, queries: list[str],
                    dsn: str, url: str, key: str) -> None:
    settings = Settings()
    embedder = get_embedder(settings)
    await embedder.warm_up()
    embedding: dict[str, Stats] = {}
    cache = QueryCache(embedder, size=max(1024, len(queries)))
    vectors = np.stack([await cache.embed_query(q) for q in queries])
    pool = await db.create_pool(dsn, min_size=max(LANES), max_size=max(LANES) + 2,
                                ef_search=settings.hnsw_ef_search)
    search_pool = await db.create_pool(dsn, min_size=max(LANES), max_size=max(LANES) + 2,
                                       ef_search=settings.hnsw_ef_search, generic_plans=True)
    http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                             timeout=60, limits=httpx.Limits(max_connections=2 * max(LANES)))
    tenant = await pool.fetchval("SELECT id FROM tenants WHERE name = $1", settings.default_tenant)
    await pool.execute("UPDATE embedding_index SET model = $1", model_key(settings))
    await pool.execute(FLOOR_TEXT_INDEX)
    run = Targets(pool, search_pool, cache, http, settings, tenant, queries, vectors)
    in_process = {
        "floor RRF": run.floor(FLOOR_RRF, "vector", "text"),
        "floor RRF, generic plan": run.floor(FLOOR_RRF, "vector", "text", generic=True),
        "function hybrid": run.function("hybrid"),
        "function hybrid + 1% filter": run.function("hybrid", filtered=True),
        "function fts": run.function("fts"),
        "floor HNSW top 10": run.floor(FLOOR_HNSW, "vector"),
        "floor FTS top 10": run.floor(FLOOR_FTS, "text"),
    }
    over_http = {"HTTP hybrid": run.post("hybrid"),
                 "HTTP hybrid + 1% filter": run.post("hybrid", filtered=True),
                 "HTTP fts": run.post("fts")}
    all_results: dict[int, dict] = {}
    recalls: dict[int, dict[str, str]] = {}
    have = 0
    try:
        if args.neighbour_parts:
            # Another tenant's parts in the same tables: the plans must still read only the
            # measured tenant's postings and rows.
            neighbour = await tenants.ensure_tenant(pool, "neighbour")
            await grow(dsn, corpus, neighbour, 0, args.neighbour_parts)
            await refresh_text_stats(pool, neighbour)
            print(f"\na second tenant holds {args.neighbour_parts:,} parts", flush=True)
        for size in args.sizes:
            print(f"\nloading {size - have:,} parts (to {size:,})…", flush=True)
            load = await grow(dsn, corpus, tenant, have, size)
            have = size
            stats_note = await refresh_text_stats(pool, tenant)
            # The API's searches bump access counts, which feed the final score: start clean.
            await pool.execute("UPDATE items SET access_count = 0, accessed_at = NULL"
                               " WHERE tenant_id = $1 AND access_count > 0", tenant)
            print(f"  COPY {load[0]:.1f} s, HNSW build {load[1]:.1f} s{stats_note}; measuring…",
                  flush=True)
            results: dict[tuple[str, int], Stats | str] = {}
            for name in ("floor RRF", "function hybrid"):  # warm the buffers, untimed
                await run_lanes(in_process[name], len(queries), max(LANES))
            await measure(in_process, len(queries), args.rounds, results)
            print("  function and floor done; recall…", flush=True)
            recalls[size] = await recall(
                lambda i, filtered: run.function("semantic", filtered)(i), corpus, size, vectors)
            print("  recall done; HTTP…", flush=True)
            warm = Stats.of(*await run_lanes(run.post("hybrid"), len(queries), 1))
            if len(all_results) == 0:  # the API's LRU was empty: every query paid the model
                embedding["HTTP hybrid c=1, query embedding not cached"] = warm
            await measure(over_http, len(queries), args.rounds, results)
            all_results[size] = results
            report_size(size, load, results, recalls[size],
                        {"search function (in process) and floor (same pool)": [*in_process],
                         "HTTP end to end (POST /v1/search)": [*over_http]})
        # Last, when no load or index build of ours shares the cores with the model.
        embedding |= await embedding_times(embedder, queries)
    finally:
        await http.aclose()
        await pool.close()
        await search_pool.close()
    summary(all_results, recalls, embedding, args.sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000",
                        help="comma-separated part counts, measured in increasing order")
    parser.add_argument("--queries", type=int, default=300, help="SciFact test queries to use")
    parser.add_argument("--rounds", type=int, default=2,
                        help="passes over the queries per target and concurrency")
    parser.add_argument("--port", type=int, default=8793)
    parser.add_argument("--neighbour-parts", type=int, default=0,
                        help="first load this many parts into a second tenant")
    args = parser.parse_args()
    args.sizes = sorted({int(s) for s in args.sizes.split(",")})
    if args.neighbour_parts < 0:
        parser.error("--neighbour-parts must be 0 or more")

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", args.port)) == 0:
            sys.exit(f"port {args.port} is in use (another memmill?); pass --port")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading bar too
    queries = load_queries(args.queries)
    corpus = load_scifact()
    print(f"{len(corpus.docs)} SciFact abstracts, {corpus.size} parts, {len(queries)} queries;"
          f" sizes {', '.join(f'{s:,}' for s in args.sizes)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="memmill-search-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, args.port, 1)
        try:
            url = f"http://127.0.0.1:{args.port}"
            key = wait_for_api(url, data_dir)
            dsn = json.loads((data_dir / "runtime.json").read_text())["database_url"]
            asyncio.run(benchmark(args, corpus, queries, dsn, url, key))
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=60)


if __name__ == "__main__":
    main()
