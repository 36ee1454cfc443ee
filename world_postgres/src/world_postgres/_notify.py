"""One LISTEN connection per World, fanned out to the waiters of this process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from world_postgres._db import Database, is_transient, tag_key

__all__ = ["Listener", "Subscription"]

log = logging.getLogger("world_postgres")

_PING_SECONDS = 10.0
_RECONNECT_MAX_SECONDS = 2.0
_REGISTER_SECONDS = 5.0

# Register as a waiter (shared session lock), then wait for the writers in flight, which saw no
# waiter and will not notify, to commit (exclusive lock taken and dropped). OFFSET 0 keeps the
# three calls in this order.
_REGISTER = """
    SELECT pg_advisory_unlock($1, $3) FROM (
        SELECT pg_advisory_lock($1, $3) FROM (
            SELECT pg_advisory_lock_shared($2, $3) OFFSET 0) AS registered OFFSET 0
    ) AS barrier
"""
_UNREGISTER = "SELECT pg_advisory_unlock_shared($1, $2)"


class Subscription:
    """One waiter on a tag: the event that wakes it, whether it sleeps on that event now, and
    whether it takes one wake-up per notification (a claim) or every one (a watch, a read)."""

    __slots__ = ("event", "one", "sleeping")

    def __init__(self, *, one: bool) -> None:
        self.event = asyncio.Event()
        self.one = one
        self.sleeping = False


class Listener:
    """Wakes waiters subscribed to a tag when a NOTIFY with that tag arrives.

    Writers notify a tag only while some World has registered it (see ``wake`` in the
    schema), so a waiter registers its tag before its last look at the store. The connection
    is opened on the first wait and reopened after any loss; then every registered tag is
    registered again and every waiter is woken, since notifications sent meanwhile are lost.

    A notification wakes every ``one=False`` subscriber of its tag (log watches and stream
    readers each need every write) but only one ``one=True`` subscriber (queue claimers: one
    message needs one claimer; waking all of them cost a claim query each for nothing). That
    one is a subscriber without a wake-up pending, asleep if any is; when every one has a
    wake-up pending, none is woken, as each of them looks at the store again anyway. No
    wake-up is lost, so no message is left to the safety poll while a claimer waits for it:

    * a woken subscriber looks at the store after the wake-up (``arm`` clears the event only
      before a look), and a claimer sleeps only after a look that found nothing to claim, so
      whatever was written before its last look is claimed by someone;
    * one chosen while looking may have looked before the write: it looks once more;
    * one leaving with its wake-up still pending (its deadline passed, or it claimed
      something in the look it was chosen during) hands it on to another, and so does one
      leaving by an error or a cancellation, which may have been looking on a wake-up;
    * a reconnect wakes every subscriber, since notifications sent meanwhile are lost.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._waiters: dict[str, dict[Subscription, None]] = {}  # ordered: oldest woken first
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None
        self._conn_lock = asyncio.Lock()
        self._registered: set[str] = set()
        self._chores: set[asyncio.Task[None]] = set()
        self._listening = asyncio.Event()
        self._closed = False
        self.reconnects = 0
        """How many times the connection was reopened after a loss."""
        self.sleeping = 0
        """How many waiters are asleep right now, waiting for a notification."""

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def is_registered(self, tag: str) -> bool:
        return self._listening.is_set() and tag in self._registered

    @contextlib.contextmanager
    def subscribe(self, tag: str, *, one: bool = False) -> Iterator[Subscription]:
        """A subscription whose event is set when ``tag`` is notified (every time, or with
        ``one`` when this subscriber is the one chosen) or the listener reconnected."""
        sub = Subscription(one=one)
        self._waiters.setdefault(tag, {})[sub] = None
        try:
            yield sub
        except BaseException:
            sub.event.set()  # it may have been looking on a wake-up it took: hand one on
            raise
        finally:
            waiters = self._waiters.get(tag)
            if waiters is not None:
                waiters.pop(sub, None)
                if one and sub.event.is_set():
                    self._wake_one(waiters)  # the wake-up it leaves unused
                if not waiters:
                    del self._waiters[tag]
                    if tag in self._registered and not self._closed:
                        try:
                            loop = asyncio.get_running_loop()
                        except RuntimeError:  # a generator finalised after its loop ended
                            return
                        chore = loop.create_task(self._unregister(tag))
                        self._chores.add(chore)
                        chore.add_done_callback(self._chores.discard)

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

    async def register(self, tag: str) -> bool:
        """Make writers notify ``tag`` from now on; False when the connection is down."""
        if self.is_registered(tag):
            return True
        async with self._conn_lock:
            conn = self._conn
            if conn is None or not self._listening.is_set():
                return False
            if tag not in self._registered:
                try:
                    await self._lock(conn, tag)
                except Exception as exc:
                    if not is_transient(exc):
                        log.warning("registering a waiter failed: %r", exc)
                    conn.terminate()  # in doubt: the listener reconnects and registers again
                    return False
        return self.is_registered(tag)

    async def _lock(self, conn: Any, tag: str) -> None:
        await asyncio.wait_for(
            conn.fetchval(_REGISTER, self._db.writers_class, self._db.waiters_class, tag_key(tag)),
            _REGISTER_SECONDS,
        )
        self._registered.add(tag)

    async def _unregister(self, tag: str) -> None:
        async with self._conn_lock:
            conn = self._conn
            if tag in self._waiters or tag not in self._registered or conn is None:
                return
            self._registered.discard(tag)
            try:
                await asyncio.wait_for(
                    conn.fetchval(_UNREGISTER, self._db.waiters_class, tag_key(tag)),
                    _REGISTER_SECONDS,
                )
            except Exception:
                conn.terminate()  # its session locks go with it; the listener reconnects

    async def aclose(self) -> None:
        self._closed = True
        for chore in list(self._chores):
            chore.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._wake_all()

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        waiters = self._waiters.get(payload)
        if waiters:
            for sub in waiters:
                if not sub.one:
                    sub.event.set()
            self._wake_one(waiters)

    @staticmethod
    def _wake_one(waiters: dict[Subscription, None]) -> None:
        # The oldest sleeper without a wake-up pending; else one looking at the store, which
        # may have looked before the write and so looks once more.
        chosen: Subscription | None = None
        for sub in waiters:
            if sub.one and not sub.event.is_set():
                if sub.sleeping:
                    chosen = sub
                    break
                if chosen is None:
                    chosen = sub
        if chosen is not None:
            chosen.event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for sub in waiters:
                sub.event.set()

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
                async with self._conn_lock:
                    self._registered.clear()  # session locks died with the old connection
                    for tag in list(self._waiters):
                        await self._lock(conn, tag)
                    self._conn = conn
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
                        async with self._conn_lock:
                            # A half-open socket raises here instead of hanging forever.
                            await asyncio.wait_for(conn.fetchval("SELECT 1"), _PING_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_transient(exc):
                    log.warning("listener on %s failed: %r", self._db.channel, exc)
            finally:
                self._listening.clear()
                self._conn = None
                self._registered.clear()
                if conn is not None:
                    conn.terminate()
            # Waiters fall back to bounded polling while the connection is down.
            self._wake_all()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RECONNECT_MAX_SECONDS)
