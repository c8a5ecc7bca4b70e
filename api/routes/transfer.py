"""Export and import of the tenant's data, so a tenant can leave or move: `GET /v1/export`
streams it as NDJSON from one snapshot; `POST /v1/import` reads the same format into the
key's tenant, checking every line before it writes anything, and writing it all in one
transaction (pipeline/transfer.py)."""

from __future__ import annotations

import contextlib
import json
import tempfile
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import datetime
from typing import IO, Annotated, Any, Literal

import asyncpg
from asyncpg.transaction import Transaction
from fastapi import APIRouter, BackgroundTasks, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from api.deps import CurrentPrincipal, PoolDep, QueueDep, SettingsDep
from api.schemas import Problem, SafeStr
from api.transfer_schemas import LINE, ImportResult, TransferLine, counted
from pipeline import actions, transfer
from pipeline.errors import BadInput
from pipeline.settings import Settings

router = APIRouter(tags=["transfer"])
EXPORT_PATH = "/v1/export"
IMPORT_PATH = "/v1/import"
NDJSON = "application/x-ndjson"
CHUNK_BYTES = 64 * 1024  # an export sends lines this many bytes at a time
SPOOL_BYTES = 16 * 1024 * 1024  # an import body past this waits on disk between its passes
LINE_FIELDS_BYTES = 1_000_000  # room on a line for what is not its text or file


class NdjsonLines(JSONResponse):
    """The export's answer as the document describes it: NDJSON, each line a `TransferLine`.
    A JSONResponse, so that FastAPI documents the model's schema alone; the route returns a
    StreamingResponse of this media type."""

    media_type = NDJSON


