"""Prometheus metrics at /metrics, for an operator's key.

The job and provider figures come from the same aggregates as the dashboard (migration 0012,
pipeline.aggregates, pipeline.providers.usage), read from Postgres at scrape time: every API
process answers the same numbers, however many API and worker processes there are, and a
restart loses nothing. Only HTTP request latency is per process; with several API processes
behind one port, set PROMETHEUS_MULTIPROC_DIR (prometheus-client's multiprocess mode) and
each scrape adds them up.

Tenants are not a label: the scrape is the installation's, and a label per tenant would
multiply every series by the number of tenants."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import key_from
from pipeline import aggregates, tenants
from pipeline.db import Q
from pipeline.errors import Forbidden
from pipeline.providers import usage

router = APIRouter(include_in_schema=False)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

REQUEST_SECONDS = Histogram(
    "memmill_http_request_duration_seconds", "HTTP requests by route template and status.",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class RequestMetrics:
    """Times every request under its route's template (`/v1/jobs/{job_id}`, never the id
    itself, so the number of series stays bounded)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            REQUEST_SECONDS.labels(scope["method"], route, str(status)).observe(
                time.perf_counter() - started)


def _histogram_buckets(histogram: list[int] | None) -> list[tuple[str, float]]:
    """Our 48 buckets (b ≤ 2^(b/2) ms) as Prometheus' cumulative `le` buckets in seconds,
    one per power of two from 1 ms, then +Inf."""
    counts = list(histogram or [0] * aggregates.HISTOGRAM_BUCKETS)
    out, seen = [], 0
    for bucket, n in enumerate(counts):
        seen += n
        if bucket % 2 == 0 and bucket < len(counts) - 1:
            out.append((f"{aggregates.bucket_upper_ms(bucket) / 1000:g}", float(seen)))
    out.append(("+Inf", float(seen)))
    return out


class _Snapshot(Collector):
    """The metric families of one scrape, built from figures already read."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


async def job_families(pool: asyncpg.Pool, *, lost_after_s: float) -> list[Metric]:
    await aggregates.fold(pool)
    counts = await aggregates.counts(pool, None)
    totals = await aggregates.timings(pool, None, "total", datetime(1970, 1, 1, tzinfo=UTC))
    oldest = await pool.fetch(Q["aggregates.oldest_due"], None)
    now = datetime.now(UTC)
    workers = await pool.fetch(Q["aggregates.workers"], None, lost_after_s)

    jobs = GaugeMetricFamily("memmill_jobs", "Jobs in the ledger by kind and state.",
                             labels=["kind", "state"])
    depth = GaugeMetricFamily("memmill_queue_depth",
                              "Queued jobs (due or backing off) by kind.", labels=["kind"])
    for kind, states in sorted(counts.items()):
        for state in aggregates.STATES:
            jobs.add_metric([kind, state], states.get(state, 0))
        depth.add_metric([kind], states.get("queued", 0) + states.get("retrying", 0))
    attempts = CounterMetricFamily("memmill_job_attempts", "Finished attempts by outcome.",
                                   labels=["kind", "outcome"])
    run = HistogramMetricFamily("memmill_job_run_seconds", "Time from claim to the end of "
                                "an attempt.", labels=["kind"])
    wait = HistogramMetricFamily("memmill_job_wait_seconds", "Time from due to claimed.",
                                 labels=["kind"])
    for row in totals:
        for outcome, column in (("done", "done"), ("retry", "retried"), ("dead", "dead")):
            attempts.add_metric([row["kind"], outcome], row[column])
        run.add_metric([row["kind"]], _histogram_buckets(row["run_hist"]),
                       sum_value=row["run_ms"] / 1000)
        wait.add_metric([row["kind"]], _histogram_buckets(row["wait_hist"]),
                        sum_value=row["wait_ms"] / 1000)
    latency = GaugeMetricFamily("memmill_queue_oldest_due_seconds",
                                "Age of the oldest due job, by kind.", labels=["kind"])
    for row in oldest:
        latency.add_metric([row["kind"]], max(0.0, (now - row["oldest_due"]).total_seconds()))
    alive = GaugeMetricFamily("memmill_workers_alive", "Workers with a recent heartbeat.")
    alive.add_metric([], sum(1 for w in workers if not w["lost"] and w["stopped_at"] is None))
    return [jobs, depth, attempts, run, wait, latency, alive]


async def provider_families(pool: asyncpg.Pool) -> list[Metric]:
    labels = ["provider", "model"]
    calls = CounterMetricFamily("memmill_provider_calls", "HTTP calls to providers.",
                                labels=labels)
    errors = CounterMetricFamily("memmill_provider_errors", "Failed provider calls by class.",
                                 labels=[*labels, "error"])
    retries = CounterMetricFamily("memmill_provider_retries", "Provider calls tried again.",
                                  labels=labels)
    waited = CounterMetricFamily("memmill_provider_wait_seconds",
                                 "Time spent waiting on rate limits and backoff.",
                                 labels=labels)
    tokens = CounterMetricFamily("memmill_provider_tokens", "Tokens the providers reported.",
                                 labels=[*labels, "direction"])
    for total in await usage.provider_totals(pool):
        key = [total.provider, total.model]
        c = total.counts
        calls.add_metric(key, c.calls)
        for error, n in (("429", c.errors_429), ("5xx", c.errors_5xx),
                         ("other", c.errors_other)):
            errors.add_metric([*key, error], n)
        retries.add_metric(key, c.retries)
        waited.add_metric(key, c.wait_ms / 1000)
        tokens.add_metric([*key, "in"], c.tokens_in)
        tokens.add_metric([*key, "out"], c.tokens_out)
    return [calls, errors, retries, waited, tokens]


def _process_metrics() -> Iterator[Collector]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        yield registry
    else:
        yield REGISTRY


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = request.app.state
    principal = await tenants.authenticate(state.pool, key_from(Headers(scope=request.scope)),
                                           state.key_cache)
    if not principal.operator:
        raise Forbidden("/metrics describes every tenant: it needs an operator's key")
    settings = state.settings
    families = await job_families(state.pool, lost_after_s=3 * settings.worker_heartbeat_s)
    families += await provider_families(state.pool)
    registry = CollectorRegistry()
    registry.register(_Snapshot(families))
    body = generate_latest(registry)
    for collector in _process_metrics():
        body += generate_latest(collector)  # type: ignore[arg-type]
    return Response(body, media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"})
