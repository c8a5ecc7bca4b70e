"""What every HTTP provider shares: one client, a bound on requests in flight and on requests
started per second, and short in-place retries that honour Retry-After.

A failure that waiting may cure (connection refused or reset, a timeout, 429, 5xx) is tried
again here a few times; when the tries are spent it becomes a TransientError, and the job
backs off at the job level. A failure that retrying cannot fix (a bad key, an unknown model,
an answer of the wrong shape) is a PermanentError at once, worded so that a person knows
which setting to look at. API keys never appear in logs or error messages.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from aiolimiter import AsyncLimiter
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_base, wait_random_exponential

from pipeline.errors import PermanentError, TransientError
from pipeline.providers import usage
from pipeline.settings import Settings

log = logging.getLogger(__name__)

# Worth trying again after a wait: rate limited, overloaded (529 is Anthropic's), or a gateway
# that lost its upstream. 408 is the server giving up on a slow request of ours.
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
EXCERPT_CHARS = 300


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP-date; None when
    absent or unreadable. A date in the past means "now" (0)."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP-dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _retry_after(headers: httpx.Headers) -> float | None:
    """Retry-After, or the millisecond variant some OpenAI-compatible servers send."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000
        except ValueError:
            pass
        else:
            if math.isfinite(value):
                return max(0.0, value)
    return parse_retry_after(headers.get("retry-after"))


