"""Who the API keys checked recently act as, so that most requests skip the round trip that
checks their key (0.4 ms of a search's 8 over HTTP, and a statement on the database).

An entry is only as good as our hearing of changes: migration 0009 notifies the channel
`memmill_api_keys` on every change that can make a key stop working, a connection of our own
listens, and the cache answers only while that connection is up. When it drops, everything is
forgotten and every request checks its key again until `run()` has listened anew. Entries
also expire after `ttl_s`, which keeps `api_keys.last_used_at` (written by the check at most
once a minute) within about that of the truth."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Generic, TypeVar

import asyncpg

log = logging.getLogger(__name__)

CHANNEL = "memmill_api_keys"
APPLICATION_NAME = "memmill key listener"

T = TypeVar("T")


class KeyCache(Generic[T]):
    """What a key hash resolved to (a `pipeline.tenants.Principal`), for `ttl_s`."""

    def __init__(self, dsn: str, *, ttl_s: float, retry_s: float = 2.0) -> None:
        self._dsn = dsn
        self._ttl_s = ttl_s
        self._retry_s = retry_s
        self._entries: dict[bytes, tuple[T, float]] = {}
        self._listener: asyncpg.Connection | None = None
        # Bumped by every change heard and by a lost listener: a check that began before one
        # must not store what it read (see put).
        self.generation = 0

    @property
    def listening(self) -> bool:
        return self._listener is not None and not self._listener.is_closed()

    def get(self, key_hash: bytes) -> T | None:
        entry = self._entries.get(key_hash) if self.listening else None
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def put(self, key_hash: bytes, value: T, generation: int) -> None:
        """Remember a key checked by a read that began at `generation`: a change heard since may
        have come after that read, so its result is then dropped."""
        if self.listening and generation == self.generation:  # never listening at ttl 0
            self._entries[key_hash] = (value, time.monotonic() + self._ttl_s)

    def _forget(self, *_: object) -> None:
        self.generation += 1
        self._entries.clear()

    def _lost(self, _: object) -> None:
        self._listener = None
        self._forget()
        log.warning("the API key listener's connection closed; checking every key until it is back")

    async def _listen(self) -> None:
        conn = await asyncpg.connect(self._dsn,
                                     server_settings={"application_name": APPLICATION_NAME})
        try:
            await conn.add_listener(CHANNEL, self._forget)
        except BaseException:
            await conn.close()
            raise
        conn.add_termination_listener(self._lost)
        self._forget()  # whatever was cached while nobody listened
        self._listener = conn

    async def run(self) -> None:
        """Listen, and listen again whenever the connection is lost; until cancelled."""
        if self._ttl_s <= 0:
            return
        try:
            while True:
                if not self.listening:
                    try:
                        await self._listen()
                    except (OSError, asyncpg.PostgresError) as exc:
                        log.warning("cannot listen for API key changes (%s); retrying", exc)
                await asyncio.sleep(self._retry_s)
        finally:
            listener, self._listener = self._listener, None
            self._forget()
            if listener is not None:
                listener.remove_termination_listener(self._lost)
                await listener.close()
