"""What each job kind does: load its inputs by id, run the pure stage, and return a writer.

The writer runs inside the runner's completion transaction, together with the ledger update,
so a stage's result is stored if and only if its job is marked done. Running a task twice
rewrites the same rows, so a duplicate delivery changes nothing. A writer may create follow-up
jobs in that same transaction (regularize adds OCR; OCR re-runs the text pipeline) and returns
them, and the runner enqueues them after the commit, like any outbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
import numpy as np

from pipeline import jobs, reindex
from pipeline.db import Q
from pipeline.errors import PermanentError
from pipeline.formats import Extracted, ExtractLimits, extract, sniff
from pipeline.items import content_hash
from pipeline.jobs import Enqueuer, JobRef, JobSpec
from pipeline.providers.batching import BatchingEmbedder
from pipeline.providers.chat import get_summarizer
from pipeline.providers.embeddings import get_embedder
from pipeline.providers.ocr import OcrLimits, ocr_image, ocr_pdf_pages
from pipeline.settings import Settings
from pipeline.stages.analyze import PAGE_BREAK, split_text
from pipeline.stages.fetch import fetch_policy, fetch_url

Writer = Callable[[asyncpg.Connection], Awaitable[list[JobRef] | None]]
Task = Callable[[asyncpg.Record, "Deps"], Awaitable[Writer]]
T = TypeVar("T")

# Extraction and OCR are CPU-bound and not async: they run here, one at a time per process,
# off the event loop (which keeps renewing leases) and off the embedder's own thread.
_CPU = ThreadPoolExecutor(max_workers=1, thread_name_prefix="extract")
RELATED_SUMMARIES = 5


@dataclass
class Deps:
    """Everything a job needs, filled once per worker process."""

    pool: asyncpg.Pool
    settings: Settings
    queue: Enqueuer
    worker_id: str
    _embedder: BatchingEmbedder | None = field(default=None, repr=False)

    @property
    def embedder(self) -> BatchingEmbedder:
        if self._embedder is None:
            self._embedder = get_embedder(self.settings,
                                          thread_nice=self.settings.worker_model_nice)
        return self._embedder


@dataclass(frozen=True)
class Source:
    media_type: str
    text: str | None
    data: bytes | None
    meta: dict[str, Any]
    content_hash: str
    text_hash: str | None
    title: str | None
    tags: dict[str, str]


async def _cpu(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_CPU, partial(fn, *args))


async def _load_source(job: asyncpg.Record, deps: Deps) -> Source:
    row = await deps.pool.fetchrow(
        Q["items.get_job_source"], job["tenant_id"], job["item_id"], job["version"]
    )
    if row is None:
        raise PermanentError(f"no source stored for {job['item_id']} v{job['version']}")
    return Source(
        media_type=row["media_type"], text=row["content"], data=row["data"], meta=row["meta"],
        content_hash=row["content_hash"], text_hash=row["text_hash"], title=row["title"],
        tags=row["tags"],
    )


def _text_of(source: Source, job: asyncpg.Record) -> str:
    if source.text is None:
        raise PermanentError(f"no text extracted for {job['item_id']} v{job['version']}")
    return source.text


async def _is_current(conn: asyncpg.Connection, job: asyncpg.Record, source: Source) -> bool:
    """False when newer content replaced this version, or OCR replaced the text, while the job
    ran: its result would be stale, so it is not written (the newer jobs write theirs)."""
    return bool(await conn.fetchval(
        Q["items.source_is_current"], job["tenant_id"], job["item_id"], job["version"],
        source.text_hash,
    ))


async def _follow_up(
    conn: asyncpg.Connection, job: asyncpg.Record, deps: Deps, specs: Sequence[JobSpec],
    payload: dict[str, Any] | None = None,
) -> list[JobRef]:
    rows = await jobs.create_jobs(
        conn, tenant_id=job["tenant_id"], item_id=job["item_id"], version=job["version"],
        specs=specs, max_attempts=deps.settings.max_attempts_for, payload=payload,
    )
    return jobs.refs_to_enqueue(rows)


# regularize ------------------------------------------------------------------------------


def extract_limits(settings: Settings) -> ExtractLimits:
    return ExtractLimits(
        max_pages=settings.max_pages,
        max_image_pixels=settings.max_image_pixels,
        max_unzipped_bytes=settings.max_unzipped_bytes,
    )


def describe(extracted: Extracted, name: str | None) -> str:
    """A line of what is known about a file without text (a scan, a photo, a recording), so it
    is findable by its metadata until OCR, if any, gives it words."""
    label = extracted.title or name or extracted.media_type
    facts = ", ".join(f"{k} {v}" for k, v in sorted(extracted.tags.items()) if k != "title")
    return f"{extracted.kind.capitalize()}: {label}" + (f" ({facts})" if facts else "")


def pending_ocr_placeholder(page: int) -> str:
    return f"[page {page + 1}: scanned, text pending OCR]"


def text_with_placeholders(extracted: Extracted, name: str | None) -> str:
    if extracted.kind != "document":
        return extracted.text or describe(extracted, name)
    if not extracted.ocr_pages:
        return extracted.text
    pages = extracted.text.split(PAGE_BREAK)
    for page in extracted.ocr_pages:
        if page < len(pages):
            pages[page] = pending_ocr_placeholder(page)
    return f"{describe(extracted, name)}\n\n" + PAGE_BREAK.join(pages)


async def regularize(job: asyncpg.Record, deps: Deps) -> Writer:
    """Fetch (for a URL) and extract text and metadata; scanned pages get an OCR job."""
    source = await _load_source(job, deps)
    data, declared, name = source.data, source.media_type, source.meta.get("filename")
    fetched_meta: dict[str, Any] = {}
    fetched = None
    if data is None and source.meta.get("uri"):
        fetched = await fetch_url(source.meta["uri"], fetch_policy(deps.settings))
        data, declared, name = fetched.data, fetched.media_type, urlsplit(fetched.url).path
        fetched_meta = {"final_url": fetched.url}
    if not data:
        raise PermanentError("there is nothing to extract text from: the source is empty")
    media_type = sniff(data, name, declared)
    extracted = await _cpu(extract, data, media_type, extract_limits(deps.settings))
    if extracted.kind == "document" and not extracted.text.strip() and not extracted.ocr_pages:
        raise PermanentError(f"the {media_type} document has no text to index")
    text = text_with_placeholders(extracted, name)
    tags = {f"_{k}": v for k, v in extracted.tags.items()}
    tags["_media_type"] = media_type
    if extracted.language:
        tags["_language"] = extracted.language

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        if not await _is_current(conn, job, source):
            return []
        await conn.execute(
            Q["items.set_source_text"], job["tenant_id"], job["item_id"], job["version"], text,
            content_hash(text), media_type, fetched.data if fetched else None,
            {**fetched_meta, "ocr_pages": list(extracted.ocr_pages)},
        )
        await conn.execute(
            Q["items.set_extracted"], job["tenant_id"], job["item_id"], extracted.kind,
            extracted.title, tags,
        )
        if not extracted.ocr_pages:
            return []
        return await _follow_up(conn, job, deps, (JobSpec(jobs.OCR),),
                                {"pages": list(extracted.ocr_pages)})

    return write


# ocr ---------------------------------------------------------------------------------------


async def ocr(job: asyncpg.Record, deps: Deps) -> Writer:
    """Replace the placeholders with recognized text, then split, summarize and embed again."""
    source = await _load_source(job, deps)
    if not source.data:
        raise PermanentError("no file stored to run OCR on")
    settings = deps.settings
    limits = OcrLimits(max_image_pixels=settings.max_image_pixels,
                       max_pages=settings.ocr_max_pages, dpi=settings.ocr_dpi)
    # Rebuilt from the file, not patched into the placeholder text: the text layer of the
    # other pages comes out of extraction again, the scanned pages out of OCR.
    extracted = await _cpu(extract, source.data, source.media_type, extract_limits(settings))
    name = source.meta.get("filename")
    if extracted.kind == "document":
        pages = extracted.text.split(PAGE_BREAK)
        found = await _cpu(ocr_pdf_pages, source.data, list(extracted.ocr_pages), limits)
        for page, recognized in found.items():
            if page < len(pages):
                pages[page] = recognized.strip()
        text = PAGE_BREAK.join(pages)
        if not text.replace(PAGE_BREAK, "").strip():
            text = f"{describe(extracted, name)} (OCR found no text)"
    else:
        recognized = (await _cpu(ocr_image, source.data, limits)).strip()
        text = describe(extracted, name) + (f"\n\n{recognized}" if recognized else "")

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        if not await _is_current(conn, job, source):
            return []
        await conn.execute(
            Q["items.set_source_text"], job["tenant_id"], job["item_id"], job["version"], text,
            content_hash(text), source.media_type, None, {"ocr": "done"},
        )
        return await _follow_up(conn, job, deps, jobs.REPROCESS_PIPELINE)

    return write


# analyze, embed, summarize -----------------------------------------------------------------


async def analyze(job: asyncpg.Record, deps: Deps) -> Writer:
    source = await _load_source(job, deps)
    drafts = split_text(
        _text_of(source, job),
        max_words=deps.settings.part_max_words,
        overlap_words=deps.settings.part_overlap_words,
    )
    if not drafts:
        raise PermanentError("the document has no text to index")
    tenant_id, item_id, version = job["tenant_id"], job["item_id"], job["version"]

    async def write(conn: asyncpg.Connection) -> None:
        if not await _is_current(conn, job, source):
            return
        await conn.execute(Q["parts.delete_version"], tenant_id, item_id, version)
        await conn.execute(
            Q["parts.insert_many"],
            tenant_id,
            item_id,
            version,
            [d.position for d in drafts],
            [d.text for d in drafts],
            [d.meta for d in drafts],
            [content_hash(d.text) for d in drafts],
        )
        await conn.execute(Q["parts.delete_other_versions"], tenant_id, item_id, version)

    return write


async def vectors_by_hash(
    deps: Deps, tenant_id: int, rows: Sequence[asyncpg.Record]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Vectors for the rows' texts by content hash: from the cache where it has them, from the
    embedder for the rest. Returns (all, newly computed)."""
    key = reindex.model_key(deps.settings)
    hashes = sorted({r["content_hash"] for r in rows})
    cached = {
        r["content_hash"]: r["embedding"]
        for r in await deps.pool.fetch(Q["parts.cached_embeddings"], tenant_id, key, hashes)
    }
    todo: dict[str, str] = {}
    for r in rows:
        if r["content_hash"] not in cached:
            todo.setdefault(r["content_hash"], r["text"])
    computed = dict(zip(todo, await deps.embedder.embed(list(todo.values())), strict=True))
    return {**cached, **computed}, computed


