"""Whether this installation can do work now, as opposed to whether the API process lives.

`/healthz` answers while no worker runs, and writes keep being accepted (the ledger keeps
them), so an operator needs a separate answer to "will my documents be processed?"."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from pipeline.db import Q, migration_files


async def migrations(pool: asyncpg.Pool) -> tuple[str, str]:
    """(latest applied, latest known) migration numbers, "none" when none was applied."""
    known = migration_files()[-1].name[:4]
    try:
        applied = await pool.fetchval("SELECT max(version) FROM schema_migrations")
    except asyncpg.UndefinedTableError:
        applied = None
    return applied or "none", known


async def check(
    pool: asyncpg.Pool,
    ping_redis: Callable[[], Awaitable[Any]],
    *,
    queue_name: str,
    alive_window_s: float,
) -> dict[str, Any]:
    """Each readiness condition by name, and `ready` when all hold.

    Each check catches its own failure, so one thing down still lets the others be reported:
    the point is to name everything that is missing at once."""
    report: dict[str, Any] = {}
    try:
        await pool.fetchval("SELECT 1")
        report["database"] = True
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        report["database"] = False
    try:
        report["redis"] = bool(await ping_redis())
    except Exception:  # noqa: BLE001 - any client error means Redis does not answer
        report["redis"] = False
    missing = [name for name in ("database", "redis") if not report[name]]
    if report["database"]:
        applied, known = await migrations(pool)
        report["migrations"] = f"{applied} of {known}"
        if applied != known:
            missing.append("migrations")
        report["workers"] = await pool.fetchval(
            Q["workers.alive_count"], alive_window_s, queue_name)
        if report["workers"] == 0:
            missing.append("workers")
    else:
        missing += ["migrations", "workers"]
    report["ready"] = not missing
    report["missing"] = missing
    return report
