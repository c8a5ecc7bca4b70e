"""A real browser for the dashboard's tests: Debian's chromium, driven by Playwright's async API.

The async API because the app under test (`api_url`) serves from the test's own event loop: the
sync API would block that loop and wait forever for a page the app can no longer serve. One
browser per session (it takes seconds to start), a fresh context (cookies, storage) per test.
Playwright never downloads a browser here: `./dev setup` installs Debian's chromium, and a
machine without it skips these tests, unless it is CI, where a missing browser is a failure.

Test modules import the fixtures: `from tests.browser import chromium, context, page, shots`."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page

CHROMIUM = Path("/usr/bin/chromium")
# Headless and quiet: no sandbox (tests run as root in containers), no GPU, and nothing
# that phones home (updates, sync, QUIC probes) to slow a test down or fail it offline.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync",
                 "--disable-quic"]
VIEWPORT = {"width": 1366, "height": 900}
# A step that waits longer than this has failed: say so well before pytest's patience ends.
STEP_TIMEOUT_MS = 10_000
REPO = Path(__file__).resolve().parent.parent


def _need_chromium() -> None:
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return
    reason = (f"{CHROMIUM} is missing: `./dev setup` installs it (as root: apt-get install "
              "chromium chromium-driver)")
    if os.environ.get("CI") == "true":
        pytest.fail(f"the dashboard's browser tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"no browser for the dashboard's browser tests: {reason}")


@pytest.fixture(scope="session")
async def chromium() -> AsyncIterator[Browser]:
    _need_chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def context(chromium: Browser, api_url: str) -> AsyncIterator[BrowserContext]:
    """A fresh browser profile on the app under test. It asks for `api_url` so that it closes
    first: a page's open event stream would otherwise hold the server's shutdown forever."""
    ctx = await chromium.new_context(viewport=VIEWPORT, locale="en-GB", timezone_id="UTC")
    ctx.set_default_timeout(STEP_TIMEOUT_MS)
    ctx.set_default_navigation_timeout(STEP_TIMEOUT_MS)
    try:
        yield ctx
    finally:
        await ctx.close()


@pytest.fixture
async def page(context: BrowserContext) -> AsyncIterator[Page]:
    """A tab whose uncaught script errors fail the test: the dashboard's script must not
    throw on any page, even where it has nothing to do."""
    tab = await context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    assert not errors, f"script errors on the page: {errors}"


class Screenshots:
    """Full-page PNGs of what a test saw, for a person to look at: into $MEMMILL_SCREENSHOTS,
    or the test's temporary directory; never into the repository."""

    def __init__(self, directory: Path) -> None:
        directory = directory.resolve()
        if directory == REPO or REPO in directory.parents:
            raise ValueError(f"screenshots go outside the repository, not into {directory}")
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory

    async def __call__(self, tab: Page, name: str) -> Path:
        path = self.directory / f"{re.sub(r'[^a-z0-9_-]+', '-', name.lower())}.png"
        await tab.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def shots(tmp_path: Path) -> Screenshots:
    return Screenshots(Path(os.environ.get("MEMMILL_SCREENSHOTS") or tmp_path / "screenshots"))


async def sign_in(tab: Page, api_url: str, key: str, *, path: str = "/dashboard") -> None:
    """Sign in as a person does: open a page, get sent to the form, type the key, click."""
    await tab.goto(api_url + path)
    await tab.wait_for_url(re.compile(r"/dashboard/login\?"))
    await tab.get_by_test_id("key").fill(key)
    async with tab.expect_navigation():
        await tab.get_by_test_id("sign-in").click()
    assert tab.url == api_url + path, tab.url


async def csrf_token(tab: Page) -> str:
    """The session's CSRF token, as every form on the page carries it (sign-out has one)."""
    token = await tab.locator("input[name=csrf]").first.get_attribute("value")
    assert token, "the page carries no CSRF token"
    return token
