"""world-memory-example: an in-memory World, the smallest backend that passes the suite.

It lives outside the workspace on purpose: it shows how a backend in its own folder, with its
own ``pyproject.toml``, depends on ``world-core`` and ``world-conformance`` (see README.md).

Every ``connect`` with the same ``url`` and ``namespace`` in one process sees the same data
(one store per pair, kept in this module); other processes see nothing of it, so
``Capabilities.shared`` is false and the suite skips its process contracts.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import anyio

from world_core import (
    Capabilities,
    Chunk,
    ClosedError,
    ConflictError,
    DeadLetter,
    DuplicateKeyError,
    Event,
    Lease,
    LeaseLostError,
    LogInfo,
    NewEvent,
    NotFoundError,
    OutboxMessage,
    Page,
    StreamInfo,
    World,
)
from world_core.spi import (
    DEFAULT_MAX_ATTEMPTS,
    Log,
    Queue,
    Stream,
    list_cursor,
    validate_append,
    validate_claim,
    validate_dead_letters,
    validate_enqueue,
    validate_id,
    validate_lease,
    validate_list,
    validate_read,
    validate_release,
    validate_renew,
    validate_stream_read,
    validate_write,
)

__all__ = ["MemoryWorld", "connect"]

_POLL = 0.05
"""Longest a waiter sleeps between looks, should a wake-up be missed."""


@dataclass
class _Message:
    message_id: str
    payload: bytes
    max_attempts: int
    dedup_key: str | None
    visible_at: float
    order: int
    attempt: int = 0
    token: str | None = None
    deadline: float = 0.0


@dataclass
class _Store:
    """One namespace's data; shared by every connection to it in this process."""

    logs: dict[str, list[Event]] = field(default_factory=dict)
    status: dict[str, str | None] = field(default_factory=dict)
    queues: dict[str, dict[str, _Message]] = field(default_factory=dict)
    dead: dict[str, list[DeadLetter]] = field(default_factory=dict)
    streams: dict[str, list[bytes]] = field(default_factory=dict)
    closed_streams: set[str] = field(default_factory=set)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    dead_max_attempts: dict[tuple[str, str], int] = field(default_factory=dict)
    changed: anyio.Event | None = None

    def clear(self) -> None:
        for data in (self.logs, self.status, self.queues, self.dead, self.streams):
            data.clear()
        self.closed_streams.clear()
        self.dead_max_attempts.clear()
        self.touch()

    def touch(self) -> None:
        if self.changed is not None:
            self.changed.set()
            self.changed = None

    async def wait(self, bound: float = _POLL) -> None:
        if self.changed is None:
            self.changed = anyio.Event()
        with anyio.move_on_after(bound):
            await self.changed.wait()


_STORES: dict[tuple[str, str], _Store] = {}


def _visible_from(message: _Message) -> float:
    """A leased message is visible again from its deadline."""
    return message.visible_at if message.token is None else message.deadline


class _Part:
    def __init__(self, world: MemoryWorld) -> None:
        self._world = world

    def _check_open(self) -> None:
        if self._world.closed:
            raise ClosedError("this World was closed (aclose); open a new one")

    @property
    def _store(self) -> _Store:
        self._check_open()
        return self._world.store


