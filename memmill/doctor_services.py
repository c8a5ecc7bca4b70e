"""`memmill doctor`'s checks of the servers: Postgres with pgvector, the migrations and the
index's dimension, and Redis. Each connects with a short timeout and turns a failure into the
reason and the fix, never a traceback."""

from __future__ import annotations

from typing import Any

from memmill.doctor_rows import FAIL, OFF, OK, SERVICES, SKIP, WARN, Row, Target, redact
from memmill.runtime import read_runtime
from pipeline.settings import Settings, model_key

CONNECT_TIMEOUT_S = 5.0
MIN_POSTGRES, MIN_PGVECTOR = 13, (0, 8, 0)


def targets(settings: Settings) -> tuple[Target, Target]:
    """The Postgres and Redis the servers would use, and where each URL came from."""
    runtime = read_runtime(settings) or {}
    running = f"the memmill up running on {settings.data_dir} (pid {runtime.get('pid')})"

    def target(url: str | None, variable: str, runtime_key: str) -> Target:
        if url:
            return Target(url, variable, variable)
        if runtime.get(runtime_key):
            return Target(runtime[runtime_key], running, variable)
        return Target(None, f"no {variable}, and no memmill up runs on {settings.data_dir}",
                      variable)

    return (target(settings.database_url, "MEMMILL_DATABASE_URL", "database_url"),
            target(settings.redis_url, "MEMMILL_REDIS_URL", "redis_url"))


async def service_rows(settings: Settings, database: Target, queue: Target,
                       model_dim: int | None) -> list[Row]:
    return [*await postgres_rows(database, settings, model_dim), await redis_row(queue)]


def _queries() -> dict[str, str]:
    """The named queries, loaded on first use: `pipeline.db` needs asyncpg, and a doctor
    without asyncpg must still print its table."""
    from pipeline.db import Q

    return Q


def _cannot_check(check: str, purpose: str, err: ImportError) -> Row:
    return Row(SERVICES, check, purpose, True, FAIL,
               f"cannot check: {type(err).__name__}: {err}",
               "install the missing package (see server packages above): ./dev setup")


def _off(check: str, purpose: str, target: Target, starts: str) -> Row:
    """Nothing configured and nothing running: the embedded default, started by memmill up.
    Not a failure (memmill is simply not running); its packages' rows are required instead."""
    return Row(SERVICES, check, purpose, False, OFF, target.source,
               f"start memmill up (it starts {starts}), or set {target.variable}")


