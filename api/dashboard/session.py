"""Sign-in for the dashboard: an API key, typed once, becomes a session.

The browser holds a random token in an HttpOnly, SameSite=Strict cookie scoped to
/dashboard, so page scripts cannot read it and other sites cannot send it; the server keeps
only its SHA-256. Every action also carries the session's CSRF token (a form field or the
`X-CSRF-Token` header), compared in constant time. A session ends when it expires, when its
owner signs out, or at once when its key is revoked."""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote

import asyncpg
from fastapi import Depends, Request

from pipeline import tenants
from pipeline.db import Q
from pipeline.errors import Forbidden, MemmillError
from pipeline.tenants import Principal

COOKIE = "memmill_dashboard"
COOKIE_PATH = "/dashboard"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


class SignInRequired(MemmillError):
    """Sign in to see this page."""

    status_code = 401

    def __init__(self, next_path: str) -> None:
        super().__init__()
        self.next_path = next_path

    @property
    def login_url(self) -> str:
        return f"{COOKIE_PATH}/login?next={quote(self.next_path, safe='/')}"


@dataclass(frozen=True)
class Viewer:
    """Who looks at the dashboard: the key's principal, its tenant's name, and the session's
    CSRF token, which every form on the page carries back."""

    principal: Principal
    tenant_name: str
    csrf_token: str

    @property
    def operator(self) -> bool:
        return self.principal.operator

    @property
    def can_act(self) -> bool:
        return not self.principal.read_only

    @property
    def view_tenant(self) -> int | None:
        """The tenant the pages are confined to; None: an operator sees them all."""
        return None if self.principal.operator else self.principal.tenant_id

    @property
    def role(self) -> str:
        """The key's role as the header shows it; `read` says what it means."""
        return "read-only" if self.principal.read_only else self.principal.role


async def sign_in(pool: asyncpg.Pool, key: str, *, ttl_s: float) -> str:
    """A new session for a valid key; its token for the cookie. Unauthorized otherwise, and
    Forbidden for a key bound to a user or agent: the dashboard shows the whole tenant's jobs,
    which such a key must not read."""
    principal = await tenants.authenticate(pool, key.strip())
    if principal.bound:
        raise Forbidden("this key is bound to a user or an agent: the dashboard shows the "
                        "whole tenant's jobs, so it needs an unbound key")
    token = secrets.token_urlsafe(32)
    await pool.execute(Q["dashboard.purge_sessions"])
    await pool.execute(Q["dashboard.create_session"], tenants.hash_key(token),
                       principal.key_id, secrets.token_urlsafe(32), ttl_s)
    return token


async def sign_out(pool: asyncpg.Pool, token: str | None) -> None:
    if token:
        await pool.execute(Q["dashboard.end_session"], tenants.hash_key(token))


async def _viewer(pool: asyncpg.Pool, token: str | None) -> Viewer | None:
    if not token or len(token) > 256:
        return None
    row = await pool.fetchrow(Q["dashboard.session"], tenants.hash_key(token))
    if row is None:
        return None
    return Viewer(tenants.principal_of(row), row["tenant_name"], row["csrf_token"])


def _path_of(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


async def viewer_of(request: Request) -> Viewer | None:
    """The signed-in viewer of a request, or None."""
    return await _viewer(request.app.state.pool, request.cookies.get(COOKIE))


async def current_viewer(request: Request) -> Viewer:
    """The signed-in viewer, or SignInRequired (a page answers it with the sign-in form)."""
    viewer = await viewer_of(request)
    if viewer is None:
        raise SignInRequired(_path_of(request))
    return viewer


def check_csrf(viewer: Viewer, sent: str | None) -> None:
    if not sent or not hmac.compare_digest(sent.encode(), viewer.csrf_token.encode()):
        raise Forbidden("the form's CSRF token is missing or wrong: reload the page and "
                        "try again")


async def acting_viewer(request: Request) -> Viewer:
    """For an action: a session (checked before the body is read), a key that may write,
    and the CSRF token from the header or, once the session is known, from the form."""
    viewer = await current_viewer(request)
    if not viewer.can_act:
        raise Forbidden("this key is read-only: it can read, but not change anything")
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        form = await request.form()
        value = form.get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    check_csrf(viewer, sent)
    return viewer


ViewerDep = Annotated[Viewer, Depends(current_viewer)]
ActingViewerDep = Annotated[Viewer, Depends(acting_viewer)]
