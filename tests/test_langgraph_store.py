"""`MemmillStore`, the LangGraph store kept in memmill, against the real API and a real worker,
side by side with LangGraph's own `InMemoryStore` wherever LangGraph documents what the
answer is: the same puts, gets, deletes, filtered searches and namespace listings give the
same items on both, through the blocking methods and the async ones.

The API runs in this test's event loop, so the blocking store runs in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypedDict

import asyncpg
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from memmill import AsyncMemmill
from memmill.client import InvalidRequest, PermissionDenied
from memmill.integrations.langgraph import MemmillStore
from pipeline import tenants
from pipeline.settings import Settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[None]:
    """A real worker, polling, so that puts that wait for their embedding return."""
    from workers.main import build_worker

    running = build_worker(settings, sweep=False, poll_delay_s=0.02)
    task = asyncio.create_task(running.main())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await running.close()


@pytest.fixture
async def store(api_url: str, tenant: tuple[int, str], worker: None) -> AsyncIterator[
        MemmillStore]:
    async with MemmillStore(api_url, tenant[1], agent_id="a1", wait_for_index=True,
                            index={"fields": ["text"]}) as made:
        yield made


def words_embed(texts: Sequence[str]) -> list[list[float]]:
    """A deterministic embedding for InMemoryStore: hashed bag of words, normalized."""
    vectors = []
    for text in texts:
        vector = [0.0] * 64
        for word in text.lower().split():
            vector[int(hashlib.md5(word.strip(".,?").encode()).hexdigest(), 16) % 64] += 1
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        vectors.append([v / norm for v in vector])
    return vectors


def reference() -> InMemoryStore:
    return InMemoryStore(index={"dims": 64, "embed": words_embed, "fields": ["text"]})


async def call(store: BaseStore, name: str, *args: Any, blocking: bool, **kwargs: Any) -> Any:
    """A store method, blocking (in a thread, the API being in this loop) or awaited."""
    if blocking:
        return await asyncio.to_thread(getattr(store, name), *args, **kwargs)
    return await getattr(store, f"a{name}")(*args, **kwargs)


def shown(found: Any) -> Any:
    """What the stores must agree on: namespace, key and value (memmill's times and scores
    are its own)."""
    if isinstance(found, Item):
        return (found.namespace, found.key, found.value)
    if isinstance(found, list):
        return sorted((shown(f) for f in found), key=repr)
    return found


ITEMS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("docs", "ana"), "glacier", {"text": "Glaciers carve valleys as the ice moves downhill.",
                                  "score": 5, "status": "active", "tags": ["ice", "geo"],
                                  "meta": {"lang": "en", "pages": 3}}),
    (("docs", "ana"), "bread", {"text": "Sourdough rises thanks to wild yeast.", "score": 3,
                                "status": "draft", "tags": ["food"],
                                "meta": {"lang": "fr", "pages": 1}}),
    (("docs", "ana", "drafts"), "tides", {"text": "The moon pulls the tides twice a day.",
                                          "score": 2.5, "status": "active",
                                          "tags": ["sea"], "meta": {"lang": "en"}}),
    (("docs", "bob"), "otters", {"text": "Sea otters shelter in kelp forests.", "score": 1,
                                 "status": "active", "tags": ["sea", "animals"],
                                 "meta": {"lang": "en", "pages": 2}}),
    (("notes",), "todo", {"text": "Buy flour and yeast.", "score": 4, "status": "done",
                          "tags": [], "meta": {}}),
]
FILTERS: list[dict[str, Any]] = [
    {"status": "active"}, {"score": 3}, {"score": 2.5}, {"score": {"$eq": 5}},
    {"score": {"$ne": 5}}, {"score": {"$gt": 3}}, {"score": {"$gte": 3}},
    {"score": {"$lt": 3}}, {"score": {"$lte": 3}}, {"score": {"$gt": 1, "$lt": 5}},
    {"status": {"$ne": "draft"}}, {"status": {"$eq": "done"}}, {"tags": ["sea", "animals"]},
    {"tags": ["sea"]}, {"meta": {"lang": "en"}}, {"meta": {"lang": "en", "pages": 2}},
    {"status": "active", "score": {"$gte": 2}}, {"status": "missing"}, {"nothing": None},
]


@pytest.mark.parametrize("blocking", [True, False], ids=["sync", "async"])
async def test_put_get_search_and_delete_answer_as_langgraphs_own_store(
        store: MemmillStore, blocking: bool) -> None:
    mine, theirs = store, reference()
    for namespace, key, value in ITEMS:
        for s in (mine, theirs):
            await call(s, "put", namespace, key, value, blocking=blocking)
    for namespace, key, _ in [*ITEMS, (("docs", "ana"), "nowhere", {}), (("nope",), "x", {})]:
        got = await call(mine, "get", namespace, key, blocking=blocking)
        assert shown(got) == shown(theirs.get(namespace, key)), (namespace, key)

    for prefix in [(), ("docs",), ("docs", "ana"), ("docs", "ana", "drafts"), ("nope",)]:
        for filter in [None, *FILTERS]:
            got = await call(mine, "search", prefix, filter=filter, limit=50, blocking=blocking)
            assert shown(got) == shown(theirs.search(prefix, filter=filter, limit=50)), (
                prefix, filter)

    # Pages of a listing: the same sizes, together every item once.
    pages = [await call(mine, "search", ("docs",), limit=2, offset=o, blocking=blocking)
             for o in (0, 2, 4)]
    assert [len(p) for p in pages] == [len(theirs.search(("docs",), limit=2, offset=o))
                                       for o in (0, 2, 4)] == [2, 2, 0]
    assert sorted(i.key for p in pages for i in p) == ["bread", "glacier", "otters", "tides"]

    # A put over an item changes it (and keeps when it was made); a delete removes it.
    before = await call(mine, "get", ("docs", "ana"), "bread", blocking=blocking)
    for s in (mine, theirs):
        await call(s, "put", ("docs", "ana"), "bread", {"text": "Rye bread is dense.",
                                                         "score": 9}, blocking=blocking)
        await call(s, "delete", ("docs", "bob"), "otters", blocking=blocking)
    after = await call(mine, "get", ("docs", "ana"), "bread", blocking=blocking)
    assert shown(after) == shown(theirs.get(("docs", "ana"), "bread"))
    assert after.created_at == before.created_at and after.updated_at > before.updated_at
    assert await call(mine, "get", ("docs", "bob"), "otters", blocking=blocking) is None
    assert shown(await call(mine, "search", ("docs",), filter={"score": {"$gt": 4}},
                            blocking=blocking)) == shown(
        theirs.search(("docs",), filter={"score": {"$gt": 4}}))


async def memory_of(store: MemmillStore, api_url: str, key: str,
                    namespace: tuple[str, ...], item_key: str) -> Any:
    async with AsyncMemmill(api_url, key) as mm:
        page = await mm.memories.list(agent_id="a1", valid_only=False, metadata={
            "langgraph": {"ns": ".".join(namespace), "key": item_key}})
    assert len(page.data) == 1, page.data
    return page.data[0]


async def test_a_query_ranks_by_memmills_hybrid_search_over_the_indexed_fields(
        store: MemmillStore, api_url: str, tenant: tuple[int, str]) -> None:
    theirs = reference()
    for namespace, key, value in ITEMS:
        await store.aput(namespace, key, value)
        theirs.put(namespace, key, value)
    await store.aput(("docs", "ana"), "hidden", {"text": "Glaciers and ice everywhere.",
                                                 "score": 0}, index=False)
    theirs.put(("docs", "ana"), "hidden", {"text": "Glaciers and ice everywhere.", "score": 0},
               index=False)
    await store.aput(("docs", "ana"), "titled", {"title": "Volcanoes", "text": "Lava flows.",
                                                 "score": 0}, index=["title"])

    found = await store.asearch(("docs",), query="how do glaciers move ice", limit=50)
    assert found[0].key == "glacier" and isinstance(found[0].score, float)
    assert found[0].score > 0
    assert [i.score for i in found].index(None) == len(found) - 1  # not indexed: last, no score
    assert found[-1].key == "hidden"
    theirs_found = theirs.search(("docs",), query="how do glaciers move ice", limit=50)
    assert theirs_found[0].key == "glacier" and theirs_found[-1].key == "hidden"
    assert {i.key for i in found} - {"titled"} == {i.key for i in theirs_found}
    filtered = await store.asearch(("docs",), query="sea", filter={"score": {"$lt": 2}})
    assert [i.key for i in filtered] == ["otters", "titled", "hidden"]
    paged = [await store.asearch(("docs",), query="glaciers", limit=3, offset=o)
             for o in (0, 3, 6)]
    assert [i.key for p in paged for i in p] == [i.key for i in await store.asearch(
        ("docs",), query="glaciers", limit=9)]

    # What memmill embeds and indexes is the text of the fields the index names.
    assert (await memory_of(store, api_url, tenant[1], ("docs", "ana"), "glacier")).content == (
        "Glaciers carve valleys as the ice moves downhill.")
    assert (await memory_of(store, api_url, tenant[1], ("docs", "ana"), "titled")).content == (
        "Volcanoes")
    hidden = await memory_of(store, api_url, tenant[1], ("docs", "ana"), "hidden")
    assert hidden.content == "docs/ana/hidden" and not hidden.metadata["langgraph"]["indexed"]
    # memmill's own search finds the store's items in the store's scope.
    async with AsyncMemmill(api_url, tenant[1]) as mm:
        hits = await mm.memories.search("glaciers carve valleys", agent_id="a1")
    assert hits.results[0].content.startswith("Glaciers carve valleys")


@pytest.mark.parametrize("blocking", [True, False], ids=["sync", "async"])
async def test_namespaces_list_as_langgraph_lists_them(store: MemmillStore,
                                                       blocking: bool) -> None:
    theirs = reference()
    namespaces = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"),
                  ("a", "c", "f"), ("x", "y"), ("x", "b", "f")]
    for i, namespace in enumerate(namespaces):
        for s in (store, theirs):
            await call(s, "put", namespace, f"k{i}", {"text": f"item {i}"}, blocking=blocking)
    await call(store, "put", ("a", "b", "c"), "second", {"text": "another"}, blocking=blocking)
    cases: list[dict[str, Any]] = [
        {}, {"prefix": ("a",)}, {"prefix": ("a", "b")}, {"prefix": ("a", "b"), "max_depth": 3},
        {"max_depth": 1}, {"max_depth": 2}, {"suffix": ("f",)}, {"suffix": ("d", "*")},
        {"prefix": ("a", "*", "f")}, {"prefix": ("*", "b")}, {"prefix": ("a",), "suffix": ("f",)},
        {"limit": 2}, {"limit": 3, "offset": 2}, {"offset": 6}, {"prefix": ("nothing",)},
        {"prefix": ("a", "b", "c", "d", "e")},
    ]
    for case in cases:
        got = await call(store, "list_namespaces", blocking=blocking, **case)
        assert got == theirs.list_namespaces(**case), case


async def test_batch_runs_every_op_in_order(store: MemmillStore) -> None:
    ops = [PutOp(("b",), "one", {"text": "first"}), PutOp(("b", "c"), "two", {"text": "2nd"}),
           GetOp(("b",), "one"), SearchOp(("b",), filter={"text": "2nd"}),
           ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("b",)),)),
           PutOp(("b",), "one", None), GetOp(("b",), "one")]
    results = await asyncio.to_thread(store.batch, ops)
    assert results[:2] == [None, None] and results[5:] == [None, None]
    assert isinstance(results[2], Item) and results[2].value == {"text": "first"}
    assert [i.key for i in results[3]] == ["two"] and isinstance(results[3][0], SearchItem)
    assert results[4] == [("b",), ("b", "c")]
    again = await store.abatch(ops[2:5])
    assert again[0] is None and [i.key for i in again[1]] == ["two"]
    assert again[2] == [("b", "c")]


async def test_concurrent_puts_of_a_new_item_make_one_memory(
        api_url: str, tenant: tuple[int, str], worker: None) -> None:
    stores = [MemmillStore(api_url, tenant[1], agent_id="a1") for _ in range(4)]
    await asyncio.gather(*(s.aput(("race",), "k", {"text": f"writer {i}"})
                           for i, s in enumerate(stores)))
    async with AsyncMemmill(api_url, tenant[1]) as mm:
        page = await mm.memories.list(agent_id="a1", metadata={"langgraph": {"key": "k"}})
    assert len(page.data) == 1
    got = await stores[0].aget(("race",), "k")
    assert got is not None and got.value["text"].startswith("writer ")
    for s in stores:
        await s.aclose()


async def test_ttl_expires_items_refreshes_them_on_read_and_removes_them(
        api_url: str, tenant: tuple[int, str], worker: None) -> None:
    ttl_min = 0.1  # six seconds
    async with MemmillStore(api_url, tenant[1], agent_id="a1",
                            ttl={"default_ttl": ttl_min, "refresh_on_read": True}) as store, \
            AsyncMemmill(api_url, tenant[1]) as mm:
        started = time.monotonic()
        await store.aput(("t",), "read", {"text": "refreshed by reads"})
        await store.aput(("t",), "unread", {"text": "left alone"})
        await store.aput(("t",), "forever", {"text": "no expiry"}, ttl=None)
        await asyncio.to_thread(store.put, ("t",), "short", {"text": "short"}, ttl=ttl_min / 2)

        await asyncio.sleep(3.5 - (time.monotonic() - started))
        assert (await store.aget(("t",), "read")) is not None  # moves its expiry to ~9.5 s
        assert await store.aget(("t",), "short") is None  # expired at 3 s, and deleted
        assert await asyncio.to_thread(store.get, ("t",), "unread", refresh_ttl=False)
        await asyncio.sleep(7.5 - (time.monotonic() - started))
        assert await store.aget(("t",), "unread") is None  # expired at 6 s
        assert (await store.aget(("t",), "read")) is not None  # lives on: it was read
        assert {i.key for i in await store.asearch(("t",))} == {"read", "forever"}
        # memmill's own readers leave the expired items out too; they were deleted on the way.
        memmill_sees = await mm.memories.list(agent_id="a1", valid_only=False)
        assert sorted(m.metadata["langgraph"]["key"] for m in memmill_sees.data) == [
            "forever", "read"]
        await asyncio.sleep(max(0.0, 7.5 + ttl_min * 60 + 1.5 - (time.monotonic() - started)))
        assert [i.key for i in await store.asearch(("t",), query="refreshed by reads")] == [
            "forever"]
        assert await asyncio.to_thread(store.sweep_ttl) == 1
        assert await store.asweep_ttl() == 0
        assert [m.metadata["langgraph"]["key"] for m in (await mm.memories.list(
            agent_id="a1", valid_only=False)).data] == ["forever"]
        # A put without a TTL over an item that has one makes it last.
        await store.aput(("t",), "forever", {"text": "still here"}, ttl=ttl_min)
        await store.aput(("t",), "forever", {"text": "for good"}, ttl=None)
        assert (await mm.memories.list(agent_id="a1")).data[0].valid_until is None


async def test_a_graph_remembers_in_one_thread_and_recalls_in_another(
        api_url: str, tenant: tuple[int, str], worker: None) -> None:
    class State(TypedDict, total=False):
        user: str
        said: str
        recalled: list[str]

    async def remember(state: State) -> State:
        if state["said"].startswith("remember: "):
            fact = state["said"].removeprefix("remember: ")
            await get_store().aput(("memories", state["user"]), str(uuid.uuid4()),
                                   {"text": fact})
        return {}

    async def recall(state: State) -> State:
        hits = await get_store().asearch(("memories", state["user"]), query=state["said"])
        return {"recalled": [h.value["text"] for h in hits]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    async with MemmillStore(api_url, tenant[1], agent_id="assistant", user_label=1,
                            wait_for_index=True, index={"fields": ["text"]}) as store:
        graph = builder.compile(checkpointer=InMemorySaver(), store=store)
        one = {"configurable": {"thread_id": "thread-1"}}
        two = {"configurable": {"thread_id": "thread-2"}}
        await graph.ainvoke({"user": "ana", "said": "remember: Ana prefers the window seat"},
                            one)
        await graph.ainvoke({"user": "bob", "said": "remember: Bob prefers the aisle"}, one)
        answer = await graph.ainvoke({"user": "ana", "said": "where does Ana like to sit?"},
                                     two)
        assert answer["recalled"] == ["Ana prefers the window seat"]
        assert (await graph.aget_state(one)).values["said"].startswith("remember: Bob")
        assert (await graph.aget_state(two)).values["said"] == "where does Ana like to sit?"
    # The namespace's user label made them ana's and bob's memories in memmill's scopes.
    async with AsyncMemmill(api_url, tenant[1]) as mm:
        context = await mm.context(user_id="ana", agent_id="assistant", query="seat")
        assert "Ana prefers the window seat" in context.context
        assert "aisle" not in context.context
        bobs = await mm.memories.list(user_id="bob", agent_id="assistant")
        assert [m.content for m in bobs.data] == ["Bob prefers the aisle"]


async def bound_key(pool: asyncpg.Pool, tenant_id: int, agent: str) -> str:
    key = tenants.new_key()
    await tenants.add_key(pool, tenant_id, key, name=agent, role="write", agent_id=agent)
    return key


async def test_keys_bound_to_two_agents_keep_their_items_apart(
        api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool, worker: None) -> None:
    planner_key = await bound_key(pool, tenant[0], "planner")
    critic_key = await bound_key(pool, tenant[0], "critic")
    async with MemmillStore(api_url, planner_key) as planner, \
            MemmillStore(api_url, critic_key) as critic:
        await planner.aput(("plans",), "today", {"text": "ship the release"})
        assert await critic.aget(("plans",), "today") is None
        assert await critic.asearch(("plans",)) == []
        assert await critic.asearch((), query="ship the release") == []
        assert await critic.alist_namespaces() == []
        # The same item name is the critic's own item, and deleting it leaves the planner's.
        await asyncio.to_thread(critic.put, ("plans",), "today", {"text": "review the release"})
        assert (await critic.aget(("plans",), "today")).value == {"text": "review the release"}
        assert (await planner.aget(("plans",), "today")).value == {"text": "ship the release"}
        await critic.adelete(("plans",), "today")
        assert await critic.aget(("plans",), "today") is None
        assert (await planner.aget(("plans",), "today")).value == {"text": "ship the release"}
    async with MemmillStore(api_url, critic_key, agent_id="planner") as impostor:
        with pytest.raises(PermissionDenied, match="bound to agent 'critic'"):
            await impostor.aget(("plans",), "today")
        with pytest.raises(PermissionDenied):
            await impostor.aput(("plans",), "today", {"text": "overwritten"})
    async with AsyncMemmill(api_url, tenant[1]) as mm:
        page = await mm.memories.list(agent_id="planner")
        # Without index fields the whole value is what memmill embeds and indexes.
        assert [m.content for m in page.data] == ['{"text": "ship the release"}']


async def test_bad_input_is_a_clear_exception(store: MemmillStore, api_url: str,
                                              tenant: tuple[int, str]) -> None:
    async def refused(error: type[Exception], words: str, action: Callable[[], Any]) -> None:
        with pytest.raises(error, match=words):
            await action()

    await refused(InvalidNamespaceError, "periods", lambda: store.aput(("a.b",), "k", {}))
    await refused(InvalidNamespaceError, "empty", lambda: store.aput((), "k", {}))
    await refused(InvalidNamespaceError, "langgraph", lambda: store.aput(("langgraph",), "k", {}))
    await refused(InvalidNamespaceError, "periods",
                  lambda: store.abatch([GetOp(("x.y",), "k")]))
    await refused(ValueError, "unknown operator '\\$in'",
                  lambda: store.asearch(("a",), filter={"n": {"$in": [1]}}))
    await refused(ValueError, r"filter.n.\$gt: compares numbers",
                  lambda: store.asearch(("a",), filter={"n": {"$gt": "3"}}))
    await refused(ValueError, "limit", lambda: store.asearch(("a",), limit=-1))
    await refused(ValueError, "ttl: minutes", lambda: store.aput(("a",), "k", {}, ttl=0))
    await refused(ValueError, "not JSON", lambda: store.aput(("a",), "k", {"t": object()}))
    await refused(ValueError, "at most 16000 bytes",
                  lambda: store.aput(("a",), "k", {"t": "x" * 17_000}))
    await refused(InvalidRequest, "query", lambda: store.asearch(("a",), query="q" * 3000))
    for bad in ({"index": {"dims": 3, "embed": words_embed}}, {"index": {"fields": "text"}},
                {"ttl": {"sweep_interval_minutes": 5}}, {"ttl": {"default_ttl": -1}},
                {"user_label": -1}, {"index": {"feilds": ["text"]}}):
        with pytest.raises(ValueError):
            MemmillStore(api_url, tenant[1], **bad)
    async with MemmillStore(api_url, tenant[1]) as nobody, \
            MemmillStore(api_url, tenant[1], user_label=0) as labelled:
        await refused(InvalidRequest, "visibility", lambda: nobody.aput(("a",), "k", {}))
        await refused(InvalidRequest, "user_id", lambda: labelled.aput(("a b",), "k", {}))
    assert await store.asearch(("a",)) == []


EXAMPLE = '''
from memmill.integrations.langgraph import MemmillStore

# MEMMILL_URL and MEMMILL_API_KEY; the items are agent "assistant"'s memories, and the
# namespace label at position 1 names the memmill user they belong to.
with MemmillStore(agent_id="assistant", user_label=1, index={"fields": ["text"]},
                  wait_for_index=True) as store:
    store.put(("memories", "ana"), "seat", {"text": "Ana prefers the window seat", "n": 3})
    store.put(("memories", "ana"), "meal", {"text": "Ana is vegetarian", "n": 1},
              ttl=60 * 24)  # minutes: gone after a day without a read or write
    for hit in store.search(("memories", "ana"), query="where does Ana like to sit",
                            filter={"n": {"$gte": 2}}):
        print(hit.key, round(hit.score, 3), hit.value["text"])
    print(store.get(("memories", "ana"), "meal").value)
    print(store.list_namespaces(prefix=("memories", "ana")))  # ana's: the label names her
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
    for expected in ("seat ", "Ana prefers the window seat", "'Ana is vegetarian'",
                     "[('memories', 'ana')]"):
        assert expected in text, (expected, text)
    assert "meal 0" not in text


def test_without_langgraph_the_import_names_the_extra_and_the_core_never_imports_it() -> None:
    blocked = subprocess.run([sys.executable, "-c", (
        "import sys\n"
        "sys.modules['langgraph'] = None\n"
        "try:\n"
        "    import memmill.integrations.langgraph\n"
        "except ImportError as exc:\n"
        "    print(exc)\n")], capture_output=True, text=True, cwd=REPO, check=True)
    assert "pip install 'memmill[langgraph]'" in blocked.stdout, blocked
    core = subprocess.run([sys.executable, "-c", (
        "import sys, memmill, memmill.client, memmill.cli, api.main\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langgraph', 'langchain_core')))\n")], capture_output=True, text=True, cwd=REPO,
        check=True)
    assert core.stdout.strip() == "[]", core
