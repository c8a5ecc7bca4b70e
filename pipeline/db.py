"""Postgres access: the asyncpg pool, the pgvector codec, migrations and named queries.

SQL lives in `sql/`: `migrations/NNNN_name.sql` run once each, in order, and
`queries/<area>.sql` hold named blocks (`-- name: foo`) that code calls as `Q["area.foo"]`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path

import asyncpg
from pgvector.asyncpg import register_vector

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
MIGRATIONS_DIR = SQL_DIR / "migrations"
QUERIES_DIR = SQL_DIR / "queries"

# Any constant works; it only has to be the same in every process that migrates.
MIGRATION_LOCK_ID = 7_314_159_265

_NAME_LINE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(directory: Path = QUERIES_DIR) -> dict[str, str]:
    """Parse every `<area>.sql` into {"area.name": sql}; a duplicate name is a bug, so it raises."""
    queries: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        text = path.read_text()
        names = list(_NAME_LINE.finditer(text))
        for match, following in zip(names, [*names[1:], None], strict=True):
            body = text[match.end() : following.start() if following else len(text)]
            # Comment lines between blocks belong to the next query's documentation, not SQL.
            lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
            key = f"{path.stem}.{match.group(1)}"
            if key in queries:
                raise ValueError(f"duplicate query name {key} in {path}")
            queries[key] = "\n".join(lines).strip().rstrip(";")
    return queries


class _Queries(Mapping[str, str]):
    """Named queries, loaded on first use so importing the module does no I/O."""

    def __init__(self) -> None:
        self._queries: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        if self._queries is None:
            self._queries = load_queries()
        return self._queries

    def __getitem__(self, key: str) -> str:
        return self._all()[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


Q = _Queries()


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    for codec in ("json", "jsonb"):
        await conn.set_type_codec(
            codec, encoder=_json_dumps, decoder=_json_loads, schema="pg_catalog"
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's reset on release (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL): a
    round trip per checkout, a third of a short job's statements. Pooled connections keep no
    session state here (no LISTEN, no session SET, advisory locks only on migrate's own
    connection), so there is nothing to reset; asyncpg still rolls back an open transaction."""


def _json_dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _json_loads(value: str) -> object:
    return json.loads(value)


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    ef_search: int = 100,
    generic_plans: bool = False,
) -> asyncpg.Pool:
    """Open a pool whose connections know the vector type and search HNSW iteratively.

    Iterative index scans (pgvector 0.8) keep filtered vector search correct: without them a
    selective WHERE clause can leave fewer rows than LIMIT asks for.

    `generic_plans` makes every prepared statement of the pool's connections run one plan
    made once: the search pool's (see pipeline/search.py). Planning the search statement
    costs more than most of its execution, and Postgres would never choose its generic plan
    on its own, since a custom plan always looks cheaper. A pool for other statements must
    not set it: some of them need their parameters' values to pick an index.
    """
    settings = {"hnsw.iterative_scan": "relaxed_order", "hnsw.ef_search": str(ef_search),
                "jit": "off"}
    if generic_plans:
        settings["plan_cache_mode"] = "force_generic_plan"
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        reset=_keep_session,
        server_settings=settings,
    )
    assert pool is not None
    return pool


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[Path]:
    files = sorted(directory.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    versions = [f.name[:4] for f in files]
    if len(set(versions)) != len(versions):
        raise ValueError(f"two migrations share a number in {directory}")
    return files


async def migrate(dsn: str, *, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations, each in its own transaction, under an advisory lock.

    The lock makes concurrent starts (API and N workers booting together) safe: the first
    applies, the others wait and then find nothing to do. Returns the names applied.
    """
    conn = await asyncpg.connect(dsn)
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version text PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for path in migration_files(directory):
            version = path.name[:4]
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    version,
                    path.name,
                )
            log.info("applied migration %s", path.name)
            applied.append(path.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
        await conn.close()
    return applied
