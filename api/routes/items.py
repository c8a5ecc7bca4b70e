from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import CurrentTenant, PoolDep, QueueDep, SettingsDep
from api.schemas import ItemAccepted, ItemCreate, ItemPublic, JobBrief
from pipeline import items, jobs
from pipeline.db import Q

router = APIRouter(prefix="/v1/items", tags=["items"])


def _public(row: dict[str, Any], job_rows: list[Any] | None = None) -> ItemPublic:
    briefs = [
        JobBrief(**{k: j[k] for k in ("id", "kind", "status", "attempts")}) for j in job_rows or []
    ]
    return ItemPublic(**{k: row[k] for k in ItemPublic.model_fields if k != "jobs"}, jobs=briefs)


@router.post("", status_code=202, response_model=ItemAccepted)
async def put_item(
    body: ItemCreate, tenant: CurrentTenant, pool: PoolDep, queue: QueueDep, settings: SettingsDep
) -> ItemAccepted:
    """Store an item and queue its processing; answers at once with the job ids.

    The same content again creates no jobs; new tags or title alone make a new version
    without reprocessing."""
    new = items.NewItem(id=body.id, content=body.content, title=body.title, tags=body.tags)
    items.check_new_item(new, settings)
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant, item=new, settings=settings)
    await jobs.enqueue(
        pool, queue, jobs.refs_to_enqueue(result.jobs), queue_name=settings.queue_name
    )
    item = _public(result.item, result.jobs)
    return ItemAccepted(item=item, jobs=item.jobs, change=result.change)


@router.get("/{item_id:path}", response_model=ItemPublic)
async def get_item(item_id: str, tenant: CurrentTenant, pool: PoolDep) -> ItemPublic:
    row = await items.get_item(pool, tenant, item_id)
    job_rows = await pool.fetch(Q["jobs.for_item"], tenant, item_id)
    return _public(row, [dict(j) for j in job_rows])
