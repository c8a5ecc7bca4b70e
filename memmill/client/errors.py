"""The client's exceptions: one per answer a caller handles differently, each carrying the
server's own message. A root exception's docstring is its default message."""

from __future__ import annotations

from typing import Any


class MemmillError(Exception):
    """The memmill API refused the request."""

    status: int = 0

    def __init__(self, detail: str | None = None, *, status: int | None = None,
                 body: Any = None) -> None:
        self.detail = detail or (self.__doc__ or "").strip()
        if status is not None:
            self.status = status
        self.body = body
        super().__init__(f"HTTP {self.status}: {self.detail}" if self.status else self.detail)


class ConnectionFailed(MemmillError):
    """The memmill API could not be reached."""


class AuthenticationFailed(MemmillError):
    """The API key is missing, wrong, revoked or past its rotation's grace."""

    status = 401


class PermissionDenied(MemmillError):
    """The key's role or binding does not allow this request."""

    status = 403


class NotFound(MemmillError):
    """No such thing in this key's tenant and scope."""

    status = 404


class Conflict(MemmillError):
    """The request conflicts with the current state (a stale version, a job already done)."""

    status = 409


class PayloadTooLarge(MemmillError):
    """The request is larger than the server takes."""

    status = 413


class InvalidRequest(MemmillError):
    """The request is not valid; `errors` lists each problem with its place."""

    status = 422

    @property
    def errors(self) -> list[dict[str, Any]]:
        found = self.body.get("errors") if isinstance(self.body, dict) else None
        return found if isinstance(found, list) else []


class RateLimited(MemmillError):
    """A rate limit or quota of the tenant refused the request; it wrote nothing."""

    status = 429

    @property
    def retry_after_s(self) -> float | None:
        value = self.body.get("retry_after_s") if isinstance(self.body, dict) else None
        return float(value) if isinstance(value, int | float) else None

    @property
    def limit(self) -> str | None:
        """Which limit (`requests_per_minute`, `items`, `memories`, `bytes`, `jobs`)."""
        value = self.body.get("limit") if isinstance(self.body, dict) else None
        return value if isinstance(value, str) else None


class Unavailable(MemmillError):
    """The server cannot serve the request now (its database or queue is down)."""

    status = 503


class ServerError(MemmillError):
    """The server failed."""

    status = 500


class WaitTimedOut(MemmillError):
    """The work did not finish within the time the caller waited for it."""


class OperationFailed(MemmillError):
    """Work the caller waited for failed or was cancelled; `body` is its state."""


BY_STATUS: dict[int, type[MemmillError]] = {
    e.status: e for e in (AuthenticationFailed, PermissionDenied, NotFound, Conflict,
                          PayloadTooLarge, InvalidRequest, RateLimited, Unavailable)
}


def for_status(status: int) -> type[MemmillError]:
    if status in BY_STATUS:
        return BY_STATUS[status]
    return ServerError if status >= 500 else MemmillError
