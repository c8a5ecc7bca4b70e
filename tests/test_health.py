"""`/healthz` says the API process lives; `/readyz` says whether work will get done, and names
what is missing when it will not."""

from __future__ import annotations

import asyncpg
import httpx

from pipeline.db import Q, migration_files
from pipeline.settings import Settings

LATEST = migration_files()[-1].name[:4]


async def test_readyz_names_missing_workers_while_healthz_is_ok(
    api_url: str, pool: asyncpg.Pool, settings: Settings
) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        assert (await http.get("/healthz")).status_code == 200
        answer = await http.get("/readyz")
        assert answer.status_code == 503
        body = answer.json()
        assert body["ready"] is False and body["missing"] == ["workers"]
        assert body["workers"] == 0 and body["database"] and body["redis"]
        assert body["migrations"] == f"{LATEST} of {LATEST}"

        # A heartbeat of a worker of this queue, as a worker writes it, makes it ready.
        await pool.execute(Q["workers.heartbeat"], "w-1", "host", 1, settings.queue_name)
        answer = await http.get("/readyz")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"database": True, "redis": True,
                                 "migrations": f"{LATEST} of {LATEST}", "workers": 1,
                                 "ready": True, "missing": []}

        # A worker of another queue, or one that stopped, does not count.
        await pool.execute(Q["workers.stopped"], "w-1")
        await pool.execute(Q["workers.heartbeat"], "w-2", "host", 2, "another-queue")
        assert (await http.get("/readyz")).json()["workers"] == 0


async def test_readyz_says_which_migration_the_database_is_at(
    api_url: str, pool: asyncpg.Pool, settings: Settings
) -> None:
    await pool.execute(Q["workers.heartbeat"], "w-1", "host", 1, settings.queue_name)
    await pool.execute("DELETE FROM schema_migrations WHERE version = $1", LATEST)
    previous = migration_files()[-2].name[:4]
    async with httpx.AsyncClient(base_url=api_url) as http:
        answer = await http.get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["migrations"] == f"{previous} of {LATEST}"
    assert answer.json()["missing"] == ["migrations"]
