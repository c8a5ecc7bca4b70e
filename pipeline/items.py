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
from pipeline.stages.fetch import check_url, fetch_policy

MAX_TAG_KEY_CHARS = 128
MAX_TAG_VALUE_CHARS = 1024
MAX_TITLE_CHARS = 1000


@dataclass(frozen=True)
class NewItem:
    """One item to store: exactly one of `content` (text), `data` (a file's bytes) or `uri` (a
    URL the regularize job fetches). Text is indexed as given; files and URLs go through
    regularize first, which extracts their text and metadata."""

    id: str
    content: str | None = None
    title: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    data: bytes | None = None
    uri: str | None = None
    media_type: str | None = None
    filename: str | None = None

    @property
    def needs_regularize(self) -> bool:
        return self.content is None

    @property
    def content_hash(self) -> str:
        if self.content is not None:
            return content_hash(self.content)
        if self.data is not None:
            return hashlib.sha256(self.data).hexdigest()
        return content_hash(f"uri\n{self.uri}")


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
    given = [name for name in ("content", "data", "uri") if getattr(item, name) is not None]
    if len(given) != 1:
        raise BadInput("give exactly one of content (text), a file, or uri (a URL to fetch)")
    if item.content is not None:
        _check_text_content(item.content, settings)
    if item.data is not None:
        if not item.data:
            raise BadInput(f"file {item.filename or item.id!r} is empty")
        if len(item.data) > settings.max_upload_bytes:
            raise PayloadTooLarge(
                f"file {item.filename or item.id!r} is {len(item.data)} bytes, over the limit"
                f" of {settings.max_upload_bytes} bytes (MEMMILL_MAX_UPLOAD_BYTES)"
            )
    if item.uri is not None:
        check_url(item.uri, fetch_policy(settings))
    if item.title is not None and (len(item.title) > MAX_TITLE_CHARS or "\x00" in item.title):
        raise BadInput(f"title must be at most {MAX_TITLE_CHARS} characters without NUL")
    if item.title is not None:
        _utf8_size(item.title, "title")


def _check_text_content(content: str, settings: Settings) -> None:
    if not content.strip():
        raise BadInput("content must not be empty")
    size = _utf8_size(content, "content")
    if size > settings.max_content_bytes:
        raise PayloadTooLarge(
            f"content is {size} bytes, over the limit of {settings.max_content_bytes} bytes"
        )
    if "\x00" in content:
        raise BadInput("content must not contain NUL characters")


def caller_tags(tags: dict[str, str]) -> dict[str, str]:
    """The tags a caller set; system tags (`_` first) come from extraction and are kept apart."""
    return {k: v for k, v in tags.items() if not k.startswith("_")}


def system_tags(tags: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tags.items() if k.startswith("_")}


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def put_item(
    conn: asyncpg.Connection, *, tenant_id: int, item: NewItem, settings: Settings
) -> PutResult:
    """Write one item in the caller's transaction; the caller enqueues after commit."""
    check_new_item(item, settings)
    digest = item.content_hash
    kind = "text" if item.content is not None else "document"
    row = await conn.fetchrow(
        Q["items.insert_item"], tenant_id, item.id, kind, item.uri, item.title, item.tags, digest
    )
    if row is not None:
        change = "created"
    else:
        current = await conn.fetchrow(Q["items.lock_item"], tenant_id, item.id)
        if current["content_hash"] != digest:
            change = "content"
        elif caller_tags(current["tags"]) != item.tags or (
            item.title is not None and current["title"] != item.title
        ):
            # No title given means no opinion: a title extraction found is not a change.
            change = "metadata"
        else:
            return PutResult(item=dict(current), jobs=[], change="unchanged")
        await conn.execute(Q["items.archive_item"], tenant_id, item.id)
        if change == "content":
            await conn.execute(Q["jobs.cancel_superseded"], tenant_id, item.id)
            status, tags, title = "pending", item.tags, item.title
        else:
            # Same content: what extraction found still holds, and so do its kind and title.
            status, kind = current["status"], current["kind"]
            tags = {**item.tags, **system_tags(current["tags"])}
            title = item.title if item.title is not None else current["title"]
        row = await conn.fetchrow(
            Q["items.bump_item_version"],
            tenant_id, item.id, kind, item.uri, title, tags, digest, status,
        )
        if change == "metadata":
            await conn.execute(
                Q["items.copy_source"], tenant_id, item.id, current["version"], row["version"]
            )
            created = await _metadata_jobs(conn, tenant_id, row, settings)
            return PutResult(item=dict(row), jobs=created, change=change)
    version = row["version"]
    await _insert_source(conn, tenant_id, version, item, digest)
    created = await jobs.create_jobs(
        conn,
        tenant_id=tenant_id,
        item_id=item.id,
        version=version,
        specs=jobs.DOCUMENT_PIPELINE if item.needs_regularize else jobs.TEXT_PIPELINE,
        max_attempts=settings.max_attempts_for,
    )
    return PutResult(item=dict(row), jobs=created, change=change)


async def _insert_source(
    conn: asyncpg.Connection, tenant_id: int, version: int, item: NewItem, digest: str
) -> None:
    if item.content is not None:
        media_type, size, text_hash = "text/plain", len(item.content.encode()), digest
    else:
        media_type = item.media_type or "application/octet-stream"
        size, text_hash = len(item.data or b""), None
    meta = {k: v for k, v in (("filename", item.filename), ("uri", item.uri)) if v}
    await conn.execute(
        Q["items.insert_source"],
        tenant_id, item.id, version, media_type, item.content, item.data, size, digest,
        text_hash, meta,
    )


async def _metadata_jobs(
    conn: asyncpg.Connection, tenant_id: int, row: asyncpg.Record, settings: Settings
) -> list[dict[str, Any]]:
    """A summary written with related items as context depends on the tags: re-queue it (the
    old summary stays until the new one is written). The local summarizer reads the text only,
    so with it a change of tags costs nothing."""
    if settings.summary_provider == "extractive" or row["status"] != "ready":
        return []
    return await jobs.create_jobs(
        conn, tenant_id=tenant_id, item_id=row["id"], version=row["version"],
        specs=(jobs.JobSpec(jobs.SUMMARIZE),), max_attempts=settings.max_attempts_for,
    )


async def get_item(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: int, item_id: str) -> dict:
    # No stored id has control characters, and Postgres refuses a NUL in a query parameter.
    row = None
    if not _has_control_chars(item_id):
        row = await conn.fetchrow(Q["items.get_item"], tenant_id, item_id)
    if row is None:
        raise NotFound(f"no item with id {item_id!r}")
    return dict(row)
