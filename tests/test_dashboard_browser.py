"""The dashboard in a real browser (chromium, see tests.browser): what tests/test_dashboard.py
checks over HTTP, checked here as an operator meets it: the sign-in form and its cookie, live
figures that change without a reload, a crashed job's attempts and traceback, one-click and
bulk replays, a read-only key's pages, another tenant's ids. Every page is saved as a
screenshot (into $MEMMILL_SCREENSHOTS, or the test's temporary directory) for a person to
look at."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from playwright.async_api import BrowserContext, Page, expect

from pipeline.settings import Settings
from tests.browser import Screenshots, chromium, context, csrf_token, page, shots, sign_in  # noqa: F401
from tests.conftest import drain
from tests.test_dashboard import _dead_jobs, viewer_key  # noqa: F401 - a fixture
from tests.test_jobs_api import FAULT, probe_task  # noqa: F401 - an autouse fixture

# A minute of real browser: with the other slow suites, in CI (CI=true) or on request
# (MEMMILL_SLOW_TESTS=1), so that a plain `./dev test` stays well under ten minutes.
pytestmark = pytest.mark.slow

COUNTS_JS = """() => Object.fromEntries([...document.querySelectorAll('[data-testid^="count-"]')]
    .map(e => [e.dataset.testid.slice(6), Number(e.textContent.replace(/[^0-9]/g, ''))]))"""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Two attempts, not five, before a crashing job is dead: enough for a job page with a
    retried attempt and a final one, each with its traceback."""
    return settings.model_copy(update={"max_attempts": 2})


async def _dead_letter_of(pool: asyncpg.Pool, job_id: str) -> int:
    return await pool.fetchval("SELECT id FROM dead_letters WHERE job_id = $1",
                               uuid.UUID(job_id))


@contextlib.asynccontextmanager
async def _live_worker(settings: Settings) -> AsyncIterator[None]:
    """One real worker, polling as in production, until the block ends."""
    from workers.main import build_worker

    # arq's worker takes SIGINT and SIGTERM over from the loop: hand them back afterwards.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    worker = build_worker(settings, sweep=False)
    running = asyncio.create_task(worker.main())
    try:
        yield
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await worker.close()
        loop = asyncio.get_running_loop()
        for sig, handler in handlers.items():
            loop.remove_signal_handler(sig)
            if handler is not None:
                signal.signal(sig, handler)


async def test_sign_in_through_the_form_sets_an_http_only_cookie(
    page: Page, context: BrowserContext, api_url: str, tenant: tuple[int, str],  # noqa: F811
    shots: Screenshots,  # noqa: F811
) -> None:
    await page.goto(api_url + "/dashboard")
    await page.wait_for_url(re.compile(r"/dashboard/login\?next=/dashboard$"))
    await expect(page.get_by_test_id("key")).to_be_focused()
    await shots(page, "login")
    await page.get_by_test_id("key").fill("mm_" + "x" * 40)
    await page.get_by_test_id("sign-in").click()
    await expect(page.get_by_test_id("notice")).to_contain_text("not valid")
    assert await context.cookies() == []

    await page.get_by_test_id("key").fill(tenant[1])
    async with page.expect_navigation():
        await page.get_by_test_id("sign-in").click()
    assert page.url == api_url + "/dashboard"
    await expect(page.locator("h1")).to_contain_text("Overview")
    await expect(page.get_by_test_id("who")).to_contain_text("default · tenant")
    (cookie,) = await context.cookies()
    assert cookie["name"] == "memmill_dashboard" and cookie["path"] == "/dashboard"
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert await page.evaluate("document.cookie") == ""  # scripts cannot read it
    assert tenant[1] not in await page.content()  # the key is nowhere on the page


async def test_overview_counts_change_live_without_a_reload(
    page: Page, api_url: str, tenant: tuple[int, str], http: httpx.AsyncClient,  # noqa: F811
) -> None:
    await sign_in(page, api_url, tenant[1])
    # The stream is open once the first event has replaced the section.
    await expect(page.locator("[data-live-status]")).to_contain_text("live · updated")
    before = await page.evaluate(COUNTS_JS)
    assert set(before) >= {"waiting", "queued", "running", "done", "dead"}, before
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url)
            if frame == page.main_frame else None)
    await page.evaluate("window.__marker = 1")

    put = await http.post("/v1/items", json={"id": "live-doc", "content": "Hello, dashboard."})
    assert put.status_code == 202, put.text
    # No worker runs: the item's jobs wait in the ledger, and the page says so by itself.
    await page.wait_for_function(
        f"(before) => JSON.stringify(({COUNTS_JS})()) !== JSON.stringify(before)",
        arg=before, timeout=5_000)
    after = await page.evaluate(COUNTS_JS)
    assert after["queued"] + after["waiting"] > before["queued"] + before["waiting"], after
    assert await page.evaluate("window.__marker") == 1
    assert navigations == [] and page.url == api_url + "/dashboard"