class MemoryLog(_Part, Log):
    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        validate_append(log_id, events, expect_tail=expect_tail, status=status, messages=messages)
        store = self._store
        stored = store.logs.get(log_id, [])
        if expect_tail is not None and expect_tail != len(stored):
            raise ConflictError(
                f"log {log_id!r} has tail {len(stored)}, not {expect_tail}",
                expected=expect_tail,
                actual=len(stored),
            )
        for event in events:
            if event.key is not None:
                existing = next((e for e in stored if e.key == event.key), None)
                if existing is not None:
                    raise DuplicateKeyError(
                        f"key {event.key!r} is already in log {log_id!r}",
                        key=event.key,
                        existing=existing,
                    )
        tail = len(stored)
        new = [Event(seq=tail + i + 1, data=e.data, key=e.key) for i, e in enumerate(events)]
        store.logs[log_id] = [*stored, *new]
        if status is not None or log_id not in store.status:
            store.status[log_id] = status if status is not None else store.status.get(log_id)
        queue = self._world.memory_queue
        for message in messages:
            queue.add(message.queue, message.payload, message.delay, message.dedup_key,
                      message.max_attempts)  # fmt: skip
        store.touch()
        return tail + len(new)

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        validate_read(log_id, after=after, limit=limit)
        events = self._store.logs.get(log_id, [])[after:]
        return events if limit is None else events[:limit]

    async def get(self, log_id: str, key: str) -> Event | None:
        validate_id(log_id, "log_id")
        validate_id(key, "event key")
        return next((e for e in self._store.logs.get(log_id, []) if e.key == key), None)

    async def tail(self, log_id: str) -> int:
        validate_id(log_id, "log_id")
        return len(self._store.logs.get(log_id, []))

    async def info(self, log_id: str) -> LogInfo | None:
        validate_id(log_id, "log_id")
        store = self._store
        if log_id not in store.logs:
            return None
        return LogInfo(log_id=log_id, tail=len(store.logs[log_id]), status=store.status[log_id])

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        # A plain method that checks, then returns the generator: the body of an async
        # generator runs only at its first step, and a bad call must fail where it was made.
        seen = validate_read(log_id, after=after)
        self._check_open()
        return self._watch(log_id, seen)

    async def _watch(self, log_id: str, seen: int) -> AsyncIterator[Event]:
        while True:
            store = self._store
            for event in store.logs.get(log_id, [])[seen:]:
                seen = event.seq
                yield event
            await store.wait()

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        start = validate_list(prefix=prefix, status=status, cursor=cursor, limit=limit)
        store = self._store
        ids = sorted(
            i
            for i in store.logs
            if i.startswith(prefix)
            and (status is None or store.status[i] == status)
            and (start is None or i > start)
        )
        page = ids[:limit]
        items = [LogInfo(log_id=i, tail=len(store.logs[i]), status=store.status[i]) for i in page]
        more = len(ids) > limit
        next_cursor = list_cursor(page[-1], prefix=prefix, status=status) if more else None
        return Page(items=items, next_cursor=next_cursor)

    async def delete(self, log_id: str) -> None:
        validate_id(log_id, "log_id")
        store = self._store
        store.logs.pop(log_id, None)
        store.status.pop(log_id, None)


class MemoryQueue(_Part, Queue):
    def add(
        self, queue: str, payload: bytes, delay: float, dedup_key: str | None, max_attempts: int
    ) -> str:
        store = self._store
        messages = store.queues.setdefault(queue, {})
        if dedup_key is not None:
            for message in messages.values():
                if message.dedup_key == dedup_key:
                    return message.message_id
        message_id = f"m{next(store.ids)}-{secrets.token_hex(4)}"
        messages[message_id] = _Message(
            message_id, payload, max_attempts, dedup_key, time.time() + delay, next(store.ids)
        )
        store.touch()
        return message_id

    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        delay: float = 0.0,
        dedup_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> str:
        validate_enqueue(
            queue, payload, delay=delay, dedup_key=dedup_key, max_attempts=max_attempts
        )
        return self.add(queue, payload, float(delay), dedup_key, max_attempts)

    def _kill(self, queue: str, message: _Message, reason: str) -> None:
        store = self._store
        del store.queues[queue][message.message_id]
        letter = DeadLetter(
            queue=queue,
            message_id=message.message_id,
            payload=message.payload,
            attempts=message.attempt,
            reason=reason,
        )
        store.dead.setdefault(queue, []).append(letter)
        store.dead_max_attempts[(queue, message.message_id)] = message.max_attempts

    def _take(self, queue: str, worker: str, lease: float, limit: int) -> list[Lease]:
        now = time.time()
        messages = self._store.queues.get(queue, {})
        visible = sorted(
            (m for m in messages.values() if _visible_from(m) <= now),
            key=lambda m: (_visible_from(m), m.order),
        )
        leases: list[Lease] = []
        for message in visible:
            if len(leases) == limit:
                break
            if message.attempt >= message.max_attempts:
                self._kill(queue, message, f"{message.attempt} deliveries, none acked")
                continue
            message.attempt += 1
            message.token = secrets.token_hex(8)
            message.deadline = now + lease
            leases.append(
                Lease(
                    queue=queue,
                    message_id=message.message_id,
                    payload=message.payload,
                    attempt=message.attempt,
                    max_attempts=message.max_attempts,
                    token=message.token,
                    deadline=message.deadline,
                )
            )
        return leases

    async def claim(
        self, queue: str, worker: str, *, lease: float, limit: int = 1, wait: float = 0.0
    ) -> list[Lease]:
        validate_claim(queue, worker, lease=lease, limit=limit, wait=wait)
        until = time.monotonic() + wait
        while True:
            leases = self._take(queue, worker, float(lease), limit)
            left = until - time.monotonic()
            if leases or left <= 0:
                return leases
            await self._store.wait(min(left, _POLL))

    def _current(self, lease: Lease) -> _Message:
        message = self._store.queues.get(lease.queue, {}).get(lease.message_id)
        if message is None or message.token != lease.token:
            raise LeaseLostError(
                f"the lease on {lease.message_id!r} is no longer current: claimed again, "
                "acked or dead-lettered; drop this lease"
            )
        return message

    async def renew(self, lease: Lease, duration: float) -> Lease:
        seconds = validate_renew(lease, duration)
        message = self._current(lease)
        message.deadline = time.time() + seconds
        return lease.model_copy(update={"deadline": message.deadline})

    async def ack(self, lease: Lease) -> None:
        validate_lease(lease)
        message = self._current(lease)
        del self._store.queues[lease.queue][message.message_id]

    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        seconds = validate_release(lease, delay)
        message = self._current(lease)
        if message.attempt >= message.max_attempts:
            self._kill(lease.queue, message, f"released after {message.attempt} deliveries")
            return
        message.token = None
        message.visible_at = time.time() + seconds
        message.order = next(self._store.ids)
        self._store.touch()

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        validate_dead_letters(queue, limit=limit)
        return self._store.dead.get(queue, [])[:limit]

    async def requeue(self, queue: str, message_id: str) -> None:
        validate_id(queue, "queue")
        validate_id(message_id, "message_id")
        store = self._store
        letters = store.dead.get(queue, [])
        letter = next((d for d in letters if d.message_id == message_id), None)
        if letter is None:
            raise NotFoundError(f"no dead letter {message_id!r} in queue {queue!r}")
        letters.remove(letter)
        max_attempts = store.dead_max_attempts.pop((queue, message_id))
        store.queues.setdefault(queue, {})[message_id] = _Message(
            message_id, letter.payload, max_attempts, None, time.time(), next(store.ids)
        )
        store.touch()


