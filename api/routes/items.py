from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import UploadFile

from api.deps import CurrentTenant, PoolDep, QueueDep, SettingsDep
from api.schemas import (
    BatchAccepted,
    BatchRefused,
    BatchResult,
    ItemAccepted,
    ItemBatch,
    ItemCreate,
    ItemDeleted,
    ItemLookup,
    ItemPublic,
    ItemState,
    ItemStates,
    ItemVersionPublic,
    JobBrief,
    SafeStr,
)
from pipeline import items, jobs, quotas, versions
from pipeline.db import Q
from pipeline.errors import BadInput, MemmillError, PayloadTooLarge
from pipeline.settings import Settings

# An item's id is the whole rest of the path, `/` included, so nothing may follow it: a
# suffix route like `/v1/items/{id}/versions` cannot tell item `doc`'s versions from the item
# `doc/versions` (the server decodes %2F before routing). An item's versions therefore live
# under a prefix of their own, and every path below names the full route.
router = APIRouter(tags=["items"])
BULK_PATHS = ("/v1/items/batch", "/v1/items/upload")
ItemId = Annotated[SafeStr, Path(
    description="The item id as one path segment, percent-encoded: `/` as %2F, `%` as %25, "
                "`?` as %3F, `#` as %23, and an id of dots as %2E (`..` would be resolved).")]


def _public(row: dict[str, Any], job_rows: list[Any] | None = None) -> ItemPublic:
    briefs = [
        JobBrief(**{k: j[k] for k in ("id", "kind", "status", "attempts")}) for j in job_rows or []
    ]
    return ItemPublic(**{k: row[k] for k in ItemPublic.model_fields if k != "jobs"}, jobs=briefs)


def _new_item(body: ItemCreate) -> items.NewItem:
    return items.NewItem(
        id=body.id, content=body.content, uri=body.uri, title=body.title, tags=body.tags
    )


@router.post("/v1/items", status_code=202, response_model=ItemAccepted)
async def put_item(
    body: ItemCreate, tenant: CurrentTenant, pool: PoolDep, queue: QueueDep, settings: SettingsDep
) -> ItemAccepted:
    """Store an item (text in `content`, or a URL in `uri`) and queue its processing; answers
    at once with the job ids.

    The same content again creates no jobs; new tags or title alone make a new version
    without reprocessing."""
    new = _new_item(body)
    items.check_new_item(new, settings)
    await quotas.check_items(pool, tenant, [new], settings)
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant, item=new, settings=settings)
    await jobs.enqueue(
        pool, queue, jobs.refs_to_enqueue(result.jobs), queue_name=settings.queue_name
    )
    item = _public(result.item, result.jobs)
    return ItemAccepted(item=item, jobs=item.jobs, change=result.change)


# An entry of a batch or an upload: its index, its id if it has one, and the item to write or
# the reason it was already refused.
Candidate = tuple[int, str | None, items.NewItem | MemmillError]


async def _put_many(
    pool: PoolDep, queue: QueueDep, settings: Settings, tenant: int, candidates: list[Candidate]
) -> BatchResult:
    """Validate each entry on its own, write every valid one in one transaction, enqueue after
    the commit. A refused entry is reported by index and never half-written."""
    accepted: list[tuple[int, items.NewItem]] = []
    refused: list[BatchRefused] = []
    seen: set[str] = set()
    for index, item_id, new in candidates:
        try:
            if isinstance(new, MemmillError):
                raise new
            items.check_new_item(new, settings)
            if new.id in seen:
                raise BadInput(f"id {new.id!r} appears more than once in this request")
        except MemmillError as exc:
            refused.append(BatchRefused(index=index, id=item_id, status=exc.status_code,
                                        error=exc.message))
            continue
        seen.add(new.id)
        accepted.append((index, new))
    results: list[BatchAccepted] = []
    to_enqueue: list[jobs.JobRef] = []
    if accepted:
        await quotas.check_items(pool, tenant, [new for _, new in accepted], settings)
        async with pool.acquire() as conn, conn.transaction():
            for index, new in accepted:
                result = await items.put_item(conn, tenant_id=tenant, item=new, settings=settings)
                to_enqueue += jobs.refs_to_enqueue(result.jobs)
                results.append(BatchAccepted(
                    index=index, id=new.id, change=result.change,
                    version=result.item["version"], jobs=[j["id"] for j in result.jobs]))
        await jobs.enqueue(pool, queue, to_enqueue, queue_name=settings.queue_name)
    return BatchResult(accepted=results, refused=refused)


@router.post("/v1/items/batch", status_code=202, response_model=BatchResult)
async def put_batch(
    body: ItemBatch, tenant: CurrentTenant, pool: PoolDep, queue: QueueDep, settings: SettingsDep
) -> BatchResult:
    """Up to `MEMMILL_MAX_BATCH_ITEMS` items (text or URL) in one request; the answer says
    which were accepted and why the others were not."""
    if not body.items:
        raise BadInput("items must not be empty")
    if len(body.items) > settings.max_batch_items:
        raise BadInput(f"at most {settings.max_batch_items} items per batch"
                       f" (got {len(body.items)})")
    candidates: list[Candidate] = []
    for index, raw in enumerate(body.items):
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        item_id = raw_id if isinstance(raw_id, str) else None
        try:
            candidates.append((index, item_id, _new_item(ItemCreate.model_validate(raw))))
        except ValidationError as exc:
            candidates.append((index, item_id, BadInput(_first_error(exc))))
    return await _put_many(pool, queue, settings, tenant, candidates)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if error["type"] == "model_type":
        return "each item must be a JSON object"
    return f"{where}: {error['msg']}" if where else error["msg"]


