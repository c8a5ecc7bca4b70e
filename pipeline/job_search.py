"""Search over the ledger by qualifiers, as an operator types them into the jobs page:
`kind:embed status:dead error:"timed out" item:doc-7 tenant:acme arg:report.pdf
after:2026-11-25T08:00 before:2026-11-25`. Words without a qualifier search the error text.

The SQL holds only the conditions asked for, each a bound parameter, so Postgres plans every
combination on the index that fits it: with `$n IS NULL OR …` for every filter, one generic
plan served them all and scanned a million rows for the rarest of them."""

from __future__ import annotations

import shlex
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from pipeline import jobs
from pipeline.aggregates import STATES
from pipeline.db import Q
from pipeline.errors import BadInput

PAGE_SIZE = 50
COUNT_CAP = 10_000
MAX_TERM_CHARS = 200
QUALIFIERS = ("kind", "status", "item", "tenant", "error", "arg", "after", "before", "id")


@dataclass(frozen=True)
class JobQuery:
    kinds: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    item_id: str | None = None
    tenant: str | None = None
    errors: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    after: datetime | None = None
    before: datetime | None = None
    job_id: uuid.UUID | None = None
    text: str = ""

    @property
    def empty(self) -> bool:
        return self == JobQuery(text=self.text)


def _time(name: str, value: str) -> datetime:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"{name}: wants a date or time such as 2026-11-25 or "
                       f"2026-11-25T08:00, not {value!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise BadInput(f"{name}:{value} is not known; {name}: is one of {', '.join(allowed)}")
    return value


def parse(text: str) -> JobQuery:
    """A query from what the operator typed; a clear BadInput for what cannot be read."""
    try:
        terms = shlex.split(text)
    except ValueError:
        raise BadInput("the search has an unmatched quote") from None
    found: dict[str, Any] = {"kinds": [], "states": [], "errors": [], "args": []}
    for term in terms:
        if len(term) > MAX_TERM_CHARS:
            raise BadInput(f"a search term is limited to {MAX_TERM_CHARS} characters")
        if "\x00" in term:
            raise BadInput("a search term cannot contain NUL")
        name, sep, value = term.partition(":")
        if not sep or name not in QUALIFIERS:
            found["errors"].append(term)
            continue
        if not value:
            raise BadInput(f"{name}: needs a value, as in {name}:something")
        if name == "kind":
            found["kinds"].append(_one_of("kind", value, jobs.KINDS))
        elif name == "status":
            found["states"].append(_one_of("status", value, STATES))
        elif name == "item":
            found["item_id"] = value
        elif name == "tenant":
            found["tenant"] = value
        elif name == "error":
            found["errors"].append(value)
        elif name == "arg":
            found["args"].append(value)
        elif name in ("after", "before"):
            found[name] = _time(name, value)
        elif name == "id":
            try:
                found["job_id"] = uuid.UUID(value)
            except ValueError:
                raise BadInput(f"id:{value} is not a job id (a UUID)") from None
    return JobQuery(
        kinds=tuple(dict.fromkeys(found.pop("kinds"))),
        states=tuple(dict.fromkeys(found.pop("states"))),
        errors=tuple(found.pop("errors")), args=tuple(found.pop("args")), text=text.strip(),
        **found,
    )


@dataclass
class SqlConditions:
    conditions: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)

    def add(self, template: str, *values: Any) -> None:
        """`template` names its parameters {0}, {1}…; they become $n in order."""
        numbers = []
        for value in values:
            self.params.append(value)
            numbers.append(f"${len(self.params)}")
        self.conditions.append(template.format(*numbers))

    @property
    def where(self) -> str:
        return " AND ".join(self.conditions) or "true"


def like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _state_condition(states: tuple[str, ...]) -> str:
    parts = []
    for state in states:
        if state == "retrying":
            parts.append("(j.status = 'queued' AND j.last_error IS NOT NULL)")
        elif state == "queued":
            parts.append("(j.status = 'queued' AND j.last_error IS NULL)")
        else:
            parts.append(f"j.status = '{state}'")  # from STATES only: parse() checked it
    return "(" + " OR ".join(parts) + ")"


