"""`MemmillStore`: a LangGraph store (`langgraph.store.base.BaseStore`) whose items are
memmill memories, so what a graph remembers is searched by memmill's hybrid search, kept
per user and agent by memmill's scopes and keys, and seen by memmill's own readers (search,
context) too. Needs the `langgraph` extra: `pip install 'memmill[langgraph]'`.

    from memmill.integrations.langgraph import MemmillStore

    store = MemmillStore(agent_id="planner")  # MEMMILL_URL and MEMMILL_API_KEY
    store.put(("memories", "ana"), "seat", {"text": "Ana prefers the window seat"})
    store.search(("memories", "ana"), query="where does Ana sit")

How items map onto memories is in `langgraph_codec`, each operation in `langgraph_plans`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from memmill.integrations import missing_extra

try:
    from langgraph.store.base import BaseStore, IndexConfig, Op, Result, TTLConfig
except ImportError as exc:  # pragma: no cover - exercised in a process without langgraph
    raise missing_extra(__name__, "LangGraph", "langgraph") from exc

from memmill.client import MemmillError, RetryPolicy
from memmill.client.clients import DEFAULT_TIMEOUT_S
from memmill.integrations import langgraph_plans as plans
from memmill.integrations.connection import Clients
from memmill.integrations.langgraph_codec import StoreScope, Visibility
from memmill.integrations.langgraph_plans import Plan, Request, StoreConfig

__all__ = ["MemmillStore"]
T = TypeVar("T")


class MemmillStore(BaseStore):
    """A LangGraph store kept in memmill (see the module docstring).

    - `url`, `key`: the API and its key (default `MEMMILL_URL`, `MEMMILL_API_KEY`).
    - `user_id`, `agent_id`, `visibility`: the memmill scope of every item (memmill's rules:
      `user` when a user is named, else `private` to the agent; a store naming neither needs
      `visibility="tenant"`). A key bound to a user or agent acts as them in any case.
    - `user_label`: the position of the namespace label that names the user, so
      `("memories", "ana")` with `user_label=1` is ana's (see `StoreScope`).
    - `index`: LangGraph's IndexConfig; its `fields` choose the text memmill embeds and
      indexes (default `["$"]`, the whole value). memmill embeds with its own model, so an
      `embed` is refused; `dims` is ignored.
    - `ttl`: LangGraph's TTLConfig (`default_ttl` minutes, `refresh_on_read`). An expired item
      is left out of every read at once (it is the memory's `valid_until`) and deleted when a
      get or put meets it, or by `sweep_ttl()`.
    - `wait_for_index`: a put returns once the item is embedded (True, or seconds), so the
      next search finds it by meaning; by its words it is found at once anyway.
    """

    supports_ttl = True

    def __init__(self, url: str | None = None, key: str | None = None, *,
                 user_id: str | None = None, agent_id: str | None = None,
                 visibility: Visibility | None = None, user_label: int | None = None,
                 index: IndexConfig | None = None, ttl: TTLConfig | None = None,
                 memory_type: str = "fact", wait_for_index: bool | float = False,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None) -> None:
        self.ttl_config = _checked_ttl(ttl)
        self._config = StoreConfig(
            scope=StoreScope(user_id, agent_id, visibility, _checked_label(user_label)),
            fields=_index_fields(index), memory_type=memory_type, wait=wait_for_index)
        self._clients = Clients(url, key, timeout_s=timeout_s, retry=retry)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [drive(plans.plan_for(self._config, op), self._call) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        call = self._acall_in_this_loop()
        return [await adrive(plans.plan_for(self._config, op), call) for op in ops]

    def sweep_ttl(self, namespace_prefix: tuple[str, ...] = ()) -> int:
        """Delete the expired items under the prefix (they are left out of reads already);
        returns how many went."""
        return drive(plans.sweep(self._config, namespace_prefix), self._call)

    async def asweep_ttl(self, namespace_prefix: tuple[str, ...] = ()) -> int:
        return await adrive(plans.sweep(self._config, namespace_prefix),
                            self._acall_in_this_loop())

    def _call(self, request: Request) -> Any:
        return getattr(self._clients.sync.memories, request.method)(**request.kwargs)

    def _acall_in_this_loop(self) -> Callable[[Request], Awaitable[Any]]:
        memories = self._clients.for_this_loop().memories
        return lambda request: getattr(memories, request.method)(**request.kwargs)

    def close(self) -> None:
        self._clients.close()

    async def aclose(self) -> None:
        await self._clients.aclose()

    def __enter__(self) -> MemmillStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    async def __aenter__(self) -> MemmillStore:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def drive(plan: Plan[T], call: Callable[[Request], Any]) -> T:
    """Run a plan with a blocking client: each request's answer is sent back into it, each
    refusal thrown into it (a plan handles the ones it expects, such as a Conflict)."""
    answer: Any = None
    error: MemmillError | None = None
    while True:
        try:
            request = plan.throw(error) if error is not None else plan.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            answer, error = call(request), None
        except MemmillError as exc:
            answer, error = None, exc


async def adrive(plan: Plan[T], call: Callable[[Request], Awaitable[Any]]) -> T:
    """`drive` with an async client."""
    answer: Any = None
    error: MemmillError | None = None
    while True:
        try:
            request = plan.throw(error) if error is not None else plan.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            answer, error = await call(request), None
        except MemmillError as exc:
            answer, error = None, exc


def _index_fields(index: IndexConfig | None) -> tuple[str, ...]:
    if index is None:
        return ("$",)
    unknown = set(index) - {"fields", "dims", "embed"}
    if unknown:
        raise ValueError(f"index: unknown keys {sorted(unknown)}; MemmillStore takes 'fields'")
    if index.get("embed") is not None:
        raise ValueError("index.embed: memmill embeds items with its own model "
                         "(MEMMILL_EMBEDDING_* settings); give only index={'fields': [...]}")
    fields = index.get("fields") or ["$"]
    if isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields):
        raise ValueError(f"index.fields: a list of paths such as ['text', 'notes[*]'], "
                         f"not {fields!r}")
    return tuple(fields)


def _checked_ttl(ttl: TTLConfig | None) -> TTLConfig | None:
    if ttl is None:
        return None
    unknown = set(ttl) - {"default_ttl", "refresh_on_read", "omit_expired",
                          "sweep_interval_minutes"}
    if unknown:
        raise ValueError(f"ttl: unknown keys {sorted(unknown)}")
    if ttl.get("sweep_interval_minutes") is not None:
        raise ValueError("ttl.sweep_interval_minutes: MemmillStore runs no sweeper of its own; "
                         "expired items are left out of every read already, and sweep_ttl() "
                         "deletes them when you call it")
    default = ttl.get("default_ttl")
    if default is not None and (not isinstance(default, int | float)
                                or isinstance(default, bool) or default <= 0):
        raise ValueError(f"ttl.default_ttl: minutes, a number above 0, not {default!r}")
    return ttl


def _checked_label(label: int | None) -> int | None:
    if label is not None and (not isinstance(label, int) or isinstance(label, bool)
                              or label < 0):
        raise ValueError(f"user_label: the position of a namespace label (0, 1, ...), "
                         f"not {label!r}")
    return label
