"""The HTTP providers against a real local server that speaks each provider's wire format
(OpenAI-compatible, Anthropic, Ollama), with a fault script per test: rate limits with
Retry-After, 5xx, bad keys, malformed answers, vectors of the wrong dimension, slow answers.
No mock of httpx: every request goes over a loopback socket to uvicorn."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from email.utils import formatdate
from typing import Any

import numpy as np
import pytest

from pipeline.errors import PermanentError, TransientError
from pipeline.providers import chat, embeddings, usage
from pipeline.providers.batching import BatchingEmbedder, CallShape
from pipeline.providers.chat import (
    AnthropicSummarizer,
    ExtractiveSummarizer,
    OllamaSummarizer,
    OpenAIChatSummarizer,
    build_prompt,
    clip,
    get_summarizer,
)
from pipeline.providers.embeddings import (
    LocalEmbedder,
    OllamaEmbedder,
    OpenAIEmbedder,
    QueryCache,
    get_embedder,
)
from pipeline.providers.http import parse_retry_after
from pipeline.settings import Settings
from pipeline.stages.summarize import summarize as extractive_summarize
from tests.fake_providers import (
    ANSWER,
    DIM,
    DOCUMENT,
    KEY,
    REFUSED_INPUT,
    FakeProviders,
    fake_vector,
    unit,
)


def make_settings(fake: FakeProviders, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "summary_provider": "openai",
        "summary_model": "gpt-x",
        "summary_base_url": f"{fake.url}/v1",
        "summary_api_key": KEY,
        "embedding_provider": "openai",
        "embedding_model": "embed-x",
        "embedding_base_url": f"{fake.url}/v1",
        "embedding_api_key": KEY,
        "embedding_dim": DIM,
        "provider_timeout_s": 5,
        "provider_concurrency": 4,
        "provider_rate_per_s": 1000,
        "provider_retries": 4,
        "provider_retry_max_wait_s": 0.05,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
async def made() -> AsyncIterator[list[Any]]:
    """Providers made by a test, whose connections are closed after it."""
    providers: list[Any] = []
    yield providers
    for provider in providers:
        await provider.client.aclose()


@pytest.fixture
def openai_chat(fake: FakeProviders, made: list[Any]) -> Callable[..., OpenAIChatSummarizer]:
    def build(**overrides: Any) -> OpenAIChatSummarizer:
        provider = OpenAIChatSummarizer(make_settings(fake, **overrides))
        made.append(provider)
        return provider

    return build


@pytest.fixture
def openai_embedder(fake: FakeProviders, made: list[Any]) -> Callable[..., OpenAIEmbedder]:
    def build(**overrides: Any) -> OpenAIEmbedder:
        provider = OpenAIEmbedder(make_settings(fake, **overrides))
        made.append(provider)
        return provider

    return build


# ----------------------------------------------------------------------------- summarizers


async def test_extractive_summarizer_needs_no_network(fake: FakeProviders) -> None:
    summarizer = get_summarizer(Settings(summary_provider="extractive", summary_max_chars=80))
    assert isinstance(summarizer, ExtractiveSummarizer)
    assert summarizer.name == "extractive"
    got = await summarizer.summarize(DOCUMENT, context=["something else entirely"])
    assert got == extractive_summarize(DOCUMENT, max_chars=80)
    assert fake.requests == []


async def test_openai_chat_summary_and_wire_format(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer]
) -> None:
    summarizer = openai_chat()
    related = ["Acme's second quarter report showed flat revenue.", "Lyon factory plans."]
    got = await summarizer.summarize(DOCUMENT, context=related)

    assert got == ANSWER.strip()
    assert summarizer.name == "openai:gpt-x"
    (seen,) = fake.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    body = seen.body
    assert body["model"] == "gpt-x"
    assert body["temperature"] == 0
    assert isinstance(body["max_tokens"], int) and body["max_tokens"] > 0
    system, user = body["messages"]
    assert system["role"] == "system" and system["content"]
    assert user["role"] == "user"
    assert "at most 600 characters" in user["content"]
    assert DOCUMENT in user["content"]
    for item in related:
        assert item in user["content"]
    # The background comes before, and apart from, the document.
    assert user["content"].index("</related_items>") < user["content"].index("<document>")


async def test_anthropic_summary_and_wire_format(fake: FakeProviders, made: list[Any]) -> None:
    summarizer = AnthropicSummarizer(make_settings(
        fake, summary_provider="anthropic", summary_base_url=fake.url, summary_model="claude-x",
    ))
    made.append(summarizer)
    got = await summarizer.summarize(DOCUMENT, context=["An earlier Acme report."])

    assert got == ANSWER.strip()  # the text block, not the thinking block before it
    (seen,) = fake.requests
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == KEY
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in seen.headers
    body = seen.body
    assert body["model"] == "claude-x"
    assert isinstance(body["max_tokens"], int)
    assert body["system"]
    (message,) = body["messages"]
    assert message["role"] == "user"
    assert DOCUMENT in message["content"] and "An earlier Acme report." in message["content"]


async def test_ollama_summary_and_wire_format(fake: FakeProviders, made: list[Any]) -> None:
    summarizer = OllamaSummarizer(make_settings(
        fake, summary_provider="ollama", summary_base_url=fake.url, summary_model="llama-x",
        summary_api_key=None,
    ))
    made.append(summarizer)
    assert await summarizer.summarize(DOCUMENT) == ANSWER.strip()
    (seen,) = fake.requests
    assert seen.path == "/api/chat"
    assert seen.body["model"] == "llama-x"
    assert seen.body["stream"] is False
    assert [m["role"] for m in seen.body["messages"]] == ["system", "user"]
    assert DOCUMENT in seen.body["messages"][1]["content"]
    assert "<related_items>" not in seen.body["messages"][1]["content"]  # no context given


async def test_a_long_answer_is_cut_at_a_word_boundary(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer]
) -> None:
    fake.script("answer", body="  " + "widget " * 60 + "\n")
    got = await openai_chat(summary_max_chars=50).summarize(DOCUMENT)
    assert len(got) <= 50
    assert got.endswith("widget…")
    assert got == got.strip()


async def test_context_is_truncated_to_a_budget(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer]
) -> None:
    related = [f"related item {i} " + "x" * 2000 for i in range(50)]
    await openai_chat(summary_max_chars=100).summarize(DOCUMENT, context=related)
    prompt = fake.requests[0].body["messages"][1]["content"]
    assert DOCUMENT in prompt
    assert "related item 0" in prompt
    assert "related item 49" not in prompt
    assert len(prompt) < len(DOCUMENT) + 1000


def test_prompt_and_clip_helpers() -> None:
    assert clip("  short  ", 50) == "short"
    cut = clip("alpha beta gamma delta epsilon zeta eta theta", 20)
    assert len(cut) <= 20 and cut == "alpha beta gamma…"
    prompt = build_prompt(DOCUMENT, ["", "   "], max_chars=300)
    assert "<related_items>" not in prompt  # blank context items are dropped


async def test_a_provider_without_a_model_names_the_setting(fake: FakeProviders) -> None:
    for provider in ("openai", "anthropic", "ollama"):
        settings = make_settings(fake, summary_provider=provider, summary_model="")
        with pytest.raises(PermanentError, match="MEMMILL_SUMMARY_MODEL"):
            get_summarizer(settings)


async def test_get_summarizer_is_one_per_configuration(fake: FakeProviders) -> None:
    settings = make_settings(fake)
    first = get_summarizer(settings)
    assert isinstance(first, OpenAIChatSummarizer)
    assert get_summarizer(make_settings(fake)) is first
    other = get_summarizer(make_settings(fake, summary_provider="anthropic"))
    assert isinstance(other, AnthropicSummarizer)
    assert isinstance(get_summarizer(make_settings(fake, summary_provider="ollama")),
                      OllamaSummarizer)
    for provider in ("openai", "anthropic", "ollama"):
        settings = make_settings(fake, summary_provider=provider)
        await chat._SHARED.pop(chat._key(settings)).client.aclose()  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- embedders


async def test_openai_embeddings_are_ordered_batched_and_normalized(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    embedder = openai_embedder(embedding_request_size=3)
    texts = [f"text number {i}" for i in range(7)]
    vectors = await embedder.embed(texts)

    assert [r.path for r in fake.requests] == ["/v1/embeddings"] * 3
    assert [r.body["input"] for r in fake.requests] == [texts[0:3], texts[3:6], texts[6:7]]
    for seen in fake.requests:
        assert seen.body["model"] == "embed-x"
        assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert len(vectors) == len(texts)
    for text, vector in zip(texts, vectors, strict=True):
        assert vector.dtype == np.float32 and vector.shape == (DIM,)
        assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)
        np.testing.assert_allclose(vector, unit(fake_vector(text)), atol=1e-6)
    assert embedder.model == "embed-x" and embedder.dim == DIM
    await embedder.warm_up()
    assert len(fake.requests) == 3  # warm_up sends nothing
    assert await embedder.embed([]) == []


async def test_ollama_embeddings(fake: FakeProviders, made: list[Any]) -> None:
    embedder = OllamaEmbedder(make_settings(
        fake, embedding_provider="ollama", embedding_base_url=fake.url, embedding_model="nomic-x",
        embedding_api_key=None,
    ))
    made.append(embedder)
    texts = ["one", "two"]
    vectors = await embedder.embed(texts)
    (seen,) = fake.requests
    assert seen.path == "/api/embed"
    assert seen.body == {"model": "nomic-x", "input": texts}
    for text, vector in zip(texts, vectors, strict=True):
        assert vector.dtype == np.float32
        np.testing.assert_allclose(vector, unit(fake_vector(text)), atol=1e-6)


async def test_query_cache_over_an_http_embedder(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    cache = QueryCache(openai_embedder())
    first = await cache.embed_query("what is acme")
    again = await cache.embed_query("what is acme")
    assert again is first
    assert len(fake.requests) == 1


async def test_wrong_dimension_is_permanent(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    fake.script("wrong_dim")
    with pytest.raises(PermanentError) as caught:
        await openai_embedder().embed(["hello"])
    message = str(caught.value)
    assert "embed-x" in message and str(DIM + 1) in message and "MEMMILL_EMBEDDING_DIM" in message
    assert len(fake.requests) == 1


async def test_get_embedder_chooses_by_provider(fake: FakeProviders) -> None:
    openai = get_embedder(make_settings(fake))
    assert isinstance(openai, BatchingEmbedder) and isinstance(openai.inner, OpenAIEmbedder)
    assert get_embedder(make_settings(fake)) is openai
    ollama = get_embedder(make_settings(fake, embedding_provider="ollama"))
    assert isinstance(ollama.inner, OllamaEmbedder)
    local = get_embedder(Settings(embedding_provider="local"))
    assert isinstance(local.inner, LocalEmbedder)
    assert get_embedder(Settings(embedding_provider="local")) is local
    assert (openai.model, openai.dim) == ("embed-x", DIM)
    for settings in (make_settings(fake), make_settings(fake, embedding_provider="ollama")):
        await embeddings._SHARED.pop(embeddings._key(settings)).inner.client.aclose()  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- merged embed calls


@pytest.fixture
def batcher(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> BatchingEmbedder:
    """Merges up to 8 texts per request; each request takes 0.2 s, so callers that arrive
    while one is answered queue up for the next."""
    fake.delay_s = 0.2
    return BatchingEmbedder(openai_embedder(embedding_request_size=8), CallShape(texts=8))


async def _after_first_request(fake: FakeProviders) -> None:
    while not fake.requests:
        await asyncio.sleep(0.005)


def _assert_vectors(texts: list[str], vectors: list[np.ndarray]) -> None:
    assert len(vectors) == len(texts)
    for text, vector in zip(texts, vectors, strict=True):
        np.testing.assert_allclose(vector, unit(fake_vector(text)), atol=1e-6)


async def test_concurrent_embeds_share_one_request(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    first = asyncio.create_task(batcher.embed(["first"]))
    await _after_first_request(fake)
    callers = [[f"item {i} part {j}" for j in range(i % 2 + 1)] for i in range(5)]  # 7 texts
    results = await asyncio.gather(*(batcher.embed(texts) for texts in callers))

    _assert_vectors(["first"], await first)
    for texts, vectors in zip(callers, results, strict=True):
        _assert_vectors(texts, vectors)
    assert [r.body["input"] for r in fake.requests] == [
        ["first"], [t for texts in callers for t in texts]
    ]
    assert batcher.calls == 2


async def test_merged_requests_stay_under_the_cap(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    first = asyncio.create_task(batcher.embed(["first"]))
    await _after_first_request(fake)
    callers = [[f"item {i} part {j}" for j in range(3)] for i in range(5)]  # 15 texts, cap 8
    results = await asyncio.gather(*(batcher.embed(texts) for texts in callers))
    await first

    for texts, vectors in zip(callers, results, strict=True):
        _assert_vectors(texts, vectors)
    inputs = [r.body["input"] for r in fake.requests]
    assert [len(i) for i in inputs] == [1, 8, 7]  # a caller's texts may span two requests
    assert inputs[1:] == [[t for texts in callers for t in texts][:8],
                          [t for texts in callers for t in texts][8:]]


async def test_another_tenants_text_heads_the_next_call(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    """A bulk load's 40 waiting texts do not hold back another tenant's one text: it heads
    the next request, and the two tenants then take turns heading them."""
    with usage.tenant_scope(1):
        bulk = [asyncio.create_task(batcher.embed([f"bulk {i}" for i in range(k, k + 4)]))
                for k in range(0, 40, 4)]
    await _after_first_request(fake)
    with usage.tenant_scope(2):
        lone = asyncio.create_task(batcher.embed(["the other tenant's text"]))
        more = asyncio.create_task(batcher.embed([f"more {i}" for i in range(10)]))
    await asyncio.gather(lone, more, *bulk)

    inputs = [r.body["input"] for r in fake.requests]
    assert inputs[0] == [f"bulk {i}" for i in range(8)]
    # Turn by turn: one text of each tenant, then the next of each, up to the cap.
    assert inputs[1] == ["the other tenant's text", "bulk 8", "more 0", "bulk 9", "more 1",
                         "bulk 10", "more 2", "bulk 11"]
    assert inputs[2][:2] == ["bulk 12", "more 3"]  # the bulk load heads the call after
    assert sorted(t for i in inputs for t in i) == sorted(
        ["the other tenant's text", *(f"bulk {i}" for i in range(40)),
         *(f"more {i}" for i in range(10))])


async def test_a_lone_text_gets_a_short_call(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    """No tenant gets more of a call than its head's tenant has waiting: one text heads a
    call of two, not one of a bulk load's full length."""
    with usage.tenant_scope(1):
        bulk = [asyncio.create_task(batcher.embed([f"bulk {i}" for i in range(k, k + 4)]))
                for k in range(0, 40, 4)]
    await _after_first_request(fake)
    with usage.tenant_scope(2):
        lone = asyncio.create_task(batcher.embed(["the other tenant's text"]))
    await asyncio.gather(lone, *bulk)

    inputs = [r.body["input"] for r in fake.requests]
    assert inputs[1][0] == "the other tenant's text"
    assert len(inputs[1]) == 2 and inputs[1][1].startswith("bulk ")
    assert [len(i) for i in inputs[2:]] == [8, 8, 8, 7]


