"""A request-body size limit enforced while the body streams in, so a client cannot make the
API buffer an arbitrarily large upload before validation rejects it."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _too_large(max_bytes: int) -> str:
    return f"request body is larger than the limit of {max_bytes} bytes"


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a streamed (chunked) body passes the limit. An HTTPException,
    because FastAPI turns any other error while it reads the body into a vague 400."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=_too_large(max_bytes))


class BodySizeLimit:
    """One limit for every request, and larger ones for the paths that take bulk bodies."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, larger: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = larger or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.larger.get(scope.get("path", ""), self.max_bytes)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._reject(send, max_bytes)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise BodyTooLarge(max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send, max_bytes)

    async def _reject(self, send: Send, max_bytes: int) -> None:
        body = json.dumps({"detail": _too_large(max_bytes)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