def line_limit(settings: Settings) -> int:
    """The longest line an import reads: the largest file an item may hold (in base64), or
    the largest text (each character escaped), with room for the other fields."""
    return (-(-settings.max_upload_bytes // 3) * 4 + 6 * settings.max_content_bytes
            + LINE_FIELDS_BYTES)


def _json(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to an export")


def encode(line: dict[str, Any]) -> bytes:
    return json.dumps(line, default=_json, ensure_ascii=False,
                      separators=(",", ":")).encode() + b"\n"


async def _stream(pool: asyncpg.Pool, conn: asyncpg.Connection, transaction: Transaction,
                  header: dict[str, Any],
                  lines: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[bytes]:
    """The export's bytes, a chunk at a time; the snapshot's connection goes back to the pool
    when the last line is sent or the client goes away."""
    try:
        chunk = bytearray(encode(header))
        async for line in lines:
            chunk += encode(line)
            if len(chunk) >= CHUNK_BYTES:
                yield bytes(chunk)
                chunk.clear()
        if chunk:
            yield bytes(chunk)
    finally:
        await _end(pool, conn, transaction, lines)


async def _end(pool: asyncpg.Pool, conn: asyncpg.Connection, transaction: Transaction,
               lines: AsyncGenerator[dict[str, Any], None]) -> None:
    try:
        await lines.aclose()
        # A read-only snapshot: nothing to keep. A broken connection is released all the same.
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError):
            await transaction.rollback()
    finally:
        await pool.release(conn)


TYPES_QUERY = Query(description=(
    "Only these types, comma-separated (`memory,memory_history`); a child type needs its "
    "parent (`item_version` needs `item`, `memory_history` needs `memory`, `event` needs "
    f"`session`). Default: all of {', '.join(transfer.TYPES)}."))


@router.get(EXPORT_PATH, response_class=NdjsonLines, response_model=None, responses={
    200: {"model": TransferLine, "description": (
        "NDJSON: one `TransferLine` a line, from one consistent snapshot: the header (with "
        "the count of each type's lines), memory types, items (each after its archived "
        "versions), memories (each followed by its history), sessions (each followed by "
        "its events).")}})
async def export(principal: CurrentPrincipal, pool: PoolDep,
                 types: Annotated[SafeStr | None, TYPES_QUERY] = None) -> StreamingResponse:
    """The tenant's items (with their sources and archived versions), memory types, memories
    (with their history), sessions and events, as NDJSON. Nothing names the installation or
    the tenant; vectors are left out (the importing installation embeds again)."""
    chosen = transfer.check_types(t.strip() for t in types.split(",")) if types is not None \
        else transfer.TYPES
    conn = await pool.acquire()
    transaction = conn.transaction(isolation="repeatable_read", readonly=True)
    lines = transfer.export_lines(conn, principal.tenant_id, chosen)
    try:
        await transaction.start()
        header = await anext(lines)
        await actions.audit(pool, principal, "export", tenant_id=principal.tenant_id,
                            via="api", filter={"types": list(chosen)},
                            affected=sum(header["counts"].values()))
    except BaseException:
        await _end(pool, conn, transaction, lines)
        raise
    return StreamingResponse(
        _stream(pool, conn, transaction, header, lines), media_type=NDJSON,
        headers={"Content-Disposition": 'attachment; filename="memmill-export.ndjson"'})


async def _lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[tuple[int, bytes]]:
    """The body's lines, numbered from 1, none held longer than `limit` bytes."""
    buffer = bytearray()
    line_no = 0
    async for chunk in chunks:
        start, search = 0, len(buffer)
        buffer += chunk
        while (end := buffer.find(b"\n", search)) >= 0:
            line_no += 1
            if end - start > limit:
                raise BadInput(f"line {line_no} is longer than the limit of {limit} bytes")
            yield line_no, bytes(buffer[start:end])
            start = search = end + 1
        del buffer[:start]
        if len(buffer) > limit:
            raise BadInput(f"line {line_no + 1} is longer than the limit of {limit} bytes")
    if buffer:
        yield line_no + 1, bytes(buffer)


def _problem(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    kind, loc = error["type"], error["loc"]
    if kind == "json_invalid":
        return f"not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    if kind == "union_tag_invalid":
        return (f"unknown type {error.get('ctx', {}).get('tag')!r}; a line's type is one of "
                f"header, {', '.join(transfer.TYPES)}")
    if kind == "union_tag_not_found" or not loc:
        return 'each line must be a JSON object with a "type"'
    where = ".".join(str(p) for p in loc[1:])
    if kind == "extra_forbidden":
        return f"{loc[0]}: unknown field {where!r}"
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    return f"{loc[0]}: {where + ': ' if where else ''}{error['msg']}{more}"


def parse(line_no: int, raw: bytes) -> dict[str, Any]:
    """A line as its model validated it, or a 422 naming the line and what is wrong."""
    raw = raw.removesuffix(b"\r")
    if not raw.strip():
        raise BadInput(f"line {line_no} is empty")
    try:
        return LINE.validate_json(raw).model_dump()
    except ValidationError as exc:
        raise BadInput(f"line {line_no}: {_problem(exc)}") from None


def _numbered(spool: IO[bytes]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    async def lines() -> AsyncIterator[tuple[int, dict[str, Any]]]:
        spool.seek(0)
        for line_no, raw in enumerate(spool, start=1):
            yield line_no, parse(line_no, raw.removesuffix(b"\n"))
    return lines()


@router.post(IMPORT_PATH, status_code=202, response_model=ImportResult, responses={
    409: {"model": Problem, "description": (
        "The tenant already holds some of the file's ids (named), and on_conflict is fail.")}},
    openapi_extra={"requestBody": {"required": True, "description": (
        "NDJSON (`Content-Type: application/x-ndjson`): an export's lines, one "
        "`TransferLine` a line, header first."), "content": {NDJSON: {"schema": {
            "$ref": "#/components/schemas/TransferLine"}}}}})
async def import_(
    request: Request, principal: CurrentPrincipal, pool: PoolDep, queue: QueueDep,
    settings: SettingsDep, background: BackgroundTasks,
    on_conflict: Annotated[Literal["fail", "skip"], Query(description=(
        "When the tenant already holds an item, memory, session or memory type of the file "
        "(by id or name): `fail` answers 409 naming them and writes nothing; `skip` leaves "
        "those as they are (with their versions, history or events) and writes the rest."
    ))] = "fail",
) -> ImportResult:
    """Read an export into this tenant: every line is checked first (a bad one is a 422
    naming its line, and nothing is written), then everything is written in one transaction.
    Items are ingested again through the put path (their parts, summaries and vectors are
    made again by jobs); memories, sessions and events are written as they were, ids kept,
    and embedded by jobs; sessions with unread events are extracted."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != NDJSON:
        raise BadInput(f"send the lines of an export as {NDJSON}")
    tenant_id = principal.tenant_id
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        checker = transfer.Checker(settings)
        async for line_no, raw in _lines(request.stream(), line_limit(settings)):
            checker.add(line_no, parse(line_no, raw))
            spool.write(raw + b"\n")
        plan = checker.finish()
        async with pool.acquire() as conn, conn.transaction():
            skips = await transfer.prepare(conn, tenant_id=tenant_id, plan=plan,
                                           on_conflict=on_conflict, settings=settings)
            importer = transfer.Importer(conn, tenant_id=tenant_id, key_id=principal.key_id,
                                         settings=settings, skips=skips)
            async for line_no, line in _numbered(spool):
                await importer.add(line_no, line)
            result = await importer.finish()
            await actions.audit(conn, principal, "import", tenant_id=tenant_id, via="api",
                                filter={"on_conflict": on_conflict},
                                affected=sum(result.imported.values()),
                                skipped=sum(result.skipped.values()))
    background.add_task(transfer.enqueue_imported, pool, queue, tenant_id=tenant_id,
                        created_at=result.created_at, queue_name=settings.queue_name)
    return ImportResult(counts=counted(result.imported, result.skipped), jobs=result.jobs,
                        operation_ids=result.operation_ids)
