"""Wrapper Worlds around the real local World, each with one deliberate fault.

They prove that the contracts can fail: each fault must make a named contract test fail
(``test_faults.py``). The wrapped World and its files are real; only the one behaviour named
by the factory is changed, in plain sight.
"""

from __future__ import annotations

import inspect
import os
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import anyio

import world_local
from world_conformance.wrappers import PassThroughLog, PassThroughStream, PassThroughWorld
from world_core import (
    BackendUnavailableError,
    Capabilities,
    Chunk,
    ClosedError,
    DeadLetter,
    DuplicateKeyError,
    Event,
    InvalidArgumentError,
    Lease,
    LeaseLostError,
    LogInfo,
    NewEvent,
    OutboxMessage,
    Page,
    World,
)
from world_core.spi import (
    DEFAULT_MAX_ATTEMPTS,
    Log,
    Queue,
    Stream,
    validate_id,
    validate_read,
)


class Wrapper(PassThroughWorld):
    """Delegates everything to ``inner``; subclasses replace one part."""


class _LogFault(PassThroughLog):
    """The real log; subclasses change one behaviour."""


class _StatusIgnored(_LogFault):
    """Fault: ``append`` drops ``status``."""

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        return await self.inner.append(log_id, events, expect_tail=expect_tail, messages=messages)


class _WatchRepeats(_LogFault):
    """Fault: ``watch`` yields its first event twice."""

    async def _watch(self, log_id: str, after: int) -> AsyncIterator[Event]:
        first = True
        async for event in self.inner.watch(log_id, after=after):
            yield event
            if first:
                first = False
                yield event

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        return self._watch(log_id, after)


class _AnyCursorAccepted(_LogFault):
    """Fault: ``list_logs`` takes a cursor it did not issue (or issued for another prefix or
    status) as no cursor, and starts the listing over instead of refusing it."""

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        try:
            return await self.inner.list_logs(
                prefix=prefix, status=status, cursor=cursor, limit=limit
            )
        except InvalidArgumentError:
            if cursor is None:
                raise
            return await self.inner.list_logs(prefix=prefix, status=status, limit=limit)


class _QueueFault(Queue):
    def __init__(self, inner: Queue) -> None:
        self.inner = inner

    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        delay: float = 0.0,
        dedup_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> str:
        return await self.inner.enqueue(
            queue, payload, delay=delay, dedup_key=dedup_key, max_attempts=max_attempts
        )

    async def claim(
        self, queue: str, worker: str, *, lease: float, limit: int = 1, wait: float = 0.0
    ) -> list[Lease]:
        return await self.inner.claim(queue, worker, lease=lease, limit=limit, wait=wait)

    async def renew(self, lease: Lease, duration: float) -> Lease:
        return await self.inner.renew(lease, duration)

    async def ack(self, lease: Lease) -> None:
        await self.inner.ack(lease)

    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        await self.inner.release(lease, delay=delay)

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        return await self.inner.dead_letters(queue, limit=limit)

    async def requeue(self, queue: str, message_id: str) -> None:
        await self.inner.requeue(queue, message_id)


class _Lifo(_QueueFault):
    """Fault: one claim returns its leases newest first."""

    async def claim(
        self, queue: str, worker: str, *, lease: float, limit: int = 1, wait: float = 0.0
    ) -> list[Lease]:
        leases = await self.inner.claim(queue, worker, lease=lease, limit=limit, wait=wait)
        return leases[::-1]


class _StaleAckAccepted(_QueueFault):
    """Fault: ``ack`` with a stale token is silently accepted."""

    async def ack(self, lease: Lease) -> None:
        try:
            await self.inner.ack(lease)
        except LeaseLostError:
            return


class _DedupIgnored(_QueueFault):
    """Fault: ``dedup_key`` is dropped."""

    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        delay: float = 0.0,
        dedup_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> str:
        return await self.inner.enqueue(queue, payload, delay=delay, max_attempts=max_attempts)


class _DeadLettersByEnqueue(_QueueFault):
    """Fault: ``dead_letters`` lists messages in the order they were enqueued, not died."""

    def __init__(self, inner: Queue) -> None:
        super().__init__(inner)
        self.enqueued: list[str] = []

    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        delay: float = 0.0,
        dedup_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> str:
        message_id = await self.inner.enqueue(
            queue, payload, delay=delay, dedup_key=dedup_key, max_attempts=max_attempts
        )
        self.enqueued.append(message_id)
        return message_id

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        letters = await self.inner.dead_letters(queue, limit=1000)
        order = {message_id: index for index, message_id in enumerate(self.enqueued)}
        return sorted(letters, key=lambda d: order.get(d.message_id, -1))[:limit]