class _Retryable(Exception):
    """One failed try that waiting may cure. Internal: callers see TransientError."""

    def __init__(self, detail: str, *, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.retry_after = retry_after


class WaitRetryAfter(wait_base):
    """The server's Retry-After when the last try carried one (capped), else `fallback`."""

    def __init__(self, *, max_wait: float, fallback: wait_base) -> None:
        self.max_wait = max_wait
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            return min(exc.retry_after, self.max_wait)
        return self.fallback(retry_state)


def _status_text(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def _display_url(url: str) -> str:
    """The URL without credentials or query string: both may carry a key."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class SettingNames:
    """The environment variables a person should look at when this provider fails."""

    api_key: str
    base_url: str
    model: str
    extra_hints: Mapping[int, str] = field(default_factory=dict)


@dataclass
class _LoopState:
    client: httpx.AsyncClient
    semaphore: asyncio.Semaphore
    limiter: AsyncLimiter


class ProviderClient:
    """One per provider instance. The httpx client, the semaphore and the rate limiter belong
    to an event loop, so they are made per running loop, on first use in it. Every try is
    counted (pipeline/providers/usage.py) under `provider` and the model its body names."""

    def __init__(self, settings: Settings, *, label: str, base_url: str,
                 names: SettingNames, provider: str | None = None) -> None:
        self.label = label
        self.provider = provider or label
        self.base_url = base_url.rstrip("/")
        self.names = names
        self.timeout_s = settings.provider_timeout_s
        self.concurrency = settings.provider_concurrency
        self.rate_per_s = settings.provider_rate_per_s
        self.retries = settings.provider_retries
        self.max_wait_s = settings.provider_retry_max_wait_s
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )

    def url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return path_or_url
        return f"{self.base_url}/{path_or_url.lstrip('/')}"

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            # AsyncLimiter cannot hand out more than its capacity at once: below one request
            # a second, express the rate as one request per 1/rate seconds.
            if self.rate_per_s >= 1:
                limiter = AsyncLimiter(self.rate_per_s, 1)
            else:
                limiter = AsyncLimiter(1, 1 / self.rate_per_s)
            state = _LoopState(
                client=httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s)),
                semaphore=asyncio.Semaphore(self.concurrency),
                limiter=limiter,
            )
            self._states[loop] = state
        return state

    async def aclose(self) -> None:
        """Close the client of the running loop (a later call makes a new one)."""
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.client.aclose()

    async def post_json(self, path_or_url: str, body: dict, headers: dict) -> dict:
        url = self.url(path_or_url)
        # Errors reach the tenant whose job failed (its attempts, its dead letters), so they
        # name the provider and its setting, never the host, which is the operator's business;
        # the retry lines of the worker's log, which only operators read, name the URL.
        where = f"{self.label} ({self.names.base_url})"
        logged = f"{self.label} at {_display_url(url)}"
        secrets = _secrets(headers)
        model = usage.model_name(body.get("model"))

        def before_sleep(retry_state: RetryCallState) -> None:
            exc = retry_state.outcome.exception() if retry_state.outcome else None
            wait = retry_state.next_action.sleep if retry_state.next_action else 0.0
            usage.USAGE.retry(self.provider, model, wait_ms=wait * 1000)
            log.warning(
                "%s: %s; trying again in %.2fs (try %d of %d)",
                logged, getattr(exc, "detail", type(exc).__name__),
                wait, retry_state.attempt_number + 1, self.retries,
            )

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries),
            wait=WaitRetryAfter(
                max_wait=self.max_wait_s,
                fallback=wait_random_exponential(multiplier=0.5, max=self.max_wait_s),
            ),
            retry=retry_if_exception_type(_Retryable),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._try_once(url, where, body, headers, secrets, model)
        except _Retryable as exc:
            raise TransientError(
                f"{where} still failing after {self.retries} "
                f"{'try' if self.retries == 1 else 'tries'}: {exc.detail}"
            ) from None
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _try_once(self, url: str, where: str, body: dict, headers: dict,
                        secrets: list[str], model: str) -> dict:
        state = self._state()
        attempt = usage.Attempt(self.provider, model)
        try:
            async with state.semaphore:
                await state.limiter.acquire()
                attempt.sent()
                response = await self._send(state, url, where, body, headers, secrets)
            attempt.answered(response.status_code)
            data = self._read(response, where, secrets)
            attempt.succeeded(data)
            return data
        except _Retryable as exc:
            if exc.status == 429 or exc.retry_after is not None:
                attempt.limited(exc.retry_after)
            raise
        finally:
            attempt.record()

    async def _send(self, state: _LoopState, url: str, where: str, body: dict, headers: dict,
                    secrets: list[str]) -> httpx.Response:
        """The POST, its transport failures sorted into retryable and permanent."""
        try:
            return await state.client.post(url, json=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise _Retryable(
                f"no answer within {self.timeout_s:g}s ({type(exc).__name__})"
            ) from None
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise _Retryable(
                f"{type(exc).__name__}: {_redact(str(exc), secrets) or 'connection failed'}"
            ) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise PermanentError(
                f"{where}: the URL is not usable ({_redact(str(exc), secrets)}): "
                f"check {self.names.base_url}"
            ) from None
        except httpx.TransportError as exc:  # proxy errors and the like
            raise _Retryable(f"{type(exc).__name__}: {_redact(str(exc), secrets)}") from None

    def _read(self, response: httpx.Response, where: str, secrets: list[str]) -> dict:
        status = response.status_code
        excerpt = _excerpt(response, secrets)
        if status in RETRYABLE_STATUSES:
            raise _Retryable(
                f"last answer {_status_text(status)}: {excerpt}",
                status=status,
                retry_after=_retry_after(response.headers),
            )
        if not 200 <= status < 300:
            raise PermanentError(
                f"{where} answered {_status_text(status)}: {self._hint(status)}"
                + (f" (the provider said: {excerpt})" if excerpt else "")
            )
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise PermanentError(
                f"{where} answered {_status_text(status)} with a body that is not JSON "
                f"({excerpt or 'empty'}): check {self.names.base_url} points at the "
                f"{self.label} API"
            ) from None
        if not isinstance(data, dict):
            raise PermanentError(
                f"{where} answered a JSON {type(data).__name__}, not an object: check "
                f"{self.names.base_url} points at the {self.label} API"
            )
        return data

    def _hint(self, status: int) -> str:
        names = self.names
        if status in names.extra_hints:
            return names.extra_hints[status]
        if status == 401:
            return f"check {names.api_key}"
        if status == 403:
            return f"the key is not allowed to do this: check {names.api_key} and {names.model}"
        if status == 404:
            return f"check {names.base_url} and {names.model}"
        if status in (400, 422):
            return f"the request was refused: check {names.model}"
        return f"check {names.base_url}, {names.model} and {names.api_key}"

    def shape_error(self, path_or_url: str, what: str) -> PermanentError:
        """For the providers: an answer that parsed as JSON but is not what the API returns."""
        return PermanentError(
            f"{self.label} ({self.names.base_url}) answered an unexpected shape at "
            f"{urlsplit(self.url(path_or_url)).path} ({what}): check {self.names.base_url} "
            f"points at the {self.label} API"
        )


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


_AUTH_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})


def _secrets(headers: Mapping[str, str]) -> list[str]:
    """The keys among the headers (bare, without "Bearer "), to scrub from what we report."""
    found: set[str] = set()
    for name, value in headers.items():
        if name.lower() not in _AUTH_HEADERS or not isinstance(value, str):
            continue
        token = value.split(" ", 1)[1] if value.lower().startswith("bearer ") else value
        if token.strip():
            found.add(token.strip())
    return sorted(found, key=len, reverse=True)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _excerpt(response: httpx.Response, secrets: list[str]) -> str:
    try:
        text = response.text
    except (UnicodeDecodeError, LookupError):
        text = response.content[:EXCERPT_CHARS].decode("utf-8", "replace")
    text = " ".join(_redact(text, secrets).split())
    if len(text) > EXCERPT_CHARS:
        text = text[: EXCERPT_CHARS - 1] + "…"
    return text


def secret_value(value: Any) -> str | None:
    """The plain value of a SecretStr setting (or None)."""
    if value is None:
        return None
    plain = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    return plain or None
