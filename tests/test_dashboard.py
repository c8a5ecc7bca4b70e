"""The dashboard over real HTTP, real Postgres and real workers: sign-in and its cookie, every
page for a tenant and an operator, the search qualifiers, actions with their CSRF token and
audit record, read-only keys, another tenant's ids, the two-step bulk replay, pause and
resume, and live snapshots shared between streams."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from arq import create_pool
from arq.connections import RedisSettings

from pipeline import tenants
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from tests.conftest import drain
from tests.test_jobs_api import FAULT, _item_with_probe, probe_task  # noqa: F401 - fixture

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def sign_in(api_url: str, key: str) -> httpx.AsyncClient:
    """A browser-like client: it keeps the cookie and follows an action's redirect."""
    client = httpx.AsyncClient(base_url=api_url, timeout=30, follow_redirects=True)
    response = await client.post("/dashboard/login", data={"key": key, "next": "/dashboard"},
                                 follow_redirects=False)
    assert response.status_code == 303, response.text
    return client


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "the page carries no CSRF token"
    return match.group(1)


@pytest.fixture
async def operator_key(pool: asyncpg.Pool, tenant: tuple[int, str]) -> str:
    key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], key, name="ops", role="operator")
    return key


@pytest.fixture
async def viewer_key(pool: asyncpg.Pool, tenant: tuple[int, str]) -> str:
    key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], key, name="watcher", role="read")
    return key


@pytest.fixture
async def browser(api_url: str, tenant: tuple[int, str]) -> AsyncIterator[httpx.AsyncClient]:
    client = await sign_in(api_url, tenant[1])
    yield client
    await client.aclose()


async def _dead_jobs(pool: asyncpg.Pool, settings: Settings, tenant_id: int, n: int,
                     mode: str = "permanent") -> list[str]:
    FAULT["mode"] = mode
    ids = [await _item_with_probe(pool, settings, tenant_id, f"doc-{uuid.uuid4().hex[:6]}")
           for _ in range(n)]
    await drain(settings, pool)
    FAULT["mode"] = None
    return ids


async def test_sign_in_sets_a_strict_http_only_cookie_and_pages_need_it(
    api_url: str, tenant: tuple[int, str]
) -> None:
    async with httpx.AsyncClient(base_url=api_url) as anonymous:
        page = await anonymous.get("/dashboard/jobs?q=kind:embed")
        assert page.status_code == 303
        assert page.headers["location"] == (
            "/dashboard/login?next=/dashboard/jobs%3Fq%3Dkind%3Aembed")
        assert (await anonymous.get("/dashboard/login")).status_code == 200
        wrong = await anonymous.post("/dashboard/login", data={"key": "mm_" + "x" * 40})
        assert wrong.status_code == 401 and "not valid" in wrong.text
        assert "set-cookie" not in wrong.headers
        # Only a dashboard path is followed after sign-in: never another site.
        away = await anonymous.post("/dashboard/login",
                                    data={"key": tenant[1], "next": "https://evil.example/"})
        assert away.headers["location"] == "/dashboard"
        cookie = away.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/dashboard" in cookie
        # A forged cookie is no session.
        anonymous.cookies.set("memmill_dashboard", "forged", path="/dashboard")
        assert (await anonymous.get("/dashboard")).status_code == 303