async def cache_vectors(
    conn: asyncpg.Connection, deps: Deps, tenant_id: int, computed: dict[str, np.ndarray]
) -> None:
    key = reindex.model_key(deps.settings)
    await conn.executemany(
        Q["parts.cache_embedding"],
        [(tenant_id, key, digest, vector) for digest, vector in computed.items()],
    )


async def embed(job: asyncpg.Record, deps: Deps) -> Writer:
    """Embed the parts of one item version; concurrent embed jobs share model calls (see
    `providers.batching`), and cached vectors are reused by content hash. The vectors go to
    the column the index says this embedder's vectors belong in."""
    tenant_id, item_id, version = job["tenant_id"], job["item_id"], job["version"]
    rows = await deps.pool.fetch(Q["parts.of_version"], tenant_id, item_id, version)
    vectors, computed = await vectors_by_hash(deps, tenant_id, rows)

    async def write(conn: asyncpg.Connection) -> None:
        column = await reindex.target(conn, reindex.model_key(deps.settings))
        query = Q["parts.set_embedding"] if column == reindex.CURRENT else Q["reindex.set_next"]
        await conn.executemany(
            query, [(tenant_id, r["id"], vectors[r["content_hash"]]) for r in rows]
        )
        await cache_vectors(conn, deps, tenant_id, computed)

    return write


