"""Shared embedding calls: concurrent `embed` calls from different jobs (and, in the API,
different queries) are served by one stream of short provider calls, fairly between tenants.

A worker runs many embed jobs at once, each with the parts of one item. Sent one by one, the
model would see batches of two or three texts; merged, it runs full batches of texts of like
length, and an HTTP provider gets one request instead of eight.

Calls are kept short (`CallShape.texts`: two forward passes a model copy), and each is chosen
afresh from what waits, so nobody waits long behind anybody:

- **Fair between tenants.** Calls are headed by the waiting tenants in turn, a tenant new to
  the line first; the texts considered for a call are taken one of each tenant's, then the
  second of each, and so on. A tenant with one query or one small item heads the next call,
  however many texts another tenant's bulk load has waiting. Whole requests used to go first
  come, first served, in calls of up to 256 texts, and a lone text waited for calls of 0.4 s
  on short notes and 3-8 s on abstracts.
- **Like lengths together.** A call is the head of the line and the texts among the next
  `pool_texts` whose lengths are closest to it, so a forward pass pads little (the model
  pads every text of a pass to the longest). The head is always served, so a long text is
  never passed over for shorter ones.
- **Short calls cost little.** benchmarks/embed_calls.py measures this against the earlier
  way (first come, first served, calls of up to 128 texts a copy): as fast on abstracts'
  parts, 4-10% slower on short notes, which a worker's pipeline, not its model, holds back.
  Calls of four passes of short notes were as fast as the earlier ones, but another tenant's
  item waited half as long again behind them; calls of one pass encoded a fifth fewer, and
  calls cut to 2048 characters whatever they held (two or three abstracts' parts) 27% fewer.

A request's texts may be spread over several calls; it is answered once all are embedded.
There is no timer: whatever arrives while a call runs is considered for the next, so a lone
call is never delayed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipeline.providers import usage

if TYPE_CHECKING:
    from pipeline.providers.embeddings import Embedder

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    texts: list[str]
    future: asyncio.Future[list[np.ndarray]] = field(repr=False)
    # Whose job asked (pipeline.providers.usage): turns are taken by tenant, and a call is
    # counted for the tenant whose text heads it.
    tenant: int | None = field(default_factory=usage.TENANT.get)
    # Indices of texts not yet in a call, in order (a dict as an ordered set), and how many
    # are in a call under way.
    waiting: dict[int, None] = field(init=False)
    in_flight: int = 0
    vectors: list[np.ndarray | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.waiting = dict.fromkeys(range(len(self.texts)))
        self.vectors = [None] * len(self.texts)

    @property
    def dead(self) -> bool:
        """Answered already: cancelled by its caller (a job's timeout) or failed."""
        return self.future.done()


# A text in a call: its request and its index there.
_Entry = tuple[_Request, int]


def _texts_of(line: list[_Request]) -> Iterator[_Entry]:
    for request in line:
        for index in request.waiting:
            yield request, index


@dataclass(frozen=True)
class CallShape:
    """What one merged provider call may take: at most `texts` texts, chosen among the first
    `pool_texts` waiting in fair order, with up to `parallel` calls under way at once (one a
    local model copy). A pool no larger than a call takes texts in that order, as suits an
    HTTP provider, which pads nothing."""

    texts: int
    pool_texts: int = 0
    parallel: int = 1

    def __post_init__(self) -> None:
        if self.texts < 1 or self.parallel < 1:
            raise ValueError("a call takes at least one text, and one call runs at a time")


class BatchingEmbedder:
    """Wraps an embedder; its callers share calls of the given shape (see the module
    docstring)."""

    def __init__(self, inner: Embedder, shape: CallShape) -> None:
        self.inner = inner
        self.model = inner.model
        self.dim = inner.dim
        self._call_texts = shape.texts
        self._pool_texts = max(shape.pool_texts, shape.texts)
        self._parallel = shape.parallel
        self._pending: list[_Request] = []
        self._drainers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The number of the call each waiting tenant last headed.
        self._headed: dict[int | None, int] = {}
        self._calls_made = 0
        self.calls = 0  # provider calls made, so tests can see the merging

    async def warm_up(self) -> None:
        await self.inner.warm_up()

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): state of the old one is dead
            self._loop, self._pending, self._drainers = loop, [], set()
        request = _Request(list(texts), loop.create_future())
        self._pending.append(request)
        # A drainer that found nothing left to take has returned (done) even before its
        # callback drops it from the set.
        self._drainers = {d for d in self._drainers if not d.done()}
        if len(self._drainers) < self._parallel:
            drainer = loop.create_task(self._drain(), name="embed-batcher")
            self._drainers.add(drainer)
        # A cancelled caller (job timeout) cancels only its own future: its texts not yet in
        # a call are never sent, and its share of a call under way is dropped.
        return await request.future

    def _fair_order(self) -> list[_Entry]:
        """The first `pool_texts` waiting texts, taking turns between tenants."""
        self._pending = [r for r in self._pending if r.waiting and not r.dead]
        lines: dict[int | None, list[_Request]] = defaultdict(list)
        for request in self._pending:  # arrival order: a tenant's line starts at its oldest
            lines[request.tenant].append(request)
        # Whoever headed a call longest ago goes first (a tenant new to the line, first of
        # all), so that heads go round the tenants waiting, not to the oldest request.
        self._headed = {t: n for t, n in self._headed.items() if t in lines}
        order_of_lines = sorted(lines, key=lambda t: self._headed.get(t, -1))
        turns = [_texts_of(lines[tenant]) for tenant in order_of_lines]
        order: list[_Entry] = []
        while turns and len(order) < self._pool_texts:
            still: list[Iterator[_Entry]] = []
            for texts in turns:
                entry = next(texts, None)
                if entry is not None:
                    order.append(entry)
                    still.append(texts)
                    if len(order) == self._pool_texts:
                        break
            turns = still
        return order

    def _next_call(self) -> list[_Entry]:
        """The head of the line, and the texts of the pool closest to it in length, in the
        pool's order; taken out of their requests' waiting texts."""
        pool = self._fair_order()
        if not pool:
            return []
        lengths = [len(request.texts[index]) for request, index in pool]
        ranked = sorted(range(1, len(pool)), key=lambda p: abs(lengths[p] - lengths[0]))
        # No tenant gets more of the call than the head's tenant has waiting: a tenant with
        # one text is answered by a call of a few texts, not by one as long as a bulk load's.
        head = pool[0][0].tenant
        share = min(sum(1 for request, _ in pool if request.tenant == head), self._call_texts)
        taken = Counter([head])
        chosen = [0]
        for p in ranked:
            if len(chosen) == self._call_texts:
                break
            tenant = pool[p][0].tenant
            if taken[tenant] < share:
                taken[tenant] += 1
                chosen.append(p)
        chosen.sort()
        call = [pool[p] for p in chosen]
        self._calls_made += 1
        self._headed[call[0][0].tenant] = self._calls_made
        for request, index in call:
            del request.waiting[index]
            request.in_flight += 1
        return call

    async def _drain(self) -> None:
        call: list[_Entry] = []
        try:
            while call := self._next_call():
                try:
                    with usage.tenant_scope(call[0][0].tenant):
                        vectors = await self._call([r.texts[i] for r, i in call])
                except Exception as exc:  # noqa: BLE001 - handed to the callers, who decide
                    await self._fail(call, exc)
                    continue
                self._deliver(call, vectors)
        except asyncio.CancelledError:  # the loop is closing: nobody is left waiting unawares
            for request in {r for r, _ in call} | set(self._pending):
                request.future.cancel()
            raise

    @staticmethod
    def _deliver(call: list[_Entry], vectors: list[np.ndarray]) -> None:
        for (request, index), vector in zip(call, vectors, strict=True):
            request.vectors[index] = vector
            request.in_flight -= 1
            if not request.dead and not request.waiting and not request.in_flight:
                request.future.set_result(request.vectors)  # type: ignore[arg-type]

    async def _fail(self, call: list[_Entry], exc: Exception) -> None:
        """One caller's bad text must not fail the others it was merged with: when a merged
        call fails, each caller's share is sent alone, and only a share that fails again
        fails its caller (whose other texts are then never sent)."""
        shares: dict[_Request, list[int]] = {}
        for request, index in call:
            shares.setdefault(request, []).append(index)
        if len(shares) > 1:
            log.info("a merged embedding call of %d requests failed (%s); retrying each alone",
                     len(shares), exc)
        for request, indices in shares.items():
            error: Exception = exc
            if len(shares) > 1 and not request.dead:
                try:
                    with usage.tenant_scope(request.tenant):
                        vectors = await self._call([request.texts[i] for i in indices])
                except Exception as own:  # noqa: BLE001 - handed to its caller
                    error = own
                else:
                    self._deliver([(request, i) for i in indices], vectors)
                    continue
            request.in_flight -= len(indices)
            if not request.dead:
                request.future.set_exception(error)

    async def _call(self, texts: list[str]) -> list[np.ndarray]:
        self.calls += 1
        vectors = await self.inner.embed(texts)
        if len(vectors) != len(texts):
            raise RuntimeError(f"{len(vectors)} vectors came back for {len(texts)} texts")
        return vectors