@router.post("/v1/items/upload", status_code=202, response_model=BatchResult)
async def upload(
    request: Request, tenant: CurrentTenant, pool: PoolDep, queue: QueueDep,
    settings: SettingsDep,
) -> BatchResult:
    """Files as multipart/form-data, one `file` part each. A file's item id is its file name
    (send a relative path to keep folders apart) with the optional `prefix` field before it;
    an optional `tags` field (a JSON object) applies to every file."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadInput("send files as multipart/form-data, one 'file' part per file")
    async with request.form(max_files=settings.max_batch_items) as form:
        prefix = _form_text("prefix", form.get("prefix") or "")
        tags = _form_tags(form.get("tags"))
        files = [f for f in form.getlist("file") if isinstance(f, UploadFile)]
        if not files:
            raise BadInput("no files: send one or more parts named 'file'")
        unknown = sorted(set(form.keys()) - {"file", "prefix", "tags"})
        if unknown:
            raise BadInput(f"unknown form fields {unknown}; expected file, prefix, tags")
        candidates: list[Candidate] = []
        for index, upload_file in enumerate(files):
            name = (upload_file.filename or "").strip()
            if not name:
                candidates.append((index, None, BadInput("a file part has no file name")))
                continue
            data = await _read_limited(upload_file, settings.max_upload_bytes)
            item_id = f"{prefix}{name}"
            if data is None:
                candidates.append((index, item_id, PayloadTooLarge(
                    f"file {name!r} is over the limit of {settings.max_upload_bytes} bytes"
                    " (MEMMILL_MAX_UPLOAD_BYTES)")))
                continue
            candidates.append((index, item_id, items.NewItem(
                id=item_id, data=data, tags=tags, filename=name,
                media_type=upload_file.content_type)))
    return await _put_many(pool, queue, settings, tenant, candidates)


_FORM_TEXT = TypeAdapter(SafeStr)
_FORM_TAGS = TypeAdapter(dict[SafeStr, SafeStr])


def _form_text(field: str, raw: Any) -> str:
    """A form field as text Postgres can store, or a 422 naming the field (the form is read
    by hand, so FastAPI's validation never sees it)."""
    if not isinstance(raw, str):
        raise BadInput(f"{field} must be a text field")
    try:
        return _FORM_TEXT.validate_python(raw)
    except ValidationError as exc:
        raise BadInput(f"{field}: {exc.errors()[0]['msg']}") from None


def _form_tags(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    try:
        tags = json.loads(_form_text("tags", raw))
    except json.JSONDecodeError as exc:
        raise BadInput(f"tags must be a JSON object of strings: {exc}") from None
    except RecursionError:  # Python's reader gives up on JSON nested thousands deep
        raise BadInput("tags: JSON nested too deeply (tags must be a JSON object of "
                       "strings)") from None
    try:
        return _FORM_TAGS.validate_python(tags)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in ("tags", *error["loc"]))
        raise BadInput(f"{where}: {error['msg']} (tags must be a JSON object of strings)"
                       if isinstance(tags, dict)
                       else "tags must be a JSON object of strings") from None


async def _read_limited(upload_file: UploadFile, limit: int) -> bytes | None:
    data = await upload_file.read(limit + 1)
    return None if len(data) > limit else data


@router.post("/v1/items/lookup", response_model=ItemStates)
async def lookup(body: ItemLookup, tenant: CurrentTenant, pool: PoolDep) -> ItemStates:
    """Version, content hash and status of up to 1000 items at once: what `memmill ingest`
    asks to skip unchanged files and to follow its items to the end."""
    rows = await pool.fetch(Q["items.states"], tenant, body.ids)
    found = {r["id"] for r in rows}
    return ItemStates(items=[ItemState(**dict(r)) for r in rows],
                      missing=[i for i in body.ids if i not in found])


@router.get("/v1/item-versions/{item_id:path}", response_model=list[ItemVersionPublic])
async def list_versions(item_id: ItemId, tenant: CurrentTenant, pool: PoolDep
                        ) -> list[ItemVersionPublic]:
    """Every version of an item, newest first; `offset` is what `GET /v1/items/{id}?version=`
    and the CLI's `id@V{N}` take."""
    rows = await versions.list_versions(pool, tenant, item_id)
    return [ItemVersionPublic(**{k: r[k] for k in ItemVersionPublic.model_fields}) for r in rows]


@router.get("/v1/items/{item_id:path}", response_model=ItemPublic)
async def get_item(
    item_id: ItemId, tenant: CurrentTenant, pool: PoolDep,
    version: int = Query(0, ge=0, le=versions.MAX_OFFSET,
                         description="0 is the current version, 1 the previous, ..."),
) -> ItemPublic:
    """An item with its jobs, or an older version of it by offset."""
    row = await versions.get_version(pool, tenant, item_id, version)
    if version:
        return _public(row)
    job_rows = await pool.fetch(Q["jobs.for_item"], tenant, item_id)
    return _public(row, [dict(j) for j in job_rows])


@router.delete("/v1/items/{item_id:path}", response_model=ItemDeleted)
async def delete_item(
    item_id: ItemId, tenant: CurrentTenant, pool: PoolDep, queue: QueueDep,
    settings: SettingsDep,
    purge: bool = Query(False, description="delete every version, not only the current one"),
) -> ItemDeleted:
    """Revert to the previous version where there is one; delete the item otherwise."""
    async with pool.acquire() as conn, conn.transaction():
        outcome, version, created = await versions.delete_item(
            conn, tenant, item_id, purge=purge, settings=settings)
    await jobs.enqueue(pool, queue, jobs.refs_to_enqueue(created), queue_name=settings.queue_name)
    briefs = [JobBrief(**{k: j[k] for k in ("id", "kind", "status", "attempts")})
              for j in created]
    return ItemDeleted(id=item_id, outcome=outcome, version=version, jobs=briefs)
