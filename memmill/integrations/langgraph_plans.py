"""What each LangGraph store operation asks of memmill, written once for both clients.

A plan is a generator that yields `Request`s (a call of the client's `memories` group) and
is sent each answer, or thrown the client's exception; `MemmillStore.batch` drives plans with
the blocking client, `abatch` with the async one. So put, get, search, listing and TTL
handling exist once, and neither store wraps the other in a thread.

(namespace, key) names one item among the memories the store's scope may read: a get or a
put finds it by its metadata (`langgraph_codec.exact`), so a key bound to an agent, which acts
as that agent whatever the store says, finds its own items and never another agent's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from memmill.client.errors import Conflict, NotFound
from memmill.integrations import langgraph_codec as codec
from memmill.integrations import langgraph_filters as filters

T = TypeVar("T")
LIST_PAGE = 500  # GET /v1/memories answers at most this many a page
RANKED_PAGE = 100  # POST /v1/memories/search answers at most this many a page
MAX_RANKED_OFFSET = 10_000  # and pages no further than this
LOOKUP_LIMIT = 50  # memories of one item: one, or a few after writers raced
WRITE_ATTEMPTS = 4


@dataclass(frozen=True)
class Request:
    """One call a plan asks for: `client.memories.<method>(**kwargs)`, on either client."""

    method: str
    kwargs: dict[str, Any]


Plan = Generator[Request, Any, T]


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class StoreConfig:
    scope: codec.StoreScope = field(default_factory=codec.StoreScope)
    fields: tuple[str, ...] = ("$",)  # what is embedded and indexed (IndexConfig.fields)
    memory_type: str = "fact"
    wait: bool | float = False  # puts return once memmill has embedded the item
    now: Callable[[], datetime] = _utcnow


def plan_for(config: StoreConfig, op: Op) -> Plan[Result]:
    """The plan of one operation of a batch."""
    validate_op_namespace(op)
    if isinstance(op, GetOp):
        return get(config, op)
    if isinstance(op, PutOp):
        return put(config, op)
    if isinstance(op, SearchOp):
        return search(config, op)
    if isinstance(op, ListNamespacesOp):
        return list_namespaces(config, op)
    raise ValueError(f"unknown store operation {type(op).__name__}")


def lookup(config: StoreConfig, namespace: Sequence[str], key: str) -> Plan[list[Any]]:
    """The memories of one item the scope may read, valid or not, last written first."""
    page = yield Request("list", {**config.scope.of(namespace), "valid_only": False,
                                  "metadata": codec.exact(namespace, key),
                                  "limit": LOOKUP_LIMIT})
    return sorted(page.data, key=codec.updated_of, reverse=True)


def forget(config: StoreConfig, namespace: Sequence[str], rows: Sequence[Any]) -> Plan[None]:
    for row in rows:
        with contextlib.suppress(NotFound):  # deleted meanwhile: what was asked is done
            yield Request("delete", {"memory_id": str(row.id), **config.scope.of(namespace)})


def get(config: StoreConfig, op: GetOp) -> Plan[Item | None]:
    """The item, or None; an expired one is deleted on the way (LangGraph: an expired item
    is gone), and a read refreshes the TTL when asked to."""
    now = config.now()
    rows = yield from lookup(config, op.namespace, op.key)
    yield from forget(config, op.namespace, [
        r for r in rows if not codec.live(r, now) and codec.ttl_of(r) is not None])
    alive = [r for r in rows if codec.live(r, now)]
    if not alive:
        return None
    if op.refresh_ttl:
        yield from refresh(config, op.namespace, alive[0], now)
    return codec.to_item(alive[0])


def refresh(config: StoreConfig, namespace: Sequence[str], row: Any,
            now: datetime) -> Plan[None]:
    until = codec.refreshed_until(row, now)
    if until is None:
        return
    with contextlib.suppress(Conflict):  # written meanwhile: that write set the expiry itself
        yield expire(config, namespace, row.id, row.version, until, codec.ttl_of(row))


def expire(config: StoreConfig, namespace: Sequence[str], memory_id: Any, version: int,
           until: datetime, ttl_minutes: float | None) -> Request:
    """The end of an item's life, moved as memmill moves any memory's validity: by
    invalidating it from then on, with the reason."""
    return Request("invalidate", {"memory_id": str(memory_id), "expected_version": version,
                                  **config.scope.of(namespace), "valid_until": until,
                                  "reason": f"LangGraph TTL: {ttl_minutes:g} minutes after its "
                                            "last read or write"})


def put(config: StoreConfig, op: PutOp) -> Plan[None]:
    """Write the item: its memory changed in place when there is one (the version it was
    read at guards against a concurrent write, which makes this read again), else a new
    one. Expired memories of the item and those of writers that raced are deleted."""
    if op.value is None:
        yield from delete(config, op.namespace, op.key)
        return
    if not op.namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    if op.ttl is not None and (not isinstance(op.ttl, int | float) or isinstance(op.ttl, bool)
                               or op.ttl <= 0):
        raise ValueError(f"ttl: minutes, a number above 0 (or None: no expiry), not {op.ttl!r}")
    id_taken = False
    for _ in range(WRITE_ATTEMPTS):
        now = config.now()
        rows = yield from lookup(config, op.namespace, op.key)
        alive = [r for r in rows if codec.live(r, now)]
        # memmill cannot take a memory's valid_until away: a TTL dropped means a new memory.
        target = alive[0] if alive and (op.ttl is not None or alive[0].valid_until is None) \
            else None
        yield from forget(config, op.namespace, [r for r in rows if r is not target])
        created = codec.created_of(alive[0]) if alive else now
        try:
            if target is not None:
                yield from _update(config, op, target, created, now)
            else:
                yield _create(config, op, created, now, with_id=not id_taken)
            return
        except Conflict:
            # A stale version, or the item's id taken: by a concurrent put (read again and
            # update it) or by a memory this scope cannot read (then make it without an id).
            id_taken = target is None
    raise Conflict(f"{codec.namespace_text(op.namespace)!r}/{op.key!r} kept changing while "
                   f"it was written ({WRITE_ATTEMPTS} attempts)")


def _body(config: StoreConfig, op: PutOp, created: datetime,
          now: datetime) -> dict[str, Any]:
    paths = config.fields if op.index is None else tuple(op.index or ())
    text = codec.index_text(op.value or {}, paths) if op.index is not False else ""
    metadata = codec.record(op.namespace, op.key, op.value or {}, indexed=bool(text),
                            ttl_minutes=op.ttl, created_at=created, updated_at=now)
    return {"content": text or codec.placeholder(op.namespace, op.key), "metadata": metadata,
            "wait": config.wait, **config.scope.of(op.namespace)}


def _update(config: StoreConfig, op: PutOp, row: Any, created: datetime,
            now: datetime) -> Plan[None]:
    body = _body(config, op, created, now)
    body["metadata"] = {**(row.metadata or {}), **body["metadata"]}
    written = yield Request("update", {"memory_id": str(row.id),
                                       "expected_version": row.version, **body})
    until = codec.expires(op.ttl, now)
    if until is not None:
        yield expire(config, op.namespace, row.id, written.memory.version, until, op.ttl)


def _create(config: StoreConfig, op: PutOp, created: datetime, now: datetime, *,
            with_id: bool) -> Request:
    scope = config.scope.of(op.namespace)
    memory_id = codec.item_id(scope, config.scope.visibility, op.namespace, op.key)
    return Request("add", {**_body(config, op, created, now), "type": config.memory_type,
                           "visibility": config.scope.visibility, "source": "langgraph",
                           "valid_until": codec.expires(op.ttl, now),
                           "memory_id": memory_id if with_id else None})


def delete(config: StoreConfig, namespace: Sequence[str], key: str) -> Plan[None]:
    rows = yield from lookup(config, namespace, key)
    yield from forget(config, namespace, rows)


def search(config: StoreConfig, op: SearchOp) -> Plan[list[SearchItem]]:
    """With a query, memmill's hybrid ranking of the indexed items, then those not indexed
    (score None), as LangGraph's stores do; without, a listing, newest first. Filters the
    server cannot apply are checked here, page by page, until the page asked for is full."""
    filters.check(op.filter)
    for name, number in (("limit", op.limit), ("offset", op.offset)):
        if not isinstance(number, int) or number < 0:
            raise ValueError(f"{name}: must be a whole number from 0, not {number!r}")
    scope = config.scope.of(op.namespace_prefix)
    wanted = op.offset + op.limit
    exact = filters.containment(op.filter)
    narrow = {"value": exact} if exact else {}
    query = (op.query or "").strip()
    if query:
        found = yield from ranked(scope, query, codec.under(
            op.namespace_prefix, indexed=True, **narrow), op.filter, wanted)
        if len(found) < wanted:
            found += yield from listed(scope, codec.under(
                op.namespace_prefix, indexed=False, **narrow), op.filter, wanted - len(found))
    else:
        found = yield from listed(scope, codec.under(op.namespace_prefix, **narrow),
                                  op.filter, wanted)
    page = found[op.offset:wanted]
    if op.refresh_ttl:
        now = config.now()
        for row, _ in page:
            yield from refresh(config, op.namespace_prefix, row, now)
    return [codec.to_search_item(row, score) for row, score in page]


Found = list[tuple[Any, float | None]]


def ranked(scope: Mapping[str, str], query: str, contains: dict[str, Any],
           filter: Mapping[str, Any] | None, wanted: int) -> Plan[Found]:
    found: Found = []
    offset = 0
    while len(found) < wanted and offset <= MAX_RANKED_OFFSET:
        page = yield Request("search", {"query": query, **scope, "metadata": contains,
                                        "limit": RANKED_PAGE, "offset": offset})
        found += [(hit, hit.score) for hit in page.results
                  if hit.kind == "memory" and filters.matches(codec.value_of(hit), filter)]
        if len(page.results) < RANKED_PAGE:
            break
        offset += RANKED_PAGE
    return found[:wanted]


def listed(scope: Mapping[str, str], contains: dict[str, Any],
           filter: Mapping[str, Any] | None, wanted: int) -> Plan[Found]:
    found: Found = []
    cursor = None
    while len(found) < wanted:
        page = yield Request("list", {**scope, "metadata": contains, "limit": LIST_PAGE,
                                      "cursor": cursor})
        found += [(row, None) for row in page.data
                  if filters.matches(codec.value_of(row), filter)]
        cursor = page.next_cursor
        if cursor is None:
            break
    return found[:wanted]


def list_namespaces(config: StoreConfig, op: ListNamespacesOp) -> Plan[list[tuple[str, ...]]]:
    """Every namespace holding a live item the scope may read, narrowed by the server to the
    prefix, then as LangGraph lists them (`langgraph_filters.select_namespaces`)."""
    prefix = filters.prefix_of(op)
    seen: set[tuple[str, ...]] = set()
    cursor = None
    while True:
        page = yield Request("list", {**config.scope.of(prefix), "limit": LIST_PAGE,
                                      "metadata": codec.under(prefix), "cursor": cursor})
        seen.update(codec.namespace_of(row) for row in page.data)
        cursor = page.next_cursor
        if cursor is None:
            return filters.select_namespaces(seen, op)


def sweep(config: StoreConfig, prefix: tuple[str, ...]) -> Plan[int]:
    """Delete every expired item under `prefix` the scope may read; how many went."""
    now = config.now()
    expired = []
    cursor = None
    while True:
        page = yield Request("list", {**config.scope.of(prefix), "valid_only": False,
                                      "limit": LIST_PAGE, "metadata": codec.under(prefix),
                                      "cursor": cursor})
        expired += [r for r in page.data
                    if not codec.live(r, now) and codec.ttl_of(r) is not None]
        cursor = page.next_cursor
        if cursor is None:
            break
    yield from forget(config, prefix, expired)
    return len(expired)
