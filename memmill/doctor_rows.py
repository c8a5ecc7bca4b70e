"""The rows of `memmill doctor`'s table, shared by its checks: what a row says, its statuses,
and URLs fit to print."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

OK, WARN, FAIL, OFF, SKIP = "ok", "warn", "fail", "not running", "skipped"
SERVER, MODEL, FORMATS, SERVICES, STORAGE = (
    "server packages", "embedding", "file formats (optional)", "services", "storage")


@dataclass(frozen=True)
class Target:
    """A server to check, and where its URL came from: the fix depends on it."""

    url: str | None
    source: str  # where the URL came from, or why there is none
    variable: str  # the setting that names it


@dataclass
class Row:
    """One line of the table (or one object of --json)."""

    section: str
    check: str
    purpose: str
    required: bool
    status: str
    detail: str
    fix: str = ""

    @property
    def fails(self) -> bool:
        """Only a required row can fail the command; an optional one is a finding."""
        return self.required and self.status == FAIL


def redact(url: str) -> str:
    """A URL fit to print: the password replaced (the embedded servers' URLs carry theirs)."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
