"""The LangChain retrievers over memmill (`MemmillRetriever` for documents,
`MemmillMemoryRetriever` for memories) against the real API and a real worker, blocking and
async, with filters. The API runs in this test's event loop, so blocking calls run in a
thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda

from memmill import AsyncMemmill
from memmill.client import InvalidRequest
from memmill.integrations.langchain import MemmillMemoryRetriever, MemmillRetriever
from pipeline.settings import Settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTES = {
    "notes/bread": ("Sourdough rises thanks to wild yeast and lactic bacteria.", "baking"),
    "notes/rye": ("Rye bread is dense because rye flour holds little gluten.", "baking"),
    "notes/tides": ("The moon pulls the oceans, which makes the tides rise and fall.", "sea"),
}


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[None]:
    """A real worker, polling, so that writes can wait for their items and embeddings."""
    from workers.main import build_worker

    running = build_worker(settings, sweep=False, poll_delay_s=0.02)
    task = asyncio.create_task(running.main())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await running.close()


@pytest.fixture
async def corpus(api_url: str, tenant: tuple[int, str], worker: None) -> None:
    """The notes, ready (split, summarized and embedded), and a few memories, embedded."""
    async with AsyncMemmill(api_url, tenant[1]) as mm:
        for item_id, (text, topic) in NOTES.items():
            await mm.items.put(item_id, text, title=item_id.split("/")[1].title(),
                               tags={"topic": topic}, wait=True)
        await mm.memories.add("Ana prefers the window seat", user_id="ana",
                              type="preference", metadata={"trip": "lisbon"}, wait=True)
        await mm.memories.add("Ana is allergic to peanuts", user_id="ana",
                              metadata={"trip": "porto"}, wait=True)
        await mm.memories.add("Bob likes the aisle seat", user_id="bob", wait=True)


def retriever(api_url: str, key: str, **options: object) -> MemmillRetriever:
    return MemmillRetriever(url=api_url, api_key=key, **options)


async def test_documents_sync_and_async_with_text_scores_and_item_fields(
        api_url: str, tenant: tuple[int, str], corpus: None) -> None:
    found = retriever(api_url, tenant[1], limit=3)
    blocking = await asyncio.to_thread(found.invoke, "what makes bread rise")
    awaited = await found.ainvoke("what makes bread rise")
    assert [d.metadata["item_id"] for d in blocking] == [d.metadata["item_id"] for d in awaited]
    best = awaited[0]
    assert isinstance(best, Document) and best.metadata["item_id"] == "notes/bread"
    assert best.page_content == NOTES["notes/bread"][0]
    assert best.id == "notes/bread#0"
    assert best.metadata["title"] == "Bread" and best.metadata["tags"] == {"topic": "baking"}
    assert best.metadata["position"] == 0 and isinstance(best.metadata["part_id"], int)
    assert 0 < best.metadata["score"] <= 1
    assert best.metadata["scores"]["final"] == best.metadata["score"]
    assert "<<" in best.metadata["snippet"] and best.metadata["summary"]
    scores = [d.metadata["score"] for d in awaited]
    assert scores == sorted(scores, reverse=True) and len(awaited) == 3


async def test_filters_modes_and_per_call_options(
        api_url: str, tenant: tuple[int, str], corpus: None) -> None:
    sea = retriever(api_url, tenant[1], filters={"tags": {"topic": "sea"}})
    assert [d.metadata["item_id"] for d in await sea.ainvoke("bread rises")] == ["notes/tides"]
    baking = retriever(api_url, tenant[1], limit=10, mode="fts",
                       filters={"tags": {"topic": ["baking"]}, "item_ids": ["notes/rye"]})
    got = await asyncio.to_thread(baking.invoke, "bread")
    assert [d.metadata["item_id"] for d in got] == ["notes/rye"]
    assert got[0].metadata["scores"]["vector"] is None  # full text alone
    anything = retriever(api_url, tenant[1], limit=10)
    one = await anything.ainvoke("bread", limit=1, filters={"tags": {"topic": "baking"}})
    assert len(one) == 1 and one[0].metadata["tags"] == {"topic": "baking"}
    by_item = await anything.ainvoke("bread", group_by="item")
    assert len({d.metadata["item_id"] for d in by_item}) == len(by_item) == 3
    # A retriever is a Runnable: it composes and batches.
    chain = anything | RunnableLambda(lambda docs: [d.metadata["item_id"] for d in docs][:1])
    assert await chain.abatch(["sourdough yeast", "moon oceans"]) == [
        ["notes/bread"], ["notes/tides"]]


async def test_bad_options_are_clear_errors(api_url: str, tenant: tuple[int, str],
                                            corpus: None) -> None:
    with pytest.raises(InvalidRequest, match=r"filters\.colour"):
        await retriever(api_url, tenant[1], filters={"colour": "red"}).ainvoke("bread")
    with pytest.raises(InvalidRequest, match="created_after"):
        await retriever(api_url, tenant[1],
                        filters={"created_after": "yesterday"}).ainvoke("bread")
    with pytest.raises(ValueError, match="unknown search options"):
        await retriever(api_url, tenant[1]).ainvoke("bread", colour="red")
    with pytest.raises(ValueError, match="limit"):
        await retriever(api_url, tenant[1]).ainvoke("bread", limit=500)
    with pytest.raises(ValueError, match="mode"):
        retriever(api_url, tenant[1], mode="psychic")  # type: ignore[arg-type]


async def test_memories_of_a_scope_sync_and_async_with_a_metadata_filter(
        api_url: str, tenant: tuple[int, str], corpus: None) -> None:
    ana = MemmillMemoryRetriever(url=api_url, api_key=tenant[1], user_id="ana", limit=5)
    got = await ana.ainvoke("where does Ana like to sit")
    assert got[0].page_content == "Ana prefers the window seat"
    assert got[0].metadata["kind"] == "memory" and got[0].metadata["type"] == "preference"
    assert got[0].metadata["metadata"] == {"trip": "lisbon"} and got[0].metadata["score"] > 0
    assert {d.page_content for d in got} == {"Ana prefers the window seat",
                                             "Ana is allergic to peanuts"}
    porto = await asyncio.to_thread(ana.invoke, "seat", metadata_filter={"trip": "porto"})
    assert [d.page_content for d in porto] == ["Ana is allergic to peanuts"]
    bob = await ana.ainvoke("seat", user_id="bob")
    assert [d.page_content for d in bob] == ["Bob likes the aisle seat"]
    lisbon = MemmillMemoryRetriever(url=api_url, api_key=tenant[1], user_id="ana",
                                    metadata_filter={"trip": "lisbon"}, metadata={"run": "x"})
    assert [d.page_content for d in await lisbon.ainvoke("Ana")] == [
        "Ana prefers the window seat"]


EXAMPLE = '''
from memmill import Memmill
from memmill.integrations.langchain import MemmillMemoryRetriever, MemmillRetriever

with Memmill() as mm:  # MEMMILL_URL and MEMMILL_API_KEY
    mm.items.put("notes/bread", "Sourdough rises thanks to wild yeast.",
                 tags={"topic": "baking"}, wait=True)
    mm.items.put("notes/tides", "The moon makes the tides rise.", tags={"topic": "sea"},
                 wait=True)
    mm.memories.add("Ana prefers the window seat", user_id="ana", wait=True)

docs = MemmillRetriever(limit=3, filters={"tags": {"topic": "baking"}})
for doc in docs.invoke("what makes bread rise"):
    print(doc.metadata["item_id"], round(doc.metadata["score"], 3), doc.page_content)

memories = MemmillMemoryRetriever(user_id="ana", limit=2)
print([doc.page_content for doc in memories.invoke("where does Ana like to sit")])
'''


async def test_the_readme_example_runs(api_url: str, tenant: tuple[int, str],
                                       worker: None) -> None:
    env = {**os.environ, "MEMMILL_URL": api_url, "MEMMILL_API_KEY": tenant[1]}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", EXAMPLE, env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    text = output.decode()
    assert process.returncode == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("notes/bread ") and "wild yeast" in lines[0]
    assert "notes/tides" not in text and lines[-1] == "['Ana prefers the window seat']"


def test_without_langchain_the_import_names_the_extra() -> None:
    blocked = subprocess.run([sys.executable, "-c", (
        "import sys\n"
        "sys.modules['langchain_core'] = None\n"
        "try:\n"
        "    import memmill.integrations.langchain\n"
        "except ImportError as exc:\n"
        "    print(exc)\n")], capture_output=True, text=True, cwd=REPO, check=True)
    assert "pip install 'memmill[langchain]'" in blocked.stdout, blocked
