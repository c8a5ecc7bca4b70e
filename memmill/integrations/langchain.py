"""LangChain retrievers over memmill: `MemmillRetriever` for documents (the hybrid search of
`POST /v1/search`) and `MemmillMemoryRetriever` for an agent's memories (`POST
/v1/memories/search`), both blocking and async (`invoke` / `ainvoke`). Needs the `langchain`
extra: `pip install 'memmill[langchain]'`.

    from memmill.integrations.langchain import MemmillRetriever

    retriever = MemmillRetriever(limit=5, filters={"tags": {"topic": "baking"}})
    for doc in retriever.invoke("what makes bread rise"):
        print(doc.metadata["item_id"], doc.metadata["score"], doc.page_content)

A call may override the retriever's options: `retriever.invoke(query, limit=10)`.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Literal

from memmill.integrations import missing_extra

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - exercised in a process without langchain-core
    raise missing_extra(__name__, "LangChain", "langchain") from exc

from pydantic import Field, PrivateAttr, SecretStr

from api.memory_schemas import RecallHit, RecallResults
from api.schemas import SearchResponse, SearchResult
from memmill.client import RetryPolicy
from memmill.client.clients import DEFAULT_TIMEOUT_S
from memmill.integrations.connection import Clients

__all__ = ["MemmillMemoryRetriever", "MemmillRetriever"]


class _Connected(BaseRetriever):
    """What both retrievers share: where memmill is, and the clients that reach it."""

    url: str | None = Field(default=None, description="Default: MEMMILL_URL.")
    api_key: SecretStr | None = Field(default=None, description="Default: MEMMILL_API_KEY.")
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    retry: RetryPolicy | None = None
    _clients: Clients | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    searched: ClassVar[tuple[str, ...]] = ()  # the fields a search is sent with

    @property
    def clients(self) -> Clients:
        """Made on first use, once, though a chain may call from several threads."""
        with self._lock:
            if self._clients is None:
                key = self.api_key.get_secret_value() if self.api_key else None
                self._clients = Clients(self.url, key, timeout_s=self.timeout_s,
                                        retry=self.retry)
            return self._clients

    def options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The retriever's search options with a call's overrides, each checked as a field."""
        unknown = set(overrides) - set(self.searched)
        if unknown:
            raise ValueError(f"unknown search options {sorted(unknown)}; this retriever "
                             f"takes {', '.join(self.searched)}")
        # An override is held to its field's rules, as the retriever's own options were.
        chosen = self.model_validate({**self.model_dump(), **overrides}) if overrides else self
        return {name: getattr(chosen, name) for name in self.searched}


class MemmillRetriever(_Connected):
    """Documents by memmill's hybrid search. Each `Document` holds a part's text, and in
    `metadata`: `item_id`, `title`, `tags`, `position` (the part's place in its item),
    `part_id`, `score` (the final score), `scores` (both sides' ranks and scores, fused and
    final), `snippet`, `summary`, `kind` and `version`.

    Options (each may be overridden per call): `limit` (1-100), `mode` (`hybrid`, `fts`,
    `semantic`), `filters` (as `POST /v1/search` takes them: `tags`, `kinds`, `item_ids`,
    `created_after`, ...; a bad one is an `InvalidRequest` naming it), `group_by` (`part`, or
    `item`: each item once, at its best part), `track` (count the results as used)."""

    limit: int = Field(default=4, ge=1, le=100)
    mode: Literal["hybrid", "fts", "semantic"] = "hybrid"
    filters: dict[str, Any] | None = None
    group_by: Literal["part", "item"] = "part"
    track: bool = True
    searched: ClassVar[tuple[str, ...]] = ("limit", "mode", "filters", "group_by", "track")

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun,
                                **overrides: Any) -> list[Document]:
        return documents(self.clients.sync.search(query, **self.options(overrides)))

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **overrides: Any) -> list[Document]:
        answer = await self.clients.for_this_loop().search(query, **self.options(overrides))
        return documents(answer)


def documents(answer: SearchResponse) -> list[Document]:
    return [document(result) for result in answer.results]


def document(result: SearchResult) -> Document:
    item = result.item
    return Document(id=f"{item.id}#{result.position}", page_content=result.text, metadata={
        "item_id": item.id, "title": item.title, "tags": item.tags,
        "position": result.position, "part_id": result.part_id,
        "score": result.scores.final, "scores": result.scores.model_dump(),
        "snippet": result.snippet, "summary": item.summary, "kind": item.kind,
        "version": item.version})


class MemmillMemoryRetriever(_Connected):
    """An agent's memories (and, with `include_events`, the turns of its sessions) by
    memmill's search over what the scope may read. Each `Document` holds the memory's (or
    turn's) text, and in `metadata`: `kind`, `id`, `score`, `type`, `confidence`,
    `observed_at`, `session_id`, `event_id`, `source_events` and the memory's own
    `metadata`.

    Options (each may be overridden per call): `user_id`, `agent_id` (the reader; a bound key
    reads as its binding), `limit`, `include_events`, `types`, `metadata_filter` (JSON the
    rows' metadata must contain; `metadata` is LangChain's own field, for tracing)."""

    user_id: str | None = None
    agent_id: str | None = None
    limit: int = Field(default=4, ge=1, le=100)
    include_events: bool = False
    types: list[str] | None = None
    metadata_filter: dict[str, Any] | None = None
    searched: ClassVar[tuple[str, ...]] = ("user_id", "agent_id", "limit", "include_events",
                                           "types", "metadata_filter")

    def recall_options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        options = self.options(overrides)
        options["metadata"] = options.pop("metadata_filter")
        return options

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun,
                                **overrides: Any) -> list[Document]:
        answer = self.clients.sync.memories.search(query, **self.recall_options(overrides))
        return memory_documents(answer)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **overrides: Any) -> list[Document]:
        memories = self.clients.for_this_loop().memories
        return memory_documents(await memories.search(query, **self.recall_options(overrides)))


def memory_documents(answer: RecallResults) -> list[Document]:
    return [memory_document(hit) for hit in answer.results]


def memory_document(hit: RecallHit) -> Document:
    return Document(id=hit.id, page_content=hit.content, metadata={
        "kind": hit.kind, "id": hit.id, "score": hit.score, "type": hit.type,
        "confidence": hit.confidence, "observed_at": hit.observed_at,
        "session_id": hit.session_id, "event_id": hit.event_id,
        "source_events": hit.source_events, "metadata": hit.metadata})
