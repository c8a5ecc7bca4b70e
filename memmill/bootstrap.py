"""First-start set-up shared by `memmill up` and `memmill migrate`: schema and default key."""

from __future__ import annotations

import asyncio

import asyncpg

from memmill.private import write_private
from memmill.runtime import key_file, read_local_key
from pipeline import tenants
from pipeline.db import migrate
from pipeline.settings import Settings


async def register_bootstrap_key(dsn: str, settings: Settings, key: str) -> None:
    """Make sure the default tenant exists and accepts `key` as its operator's key
    (idempotent)."""
    conn = await asyncpg.connect(dsn)
    try:
        tenant_id = await tenants.ensure_tenant(conn, settings.default_tenant)
        await tenants.add_key(conn, tenant_id, key, name="bootstrap", role="operator")
    finally:
        await conn.close()


async def _bootstrap(dsn: str, settings: Settings) -> str:
    await migrate(dsn)
    key = settings.bootstrap_api_key or read_local_key(settings) or tenants.new_key()
    await register_bootstrap_key(dsn, settings, key)
    path = key_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, key + "\n")
    return key


def bootstrap(dsn: str, settings: Settings) -> str:
    """Apply migrations and make sure the default tenant has a key; returns that key.

    The key is kept in data_dir/api_key (mode 600) so a restart prints the same key and the
    CLI finds it without being told."""
    return asyncio.run(_bootstrap(dsn, settings))
