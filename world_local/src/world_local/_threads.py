"""Worker threads for the blocking file work, handed off more cheaply than a generic call.

Every call of the local World runs its file work (locks, reads, an fsync) in a worker thread,
so that the event loop never waits on the disk. ``anyio.to_thread.run_sync`` costs more than
that work itself (measured in benchmarks/bench_local.py: the fsync floor through it is 1.6x to
1.9x the floor on the caller's thread, through :func:`run_sync` here 1.15x to 1.25x): it yields
to the event loop once before starting, takes a capacity limiter, copies the context and finds
the root task at every call. Under asyncio the hand-off here is a future and one queue per
thread: the caller's loop sleeps until the thread's ``call_soon_threadsafe`` wakes it. Under
any other event loop (trio) it is anyio's.

Semantics kept from ``anyio.to_thread.run_sync``: a call in an already cancelled scope starts
nothing; once started, the work runs to its end and the caller waits for it even if cancelled
meanwhile (the cancellation takes effect after), so a write is never abandoned half-way by
its caller.

The threads are shared by every World of the process, at most :data:`THREADS`; one idle for
:data:`IDLE` seconds ends. They are daemons, like anyio's: an interpreter exiting mid-write
leaves a torn frame at worst, which readers ignore and the next writer cuts off.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = ["IDLE", "THREADS", "run_sync"]

R = TypeVar("R")

THREADS = 32
"""Worker threads at most: file work of this many calls runs at once (fsyncs of different
files overlap on the disk); more calls wait for a thread."""
IDLE = 10.0
"""Seconds a thread waits for work before it ends."""

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class _Pool:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every thread: at start, and in a child after fork (they stayed in the
        parent)."""
        self._lock = threading.Lock()
        self._idle: list[_Thread] = []  # waiting for a job, the last to go idle last
        self._backlog: deque[_Job] = deque()  # jobs no thread was free for
        self._count = 0

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                thread = self._idle.pop()  # the most recently idle: its stack is warm
            elif self._count < THREADS:
                self._count += 1
                thread = _Thread(self)
                thread.start()
            else:
                self._backlog.append(job)
                return
        thread.jobs.put(job)

    def next_job(self, thread: _Thread) -> _Job | None:
        """The backlog's next job, or None after marking ``thread`` idle."""
        with self._lock:
            if self._backlog:
                return self._backlog.popleft()
            self._idle.append(thread)
            return None

    def retire(self, thread: _Thread) -> bool:
        """End ``thread``, idle too long, unless a job was just handed to it."""
        with self._lock:
            if thread not in self._idle:
                return False  # submit() popped it and is putting a job in its queue
            self._idle.remove(thread)
            self._count -= 1
            return True


class _Thread(threading.Thread):
    def __init__(self, pool: _Pool) -> None:
        super().__init__(name="world-local-file-work", daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()

    def run(self) -> None:
        job: _Job | None = None
        while True:
            if job is None:
                try:
                    job = self.jobs.get(timeout=IDLE)
                except queue.Empty:
                    if self.pool.retire(self):
                        return
                    continue
            _call(*job)
            job = None  # nothing of a finished call is kept alive while idle
            job = self.pool.next_job(self)


def _call(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], fn: Callable[[], Any]
) -> None:
    try:
        result = fn()
    except BaseException as exc:
        _report(loop, future, None, exc)
    else:
        _report(loop, future, result, None)


def _report(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: object,
    exc: BaseException | None,
) -> None:
    with suppress(RuntimeError):  # the loop was closed: nobody waits any more
        loop.call_soon_threadsafe(_settle, future, result, exc)


def _settle(future: asyncio.Future[Any], result: object, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.reset)


async def run_sync(fn: Callable[[], R]) -> R:
    """``fn()`` in a worker thread; see the module docstring."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio
        return await anyio.to_thread.run_sync(fn)
    await anyio.lowlevel.checkpoint_if_cancelled()
    future: asyncio.Future[R] = loop.create_future()
    _pool.submit((loop, future, fn))
    with anyio.CancelScope(shield=True):
        result = await future
    return result
