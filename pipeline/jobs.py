"""The job contract: kinds, the ledger rows a request writes, enqueueing, and the retry policy.

Postgres is the truth and Redis is the fast lane. A request writes its ledger rows in the same
transaction as the data they act on, then enqueues after commit (the outbox). If the enqueue
fails or Redis later loses the job, the sweeper finds the ledger row and enqueues it again.

This module never imports arq: `Enqueuer` is the one method of arq's pool we use, declared
structurally, so the API and the workers each pass in their own arq connection.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import asyncpg

from pipeline import fairness
from pipeline.db import Q
from pipeline.fairness import FairJob, FairQueueing
from pipeline.settings import get_settings

log = logging.getLogger(__name__)

REGULARIZE = "regularize"
OCR = "ocr"
ANALYZE = "analyze"
SUMMARIZE = "summarize"
EMBED = "embed"
EXTRACT = "extract"
REINDEX = "reindex"
EMBED_MEMORY = "embed_memory"
FORGET = "forget"
ERASE_TENANT = "erase_tenant"
WEBHOOK = "webhook"
# A memory upkeep run's steps (pipeline/memory/upkeep/), one job each, in this order.
PRUNE_MEMORIES = "prune_memories"
PROMOTE_MEMORIES = "promote_memories"
MERGE_MEMORIES = "merge_memories"
DECAY_MEMORIES = "decay_memories"
LINK_MEMORIES = "link_memories"
UPKEEP_KINDS = (PRUNE_MEMORIES, PROMOTE_MEMORIES, MERGE_MEMORIES, DECAY_MEMORIES, LINK_MEMORIES)
KINDS = (REGULARIZE, OCR, ANALYZE, SUMMARIZE, EMBED, EXTRACT, REINDEX, EMBED_MEMORY, FORGET,
         ERASE_TENANT, WEBHOOK, *UPKEEP_KINDS)

# Ledger statuses, in the order a job moves through them.
WAITING, QUEUED, RUNNING, DONE, DEAD, CANCELLED = (
    "waiting",
    "queued",
    "running",
    "done",
    "dead",
    "cancelled",
)
STATUSES = (WAITING, QUEUED, RUNNING, DONE, DEAD, CANCELLED)

# The queue runs jobs in order of when they became due. A later stage is enqueued as if it had
# been waiting this much longer, so it overtakes up to that much backlog of earlier stages: in
# a bulk load of 100k documents items finish one by one from the start (the progress bar
# moves, the first documents are searchable within seconds) instead of every document being
# split before the first is embedded. Retries keep their backoff and get no head start.
STAGE_HEAD_START_S = {
    REGULARIZE: 0.0,
    OCR: 0.0,
    REINDEX: 0.0,
    ANALYZE: 3600.0,
    SUMMARIZE: 3600.0,
    EXTRACT: 3600.0,
    EMBED: 7200.0,
    EMBED_MEMORY: 7200.0,
    FORGET: 0.0,
    ERASE_TENANT: 0.0,
    # A delivery is small and someone waits for it: ahead of any backlog, like the last stage.
    WEBHOOK: 7200.0,
    # Background upkeep: behind whatever a caller waits for.
    PRUNE_MEMORIES: 0.0,
    PROMOTE_MEMORIES: 0.0,
    MERGE_MEMORIES: 0.0,
    DECAY_MEMORIES: 0.0,
    LINK_MEMORIES: 0.0,
}


class Enqueuer(Protocol):
    """What we need of a queue: arq's `ArqRedis.enqueue_job` fits this shape. A queue that
    can also run Lua scripts (`register_script`, as arq's pool can) gets fair scores (see
    `pipeline.fairness`); with one that cannot, jobs are scored by due time alone."""

    async def enqueue_job(
        self,
        function: str,
        *args: Any,
        _job_id: str | None = None,
        _queue_name: str | None = None,
        _defer_by: float | None = None,
        _defer_until: datetime | None = None,
        _expires: float | None = None,
    ) -> Any: ...


@dataclass(frozen=True)
class JobSpec:
    """A job to create with an item version; `after` names the kind it waits for."""

    kind: str
    after: str | None = None


@dataclass(frozen=True)
class JobRef:
    """Enough to put a job on the queue. The queue's job id includes the attempt, so a retry
    enqueued while the current attempt is still running is never mistaken for a duplicate,
    and the tenant, so a worker can keep a share of its slots for other tenants without
    reading the job (workers/main.py)."""

    id: uuid.UUID
    kind: str
    attempts: int = 0
    # Due later than now (an extraction waiting for its session to go quiet): the queue holds
    # it back this long. None: due at once, with its stage's head start.
    defer_s: float | None = None
    # Whose job it is: fair queueing orders tenants' jobs by it. None: by due time alone.
    tenant_id: int | None = None

    @property
    def queue_job_id(self) -> str:
        delivery = f"{self.id}:{self.attempts + 1}"
        return delivery if self.tenant_id is None else f"{delivery}:{self.tenant_id}"


def queue_job_tenant(queue_job_id: str) -> int | None:
    """The tenant named in a queue job id (`JobRef.queue_job_id`), or None: a job without a
    tenant, or an id of another shape."""
    parts = queue_job_id.split(":")
    return int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else None


TEXT_PIPELINE = (JobSpec(ANALYZE), JobSpec(SUMMARIZE), JobSpec(EMBED, after=ANALYZE))
# Files and URLs: regularize extracts the text first (and adds an OCR job when pages are scans).
DOCUMENT_PIPELINE = (
    JobSpec(REGULARIZE),
    JobSpec(ANALYZE, after=REGULARIZE),
    JobSpec(SUMMARIZE, after=REGULARIZE),
    JobSpec(EMBED, after=ANALYZE),
)
# After OCR replaced the placeholder text: split, summarize and embed again.
REPROCESS_PIPELINE = TEXT_PIPELINE


async def create_jobs(
    conn: asyncpg.Connection,
    *,
    tenant_id: int,
    item_id: str | None,
    version: int | None,
    specs: Sequence[JobSpec],
    max_attempts: Callable[[str], int],
    payload: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Write ledger rows inside the caller's transaction, in one pipelined round trip; returns
    them in spec order."""
    ids: dict[str, uuid.UUID] = {}
    rows: list[dict[str, Any]] = []
    args: list[tuple[Any, ...]] = []
    for spec in specs:
        job_id = uuid.uuid4()
        depends_on = ids[spec.after] if spec.after else None
        status = WAITING if depends_on else QUEUED
        args.append((job_id, tenant_id, spec.kind, item_id, version, status, depends_on,
                     max_attempts(spec.kind), payload or {}))
        ids[spec.kind] = job_id
        rows.append({"id": job_id, "kind": spec.kind, "status": status, "attempts": 0,
                     "tenant_id": tenant_id})
    if args:
        await conn.executemany(Q["jobs.insert"], args)
    return rows


