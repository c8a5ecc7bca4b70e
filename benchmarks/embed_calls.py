"""Shared embedding calls: throughput, and how long a lone text waits behind a bulk load.

The local model (one copy a core, one torch thread each) shared by concurrent callers, in two
ways measured in the same run:

- **fair**: what memmill runs, `pipeline.providers.batching.BatchingEmbedder` as a worker
  uses it: a call going on each copy, of `LOCAL_CALL_PASSES` forward passes, chosen from a
  pool of 128 texts a copy, headed by the tenants in turn and matched by length;
- **fifo**: the earlier way, kept here as the baseline: whole requests first come, first
  served, merged into calls of up to 128 texts a copy, each call sorted by length and dealt
  out between the copies, which all work on it until it ends.

For each, on short notes (as benchmarks/fairness.py puts) and on SciFact parts (abstracts
split as the analyze stage splits them):

1. **throughput**: tenant A's N texts as `--jobs` concurrent requests of one or two texts
   each (a worker's embed jobs), texts a second;
2. **a lone text's wait**: while A's load runs, tenant B asks for one text every 0.25 s;
   the time until it has its vector, p50 and p95, against the same text asked with nothing
   else running (idle).

    .venv/bin/python benchmarks/embed_calls.py [--texts 3000] [--jobs 128] [--probes 20]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue` (torch imports
# it) when this script runs with the folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import asyncio
import statistics
import time
from typing import Any

from benchmarks.ingest import load_corpus, split_parts
from pipeline.providers import usage
from pipeline.providers.batching import BatchingEmbedder
from pipeline.providers.embeddings import LocalEmbedder, local_copies, merged_call_shape
from pipeline.settings import Settings

A, B = 1, 2
FIFO_TEXTS_PER_COPY = 128


def notes(count: int) -> list[str]:
    words = ("river", "glacier", "harbour", "orchard", "meadow", "canyon")
    return [f"bulk note {n}: the {words[n % 6]} near site {n * 7919 % 10007} was surveyed on "
            f"day {n % 365}." for n in range(count)]


def pct(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def as_tenant(tenant: int, embedder: Sharing, texts: list[str]) -> None:
    with usage.tenant_scope(tenant):
        await embedder.embed(texts)


async def bulk(embedder: Sharing, texts: list[str], jobs: int) -> float:
    """A's texts as `jobs` concurrent callers of one or two texts; seconds for all."""
    requests = [texts[i:i + 1 + i % 2] for i in range(0, len(texts), 2)]
    requests = [r for r in requests if r]
    started = time.perf_counter()
    queue = iter(requests)

    async def caller() -> None:
        for request in queue:
            await as_tenant(A, embedder, request)

    await asyncio.gather(*(caller() for _ in range(jobs)))
    return time.perf_counter() - started


async def lone_waits(embedder: Sharing, text: str, probes: int,
                     load: asyncio.Task[float] | None) -> list[float]:
    waits = []
    for n in range(probes):
        if load is not None and load.done():
            break
        started = time.perf_counter()
        await as_tenant(B, embedder, [f"{text} ({n})"])
        waits.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.25)
    return waits


class FifoEmbedder:
    """The earlier sharing, for comparison: no turns, no matching, one call at a time on all
    copies, as long as what waits (up to `call_texts`)."""

    def __init__(self, inner: LocalEmbedder, call_texts: int) -> None:
        self.inner, self.call_texts = inner, call_texts
        self.pending: list[tuple[list[str], asyncio.Future[list[Any]]]] = []
        self.drainer: asyncio.Task[None] | None = None

    async def embed(self, texts: list[str]) -> list[Any]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.pending.append((texts, future))
        if self.drainer is None or self.drainer.done():
            self.drainer = asyncio.create_task(self.drain())
        return await future

    async def drain(self) -> None:
        while self.pending:
            call, count = [], 0
            while self.pending and (not call or count + len(self.pending[0][0]) <= self.call_texts):
                call.append(self.pending.pop(0))
                count += len(call[-1][0])
            texts = [t for request, _ in call for t in request]
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            shares = [order[c::self.inner.copies] for c in range(self.inner.copies)]
            done = await asyncio.gather(*(self.inner.embed([texts[i] for i in share])
                                          for share in shares if share))
            vectors: list[Any] = [None] * len(texts)
            for share, got in zip([s for s in shares if s], done, strict=True):
                for i, vector in zip(share, got, strict=True):
                    vectors[i] = vector
            offset = 0
            for request, future in call:
                future.set_result(vectors[offset:offset + len(request)])
                offset += len(request)


Sharing = BatchingEmbedder | FifoEmbedder


async def measure(name: str, texts: list[str], embedder: Sharing, *, jobs: int,
                  probes: int) -> None:
    rate = len(texts) / await bulk(embedder, texts, jobs)
    idle = await lone_waits(embedder, texts[len(texts) // 2], probes, None)
    load = asyncio.create_task(bulk(embedder, texts * 3, jobs))
    await asyncio.sleep(0.5)
    loaded = await lone_waits(embedder, texts[len(texts) // 2], probes, load)
    await load
    print(f"  {name:<5} {rate:7.1f} texts/s; "
          f"a lone text idle p50 {statistics.median(idle):6.1f} ms / p95 {pct(idle, 95):6.1f}, "
          f"behind the load p50 {statistics.median(loaded):7.1f} / p95 {pct(loaded, 95):7.1f} "
          f"({pct(loaded, 95) / pct(idle, 95):.1f}x idle at p95, {len(loaded)} probes)",
          flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=3000, help="A's texts of each kind")
    parser.add_argument("--jobs", type=int, default=128, help="A's concurrent callers")
    parser.add_argument("--probes", type=int, default=20, help="B's lone texts per figure")
    args = parser.parse_args()

    settings = Settings(embedding_provider="local")
    copies = local_copies(settings)
    inner = LocalEmbedder(model=settings.embedding_model, dim=settings.embedding_dim,
                          batch_size=settings.embedding_batch_size, copies=copies)
    await inner.warm_up()
    sets = {"short notes": notes(args.texts),
            "SciFact parts": split_parts(load_corpus(args.texts))[: args.texts]}
    print(f"{copies} model copies, {settings.embedding_batch_size} texts a forward pass; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for label, texts in sets.items():
        print(f"{label} ({len(texts)}, mean {statistics.mean(map(len, texts)):.0f} characters):")
        for name, embedder in (
            ("fair", BatchingEmbedder(inner, merged_call_shape(settings))),
            ("fifo", FifoEmbedder(inner, FIFO_TEXTS_PER_COPY * copies)),
        ):
            await measure(name, texts, embedder, jobs=args.jobs, probes=args.probes)


if __name__ == "__main__":
    asyncio.run(main())
