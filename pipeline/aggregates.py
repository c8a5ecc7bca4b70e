"""The figures of the overview and of /metrics, read from the aggregates that triggers keep on
the ledger (migration 0012): counts per state and kind, attempts per minute and hour, and
histograms of wait and run time. Nothing here counts the ledger itself, so the cost of a
snapshot does not grow with the number of jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg

from pipeline import jobs
from pipeline.db import Q

# The states an operator sees, in the order a job passes through them.
STATES = ("waiting", "queued", "running", "retrying", "done", "dead", "cancelled")
HISTOGRAM_BUCKETS = 48


def bucket_upper_ms(bucket: int) -> float:
    """Bucket b of a histogram holds durations of at most 2^(b/2) ms (migration 0012)."""
    return 2 ** (bucket / 2)


def percentile_ms(histogram: list[int] | None, q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile: within a factor of √2."""
    if not histogram:
        return None
    total = sum(histogram)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for bucket, n in enumerate(histogram):
        seen += n
        if seen >= rank and n:
            return bucket_upper_ms(bucket)
    return bucket_upper_ms(len(histogram) - 1)


async def fold(pool: asyncpg.Pool | asyncpg.Connection) -> bool:
    """Add the pending deltas up; False when another process is folding right now."""
    return bool(await pool.fetchval(Q["aggregates.fold"]))


@dataclass(frozen=True)
class Point:
    period: datetime
    done: int
    failed: int  # attempts that ended in a retry or a dead letter


@dataclass(frozen=True)
class KindTimings:
    kind: str
    done: int
    failed: int
    wait_p50_ms: float | None
    wait_p95_ms: float | None
    run_p50_ms: float | None
    run_p95_ms: float | None


@dataclass(frozen=True)
class Worker:
    id: str
    hostname: str
    pid: int
    started_at: datetime
    last_seen_at: datetime
    heartbeat_age_s: float
    in_hand: int
    lost: bool
    stopped: bool


@dataclass
class Overview:
    counts: dict[str, dict[str, int]]   # kind -> state -> n
    totals: dict[str, int]               # state -> n
    last_hour: list[Point]               # one point a minute
    last_day: list[Point]                # one point an hour
    hour_timings: list[KindTimings]
    day_done: int
    day_failed: int
    oldest_due_s: dict[str, float]       # kind -> age of its oldest due job
    workers: list[Worker]
    paused: list[str]
    computed_at: datetime
    kinds: list[str] = field(default_factory=list)

    @property
    def hour_done(self) -> int:
        return sum(p.done for p in self.last_hour)

    @property
    def hour_failed(self) -> int:
        return sum(p.failed for p in self.last_hour)

    @staticmethod
    def failure_rate(done: int, failed: int) -> float | None:
        return failed / (done + failed) if done + failed else None

    @property
    def workers_alive(self) -> int:
        return sum(1 for w in self.workers if not w.lost and not w.stopped)


def _points(rows: list[asyncpg.Record], start: datetime, step: timedelta, n: int) -> list[Point]:
    """Every period of the window, empty ones included, so a chart's bars keep their places."""
    by_period = {r["period"]: r for r in rows}
    points = []
    for i in range(n):
        period = start + i * step
        row = by_period.get(period)
        points.append(Point(period, row["done"] if row else 0,
                            (row["retried"] + row["dead"]) if row else 0))
    return points


async def counts(pool: asyncpg.Pool, tenant_id: int | None) -> dict[str, dict[str, int]]:
    by_kind: dict[str, dict[str, int]] = {}
    for row in await pool.fetch(Q["aggregates.counts"], tenant_id):
        by_kind.setdefault(row["kind"], {})[row["status"]] = row["n"]
    return by_kind


async def timings(
    pool: asyncpg.Pool, tenant_id: int | None, grain: str, since: datetime
) -> list[asyncpg.Record]:
    return await pool.fetch(Q["aggregates.timings"], tenant_id, grain, since)


async def overview(
    pool: asyncpg.Pool, tenant_id: int | None, *, lost_after_s: float
) -> Overview:
    """One snapshot for the overview page: eight statements, whatever the ledger's size."""
    await fold(pool)
    now = await pool.fetchval("SELECT now()")
    minute = now.replace(second=0, microsecond=0)
    hour = minute.replace(minute=0)
    hour_start, day_start = minute - timedelta(minutes=59), hour - timedelta(hours=23)
    by_kind = await counts(pool, tenant_id)
    minute_rows = await pool.fetch(Q["aggregates.series"], tenant_id, "minute", hour_start)
    hour_rows = await pool.fetch(Q["aggregates.series"], tenant_id, "hour", day_start)
    kind_rows = await timings(pool, tenant_id, "minute", hour_start)
    oldest = await pool.fetch(Q["aggregates.oldest_due"], tenant_id)
    worker_rows = await pool.fetch(Q["aggregates.workers"], tenant_id, lost_after_s)
    paused = [r["kind"] for r in await pool.fetch(Q["aggregates.paused"])]

    totals = {state: sum(k.get(state, 0) for k in by_kind.values()) for state in STATES}
    last_day = _points(hour_rows, day_start, timedelta(hours=1), 24)
    return Overview(
        counts=by_kind,
        totals=totals,
        last_hour=_points(minute_rows, hour_start, timedelta(minutes=1), 60),
        last_day=last_day,
        hour_timings=[
            KindTimings(r["kind"], r["done"], r["retried"] + r["dead"],
                        percentile_ms(r["wait_hist"], 0.5), percentile_ms(r["wait_hist"], 0.95),
                        percentile_ms(r["run_hist"], 0.5), percentile_ms(r["run_hist"], 0.95))
            for r in kind_rows
        ],
        day_done=sum(p.done for p in last_day),
        day_failed=sum(p.failed for p in last_day),
        oldest_due_s={r["kind"]: max(0.0, (now - r["oldest_due"]).total_seconds())
                      for r in oldest},
        workers=[
            Worker(r["id"], r["hostname"], r["pid"], r["started_at"], r["last_seen_at"],
                   r["heartbeat_age_s"], r["in_hand"], r["lost"], r["stopped_at"] is not None)
            for r in worker_rows
        ],
        paused=paused,
        computed_at=now,
        kinds=[k for k in jobs.KINDS if k in by_kind] + sorted(set(by_kind) - set(jobs.KINDS)),
    )
