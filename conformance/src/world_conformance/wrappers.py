"""Pass-through wrappers, the base of fault injection: a Log, a Stream and a World that
delegate every call to the World under test, so a subclass changes one behaviour in plain
sight.

Used by the journal contracts (a log whose append fails once) and by the suite's own proof
that its contracts can fail (``conformance/tests/faulty_worlds.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

from world_core import (
    Capabilities,
    Chunk,
    Event,
    LogInfo,
    NewEvent,
    OutboxMessage,
    Page,
    StreamInfo,
    World,
)
from world_core.spi import Log, Queue, Stream

__all__ = ["PassThroughLog", "PassThroughStream", "PassThroughWorld"]


class PassThroughLog(Log):
    """Delegates every call to ``inner``."""

    def __init__(self, inner: Log) -> None:
        self.inner = inner

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        return await self.inner.append(
            log_id, events, expect_tail=expect_tail, status=status, messages=messages
        )

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        return await self.inner.read(log_id, after=after, limit=limit)

    async def get(self, log_id: str, key: str) -> Event | None:
        return await self.inner.get(log_id, key)

    async def tail(self, log_id: str) -> int:
        return await self.inner.tail(log_id)

    async def info(self, log_id: str) -> LogInfo | None:
        return await self.inner.info(log_id)

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        return self.inner.watch(log_id, after=after)

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        return await self.inner.list_logs(prefix=prefix, status=status, cursor=cursor, limit=limit)

    async def delete(self, log_id: str) -> None:
        await self.inner.delete(log_id)


class PassThroughStream(Stream):
    """Delegates every call to ``inner``."""

    def __init__(self, inner: Stream) -> None:
        self.inner = inner

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        return await self.inner.write(stream_id, chunks, expect_next=expect_next)

    async def close(self, stream_id: str) -> None:
        await self.inner.close(stream_id)

    async def info(self, stream_id: str) -> StreamInfo:
        return await self.inner.info(stream_id)

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        return self.inner.read(stream_id, start=start)

    async def delete(self, stream_id: str) -> None:
        await self.inner.delete(stream_id)


class PassThroughWorld(World):
    """Delegates everything to ``inner``; ``log``, ``queue`` or ``stream`` replace its parts
    (or a subclass assigns them)."""

    def __init__(
        self,
        inner: World,
        *,
        log: Log | None = None,
        queue: Queue | None = None,
        stream: Stream | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.namespace = inner.namespace
        self.log = log if log is not None else inner.log
        self.queue = queue if queue is not None else inner.queue
        self.stream = stream if stream is not None else inner.stream

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def settings(self) -> Mapping[str, str]:
        return self.inner.settings()

    async def purge(self) -> None:
        await self.inner.purge()

    async def aclose(self) -> None:
        await self.inner.aclose()
