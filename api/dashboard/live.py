"""Live figures for every open dashboard, computed once per interval per view.

A dashboard that queries the database for each open tab every second is a known way to take
a production Postgres down. Here each view (a tenant, or an operator's whole installation)
has one feed: while anyone watches it, one task computes the overview snapshot every
`refresh_s`, renders it once, and hands the same text to every subscriber. Fifty open tabs
cost what one costs; the feed stops when the last one closes. Page loads share it too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Frame:
    version: int
    at: float          # time.monotonic() of its computation
    payload: object    # what the renderer made of the snapshot


Compute = Callable[[int | None], Awaitable[object]]


class _Feed:
    def __init__(self, view: int | None, compute: Compute, refresh_s: float) -> None:
        self.view = view
        self.compute = compute
        self.refresh_s = refresh_s
        self.frame: Frame | None = None
        self.subscribers = 0
        self.changed = asyncio.Condition()
        self.task: asyncio.Task[None] | None = None
        self.computing: asyncio.Lock = asyncio.Lock()

    async def refresh(self) -> Frame:
        """Compute a frame, unless one being computed or fresh enough is there to share."""
        async with self.computing:
            frame = self.frame
            if frame is not None and time.monotonic() - frame.at < self.refresh_s * 0.9:
                return frame
            payload = await self.compute(self.view)
            version = frame.version + 1 if frame else 1
            self.frame = Frame(version, time.monotonic(), payload)
        async with self.changed:
            self.changed.notify_all()
        return self.frame

    async def run(self) -> None:
        while self.subscribers > 0:
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the feed
                log.warning("dashboard snapshot failed, will try again: %s", exc)
            await asyncio.sleep(self.refresh_s)


class LiveSnapshots:
    def __init__(self, compute: Compute, *, refresh_s: float) -> None:
        self.compute = compute
        self.refresh_s = refresh_s
        self.feeds: dict[int | None, _Feed] = {}

    def _feed(self, view: int | None) -> _Feed:
        feed = self.feeds.get(view)
        if feed is None:
            feed = self.feeds[view] = _Feed(view, self.compute, self.refresh_s)
        return feed

    async def current(self, view: int | None) -> object:
        """The latest snapshot of `view`, shared when fresh: what a page load renders."""
        return (await self._feed(view).refresh()).payload

    async def subscribe(self, view: int | None, every_s: float) -> AsyncIterator[Frame]:
        """Frames of `view`, at most one per `every_s` (never more often than the feed
        computes them), until the caller stops iterating. Every subscriber of a view gets
        the same frames, numbered by `version`."""
        feed = self._feed(view)
        feed.subscribers += 1
        if feed.task is None or feed.task.done():
            feed.task = asyncio.create_task(feed.run())
        try:
            seen = 0

            def newer() -> bool:
                return feed.frame is not None and feed.frame.version > seen

            while True:
                async with feed.changed:
                    await feed.changed.wait_for(newer)
                frame = feed.frame
                assert frame is not None
                seen = frame.version
                yield frame
                await asyncio.sleep(max(0.0, every_s - self.refresh_s))
        finally:
            feed.subscribers -= 1

    async def close(self) -> None:
        for feed in self.feeds.values():
            if feed.task is not None:
                feed.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feed.task
