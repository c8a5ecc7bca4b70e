"""Fair queueing between tenants: start-time fair queueing over the queue's scores.

Every job goes onto one arq queue, a Redis sorted set that workers read lowest score first.
Scored by due time alone, one tenant's bulk load of 20,000 items put every other tenant's
single item behind all of it. Here each tenant's jobs are spread over *virtual time* instead:

- V, where the workers are: the score of the first job in the queue that no worker holds (a
  running job stays in the set until it ends, and a long one would hold V back), and never
  later than now - `LEAD_MS`, or now - `LEAD_MS` when nothing waits;
- each tenant has clocks in Redis (one hash per tenant, `{queue}:fair:{tenant_id}`, expiring
  a day after its last use, so an idle tenant costs nothing): the end of its backlog. A job
  starts at max(V, the tenant's clock) and scores start + cost; the clock moves to that score.
  So a tenant with 20,000 queued jobs has a clock 20,000 costs past V, while a tenant with
  none starts at V: its job lands behind at most a handful, whoever else is waiting.

Why this, and not per-tenant queues or caps: the workers poll exactly as before (one queue, in
score order); no capacity idles (a lone tenant's bulk load runs at full speed: V is an hour
before now, so its scores are due at once while its backlog is under an hour of virtual time,
3.6 million jobs at 1 ms); a new tenant's job is at the head at once; and nothing per tenant
has to be configured or polled. A cap on each tenant's running jobs idles the workers when
one tenant has work and the others none, and still leaves the small tenant behind the big
one's FIFO backlog.

Stages within a tenant: a later stage (embed after analyze) still overtakes its tenant's
backlog of earlier stages, as `pipeline.jobs.STAGE_HEAD_START_S` orders them. A tenant has one
clock per head start; a job goes behind its tenant's backlog of its own and later stages, ahead
of the earlier ones, and what it overtakes is charged to them (their clocks move by its cost).
The head start is not subtracted from the score as it is without fair queueing: V is read
off the scores, and a score an hour or two early would drag V back with it, so that every
tenant arriving next would be scored hours ahead of the backlog, and each such arrival further.

Deferred jobs (a retry's backoff, an extraction waiting for its session to go quiet) keep
their wall-clock due time (now + defer): they are not reordered. Once due they sort after the
fairly scored jobs below their due time, as a retry sorted after the head-started stages
before. A job already in the queue (the sweeper re-enqueues anything unseen for a while) is
neither scored nor charged again.

The scoring is one Lua script, atomic, run once per enqueued batch. It reads arq's keys: a
job's key (already queued?) and its in-progress marker (held by a worker?). This module does
not import arq; `ARQ_JOB_KEY_PREFIX` and `ARQ_IN_PROGRESS_PREFIX` are arq's constants, and
tests/test_fairness.py fails if arq ever changes them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pipeline.settings import Settings

ARQ_JOB_KEY_PREFIX = "arq:job:"
ARQ_IN_PROGRESS_PREFIX = "arq:in-progress:"

# Fair scores sit this far before now, so that a backlog is due at once (see the docstring).
LEAD_MS = 3_600_000
# A tenant's clocks are forgotten a day after its last enqueue (by then its backlog is long
# behind V, where a missing clock starts anyway).
CLOCK_TTL_MS = 86_400_000
# How long a fairly scored job's key lives in Redis: arq's own default (a day after the job is
# due). arq counts it from the score, which here may be hours in the past; passed explicitly,
# it can never come out zero or negative (Redis refuses a non-positive expiry).
JOB_EXPIRES_S = 86_400.0
# How far down the queue V looks past jobs that workers hold (a page at a time).
HEAD_SCAN = 2048
HEAD_PAGE = 128
# What the script returns for a job whose key is already in Redis.
ALREADY_QUEUED = -1

SCRIPT = """
local now, lead, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, running = tonumber(ARGV[4]), ARGV[5]
local scan, page, tenants = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

