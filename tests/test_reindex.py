"""A change of embedding model re-embeds the index in the background, and no query is ever
compared with vectors of another model: real workers, real Postgres and Redis, the local model
before and an OpenAI-compatible server (speaking the real wire format) after."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import numpy as np
import pytest
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from pipeline import items, jobs, reindex
from pipeline.errors import RetryLater
from pipeline.providers import embeddings
from pipeline.providers.embeddings import QueryCache, get_embedder
from pipeline.queue_codec import ARQ_CODEC
from pipeline.search import SearchFilters, SearchParams, search
from pipeline.settings import Settings
from tests.conftest import drain
from tests.fake_providers import KEY, FakeProviders, fake_vector, unit

LOCAL = "local:all-MiniLM-L6-v2"
NEW = "openai:embed-384"
TEXTS = {
    "notes/tides": "The tides follow the moon. Spring tides come with the full and new moon.",
    "notes/bread": "Sourdough bread rises slowly; the starter needs feeding every day.",
    "notes/bees": "Honey bees dance to tell the hive where the flowers are.",
}


@pytest.fixture
async def queue(settings: Settings) -> AsyncIterator[ArqRedis]:
    redis = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    yield redis
    await redis.aclose()


@pytest.fixture
async def new_model(settings: Settings, fake: FakeProviders) -> AsyncIterator[Settings]:
    fake.dim = 384
    changed = settings.model_copy(update={
        "embedding_provider": "openai", "embedding_model": "embed-384",
        "embedding_base_url": f"{fake.url}/v1", "embedding_api_key": KEY,
        "provider_rate_per_s": 1000, "provider_retry_max_wait_s": 0.05,
    })
    yield changed
    shared = embeddings._SHARED.pop(embeddings._key(changed), None)
    if shared is not None:
        await shared.inner.client.aclose()  # type: ignore[attr-defined]


async def _put(
    pool: asyncpg.Pool, queue: ArqRedis, settings: Settings, tenant_id: int, item_id: str,
    text: str,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant_id, settings=settings,
                                      item=items.NewItem(id=item_id, content=text))
    await jobs.enqueue(pool, queue, jobs.refs_to_enqueue(result.jobs),
                       queue_name=settings.queue_name)


async def _semantic(pool: asyncpg.Pool, settings: Settings, tenant_id: int,
                    item_ids: list[str] | None = None) -> set[str]:
    """The items a semantic search finds; with `item_ids`, a filter few enough items pass that
    their parts are ranked one by one instead of through the HNSW index."""
    outcome = await search(pool, QueryCache(get_embedder(settings)), settings,
                           tenant_id=tenant_id, filter_pool=pool,
                           params=SearchParams(query="moon and tides", mode="semantic", limit=10,
                                               filters=SearchFilters(item_ids=item_ids)))
    return {r["item"]["id"] for r in outcome.results}


async def test_a_new_model_reindexes_in_the_background_without_a_mix(
    settings: Settings, new_model: Settings, pool: asyncpg.Pool, queue: ArqRedis,
    tenant: tuple[int, str], other_tenant: tuple[int, str], fake: FakeProviders,
    monkeypatch: pytest.MonkeyPatch, api_url: str,
) -> None:
    monkeypatch.setattr(reindex, "PAGE_PARTS", 2)  # so each tenant's chain has several pages
    for item_id, text in TEXTS.items():
        await _put(pool, queue, settings, tenant[0], item_id, text)
    await _put(pool, queue, settings, other_tenant[0], "theirs", "Moon and tides, other tenant.")
    await drain(settings, pool)
    assert (await reindex.state(pool)).model == LOCAL
    assert await _semantic(pool, settings, tenant[0]) == set(TEXTS)

    started = await reindex.start(pool, queue, new_model)
    assert (started.model, started.next_model) == (LOCAL, NEW)
    assert (await reindex.start(pool, queue, new_model)).next_model == NEW  # no second run
    chains = await pool.fetch("SELECT tenant_id FROM jobs WHERE kind = 'reindex'")
    assert sorted(r["tenant_id"] for r in chains) == sorted([tenant[0], other_tenant[0]])

    # Under way: the old model's queries still see the old vectors; the new model's queries see
    # only what the new model has embedded (nothing yet), never the old vectors.
    assert await _semantic(pool, settings, tenant[0]) == set(TEXTS)
    assert await _semantic(pool, new_model, tenant[0]) == set()
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        stats = (await http.get("/v1/jobs/stats")).json()
    assert stats["embedding_index"] == {"model": LOCAL, "reindexing_to": NEW,
                                        "parts": len(TEXTS), "reindexed_parts": 0}
    # A worker still on the old model leaves its embeds to one on the new model.
    for stale in (LOCAL, "ollama:other"):
        async with pool.acquire() as conn, conn.transaction():
            with pytest.raises(RetryLater, match=f"embeds with {stale}.*reindexing to {NEW}"):
                await reindex.target(conn, stale)

    # An item written during the reindex is embedded by the new model into the new column.
    await _put(pool, queue, new_model, tenant[0], "notes/moon", "The moon pulls the sea.")
    await drain(new_model, pool)
    # Every part has its new vector, not yet moved into place: the new model's queries read
    # the column being built, through the HNSW index and with a filter's parts ranked one by
    # one alike; the old model's read the old column, which the new item never reached.
    assert await _semantic(pool, new_model, tenant[0]) == {*TEXTS, "notes/moon"}
    assert await _semantic(pool, new_model, tenant[0],
                           ["notes/moon", "notes/bees"]) == {"notes/moon", "notes/bees"}
    assert await _semantic(pool, settings, tenant[0],
                           ["notes/moon", "notes/bees"]) == {"notes/bees"}
    assert await reindex.finish_if_complete(pool)

    state = await reindex.state(pool, tenant_id=tenant[0])
    assert (state.model, state.next_model) == (NEW, None)
    assert (state.parts, state.done) == (len(TEXTS) + 1, 0)  # the new vectors moved into place
    rows = await pool.fetch("SELECT text, embedding, embedding_next FROM parts")
    assert len(rows) == len(TEXTS) + 2
    for row in rows:
        assert row["embedding_next"] is None
        np.testing.assert_allclose(row["embedding"].to_numpy(), unit(fake_vector(row["text"], 384)),
                                   atol=1e-5)
    pages = await pool.fetch("SELECT payload FROM jobs WHERE kind = 'reindex' AND status = 'done'")
    assert len(pages) >= 3  # the chain went on page by page
    assert await _semantic(pool, new_model, tenant[0]) == {*TEXTS, "notes/moon"}
    assert await _semantic(pool, new_model, other_tenant[0]) == {"theirs"}
    assert await _semantic(pool, settings, tenant[0]) == set()  # old-model queries: no vectors
    # Cached by provider and model: the local model's entries stay apart from the new ones.
    keys = {r["model"] for r in await pool.fetch("SELECT DISTINCT model FROM embedding_cache")}
    assert keys == {LOCAL, NEW}


async def test_the_first_embedder_claims_an_empty_index(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    assert (await reindex.state(pool)).model is None
    state = await reindex.start(pool, queue, settings)
    assert (state.model, state.next_model) == (LOCAL, None)
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert not await reindex.finish_if_complete(pool)


async def test_a_model_of_another_dimension_is_refused_at_start(
    settings: Settings, pool: asyncpg.Pool, queue: ArqRedis
) -> None:
    with pytest.raises(RuntimeError, match=r"MEMMILL_EMBEDDING_DIM is 768 .* 384 dimensions"):
        await reindex.start(pool, queue, settings.model_copy(update={"embedding_dim": 768}))
    assert (await reindex.state(pool)).model is None