async def test_every_page_renders_for_a_tenant(
    browser: httpx.AsyncClient, pool: asyncpg.Pool, settings: Settings,
    tenant: tuple[int, str],
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, tenant[0], 1, mode="crash")
    dead_id = await pool.fetchval("SELECT id FROM dead_letters")
    item_id = await pool.fetchval("SELECT item_id FROM jobs WHERE id = $1", uuid.UUID(job_id))
    for path in ("/dashboard", "/dashboard/jobs", "/dashboard/dead-letters",
                 "/dashboard/workers", "/dashboard/queues", "/dashboard/providers",
                 "/dashboard/audit", f"/dashboard/jobs/{job_id}",
                 f"/dashboard/dead-letters/{dead_id}", f"/dashboard/items/{item_id}"):
        page = await browser.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        assert page.headers["content-type"].startswith("text/html")
    # A provider that is being rate-limited shows as such on the queues page.
    await pool.execute("INSERT INTO provider_limits (provider, model, last_limited_at, "
                       "limited_until) VALUES ('openai', 'gpt-x', now(), now() + "
                       "interval '1 minute')")
    await pool.execute("INSERT INTO provider_calls (tenant_id, provider, model, grain, period, "
                       "calls, errors_429) VALUES ($1, 'openai', 'gpt-x', 'hour', "
                       "date_trunc('hour', now(), 'UTC'), 3, 1)", tenant[0])
    queues = await browser.get("/dashboard/queues")
    assert queues.status_code == 200 and "s-limited" in queues.text
    job_page = (await browser.get(f"/dashboard/jobs/{job_id}")).text
    assert "ZeroDivisionError" in job_page or "division by zero" in job_page
    assert "Traceback" in job_page
    item_page = (await browser.get(f"/dashboard/items/{item_id}")).text
    for stage in ("analyze", "embed", "probe"):
        assert stage in item_page


async def test_job_search_qualifiers(
    browser: httpx.AsyncClient, pool: asyncpg.Pool, settings: Settings,
    tenant: tuple[int, str],
) -> None:
    await _dead_jobs(pool, settings, tenant[0], 2)
    dead = await browser.get("/dashboard/jobs", params={"q": 'status:dead error:"no xref"'})
    assert dead.status_code == 200
    assert re.search(r"<strong>2</strong> jobs match", dead.text), dead.text
    none = await browser.get("/dashboard/jobs", params={"q": "status:dead error:nothing-like-it"})
    assert re.search(r"<strong>0</strong> jobs match", none.text)
    done = await browser.get("/dashboard/jobs", params={"q": "kind:analyze status:done"})
    assert re.search(r"<strong>2</strong> jobs match", done.text)
    for bad, says in (("kind:nope", "kind:nope is not known"),
                      ("status:sleeping", "status:sleeping is not known"),
                      ("after:yesterday", "after: wants a date"),
                      ('error:"open', "unmatched quote"), ("id:123", "not a job id")):
        page = await browser.get("/dashboard/jobs", params={"q": bad})
        assert page.status_code == 422, bad
        assert says in page.text, (bad, page.text[:300])
    assert (await browser.get("/dashboard/jobs", params={"cursor": "junk"})).status_code == 422


async def test_retry_needs_the_csrf_token_and_is_audited(
    browser: httpx.AsyncClient, pool: asyncpg.Pool, settings: Settings,
    tenant: tuple[int, str],
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, tenant[0], 1)
    page = await browser.get(f"/dashboard/jobs/{job_id}")
    token = csrf_of(page.text)
    forged = await browser.post(f"/dashboard/jobs/{job_id}/retry", data={"csrf": "guess"})
    assert forged.status_code == 403
    missing = await browser.post(f"/dashboard/jobs/{job_id}/retry")
    assert missing.status_code == 403
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1",
                               uuid.UUID(job_id)) == "dead"
    done = await browser.post(f"/dashboard/jobs/{job_id}/retry", data={"csrf": token})
    assert done.status_code == 200, done.text
    # Sent on to the job's page (a reload does not post again), which says what was done.
    assert done.history[0].status_code == 303
    assert str(done.url).endswith(f"/dashboard/jobs/{job_id}?done=retried")
    assert "Queued again with a fresh budget of attempts." in done.text
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1",
                               uuid.UUID(job_id)) in ("queued", "running", "done")
    audit = await pool.fetchrow("SELECT * FROM audit_log")
    assert (audit["action"], audit["target"], audit["affected"], audit["via"]) == (
        "retry", job_id, 1, "dashboard")
    assert audit["key_name"] == "default" and audit["tenant_id"] == tenant[0]


