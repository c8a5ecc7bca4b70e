"""Item versions: address them by offset, list them, and revert or delete.

Offsets count back from now (0 is the current version, 1 the one before), because that is how
a person thinks of history ("the previous version"), and they stay meaningful when a revert
removes the newest version. Version numbers are storage; offsets are the API.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import BadInput, NotFound
from pipeline.items import get_item
from pipeline.settings import Settings

MAX_OFFSET = 10_000


async def list_versions(pool: asyncpg.Pool, tenant_id: int, item_id: str) -> list[dict[str, Any]]:
    current = await get_item(pool, tenant_id, item_id)
    archived = await pool.fetch(Q["versions.list"], tenant_id, item_id)
    rows = [{**current, "archived_at": None}, *[dict(r) for r in archived]]
    return [{**row, "offset": offset} for offset, row in enumerate(rows)]


async def get_version(
    pool: asyncpg.Pool, tenant_id: int, item_id: str, offset: int
) -> dict[str, Any]:
    """Offset 0 is the item as it is; an archived version comes back with status `archived`."""
    if not 0 <= offset <= MAX_OFFSET:
        raise BadInput(f"version must be an offset between 0 and {MAX_OFFSET}")
    current = await get_item(pool, tenant_id, item_id)
    if offset == 0:
        return current
    row = await pool.fetchrow(Q["versions.at_offset"], tenant_id, item_id, offset - 1)
    if row is None:
        raise NotFound(f"item {item_id!r} has no version at offset {offset}")
    return {
        **current, **dict(row), "status": "archived", "error": None,
        "updated_at": row["archived_at"], "accessed_at": None, "access_count": 0,
    }


async def delete_item(
    conn: asyncpg.Connection, tenant_id: int, item_id: str, *, purge: bool, settings: Settings
) -> tuple[str, int | None, list[dict[str, Any]]]:
    """Revert to the previous version where there is one (its text is reprocessed when it
    differs); delete the item otherwise, or with `purge`. Returns outcome, version, jobs."""
    current = await conn.fetchrow(Q["items.lock_item"], tenant_id, item_id)
    if current is None:
        raise NotFound(f"no item with id {item_id!r}")
    previous = None if purge else await conn.fetchrow(Q["versions.latest"], tenant_id, item_id)
    if previous is None:
        await conn.execute(Q["jobs.cancel_superseded"], tenant_id, item_id)
        await conn.execute(Q["versions.purge"], tenant_id, item_id)
        return "deleted", None, []
    same_content = previous["content_hash"] == current["content_hash"]
    if not same_content:
        await conn.execute(Q["jobs.cancel_superseded"], tenant_id, item_id)
    status = current["status"] if same_content else "pending"
    row = await conn.fetchrow(
        Q["versions.restore"], tenant_id, item_id, previous["version"], status
    )
    await conn.execute(Q["versions.drop_newer"], tenant_id, item_id, previous["version"])
    if same_content:
        return "reverted", row["version"], []
    source = await conn.fetchrow(Q["items.get_source"], tenant_id, item_id, row["version"])
    specs = jobs.TEXT_PIPELINE if source and source["content"] is not None \
        else jobs.DOCUMENT_PIPELINE
    created = await jobs.create_jobs(
        conn, tenant_id=tenant_id, item_id=item_id, version=row["version"], specs=specs,
        max_attempts=settings.max_attempts_for,
    )
    return "reverted", row["version"], created
