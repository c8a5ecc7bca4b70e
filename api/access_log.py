"""The API's access log: one line per request that did not succeed (status 400 and up).

uvicorn's own access log writes a line for every request, which at a few hundred requests a
second buries everything else, and quotes the whole query string. A success is already told
by its answer; a refusal or a failure is what someone reads the log for. So this middleware
writes a line only for those: method, path, status, duration and the key's tenant, 4xx at INFO
and 5xx at WARNING. The health probes are left out.

The query string shows its parameter names, never their values (`?item_id=…&limit=…`): a value
may be anything a client put there, a search phrase or an identifier it thinks private, and a
parameter's name is enough to tell which one a 422 is about. The path is logged as it came,
still percent-encoded and cut at `MAX_PATH_CHARS`, so a request cannot write a line break (or
anything else) into the log.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import PRINCIPAL

log = logging.getLogger(__name__)

MAX_PATH_CHARS = 200
LOGGED_FROM_STATUS = 400
# Polled by `memmill up`, load balancers and orchestrators several times a second; their 503
# is the answer they ask for (not ready yet), and /readyz's body names what is missing.
PROBES = frozenset({"/healthz", "/readyz"})


def _shown_path(scope: Scope) -> str:
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.partition(b"?")[0].decode("ascii", "backslashreplace")
    if len(path) > MAX_PATH_CHARS:
        path = path[:MAX_PATH_CHARS] + "…"
    names = dict.fromkeys(name for name, _ in parse_qsl(
        scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
    if names:
        path += "?" + "&".join(
            f"{name.encode('ascii', 'backslashreplace').decode()[:40]}=…" for name in names)
    return path


class AccessLog:
    """Pure ASGI (no per-request task or body buffering), outermost, so that the 401s and 413s
    the other middlewares answer are logged as well."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBES:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # An app that raises before it answers gets a 500 from the server.
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if status >= LOGGED_FROM_STATUS:
                principal = scope.get(PRINCIPAL)
                log.log(
                    logging.WARNING if status >= 500 else logging.INFO,
                    "%s %s %d %.1f ms%s", scope["method"], _shown_path(scope), status,
                    (time.perf_counter() - started) * 1000,
                    f" tenant {principal.tenant_id}" if principal is not None else "",
                )
