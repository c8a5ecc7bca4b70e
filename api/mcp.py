"""`/mcp` on the API: the MCP server of `memmill.mcp_server` over streamable HTTP.

The endpoint is behind the API's own keys: `api.auth.Authenticate` checks the key of every
request to it from the headers, before the body is read, as for `/v1/`, and any valid key may
open it. Each tool call then calls the API in process, through `httpx.ASGITransport` of the
same app, with the key of the request that carries the call: so the call meets the same role
table, key binding, quotas and tenant isolation as the HTTP request it stands for, and a key
that may not make it gets the API's refusal as a tool error.

The server is stateless and answers JSON, not an event stream: nothing of an MCP session is
kept between requests, so any API process behind a load balancer can answer any request, and
a request is one JSON answer that proxies pass like any other. The session manager is started
by the app's lifespan (`sessions`) and kept on `app.state`, so each app has its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from api.auth import key_from
from memmill.client import AsyncMemmill, RetryPolicy
from memmill.mcp_server import build_server
from memmill.mcp_tools import CALL_TIMEOUT_S, ClientSource

PATH = "/mcp"
# The host of the in-process calls: nothing resolves it, the transport hands requests to the app.
INTERNAL_URL = "http://memmill.internal"
# A 429 or 503 goes back to the model at once, as a tool error that says when to try again,
# rather than holding the MCP request open while the client waits it out.
NO_RETRIES = RetryPolicy(attempts=1)
# The SDK's DNS-rebinding guard admits only localhost Host headers, which would refuse every
# request that reaches the API under its real name. What it guards against is a browser page
# borrowing a local server's trust; here every request must carry an API key, which a page on
# another origin does not have.
ANY_HOST = TransportSecuritySettings(enable_dns_rebinding_protection=False)


class Endpoint:
    """The ASGI app at `/mcp`: hands each POST to the app's session manager.

    A stateless server has nothing to push, so it offers no event stream: a GET would be held
    open with nothing ever sent on it (tying up a connection per request), and the protocol
    has the server answer 405 instead, as it does to any method but POST here."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            response = JSONResponse(
                {"detail": "the MCP endpoint takes POST only: it is stateless, with no event "
                           "stream to open and no session to end"},
                status_code=405, headers={"Allow": "POST"})
            await response(scope, receive, send)
            return
        manager = getattr(scope["app"].state, "mcp_sessions", None)
        if manager is None:
            response = JSONResponse({"detail": "the MCP endpoint is starting or stopping"},
                                    status_code=503, headers={"Retry-After": "1"})
            await response(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)


def request_clients(app: Starlette) -> ClientSource:
    """A client per tool call, with the key of the request that carries it, calling `app`
    in process."""

    @contextlib.asynccontextmanager
    async def source(ctx: Context) -> AsyncIterator[AsyncMemmill]:
        request = ctx.request_context.request
        key = key_from(request.headers) if request is not None else None
        if not key:  # Authenticate refused such a request already; never fall back to another key
            raise ToolError("this request carries no API key")
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with AsyncMemmill(INTERNAL_URL, key, transport=transport, retry=NO_RETRIES,
                                timeout_s=CALL_TIMEOUT_S) as client:
            yield client

    return source


@contextlib.asynccontextmanager
async def sessions(app: Starlette, *, max_request_bytes: int) -> AsyncIterator[None]:
    """Run the MCP endpoint for the app's lifetime (inside its lifespan)."""
    server = build_server(request_clients(app), local_files=False)
    # Builds the session manager; the Starlette app it returns is not used: `Endpoint` is
    # routed in the API's own app, behind its middleware.
    server.streamable_http_app(stateless_http=True, json_response=True,
                               max_request_body_size=max_request_bytes,
                               transport_security=ANY_HOST)
    manager = server.session_manager
    async with manager.run():
        app.state.mcp_sessions = manager
        try:
            yield
        finally:
            app.state.mcp_sessions = None