def refs_to_enqueue(rows: Iterable[dict[str, Any]]) -> list[JobRef]:
    return [JobRef(r["id"], r["kind"], r.get("attempts", 0), tenant_id=r.get("tenant_id"))
            for r in rows if r["status"] == QUEUED]


async def enqueue(
    pool: asyncpg.Pool,
    queue: Enqueuer,
    refs: Sequence[JobRef],
    *,
    queue_name: str,
    defer_s: float | None = None,
    fair: FairQueueing | None = None,
) -> int:
    """Put committed jobs on the fast lane. A failure here loses nothing: the ledger row stays
    queued with no enqueue time, and the sweeper enqueues it. Returns how many went through.
    Without `defer_s` a job is due at once: scored fairly among tenants (`fair`, by default
    the process's settings; see `pipeline.fairness`), or by due time with its stage's head
    start when fair queueing is off or the job has no tenant."""
    try:
        placements = await _placements(queue, refs, queue_name, defer_s,
                                       fair or FairQueueing.of(get_settings()))
    except Exception as exc:  # noqa: BLE001 - Redis down must not fail the request
        log.warning("scoring %d jobs failed, the sweeper will enqueue them: %s", len(refs), exc)
        return 0
    sent: list[uuid.UUID] = []
    for ref, placement in zip(refs, placements, strict=True):
        try:
            if placement is not None:  # None: already queued (arq would refuse it too)
                await queue.enqueue_job(
                    ref.kind, str(ref.id), _job_id=ref.queue_job_id, _queue_name=queue_name,
                    **placement,
                )
            sent.append(ref.id)
        except Exception as exc:  # noqa: BLE001 - Redis down must not fail the request
            log.warning("enqueue of job %s failed, the sweeper will retry: %s", ref.id, exc)
            break
    if sent:
        try:
            await pool.execute(Q["jobs.mark_enqueued"], sent)
        except Exception as exc:  # noqa: BLE001 - only an optimisation for the sweeper
            log.warning("could not record enqueue time: %s", exc)
    return len(sent)


async def _placements(
    queue: Enqueuer, refs: Sequence[JobRef], queue_name: str, defer_s: float | None,
    fair: FairQueueing,
) -> list[dict[str, Any] | None]:
    """arq's scheduling arguments for each ref: a fair score, or a delay by due time."""
    placements: list[dict[str, Any] | None] = [{"_defer_by": _defer_of(r, defer_s)} for r in refs]
    if not (fair.enabled and isinstance(queue, fairness.ScriptRunner)):
        return placements
    chosen = [(i, FairJob(r.tenant_id, round(STAGE_HEAD_START_S.get(r.kind, 0.0) * 1000),
                          r.queue_job_id))
              for i, r in enumerate(refs) if r.tenant_id is not None and _due_now(r, defer_s)]
    if not chosen:
        return placements
    scores = await fairness.fair_scores(queue, queue_name, [job for _, job in chosen],
                                        cost_ms=fair.cost_ms)
    for (i, _), score in zip(chosen, scores, strict=True):
        placements[i] = None if score == fairness.ALREADY_QUEUED else {
            # Exact milliseconds (a delay would be added to arq's own reading of the clock),
            # and a key expiry of its own: arq's would count from a score that may be past.
            "_defer_until": datetime.fromtimestamp(score / 1000, UTC),
            "_expires": fairness.JOB_EXPIRES_S,
        }
    return placements


def _due_now(ref: JobRef, defer_s: float | None) -> bool:
    """A deferred job (a retry's backoff, an extraction waiting for quiet) keeps its
    wall-clock due time: only jobs due now are scored fairly."""
    defer = defer_s if defer_s is not None else ref.defer_s
    return defer is None or defer <= 0


def _defer_of(ref: JobRef, defer_s: float | None) -> float:
    if defer_s is not None:
        return defer_s
    if ref.defer_s is not None:
        return ref.defer_s
    return -STAGE_HEAD_START_S.get(ref.kind, 0.0)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits a random share of
    min(base * 2^(n-1), max). Full jitter spreads a burst of failures (a provider outage hit by
    a thousand jobs) evenly instead of in synchronized waves."""

    base_s: float = 30.0
    max_s: float = 3600.0

    def ceiling_s(self, attempt: int) -> float:
        return min(self.max_s, self.base_s * 2 ** max(attempt - 1, 0))

    def delay_s(self, attempt: int, *, rand: Callable[[], float] = random.random) -> float:
        return self.ceiling_s(attempt) * rand()
