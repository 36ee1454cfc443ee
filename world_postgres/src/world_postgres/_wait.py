"""Waiting for a notification, bounded."""

from __future__ import annotations

import asyncio
import contextlib

from world_postgres._notify import Listener, Subscription

__all__ = ["Waiter"]

# With the tag registered, a safety net only; otherwise bounded polling until it is.
_POLL_LISTENING = 5.0
_POLL_DEAF = 0.5


class Waiter:
    """Sleeps until the subscribed tag is notified, a deadline, or the next safety poll.

    The caller loops: ``arm()``, look at the store, ``sleep()``. The first ``sleep`` only
    registers the tag with the writers and returns at once, so that the caller looks again
    before really sleeping: what was written before the registration took effect is seen by
    that look, what is written after it is notified.
    """

    def __init__(self, listener: Listener, tag: str, sub: Subscription) -> None:
        self._listener = listener
        self._tag = tag
        self._sub = sub

    async def start(self) -> None:
        await self._listener.ready(within=2.0)

    def arm(self) -> None:
        """Forget earlier wake-ups; call before looking at the store."""
        self._sub.event.clear()

    async def sleep(self, seconds: float | None = None) -> None:
        """Sleep at most ``seconds`` (None: until woken or the safety poll)."""
        listener = self._listener
        if not listener.is_registered(self._tag):
            if await listener.register(self._tag):
                return  # look again now that writers notify this tag
            cap = _POLL_DEAF
        else:
            cap = _POLL_LISTENING
        timeout = cap if seconds is None else max(0.0, min(seconds, cap))
        listener.sleeping += 1
        self._sub.sleeping = True
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sub.event.wait(), timeout)
        finally:
            self._sub.sleeping = False
            listener.sleeping -= 1
