"""Every provider call counted in process, per tenant, provider and model, and added to
`provider_calls` (by minute, by hour and in total) and `provider_limits` every few seconds.

Recording is on the hot path of every call, so it is a dict update under a lock and no I/O:
the worker's heartbeat (`flush`) moves what was counted to Postgres in one transaction. The
tenant is a context variable the job runner sets while it runs a job (`tenant_scope`); a call
made outside a job (an API query's embedding, a warm-up) belongs to no tenant and is not
counted, though a rate limit it meets is still remembered: limits are installation-wide.

Counts are keyed by the minute they were recorded in, so a flush that fails and is retried
minutes later still puts each call in its own minute and hour.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the providers import this module, and need neither asyncpg nor pgvector
    import asyncpg

TENANT: ContextVar[int | None] = ContextVar("memmill_provider_usage_tenant", default=None)

# The counters of one (tenant, provider, model, minute), in the order of provider_calls.
FIELDS = ("calls", "errors_429", "errors_5xx", "errors_other", "retries", "wait_ms",
          "call_ms", "tokens_in", "tokens_out")
CALLS, ERRORS_429, ERRORS_5XX, ERRORS_OTHER, RETRIES, WAIT_MS, CALL_MS, TOKENS_IN, TOKENS_OUT = (
    range(len(FIELDS))
)

_Key = tuple[int, str, str, int]  # tenant, provider, model, minutes since the epoch
_Counts = dict[_Key, list[Any]]
_Limits = dict[tuple[str, str], tuple[float, float]]  # last limited at, limited until (epoch s)


@contextmanager
def tenant_scope(tenant_id: int | None) -> Iterator[None]:
    """Count the provider calls made inside (and in tasks started inside) for this tenant."""
    token = TENANT.set(tenant_id)
    try:
        yield
    finally:
        TENANT.reset(token)


def error_field(status: int | None) -> int:
    """The error counter of a failed try: its HTTP status, or None when no answer came."""
    if status == 429:
        return ERRORS_429
    if status is not None and 500 <= status <= 599:
        return ERRORS_5XX
    return ERRORS_OTHER


def model_name(value: Any) -> str:
    """The model a request body names (every provider's body has one), as counted."""
    return value if isinstance(value, str) and value else "unknown"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def tokens_of(data: Mapping[str, Any]) -> tuple[int, int]:
    """(tokens in, tokens out) as an answer reports them, (0, 0) when it does not: OpenAI's
    usage.prompt_tokens / completion_tokens (embeddings: prompt_tokens only), Anthropic's
    usage.input_tokens / output_tokens (plus cached input, which Anthropic counts apart and
    still bills), Ollama's prompt_eval_count / eval_count."""
    usage = data.get("usage")
    if isinstance(usage, Mapping):
        tokens_in = _count(usage.get("prompt_tokens")) or (
            _count(usage.get("input_tokens"))
            + _count(usage.get("cache_creation_input_tokens"))
            + _count(usage.get("cache_read_input_tokens"))
        )
        tokens_out = _count(usage.get("completion_tokens")) or _count(usage.get("output_tokens"))
        return tokens_in, tokens_out
    return _count(data.get("prompt_eval_count")), _count(data.get("eval_count"))


class Usage:
    """What this process counted since its last flush. Safe from any thread: the lock is
    uncontended on an event loop and keeps a flush's swap from racing a recording thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: _Counts = {}
        self._limits: _Limits = {}

    def _row(self, provider: str, model: str) -> list[Any] | None:
        """The counters of the current tenant and minute (call with the lock held)."""
        tenant = TENANT.get()
        if tenant is None:
            return None
        key = (tenant, provider, model, int(time.time() // 60))
        row = self._counts.get(key)
        if row is None:
            row = self._counts[key] = [0, 0, 0, 0, 0, 0.0, 0.0, 0, 0]
        return row

    def call(self, provider: str, model: str, *, error: int | None, call_ms: float,
             wait_ms: float = 0.0, tokens_in: int = 0, tokens_out: int = 0) -> None:
        """One try: `error` is None when it succeeded, else its error field (`error_field`)."""
        with self._lock:
            row = self._row(provider, model)
            if row is None:
                return
            row[CALLS] += 1
            if error is not None:
                row[error] += 1
            row[WAIT_MS] += wait_ms
            row[CALL_MS] += call_ms
            row[TOKENS_IN] += tokens_in
            row[TOKENS_OUT] += tokens_out

    def retry(self, provider: str, model: str, *, wait_ms: float) -> None:
        """A failed try is about to be tried again after `wait_ms`."""
        with self._lock:
            row = self._row(provider, model)
            if row is not None:
                row[RETRIES] += 1
                row[WAIT_MS] += wait_ms

    def limited(self, provider: str, model: str, *, retry_after_s: float | None) -> None:
        """The server rate-limited us (429) or asked us to come back later (Retry-After)."""
        now = time.time()
        until = now + (retry_after_s or 0.0)
        with self._lock:
            old = self._limits.get((provider, model))
            if old is not None:
                now, until = max(old[0], now), max(old[1], until)
            self._limits[(provider, model)] = (now, until)

    def take(self) -> tuple[_Counts, _Limits]:
        """Everything counted so far; counting starts again from nothing."""
        with self._lock:
            taken = self._counts, self._limits
            self._counts, self._limits = {}, {}
        return taken

    def give_back(self, counts: _Counts, limits: _Limits) -> None:
        """Add back what a failed flush took, to what was counted meanwhile."""
        with self._lock:
            for key, row in counts.items():
                mine = self._counts.get(key)
                if mine is None:
                    self._counts[key] = row
                else:
                    for i, value in enumerate(row):
                        mine[i] += value
            for key, (at, until) in limits.items():
                old = self._limits.get(key)
                self._limits[key] = (at, until) if old is None else (
                    max(old[0], at), max(old[1], until))


USAGE = Usage()


class Attempt:
    """One HTTP try, timed from the moment it queues for a slot and the rate limiter (its
    wait) to its answer (its call), recorded once whatever the outcome."""

    __slots__ = ("_sent", "_started", "_status", "_tokens", "model", "provider")

    def __init__(self, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self._started = time.monotonic()
        self._sent: float | None = None
        self._status: int | None = None
        self._tokens: tuple[int, int] | None = None

    def sent(self) -> None:
        self._sent = time.monotonic()

    def answered(self, status: int) -> None:
        self._status = status

    def succeeded(self, data: Mapping[str, Any]) -> None:
        self._tokens = tokens_of(data)

    def limited(self, retry_after_s: float | None) -> None:
        USAGE.limited(self.provider, self.model, retry_after_s=retry_after_s)

    def record(self) -> None:
        """A try cancelled before it was sent made no call and counts for nothing."""
        if self._sent is None:
            return
        tokens_in, tokens_out = self._tokens or (0, 0)
        USAGE.call(
            self.provider, self.model,
            error=None if self._tokens is not None else error_field(self._status),
            wait_ms=(self._sent - self._started) * 1000,
            call_ms=(time.monotonic() - self._sent) * 1000,
            tokens_in=tokens_in, tokens_out=tokens_out,
        )


@contextmanager
def timed_call(provider: str, model: str) -> Iterator[None]:
    """One call of a local model: counted, timed, and an error if it raised."""
    started = time.monotonic()
    failed = True
    try:
        yield
        failed = False
    finally:
        USAGE.call(provider, model, error=ERRORS_OTHER if failed else None,
                   call_ms=(time.monotonic() - started) * 1000)


# ------------------------------------------------------------------------------ to Postgres


async def flush(pool: asyncpg.Pool, *, usage: Usage = USAGE) -> int:
    """Add what was counted to provider_calls (every grain in one statement) and
    provider_limits, and prune old minute and hour rows, in one transaction. What was
    recorded during the flush stays for the next one; when the write fails (or is cancelled)
    everything taken is given back and the error raised. Returns the counter rows written."""
    from pipeline.db import Q

    counts, limits = usage.take()
    try:
        async with pool.acquire() as conn, conn.transaction():
            if counts:
                await conn.execute(Q["provider_usage.add_calls"], *_call_columns(counts))
            if limits:
                await conn.execute(Q["provider_usage.add_limits"], *_limit_columns(limits))
            await conn.execute(Q["provider_usage.prune"])
    except BaseException:
        usage.give_back(counts, limits)
        raise
    return len(counts)


def _call_columns(counts: _Counts) -> list[list[Any]]:
    """Column arrays for unnest: tenant, provider, model, minute, then each counter."""
    keys = list(counts)
    return [list(column) for column in zip(*keys, strict=True)] + [
        list(column) for column in zip(*(counts[k] for k in keys), strict=True)
    ]


def _limit_columns(limits: _Limits) -> list[list[Any]]:
    keys = list(limits)
    return [[k[0] for k in keys], [k[1] for k in keys],
            [limits[k][0] for k in keys], [limits[k][1] for k in keys]]


@dataclass(frozen=True)
class Counts:
    calls: int = 0
    errors_429: int = 0
    errors_5xx: int = 0
    errors_other: int = 0
    retries: int = 0
    wait_ms: float = 0.0
    call_ms: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0

    @classmethod
    def of(cls, row: Mapping[str, Any], prefix: str = "") -> Counts:
        return cls(**{name: row[prefix + name] for name in FIELDS})


@dataclass(frozen=True)
class ProviderSummary:
    """One provider and model on the dashboard: its calls over the last hour (by minute) and
    the last day (by hour), and the last rate limit it met (installation-wide)."""

    provider: str
    model: str
    last_hour: Counts
    last_day: Counts
    last_limited_at: datetime | None
    limited_until: datetime | None


@dataclass(frozen=True)
class ProviderTotal:
    provider: str
    model: str
    counts: Counts


async def provider_summary(pool: asyncpg.Pool, tenant_id: int | None) -> list[ProviderSummary]:
    """Per provider and model, for one tenant, or for all (None: an operator). A tenant sees
    only the models it called in the last day; an operator also sees limits without calls."""
    from pipeline.db import Q

    rows = await pool.fetch(Q["provider_usage.summary"], tenant_id)
    return [
        ProviderSummary(
            provider=r["provider"], model=r["model"], last_hour=Counts.of(r, "h_"),
            last_day=Counts.of(r, "d_"), last_limited_at=r["last_limited_at"],
            limited_until=r["limited_until"],
        )
        for r in rows
    ]


async def provider_totals(pool: asyncpg.Pool) -> list[ProviderTotal]:
    """Every call ever counted, per provider and model across tenants: Prometheus counters."""
    from pipeline.db import Q

    rows = await pool.fetch(Q["provider_usage.totals"])
    return [ProviderTotal(r["provider"], r["model"], Counts.of(r)) for r in rows]
