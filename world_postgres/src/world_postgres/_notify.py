"""One LISTEN connection per World, fanned out to the waiters of this process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from world_postgres._db import Database, is_transient

__all__ = ["Listener"]

log = logging.getLogger("world_postgres")

_PING_SECONDS = 10.0
_RECONNECT_MAX_SECONDS = 2.0


class Listener:
    """Wakes waiters subscribed to a tag when a NOTIFY with that tag arrives.

    The connection is opened on the first subscription and reopened after any loss; every
    waiter is woken after a reconnect, since notifications sent while it was down are lost
    and the waiters must look again.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._closed = False
        self.reconnects = 0
        """How many times the connection was reopened after a loss."""
        self.sleeping = 0
        """How many waiters are asleep right now, waiting for a notification."""

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    @contextlib.contextmanager
    def subscribe(self, tag: str) -> Iterator[asyncio.Event]:
        """An event set whenever ``tag`` is notified (or the listener reconnected)."""
        event = asyncio.Event()
        self._waiters.setdefault(tag, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(tag)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[tag]

    async def ready(self, within: float) -> bool:
        """Start the listener if needed and wait up to ``within`` s until it listens."""
        if self._closed:
            return False
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"world_postgres listener {self._db.channel}"
            )
        if self._listening.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), within)
        return self._listening.is_set()

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._wake_all()

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for event in self._waiters.get(payload, ()):
            event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _run(self) -> None:
        delay = 0.05
        first = True
        while not self._closed:
            conn: Any = None
            lost = asyncio.Event()
            try:
                conn = await self._db.connect()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(self._db.channel, self._on_notify)
                self._listening.set()
                if not first:
                    self.reconnects += 1
                    log.info("listener on %s reconnected", self._db.channel)
                first = False
                delay = 0.05
                # Anything notified while no connection listened is lost: look again.
                self._wake_all()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), _PING_SECONDS)
                    if not lost.is_set():
                        # A half-open socket raises here instead of hanging forever.
                        await asyncio.wait_for(conn.fetchval("SELECT 1"), _PING_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_transient(exc):
                    log.warning("listener on %s failed: %r", self._db.channel, exc)
            finally:
                self._listening.clear()
                if conn is not None:
                    conn.terminate()
            # Waiters fall back to bounded polling while the connection is down.
            self._wake_all()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RECONNECT_MAX_SECONDS)
