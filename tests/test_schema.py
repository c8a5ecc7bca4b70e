"""The schema and the named queries: migrations apply once, every query prepares."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from pipeline.db import Q, load_queries, migrate, migration_files


async def test_every_named_query_prepares(pool: asyncpg.Pool) -> None:
    assert len(Q) > 20
    async with pool.acquire() as conn:
        for name, sql in Q.items():
            try:
                await conn.prepare(sql)
            except asyncpg.PostgresError as exc:  # pragma: no cover - the message is the point
                pytest.fail(f"query {name} does not prepare: {exc}")


async def test_migrations_are_recorded_and_not_applied_twice(db_url: str) -> None:
    assert await migrate(db_url) == []  # the template already applied them
    conn = await asyncpg.connect(db_url)
    try:
        recorded = [r["name"] for r in await conn.fetch(
            "SELECT name FROM schema_migrations ORDER BY version")]
        vector = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname='vector'")
        columns = await conn.fetch(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'tenant_id'")
    finally:
        await conn.close()
    assert recorded == [p.name for p in migration_files()]
    assert tuple(int(x) for x in vector.split(".")[:2]) >= (0, 8)
    tables = {r["table_name"] for r in columns}
    assert {"api_keys", "items", "item_versions", "sources", "parts", "jobs", "job_attempts",
            "dead_letters", "embedding_cache"} <= tables


def test_query_files_parse_into_named_blocks(tmp_path: Path) -> None:
    (tmp_path / "area.sql").write_text(
        "-- name: one\nSELECT 1;\n\n-- a comment about two\n-- name: two\nSELECT 2\n")
    assert load_queries(tmp_path) == {"area.one": "SELECT 1", "area.two": "SELECT 2"}
    (tmp_path / "area.sql").write_text("-- name: one\nSELECT 1;\n-- name: one\nSELECT 2;\n")
    with pytest.raises(ValueError, match="duplicate"):
        load_queries(tmp_path)
