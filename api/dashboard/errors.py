"""Errors on dashboard paths are pages, not JSON: a person reads them. A page that needs a
session sends the browser to the sign-in form and back; an action without one is a 401."""

from __future__ import annotations

import asyncpg
from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from api.dashboard.render import templates
from api.dashboard.session import SignInRequired, viewer_of

PREFIX = "/dashboard"
HEADINGS = {401: "Sign in", 403: "Not allowed", 404: "Not found", 409: "Not possible now",
            413: "Too large", 422: "Cannot read that"}


def is_dashboard(request: Request) -> bool:
    return request.url.path == PREFIX or request.url.path.startswith(PREFIX + "/")


async def page(request: Request, status: int, message: str,
               exc: Exception | None = None) -> Response:
    if isinstance(exc, SignInRequired):
        if request.method in ("GET", "HEAD"):
            return RedirectResponse(exc.login_url, status_code=303)
        viewer = None
    else:  # a signed-in viewer keeps the navigation on an error page
        try:
            viewer = await viewer_of(request)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            viewer = None  # the error may be the database's: the page still answers
    return templates.TemplateResponse(
        request, "error.html",
        {"viewer": viewer, "title": "Error", "status": status, "stream_url": None,
         "heading": HEADINGS.get(status, "Error"), "message": message},
        status_code=status, headers={"Cache-Control": "no-store"},
    )
