"""A local server that speaks the wire formats of the HTTP providers (OpenAI-compatible chat
and embeddings, Anthropic messages, Ollama chat and embed), with a fault script per test:
rate limits with Retry-After, 5xx, bad keys, malformed answers, vectors of the wrong dimension,
slow answers. Registered as a pytest plugin by conftest, so any test can use `fake`."""

from __future__ import annotations

import asyncio
import hashlib
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

DIM = 8
REFUSED_INPUT = "<refused>"  # the fake OpenAI embeddings server answers 400 to any input with it
KEY = "sk-test-0123456789"
ANSWER = "  The report covers Acme's third quarter: revenue rose 12% on strong widget sales.\n"
DOCUMENT = (
    "Acme Corporation published its third quarter report. Revenue rose twelve percent, "
    "driven by widget sales in Europe. The board approved a new factory in Lyon."
)


def fake_vector(text: str, dim: int = DIM) -> list[float]:
    """Deterministic, not normalized (so the client's normalization shows)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return [round(float(x) * 3, 6) for x in np.random.default_rng(seed).standard_normal(dim)]


def unit(values: list[float]) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


# ----------------------------------------------------------------------------- the fake server


@dataclass
class Fault:
    kind: str  # "status", "malformed", "json", "wrong_dim", "slow", "answer"
    times: int | None = 1  # None: forever
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay_s: float = 0.0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any
    at: float


class FakeProviders:
    """The server's state: a fault script consumed one request at a time, what it received,
    and how many requests it was answering at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: deque[Fault] = deque()
        self.requests: list[Seen] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay_s = 0.0
        self.dim = DIM  # of the vectors the embedding endpoints answer with
        self.url = ""

    def reset(self) -> None:
        deadline = time.monotonic() + 3
        while self.in_flight and time.monotonic() < deadline:  # slow answers of a past test
            time.sleep(0.02)
        with self.lock:
            self.faults.clear()
            self.requests.clear()
            self.max_in_flight = self.in_flight
            self.delay_s = 0.0
            self.dim = DIM

    def script(self, kind: str = "status", *, times: int | None = 1, **kwargs: Any) -> None:
        with self.lock:
            self.faults.append(Fault(kind, times, **kwargs))

    def take(self, seen: Seen) -> Fault | None:
        with self.lock:
            self.requests.append(seen)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if not self.faults:
                return None
            fault = self.faults[0]
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.popleft()
            return fault

    def done(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]


def _error_body(path: str, status: int, message: str) -> Any:
    if path == "/v1/messages":
        kinds = {401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error"}
        return {"type": "error", "error": {"type": kinds.get(status, "api_error"),
                                           "message": message}}
    if path.startswith("/api/"):
        return {"error": message}
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


def _openai_key_error(headers: Any) -> Response | None:
    auth = headers.get("authorization", "")
    if auth == f"Bearer {KEY}":
        return None
    given = auth.removeprefix("Bearer ")
    return JSONResponse(
        {"error": {"message": f"Incorrect API key provided: {given}.",
                   "type": "invalid_request_error", "code": "invalid_api_key"}},
        status_code=401,
    )


def build_app(state: FakeProviders) -> FastAPI:
    app = FastAPI()

    async def serve(request: Request, answer: Callable[[Any, Any, Fault | None], Response]):
        body = await request.json()
        path = request.url.path
        fault = state.take(Seen(path, dict(request.headers), body, time.monotonic()))
        try:
            delay = fault.delay_s if fault and fault.kind == "slow" else state.delay_s
            if delay:
                await asyncio.sleep(delay)
            if fault and fault.kind == "status":
                content = fault.body or _error_body(path, fault.status, "scripted failure")
                return JSONResponse(content, status_code=fault.status, headers=fault.headers)
            if fault and fault.kind == "malformed":
                return Response('{"choices": [{"message": {"content": "cut sh',
                                media_type="application/json")
            if fault and fault.kind == "json":
                return JSONResponse(fault.body)
            return answer(body, request.headers, fault)
        finally:
            state.done()

    def text_of(fault: Fault | None) -> str:
        return fault.body if fault and fault.kind == "answer" else ANSWER

    def dim_of(fault: Fault | None) -> int:
        return state.dim + 1 if fault and fault.kind == "wrong_dim" else state.dim

    @app.post("/v1/chat/completions")
    async def openai_chat(request: Request) -> Response:
        def answer(body: Any, headers: Any, fault: Fault | None) -> Response:
            refused = _openai_key_error(headers)
            if refused:
                return refused
            return JSONResponse({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant",
                                                     "content": text_of(fault)},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
            })

        return await serve(request, answer)

    @app.post("/v1/messages")
    async def anthropic_messages(request: Request) -> Response:
        def answer(body: Any, headers: Any, fault: Fault | None) -> Response:
            if headers.get("x-api-key") != KEY or headers.get("anthropic-version") is None:
                return JSONResponse(
                    {"type": "error", "error": {"type": "authentication_error",
                                                "message": "invalid x-api-key"}},
                    status_code=401,
                )
            return JSONResponse({
                "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": [
                    {"type": "thinking", "thinking": "Let me see.", "signature": "c2ln"},
                    {"type": "text", "text": text_of(fault)},
                ],
                "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 50, "output_tokens": 20},
            })

        return await serve(request, answer)

    @app.post("/api/chat")
    async def ollama_chat(request: Request) -> Response:
        def answer(body: Any, headers: Any, fault: Fault | None) -> Response:
            return JSONResponse({
                "model": body["model"], "created_at": "2024-01-01T00:00:00Z",
                "message": {"role": "assistant", "content": text_of(fault)},
                "done": True, "done_reason": "stop",
            })

        return await serve(request, answer)

    @app.post("/v1/embeddings")
    async def openai_embeddings(request: Request) -> Response:
        def answer(body: Any, headers: Any, fault: Fault | None) -> Response:
            refused = _openai_key_error(headers)
            if refused:
                return refused
            if any(REFUSED_INPUT in t for t in body["input"]):
                return JSONResponse(_error_body("/v1/embeddings", 400, "input refused"),
                                    status_code=400)
            data = [{"object": "embedding", "index": i, "embedding": fake_vector(t, dim_of(fault))}
                    for i, t in enumerate(body["input"])]
            order = list(range(len(data)))
            random.Random(len(data)).shuffle(order)
            if len(order) > 1 and order == sorted(order):
                order.reverse()
            return JSONResponse({"object": "list", "data": [data[i] for i in order],
                                 "model": body["model"],
                                 "usage": {"prompt_tokens": 5, "total_tokens": 5}})

        return await serve(request, answer)

    @app.post("/api/embed")
    async def ollama_embed(request: Request) -> Response:
        def answer(body: Any, headers: Any, fault: Fault | None) -> Response:
            return JSONResponse({"model": body["model"],
                                 "embeddings": [fake_vector(t, dim_of(fault))
                                                for t in body["input"]]})

        return await serve(request, answer)

    return app


@contextmanager
def serve_in_thread(app: FastAPI, *, what: str = "fake server") -> Iterator[str]:
    """uvicorn on a loopback port, in a thread of its own with its own event loop, so that
    the async code under test reaches it over a real socket; yields its base URL. `what`
    names the server in the failure when it does not start."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not uv.started:
            assert thread.is_alive() and time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(timeout=5)
        sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProviders]:
    """The fake providers, served for the tests of one module."""
    state = FakeProviders()
    with serve_in_thread(build_app(state)) as url:
        state.url = url
        yield state


@pytest.fixture
def fake(server: FakeProviders) -> FakeProviders:
    server.reset()
    return server