def _conditions(query: JobQuery, tenant_id: int | None) -> SqlConditions:
    sql = SqlConditions()
    if tenant_id is not None:
        sql.add("j.tenant_id = {0}", tenant_id)
    if query.kinds:
        sql.add("j.kind = ANY({0}::text[])", list(query.kinds))
    if query.states:
        sql.conditions.append(_state_condition(query.states))
    if query.item_id is not None:
        sql.add("j.item_id = {0}", query.item_id)
    for error in query.errors:
        sql.add("j.last_error ILIKE {0}", like_pattern(error))
    for arg in query.args:
        sql.add("j.payload::text ILIKE {0}", like_pattern(arg))
    if query.after is not None:
        sql.add("j.created_at >= {0}", query.after)
    if query.before is not None:
        sql.add("j.created_at < {0}", query.before)
    if query.job_id is not None:
        sql.add("j.id = {0}", query.job_id)
    return sql


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: the last row's creation time and id (newest first)."""

    created_at: datetime
    job_id: uuid.UUID

    def encode(self) -> str:
        return f"{self.created_at.isoformat()}|{self.job_id}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        stamp, _, job_id = text.partition("|")
        try:
            return cls(datetime.fromisoformat(stamp), uuid.UUID(job_id))
        except ValueError:
            raise BadInput("the page cursor is not one this server gave out") from None


@dataclass
class Page:
    rows: list[asyncpg.Record]
    total: int
    total_capped: bool
    next_cursor: Cursor | None


async def resolve_tenant(pool: asyncpg.Pool, query: JobQuery, tenant_id: int | None) -> int | None:
    """The tenant a search is confined to: the key's own, or for an operator the one
    `tenant:` names (by name or id). An unknown tenant is a 4xx, not an empty page."""
    if tenant_id is not None or query.tenant is None:
        return tenant_id
    found = await pool.fetchval(Q["dashboard.tenant_by_name"], query.tenant)
    by_id = query.tenant.isdigit() and len(query.tenant) < 19
    if found is None and by_id and await pool.fetchval(Q["dashboard.tenant_name"],
                                                       int(query.tenant)) is not None:
        found = int(query.tenant)
    if found is None:
        raise BadInput(f"tenant:{query.tenant} names no tenant")
    return found


async def search(
    pool: asyncpg.Pool, query: JobQuery, *, tenant_id: int | None,
    cursor: Cursor | None = None, limit: int = PAGE_SIZE,
) -> Page:
    """One page of matching jobs, newest first, and how many match (counted up to 10,000).
    `tenant_id` None searches every tenant: an operator's view."""
    tenant_id = await resolve_tenant(pool, query, tenant_id)
    sql = _conditions(query, tenant_id)
    count_sql = (f"SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE {sql.where} "
                 f"LIMIT {COUNT_CAP + 1}) c")
    total = await pool.fetchval(count_sql, *sql.params)
    if cursor is not None:
        sql.add("(j.created_at, j.id) < ({0}, {1})", cursor.created_at, cursor.job_id)
    sql.params.append(limit + 1)
    rows = await pool.fetch(
        "SELECT j.id, j.tenant_id, t.name AS tenant_name, j.kind, j.item_id, j.version, "
        "j.status, job_state(j.status, j.last_error) AS state, j.attempts, j.max_attempts, "
        "j.last_error, j.run_after, j.created_at, j.updated_at, j.finished_at "
        f"FROM jobs j JOIN tenants t ON t.id = j.tenant_id WHERE {sql.where} "
        f"ORDER BY j.created_at DESC, j.id DESC LIMIT ${len(sql.params)}",
        *sql.params,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = Cursor(rows[-1]["created_at"], rows[-1]["id"]) if more else None
    return Page(rows, min(total, COUNT_CAP), total > COUNT_CAP, next_cursor)