async def reindex_page(job: asyncpg.Record, deps: Deps) -> Writer:
    """Embed the next page of a tenant's parts for the reindex under way, then hand the rest
    of the tenant's parts to the next job of the chain."""
    tenant_id, after_id = job["tenant_id"], int(job["payload"].get("after_id", 0))
    rows = await deps.pool.fetch(Q["reindex.page"], tenant_id, after_id, reindex.PAGE_PARTS)
    vectors, computed = await vectors_by_hash(deps, tenant_id, rows)

    async def write(conn: asyncpg.Connection) -> list[JobRef] | None:
        if await reindex.target(conn, reindex.model_key(deps.settings)) != reindex.NEXT:
            return None  # the reindex finished or was superseded while this page ran
        await conn.executemany(
            Q["reindex.set_next"], [(tenant_id, r["id"], vectors[r["content_hash"]]) for r in rows]
        )
        await cache_vectors(conn, deps, tenant_id, computed)
        if len(rows) < reindex.PAGE_PARTS:
            return None
        created = await jobs.create_jobs(
            conn, tenant_id=tenant_id, item_id=None, version=None,
            specs=[JobSpec(jobs.REINDEX)], max_attempts=deps.settings.max_attempts_for,
            payload={"after_id": rows[-1]["id"]},
        )
        return jobs.refs_to_enqueue(created)

    return write


async def summarize_item(job: asyncpg.Record, deps: Deps) -> Writer:
    source = await _load_source(job, deps)
    text = _text_of(source, job)
    summarizer = get_summarizer(deps.settings)
    context: list[str] = []
    caller_tags = [{k: v} for k, v in source.tags.items() if not k.startswith("_")]
    if summarizer.name != "extractive" and caller_tags:
        context = [r["summary"] for r in await deps.pool.fetch(
            Q["items.related_summaries"], job["tenant_id"], job["item_id"], caller_tags,
            RELATED_SUMMARIES,
        )]
    summary = await summarizer.summarize(text, context=context)

    async def write(conn: asyncpg.Connection) -> None:
        if not await _is_current(conn, job, source):
            return
        await conn.execute(
            Q["items.set_summary"], job["tenant_id"], job["item_id"], source.content_hash,
            summary,
        )

    return write


TASKS: dict[str, Task] = {
    jobs.REGULARIZE: regularize,
    jobs.OCR: ocr,
    jobs.ANALYZE: analyze,
    jobs.EMBED: embed,
    jobs.REINDEX: reindex_page,
    jobs.SUMMARIZE: summarize_item,
}

# The agent memory's jobs build on Deps and the embedding helpers above.
from pipeline.memory import tasks as memory_tasks  # noqa: E402

TASKS.update(memory_tasks.TASKS)

# Erasing a tenant is the operator's job, under the operator's tenant (pipeline/erasure.py).
from pipeline import erasure  # noqa: E402

TASKS[jobs.ERASE_TENANT] = erasure.erase_tenant

# Memory upkeep's steps (pipeline/memory/upkeep/steps.py).
from pipeline.memory.upkeep import steps as upkeep_steps  # noqa: E402

TASKS.update(upkeep_steps.TASKS)
