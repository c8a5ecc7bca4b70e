"""Provider calls counted per tenant, provider and model, and stored by minute, hour and in
total: real calls over a loopback socket to the fake providers, real flushes into Postgres."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from arq.connections import ArqRedis, RedisSettings, create_pool

from pipeline import items, jobs
from pipeline.db import create_pool as create_db_pool
from pipeline.errors import PermanentError, TransientError
from pipeline.providers import chat, usage
from pipeline.providers.batching import BatchingEmbedder, CallShape
from pipeline.providers.chat import (
    AnthropicSummarizer,
    OllamaSummarizer,
    OpenAIChatSummarizer,
)
from pipeline.providers.embeddings import LocalEmbedder, OpenAIEmbedder
from pipeline.providers.usage import Counts
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from tests.conftest import drain, free_port
from tests.fake_providers import ANSWER, DOCUMENT, KEY, FakeProviders

GRAINS = ("hour", "minute", "total")


@pytest.fixture(autouse=True)
def nothing_pending() -> None:
    """Counts other tests left in this process (a worker whose flush failed) are not ours."""
    usage.USAGE.take()


def model_name() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def make_settings(fake: FakeProviders, model: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "summary_provider": "openai", "summary_model": model,
        "summary_base_url": f"{fake.url}/v1", "summary_api_key": KEY,
        "embedding_provider": "openai", "embedding_model": model,
        "embedding_base_url": f"{fake.url}/v1", "embedding_api_key": KEY, "embedding_dim": 8,
        "provider_timeout_s": 5, "provider_concurrency": 4, "provider_rate_per_s": 1000,
        "provider_retries": 4, "provider_retry_max_wait_s": 0.05,
    }
    values.update(overrides)
    return Settings(**values)


async def summarize(provider: Any, tenant_id: int | None) -> str:
    try:
        if tenant_id is None:
            return await provider.summarize(DOCUMENT)
        with usage.tenant_scope(tenant_id):
            return await provider.summarize(DOCUMENT)
    finally:
        await provider.client.aclose()


async def stored(pool: asyncpg.Pool, model: str) -> dict[str, asyncpg.Record]:
    """provider_calls of a model summed by grain (calls that straddle a minute make two
    minute rows), with the first period and the tenant and provider (one of each here)."""
    rows = await pool.fetch(
        """SELECT grain, min(tenant_id) AS tenant_id, min(provider) AS provider,
                  min(period) AS period, sum(calls)::bigint AS calls,
                  sum(errors_429)::bigint AS errors_429, sum(errors_5xx)::bigint AS errors_5xx,
                  sum(errors_other)::bigint AS errors_other, sum(retries)::bigint AS retries,
                  sum(wait_ms) AS wait_ms, sum(call_ms) AS call_ms,
                  sum(tokens_in)::bigint AS tokens_in, sum(tokens_out)::bigint AS tokens_out
           FROM provider_calls WHERE model = $1 GROUP BY grain""", model)
    return {r["grain"]: r for r in rows}


def counts(row: asyncpg.Record) -> dict[str, Any]:
    return {f: row[f] for f in usage.FIELDS if f not in ("wait_ms", "call_ms")}


def plain(c: Counts) -> dict[str, Any]:
    return {f: getattr(c, f) for f in usage.FIELDS if f not in ("wait_ms", "call_ms")}


def expected(**values: int) -> dict[str, int]:
    return {f: values.get(f, 0) for f in usage.FIELDS if f not in ("wait_ms", "call_ms")}


async def test_a_429_then_success_is_counted_in_every_grain(
    fake: FakeProviders, pool: asyncpg.Pool, tenant: tuple[int, str],
) -> None:
    model = model_name()
    fake.script(status=429, headers={"Retry-After": "2"})
    summary = await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
    assert summary == ANSWER.strip()
    assert await usage.flush(pool) in (1, 2)  # one row a minute

    rows = await stored(pool, model)
    assert sorted(rows) == list(GRAINS)
    now = await pool.fetchval("SELECT now()")
    for grain, row in rows.items():
        assert (row["tenant_id"], row["provider"]) == (tenant[0], "openai")
        # Two tries: the 429 and the answer; one retry; the tokens the answer reported.
        assert counts(row) == expected(calls=2, errors_429=1, retries=1, tokens_in=50,
                                       tokens_out=20)
        # The retry slept the capped Retry-After (50 ms); both tries took some time.
        assert row["wait_ms"] >= 45 and row["call_ms"] > 0
        if grain == "total":
            assert row["period"] == datetime.fromtimestamp(0, UTC)
        else:
            assert row["period"] == await pool.fetchval("SELECT date_trunc($1, $2::timestamptz)",
                                                        grain, row["period"])
            span = timedelta(hours=1) if grain == "hour" else timedelta(minutes=2)
            assert now - span < row["period"] <= now

    # The server's word is remembered, not the capped wait: limited for two seconds from then.
    limit = await pool.fetchrow("SELECT * FROM provider_limits WHERE model = $1", model)
    assert limit["provider"] == "openai"
    assert abs(now - limit["last_limited_at"]) < timedelta(minutes=1)
    assert timedelta(seconds=1.9) < limit["limited_until"] - limit["last_limited_at"] < (
        timedelta(seconds=2.1))

    # A second flush adds; it never overwrites.
    fake.script(status=429, headers={"Retry-After": "0"})
    await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
    await usage.flush(pool)
    for row in (await stored(pool, model)).values():
        assert counts(row) == expected(calls=4, errors_429=2, retries=2, tokens_in=100,
                                       tokens_out=40)
    # An earlier "until" from a later 429 does not shorten the limit the server asked for.
    again = await pool.fetchrow("SELECT * FROM provider_limits WHERE model = $1", model)
    assert again["last_limited_at"] > limit["last_limited_at"]
    assert again["limited_until"] == limit["limited_until"]


@pytest.mark.parametrize("wire", ["openai", "anthropic", "ollama"])
async def test_each_wire_reports_its_tokens(
    wire: str, fake: FakeProviders, pool: asyncpg.Pool, tenant: tuple[int, str],
) -> None:
    model = model_name()
    base = {"openai": f"{fake.url}/v1", "anthropic": fake.url, "ollama": fake.url}[wire]
    settings = make_settings(fake, model, summary_provider=wire, summary_base_url=base)
    provider = {"openai": OpenAIChatSummarizer, "anthropic": AnthropicSummarizer,
                "ollama": OllamaSummarizer}[wire](settings)
    if wire == "ollama":  # the fake's plain answer reports no counts; a real server does
        fake.script("json", body={"model": model, "done": True, "prompt_eval_count": 11,
                                  "eval_count": 7,
                                  "message": {"role": "assistant", "content": ANSWER}})
    await summarize(provider, tenant[0])
    await usage.flush(pool)
    tokens = {"openai": (50, 20), "anthropic": (50, 20), "ollama": (11, 7)}[wire]
    for row in (await stored(pool, model)).values():
        assert row["provider"] == wire
        assert counts(row) == expected(calls=1, tokens_in=tokens[0], tokens_out=tokens[1])


async def test_errors_are_counted_by_class(
    fake: FakeProviders, pool: asyncpg.Pool, tenant: tuple[int, str],
) -> None:
    model = model_name()
    embedder = OpenAIEmbedder(make_settings(fake, model))
    fake.script(status=503)
    fake.script(status=500)
    try:
        with usage.tenant_scope(tenant[0]):
            await embedder.embed(["one", "two"])  # 503, 500, then answered: 5 prompt tokens
            fake.script(status=401, body={"error": {"message": "bad key"}})
            with pytest.raises(PermanentError):
                await embedder.embed(["three"])  # 401: not retried
    finally:
        await embedder.client.aclose()

    # Nobody listens on this port: connection refused on each of the two tries.
    unreachable = OpenAIEmbedder(make_settings(
        fake, model, embedding_base_url=f"http://127.0.0.1:{free_port()}/v1",
        provider_retries=2))
    with usage.tenant_scope(tenant[0]), pytest.raises(TransientError):
        await unreachable.embed(["four"])
    await unreachable.client.aclose()

    await usage.flush(pool)
    for row in (await stored(pool, model)).values():
        assert counts(row) == expected(calls=6, errors_5xx=2, errors_other=3, retries=3,
                                       tokens_in=5)
    # A 503 without Retry-After is no rate limit.
    assert await pool.fetchval("SELECT count(*) FROM provider_limits WHERE model = $1",
                               model) == 0


async def test_a_call_without_a_tenant_still_records_the_limit(
    fake: FakeProviders, pool: asyncpg.Pool,
) -> None:
    model = model_name()
    fake.script(status=503, headers={"Retry-After": "30"})  # asked to wait: a limit too
    await summarize(OpenAIChatSummarizer(make_settings(fake, model)), None)
    assert await usage.flush(pool) == 0
    assert await stored(pool, model) == {}
    limit = await pool.fetchrow("SELECT * FROM provider_limits WHERE model = $1", model)
    assert timedelta(seconds=29) < limit["limited_until"] - limit["last_limited_at"] < (
        timedelta(seconds=31))


async def test_the_local_embedder_counts_a_call_per_batch(
    pool: asyncpg.Pool, tenant: tuple[int, str],
) -> None:
    model = f"all-MiniLM-L6-v2-{uuid.uuid4().hex[:6]}"  # its name only labels the counts
    embedder = BatchingEmbedder(LocalEmbedder(model=model, dim=384, batch_size=4),
                                CallShape(texts=2))
    with usage.tenant_scope(tenant[0]):
        vectors = await embedder.embed(["a", "b", "c", "d", "e"])
    assert len(vectors) == 5
    await usage.flush(pool)
    rows = await stored(pool, model)
    assert sorted(rows) == list(GRAINS)
    for row in rows.values():
        assert row["provider"] == "local"
        assert counts(row) == expected(calls=3)
        assert row["call_ms"] > 0


async def test_a_failed_flush_keeps_its_counts(
    fake: FakeProviders, pool: asyncpg.Pool, settings: Settings, tenant: tuple[int, str],
) -> None:
    model = model_name()
    fake.script(status=429, headers={"Retry-After": "1"})
    await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
    assert settings.database_url
    closed = await create_db_pool(settings.database_url, max_size=1)
    await closed.close()
    with pytest.raises(asyncpg.InterfaceError):
        await usage.flush(closed)
    # Counted after the failure: added to what the failed flush gave back.
    await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
    await usage.flush(pool)
    for row in (await stored(pool, model)).values():
        assert counts(row) == expected(calls=3, errors_429=1, retries=1, tokens_in=100,
                                       tokens_out=40)
    assert await pool.fetchval("SELECT limited_until FROM provider_limits WHERE model = $1",
                               model) is not None


async def _flush_blocked(pool: asyncpg.Pool, blocker: asyncpg.Connection) -> asyncio.Task[int]:
    """A flush started while `blocker` holds provider_calls, waiting on that lock."""
    flushing = asyncio.create_task(usage.flush(pool))
    for _ in range(200):
        waiting = await blocker.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%INSERT INTO provider_calls%'")
        if waiting is not None:
            return flushing
        await asyncio.sleep(0.02)
    raise AssertionError("the flush never waited on the lock")


@pytest.mark.parametrize("outcome", ["written", "connection lost"])
async def test_calls_counted_during_a_flush_are_not_lost(
    outcome: str, fake: FakeProviders, pool: asyncpg.Pool, settings: Settings,
    tenant: tuple[int, str],
) -> None:
    model = model_name()
    await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
    assert settings.database_url
    blocker = await asyncpg.connect(settings.database_url)
    try:
        async with blocker.transaction():
            await blocker.execute("LOCK TABLE provider_calls IN EXCLUSIVE MODE")
            flushing = await _flush_blocked(pool, blocker)
            # Counted while the flush is under way: not in what it took.
            await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
            await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
            if outcome == "connection lost":
                await blocker.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO provider_calls%'")
        if outcome == "written":
            assert await flushing == 1
            for row in (await stored(pool, model)).values():
                assert counts(row) == expected(calls=1, tokens_in=50, tokens_out=20)
        else:
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
                await flushing
            assert await stored(pool, model) == {}
    finally:
        await blocker.close()
    await usage.flush(pool)
    for row in (await stored(pool, model)).values():
        assert counts(row) == expected(calls=3, tokens_in=150, tokens_out=60)


async def test_a_summary_is_the_tenants_own(
    fake: FakeProviders, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    model = model_name()
    fake.script(status=429, headers={"Retry-After": "5"})
    await summarize(OpenAIChatSummarizer(make_settings(fake, model)), tenant[0])
    for _ in range(3):
        await summarize(OpenAIChatSummarizer(make_settings(fake, model)), other_tenant[0])
    # Older rows: a minute row two hours back is outside the last hour but inside the day; an
    # hour row two days back is outside both. Rows past their keep are pruned by the flush.
    await pool.execute(
        """INSERT INTO provider_calls (tenant_id, provider, model, grain, period, calls)
           VALUES ($1, 'openai', $2, 'minute', date_trunc('minute', now()) - interval '2 hours', 7),
                  ($1, 'openai', $2, 'hour', date_trunc('hour', now()) - interval '2 hours', 7),
                  ($1, 'openai', $2, 'hour', date_trunc('hour', now()) - interval '2 days', 9),
                  ($1, 'openai', $2, 'minute', now() - interval '4 hours', 1),
                  ($1, 'openai', $2, 'hour', now() - interval '9 days', 1)""",
        tenant[0], model)
    await usage.flush(pool)
    assert await pool.fetchval(
        "SELECT count(*) FROM provider_calls WHERE model = $1 AND grain <> 'total'"
        " AND period < now() - interval '3 hours' AND calls = 1", model) == 0

    mine = [s for s in await usage.provider_summary(pool, tenant[0]) if s.model == model]
    assert len(mine) == 1
    assert plain(mine[0].last_hour) == expected(calls=2, errors_429=1, retries=1,
                                                tokens_in=50, tokens_out=20)
    assert plain(mine[0].last_day) == expected(calls=9, errors_429=1, retries=1,
                                               tokens_in=50, tokens_out=20)
    assert mine[0].limited_until is not None and mine[0].last_limited_at is not None
    assert mine[0].limited_until - mine[0].last_limited_at > timedelta(seconds=4.9)

    theirs = [s for s in await usage.provider_summary(pool, other_tenant[0]) if s.model == model]
    assert plain(theirs[0].last_hour) == expected(calls=3, tokens_in=150, tokens_out=60)
    assert plain(theirs[0].last_day) == plain(theirs[0].last_hour)

    everyone = [s for s in await usage.provider_summary(pool, None) if s.model == model]
    assert everyone[0].last_hour.calls == 5 and everyone[0].last_day.calls == 12

    # A limit without calls: an operator sees it, a tenant that never called it does not.
    quiet = model_name()
    await summarize(OpenAIChatSummarizer(make_settings(fake, quiet)), None)
    fake.script(status=429, headers={"Retry-After": "1"})
    await summarize(OpenAIChatSummarizer(make_settings(fake, quiet)), None)
    await usage.flush(pool)
    assert [s.last_hour for s in await usage.provider_summary(pool, None)
            if s.model == quiet] == [Counts()]
    assert not [s for s in await usage.provider_summary(pool, tenant[0]) if s.model == quiet]

    totals = {(t.provider, t.model): t.counts for t in await usage.provider_totals(pool)}
    # The total grain counts every call, whatever its age (the older rows were added by hand
    # to the minute and hour grains only).
    assert plain(totals[("openai", model)]) == expected(calls=5, errors_429=1, retries=1,
                                                        tokens_in=200, tokens_out=80)


@pytest.fixture
async def queue(settings: Settings) -> AsyncIterator[ArqRedis]:
    redis = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    yield redis
    await redis.aclose()


async def test_a_worker_counts_calls_for_the_job_tenant(
    fake: FakeProviders, settings: Settings, pool: asyncpg.Pool, queue: ArqRedis,
    tenant: tuple[int, str], other_tenant: tuple[int, str],
) -> None:
    model = model_name()
    chatty = settings.model_copy(update={
        "summary_provider": "openai", "summary_model": model,
        "summary_base_url": f"{fake.url}/v1", "summary_api_key": KEY,
        "provider_rate_per_s": 1000, "provider_retry_max_wait_s": 0.05,
    })
    try:
        for tenant_id, item_ids in ((tenant[0], ["a", "b"]), (other_tenant[0], ["c"])):
            for item_id in item_ids:
                async with pool.acquire() as conn, conn.transaction():
                    result = await items.put_item(
                        conn, tenant_id=tenant_id, settings=chatty,
                        item=items.NewItem(id=item_id, content=f"{DOCUMENT} ({item_id})"))
                await jobs.enqueue(pool, queue, jobs.refs_to_enqueue(result.jobs),
                                   queue_name=chatty.queue_name)
        await drain(chatty, pool)  # the worker's shutdown flushes what it counted
    finally:
        shared = chat._SHARED.pop(chat._key(chatty), None)
        if shared is not None:
            await shared.client.aclose()  # type: ignore[attr-defined]

    summaries = {r["tenant_id"]: r["calls"] for r in await pool.fetch(
        "SELECT tenant_id, calls FROM provider_calls WHERE grain = 'total' AND model = $1",
        model)}
    assert summaries == {tenant[0]: 2, other_tenant[0]: 1}
    local = await pool.fetchval(
        "SELECT sum(calls) FROM provider_calls WHERE grain = 'total' AND provider = 'local'")
    assert local >= 2  # at least one model call per tenant's embeds (merged or not)
