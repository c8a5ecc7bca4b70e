"""Domain errors. Each class's docstring is its default message, so subclasses are one line.

The API maps these to HTTP statuses in one handler; the job wrapper maps them to retry or
dead-letter. Nothing else needs to know about them.
"""

from __future__ import annotations


class MemmillError(Exception):
    """Something went wrong in memmill."""

    status_code = 500

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self)


class BadInput(MemmillError):
    """The request is not valid."""

    status_code = 422


class NotFound(MemmillError):
    """No such resource."""

    status_code = 404


class Conflict(MemmillError):
    """The resource is not in a state that allows this."""

    status_code = 409


class PayloadTooLarge(MemmillError):
    """The content is larger than the configured limit."""

    status_code = 413


class Unauthorized(MemmillError):
    """A valid API key is required (Authorization: Bearer <key>)."""

    status_code = 401


class Forbidden(MemmillError):
    """This key may not do this."""

    status_code = 403


class QuotaExceeded(MemmillError):
    """The tenant is over one of its limits; try again later."""

    status_code = 429

    def __init__(self, limit: str, *, limit_value: int, used: int, adding: int,
                 retry_after_s: int, message: str | None = None) -> None:
        super().__init__(message or f"tenant quota exceeded: {limit} (limit {limit_value}, "
                                    f"used {used}, adding {adding})")
        self.limit = limit
        self.limit_value = limit_value
        self.used = used
        self.adding = adding
        self.retry_after_s = max(1, retry_after_s)

    @property
    def fields(self) -> dict[str, str | int]:
        """What the 429's body says besides `detail`, so a client need not parse the text."""
        return {"limit": self.limit, "limit_value": self.limit_value, "used": self.used,
                "adding": self.adding, "retry_after_s": self.retry_after_s}


class TransientError(MemmillError):
    """A temporary failure; the job is retried with backoff."""


class RetryLater(TransientError):
    """The server asked us to come back later; the job's next attempt waits at least that."""

    def __init__(self, message: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermanentError(MemmillError):
    """A failure that retrying cannot fix; the job goes to dead letters at once."""


class MissingDependency(PermanentError):
    """A package this job needs is not installed; every other kind of job still works."""
