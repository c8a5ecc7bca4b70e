from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

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
