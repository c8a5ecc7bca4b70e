"""The Python client of the memmill API: `Memmill` (blocking) and `AsyncMemmill` (awaited).

    from memmill import Memmill

    with Memmill("http://127.0.0.1:8700", key) as mm:
        mm.items.put("notes/bread", "Sourdough rises thanks to wild yeast.", wait=True)
        for hit in mm.search("what makes bread rise").results:
            print(hit.scores.final, hit.item.id, hit.snippet)
"""

from memmill.client.clients import AsyncMemmill, Memmill
from memmill.client.errors import (
    AuthenticationFailed,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    MemmillError,
    NotFound,
    OperationFailed,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServerError,
    Unavailable,
    WaitTimedOut,
)
from memmill.client.transport import RetryPolicy

__all__ = [
    "AsyncMemmill",
    "AuthenticationFailed",
    "Conflict",
    "ConnectionFailed",
    "InvalidRequest",
    "Memmill",
    "MemmillError",
    "NotFound",
    "OperationFailed",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "RetryPolicy",
    "ServerError",
    "Unavailable",
    "WaitTimedOut",
]