async def test_a_crashed_job_shows_its_attempts_and_traceback_and_every_page_renders(
    page: Page, api_url: str, pool: asyncpg.Pool, settings: Settings,  # noqa: F811
    tenant: tuple[int, str], shots: Screenshots,  # noqa: F811
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, tenant[0], 1, mode="crash")
    item_id = await pool.fetchval("SELECT item_id FROM jobs WHERE id = $1", uuid.UUID(job_id))
    dead_id = await _dead_letter_of(pool, job_id)
    await sign_in(page, api_url, tenant[1], path=f"/dashboard/jobs/{job_id}")

    await expect(page.locator("h1 .badge")).to_have_text("dead")
    attempts = page.get_by_test_id("attempts")
    budget = settings.max_attempts_for("probe")
    await expect(attempts.locator("tbody .badge")).to_have_count(budget)
    traces = page.get_by_test_id("traceback")
    await expect(traces).to_have_count(budget)
    # The newest attempt's traceback is open; the earlier ones are one click away.
    await expect(traces.last).to_be_visible()
    await expect(traces.last).to_contain_text("Traceback")
    await expect(traces.last).to_contain_text("FileNotFoundError")
    await expect(traces.first).to_be_hidden()
    await attempts.locator("summary").first.click()
    await expect(traces.first).to_be_visible()
    await shots(page, "job-traceback")

    await page.goto(api_url + "/dashboard")
    await expect(page.get_by_test_id("count-dead")).to_have_text("1")
    await expect(page.get_by_test_id("count-done")).not_to_have_text("0")
    # The charts have bars: some rectangle is taller than nothing.
    bars = await page.locator(".chart svg rect").evaluate_all(
        "rects => rects.filter(r => Number(r.getAttribute('height')) > 0).length")
    assert bars >= 2, bars
    await shots(page, "overview")

    await page.goto(api_url + "/dashboard/jobs")
    await expect(page.get_by_test_id("job-total")).to_contain_text("jobs match")
    await shots(page, "jobs")
    await page.get_by_test_id("job-search").fill("status:dead")
    async with page.expect_navigation():
        await page.get_by_test_id("job-search").press("Enter")
    await expect(page.get_by_test_id("jobs").locator("tbody tr")).to_have_count(1)

    await page.get_by_test_id("jobs").locator("tbody a", has_text=item_id).click()
    await expect(page.get_by_test_id("timeline-1")).to_contain_text("probe")
    for stage in ("analyze", "embed"):
        await expect(page.get_by_test_id("timeline-1")).to_contain_text(stage)
    await shots(page, "item")

    await page.goto(api_url + "/dashboard/dead-letters")
    await expect(page.get_by_test_id(f"replay-{dead_id}")).to_be_visible()
    await shots(page, "dead-letters")
    await page.goto(api_url + f"/dashboard/dead-letters/{dead_id}")
    await expect(page.get_by_test_id("traceback").first).to_contain_text("Traceback")
    await shots(page, "dead-letter")

    for path, name in (("/dashboard/queues", "queues"), ("/dashboard/providers", "providers")):
        response = await page.goto(api_url + path)
        assert response is not None and response.status == 200, path
        await shots(page, name)

    async with _live_worker(settings):
        await page.goto(api_url + "/dashboard/workers")
        # The live section shows the worker once its first heartbeat is in a snapshot.
        await expect(page.get_by_test_id("workers-alive")).to_have_text("1", timeout=15_000)
        await shots(page, "workers")


async def test_replaying_a_dead_letter_from_its_row_makes_the_job_done(
    page: Page, api_url: str, pool: asyncpg.Pool, settings: Settings,  # noqa: F811
    tenant: tuple[int, str],
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, tenant[0], 1)
    dead_id = await _dead_letter_of(pool, job_id)
    await sign_in(page, api_url, tenant[1], path="/dashboard/dead-letters")
    async with page.expect_navigation():
        await page.get_by_test_id(f"replay-{dead_id}").click()
    await expect(page.get_by_test_id("result")).to_contain_text("Queued again with a fresh budget")
    FAULT["mode"] = None  # the cause is fixed
    await drain(settings, pool)
    await page.goto(api_url + f"/dashboard/jobs/{job_id}")
    await expect(page.locator("h1 .badge")).to_have_text("done")
    await page.goto(api_url + "/dashboard/dead-letters")
    # Replayed: its row says when, and offers no second replay.
    await expect(page.get_by_test_id(f"replay-{dead_id}")).to_have_count(0)
    await expect(page.get_by_test_id("dead-total")).to_contain_text("0 of them waiting")