class MemoryStream(_Part, Stream):
    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        validate_write(stream_id, chunks, expect_next=expect_next)
        store = self._store
        if stream_id in store.closed_streams:
            raise ClosedError(f"stream {stream_id!r} is closed; write to a new stream")
        stored = store.streams.setdefault(stream_id, [])
        if expect_next is not None and expect_next != len(stored):
            raise ConflictError(
                f"stream {stream_id!r} is at {len(stored)}, not {expect_next}",
                expected=expect_next,
                actual=len(stored),
            )
        stored.extend(chunks)
        store.touch()
        return len(stored)

    async def close(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        store = self._store
        store.streams.setdefault(stream_id, [])
        store.closed_streams.add(stream_id)
        store.touch()

    async def info(self, stream_id: str) -> StreamInfo:
        validate_id(stream_id, "stream_id")
        store = self._store
        return StreamInfo(
            stream_id=stream_id,
            next_index=len(store.streams.get(stream_id, [])),
            closed=stream_id in store.closed_streams,
        )

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        # Checked here, not in the generator (see MemoryLog.watch).
        index = validate_stream_read(stream_id, start=start)
        self._check_open()
        return self._follow(stream_id, index)

    async def _follow(self, stream_id: str, index: int) -> AsyncIterator[Chunk]:
        if index < 0:
            index = max(0, len(self._store.streams.get(stream_id, [])) + index)
        while True:
            store = self._store
            stored = store.streams.get(stream_id, [])
            while index < len(stored):
                yield Chunk(index=index, data=stored[index])
                index += 1
            if stream_id in store.closed_streams:
                return
            await store.wait()

    async def delete(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        store = self._store
        store.streams.pop(stream_id, None)
        store.closed_streams.discard(stream_id)


class MemoryWorld(World):
    """A namespace of an in-process store; see the module docstring."""

    def __init__(self, url: str, namespace: str) -> None:
        self.name = "memory_example"
        self.namespace = namespace
        self.url = url
        self.store = _STORES.setdefault((url, namespace), _Store())
        self.closed = False
        self.log = MemoryLog(self)
        self.memory_queue = MemoryQueue(self)
        self.queue = self.memory_queue
        self.stream = MemoryStream(self)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(outbox=True, shared=False)

    def settings(self) -> Mapping[str, str]:
        return {"url": self.url, "namespace": self.namespace}

    async def purge(self) -> None:
        if self.closed:
            raise ClosedError("this World was closed (aclose); open a new one")
        self.store.clear()

    async def aclose(self) -> None:
        self.closed = True


async def connect(*, url: str | None = None, namespace: str = "default") -> MemoryWorld:
    """Open ``namespace`` of the in-process store named ``url`` (any text; default ``memory``)."""
    return MemoryWorld(url or "memory", namespace)


connect.needs_server = False  # type: ignore[attr-defined]  # a function attribute
