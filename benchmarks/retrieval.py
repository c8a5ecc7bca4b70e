"""Search quality: BEIR SciFact test queries through memmill's own search API.

Figures for the same corpus and the same 300 test queries (fewer with `--limit`):

- **memmill fts / semantic / hybrid**: a real `memmill up` (as in benchmarks/ingest.py) in a
  temporary data directory, fed the abstracts through `POST /v1/items/batch` until every item is
  `ready` and its word statistics are counted, then each query sent to `POST /v1/search` once
  per mode with `limit` 100 and `group_by: item` (each abstract once, at its best part, as
  BEIR judges whole documents) and `track: false`, so that no query's results feed the use
  signal of the next. Every other option is the default a user gets; the hybrid row with RRF
  is the same search with `fusion: rrf`, and the first-page row the same with `limit` 10
  (nDCG@10 only), whose full-text side reads 50 postings where a page of 100 items reads
  1000. p50 is the median request time seen by the client, one request at a time;
- **dense exact**: the model memmill embeds with (all-MiniLM-L6-v2), on each whole abstract and
  each query, ranked by exact cosine with numpy: what the vector side could reach with no ANN
  index and no splitting. It runs before memmill starts, so they never share the cores.

Scores are nDCG@10 and Recall@100 as BEIR computes them (pytrec_eval), averaged over every test
query, a query with no result counting 0.

    .venv/bin/python benchmarks/retrieval.py [--limit N] [--no-reference] [--port 8792]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue` (torch imports
# it) when this script runs with the folder first on sys.path. Putting the repository root there
# instead removes the shadow and makes `benchmarks.ingest` importable (a namespace package), so
# the setup of memmill is ingest.py's own rather than a copy.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import csv
import gc
import json
import math
import signal
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import numpy as np

from benchmarks.ingest import ingest, load_corpus, load_model, start_memmill, wait_for_api

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = REPO_ROOT.parent / "shared" / "data" / "beir" / "scifact"
PREFIX = "scifact/"
# Row name -> the request's options besides the query.
RUNS: dict[str, dict[str, object]] = {
    "fts": {"mode": "fts"},
    "semantic": {"mode": "semantic"},
    "hybrid": {"mode": "hybrid"},
    "hybrid, fusion rrf": {"mode": "hybrid", "fusion": "rrf"},
    # The first page a user gets: its full-text side reads fewer postings (5 per result).
    "hybrid, first page (limit 10)": {"mode": "hybrid", "limit": 10},
}
SEARCH_LIMIT = 100  # the API's maximum; also the cut of Recall@100
REFERENCE = "dense exact (same model, numpy)"
ISSUE_FIGURES = ("issue figures (full corpus, nDCG@10/Recall@100): BM25 (bm25s) 0.657/0.876,"
                 " dense exact 0.645/0.925, RRF 0.684/0.955, keep 0.716/0.949;"
                 " goal nDCG@10 >= 0.73 and Recall@100 >= 0.96")

Qrels = dict[str, dict[str, int]]


def read_qrels(path: Path) -> Qrels:
    """Query id -> {doc id: grade}. Only positive grades are kept: trec_eval counts only those
    as relevant, so a zero grade would add nothing to nDCG and wrongly count in recall."""
    qrels: Qrels = {}
    with path.open(encoding="utf-8", newline="") as lines:
        rows = csv.reader(lines, delimiter="\t")
        next(rows)  # header: query-id, corpus-id, score
        for query_id, doc_id, grade in rows:
            if int(grade) > 0:
                qrels.setdefault(query_id, {})[doc_id] = int(grade)
    return qrels


def ndcg_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    """pytrec_eval's ndcg_cut: the grade itself as gain (not 2^grade - 1) and a log2(rank + 1)
    discount, over an ideal ranking of the judged documents, so BEIR's published figures
    compare. `ranked` must hold each doc once: a repeat would be credited twice."""
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(grade / math.log2(rank + 2) for rank, grade in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 100) -> float:
    """Share of the relevant docs found in the first k: how much a reranker on top could
    still reach, whatever the order."""
    if not relevant:
        return 0.0
    return len(set(ranked[:k]) & relevant.keys()) / len(relevant)


def unique_docs(item_ids: Sequence[str]) -> list[str]:
    """Parts -> docs: each doc at the rank of its best part, as BEIR judges whole documents."""
    return list(dict.fromkeys(item_id.removeprefix(PREFIX) for item_id in item_ids))


def mean_scores(runs: Mapping[str, Sequence[str]], qrels: Qrels) -> tuple[float, float]:
    """Means over every judged query, one missing from `runs` counting 0: BEIR averages over
    the queries that got results only, which would flatter a mode that returns none."""
    ndcg = [ndcg_at_k(runs.get(q, []), rel, 10) for q, rel in qrels.items()]
    recall = [recall_at_k(runs.get(q, []), rel, 100) for q, rel in qrels.items()]
    return statistics.fmean(ndcg), statistics.fmean(recall)


def load_queries(doc_ids: set[str]) -> tuple[dict[str, str], Qrels, int]:
    """Test queries whose relevant docs are all in the corpus used, their qrels, and how many
    test queries there are in all: on a subset, a query whose answer is missing can't be won."""
    qrels = read_qrels(DATA / "qrels" / "test.tsv")
    kept = {q: rel for q, rel in qrels.items() if rel.keys() <= doc_ids}
    texts = {}
    with (DATA / "queries.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            raw = json.loads(line)
            if raw["_id"] in kept:
                texts[raw["_id"]] = raw["text"]
    return texts, kept, len(qrels)


def dense_reference(docs: list[dict[str, str]], queries: dict[str, str]) -> dict[str, list[str]]:
    """Top 100 docs per query by exact cosine of the whole abstract's embedding."""
    model = load_model(os.cpu_count() or 1)
    doc_vectors = model.encode([d["content"] for d in docs], batch_size=32,
                               normalize_embeddings=True, show_progress_bar=False)
    query_ids = list(queries)
    query_vectors = model.encode([queries[q] for q in query_ids], batch_size=32,
                                 normalize_embeddings=True, show_progress_bar=False)
    del model
    gc.collect()
    scores = np.asarray(query_vectors) @ np.asarray(doc_vectors).T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :SEARCH_LIMIT]
    doc_ids = [d["id"].removeprefix(PREFIX) for d in docs]
    return {q: [doc_ids[i] for i in row] for q, row in zip(query_ids, top, strict=True)}


