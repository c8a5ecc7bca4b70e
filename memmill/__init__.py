"""memmill's command line, the embedded runtime that starts everything locally, and the Python
client of its API (`from memmill import Memmill, AsyncMemmill`).

The client is imported on first use, so that the command line (`memmill doctor` above all)
starts, and reports what is missing, without the packages the client needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memmill.client import AsyncMemmill, Memmill, MemmillError

__all__ = ["AsyncMemmill", "Memmill", "MemmillError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from memmill import client

        return getattr(client, name)
    raise AttributeError(f"module 'memmill' has no attribute {name!r}")