async def test_a_long_text_is_not_passed_over_for_shorter_ones(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    """Calls are filled with texts of the head's length from a larger pool, but the head of
    the line is always in the call."""
    fake.delay_s = 0.1
    batcher = BatchingEmbedder(openai_embedder(embedding_request_size=4),
                               CallShape(texts=4, pool_texts=16))
    first = asyncio.create_task(batcher.embed(["first"]))
    await _after_first_request(fake)
    long_one = "a long text " * 20
    texts = [long_one, *[f"short {i}" for i in range(6)], "another long text " * 13,
             *[f"short {i}" for i in range(6, 12)], "third long text " * 15]
    got = await asyncio.gather(*(batcher.embed([t]) for t in texts))
    await first

    for text, vectors in zip(texts, got, strict=True):
        _assert_vectors([text], vectors)
    inputs = [r.body["input"] for r in fake.requests][1:]
    assert inputs[0][0] == long_one  # the head, with the other long texts beside it
    assert sorted(inputs[0][1:], key=len)[-2:] == sorted([texts[7], texts[14]], key=len)


async def test_a_refused_text_fails_only_its_own_caller(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    first = asyncio.create_task(batcher.embed(["first"]))
    await _after_first_request(fake)
    good, bad, other = ["a good text"], [f"a {REFUSED_INPUT} text"], ["another", "good one"]
    results = await asyncio.gather(
        batcher.embed(good), batcher.embed(bad), batcher.embed(other), return_exceptions=True
    )
    await first

    _assert_vectors(good, results[0])  # type: ignore[arg-type]
    assert isinstance(results[1], PermanentError) and "400" in str(results[1])
    _assert_vectors(other, results[2])  # type: ignore[arg-type]
    inputs = [r.body["input"] for r in fake.requests]
    assert inputs == [["first"], good + bad + other, good, bad, other]


async def test_a_cancelled_caller_sends_nothing(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    first = asyncio.create_task(batcher.embed(["first"]))
    await _after_first_request(fake)
    doomed = asyncio.create_task(batcher.embed(["never sent"]))
    kept = asyncio.create_task(batcher.embed(["kept"]))
    await asyncio.sleep(0.02)
    doomed.cancel()
    _assert_vectors(["kept"], await kept)
    await first
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert [r.body["input"] for r in fake.requests] == [["first"], ["kept"]]


async def test_a_long_call_is_cut_into_requests_of_the_cap(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    texts = [f"part {i}" for i in range(20)]
    _assert_vectors(texts, await batcher.embed(texts))
    assert [len(r.body["input"]) for r in fake.requests] == [8, 8, 4]
    assert await batcher.embed([]) == []
    assert batcher.calls == 3


async def test_a_cancelled_long_call_sends_no_more(
    fake: FakeProviders, batcher: BatchingEmbedder
) -> None:
    doomed = asyncio.create_task(batcher.embed([f"part {i}" for i in range(40)]))
    await _after_first_request(fake)
    doomed.cancel()
    kept = await batcher.embed(["kept"])
    _assert_vectors(["kept"], kept)
    assert [len(r.body["input"]) for r in fake.requests] == [8, 1]


# ----------------------------------------------------------------------------- retries and faults


async def test_429_waits_for_retry_after_then_succeeds(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer]
) -> None:
    fake.script(status=429, headers={"Retry-After": "1"})
    got = await openai_chat(provider_retry_max_wait_s=5).summarize(DOCUMENT)
    assert got == ANSWER.strip()
    first, second = fake.requests
    assert 0.9 <= second.at - first.at < 3


async def test_retry_after_is_capped_by_the_max_wait(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    fake.script(status=429, headers={"Retry-After": "120"})
    await openai_embedder(provider_retry_max_wait_s=0.3).embed(["hello"])
    first, second = fake.requests
    assert 0.25 <= second.at - first.at < 2


async def test_retry_after_zero_and_ms_are_quick(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    fake.script(status=429, times=2, headers={"Retry-After": "0"})
    fake.script(status=529, headers={"retry-after-ms": "10"})
    started = time.monotonic()
    (vector,) = await openai_embedder(provider_retry_max_wait_s=5).embed(["hello"])
    assert time.monotonic() - started < 1
    assert len(fake.requests) == 4
    np.testing.assert_allclose(vector, unit(fake_vector("hello")), atol=1e-6)


async def test_503_twice_then_success(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    fake.script(status=503, times=2)
    (vector,) = await openai_embedder().embed(["hello"])
    assert len(fake.requests) == 3
    np.testing.assert_allclose(vector, unit(fake_vector("hello")), atol=1e-6)


async def test_500_forever_is_transient_after_the_tries(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer]
) -> None:
    fake.script(status=500, times=None, body={"error": {"message": "the server is on fire"}})
    with pytest.raises(TransientError) as caught:
        await openai_chat(provider_retries=3).summarize(DOCUMENT)
    assert len(fake.requests) == 3
    message = str(caught.value)
    assert "500" in message and "the server is on fire" in message and "3 tries" in message


async def test_anthropic_overloaded_forever_is_transient(
    fake: FakeProviders, made: list[Any]
) -> None:
    fake.script(status=529, times=None)
    summarizer = AnthropicSummarizer(make_settings(
        fake, summary_provider="anthropic", summary_base_url=fake.url, provider_retries=2,
    ))
    made.append(summarizer)
    with pytest.raises(TransientError, match="529"):
        await summarizer.summarize(DOCUMENT)
    assert len(fake.requests) == 2


async def test_401_is_permanent_at_once_and_names_the_key_setting(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    fake.script(status=401)
    with pytest.raises(PermanentError) as caught:
        await openai_embedder().embed(["hello"])
    assert len(fake.requests) == 1
    message = str(caught.value)
    assert "401 Unauthorized" in message and "MEMMILL_EMBEDDING_API_KEY" in message
    # The tenant whose job failed reads this: it names the setting, never the host.
    assert "MEMMILL_EMBEDDING_BASE_URL" in message and "127.0.0.1" not in message


async def test_anthropic_without_a_key_is_permanent(fake: FakeProviders, made: list[Any]) -> None:
    summarizer = AnthropicSummarizer(make_settings(
        fake, summary_provider="anthropic", summary_base_url=fake.url, summary_api_key=None,
    ))
    made.append(summarizer)
    with pytest.raises(PermanentError, match="MEMMILL_SUMMARY_API_KEY") as caught:
        await summarizer.summarize(DOCUMENT)
    assert "authentication_error" in str(caught.value)
    assert len(fake.requests) == 1
    assert "x-api-key" not in fake.requests[0].headers


async def test_keys_never_reach_errors_or_logs(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = "sk-wrong-key-987654321"
    caplog.set_level(logging.DEBUG)
    fake.script(status=503, body={"error": {"message": f"upstream saw key {wrong}"}})
    with pytest.raises(PermanentError) as caught:
        await openai_chat(summary_api_key=wrong).summarize(DOCUMENT)
    assert len(fake.requests) == 2  # the 503 is retried, the 401 (echoing the key) is not
    message = str(caught.value)
    assert "MEMMILL_SUMMARY_API_KEY" in message and "Incorrect API key" in message
    assert wrong not in message
    assert "503" in caplog.text  # the retry was logged...
    assert wrong not in caplog.text  # ...without the key the server echoed
    assert KEY not in caplog.text


async def test_malformed_json_is_permanent(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer]
) -> None:
    fake.script("malformed")
    with pytest.raises(PermanentError, match="not JSON"):
        await openai_chat().summarize(DOCUMENT)
    assert len(fake.requests) == 1


async def test_unexpected_shapes_are_permanent(
    fake: FakeProviders, openai_chat: Callable[..., OpenAIChatSummarizer],
    openai_embedder: Callable[..., OpenAIEmbedder],
) -> None:
    fake.script("json", body={"object": "list", "data": []})
    with pytest.raises(PermanentError, match="0 embeddings for 2 inputs"):
        await openai_embedder().embed(["a", "b"])
    fake.script("json", body={"choices": []})
    with pytest.raises(PermanentError, match="unexpected shape"):
        await openai_chat().summarize(DOCUMENT)
    fake.script("answer", body="   ")
    with pytest.raises(PermanentError, match="empty summary"):
        await openai_chat().summarize(DOCUMENT)
    assert len(fake.requests) == 3


async def test_unreachable_server_is_transient(made: list[Any]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    embedder = OpenAIEmbedder(Settings(
        embedding_provider="openai", embedding_model="embed-x", embedding_dim=DIM,
        embedding_base_url=f"http://127.0.0.1:{port}/v1", provider_retries=2,
        provider_retry_max_wait_s=0.05,
    ))
    made.append(embedder)
    with pytest.raises(TransientError, match="ConnectError"):
        await embedder.embed(["hello"])


async def test_a_slow_answer_times_out_as_transient(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    fake.script("slow", times=2, delay_s=0.6)
    with pytest.raises(TransientError, match="no answer within"):
        await openai_embedder(provider_timeout_s=0.15, provider_retries=2).embed(["hello"])
    assert len(fake.requests) == 2


# ----------------------------------------------------------------------------- limits


async def test_concurrency_is_bounded(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    fake.delay_s = 0.2
    embedder = openai_embedder(provider_concurrency=2)
    started = time.monotonic()
    results = await asyncio.gather(*(embedder.embed([f"text {i}"]) for i in range(10)))
    elapsed = time.monotonic() - started
    assert len(results) == 10 and len(fake.requests) == 10
    assert fake.max_in_flight == 2
    assert elapsed >= 0.95  # five rounds of two


async def test_rate_is_bounded(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    embedder = openai_embedder(provider_rate_per_s=2)
    await asyncio.gather(*(embedder.embed([f"text {i}"]) for i in range(4)))
    arrivals = sorted(r.at for r in fake.requests)
    assert arrivals[-1] - arrivals[0] >= 0.9  # two at once, then one every half second


async def test_a_rate_below_one_per_second_works(
    fake: FakeProviders, openai_embedder: Callable[..., OpenAIEmbedder]
) -> None:
    (vector,) = await openai_embedder(provider_rate_per_s=0.5).embed(["hello"])
    assert vector.shape == (DIM,)


def test_one_embedder_serves_several_event_loops(fake: FakeProviders) -> None:
    """A worker may run more than one loop in its life; the client follows the loop."""
    embedder = OpenAIEmbedder(make_settings(fake))

    async def once() -> np.ndarray:
        try:
            (vector,) = await embedder.embed(["hello"])
            return vector
        finally:
            await embedder.client.aclose()

    first = asyncio.run(once())
    second = asyncio.run(once())
    np.testing.assert_array_equal(first, second)
    assert len(fake.requests) == 2


def test_parse_retry_after() -> None:
    now = time.time()
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-4") == 0.0
    in_ten = parse_retry_after(formatdate(now + 10, usegmt=True), now=now)
    assert in_ten is not None and 9 <= in_ten <= 10
    assert parse_retry_after(formatdate(now - 100, usegmt=True), now=now) == 0.0


class _ThreadRecordingEmbedder(LocalEmbedder):
    """The real local model, noting which thread encoded which texts."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.seen: list[tuple[str, list[str]]] = []
        self.nice: set[int] = set()

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        self.seen.append((threading.current_thread().name, list(texts)))
        vectors = super()._encode(texts)  # the first call on a thread loads its copy
        self.nice.add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return vectors


async def test_local_model_copies_each_run_calls_and_keep_the_order() -> None:
    """Two copies, each on its own thread, run calls of their own side by side; the vectors
    come back in each caller's order and equal one copy's, whatever the call size."""
    texts = [f"{'long ' * (i % 7)}text number {i} about {topic}"
             for i, topic in enumerate(["glaciers", "bread", "tides", "bees", "comets"] * 2)]
    options = {"model": "all-MiniLM-L6-v2", "dim": 384, "batch_size": 4}
    expected = await LocalEmbedder(**options, copies=1).embed(texts)
    two = _ThreadRecordingEmbedder(**options, copies=2, thread_nice=3)
    await two.warm_up()
    assert len({thread for thread, _ in two.seen}) == 2  # the warm-up loaded both copies
    if sys.platform == "linux":  # a worker's model threads yield the CPU to the rest
        assert two.nice == {os.getpriority(os.PRIO_PROCESS, 0) + 3}
    two.seen.clear()
    batcher = BatchingEmbedder(two, CallShape(texts=4, pool_texts=8, parallel=2))
    got = await asyncio.gather(*(batcher.embed(texts[i:i + 2]) for i in range(0, 10, 2)))
    for want, have in zip(expected, [v for vectors in got for v in vectors], strict=True):
        assert np.allclose(want, have, atol=1e-5)
    assert len({thread for thread, _ in two.seen}) == 2  # both copies worked
    assert sorted(t for _, call in two.seen for t in call) == sorted(texts)
    assert max(len(call) for _, call in two.seen) == 4
