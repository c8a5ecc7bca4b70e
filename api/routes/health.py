from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pipeline import readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    """The one endpoint without a key: says whether Postgres and Redis answer."""
    state = request.app.state
    checks: dict[str, bool] = {}
    try:
        checks["database"] = await state.pool.fetchval("SELECT true")
    except Exception:  # noqa: BLE001 - a health check reports failures, it does not raise
        checks["database"] = False
    try:
        checks["redis"] = bool(await state.queue.ping())
    except Exception:  # noqa: BLE001
        checks["redis"] = False
    healthy = all(checks.values())
    return JSONResponse(
        {"status": "ok" if healthy else "degraded", **checks}, status_code=200 if healthy else 503
    )


@router.get(
    "/readyz",
    responses={503: {"description": "Something memmill needs to do work is missing; the body "
                                    "names it (the same fields as 200)."}},
)
async def readyz(request: Request) -> JSONResponse:
    """Ready to do work: the database and Redis answer, the schema's migrations are all
    applied and at least one worker of this queue has a fresh heartbeat. Without a key, like
    `/healthz`; it says how many workers live, never which."""
    state = request.app.state
    settings = state.settings
    report = await readiness.check(
        state.pool, state.queue.ping, queue_name=settings.queue_name,
        alive_window_s=3 * settings.worker_heartbeat_s,
    )
    return JSONResponse(report, status_code=200 if report["ready"] else 503)
