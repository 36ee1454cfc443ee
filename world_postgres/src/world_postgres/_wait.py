"""Waiting for a notification, bounded."""

from __future__ import annotations

import asyncio
import contextlib
import time

from world_postgres._notify import Listener

__all__ = ["Waiter"]

# With the listener up, a safety net only; with it down, bounded polling until it is back.
_POLL_LISTENING = 5.0
_POLL_DEAF = 0.5


class Waiter:
    """Sleeps until the subscribed event fires, a deadline, or the next safety poll."""

    def __init__(self, listener: Listener, event: asyncio.Event) -> None:
        self._listener = listener
        self._event = event

    async def start(self) -> None:
        await self._listener.ready(within=2.0)

    def arm(self) -> None:
        """Forget earlier wake-ups; call before looking at the store."""
        self._event.clear()

    async def sleep(self, seconds: float | None = None) -> None:
        """Sleep at most ``seconds`` (None: until woken or the safety poll)."""
        cap = _POLL_LISTENING if self._listener.listening else _POLL_DEAF
        timeout = cap if seconds is None else max(0.0, min(seconds, cap))
        self._listener.sleeping += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout)
        finally:
            self._listener.sleeping -= 1


def remaining(deadline: float) -> float:
    return deadline - time.monotonic()