async def test_bulk_replay_by_filter_counts_first_and_reports_what_changed(
    page: Page, api_url: str, pool: asyncpg.Pool, settings: Settings,  # noqa: F811
    tenant: tuple[int, str], http: httpx.AsyncClient, shots: Screenshots,  # noqa: F811
) -> None:
    ids = await _dead_jobs(pool, settings, tenant[0], 3)
    await sign_in(page, api_url, tenant[1], path="/dashboard/dead-letters")
    await page.get_by_test_id("dead-search").fill('error:"no xref"')
    async with page.expect_navigation():
        await page.get_by_role("button", name="Search").click()
    await expect(page.get_by_test_id("dead-total")).to_contain_text("3 of them waiting")
    replay_matching = page.get_by_test_id("replay-matching")
    await expect(replay_matching).to_have_text("Replay the 3 waiting…")
    async with page.expect_navigation():
        await replay_matching.click()
    await expect(page.get_by_test_id("preview-count")).to_contain_text("exactly 3 dead letters")
    await expect(page.get_by_test_id("confirm-replay")).to_have_text("Replay 3")
    await shots(page, "replay-preview")

    # Meanwhile someone replays one of the three through the JSON API.
    first = await _dead_letter_of(pool, ids[0])
    assert (await http.post(f"/v1/dead-letters/{first}/replay")).status_code == 200
    async with page.expect_navigation():
        await page.get_by_test_id("confirm-replay").click()
    result = page.get_by_test_id("result")
    await expect(result).to_contain_text("Replayed 2.")
    await expect(result).to_contain_text("Skipped 1")
    await shots(page, "replay-result")
    assert await pool.fetchval(
        "SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL") == 3

    await page.goto(api_url + "/dashboard/audit")
    rows = page.get_by_test_id("audit").locator("tbody tr")
    await expect(rows).to_have_count(2)  # the API's replay and the dashboard's
    await expect(rows.first).to_contain_text("dashboard")
    await shots(page, "audit")


async def test_a_read_only_key_sees_no_buttons_and_a_forged_post_is_refused(
    page: Page, api_url: str, pool: asyncpg.Pool, settings: Settings,  # noqa: F811
    tenant: tuple[int, str], viewer_key: str, shots: Screenshots,  # noqa: F811
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, tenant[0], 1)
    dead_id = await _dead_letter_of(pool, job_id)
    await sign_in(page, api_url, viewer_key)
    await expect(page.get_by_test_id("who")).to_contain_text("read-only")
    for path in ("/dashboard", f"/dashboard/jobs/{job_id}", "/dashboard/dead-letters",
                 f"/dashboard/dead-letters/{dead_id}", "/dashboard/queues"):
        response = await page.goto(api_url + path)
        assert response is not None and response.status == 200, path
        # No retry, cancel, replay, pause or resume: the one form that posts is "Sign out".
        actions = await page.locator("form[method=post]").evaluate_all(
            "forms => forms.map(f => f.getAttribute('action'))")
        assert actions == ["/dashboard/logout"], (path, actions)
        buttons = await page.locator("button").all_inner_texts()
        assert set(buttons) <= {"Sign out", "Search"}, (path, buttons)
        if path.startswith("/dashboard/jobs/"):
            await shots(page, "job-read-only")
    token = await csrf_token(page)  # a valid token, from the sign-out form
    for path in (f"/dashboard/jobs/{job_id}/retry", f"/dashboard/dead-letters/{dead_id}/replay",
                 "/dashboard/queues/embed/pause"):
        forged = await page.request.post(api_url + path, form={"csrf": token},
                                         max_redirects=0)
        assert forged.status == 403, (path, forged.status, await forged.text())
        assert "read-only" in await forged.text()
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1",
                               uuid.UUID(job_id)) == "dead"
    assert await pool.fetchval("SELECT count(*) FROM audit_log") == 0


async def test_another_tenants_ids_are_not_found(
    page: Page, api_url: str, pool: asyncpg.Pool, settings: Settings,  # noqa: F811
    tenant: tuple[int, str], other_tenant: tuple[int, str], shots: Screenshots,  # noqa: F811
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, other_tenant[0], 1)
    dead_id = await _dead_letter_of(pool, job_id)
    item_id = await pool.fetchval("SELECT item_id FROM jobs WHERE id = $1", uuid.UUID(job_id))
    await sign_in(page, api_url, tenant[1])
    for path in (f"/dashboard/jobs/{job_id}", f"/dashboard/dead-letters/{dead_id}",
                 f"/dashboard/items/{item_id}?tenant={other_tenant[0]}"):
        response = await page.goto(api_url + path)
        assert response is not None and response.status == 404, (path, response)
        await expect(page.locator("h1")).to_have_text("404 · Not found")
        await expect(page.get_by_test_id("error")).not_to_contain_text("other")
    await shots(page, "not-found")