def _reason(err: BaseException) -> str:
    """Plain words for the usual causes, which the clients word as "Connect call failed"."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused: nothing listens there"
        if isinstance(seen, TimeoutError):
            return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
        seen = seen.__cause__ or seen.__context__
    return " ".join(str(err).split()) or type(err).__name__


def _unreachable(check: str, purpose: str, target: Target, err: BaseException) -> Row:
    reason = _reason(err)
    if target.source == target.variable:
        fix = (f"start it, or set {target.variable} to one that runs (unset, memmill up "
               "starts an embedded one)")
    else:
        fix = "that memmill up does not answer: stop it (Ctrl-C) and start it again"
    return Row(SERVICES, check, purpose, True, FAIL,
               f"cannot connect to {redact(target.url or '')} ({target.source}): {reason}", fix)


async def postgres_rows(target: Target, settings: Settings, model_dim: int | None) -> list[Row]:
    purpose = "items, parts, vectors and the job ledger"
    if target.url is None:
        return [_off("Postgres", purpose, target, "the embedded Postgres")]
    try:
        import asyncpg
    except ImportError as err:
        return [_cannot_check("Postgres", purpose, err)]

    try:
        conn = await asyncpg.connect(target.url, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError,
            asyncpg.InterfaceError) as err:
        return [_unreachable("Postgres", purpose, target, err)]
    try:
        version = conn.get_server_version()
        rows = [Row(SERVICES, "Postgres", purpose, True,
                    OK if version.major >= MIN_POSTGRES else FAIL,
                    f"PostgreSQL {version.major}.{version.minor} at {redact(target.url)} "
                    f"({target.source})",
                    "" if version.major >= MIN_POSTGRES else
                    f"pgvector 0.8 needs PostgreSQL {MIN_POSTGRES} or later: upgrade it")]
        rows.append(pgvector_row(await conn.fetchrow(_queries()["doctor.pgvector"])))
        rows.append(await migrations_row(conn))
        if rows[-1].status == OK:
            rows.append(await index_row(conn, settings, model_dim))
        else:  # no table to read the index from
            rows.append(Row(SERVICES, "index dimension", "vectors of the configured model's size",
                            True, SKIP, "read once the migrations are applied"))
        return rows
    finally:
        await conn.close()


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def pgvector_row(found: Any) -> Row:
    purpose = "vector and BM25 search (iterative HNSW scans need 0.8)"
    installed, available = found["installed"], found["available"]
    wanted = ".".join(map(str, MIN_PGVECTOR))
    if installed is not None:
        ok = _version_tuple(installed) >= MIN_PGVECTOR
        return Row(SERVICES, "pgvector extension", purpose, True, OK if ok else FAIL,
                   f"{installed} in this database",
                   "" if ok else f"ALTER EXTENSION vector UPDATE, after installing {wanted}+")
    if available is not None and _version_tuple(available) >= MIN_PGVECTOR:
        return Row(SERVICES, "pgvector extension", purpose, True, OK,
                   f"{available} available; memmill migrate creates the extension")
    return Row(SERVICES, "pgvector extension", purpose, True, FAIL,
               f"this server has pgvector {available}" if available else
               "this server does not have pgvector",
               f"install pgvector {wanted}+ on it (e.g. the pgvector/pgvector:pg18 image)")


async def migrations_row(conn: Any) -> Row:
    from pipeline.readiness import migrations

    applied, known = await migrations(conn)
    purpose = "the schema this memmill expects"
    if applied == known:
        return Row(SERVICES, "migrations", purpose, True, OK, f"{applied} of {known} applied")
    if applied != "none" and applied > known:
        return Row(SERVICES, "migrations", purpose, True, FAIL,
                   f"the database has {applied}, this memmill knows up to {known}",
                   "update memmill: a newer one migrated this database")
    return Row(SERVICES, "migrations", purpose, True, FAIL, f"{applied} of {known} applied",
               "run memmill migrate (memmill up applies them when it starts)")


async def index_row(conn: Any, settings: Settings, model_dim: int | None) -> Row:
    """The index's vector size is fixed by the schema; a worker refuses to start when the
    settings disagree, and a model of another size could not write its vectors at all."""
    dimension = await conn.fetchval(_queries()["reindex.dimension"])
    state = await conn.fetchrow(_queries()["reindex.state"])
    purpose = "vectors of the configured model's size"
    if dimension != settings.embedding_dim or model_dim not in (None, dimension):
        model = f"the model gives {model_dim}, " if model_dim not in (None, dimension) else ""
        return Row(SERVICES, "index dimension", purpose, True, FAIL,
                   f"the index stores {dimension} dimensions; {model}MEMMILL_EMBEDDING_DIM is "
                   f"{settings.embedding_dim}",
                   f"use a model of {dimension} dimensions (MEMMILL_EMBEDDING_MODEL, "
                   f"MEMMILL_EMBEDDING_DIM={dimension})")
    key, model, building = model_key(settings), state["model"], state["next_model"]
    if model is None or (model == key and building is None):
        made = "no vectors yet" if model is None else f"vectors by {model}"
        return Row(SERVICES, "index dimension", purpose, True, OK,
                   f"{dimension}, as the model and MEMMILL_EMBEDDING_DIM; {made}")
    if building == key:
        return Row(SERVICES, "index dimension", purpose, True, OK,
                   f"{dimension}; reindexing from {model} to {key} in the background")
    return Row(SERVICES, "index dimension", purpose, True, WARN,
               f"{dimension}; the index holds {model} vectors, this configuration is {key}",
               "a worker with this configuration re-embeds everything in the background "
               "when it starts; unset the embedding settings to keep the old model")


async def redis_row(target: Target) -> Row:
    purpose = "the job queue between the API and the workers"
    if target.url is None:
        return _off("Redis", purpose, target, "the embedded Valkey")
    try:
        import redis
        import redis.asyncio
    except ImportError as err:
        return _cannot_check("Redis", purpose, err)

    client = redis.asyncio.Redis.from_url(target.url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                          socket_timeout=CONNECT_TIMEOUT_S)
    try:
        info = await client.info("server")
    except (redis.RedisError, OSError, ValueError) as err:
        return _unreachable("Redis", purpose, target, err)
    finally:
        await client.aclose()
    name = (f"Valkey {info['valkey_version']}" if "valkey_version" in info
            else f"Redis {info.get('redis_version', '?')}")
    return Row(SERVICES, "Redis", purpose, True, OK,
               f"{name} at {redact(target.url)} ({target.source})")
