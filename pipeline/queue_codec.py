"""What travels through the job queue, as JSON, so nothing read from Redis can run code.

arq pickles its job and result dicts by default, and unpickling runs whatever the payload names:
anyone who could write to Redis could run code as the worker's user. Every arq pool and worker
memmill creates passes `ARQ_CODEC` (`tests/test_queue_security.py` checks the source for it).

What arq passes through it: job dicts (`f` function name, `a` args, `k` kwargs, `t` try,
`et` enqueue time in ms) and result dicts (the same plus `s` success, `r` result, `st`/`ft`
times, `q` queue, `id`). Our job arguments are ids and our results strings, so JSON carries
them. The one other thing arq hands over is the exception of a failed, timed-out or unreadable
job as a result: it is written as its type name and message, and read back as a
`QueuedJobError`, never as the original type (naming a type to construct is how pickle runs code).
Anything else JSON cannot carry is refused, with no fallback: a payload that is not JSON (a
pickle) fails to decode, arq drops that job as failed, and the worker goes on.

This module never imports arq: `ARQ_CODEC` is the two keyword arguments that arq's
`create_pool`, `ArqRedis` and `Worker` all take.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypedDict

EXCEPTION_KEY = "__exception__"


class QueueCodecError(ValueError):
    """A value JSON cannot carry, or a payload that is not JSON."""


class QueuedJobError(Exception):
    """The exception a job ended with, as read back from the queue: its type's name and its
    message, and nothing that could name a type to construct."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind
        self.message = message


def serialize(obj: Any) -> bytes:
    """JSON bytes for a job or result dict; exceptions as {"__exception__": name, "message"}."""
    try:
        return json.dumps(obj, default=_encode, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise QueueCodecError(f"cannot put this on the queue: {exc}") from exc


def deserialize(data: bytes) -> Any:
    """The value `serialize` wrote; anything that is not strict JSON raises QueueCodecError."""
    try:
        return json.loads(data, object_hook=_decode_object, parse_constant=_refuse_constant)
    except (TypeError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise QueueCodecError(f"not a JSON queue payload: {exc}") from exc


def _encode(value: Any) -> Any:
    if isinstance(value, BaseException):
        if isinstance(value, QueuedJobError):
            return {EXCEPTION_KEY: value.kind, "message": value.message}
        return {EXCEPTION_KEY: type(value).__name__, "message": str(value)}
    raise TypeError(f"{type(value).__name__} is not JSON")


def _decode_object(obj: dict[str, Any]) -> Any:
    if set(obj) == {EXCEPTION_KEY, "message"}:
        kind, message = obj[EXCEPTION_KEY], obj["message"]
        if isinstance(kind, str) and isinstance(message, str):
            return QueuedJobError(kind, message)
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class ArqCodec(TypedDict):
    job_serializer: Callable[[dict[str, Any]], bytes]
    job_deserializer: Callable[[bytes], Any]


ARQ_CODEC: ArqCodec = {"job_serializer": serialize, "job_deserializer": deserialize}

__all__ = ["ARQ_CODEC", "QueueCodecError", "QueuedJobError", "deserialize", "serialize"]
