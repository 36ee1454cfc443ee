"""Concurrent calls of one kind merged into one statement.

A queue worker that handles a claimed batch at once acks its leases at once; a process whose
tasks submit work enqueues from many tasks at once. Each such call alone is one round trip and
one commit, and on a small machine the commit's fixed cost (the server's statement overhead,
its WAL flush, the client's pool and protocol work) is most of what a message costs. Here a
call made while another of its kind is on the wire waits for a round trip to end and goes out
with the others that came meanwhile, as one statement over arrays in one transaction: the same
durability (each call returns after the commit that holds it), fewer commits.

A lone call is sent at once, in its caller's task, as a statement of one item: it pays nothing
extra (a journal worker acks one lease at a time; the array statement for a single item was
measured a fifth to a quarter slower, wall and client CPU). Merged calls run in a task of
their own (at most ``max_inflight`` at a time), so a caller that is cancelled abandons only
its own result, never a statement that carries others' items; an item whose caller was
cancelled before its statement left is not sent. The statement's retries are
``Database.run``'s, as for any call; a failure fails every item it carried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from world_core.errors import ClosedError
from world_core.spi import MAX_PAYLOAD_BYTES
from world_postgres._db import Conn, Database

__all__ = ["MAX_MERGED", "MAX_MERGED_BYTES", "Merged"]

T = TypeVar("T")
R = TypeVar("R")

MAX_MERGED = 256
"""Most items in one statement: a burst of thousands becomes several statements, each holding
its row locks for a bounded time."""

MAX_MERGED_BYTES = MAX_PAYLOAD_BYTES
"""Most payload bytes in one statement (items that carry some: ``weight``), what one call may
carry, so that merged payloads stay far below PostgreSQL's 1 GB limit on one value or
message; an item alone may reach it."""

One = Callable[[Conn, bool, T], Awaitable[R]]
"""Runs one item on a connection (``retried`` as for ``Database.run``)."""
Many = Callable[[Conn, bool, Sequence[T]], Awaitable[Sequence[R]]]
"""Runs several items in one statement, one result per item, in their order."""


class Merged(Generic[T, R]):
    """Calls of one statement, merged while one is on the wire.

    Args:
        db: the World's database, whose ``run`` carries every statement.
        what: the operation's name, for errors.
        one: runs a lone item.
        many: runs several items in one statement.
        absent: the result of each item when the namespace has no storage (see
            ``Database.run``); None for a call that stores something.
        weight: an item's payload bytes, bounded per statement by MAX_MERGED_BYTES.
        max_inflight: merged statements on the wire at once (connections they take).
    """

    def __init__(
        self,
        db: Database,
        what: str,
        one: One[T, R],
        many: Many[T, R],
        *,
        absent: Callable[[], R] | None = None,
        weight: Callable[[T], int] | None = None,
        max_inflight: int = 2,
    ) -> None:
        self._db = db
        self._what = what
        self._one = one
        self._many = many
        self._absent = absent
        self._weight = weight
        self._max_inflight = max_inflight
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._inflight = 0
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.statements = 0
        self.items = 0
        """Counters, for tests and benchmarks: statements run (a retry is not counted again),
        items they carried."""

    async def call(self, item: T) -> R:
        """Run ``item``, alone when nothing of its kind is on the wire, else merged."""
        if self._inflight == 0 and not self._pending:
            self._inflight += 1
            try:
                self.statements += 1
                self.items += 1
                absent = self._absent
                return await self._db.run(
                    self._what,
                    lambda conn, retried: self._one(conn, retried, item),
                    absent=absent,
                    stores=True,  # enqueues and acks: cut off by aclose, in doubt
                )
            finally:
                self._inflight -= 1
                self._flush()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if not self._flush_scheduled:
            # After every task that is ready now has run: calls made in the same turn of the
            # event loop (a task group's acks) share the statement.
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    async def _run_many(self, items: Sequence[T]) -> Sequence[R]:
        self.statements += 1
        self.items += len(items)
        absent = self._absent
        return await self._db.run(
            self._what,
            lambda conn, retried: self._many(conn, retried, items),
            absent=None if absent is None else lambda: [absent() for _ in items],
            stores=True,
        )

    def _flush(self) -> None:
        """Start a statement of what is pending, if one may start now."""
        self._flush_scheduled = False
        while self._pending and self._inflight < self._max_inflight:
            live = self._take()
            if not live:
                continue
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._send(live))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        """The next statement's items, in order: at most MAX_MERGED, and MAX_MERGED_BYTES of
        payload unless one item alone has more; those whose caller was cancelled are dropped."""
        taken: list[tuple[T, asyncio.Future[R]]] = []
        size = 0
        used = 0
        for item, future in self._pending:
            if not future.done():
                weight = 0 if self._weight is None else self._weight(item)
                if len(taken) == MAX_MERGED or (taken and size + weight > MAX_MERGED_BYTES):
                    break
                taken.append((item, future))
                size += weight
            used += 1
        del self._pending[:used]
        return taken

    async def _send(self, live: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run_many([item for item, _ in live])
        except BaseException as exc:
            for _, future in live:
                if future.done():
                    continue
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:  # the event loop is shutting down
                    future.cancel()
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), result in zip(live, results, strict=True):
                if not future.done():  # its caller was cancelled meanwhile
                    future.set_result(result)
        finally:
            self._inflight -= 1
            self._flush()

    async def aclose(self) -> None:
        """Fail the calls still waiting with ClosedError and wait for the merged statements in
        flight. Call after the pool closed, which ends each of them with ClosedError too."""
        pending, self._pending = self._pending, []
        for _, future in pending:
            if not future.done():
                try:
                    self._db.check_open(self._what)
                except ClosedError as exc:
                    future.set_exception(exc)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