async def test_read_only_key_sees_no_buttons_and_a_forged_post_is_refused(
    api_url: str, pool: asyncpg.Pool, settings: Settings, tenant: tuple[int, str],
    viewer_key: str,
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, tenant[0], 1)
    client = await sign_in(api_url, viewer_key)
    try:
        page = await client.get(f"/dashboard/jobs/{job_id}")
        assert page.status_code == 200
        assert page.text.count("<button") == 1  # only "Sign out"
        token = csrf_of(page.text)  # the sign-out form's: a valid token still acts on nothing
        for path in (f"/dashboard/jobs/{job_id}/retry", "/dashboard/queues/embed/pause",
                     "/dashboard/dead-letters/1/replay"):
            refused = await client.post(path, data={"csrf": token})
            assert refused.status_code == 403, path
        dead = await client.get("/dashboard/dead-letters")
        assert "Replay" not in dead.text
    finally:
        await client.aclose()
    # The JSON API refuses it too, before reading the body, and still lets it read.
    headers = {"Authorization": f"Bearer {viewer_key}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers) as api:
        assert (await api.post(f"/v1/jobs/{job_id}/retry")).status_code == 403
        put = await api.post("/v1/items", json={"id": "x", "content": "y"})
        assert put.status_code == 403 and "read-only" in put.json()["detail"]
        assert (await api.get(f"/v1/jobs/{job_id}")).status_code == 200
        assert (await api.post("/v1/search", json={"query": "probe"})).status_code == 200
    assert await pool.fetchval("SELECT count(*) FROM audit_log") == 0


async def test_another_tenants_ids_are_not_found(
    api_url: str, pool: asyncpg.Pool, settings: Settings, tenant: tuple[int, str],
    other_tenant: tuple[int, str], operator_key: str,
) -> None:
    (job_id,) = await _dead_jobs(pool, settings, other_tenant[0], 1)
    dead_id = await pool.fetchval("SELECT id FROM dead_letters")
    item_id = await pool.fetchval("SELECT item_id FROM jobs WHERE id = $1", uuid.UUID(job_id))
    client = await sign_in(api_url, tenant[1])
    try:
        token = csrf_of((await client.get("/dashboard")).text)
        for path in (f"/dashboard/jobs/{job_id}", f"/dashboard/dead-letters/{dead_id}",
                     f"/dashboard/items/{item_id}",
                     f"/dashboard/items/{item_id}?tenant={other_tenant[0]}"):
            assert (await client.get(path)).status_code == 404, path
        assert (await client.post(f"/dashboard/jobs/{job_id}/retry",
                                  data={"csrf": token})).status_code == 404
        listing = await client.get("/dashboard/jobs", params={"q": f"id:{job_id}"})
        assert re.search(r"<strong>0</strong> jobs match", listing.text)
        assert f"/dashboard/jobs/{job_id}" not in listing.text
        overview = (await client.get("/dashboard")).text
        assert 'data-testid="count-dead">0<' in overview
    finally:
        await client.aclose()
    # The operator sees it, and the tenant's name beside it.
    ops = await sign_in(api_url, operator_key)
    try:
        page = await ops.get(f"/dashboard/jobs/{job_id}")
        assert page.status_code == 200 and "other" in page.text
        narrowed = await ops.get("/dashboard/jobs", params={"q": "tenant:other status:dead"})
        assert re.search(r"<strong>1</strong> job matches", narrowed.text)
        unknown = await ops.get("/dashboard/jobs", params={"q": "tenant:nobody"})
        assert unknown.status_code == 422
    finally:
        await ops.aclose()


async def test_bulk_replay_counts_first_and_skips_what_changed_in_between(
    browser: httpx.AsyncClient, pool: asyncpg.Pool, settings: Settings,
    tenant: tuple[int, str], http: httpx.AsyncClient,
) -> None:
    await _dead_jobs(pool, settings, tenant[0], 3)
    q = 'error:"no xref"'
    listing = await browser.get("/dashboard/dead-letters", params={"q": q})
    assert re.search(r"<strong>3</strong> of them waiting", listing.text), listing.text
    token = csrf_of(listing.text)
    preview = await browser.post("/dashboard/dead-letters/preview",
                                 data={"csrf": token, "q": q})
    assert preview.status_code == 200, preview.text
    assert "exactly <strong>3</strong> dead letters" in preview.text
    preview_id = re.search(r'name="preview" value="([^"]+)"', preview.text).group(1)
    # Meanwhile someone replays one of them through the API, and a new one dies.
    first = await pool.fetchval("SELECT min(id) FROM dead_letters")
    assert (await http.post(f"/v1/dead-letters/{first}/replay")).status_code == 200
    await drain(settings, pool)
    FAULT["mode"] = "permanent"
    await _dead_jobs(pool, settings, tenant[0], 1)
    replayed_before = await pool.fetchval(
        "SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL")
    done = await browser.post("/dashboard/dead-letters/replay",
                              data={"csrf": token, "preview": preview_id})
    assert done.status_code == 200, done.text
    assert "Replayed 2." in done.text and "Skipped 1" in done.text
    after = await pool.fetchval("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL")
    assert after == replayed_before + 2  # not the one that died after the count
    again = await browser.post("/dashboard/dead-letters/replay",
                               data={"csrf": token, "preview": preview_id})
    assert again.status_code == 404  # a preview acts once
    audit = await pool.fetchrow(
        "SELECT * FROM audit_log WHERE via = 'dashboard' AND action = 'replay'")
    assert (audit["affected"], audit["skipped"], audit["filter"]) == (2, 1, {"q": q})


async def test_pause_and_resume_are_an_operators_and_stop_claims(
    api_url: str, pool: asyncpg.Pool, settings: Settings, tenant: tuple[int, str],
    operator_key: str, browser: httpx.AsyncClient,
) -> None:
    token = csrf_of((await browser.get("/dashboard/queues")).text)
    refused = await browser.post("/dashboard/queues/analyze/pause", data={"csrf": token})
    assert refused.status_code == 403 and "operator" in refused.text
    ops = await sign_in(api_url, operator_key)
    try:
        page = await ops.get("/dashboard/queues")
        ops_token = csrf_of(page.text)
        assert (await ops.post("/dashboard/queues/analyze/pause",
                               data={"csrf": ops_token})).status_code == 200
        assert (await ops.post("/dashboard/queues/nonsense/pause",
                               data={"csrf": ops_token})).status_code == 404
        await _item_with_probe(pool, settings, tenant[0], "held")
        worker_settings = settings
        from workers.main import build_worker

        worker = build_worker(worker_settings, burst=True, sweep=False, poll_delay_s=0)
        try:
            await worker.main()
        finally:
            await worker.close()
        assert await pool.fetchval(
            "SELECT status FROM jobs WHERE item_id = 'held' AND kind = 'analyze'") == "queued"
        assert "paused" in (await ops.get("/dashboard/queues")).text
        assert (await ops.post("/dashboard/queues/analyze/resume",
                               data={"csrf": ops_token})).status_code == 200
        # The resume hands the held jobs back to the sweeper.
        from pipeline.sweeper import sweep_once

        queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
        try:
            await sweep_once(pool, queue, settings.model_copy(update={"enqueue_grace_s": 0}))
        finally:
            await queue.aclose()
        await drain(settings, pool)
        assert await pool.fetchval(
            "SELECT status FROM jobs WHERE item_id = 'held' AND kind = 'analyze'") == "done"
    finally:
        await ops.aclose()
    actions = await pool.fetch("SELECT action, target, key_name, tenant_id FROM audit_log "
                               "ORDER BY id")
    assert [(a["action"], a["target"], a["key_name"], a["tenant_id"]) for a in actions] == [
        ("pause", "analyze", "ops", None), ("resume", "analyze", "ops", None)]


async def _read_events(client: httpx.AsyncClient, n: int, path: str
                       ) -> list[tuple[int, str]]:
    """The first `n` events of a stream: (id, data)."""
    events = []
    async with client.stream("GET", path) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event_id, data = 0, []
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and data:
                events.append((event_id, "\n".join(data)))
                data = []
                if len(events) == n:
                    break
    return events


async def test_live_stream_updates_and_is_shared_between_tabs(
    browser: httpx.AsyncClient, http: httpx.AsyncClient,
) -> None:
    ((_, first),) = await _read_events(browser, 1, "/dashboard/stream?page=overview")
    assert 'data-testid="count-waiting">0<' in first
    assert (await http.post("/v1/items", json={"id": "live", "content": "Hello"})).status_code \
        == 202
    # No worker runs: the new item's jobs wait in the ledger, and the stream says so.
    seen = await _read_events(browser, 3, "/dashboard/stream?page=overview&interval=0.2")
    assert any('data-testid="count-waiting">0<' not in data for _, data in seen)
    # Twenty tabs at once get the same snapshots, computed once per interval for all of
    # them: a handful of distinct snapshot numbers, not one per tab.
    streams = await asyncio.gather(*(_read_events(browser, 2, "/dashboard/stream?page=workers")
                                     for _ in range(20)))
    ids = {event_id for events in streams for event_id, _ in events}
    assert len(ids) <= 4, ids
    bad = await browser.get("/dashboard/stream?page=secrets")
    assert bad.status_code == 422


async def test_keys_made_by_the_cli_carry_their_role(
    api_url: str, pool: asyncpg.Pool, operator_key: str,
) -> None:
    from tests.test_jobs_api import _cli

    code, out = await _cli(api_url, operator_key, "tenants", "create", "acme")
    assert code == 0, out
    code, out = await _cli(api_url, operator_key, "keys", "create", "--tenant", "acme",
                           "--name", "night-shift", "--role", "read")
    assert code == 0, out
    key = out.strip().splitlines()[-1]
    assert key.startswith("mm_")
    row = await pool.fetchrow("SELECT k.role, k.read_only, k.name, t.name AS tenant "
                              "FROM api_keys k JOIN tenants t ON t.id = k.tenant_id "
                              "WHERE k.name = 'night-shift'")
    assert dict(row) == {"role": "read", "read_only": True, "name": "night-shift",
                         "tenant": "acme"}
    client = await sign_in(api_url, key)
    try:
        who = (await client.get("/dashboard")).text
        assert "key night-shift · tenant acme · read-only" in who
    finally:
        await client.aclose()
    # A key bound to an agent cannot open the dashboard: it shows the whole tenant's jobs.
    code, out = await _cli(api_url, operator_key, "keys", "create", "--tenant", "acme",
                           "--name", "bot", "--role", "read", "--agent-id", "bot-1")
    bound = out.strip().splitlines()[-1]
    async with httpx.AsyncClient(base_url=api_url) as browser:
        refused = await browser.post("/dashboard/login", data={"key": bound})
    assert refused.status_code == 403 and "bound" in refused.text


async def test_queues_api_and_cli_pause_for_operators_only(
    api_url: str, http: httpx.AsyncClient, pool: asyncpg.Pool, operator_key: str,
) -> None:
    from tests.test_jobs_api import _cli

    refused = await http.post("/v1/queues/embed/pause")
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]
    ops = {"Authorization": f"Bearer {operator_key}"}
    first = await http.post("/v1/queues/embed/pause", headers=ops)
    assert first.json() == {"kind": "embed", "paused": True, "changed": True}
    again = await http.post("/v1/queues/embed/pause", headers=ops)
    assert again.json()["changed"] is False
    assert (await http.post("/v1/queues/nonsense/pause", headers=ops)).status_code == 422
    await http.post("/v1/items", json={"id": "q1", "content": "Queued while paused."})
    listed = {q["kind"]: q for q in (await http.get("/v1/queues")).json()["data"]}
    assert listed["embed"]["paused"] and not listed["analyze"]["paused"]
    assert listed["analyze"]["queued"] == 1 and listed["embed"]["waiting"] == 1
    code, out = await _cli(api_url, operator_key, "queues", "resume", "embed")
    assert (code, out.strip()) == (0, "embed resumed")
    code, out = await _cli(api_url, operator_key, "queues", "list")
    assert code == 0 and "embed" in out and "paused" not in out
    assert [r["action"] for r in await pool.fetch(
        "SELECT action FROM audit_log ORDER BY id")] == ["pause", "pause", "resume"]
