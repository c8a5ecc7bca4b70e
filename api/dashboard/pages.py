"""The dashboard's pages and actions, at /dashboard: server-rendered HTML, one small script
for the live sections, nothing fetched from elsewhere.

What a viewer sees is what its key sees in the JSON API: a tenant's key its own tenant, an
operator's key every tenant (and may narrow the view with `tenant:`). Another tenant's job,
item or dead letter is a 404, never a 403: its existence is not confirmed. A read-only key
gets the pages without their buttons, and 403 for an action it posts anyway."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from api.dashboard import session
from api.dashboard.live import LiveSnapshots
from api.dashboard.render import fragment, templates
from api.dashboard.session import ActingViewerDep, Viewer, ViewerDep
from api.routes.jobs import attempt_fields
from pipeline import actions, aggregates, dead_letter_search, job_search, jobs
from pipeline.db import Q
from pipeline.errors import BadInput, Forbidden, NotFound, Unauthorized
from pipeline.memory.upkeep import runs
from pipeline.providers import usage
from pipeline.settings import Settings

router = APIRouter(prefix="/dashboard", include_in_schema=False)
MAX_LOGIN_KEY_CHARS = 512
STREAM_MAX_S = 120


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def lost_after_s(settings: Settings) -> float:
    return 3 * settings.worker_heartbeat_s


def live_snapshots(settings: Settings, pool: Any) -> LiveSnapshots:
    """The app's one hub: the overview snapshot of a view, with its two live fragments."""

    async def compute(view: int | None) -> dict[str, Any]:
        snap = await aggregates.overview(pool, view, lost_after_s=lost_after_s(settings))
        return {"snap": snap}

    return LiveSnapshots(compute, refresh_s=settings.dashboard_refresh_s)


def _render_live(name: str, frame: dict[str, Any], viewer: Viewer, settings: Settings) -> str:
    return fragment(f"_{name}.html", viewer=viewer, **_live_context(frame, settings))


def _page(request: Request, template: str, viewer: Viewer | None, *, section: str = "",
          title: str = "", status_code: int = 200, **context: Any) -> HTMLResponse:
    scope = ("all tenants" if viewer is not None and viewer.operator
             else f"tenant {viewer.tenant_name}" if viewer is not None else "")
    return templates.TemplateResponse(
        request, template,
        {"viewer": viewer, "section": section, "title": title or section,
         "scope_label": scope, "stream_url": None, "result": _note(request), **context},
        status_code=status_code, headers={"Cache-Control": "no-store"},
    )


# After an action the browser is sent on (303) to the page it acted on, which says what was
# done: a reload then reloads that page rather than posting the action again. The message is
# chosen by a code from this table; only counts and a known kind travel in the URL.
NOTES = {
    "retried": "Queued again with a fresh budget of attempts.",
    "cancelled": "Cancelled, with the jobs waiting on it.",
    "replayed": "Queued again with a fresh budget of attempts.",
    "bulk": "Replayed {n}.",
    "paused": "Workers no longer take {kind} jobs; they wait in the ledger.",
    "already-paused": "{kind} was paused already.",
    "resumed": "{kind} jobs run again; the queued ones are delivered at the next sweep.",
    "not-paused": "{kind} was not paused.",
}


def _note(request: Request) -> str | None:
    code = request.query_params.get("done")
    if code not in NOTES:
        return None
    kind = request.query_params.get("kind", "")
    values = {"n": request.query_params.get("n", "0"),
              "kind": kind if kind in jobs.KINDS else "the kind"}
    if not values["n"].isdigit():
        values["n"] = "0"
    note = NOTES[code].format(**values)
    skipped = request.query_params.get("skipped", "0")
    if code == "bulk" and skipped.isdigit() and int(skipped):
        note += (f" Skipped {int(skipped)}: replayed, retried or deleted since they were "
                 "counted.")
    return note


def _done(target: str, code: str, **params: str | int) -> RedirectResponse:
    query = urlencode({"done": code, **params})
    return RedirectResponse(f"{target}?{query}", status_code=303)


