"""How a LangGraph store item is kept as a memmill memory, and read back.

An item is one memory of the store's scope (`StoreScope`). Its content is the text of the
fields the index names (what memmill embeds and indexes by word); everything LangGraph needs
lives in its metadata under `"langgraph"`:

    {"langgraph": {"ns": "memories.ana", "path": ["0:memories", "1:ana"], "key": "prefs",
                   "value": {...}, "indexed": true, "ttl": 5.0,
                   "created_at": "...", "updated_at": "..."}}

`ns` names the namespace exactly (labels cannot hold a period, so joining them is safe) and
`path` holds each label with its position, so that a namespace prefix is a jsonb containment
(`["0:memories"]` is contained in every namespace starting with "memories"). A TTL is the
memory's `valid_until`, so every memmill read (search, context, listing) leaves an expired
item out, not only the store's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from langgraph.store.base import Item, SearchItem, get_text_at_path

from api.memory_schemas import MAX_CONTENT_CHARS, MAX_METADATA_BYTES, MemoryPublic, RecallHit

FIELD = "langgraph"
# Derived ids live in a space of their own (uuid5), so no other writer's ids collide with them.
ID_SPACE = uuid.UUID("6f0c1d2e-8a4b-5c3d-9e7f-a1b2c3d4e5f6")
Visibility = Literal["private", "user", "tenant"]
Row = MemoryPublic | RecallHit


@dataclass(frozen=True)
class StoreScope:
    """Whose memories a store's items are. `user_label`, when set, is the position of the
    namespace label that names the memmill user, so `("memories", "ana")` with user_label=1 is
    user ana's and memmill's own visibility rules keep it hers; a namespace too short to have
    that label (or a `*` there) reads and writes as `user_id`. A key bound to a user or an agent
    acts as them whatever the store names (a store naming someone else gets a 403)."""

    user_id: str | None = None
    agent_id: str | None = None
    visibility: Visibility | None = None
    user_label: int | None = None

    def of(self, namespace: Sequence[str]) -> dict[str, str]:
        """The scope a read or write under `namespace` acts in."""
        user = self.user_id
        at = self.user_label
        if at is not None and len(namespace) > at and namespace[at] != "*":
            user = namespace[at]
        return {k: v for k, v in (("user_id", user), ("agent_id", self.agent_id)) if v}


def namespace_text(namespace: Sequence[str]) -> str:
    return ".".join(namespace)


def positioned(prefix: Sequence[str]) -> list[str]:
    """Each label with its position; a wildcard matches any label, so it is left out."""
    return [f"{i}:{label}" for i, label in enumerate(prefix) if label != "*"]


def exact(namespace: Sequence[str], key: str) -> dict[str, Any]:
    """The metadata every memory of one item contains."""
    return {FIELD: {"ns": namespace_text(namespace), "key": key}}


def under(prefix: Sequence[str], **more: Any) -> dict[str, Any]:
    """The metadata every memory of an item under `prefix` contains."""
    return {FIELD: {"path": positioned(prefix), **more}}


def item_id(scope: Mapping[str, str], visibility: str | None, namespace: Sequence[str],
            key: str) -> uuid.UUID:
    """The id a new item's memory asks for: the same for the same item of the same scope, so
    two writers creating it at once make one memory, not two."""
    name = json.dumps([scope.get("user_id"), scope.get("agent_id"), visibility,
                       list(namespace), key])
    return uuid.uuid5(ID_SPACE, name)


def index_text(value: Mapping[str, Any], paths: Sequence[str]) -> str:
    """The text memmill embeds and indexes for an item: that of each field `paths` names (a
    LangGraph path: "$" the whole value, "a.b", "items[*].text"), one per line."""
    texts = [text for path in paths for text in get_text_at_path(value, path)]
    return "\n".join(t for t in texts if t.strip())[:MAX_CONTENT_CHARS]


def placeholder(namespace: Sequence[str], key: str) -> str:
    """The content of an item with nothing to index (memmill content is never empty): its
    path, which is also what memmill's own readers see of it."""
    return "/".join((*namespace, key))[:MAX_CONTENT_CHARS]


def record(namespace: Sequence[str], key: str, value: Mapping[str, Any], *, indexed: bool,
           ttl_minutes: float | None, created_at: datetime,
           updated_at: datetime) -> dict[str, Any]:
    """The metadata of an item's memory. The item's own times are kept here: memmill's
    `updated_at` also moves when a read refreshes the TTL, which is no update of the item."""
    body = {FIELD: {"ns": namespace_text(namespace), "path": positioned(namespace), "key": key,
                    "value": dict(value), "indexed": indexed, "ttl": ttl_minutes,
                    "created_at": created_at.isoformat(),
                    "updated_at": updated_at.isoformat()}}
    try:
        size = len(json.dumps(body, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the value of {namespace_text(namespace)!r}/{key!r} is not JSON: "
                         f"{exc}") from None
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"the value of {namespace_text(namespace)!r}/{key!r} is {size} bytes "
                         f"as JSON with its namespace; memmill keeps at most "
                         f"{MAX_METADATA_BYTES} bytes of an item")
    return body


def fields_of(row: Row) -> dict[str, Any]:
    found = (row.metadata or {}).get(FIELD)
    return found if isinstance(found, dict) else {}


def value_of(row: Row) -> dict[str, Any]:
    value = fields_of(row).get("value")
    return value if isinstance(value, dict) else {}


def namespace_of(row: Row) -> tuple[str, ...]:
    return tuple(str(fields_of(row).get("ns", "")).split("."))


def ttl_of(row: Row) -> float | None:
    ttl = fields_of(row).get("ttl")
    return float(ttl) if isinstance(ttl, int | float) else None


def created_of(row: Row) -> datetime:
    text = fields_of(row).get("created_at")
    return datetime.fromisoformat(text) if isinstance(text, str) else row.created_at or _now()


def updated_of(row: Row) -> datetime:
    text = fields_of(row).get("updated_at")
    return datetime.fromisoformat(text) if isinstance(text, str) else created_of(row)


def _now() -> datetime:
    return datetime.now(UTC)


def live(row: Row, now: datetime) -> bool:
    return row.valid_until is None or row.valid_until > now


def expires(ttl_minutes: float | None, now: datetime) -> datetime | None:
    return None if ttl_minutes is None else now + timedelta(minutes=ttl_minutes)


def refreshed_until(row: Row, now: datetime) -> datetime | None:
    """The new end of an item's life after a read, or None when no write is needed: it has
    no TTL, or a refresh would move it by less than a hundredth of the TTL (at least a
    second), so that a burst of reads makes one write, not one each."""
    ttl = ttl_of(row)
    if ttl is None:
        return None
    until = now + timedelta(minutes=ttl)
    slack = max(timedelta(seconds=1), timedelta(minutes=ttl) / 100)
    if row.valid_until is not None and until - row.valid_until < slack:
        return None
    return until


def to_item(row: Row) -> Item:
    return Item(value=value_of(row), key=str(fields_of(row).get("key")),
                namespace=namespace_of(row), created_at=created_of(row),
                updated_at=updated_of(row))


def to_search_item(row: Row, score: float | None) -> SearchItem:
    return SearchItem(namespace=namespace_of(row), key=str(fields_of(row).get("key")),
                      value=value_of(row), created_at=created_of(row),
                      updated_at=updated_of(row), score=score)
