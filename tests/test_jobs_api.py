"""Retries, dead letters and replay, and the operator's job endpoints, over real HTTP.

A `probe` task, registered for these tests only, fails as the test tells it to: transiently,
permanently, by crashing inside libraries, or not at all."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from uuid import UUID

import asyncpg
import httpx
import pytest
from arq import create_pool
from arq.connections import RedisSettings

from pipeline import items, jobs, tenants
from pipeline.db import Q
from pipeline.errors import PermanentError, TransientError
from pipeline.jobs import JobSpec, RetryPolicy
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from pipeline.tasks import TASKS, Deps
from tests.conftest import drain

FAULT: dict[str, str | None] = {"mode": None}


async def probe(job: asyncpg.Record, deps: Deps):  # type: ignore[no-untyped-def]
    if FAULT["mode"] == "transient":
        raise TransientError("upstream answered 503")
    if FAULT["mode"] == "permanent":
        raise PermanentError("the PDF is corrupt: no xref table")
    if FAULT["mode"] == "crash":
        # A real failure through a library and the standard library, with a server path in its
        # message: everything a traceback shown to the tenant used to give away.
        try:
            await deps.pool.fetchval("SELECT 1 / 0")
        except asyncpg.DataError:
            Path(__file__).with_name("no-such-file.txt").read_text()

    async def write(conn: asyncpg.Connection) -> None:
        return None

    return write


@pytest.fixture(autouse=True)
def probe_task() -> AsyncIterator[None]:
    TASKS["probe"] = probe
    FAULT["mode"] = None
    yield
    TASKS.pop("probe")


async def _item_with_probe(pool: asyncpg.Pool, settings: Settings, tenant_id: int, item_id: str
                           ) -> str:
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(conn, tenant_id=tenant_id, settings=settings,
                                      item=items.NewItem(id=item_id, content="Probe me."))
        (probe_row,) = await jobs.create_jobs(
            conn, tenant_id=tenant_id, item_id=item_id, version=1, specs=[JobSpec("probe")],
            max_attempts=settings.max_attempts_for)
    queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        await jobs.enqueue(pool, queue, jobs.refs_to_enqueue([*result.jobs, probe_row]),
                           queue_name=settings.queue_name)
    finally:
        await queue.aclose()
    return str(probe_row["id"])


async def test_transient_failures_back_off_then_dead_letter_then_replay(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    FAULT["mode"] = "transient"
    job_id = await _item_with_probe(pool, settings, tenant[0], "flaky")
    await drain(settings, pool)

    job = (await http.get(f"/v1/jobs/{job_id}")).json()
    assert job["status"] == "dead" and job["attempts"] == settings.max_attempts
    history = job["history"]
    assert [h["outcome"] for h in history] == ["retry"] * 4 + ["dead"]
    assert all("503" in h["error"] for h in history)
    policy = RetryPolicy(settings.retry_base_s, settings.retry_max_s)
    for h, nxt in pairwise(history):
        # Each delay lies under its attempt's ceiling, and the next attempt waited for it.
        assert 0 <= h["retry_delay_s"] <= policy.ceiling_s(h["attempt"])
        waited = _seconds(nxt["started_at"]) - _seconds(h["finished_at"])
        assert waited >= h["retry_delay_s"] - 0.01
    item = (await http.get("/v1/items/flaky")).json()
    assert item["status"] == "failed" and "503" in item["error"]

    letters = (await http.get("/v1/dead-letters")).json()
    assert letters["count"] == 1
    letter = letters["data"][0]
    assert letter["job_id"] == job_id and letter["permanent"] is False
    detail = (await http.get(f"/v1/dead-letters/{letter['id']}")).json()
    assert len(detail["history"]) == 5 and all(h["traceback"] for h in detail["history"])

    FAULT["mode"] = None  # the upstream recovered
    r = await http.post(f"/v1/dead-letters/{letter['id']}/replay")
    assert r.status_code == 200 and r.json()["replayed"] == 1
    await drain(settings, pool)
    job = (await http.get(f"/v1/jobs/{job_id}")).json()
    assert job["status"] == "done" and job["attempts"] == 6
    assert (await http.get("/v1/items/flaky")).json()["status"] == "ready"
    again = await http.post(f"/v1/dead-letters/{letter['id']}/replay")
    assert again.status_code == 409


async def test_permanent_failure_dead_letters_at_once(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    FAULT["mode"] = "permanent"
    job_id = await _item_with_probe(pool, settings, tenant[0], "corrupt.pdf")
    await drain(settings, pool)
    job = (await http.get(f"/v1/jobs/{job_id}")).json()
    assert job["status"] == "dead" and job["attempts"] == 1
    item = (await http.get("/v1/items/corrupt.pdf")).json()
    assert item["status"] == "failed"
    assert item["error"] == "probe: the PDF is corrupt: no xref table"
    letters = (await http.get("/v1/dead-letters", params={"permanent": True})).json()
    assert [d["reason"] for d in letters["data"]] == ["the PDF is corrupt: no xref table"]


async def test_replay_by_filter_and_job_listing(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    FAULT["mode"] = "permanent"
    for n in range(3):
        await _item_with_probe(pool, settings, tenant[0], f"batch-{n}")
    await drain(settings, pool)
    dead = (await http.get("/v1/jobs", params={"status": "dead", "kind": "analyze"})).json()
    assert dead["count"] == 0  # the filter is applied: analyze jobs did not fail
    listed = (await http.get("/v1/jobs", params={"status": "dead", "limit": 2})).json()
    assert listed["count"] == 3 and len(listed["data"]) == 2
    stats = (await http.get("/v1/jobs/stats")).json()
    assert stats["by_status"] == {"done": 9, "dead": 3}
    assert stats["by_kind"]["probe"] == {"dead": 3}

    FAULT["mode"] = None
    r = await http.post("/v1/dead-letters/replay", json={"item_id": "batch-1"})
    assert r.json()["replayed"] == 1
    r = await http.post("/v1/dead-letters/replay", json={})
    assert r.json()["replayed"] == 2
    await drain(settings, pool)
    stats = (await http.get("/v1/jobs/stats")).json()
    assert stats["by_status"] == {"done": 12}
    bad = await http.post("/v1/dead-letters/replay", json={"kind": "probe", "nope": 1})
    assert bad.status_code == 422


async def test_cancel_and_retry(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    r = await http.post("/v1/items", json={"id": "later", "content": "Cancel my embedding."})
    embed = next(j for j in r.json()["jobs"] if j["kind"] == "embed")
    cancelled = await http.post(f"/v1/jobs/{embed['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert (await http.post(f"/v1/jobs/{embed['id']}/cancel")).status_code == 409
    await drain(settings, pool)
    item = (await http.get("/v1/items/later")).json()
    assert item["status"] == "failed" and "cancelled" in item["error"]

    retried = await http.post(f"/v1/jobs/{embed['id']}/retry")
    assert retried.status_code == 200 and retried.json()["status"] in ("queued", "waiting")
    await drain(settings, pool)
    assert (await http.get("/v1/items/later")).json()["status"] == "ready"
    done = await http.post(f"/v1/jobs/{embed['id']}/retry")
    assert done.status_code == 409 and "done" in done.json()["detail"]
    assert (await http.get("/v1/jobs/00000000-0000-0000-0000-000000000000")).status_code == 404
    assert (await http.get("/v1/jobs", params={"status": "bogus"})).status_code == 422


@pytest.mark.parametrize("action", ["cancel", "retry"])
async def test_a_refusal_quotes_the_status_it_was_refused_on(
    action: str, http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    r = await http.post("/v1/items", json={"id": "racing", "content": "Claimed meanwhile."})
    job_id = next(j["id"] for j in r.json()["jobs"] if j["kind"] == "analyze")
    async with pool.acquire() as worker, worker.transaction():
        # A worker claims the queued job; the request arrives before the claim commits.
        claimed = await worker.fetchrow(Q["jobs.claim"], UUID(job_id), "host:1:abcdef", 60)
        assert claimed["status"] == "running"
        request = asyncio.create_task(http.post(f"/v1/jobs/{job_id}/{action}"))
        await _until_a_backend_waits_on_a_lock(pool)
    refused = await request
    assert refused.status_code == 409
    # Not "is queued": the status read before the claim, which the change was refused against.
    assert f"job {job_id} is running;" in refused.json()["detail"]


async def _until_a_backend_waits_on_a_lock(pool: asyncpg.Pool) -> None:
    for _ in range(200):
        if await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the request never waited on the job's row")


REPO = Path(__file__).resolve().parent.parent
# An absolute path under a directory that servers keep code, data or users in.
SERVER_PATH = re.compile(r"(?<![\w.:/<>…-])/(?:work|root|home|usr|opt|tmp|var|srv|app)/")


def _assert_no_server_path(text: str) -> None:
    for prefix in {str(REPO), sys.prefix, sys.base_prefix}:
        assert prefix not in text, text
    assert not SERVER_PATH.search(text), text
    assert "site-packages" not in text and "dist-packages" not in text, text


async def test_dead_letters_show_no_server_path_nor_host(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    api_url: str,
) -> None:
    FAULT["mode"] = "crash"
    job_id = await _item_with_probe(pool, settings, tenant[0], "crashing")
    await drain(settings, pool)
    (letter,) = (await http.get("/v1/dead-letters")).json()["data"]
    detail = (await http.get(f"/v1/dead-letters/{letter['id']}")).json()
    job = (await http.get(f"/v1/jobs/{job_id}")).json()
    item = (await http.get("/v1/items/crashing")).json()
    assert len(detail["history"]) == settings.max_attempts

    shown = [detail["reason"], detail["last_error"], job["last_error"], item["error"],
             *(h["error"] for h in detail["history"] + job["history"]),
             *(h["traceback"] for h in detail["history"])]
    for text in shown:
        _assert_no_server_path(text)
    # The stored rows hold no path either: they were scrubbed when written.
    stored = await pool.fetch(
        "SELECT a.error, a.traceback, a.worker_id, j.last_error, d.reason FROM job_attempts a"
        " JOIN jobs j ON j.id = a.job_id JOIN dead_letters d ON d.job_id = j.id"
        " WHERE a.job_id = $1 ORDER BY a.attempt", UUID(job_id))
    for row in stored:
        for text in (row["error"], row["traceback"], row["last_error"], row["reason"]):
            _assert_no_server_path(text)
    # What a traceback is for is still there: which of our files, which library, which line.
    trace = detail["history"][-1]["traceback"]
    assert 'File "tests/test_jobs_api.py", line' in trace and "in probe" in trace
    assert 'File "pipeline/runner.py", line' in trace
    assert 'File "<lib>/asyncpg/' in trace and 'File "<python>/pathlib.py"' in trace
    assert "DivisionByZeroError" in trace
    assert "FileNotFoundError" in detail["last_error"]
    assert "tests/no-such-file.txt" in detail["last_error"]

    # A tenant tells attempts' workers apart, without their host and pid; an operator sees them.
    worker_ids = [r["worker_id"] for r in stored]
    assert [h["worker_id"] for h in detail["history"]] == [
        f"worker-{w.rsplit(':', 1)[1]}" for w in worker_ids]
    operator_key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], operator_key, name="ops", role="operator")
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {operator_key}"}) as op:
        seen = (await op.get(f"/v1/dead-letters/{letter['id']}")).json()
    assert [h["worker_id"] for h in seen["history"]] == worker_ids


def _seconds(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp).timestamp()


async def _cli(api_url: str, key: str, *args: str) -> tuple[int, str]:
    import asyncio
    import sys

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memmill", *args, "--url", api_url, "--key", key,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def test_operator_cli(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    FAULT["mode"] = "permanent"
    job_id = await _item_with_probe(pool, settings, tenant[0], "cli-item")
    await drain(settings, pool)
    code, out = await _cli(api_url, tenant[1], "dead-letters", "list")
    assert code == 0 and "cli-item" in out and "the PDF is corrupt" in out
    dead_id = await pool.fetchval("SELECT id FROM dead_letters WHERE job_id = $1", job_id)
    code, out = await _cli(api_url, tenant[1], "jobs", "list", "--status", "dead")
    assert code == 0 and job_id in out and "1 of 1" in out
    # The queue's depth is the installation's: an operator's key sees it.
    operator_key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], operator_key, name="ops", role="operator")
    code, out = await _cli(api_url, operator_key, "jobs", "stats")
    assert code == 0 and "probe" in out and "queue depth: 0" in out
    FAULT["mode"] = None
    code, out = await _cli(api_url, tenant[1], "dead-letters", "replay", str(dead_id))
    assert (code, out.strip()) == (0, "replayed 1 job(s)")
    code, out = await _cli(api_url, tenant[1], "dead-letters", "replay", str(dead_id))
    assert code == 1 and "already replayed" in out
    await drain(settings, pool)
    code, out = await _cli(api_url, tenant[1], "jobs", "show", job_id)
    assert code == 0 and json.loads(out)["status"] == "done"


async def test_cancelling_a_waiting_job_never_deadlocks_with_a_completion(
    pool: asyncpg.Pool, tenant: tuple[int, str], settings: Settings
) -> None:
    """A completion locks the item's row, then the job's; cancel takes them in the same order.
    In the other order, cancelling the embed job while analyze completed deadlocked, and
    Postgres aborted one of the two."""
    from pipeline import ledger

    tenant_id, _ = tenant
    async with pool.acquire() as conn, conn.transaction():
        result = await items.put_item(
            conn, tenant_id=tenant_id, settings=settings,
            item=items.NewItem(id="locks/a", content="Lock order matters to deadlocks."))
    waiting = next(j for j in result.jobs if j["status"] == jobs.WAITING)
    async with pool.acquire() as completion, completion.transaction():
        await completion.execute(Q["items.lock_for_completion"], tenant_id, "locks/a")
        cancelling = asyncio.create_task(ledger.cancel_job(pool, tenant_id, waiting["id"]))
        await asyncio.sleep(0.3)  # the cancel is waiting for the item's row by now
        assert not cancelling.done()
        # The completion goes on to the job's row: free, because cancel holds nothing yet.
        await asyncio.wait_for(completion.execute(Q["jobs.lock"], tenant_id, waiting["id"]), 5)
    row = await asyncio.wait_for(cancelling, 10)
    assert row["status"] == jobs.CANCELLED