# --- sign-in ----------------------------------------------------------------------------

@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str = "/dashboard") -> HTMLResponse:
    return _page(request, "login.html", None, title="Sign in", next=_safe_next(next))


def _safe_next(target: str) -> str:
    """Only a path of this dashboard: never an address elsewhere (an open redirect)."""
    if target.startswith("/dashboard") and not target.startswith("//") and "\\" not in target:
        return target
    return "/dashboard"


@router.post("/login")
async def login(request: Request) -> Response:
    form = await request.form()
    key, target = form.get("key"), form.get("next")
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_LOGIN_KEY_CHARS:
        return _page(request, "login.html", None, title="Sign in", status_code=401,
                     notice="Type an API key.", notice_kind="bad", next="/dashboard")
    settings: Settings = _settings(request)
    try:
        token = await session.sign_in(request.app.state.pool, key,
                                      ttl_s=settings.dashboard_session_hours * 3600)
    except Unauthorized:
        return _page(request, "login.html", None, title="Sign in", status_code=401,
                     notice="That key is not valid or was revoked.", notice_kind="bad",
                     next=_safe_next(target if isinstance(target, str) else "/dashboard"))
    except Forbidden as exc:
        return _page(request, "login.html", None, title="Sign in", status_code=403,
                     notice=exc.message, notice_kind="bad",
                     next=_safe_next(target if isinstance(target, str) else "/dashboard"))
    response = RedirectResponse(
        _safe_next(target if isinstance(target, str) else "/dashboard"), status_code=303)
    response.set_cookie(
        session.COOKIE, token, max_age=int(settings.dashboard_session_hours * 3600),
        path=session.COOKIE_PATH, httponly=True, samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request, viewer: ActingViewerDep) -> Response:
    await session.sign_out(request.app.state.pool, request.cookies.get(session.COOKIE))
    response = RedirectResponse("/dashboard/login", status_code=303)
    response.delete_cookie(session.COOKIE, path=session.COOKIE_PATH)
    return response


# --- overview, workers and the live stream ------------------------------------------------

async def _view(request: Request, viewer: Viewer, tenant: str | None) -> int | None:
    """The tenant a page shows: the key's own; an operator may pick one by `?tenant=`."""
    if not viewer.operator or not tenant:
        return viewer.view_tenant
    return await job_search.resolve_tenant(request.app.state.pool,
                                           job_search.JobQuery(tenant=tenant), None)


@router.get("", response_class=HTMLResponse)
async def overview(request: Request, viewer: ViewerDep, tenant: str | None = None,
                   ) -> HTMLResponse:
    view = await _view(request, viewer, tenant)
    frame = await request.app.state.live.current(view)
    settings = _settings(request)
    stream = "/dashboard/stream?page=overview" + (f"&tenant={view}" if tenant else "")
    return _page(request, "overview.html", viewer, section="Overview",
                 stream_url=stream, **_live_context(frame, settings))


def _live_context(frame: dict[str, Any], settings: Settings) -> dict[str, Any]:
    snap = frame["snap"]
    return {"snap": snap, "states": aggregates.STATES,
            "timings": {t.kind: t for t in snap.hour_timings},
            "lost_after_s": lost_after_s(settings)}


@router.get("/workers", response_class=HTMLResponse)
async def workers(request: Request, viewer: ViewerDep) -> HTMLResponse:
    frame = await request.app.state.live.current(viewer.view_tenant)
    return _page(request, "workers.html", viewer, section="Workers",
                 stream_url="/dashboard/stream?page=workers",
                 **_live_context(frame, _settings(request)))


