"""Re-embedding everything when the embedding model changes, without a mix of models.

The index records which embedder (`provider:model`) made the vectors in `parts.embedding`.
A worker whose configured embedder differs starts a reindex at startup: the new vectors are
built in `parts.embedding_next` from the stored part texts, in the background, a page of parts
per job (one chain of jobs per tenant), while searches embedded with the old model keep using
the old vectors and searches embedded with the new one use the new vectors built so far. When
every part has its new vector, the sweeper moves them into place in one transaction.

An embed job writes where its vectors belong (see `target`), so items ingested during a
reindex are neither left behind nor written into the wrong column.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import RetryLater
from pipeline.jobs import Enqueuer, JobRef, JobSpec
from pipeline.settings import Settings, model_key

log = logging.getLogger(__name__)

PAGE_PARTS = 256
CURRENT, NEXT = "embedding", "embedding_next"
# An embed job whose worker has neither the index's model nor the one being built waits for
# a worker that does (during a rolling restart, the old workers still run).
MISMATCH_RETRY_S = 60.0


@dataclass(frozen=True)
class IndexState:
    model: str | None
    next_model: str | None
    parts: int = 0
    done: int = 0

    @property
    def reindexing(self) -> bool:
        return self.next_model is not None


async def state(
    conn: asyncpg.Connection | asyncpg.Pool, *, tenant_id: int | None = None
) -> IndexState:
    """The index's models; with a tenant, also how many of its parts have a new vector."""
    row = await conn.fetchrow(Q["reindex.state"])
    counts = await conn.fetchrow(Q["reindex.progress"], tenant_id) if tenant_id else None
    return IndexState(
        model=row["model"], next_model=row["next_model"],
        parts=counts["parts"] if counts else 0, done=counts["done"] if counts else 0,
    )


async def target(conn: asyncpg.Connection, key: str) -> str:
    """The column where vectors of embedder `key` go, read under a share lock held to the end
    of the caller's transaction, so the swap cannot happen between the read and the write."""
    row = await conn.fetchrow(Q["reindex.state_for_write"])
    model, next_model = row["model"], row["next_model"]
    if model is None:
        await conn.execute(Q["reindex.claim_model"], key)
        model = key
    if next_model == key:
        return NEXT
    if model == key and next_model is None:
        return CURRENT
    building = f", reindexing to {next_model}" if next_model else ""
    raise RetryLater(
        f"this worker embeds with {key}, but the index holds {model} vectors{building}: "
        "a worker configured with the index's model will write them",
        retry_after_s=MISMATCH_RETRY_S,
    )


async def start(pool: asyncpg.Pool, queue: Enqueuer, settings: Settings) -> IndexState:
    """Start a reindex to this process's embedder if the index holds another's vectors; a
    no-op when it already matches or is being rebuilt for it. Safe to race: the index row
    is locked while the jobs are created."""
    key = model_key(settings)
    dimension = await pool.fetchval(Q["reindex.dimension"])
    if dimension != settings.embedding_dim:
        raise RuntimeError(
            f"MEMMILL_EMBEDDING_DIM is {settings.embedding_dim} but the index stores vectors of "
            f"{dimension} dimensions: choose a model of {dimension} dimensions"
        )
    refs: list[JobRef] = []
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(Q["reindex.state_for_update"])
        if row["model"] is None:
            await conn.execute(Q["reindex.claim_model"], key)
        elif row["model"] != key and row["next_model"] != key:
            if row["next_model"] is not None:  # only an abandoned reindex left vectors there
                await conn.execute(Q["reindex.clear_next"])
            await conn.execute(Q["reindex.begin"], key)
            for tenant in await conn.fetch(Q["reindex.tenants_with_parts"]):
                rows = await jobs.create_jobs(
                    conn, tenant_id=tenant["tenant_id"], item_id=None, version=None,
                    specs=[JobSpec(jobs.REINDEX)], max_attempts=settings.max_attempts_for,
                    payload={"after_id": 0},
                )
                refs += jobs.refs_to_enqueue(rows)
            log.warning("embedding model changed from %s to %s: reindexing in the background"
                        " (%d tenants)", row["model"], key, len(refs))
    await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    return await state(pool)


async def finish_if_complete(pool: asyncpg.Pool) -> bool:
    """Swap the new vectors in once every part has one. Called by the sweeper: a single place,
    so no two writers wait on each other for it, and a reindex whose last page was written by
    an embed job still finishes."""
    if not (await state(pool)).reindexing:
        return False
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(Q["reindex.state_for_update"])
        if row["next_model"] is None or await conn.fetchval(Q["reindex.incomplete"]):
            return False
        await conn.execute(Q["reindex.swap_vectors"])
        await conn.execute(Q["reindex.finish"])
    log.warning("reindex to %s finished: the index now holds its vectors", row["next_model"])
    return True
