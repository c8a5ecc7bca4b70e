"""What each job kind does: load its inputs by id, run the pure stage, and return a writer.

The writer runs inside the runner's completion transaction, together with the ledger update,
so a stage's result is stored if and only if its job is marked done. Running a task twice
rewrites the same rows, so a duplicate delivery changes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import PermanentError
from pipeline.items import content_hash
from pipeline.jobs import Enqueuer
from pipeline.providers.embeddings import Embedder, get_embedder
from pipeline.settings import Settings
from pipeline.stages.analyze import split_text
from pipeline.stages.summarize import summarize

Writer = Callable[[asyncpg.Connection], Awaitable[None]]
Task = Callable[[asyncpg.Record, "Deps"], Awaitable[Writer]]


@dataclass
class Deps:
    """Everything a job needs, filled once per worker process."""

    pool: asyncpg.Pool
    settings: Settings
    queue: Enqueuer
    worker_id: str
    _embedder: Embedder | None = field(default=None, repr=False)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = get_embedder(self.settings)
        return self._embedder


async def _load_text(job: asyncpg.Record, deps: Deps) -> str:
    source = await deps.pool.fetchrow(
        Q["items.get_source"], job["tenant_id"], job["item_id"], job["version"]
    )
    if source is None or source["content"] is None:
        raise PermanentError(f"no source text stored for {job['item_id']} v{job['version']}")
    return source["content"]


async def _is_current(conn: asyncpg.Connection, job: asyncpg.Record, digest: str) -> bool:
    """False when newer content replaced this version while the job ran."""
    current = await conn.fetchval(Q["items.lock_for_completion"], job["tenant_id"], job["item_id"])
    return current == digest


async def analyze(job: asyncpg.Record, deps: Deps) -> Writer:
    text = await _load_text(job, deps)
    drafts = split_text(
        text,
        max_words=deps.settings.part_max_words,
        overlap_words=deps.settings.part_overlap_words,
    )
    if not drafts:
        raise PermanentError("the document has no text to index")
    digest = content_hash(text)
    tenant_id, item_id, version = job["tenant_id"], job["item_id"], job["version"]

    async def write(conn: asyncpg.Connection) -> None:
        if not await _is_current(conn, job, digest):
            return
        await conn.execute(Q["parts.delete_version"], tenant_id, item_id, version)
        await conn.execute(
            Q["parts.insert_many"],
            tenant_id,
            item_id,
            version,
            [d.position for d in drafts],
            [d.text for d in drafts],
            [{} for _ in drafts],
            [content_hash(d.text) for d in drafts],
        )
        await conn.execute(Q["parts.delete_other_versions"], tenant_id, item_id, version)

    return write


async def embed(job: asyncpg.Record, deps: Deps) -> Writer:
    """Embed the parts of one item version in one batch, reusing cached vectors by content hash."""
    tenant_id, item_id, version = job["tenant_id"], job["item_id"], job["version"]
    rows = await deps.pool.fetch(Q["parts.unembedded"], tenant_id, item_id, version)
    embedder = deps.embedder
    hashes = sorted({r["content_hash"] for r in rows})
    cached = {
        r["content_hash"]: r["embedding"]
        for r in await deps.pool.fetch(
            Q["parts.cached_embeddings"], tenant_id, embedder.model, hashes
        )
    }
    todo: dict[str, str] = {}
    for r in rows:
        if r["content_hash"] not in cached:
            todo.setdefault(r["content_hash"], r["text"])
    computed = dict(zip(todo, await embedder.embed(list(todo.values())), strict=True))
    vectors = {**cached, **computed}

    async def write(conn: asyncpg.Connection) -> None:
        await conn.executemany(
            Q["parts.set_embedding"],
            [(tenant_id, r["id"], vectors[r["content_hash"]]) for r in rows],
        )
        await conn.executemany(
            Q["parts.cache_embedding"],
            [(tenant_id, embedder.model, digest, v) for digest, v in computed.items()],
        )

    return write


async def summarize_item(job: asyncpg.Record, deps: Deps) -> Writer:
    text = await _load_text(job, deps)
    summary = summarize(text, max_chars=deps.settings.summary_max_chars)
    digest = content_hash(text)

    async def write(conn: asyncpg.Connection) -> None:
        await conn.execute(
            Q["items.set_summary"], job["tenant_id"], job["item_id"], digest, summary
        )

    return write


TASKS: dict[str, Task] = {
    jobs.ANALYZE: analyze,
    jobs.EMBED: embed,
    jobs.SUMMARIZE: summarize_item,
}