@router.get("/stream")
async def stream(
    request: Request, viewer: ViewerDep,
    page: Annotated[str, Query(pattern="^(overview|workers)$")] = "overview",
    interval: Annotated[float, Query(ge=0.2, le=600)] = 2.0,
    tenant: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> StreamingResponse:
    """Server-sent events: the page's live section, rendered from the view's shared
    snapshot, every `interval` seconds (no more often than the server computes it)."""
    settings = _settings(request)
    view = tenant if viewer.operator and tenant else viewer.view_tenant
    hub: LiveSnapshots = request.app.state.live

    async def events() -> AsyncIterator[str]:
        yield f"retry: {int(max(interval, settings.dashboard_refresh_s) * 1000)}\n\n"
        # A stream ends after a few minutes and the browser opens a new one: an open tab
        # never holds a stopping server for long, nor a session past its revocation.
        ends = time.monotonic() + STREAM_MAX_S
        async for frame in hub.subscribe(view, interval):
            if await request.is_disconnected() or time.monotonic() > ends:
                return
            html = _render_live(page, frame.payload, viewer, settings)
            data = "\n".join(f"data: {line}" for line in html.splitlines())
            # The id is the snapshot's number in its view: equal ids, one computation.
            yield f"id: {frame.version}\nevent: {page}\n{data}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


# --- jobs ---------------------------------------------------------------------------------

@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(request: Request, viewer: ViewerDep, q: str = "",
                    cursor: str | None = None) -> HTMLResponse:
    query = job_search.parse(q)
    page = await job_search.search(
        request.app.state.pool, query, tenant_id=viewer.view_tenant,
        cursor=job_search.Cursor.decode(cursor) if cursor else None)
    return _page(request, "jobs.html", viewer, section="Jobs", q=q, page=page, cursor=cursor)


async def _tenant_name(request: Request, tenant_id: int) -> str:
    return await request.app.state.pool.fetchval(Q["dashboard.tenant_name"], tenant_id) or ""


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(request: Request, job_id: uuid.UUID, viewer: ViewerDep) -> HTMLResponse:
    pool = request.app.state.pool
    tenant_id = await actions.job_tenant(pool, viewer.principal, job_id, across=True)
    job = await pool.fetchrow(Q["jobs.get"], tenant_id, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id}")
    attempts = await pool.fetch(Q["dashboard.full_attempts"], job_id)
    dependents = await pool.fetch(Q["dashboard.dependents"], job_id)
    state = "retrying" if job["status"] == "queued" and job["last_error"] else job["status"]
    return _page(
        request, "job.html", viewer, section="Jobs", title=f"Job {str(job_id)[:8]}",
        job={**dict(job), "state": state},
        attempts=[attempt_fields(a, viewer.principal) for a in attempts],
        dependents=dependents, payload=json.dumps(job["payload"], indent=2, sort_keys=True),
        tenant_name=await _tenant_name(request, tenant_id))


@router.post("/jobs/{job_id}/retry")
async def retry(request: Request, job_id: uuid.UUID, viewer: ActingViewerDep) -> Response:
    settings = _settings(request)
    ref = await actions.retry(request.app.state.pool, viewer.principal, job_id,
                              fresh_attempts=settings.max_attempts_for, via="dashboard")
    await jobs.enqueue(request.app.state.pool, request.app.state.queue, [ref],
                       queue_name=settings.queue_name)
    return _done(f"/dashboard/jobs/{job_id}", "retried")


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: uuid.UUID, viewer: ActingViewerDep) -> Response:
    await actions.cancel(request.app.state.pool, viewer.principal, job_id, via="dashboard")
    return _done(f"/dashboard/jobs/{job_id}", "cancelled")


# --- items --------------------------------------------------------------------------------

