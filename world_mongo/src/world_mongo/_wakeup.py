"""Waking waiters: in-process notifications, optional change streams, bounded polling.

A waiter subscribes *before* it checks the store, so a write that lands between its check and
its sleep still wakes it. Writers in this process notify directly; writers elsewhere are seen
through a change stream (replica sets) or, at the latest, at the next poll.

pymongo's async client runs on asyncio only, so this module uses asyncio primitives directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

__all__ = ["Backoff", "Notifier", "Subscription", "notifier_for"]

_log = logging.getLogger("world_mongo")

WakeKey = tuple[str, str]
"""(kind, name): ("log", log_id), ("queue", queue), ("stream", stream_id)."""


@dataclass
class Backoff:
    """Poll intervals that start short, double, and stop growing at ``maximum``.

    ``reset()`` after progress, so a busy waiter stays responsive and an idle one costs at most
    one query per ``maximum`` seconds. Jitter (up to 10 % shorter) keeps idle waiters apart.
    """

    minimum: float = 0.01
    maximum: float = 0.5
    _current: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.maximum:
            raise ValueError("Backoff needs 0 < minimum <= maximum")
        self._current = self.minimum

    def next(self) -> float:
        """The next interval to sleep, within [minimum, maximum]."""
        value = self._current
        self._current = min(self.maximum, self._current * 2)
        return max(self.minimum, value * (1 - random.random() * 0.1))

    def reset(self) -> None:
        self._current = self.minimum


class Subscription:
    """One waiter's interest in one key; ``wait`` returns early when the key is notified."""

    def __init__(self, notifier: Notifier, key: WakeKey) -> None:
        self._notifier = notifier
        self.key = key
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def _fire(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._event.set()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if woken by a notification."""
        try:
            async with asyncio.timeout(seconds):
                await self._event.wait()
        except TimeoutError:
            return False
        finally:
            self._event.clear()
        return True


class Notifier:
    """Process-wide wake-ups for one (server, database, collection prefix)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[WakeKey, set[Subscription]] = {}

    @contextlib.contextmanager
    def subscribe(self, kind: str, name: str) -> Iterator[Subscription]:
        sub = Subscription(self, (kind, name))
        with self._lock:
            self._subs.setdefault(sub.key, set()).add(sub)
        try:
            yield sub
        finally:
            with self._lock:
                subs = self._subs.get(sub.key)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._subs[sub.key]

    def notify(self, kind: str, name: str | None = None) -> None:
        """Wake the waiters of (kind, name); of every name of ``kind`` when name is None."""
        with self._lock:
            if name is None:
                targets = [s for key, subs in self._subs.items() if key[0] == kind for s in subs]
            else:
                targets = list(self._subs.get((kind, name), ()))
        for sub in targets:
            sub._fire()


# Weak: a notifier lives as long as some World of its location holds it.
_registry: weakref.WeakValueDictionary[tuple[Any, ...], Notifier] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


def notifier_for(key: tuple[Any, ...]) -> Notifier:
    """The shared notifier for one store location, so Worlds in one process wake each other."""
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = Notifier()
            _registry[key] = found
        return found


async def follow_change_stream(
    db: AsyncDatabase[dict[str, Any]],
    kinds: dict[str, str],
    notifier: Notifier,
    live: Callable[[bool], None],
) -> None:
    """Relay inserts/updates/deletes of our collections to the notifier until cancelled.

    ``kinds`` maps a collection name to the wake kind. Head documents are keyed by the log or
    stream id, so those wake exactly; queue documents are keyed by message id, so a queue
    change wakes every queue waiter, which then re-checks its own queue. ``live(True)`` while
    a change stream is open, ``live(False)`` when it broke; it is reopened with backoff, and
    polling covers the gap (polling stays on as a safety net in any case).
    """
    pipeline = [{"$match": {"ns.coll": {"$in": list(kinds)}}}]
    retry = Backoff(0.5, 30.0)
    while True:
        try:
            async with await db.watch(pipeline) as stream:
                live(True)
                retry.reset()
                async for change in stream:
                    kind = kinds.get(change.get("ns", {}).get("coll", ""))
                    if kind is None:
                        continue
                    if kind == "queue":
                        notifier.notify(kind)
                    else:
                        doc_id = change.get("documentKey", {}).get("_id")
                        notifier.notify(kind, doc_id if isinstance(doc_id, str) else None)
        except PyMongoError as exc:
            _log.warning("change stream broke (%s); polling until it reopens", type(exc).__name__)
        live(False)
        # Anything missed while it was down: let every waiter re-check once.
        for kind in set(kinds.values()):
            notifier.notify(kind)
        await asyncio.sleep(retry.next())
