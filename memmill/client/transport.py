"""Sending calls: retries, errors, waiting for work to finish, and walking pages.

What to do with an answer (retry after how long, raise what, read what) is decided by pure
functions shared by both runners; the runners only differ in how they wait and send.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx

from memmill.client import errors
from memmill.client.calls import Call, PageCall, Wait, segment

T = TypeVar("T")

# Operations end in one of these; items leave `pending`.
FINISHED = ("done", "failed", "cancelled")
# The longest the server holds a request that waits for an operation.
SERVER_WAIT_S = 30.0
ITEM_POLL_S = (0.1, 2.0)  # first and longest pause between looks at waiting items
LOOKUP_IDS = 1000  # POST /v1/items/lookup takes this many ids at most


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a refused or failed request. 429 and 503 are retried for every call (memmill
    refuses before it writes anything); connection errors, timeouts, 502 and 504 only for calls
    that can be sent twice. A wait follows `Retry-After` when the server gives one, else
    grows from `base_s` with full jitter; a `Retry-After` beyond `max_wait_s` is not waited
    for, and the error is raised at once, carrying it."""

    attempts: int = 4
    base_s: float = 0.5
    max_wait_s: float = 30.0

    def delay_s(self, attempt: int, call: Call[Any], response: httpx.Response | None,
                *, rand: float | None = None) -> float | None:
        """How long to wait before try `attempt + 1`, or None not to try again."""
        if attempt >= self.attempts:
            return None
        if response is None:
            retryable = call.idempotent
        else:
            retryable = response.status_code in (429, 503) or (
                call.idempotent and response.status_code in (502, 504))
        if not retryable:
            return None
        told = retry_after_s(response) if response is not None else None
        if told is not None:
            return told if told <= self.max_wait_s else None
        jitter = random.random() if rand is None else rand
        return min(self.max_wait_s, self.base_s * 2 ** (attempt - 1)) * jitter


def retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def read(call: Call[T], response: httpx.Response) -> T:
    """The answer as the call's model, or the error it stands for."""
    body: Any = None
    if response.content:
        try:
            body = response.json()
        except ValueError:
            body = response.text
    if response.status_code >= 400:
        detail = body.get("detail") if isinstance(body, dict) else body
        raise errors.for_status(response.status_code)(
            str(detail or response.reason_phrase), status=response.status_code, body=body)
    return call.read(body)


def unreachable(client: httpx.Client | httpx.AsyncClient, exc: Exception) -> errors.MemmillError:
    return errors.ConnectionFailed(f"cannot reach {client.base_url}: {exc}")


def operation_call(operation_id: str, wait_s: float, scope: Mapping[str, str] | None) -> Call[Any]:
    return Call("GET", f"/v1/operations/{segment(operation_id)}", read=lambda body: body,
                params={**(scope or {}), "wait": round(min(wait_s, SERVER_WAIT_S), 3) or None})


def lookup_call(item_ids: list[str]) -> Call[Any]:
    return Call("POST", "/v1/items/lookup", read=lambda body: body, json={"ids": item_ids})


def check_operation(state: dict[str, Any]) -> bool:
    """Whether an operation finished; raises if it finished badly."""
    if state.get("status") not in FINISHED:
        return False
    if state["status"] != "done":
        raise errors.OperationFailed(
            f"operation {state.get('id')} {state['status']}: {state.get('error')}", body=state)
    return True


def still_pending(answer: dict[str, Any], wait: Wait) -> list[str]:
    """The ids among the looked-up items that are still pending; raises for a failed one when
    the wait asks for it."""
    for state in answer.get("items", []):
        if state.get("status") == "failed" and wait.raise_on_failure:
            raise errors.OperationFailed(f"item {state['id']} failed: {state.get('error')}",
                                         body=state)
    return [s["id"] for s in answer.get("items", []) if s.get("status") == "pending"]


def timed_out(what: str, timeout_s: float) -> errors.WaitTimedOut:
    return errors.WaitTimedOut(f"{what} still running after {timeout_s:g} s")


