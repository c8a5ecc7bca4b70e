"""Tenants and their API keys. Only a SHA-256 of a key is stored; the key is shown once."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import asyncpg

from pipeline.db import Q
from pipeline.errors import BadInput, Unauthorized
from pipeline.key_cache import KeyCache

KEY_PREFIX = "mm_"
MIN_KEY_CHARS = 16


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: the key's tenant, the key itself (for audit), whether the key
    is an operator's, which sees across tenants (workers, the whole queue), and whether it
    is read-only: it reads what its role may read and changes nothing."""

    tenant_id: int
    key_id: int
    operator: bool = False
    read_only: bool = False
    key_name: str = "default"


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


async def ensure_tenant(conn: asyncpg.Connection | asyncpg.Pool, name: str) -> int:
    return await conn.fetchval(Q["tenants.upsert_tenant"], name)


async def add_key(
    conn: asyncpg.Connection | asyncpg.Pool,
    tenant_id: int,
    key: str,
    *,
    name: str = "default",
    operator: bool = False,
    read_only: bool = False,
) -> bool:
    """Register a key for a tenant; returns False when that exact key already exists."""
    if len(key) < MIN_KEY_CHARS or not key.isprintable() or " " in key:
        raise BadInput(f"an API key needs at least {MIN_KEY_CHARS} printable characters, no spaces")
    row_id = await conn.fetchval(
        Q["tenants.insert_api_key"], tenant_id, key[:11], hash_key(key), name, operator,
        read_only,
    )
    return row_id is not None


def principal_of(row: asyncpg.Record) -> Principal:
    return Principal(row["tenant_id"], row["id"], row["operator"], row["read_only"],
                     row["name"])


async def authenticate(
    pool: asyncpg.Pool, key: str | None, cache: KeyCache[Principal] | None = None
) -> Principal:
    """Who a key acts as, from `cache` when it holds the key. Every failure is the same 401,
    so keys cannot be probed; a refused key is never cached."""
    if not key:
        raise Unauthorized()
    key_hash = hash_key(key)
    if cache is not None and (principal := cache.get(key_hash)) is not None:
        return principal
    generation = cache.generation if cache is not None else 0
    row = await pool.fetchrow(Q["tenants.authenticate"], key_hash)
    if row is None:
        raise Unauthorized("invalid or revoked API key")
    principal = principal_of(row)
    if cache is not None:
        cache.put(key_hash, principal, generation)
    return principal