-- V: the first job no worker holds, and never later than now - lead.
local v = now - lead
local offset = 0
local last = nil
while offset < scan do
  local head = redis.call('ZRANGE', KEYS[1], offset, offset + page - 1, 'WITHSCORES')
  if #head == 0 then last = nil break end
  local waiting = nil
  for i = 1, #head, 2 do
    if redis.call('EXISTS', running .. head[i]) == 0 then
      waiting = tonumber(head[i + 1])
      break
    end
  end
  if waiting then last = waiting break end
  last = tonumber(head[#head])
  offset = offset + page
end
if last and last < v then v = last end

-- Each tenant's clocks: head start (ms) -> the end of its backlog of that stage.
local clocks = {}
for t = 1, tenants do
  local c = {}
  local flat = redis.call('HGETALL', KEYS[1 + t])
  for i = 1, #flat, 2 do c[tonumber(flat[i])] = tonumber(flat[i + 1]) end
  clocks[t] = c
end

local scores = {}
local first_arg = 8
local jobs = (#ARGV - first_arg) / 2
for j = 1, jobs do
  local c = clocks[tonumber(ARGV[first_arg + 2 * j - 1])]
  local level = tonumber(ARGV[first_arg + 2 * j])
  if redis.call('EXISTS', KEYS[1 + tenants + j]) == 1 then
    scores[j] = -1
  else
    local start = v
    for l, at in pairs(c) do
      if l >= level and at > start then start = at end
    end
    for l, at in pairs(c) do
      if l < level and at > v then c[l] = at + cost end
    end
    c[level] = start + cost
    scores[j] = math.floor(start + cost + 0.5)
  end
end

-- A clock V has passed says nothing a missing one would not: only live ones are kept.
for t = 1, tenants do
  local flat = {}
  for l, at in pairs(clocks[t]) do
    if at > v then
      flat[#flat + 1] = string.format('%d', l)
      flat[#flat + 1] = string.format('%.17g', at)
    end
  end
  redis.call('DEL', KEYS[1 + t])
  if #flat > 0 then
    redis.call('HSET', KEYS[1 + t], unpack(flat))
    redis.call('PEXPIRE', KEYS[1 + t], ttl)
  end
end
return scores
"""


@runtime_checkable
class ScriptRunner(Protocol):
    """A queue that can run Lua scripts: any redis-py asyncio client, arq's pool included.
    redis-py's script object loads the script again when the server lost it (NOSCRIPT)."""

    def register_script(self, script: str) -> Any: ...


@dataclass(frozen=True)
class FairQueueing:
    """Whether jobs are scored fairly, and what a job costs in virtual time. Scores are whole
    milliseconds (arq rounds them), so a cost under 1 ms would tie a tenant's jobs."""

    enabled: bool = True
    cost_ms: float = 1.0

    @classmethod
    def of(cls, settings: Settings) -> FairQueueing:
        return cls(enabled=settings.fair_queueing, cost_ms=settings.fair_cost_ms)


@dataclass(frozen=True)
class FairJob:
    """A job to score: its tenant, its stage's head start and its id on the queue."""

    tenant_id: int
    head_start_ms: int
    queue_job_id: str


def clock_key(queue_name: str, tenant_id: int) -> str:
    return f"{queue_name}:fair:{tenant_id}"


def tenant_redis_keys(queue_name: str, tenant_id: int) -> list[str]:
    """Every key fair queueing keeps for a tenant (its clocks), for the tenant's erasure."""
    return [clock_key(queue_name, tenant_id)]


def now_ms() -> int:
    """The clock arq scores and polls by: this machine's, in whole milliseconds."""
    return round(time.time() * 1000)


async def fair_scores(
    queue: ScriptRunner,
    queue_name: str,
    jobs: Sequence[FairJob],
    *,
    cost_ms: float,
    now: int | None = None,
) -> list[int]:
    """The score of each job, in order, or `ALREADY_QUEUED`; moves the tenants' clocks.

    One atomic script call for the whole batch, so concurrent enqueues of one tenant never
    take the same place. Raises what Redis raises: the caller treats that as a failed enqueue
    (the ledger row stays unenqueued and the sweeper enqueues it)."""
    if not jobs:
        return []
    tenants = list(dict.fromkeys(job.tenant_id for job in jobs))
    index = {tenant_id: i + 1 for i, tenant_id in enumerate(tenants)}
    keys = [queue_name, *(clock_key(queue_name, t) for t in tenants),
            *(ARQ_JOB_KEY_PREFIX + job.queue_job_id for job in jobs)]
    args: list[Any] = [now_ms() if now is None else now, LEAD_MS, cost_ms, CLOCK_TTL_MS,
                       ARQ_IN_PROGRESS_PREFIX, HEAD_SCAN, HEAD_PAGE, len(tenants)]
    for job in jobs:
        args += [index[job.tenant_id], job.head_start_ms]
    script = queue.register_script(SCRIPT)
    scores: Awaitable[list[int]] = script(keys=keys, args=args)
    return [int(score) for score in await scores]


__all__ = ["ALREADY_QUEUED", "FairJob", "FairQueueing", "clock_key", "fair_scores",
           "tenant_redis_keys"]
