"""/metrics over real HTTP: an operator's key only, the job figures equal to the ledger's,
histograms that Prometheus can read, the same answer from two API processes, and request
latency under route templates rather than ids."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline import tenants
from pipeline.settings import Settings
from tests.conftest import serving
from tests.test_dashboard import _dead_jobs
from tests.test_jobs_api import probe_task  # noqa: F401 - fixture


@pytest.fixture
async def operator_key(pool: asyncpg.Pool, tenant: tuple[int, str]) -> str:
    key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], key, name="ops", role="operator")
    return key


async def scrape(url: str, key: str) -> dict[str, list]:
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


@pytest.fixture
async def second_api(settings: Settings) -> AsyncIterator[str]:
    """Another API process's worth: its own app, pools and hub, on the same database."""
    async with serving(settings) as url:
        yield url


async def test_only_an_operator_scrapes(api_url: str, tenant: tuple[int, str]) -> None:
    async with httpx.AsyncClient(base_url=api_url) as client:
        assert (await client.get("/metrics")).status_code == 401
        tenant_scrape = await client.get("/metrics",
                                         headers={"Authorization": f"Bearer {tenant[1]}"})
        assert tenant_scrape.status_code == 403


async def test_job_figures_match_the_ledger_from_any_api_process(
    api_url: str, second_api: str, pool: asyncpg.Pool, settings: Settings,
    tenant: tuple[int, str], other_tenant: tuple[int, str], operator_key: str,
    http: httpx.AsyncClient,
) -> None:
    await _dead_jobs(pool, settings, tenant[0], 2)
    await _dead_jobs(pool, settings, other_tenant[0], 1)
    await http.get(f"/v1/jobs/{uuid.uuid4()}")  # a 404 under its route's template
    first = await scrape(api_url, operator_key)
    ledger = {(r["kind"], r["state"]): r["n"] for r in await pool.fetch(
        "SELECT kind, job_state(status, last_error) AS state, count(*) AS n FROM jobs "
        "GROUP BY 1, 2")}
    shown = {(s.labels["kind"], s.labels["state"]): s.value for s in first["memmill_jobs"]
             if s.value}
    assert shown == ledger
    assert shown[("probe", "dead")] == 3
    attempts = {(s.labels["kind"], s.labels["outcome"]): s.value
                for s in first["memmill_job_attempts"] if s.name.endswith("_total")}
    assert attempts[("probe", "dead")] == 3
    run = [s for s in first["memmill_job_run_seconds"] if s.labels.get("kind") == "probe"]
    buckets = [s for s in run if s.name.endswith("_bucket")]
    values = [s.value for s in buckets]
    assert values == sorted(values), "cumulative buckets never decrease"
    assert buckets[-1].labels["le"] == "+Inf"
    count = next(s.value for s in run if s.name.endswith("_count"))
    assert buckets[-1].value == count == 3
    assert first["memmill_workers_alive"][0].value == 0
    # Another API process reads the same aggregates: the same figures, not its own.
    second = await scrape(second_api, operator_key)
    assert second["memmill_jobs"] == first["memmill_jobs"]
    assert second["memmill_job_attempts"] == first["memmill_job_attempts"]
    routes = {s.labels["route"] for s in first["memmill_http_request_duration_seconds"]
              if s.name.endswith("_count")}
    assert "/v1/jobs/{job_id}" in routes
    assert not any(str(uuid.UUID(int=0))[:4] in r for r in routes)
