"""Cross-item embedding batches: concurrent `embed` calls from different jobs (and, in the API,
different queries) share one provider call.

A worker runs several embed jobs at once, each with the few parts of one item. Sent one by one,
the model sees batches of two or three texts and pads nothing away; merged, it sorts a larger
pool by length and runs full batches, and an HTTP provider gets one request instead of eight.

There is no timer: whatever arrives while the provider is busy with one batch forms the next,
so a lone call is never delayed and a busy process gets large batches on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipeline.providers import usage

if TYPE_CHECKING:
    from pipeline.providers.embeddings import Embedder

log = logging.getLogger(__name__)


@dataclass
class _Request:
    texts: list[str]
    future: asyncio.Future[list[np.ndarray]] = field(repr=False)
    # Whose job asked (pipeline.providers.usage): a merged call is counted once, for the
    # tenant whose request opened the batch, not for whoever started the drainer.
    tenant: int | None = field(default_factory=usage.TENANT.get)


class BatchingEmbedder:
    """Wraps an embedder; at most `max_texts` texts per merged call. A caller with more texts
    than that (one long document) calls the provider directly: it would fill a batch alone, and
    that way its job can still be cancelled between the provider's own batches."""

    def __init__(self, inner: Embedder, *, max_texts: int) -> None:
        self.inner = inner
        self.model = inner.model
        self.dim = inner.dim
        self._max_texts = max_texts
        self._pending: deque[_Request] = deque()
        self._drainer: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.calls = 0  # provider calls made, so tests can see the merging

    async def warm_up(self) -> None:
        await self.inner.warm_up()

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        if len(texts) >= self._max_texts:
            self.calls += 1
            return await self.inner.embed(texts)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): state of the old one is dead
            self._loop, self._pending, self._drainer = loop, deque(), None
        request = _Request(list(texts), loop.create_future())
        self._pending.append(request)
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain(), name="embed-batcher")
        # A cancelled caller (job timeout) cancels only its own future: the drainer skips it
        # if it is still waiting, or drops its share of a batch already under way.
        return await request.future

    def _next_batch(self) -> list[_Request]:
        batch: list[_Request] = []
        count = 0
        while self._pending:
            head = self._pending[0]
            if head.future.done():
                self._pending.popleft()
                continue
            if batch and count + len(head.texts) > self._max_texts:
                break
            batch.append(self._pending.popleft())
            count += len(head.texts)
        return batch

    async def _drain(self) -> None:
        batch: list[_Request] = []
        try:
            while batch := self._next_batch():
                try:
                    with usage.tenant_scope(batch[0].tenant):
                        vectors = await self._call([t for r in batch for t in r.texts])
                except Exception as exc:  # noqa: BLE001 - handed to the callers, who decide
                    await self._fail(batch, exc)
                    continue
                self._deliver(batch, vectors)
        except asyncio.CancelledError:  # the loop is closing: nobody is left waiting unawares
            for request in [*batch, *self._pending]:
                request.future.cancel()
            raise

    @staticmethod
    def _deliver(batch: list[_Request], vectors: list[np.ndarray]) -> None:
        offset = 0
        for request in batch:
            share = vectors[offset : offset + len(request.texts)]
            offset += len(request.texts)
            if not request.future.done():
                request.future.set_result(share)

    async def _fail(self, batch: list[_Request], exc: Exception) -> None:
        """One caller's bad text must not fail the others it was merged with: when a merged
        call fails, each caller gets its own call and its own outcome."""
        if len(batch) == 1:
            if not batch[0].future.done():
                batch[0].future.set_exception(exc)
            return
        log.info("a merged embedding call of %d requests failed (%s); retrying each alone",
                 len(batch), exc)
        for request in batch:
            if request.future.done():
                continue
            try:
                with usage.tenant_scope(request.tenant):
                    result = await self._call(request.texts)
            except Exception as own:  # noqa: BLE001 - handed to its caller
                if not request.future.done():
                    request.future.set_exception(own)
            else:
                if not request.future.done():
                    request.future.set_result(result)

    async def _call(self, texts: list[str]) -> list[np.ndarray]:
        self.calls += 1
        vectors = await self.inner.embed(texts)
        if len(vectors) != len(texts):
            raise RuntimeError(f"{len(vectors)} vectors came back for {len(texts)} texts")
        return vectors