class _ClosedLooksTransient(_QueueFault):
    """Fault: a claim on a closed World (or waiting while it closes) raises
    BackendUnavailableError, a fault to retry, instead of ClosedError."""

    async def claim(
        self, queue: str, worker: str, *, lease: float, limit: int = 1, wait: float = 0.0
    ) -> list[Lease]:
        try:
            return await self.inner.claim(queue, worker, lease=lease, limit=limit, wait=wait)
        except ClosedError as exc:
            raise BackendUnavailableError("connection lost; retry") from exc


class _StreamFault(PassThroughStream):
    """The real stream; subclasses change one behaviour."""


class _NegativeStartIgnored(_StreamFault):
    """Fault: a negative ``start`` reads from 0."""

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        return self.inner.read(stream_id, start=max(start, 0))


class _HidesOutbox(Wrapper):
    """Fault: declares no outbox, yet ``append(messages=...)`` still enqueues them."""

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities.model_copy(update={"outbox": False})


async def _local(url: str | None, namespace: str) -> World:
    return await world_local.connect(url=url, namespace=namespace)


async def status_ignored(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.log = _StatusIgnored(world.inner.log)
    return world


async def watch_repeats(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.log = _WatchRepeats(world.inner.log)
    return world


async def any_cursor_accepted(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.log = _AnyCursorAccepted(world.inner.log)
    return world


async def lifo(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.queue = _Lifo(world.inner.queue)
    return world


async def stale_ack_accepted(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.queue = _StaleAckAccepted(world.inner.queue)
    return world


async def dedup_ignored(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.queue = _DedupIgnored(world.inner.queue)
    return world


async def negative_start_ignored(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.stream = _NegativeStartIgnored(world.inner.stream)
    return world


async def hides_outbox(*, url: str | None = None, namespace: str = "default") -> World:
    return _HidesOutbox(await _local(url, namespace))


async def dead_letters_by_enqueue(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.queue = _DeadLettersByEnqueue(world.inner.queue)
    return world


async def closed_looks_transient(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.queue = _ClosedLooksTransient(world.inner.queue)
    return world


class _LazyWatch(_LogFault):
    """Fault: ``watch`` is an ``async def`` generator, so its checks (arguments, a closed
    World) run only at its first step, not when it is called."""

    async def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        async for event in self.inner.watch(log_id, after=after):
            yield event


class _LazyRead(_StreamFault):
    """Fault: ``read`` is an ``async def`` generator, so its checks (arguments, a closed
    World) run only at its first step, not when it is called."""

    async def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        async for chunk in self.inner.read(stream_id, start=start):
            yield chunk


async def lazy_checks(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.log = _LazyWatch(world.inner.log)
    world.stream = _LazyRead(world.inner.stream)
    return world


class _ClosedFirst(Wrapper):
    """Fault: once closed, ``log.tail`` and ``log.watch`` raise ClosedError before they
    check their arguments."""

    def __init__(self, inner: World) -> None:
        super().__init__(inner)
        self.closed = False
        self.log = _ClosedFirstLog(inner.log, self)

    async def aclose(self) -> None:
        self.closed = True
        await self.inner.aclose()


class _ClosedFirstLog(_LogFault):
    def __init__(self, inner: Log, world: _ClosedFirst) -> None:
        super().__init__(inner)
        self.world = world

    def _check(self) -> None:
        if self.world.closed:
            raise ClosedError("closed")

    async def tail(self, log_id: str) -> int:
        self._check()
        validate_id(log_id, "log_id")
        return await self.inner.tail(log_id)

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        self._check()
        validate_read(log_id, after=after)
        return self.inner.watch(log_id, after=after)


async def closed_before_arguments(*, url: str | None = None, namespace: str = "default") -> World:
    return _ClosedFirst(await _local(url, namespace))


class _PollingWatch(_LogFault):
    """Not a fault by itself: ``watch`` ignores every notification and polls the log every
    ``POLL`` seconds (other processes' appends included).

    POLL is far outside the wake-up contract's window: the contract's first write comes IDLE
    (3 s) after the watch starts, so the next poll finds it about 5 s later, and only a first
    read delayed by over 4 s (never seen, even on a loaded machine) could land within
    NATIVE_WAKE (1 s). At 2.5 s, a first read delayed by 1.5 s under load once did, and the
    fault passed the contract. The control still sees its write well within IDLE + WAIT."""

    POLL = 8.0

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        validate_read(log_id, after=after)
        return self._poll(log_id, after)

    async def _poll(self, log_id: str, after: int) -> AsyncIterator[Event]:
        while True:
            for event in await self.inner.read(log_id, after=after):
                yield event
                after = event.seq
            await anyio.sleep(self.POLL)


class _DeclaredNative(Wrapper):
    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities.model_copy(update={"native_wakeups": True})


async def polling_declared_native(*, url: str | None = None, namespace: str = "default") -> World:
    """Fault: a watch that polls every 8 s, in a World declaring ``native_wakeups``."""
    world = _DeclaredNative(await _local(url, namespace))
    world.log = _PollingWatch(world.inner.log)
    return world


async def polling_honest(*, url: str | None = None, namespace: str = "default") -> World:
    """The control: the same watch polling every 8 s, ``native_wakeups`` left false."""
    world = Wrapper(await _local(url, namespace))
    world.log = _PollingWatch(world.inner.log)
    return world


class _Slow:
    """Not a fault: every call of ``inner`` (and every item of its iterators) is delayed by a
    random 0 to 20 ms, as on a loaded machine or a distant server."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if inspect.iscoroutinefunction(attr):

            async def call(*args: Any, **kwargs: Any) -> Any:
                await anyio.sleep(random.uniform(0, 0.02))
                return await attr(*args, **kwargs)

            return call
        if callable(attr):

            def follow(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                return _delayed(attr(*args, **kwargs))  # called now: it checks when called

            return follow
        return attr


async def _delayed(iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for item in iterator:
        await anyio.sleep(random.uniform(0, 0.02))
        yield item


async def slow(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.log = cast(Log, _Slow(world.inner.log))
    world.queue = cast(Queue, _Slow(world.inner.queue))
    world.stream = cast(Stream, _Slow(world.inner.stream))
    return world


class _ProcessPrivate(Wrapper):
    """Not a fault when declared: the local World in a folder of its own per process, so a
    child process never sees what its parent wrote (as an in-memory World would)."""

    def __init__(self, inner: World, *, declared_shared: bool) -> None:
        super().__init__(inner)
        self._declared_shared = declared_shared

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities.model_copy(update={"shared": self._declared_shared})


async def _process_private(url: str | None, namespace: str, *, shared: bool) -> World:
    folder = None if url is None else f"{url}/pid-{os.getpid()}"
    return _ProcessPrivate(await _local(folder, namespace), declared_shared=shared)


async def process_private(*, url: str | None = None, namespace: str = "default") -> World:
    """Honest: one process at a time (``shared=False``); process contracts must skip."""
    return await _process_private(url, namespace, shared=False)


async def process_private_claims_shared(
    *, url: str | None = None, namespace: str = "default"
) -> World:
    """Fault: process-private storage declared ``shared=True``; process contracts fail."""
    return await _process_private(url, namespace, shared=True)


class _DeafWatch(_LogFault):
    """Fault: ``watch`` yields what exists when it starts, then is never woken again."""

    async def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        for event in await self.inner.read(log_id, after=after):
            yield event
        await anyio.sleep_forever()


async def deaf_watch(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.log = _DeafWatch(world.inner.log)
    return world


class _NeverClosed(_StreamFault):
    """Fault: ``close`` does nothing, so no blob is ever complete (file contents are lost)."""

    async def close(self, stream_id: str) -> None:
        return None


async def streams_never_closed(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.stream = _NeverClosed(world.inner.stream)
    return world


class _TakenKeysDropped(_LogFault):
    """Fault: a batch carrying a key already in the log is appended anyway, without its keys
    (a key is no longer a compare-and-set: a stale edit is not refused)."""

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        try:
            return await self.inner.append(
                log_id, events, expect_tail=expect_tail, status=status, messages=messages
            )
        except DuplicateKeyError:
            unkeyed = [NewEvent(data=event.data) for event in events]
            return await self.inner.append(
                log_id, unkeyed, expect_tail=expect_tail, status=status, messages=messages
            )


async def taken_keys_dropped(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.log = _TakenKeysDropped(world.inner.log)
    return world


class _StreamDeleteIgnored(_StreamFault):
    """Fault: deleting a stream keeps it (a deleted session's live events and blobs stay)."""

    async def delete(self, stream_id: str) -> None:
        return None


async def stream_delete_ignored(*, url: str | None = None, namespace: str = "default") -> World:
    world = Wrapper(await _local(url, namespace))
    world.stream = _StreamDeleteIgnored(world.inner.stream)
    return world
