"""A worker killed mid-job must not leave its delivery in the queue.

arq marks a delivery in progress for the longest job timeout plus 10 s (30 minutes with OCR's
1800 s) and leaves it in the queue until it finishes. A SIGKILLed worker never finishes it:
the queue counted it for those 30 minutes although the sweeper had reclaimed the ledger row
and another worker had done the job, and when the mark expired a worker ran the delivery
again, found it over its one try and logged "max retries 1 exceeded" for a job long done.

Real `memmill worker` processes (see tests/test_faults.py), a real SIGKILL, nothing mocked. The
workers here run with a 20 s job timeout, so the dead delivery's mark lasts 30 s and the test
can wait until a worker would have run it again.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis

from pipeline import tenants
from pipeline.db import create_pool
from pipeline.settings import Settings
from tests.test_faults import Lab, prose

# Real processes killed and restarted: minutes of wall time (see conftest).
pytestmark = pytest.mark.slow

JOB_TIMEOUT_S = 20
# arq's rule: the in-progress mark lasts the longest job timeout plus 10 s.
IN_PROGRESS_S = JOB_TIMEOUT_S + 10
SHORT_TIMEOUTS = {"MEMMILL_JOB_TIMEOUT_S": str(JOB_TIMEOUT_S), "MEMMILL_JOB_OVERRIDES": "{}"}


async def test_sigkilled_workers_delivery_leaves_the_queue(
    db_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=db_url, redis_url=redis_url, data_dir=tmp_path,
                        queue_name=f"memmill:stale:{uuid.uuid4().hex[:10]}")
    pool = await create_pool(db_url, max_size=4)
    lab = Lab(settings, pool, await tenants.ensure_tenant(pool, "default"), tmp_path)
    queue = redis.Redis.from_url(redis_url)
    try:
        # Both up before the job exists: the survivor's sweeper runs all along, as in production.
        workers = [lab.start_worker(name, SHORT_TIMEOUTS) for name in ("A", "B")]
        await lab.wait_until("both workers to beat", lambda: lab.fetchval(
            "SELECT count(*) = 2 FROM workers WHERE stopped_at IS NULL AND queue_name = $1",
            settings.queue_name))
        await lab.put({"big": prose(random.Random(11), 60)})
        embed_id = await lab.fetchval("SELECT id FROM jobs WHERE kind = 'embed'")
        await lab.wait_until("a worker to run the embed job", lambda: lab.fetchval(
            "SELECT status = 'running' FROM jobs WHERE id = $1", embed_id))
        holder = await lab.fetchval("SELECT worker_id FROM jobs WHERE id = $1", embed_id)
        victim = next(w for w in workers if holder.startswith(w.id_pattern[:-1]))
        survivor = next(w for w in workers if w is not victim)
        attempt = await lab.fetchval("SELECT attempts FROM jobs WHERE id = $1", embed_id)
        tenant_id = await lab.fetchval("SELECT tenant_id FROM jobs WHERE id = $1", embed_id)
        dead_delivery = f"{embed_id}:{attempt}:{tenant_id}"
        assert queue.zscore(settings.queue_name, dead_delivery) is not None, await lab.report()
        assert await lab.fetchval("SELECT status FROM jobs WHERE id = $1", embed_id) == "running"
        victim.kill()
        killed_at = time.monotonic()

        await lab.wait_all_ready(1)
        await lab.assert_ledger_clean(1)
        history = await pool.fetch(
            "SELECT outcome FROM job_attempts WHERE job_id = $1 ORDER BY attempt", embed_id)
        assert [r["outcome"] for r in history] == ["lost", "done"]
        # Everything is done, so the queue is empty: the dead delivery went when its lease was
        # reclaimed, not when arq's mark expires.
        assert time.monotonic() - killed_at < IN_PROGRESS_S, "too slow to tell the two apart"
        assert queue.zcard(settings.queue_name) == 0, (
            queue.zrange(settings.queue_name, 0, -1, withscores=True))
        keys = [f"arq:{kind}:{dead_delivery}" for kind in ("job", "in-progress", "retry")]
        assert queue.exists(*keys) == 0

        # Past the moment the dead delivery's mark would have expired, the survivor has run
        # nothing again and said nothing about retries.
        await asyncio.sleep(killed_at + IN_PROGRESS_S + 3 - time.monotonic())
        log = survivor.log_path.read_text(errors="replace")
        assert "max retries" not in log, survivor.log_tail()
        assert survivor.alive(), survivor.log_tail()
        assert queue.zcard(settings.queue_name) == 0
        await lab.assert_ledger_clean(1)
    finally:
        queue.close()
        await lab.close()


async def test_sigterm_released_jobs_leave_no_delivery_behind(
    db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """On SIGTERM arq cancels a job still running after the grace and keeps its delivery, to
    run it again; the worker hands the job back through the ledger with a new delivery, so the
    old one must go, or the next worker runs it over its one try ("max retries exceeded")."""
    settings = Settings(database_url=db_url, redis_url=redis_url, data_dir=tmp_path,
                        queue_name=f"memmill:stale:{uuid.uuid4().hex[:10]}")
    pool = await create_pool(db_url, max_size=4)
    lab = Lab(settings, pool, await tenants.ensure_tenant(pool, "default"), tmp_path)
    queue = redis.Redis.from_url(redis_url)
    try:
        await lab.put({"big": prose(random.Random(12), 150)})
        embed_id = await lab.fetchval("SELECT id FROM jobs WHERE kind = 'embed'")
        a = lab.start_worker("A", {"MEMMILL_SHUTDOWN_GRACE_S": "1"})
        await lab.wait_until("worker A to run the embed job", lambda: lab.fetchval(
            "SELECT status = 'running' FROM jobs WHERE id = $1", embed_id))
        a.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(a.process.wait, 30) == 0, a.log_tail()
        assert await lab.fetchval("SELECT status FROM jobs WHERE id = $1", embed_id) == "queued", \
            await lab.report()

        # Only the new delivery (attempt 2) is left: the cancelled one went with the release.
        waiting = [m.decode() for m in queue.zrange(settings.queue_name, 0, -1)]
        assert waiting == [f"{embed_id}:2:{lab.tenant_id}"], waiting
        first = f"{embed_id}:1:{lab.tenant_id}"
        assert queue.exists(f"arq:job:{first}", f"arq:retry:{first}") == 0

        b = lab.start_worker("B")
        await lab.wait_all_ready(1)
        await lab.assert_ledger_clean(1)
        assert "max retries" not in b.log_path.read_text(errors="replace"), b.log_tail()
        assert queue.zcard(settings.queue_name) == 0
    finally:
        queue.close()
        await lab.close()
