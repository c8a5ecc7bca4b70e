"""What the server processes log at the default level: no line per job or per successful
request, a summary a minute per worker, and one line per request that failed."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from memmill import cli
from pipeline.settings import Settings
from tests.conftest import drain


@pytest.fixture
def server_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Logging as `memmill worker` and `memmill api` set it up, at the default level (the
    handlers are pytest's, which `caplog` reads)."""
    monkeypatch.delenv("MEMMILL_LOG_LEVEL", raising=False)
    saved = {name: logging.getLogger(name).level for name in cli.PER_JOB_LOGGERS}
    cli._logging()
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


async def test_a_worker_logs_a_summary_instead_of_a_line_per_job(
    server_logging: None, caplog: pytest.LogCaptureFixture, api_url: str,
    tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool,
) -> None:
    caplog.set_level(logging.INFO)
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        for n in range(3):
            r = await http.post("/v1/items", json={"id": f"quiet/{n}",
                                                   "content": f"Note {n} about quiet logs."})
            assert r.status_code == 202
    await drain(settings, pool)
    job_ids = [str(j) for j in await pool.fetch("SELECT id FROM jobs WHERE status = 'done'")]
    assert len(job_ids) == 9

    info = [r for r in caplog.records if r.levelno < logging.WARNING]
    assert not [r.getMessage() for r in info if r.name.startswith("arq.")]
    assert not [r.getMessage() for r in info if any(j in r.getMessage() for j in job_ids)]
    summaries = [line for line in (r.getMessage() for r in info if r.name == "workers.main")
                 if "done," in line]
    counts = [re.search(r": (\d+) done, (\d+) retried, (\d+) dead in the last \d+ s$", line)
              for line in summaries]
    assert all(counts), summaries
    assert sum(int(m[1]) for m in counts if m) == 9
    assert all(m[2] == m[3] == "0" for m in counts if m)
    # Nor did the API log its successful requests.
    assert not [r for r in caplog.records if r.name == "api.access_log"]


def test_debug_keeps_arqs_line_per_job(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = {name: logging.getLogger(name).level for name in cli.PER_JOB_LOGGERS}
    try:
        monkeypatch.setenv("MEMMILL_LOG_LEVEL", "debug")
        cli._logging()
        assert {logging.getLogger(n).level for n in cli.PER_JOB_LOGGERS} == {logging.NOTSET}
        monkeypatch.setenv("MEMMILL_LOG_LEVEL", "INFO")
        cli._logging()
        assert {logging.getLogger(n).level for n in cli.PER_JOB_LOGGERS} == {logging.WARNING}
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


async def test_the_api_logs_one_line_per_failed_request(
    caplog: pytest.LogCaptureFixture, api_url: str, tenant: tuple[int, str]
) -> None:
    caplog.set_level(logging.INFO)
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        assert (await http.get("/v1/jobs")).status_code == 200
        assert (await http.get("/v1/items/no-such-item")).status_code == 404
        bad = await http.get("/v1/jobs", params={"status": "bogus", "item_id": "secret-plan"})
        assert bad.status_code == 422
    async with httpx.AsyncClient(base_url=api_url) as anonymous:
        assert (await anonymous.get("/v1/jobs")).status_code == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "api.access_log"]
    ms = r"\d+\.\d ms"
    assert len(lines) == 3, lines
    assert re.fullmatch(rf"GET /v1/items/no-such-item 404 {ms} tenant {tenant[0]}", lines[0])
    # The query's parameter names, never their values.
    assert re.fullmatch(rf"GET /v1/jobs\?status=…&item_id=… 422 {ms} tenant {tenant[0]}",
                        lines[1]), lines[1]
    assert re.fullmatch(rf"GET /v1/jobs 401 {ms}", lines[2]), lines[2]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "api.access_log")