def run_mode(http: httpx.Client, queries: dict[str, str], options: dict[str, object]
             ) -> tuple[dict[str, list[str]], list[float], set[str]]:
    """Ranked docs per query, each request's milliseconds, and the warnings the API gave."""
    runs: dict[str, list[str]] = {}
    latencies: list[float] = []
    warnings: set[str] = set()
    for query_id, text in queries.items():
        start = time.perf_counter()
        answer = http.post("/v1/search", json={"query": text, "limit": SEARCH_LIMIT,
                                               "group_by": "item", "track": False, **options})
        latencies.append((time.perf_counter() - start) * 1000)
        answer.raise_for_status()
        body = answer.json()
        warnings.update(body["warnings"])
        runs[query_id] = unique_docs([result["item"]["id"] for result in body["results"]])
    return runs, latencies, warnings


def wait_for_word_statistics(http: httpx.Client, timeout_s: float = 120) -> None:
    """BM25 weighs words by statistics a worker's sweeper counts in the background, within
    MEMMILL_TEXT_STATS_INTERVAL_S of the last change; wait until a rare word of the corpus
    outranks a common one, i.e. until the count has run since the last item arrived."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = http.get("/v1/jobs/stats").json()
        if stats["text_stats"]["fresh"]:
            return
        time.sleep(1)
    raise RuntimeError("word statistics were not counted in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=5183, help="first N abstracts of the corpus")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the exact dense reference (3-5 minutes on the full corpus)")
    parser.add_argument("--port", type=int, default=8792)
    args = parser.parse_args()

    docs = load_corpus(args.limit)
    queries, qrels, total_queries = load_queries({d["id"].removeprefix(PREFIX) for d in docs})
    print(f"{len(docs)} SciFact abstracts; {len(queries)} of {total_queries} test queries have"
          " all their relevant abstracts among them", flush=True)

    reference: tuple[float, float] | None = None
    if not args.no_reference:
        start = time.perf_counter()
        reference = mean_scores(dense_reference(docs, queries), qrels)
        print(f"dense reference in {time.perf_counter() - start:.0f}s", flush=True)

    rows: list[tuple[str, float, float | None, float | None]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="memmill-retrieval-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, args.port, workers=1)
        try:
            url = f"http://127.0.0.1:{args.port}"
            key = wait_for_api(url, data_dir)
            seconds = ingest(url, key, docs, batch=500)
            print(f"ingested: {len(docs)} items ready in {seconds:.0f}s", flush=True)
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                              timeout=60) as http:
                wait_for_word_statistics(http)
                for mode, options in RUNS.items():
                    runs, latencies, warnings = run_mode(http, queries, options)
                    ndcg, recall = mean_scores(runs, qrels)
                    depth = options.get("limit", SEARCH_LIMIT)
                    rows.append((f"memmill {mode}", ndcg, recall if depth == SEARCH_LIMIT else None,
                                 statistics.median(latencies)))
                    empty = sum(not docs_found for docs_found in runs.values())
                    found = statistics.fmean(len(docs_found) for docs_found in runs.values())
                    notes.append(f"memmill {mode}: {empty} queries without results, {found:.1f}"
                                 f" distinct abstracts per query on average"
                                 + (f"; warnings: {sorted(warnings)}" if warnings else ""))
                    print(f"{mode} done", flush=True)
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=60)
    if reference is not None:
        rows.append((REFERENCE, *reference, None))

    print()
    print(f"SciFact test: {len(docs)} abstracts, {len(queries)} queries")
    print()
    print("| method | nDCG@10 | Recall@100 | p50 ms |")
    print("| --- | ---: | ---: | ---: |")
    for method, ndcg, recall, p50 in rows:
        latency = "-" if p50 is None else f"{p50:.1f}"
        found = "-" if recall is None else f"{recall:.3f}"
        print(f"| {method} | {ndcg:.3f} | {found} | {latency} |")
    print()
    for note in notes:
        print(note)
    print(f"memmill returns {SEARCH_LIMIT} items (abstracts) per query (10 on the first page),"
          " grouped by item;"
          " later modes reuse the query embeddings semantic cached, so their p50 leaves them"
          " out")
    print(ISSUE_FIGURES)


if __name__ == "__main__":
    main()
