"""The clients an integration talks to memmill through: one blocking client, and an async
client per event loop, since an httpx connection belongs to the loop that opened it and a
framework may run its graphs or chains in more than one."""

from __future__ import annotations

import asyncio

from memmill.client import AsyncMemmill, Memmill, RetryPolicy


class Clients:
    def __init__(self, url: str | None, key: str | None, *, timeout_s: float,
                 retry: RetryPolicy | None) -> None:
        self._url, self._key, self._timeout_s, self._retry = url, key, timeout_s, retry
        # Made now, not on first use: a framework may call from several threads at once.
        self.sync = Memmill(url, key, timeout_s=timeout_s, retry=retry)
        self._async: AsyncMemmill | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def for_this_loop(self) -> AsyncMemmill:
        loop = asyncio.get_running_loop()
        if self._async is None or self._loop is not loop:
            self._async = AsyncMemmill(self._url, self._key, timeout_s=self._timeout_s,
                                       retry=self._retry)
            self._loop = loop
        return self._async

    def close(self) -> None:
        self.sync.close()

    async def aclose(self) -> None:
        self.close()
        if self._async is not None and self._loop is asyncio.get_running_loop():
            await self._async.close()
