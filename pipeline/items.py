"""Writing items: validation, versioning and the outbox transaction.

A put writes the item, its source and its ledger rows in one transaction, and only after the
commit puts the jobs on the queue. Re-sending the same content creates no jobs; a change of
tags or title alone makes a new version without reprocessing.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import BadInput, NotFound, PayloadTooLarge
from pipeline.settings import Settings

MAX_TAG_KEY_CHARS = 128
MAX_TAG_VALUE_CHARS = 1024
MAX_TITLE_CHARS = 1000


@dataclass(frozen=True)
class NewItem:
    id: str
    content: str
    title: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    kind: str = "text"
    uri: str | None = None
    media_type: str = "text/plain"


@dataclass(frozen=True)
class PutResult:
    item: dict[str, Any]
    jobs: list[dict[str, Any]]
    change: str  # "created", "content", "metadata" or "unchanged"


def _has_control_chars(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") for ch in text)


def _utf8_size(text: str, what: str) -> int:
    """A lone surrogate (a JSON "\\ud800" escape) has no UTF-8 form: Postgres cannot store it."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise BadInput(f"{what} is not valid Unicode: it contains a lone surrogate") from None


def check_id(item_id: str, settings: Settings) -> None:
    if not item_id or not item_id.strip():
        raise BadInput("id must not be empty")
    if len(item_id) > settings.max_id_chars:
        raise BadInput(f"id is longer than {settings.max_id_chars} characters")
    if _has_control_chars(item_id):
        raise BadInput("id must not contain control characters")


def check_tags(tags: dict[str, str], settings: Settings) -> None:
    if len(tags) > settings.max_tags:
        raise BadInput(f"at most {settings.max_tags} tags are allowed")
    for key, value in tags.items():
        if not key or len(key) > MAX_TAG_KEY_CHARS or _has_control_chars(key):
            raise BadInput(f"tag key {key!r} must be 1-{MAX_TAG_KEY_CHARS} printable characters")
        if key.startswith("_"):
            raise BadInput(f"tag {key!r}: tags starting with '_' are system tags, set by memmill")
        if len(value) > MAX_TAG_VALUE_CHARS or _has_control_chars(value):
            raise BadInput(
                f"tag {key!r}: value must be at most {MAX_TAG_VALUE_CHARS} printable characters"
            )


def check_new_item(item: NewItem, settings: Settings) -> None:
    """Every rule a new item must pass, checked before anything is written."""
    check_id(item.id, settings)
    check_tags(item.tags, settings)
    if not item.content.strip():
        raise BadInput("content must not be empty")
    size = _utf8_size(item.content, "content")
    if size > settings.max_content_bytes:
        raise PayloadTooLarge(
            f"content is {size} bytes, over the limit of {settings.max_content_bytes} bytes"
        )
    if item.title is not None and (len(item.title) > MAX_TITLE_CHARS or "\x00" in item.title):
        raise BadInput(f"title must be at most {MAX_TITLE_CHARS} characters without NUL")
    if item.title is not None:
        _utf8_size(item.title, "title")
    if "\x00" in item.content:
        raise BadInput("content must not contain NUL characters")


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def put_item(
    conn: asyncpg.Connection, *, tenant_id: int, item: NewItem, settings: Settings
) -> PutResult:
    """Write one item in the caller's transaction; the caller enqueues after commit."""
    check_new_item(item, settings)
    digest = content_hash(item.content)
    row = await conn.fetchrow(
        Q["items.insert_item"],
        tenant_id,
        item.id,
        item.kind,
        item.uri,
        item.title,
        item.tags,
        digest,
    )
    if row is not None:
        change = "created"
    else:
        current = await conn.fetchrow(Q["items.lock_item"], tenant_id, item.id)
        if current["content_hash"] != digest:
            change = "content"
        elif current["tags"] != item.tags or current["title"] != item.title:
            change = "metadata"
        else:
            return PutResult(item=dict(current), jobs=[], change="unchanged")
        await conn.execute(Q["items.archive_item"], tenant_id, item.id)
        if change == "content":
            await conn.execute(Q["jobs.cancel_superseded"], tenant_id, item.id)
        status = "pending" if change == "content" else current["status"]
        row = await conn.fetchrow(
            Q["items.bump_item_version"],
            tenant_id,
            item.id,
            item.kind,
            item.uri,
            item.title,
            item.tags,
            digest,
            status,
        )
        if change == "metadata":
            await conn.execute(
                Q["items.insert_source"],
                tenant_id,
                item.id,
                row["version"],
                item.media_type,
                item.content,
                None,
                len(item.content.encode()),
            )
            return PutResult(item=dict(row), jobs=[], change=change)
    version = row["version"]
    await conn.execute(
        Q["items.insert_source"],
        tenant_id,
        item.id,
        version,
        item.media_type,
        item.content,
        None,
        len(item.content.encode()),
    )
    created = await jobs.create_jobs(
        conn,
        tenant_id=tenant_id,
        item_id=item.id,
        version=version,
        specs=jobs.TEXT_PIPELINE,
        max_attempts=settings.max_attempts_for,
    )
    return PutResult(item=dict(row), jobs=created, change=change)


async def get_item(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int, item_id: str) -> dict:
    # No stored id has control characters, and Postgres refuses a NUL in a query parameter.
    row = None
    if not _has_control_chars(item_id):
        row = await conn.fetchrow(Q["items.get_item"], tenant_id, item_id)
    if row is None:
        raise NotFound(f"no item with id {item_id!r}")
    return dict(row)
