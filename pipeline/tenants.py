"""Tenants and their API keys. Only a SHA-256 of a key is stored; the key is shown once."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import asyncpg

from pipeline.db import Q
from pipeline.errors import BadInput, Unauthorized
from pipeline.key_cache import KeyCache

KEY_PREFIX = "mm_"
MIN_KEY_CHARS = 16


Role = Literal["operator", "admin", "write", "read"]
# From least to most: each role may do what the roles before it may.
ROLES: tuple[Role, ...] = ("read", "write", "admin", "operator")


def role_rank(role: str) -> int:
    return ROLES.index(role)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: the key's tenant, the key itself (for audit), its role (what it
    may do, api/roles.py) and its binding: a key bound to a user and/or an agent acts as them
    whatever a request names (api/binding.py)."""

    tenant_id: int
    key_id: int
    role: Role = "admin"
    key_name: str = "default"
    user_id: str | None = None
    agent_id: str | None = None
    expires_at: datetime | None = None

    @property
    def operator(self) -> bool:
        """Sees and acts across tenants (workers, the whole queue, tenants themselves)."""
        return self.role == "operator"

    @property
    def read_only(self) -> bool:
        """Reads what its role may read and changes nothing."""
        return self.role == "read"

    def may(self, role: str) -> bool:
        """Whether this key's role is `role` or above it."""
        return role_rank(self.role) >= role_rank(role)

    @property
    def bound(self) -> bool:
        return self.user_id is not None or self.agent_id is not None


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
    role: Role = "admin",
    user_id: str | None = None,
    agent_id: str | None = None,
    expires_at: datetime | None = None,
    created_by: int | None = None,
) -> int | None:
    """Register a key for a tenant; returns its id, or None when that exact key exists."""
    if len(key) < MIN_KEY_CHARS or not key.isprintable() or " " in key:
        raise BadInput(f"an API key needs at least {MIN_KEY_CHARS} printable characters, no spaces")
    if role not in ROLES:
        raise BadInput(f"role: must be one of {', '.join(ROLES)}")
    return await conn.fetchval(
        Q["tenants.insert_api_key"], tenant_id, key[:11], hash_key(key), name, role,
        user_id, agent_id, expires_at, created_by,
    )


def principal_of(row: asyncpg.Record) -> Principal:
    return Principal(row["tenant_id"], row["id"], row["role"], row["name"], row["user_id"],
                     row["agent_id"], row["expires_at"])


def expired(principal: Principal) -> bool:
    return principal.expires_at is not None and principal.expires_at <= datetime.now(UTC)


async def authenticate(
    pool: asyncpg.Pool, key: str | None, cache: KeyCache[Principal] | None = None
) -> Principal:
    """Who a key acts as, from `cache` when it holds the key. Every failure is the same 401,
    so keys cannot be probed; a refused key is never cached."""
    if not key:
        raise Unauthorized()
    key_hash = hash_key(key)
    if cache is not None and (principal := cache.get(key_hash)) is not None:
        if expired(principal):  # a rotated key's grace ends on time, cached or not
            raise Unauthorized("invalid or revoked API key")
        return principal
    generation = cache.generation if cache is not None else 0
    row = await pool.fetchrow(Q["tenants.authenticate"], key_hash)
    if row is None:
        raise Unauthorized("invalid or revoked API key")
    principal = principal_of(row)
    if cache is not None:
        cache.put(key_hash, principal, generation)
    return principal
