"""Worker threads for the blocking file work, handed off more cheaply than a generic call.

Every call of the local World runs its file work (locks, reads, an fsync) in a worker thread,
so that the event loop never waits on a lock, nor (but for the inline appends below) on the
disk. ``anyio.to_thread.run_sync`` costs more than that work itself (measured in
benchmarks/bench_local.py: the fsync floor through it is 1.6x to 1.9x the floor on the
caller's thread, through :func:`run_sync` here 1.15x to 1.25x): it yields to the event loop
once before starting, takes a capacity limiter, copies the context and finds
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

A log append may instead run on the caller's thread (:func:`run_inline`), blocking its event
loop for one fsync, when :func:`inline_ok` allows: no call of this process is in a worker
thread (nothing else of ours waits on the disk, so the loop holds up no concurrent file work),
and no inline work was slow (:data:`INLINE_SLOW`) shortly before: a pause of
:data:`INLINE_PAUSE`, doubling while the slowness persists up to :data:`INLINE_PAUSE_MAX`, so a
disk that stays slow stalls the loop at most once per :data:`INLINE_PAUSE_MAX`, for one call.
Inline work never waits for a lock (see ``FoldedFile.writing``'s ``quick``); if it would, it
goes to a thread.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = [
    "IDLE",
    "INLINE_PAUSE",
    "INLINE_PAUSE_MAX",
    "INLINE_SLOW",
    "THREADS",
    "inline_ok",
    "run_inline",
    "run_sync",
]

R = TypeVar("R")

THREADS = 32
"""Worker threads at most: file work of this many calls runs at once (fsyncs of different
files overlap on the disk); more calls wait for a thread."""
IDLE = 10.0
"""Seconds a thread waits for work before it ends."""
INLINE_SLOW = 0.01
"""Seconds: inline work that took longer (an fsync the disk was slow to flush, or a machine
too loaded to run us) keeps file work off the event loop's thread for a pause."""
INLINE_PAUSE = 0.1
"""Seconds of the first pause after slow inline work. Slow again within one pause of the
last one's end (the first run allowed after it), and the pause doubles, up to
:data:`INLINE_PAUSE_MAX`: a disk that stays slow stalls the loop ever more rarely, while a
lone spike costs the inline runs of a tenth of a second."""
INLINE_PAUSE_MAX = 5.0

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


class _Policy:
    """What :func:`inline_ok` looks at, for every thread and event loop of the process."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.busy = 0  # calls in (or waiting for) a worker thread
        self.slow_until = 0.0  # time.monotonic() before which nothing runs inline
        self.pause = 0.0  # the length of the last pause

    def enter(self) -> None:
        with self.lock:
            self.busy += 1

    def leave(self) -> None:
        with self.lock:
            self.busy -= 1

    def timed(self, start: float) -> None:
        """Note the end of inline work that began at ``start`` (``time.monotonic()``)."""
        now = time.monotonic()
        if now - start <= INLINE_SLOW:
            return
        again = now < self.slow_until + self.pause
        self.pause = min(self.pause * 2, INLINE_PAUSE_MAX) if again else INLINE_PAUSE
        self.slow_until = now + self.pause


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
_policy = _Policy()
os.register_at_fork(after_in_child=_pool.reset)
os.register_at_fork(after_in_child=_policy.reset)


async def run_sync(fn: Callable[[], R]) -> R:
    """``fn()`` in a worker thread; see the module docstring."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio
        _policy.enter()
        try:
            return await anyio.to_thread.run_sync(fn)
        finally:
            _policy.leave()
    await anyio.lowlevel.checkpoint_if_cancelled()
    future: asyncio.Future[R] = loop.create_future()
    _policy.enter()
    try:
        _pool.submit((loop, future, fn))
        with anyio.CancelScope(shield=True):
            result = await future
    finally:
        _policy.leave()
    return result


def inline_ok() -> bool:
    """Whether file work may run on the event loop's thread now; see the module docstring."""
    return not _policy.busy and time.monotonic() >= _policy.slow_until


def run_inline(fn: Callable[[], R]) -> R:
    """``fn()`` on the caller's thread, timed for :func:`inline_ok`. Blocks the event loop:
    only for work that cannot wait on a lock (see the module docstring)."""
    start = time.monotonic()
    try:
        return fn()
    finally:
        _policy.timed(start)
