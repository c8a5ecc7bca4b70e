"""Search over dead letters with the jobs page's qualifiers (`kind:`, `item:`, `tenant:`,
`error:` in the reason, `after:`, `before:`) and `replayed:yes|no`; and the rows a bulk
replay would touch, which the page counts and keeps before anything is replayed."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import asyncpg

from pipeline import job_search
from pipeline.errors import BadInput
from pipeline.job_search import JobQuery, SqlConditions, like_pattern

PAGE_SIZE = 50
MAX_REPLAY = 10_000


@dataclass(frozen=True)
class DeadLetterQuery:
    jobs: JobQuery
    replayed: bool | None = None


def parse(text: str) -> DeadLetterQuery:
    replayed: bool | None = None
    rest = []
    try:
        terms = shlex.split(text)
    except ValueError:
        raise BadInput("the search has an unmatched quote") from None
    for term in terms:
        name, sep, value = term.partition(":")
        if sep and name == "replayed":
            if value not in ("yes", "no"):
                raise BadInput(f"replayed:{value} is not known; replayed: is yes or no")
            replayed = value == "yes"
        else:
            rest.append(term)
    query = job_search.parse(shlex.join(rest))
    for name, used in (("status", query.states), ("arg", query.args), ("id", query.job_id)):
        if used:
            raise BadInput(f"{name}: does not apply to dead letters; use kind:, item:, "
                           "tenant:, error:, after:, before: or replayed:")
    return DeadLetterQuery(query, replayed)


def _conditions(query: DeadLetterQuery, tenant_id: int | None) -> SqlConditions:
    sql = SqlConditions()
    jq = query.jobs
    if tenant_id is not None:
        sql.add("d.tenant_id = {0}", tenant_id)
    if jq.kinds:
        sql.add("d.kind = ANY({0}::text[])", list(jq.kinds))
    if jq.item_id is not None:
        sql.add("d.item_id = {0}", jq.item_id)
    for error in jq.errors:
        sql.add("d.reason ILIKE {0}", like_pattern(error))
    if jq.after is not None:
        sql.add("d.created_at >= {0}", jq.after)
    if jq.before is not None:
        sql.add("d.created_at < {0}", jq.before)
    if query.replayed is not None:
        sql.conditions.append("d.replayed_at IS NOT NULL" if query.replayed
                              else "d.replayed_at IS NULL")
    return sql


@dataclass
class Page:
    rows: list[asyncpg.Record]
    total: int
    total_capped: bool
    waiting: int          # of the matches, how many a replay would take now
    next_cursor: int | None


async def search(pool: asyncpg.Pool, query: DeadLetterQuery, *, tenant_id: int | None,
                 cursor: int | None = None, limit: int = PAGE_SIZE) -> Page:
    tenant_id = await job_search.resolve_tenant(pool, query.jobs, tenant_id)
    sql = _conditions(query, tenant_id)
    cap = job_search.COUNT_CAP
    counted = await pool.fetchrow(
        f"SELECT count(*) AS total, count(*) FILTER (WHERE waiting) AS waiting FROM ("
        f" SELECT d.replayed_at IS NULL AND j.status = 'dead' AS waiting"
        f" FROM dead_letters d JOIN jobs j ON j.id = d.job_id WHERE {sql.where}"
        f" LIMIT {cap + 1}) c", *sql.params)
    if cursor is not None:
        sql.add("d.id < {0}", cursor)
    sql.params.append(limit + 1)
    rows = await pool.fetch(
        "SELECT d.*, t.name AS tenant_name FROM dead_letters d "
        f"JOIN tenants t ON t.id = d.tenant_id WHERE {sql.where} "
        f"ORDER BY d.id DESC LIMIT ${len(sql.params)}", *sql.params)
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, min(counted["total"], cap), counted["total"] > cap, counted["waiting"],
                rows[-1]["id"] if more else None)


async def replayable(pool: asyncpg.Pool, query: DeadLetterQuery, *,
                     tenant_id: int | None) -> tuple[list[asyncpg.Record], bool]:
    """The matches a replay would take now, oldest first, at most MAX_REPLAY; and whether
    more matched than that."""
    tenant_id = await job_search.resolve_tenant(pool, query.jobs, tenant_id)
    sql = _conditions(query, tenant_id)
    sql.params.append(MAX_REPLAY + 1)
    rows = await pool.fetch(
        "SELECT d.id, d.kind FROM dead_letters d JOIN jobs j ON j.id = d.job_id "
        f"WHERE {sql.where} AND d.replayed_at IS NULL AND j.status = 'dead' "
        f"ORDER BY d.id LIMIT ${len(sql.params)}", *sql.params)
    return rows[:MAX_REPLAY], len(rows) > MAX_REPLAY