class SyncRunner:
    def __init__(self, http: httpx.Client, retry: RetryPolicy) -> None:
        self.http = http
        self.retry = retry

    def run(self, call: Call[T]) -> T:
        result = read(call, self.send(call))
        if call.wait is not None:
            self.wait(call.wait, result)
        return result

    def send(self, call: Call[Any]) -> httpx.Response:
        attempt = 1
        while True:
            try:
                response: httpx.Response | None = self.http.request(
                    call.method, call.path, params=call.query(), json=call.json,
                    files=call.files, data=call.data, headers=call.headers)
            except httpx.TransportError as exc:
                response, error = None, exc
            delay = self.retry.delay_s(attempt, call, response)
            if delay is None:
                if response is None:
                    raise unreachable(self.http, error) from error
                return response
            time.sleep(delay)
            attempt += 1

    def wait(self, wait: Wait, result: Any) -> None:
        deadline = time.monotonic() + wait.timeout_s
        for operation_id in wait.operation_ids(result):
            while not check_operation(self.run(operation_call(
                    operation_id, deadline - time.monotonic(), wait.scope))):
                if time.monotonic() >= deadline:
                    raise timed_out(f"operation {operation_id}", wait.timeout_s)
        pending, pause = list(wait.item_ids(result)), ITEM_POLL_S[0]
        while pending:
            pending = [i for start in range(0, len(pending), LOOKUP_IDS)
                       for i in still_pending(self.run(lookup_call(
                           pending[start:start + LOOKUP_IDS])), wait)]
            if pending:
                if time.monotonic() + pause > deadline:
                    raise timed_out(f"{len(pending)} items", wait.timeout_s)
                time.sleep(pause)
                pause = min(pause * 2, ITEM_POLL_S[1])

    def walk(self, pages: PageCall[T]) -> Iterator[T]:
        call: Call[Any] | None = pages.first
        while call is not None:
            page = self.run(call)
            yield from pages.rows(page)
            params = pages.next_params(page, call.params or {})
            call = None if params is None else Call(
                call.method, call.path, call.read, params=params, headers=call.headers)


class AsyncRunner:
    def __init__(self, http: httpx.AsyncClient, retry: RetryPolicy) -> None:
        self.http = http
        self.retry = retry

    async def run(self, call: Call[T]) -> T:
        result = read(call, await self.send(call))
        if call.wait is not None:
            await self.wait(call.wait, result)
        return result

    async def send(self, call: Call[Any]) -> httpx.Response:
        attempt = 1
        while True:
            try:
                response: httpx.Response | None = await self.http.request(
                    call.method, call.path, params=call.query(), json=call.json,
                    files=call.files, data=call.data, headers=call.headers)
            except httpx.TransportError as exc:
                response, error = None, exc
            delay = self.retry.delay_s(attempt, call, response)
            if delay is None:
                if response is None:
                    raise unreachable(self.http, error) from error
                return response
            await asyncio.sleep(delay)
            attempt += 1

    async def wait(self, wait: Wait, result: Any) -> None:
        deadline = time.monotonic() + wait.timeout_s
        for operation_id in wait.operation_ids(result):
            while not check_operation(await self.run(operation_call(
                    operation_id, deadline - time.monotonic(), wait.scope))):
                if time.monotonic() >= deadline:
                    raise timed_out(f"operation {operation_id}", wait.timeout_s)
        pending, pause = list(wait.item_ids(result)), ITEM_POLL_S[0]
        while pending:
            still: list[str] = []
            for start in range(0, len(pending), LOOKUP_IDS):
                answer = await self.run(lookup_call(pending[start:start + LOOKUP_IDS]))
                still += still_pending(answer, wait)
            pending = still
            if pending:
                if time.monotonic() + pause > deadline:
                    raise timed_out(f"{len(pending)} items", wait.timeout_s)
                await asyncio.sleep(pause)
                pause = min(pause * 2, ITEM_POLL_S[1])

    async def walk(self, pages: PageCall[T]) -> AsyncIterator[T]:
        call: Call[Any] | None = pages.first
        while call is not None:
            page = await self.run(call)
            for row in pages.rows(page):
                yield row
            params = pages.next_params(page, call.params or {})
            call = None if params is None else Call(
                call.method, call.path, call.read, params=params, headers=call.headers)