@router.get("/items/{item_id}", response_class=HTMLResponse)
async def item_page(
    request: Request, item_id: str, viewer: ViewerDep,
    tenant: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> HTMLResponse:
    """The item's way through the pipeline: each version's stages with their states,
    attempts, durations and errors, newest version first."""
    pool = request.app.state.pool
    tenant_id = tenant if viewer.operator and tenant else viewer.principal.tenant_id
    item = await pool.fetchrow(Q["items.get_item"], tenant_id, item_id)
    if item is None:
        raise NotFound(f"no item {item_id!r}")
    timeline: dict[int, list[Any]] = {}
    for row in await pool.fetch(Q["dashboard.item_jobs"], tenant_id, item_id):
        timeline.setdefault(row["version"] or 0, []).append(row)
    versions = await pool.fetch(Q["versions.list"], tenant_id, item_id)
    return _page(request, "item.html", viewer, section="Jobs", title=f"Item {item_id}",
                 item=item, timeline=list(timeline.items()), versions=versions,
                 tenant_name=await _tenant_name(request, tenant_id))


# --- dead letters -------------------------------------------------------------------------

@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters_page(
    request: Request, viewer: ViewerDep, q: str = "",
    cursor: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> HTMLResponse:
    page = await dead_letter_search.search(request.app.state.pool, dead_letter_search.parse(q),
                                           tenant_id=viewer.view_tenant, cursor=cursor)
    return _page(request, "dead_letters.html", viewer, section="Dead letters", q=q, page=page,
                 cursor=cursor, waiting=page.waiting)


@router.get("/dead-letters/{dead_letter_id}", response_class=HTMLResponse)
async def dead_letter_page(
    request: Request, dead_letter_id: int, viewer: ViewerDep,
) -> HTMLResponse:
    pool = request.app.state.pool
    _check_id(dead_letter_id)
    tenant_id = await actions.dead_letter_tenant(pool, viewer.principal, dead_letter_id,
                                                 across=True)
    dead = await pool.fetchrow(Q["dead_letters.get"], tenant_id, dead_letter_id)
    if dead is None:
        raise NotFound(f"no dead letter with id {dead_letter_id}")
    job = await pool.fetchrow(Q["jobs.get"], tenant_id, dead["job_id"])
    attempts = await pool.fetch(Q["dashboard.full_attempts"], dead["job_id"])
    return _page(request, "dead_letter.html", viewer, section="Dead letters",
                 title=f"Dead letter {dead_letter_id}", dead=dead,
                 job_state=job["status"] if job else "gone",
                 attempts=[attempt_fields(a, viewer.principal) for a in attempts],
                 payload=json.dumps(dead["payload"], indent=2, sort_keys=True),
                 tenant_name=await _tenant_name(request, tenant_id))


def _check_id(value: int) -> None:
    if not 1 <= value < 2**63:
        raise NotFound(f"no dead letter with id {value}")


@router.post("/dead-letters/{dead_letter_id}/replay")
async def replay_one(request: Request, dead_letter_id: int, viewer: ActingViewerDep,
                     ) -> Response:
    _check_id(dead_letter_id)
    settings = _settings(request)
    refs = await actions.replay_one(request.app.state.pool, viewer.principal, dead_letter_id,
                                    fresh_attempts=settings.max_attempts_for, via="dashboard")
    await jobs.enqueue(request.app.state.pool, request.app.state.queue, refs,
                       queue_name=settings.queue_name)
    return _done(f"/dashboard/dead-letters/{dead_letter_id}", "replayed")


async def _form_text(request: Request, name: str) -> str:
    value = (await request.form()).get(name)
    return value if isinstance(value, str) else ""


@router.post("/dead-letters/preview", response_class=HTMLResponse)
async def replay_preview(request: Request, viewer: ActingViewerDep) -> HTMLResponse:
    """Step one of a bulk replay: count exactly what it would touch, and keep that list."""
    q = await _form_text(request, "q")
    query = dead_letter_search.parse(q)
    pool = request.app.state.pool
    rows, truncated = await dead_letter_search.replayable(pool, query,
                                                          tenant_id=viewer.view_tenant)
    if not rows:
        raise BadInput("no dead letter that matches is waiting for a replay")
    preview = await actions.preview_replay(pool, viewer.principal, rows,
                                           tenant_id=viewer.view_tenant,
                                           filter={"q": q}, truncated=truncated)
    return _page(request, "replay_preview.html", viewer, section="Dead letters",
                 title="Replay?", preview=preview, q=q, limit=dead_letter_search.MAX_REPLAY)


@router.post("/dead-letters/replay")
async def replay_confirmed(request: Request, viewer: ActingViewerDep) -> Response:
    """Step two: replay what the preview counted; report what changed in between."""
    try:
        preview_id = uuid.UUID(await _form_text(request, "preview"))
    except ValueError:
        raise BadInput("the form names no replay preview") from None
    settings = _settings(request)
    result = await actions.confirm_replay(request.app.state.pool, viewer.principal, preview_id,
                                          fresh_attempts=settings.max_attempts_for,
                                          via="dashboard")
    await jobs.enqueue(request.app.state.pool, request.app.state.queue, result.replayed,
                       queue_name=settings.queue_name)
    return _done("/dashboard/dead-letters", "bulk", n=len(result.replayed),
                 skipped=result.skipped)


# --- queues, providers, actions -------------------------------------------------------------

@router.get("/queues", response_class=HTMLResponse)
async def queues_page(request: Request, viewer: ViewerDep) -> HTMLResponse:
    frame = await request.app.state.live.current(viewer.view_tenant)
    providers = await usage.provider_summary(request.app.state.pool, viewer.view_tenant)
    return _page(request, "queues.html", viewer, section="Queues", snap=frame["snap"],
                 kinds=jobs.KINDS, providers=providers, settings=_settings(request),
                 now=datetime.now(UTC))


@router.post("/queues/{kind}/{action}")
async def pause_or_resume(request: Request, kind: str, action: str,
                          viewer: ActingViewerDep) -> Response:
    pool = request.app.state.pool
    if action == "pause":
        changed = await actions.pause(pool, viewer.principal, kind, via="dashboard")
        code = "paused" if changed else "already-paused"
    elif action == "resume":
        changed = await actions.resume(pool, viewer.principal, kind, via="dashboard")
        code = "resumed" if changed else "not-paused"
    else:
        raise NotFound(f"no action {action!r}: pause or resume")
    return _done("/dashboard/queues", code, kind=kind)


@router.get("/providers", response_class=HTMLResponse)
async def providers_page(request: Request, viewer: ViewerDep) -> HTMLResponse:
    providers = await usage.provider_summary(request.app.state.pool, viewer.view_tenant)
    return _page(request, "providers.html", viewer, section="Providers", providers=providers)


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request, viewer: ViewerDep) -> HTMLResponse:
    entries = await request.app.state.pool.fetch(Q["dashboard.audit_list"], viewer.view_tenant,
                                                 200)
    return _page(request, "audit.html", viewer, section="Actions", entries=entries)


# --- memory upkeep ------------------------------------------------------------------------

CHANGES_SHOWN = 500


@router.get("/memory-runs", response_class=HTMLResponse)
async def memory_runs_page(request: Request, viewer: ViewerDep) -> HTMLResponse:
    """Consolidation and prune runs with each step's counts, newest first."""
    rows = await request.app.state.pool.fetch(Q["upkeep.dashboard_runs"], viewer.view_tenant,
                                              200)
    listed = [{**runs.describe(r), "tenant_name": r["tenant_name"]} for r in rows]
    return _page(request, "memory_runs.html", viewer, section="Memory", runs=listed)


@router.get("/memory-runs/{run_id}", response_class=HTMLResponse)
async def memory_run_page(request: Request, run_id: uuid.UUID, viewer: ViewerDep) -> HTMLResponse:
    """One run: its counts, its undo, and the changes it recorded (the first 500)."""
    pool = request.app.state.pool
    tenant_id = await pool.fetchval(Q["upkeep.dashboard_run_tenant"], run_id, viewer.view_tenant)
    if tenant_id is None:
        raise NotFound(f"no upkeep run {run_id}")
    run = await runs.get(pool, tenant_id, run_id)
    changes = await pool.fetch(Q["upkeep.changes_page"], tenant_id, run_id, None, 0,
                               CHANGES_SHOWN)
    total = sum(n for by_action in run["changes"].values() for n in by_action.values())
    return _page(request, "memory_run.html", viewer, section="Memory",
                 title=f"Upkeep run {str(run_id)[:8]}", run=run, changes=changes,
                 shown=len(changes), total=total,
                 tenant_name=await _tenant_name(request, tenant_id))
