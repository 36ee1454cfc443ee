"""Stream: one framed file per stream; a frame is a batch of chunks or the close mark."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from world_core.errors import ClosedError, ConflictError
from world_core.spi import (
    MAX_PAYLOAD_BYTES,
    Chunk,
    Stream,
    StreamInfo,
    validate_id,
    validate_stream_read,
    validate_write,
)
from world_local._files import Blob, FoldedFile, encode_frame, read_exact
from world_local._space import POLL_MAX, POLL_MIN, Space, pause

__all__ = ["LocalStream"]


class StreamFile(FoldedFile):
    """Frames: ``{"chunks": n}`` with one blob per chunk, or ``{"closed": true}``."""

    kind = "streams"

    def reset(self) -> None:
        self.chunks: list[tuple[int, int]] = []  # (offset, size) of chunk i
        self.closed = False

    def apply(self, meta: dict[str, Any], blobs: list[Blob]) -> None:
        self.chunks.extend((offset, len(data)) for offset, data in blobs)
        self.closed = self.closed or bool(meta.get("closed"))

    @property
    def held(self) -> int:
        return len(self.chunks)

    def info(self) -> StreamInfo:
        return StreamInfo(stream_id=self.ident, next_index=len(self.chunks), closed=self.closed)

    def fetch(self, start: int, budget: int) -> tuple[list[Chunk], bool]:
        """Chunks from ``start`` (once ``budget`` bytes are reached no more, but at least one),
        and whether the stream ends after them."""

        def work(fd: int | None) -> tuple[list[Chunk], bool]:
            found: list[Chunk] = []
            total = 0
            index = start
            while fd is not None and index < len(self.chunks):
                offset, size = self.chunks[index]
                if found and total + size > budget:
                    break
                found.append(Chunk(index=index, data=read_exact(fd, size, offset)))
                total += size
                index += 1
            return found, self.closed and index >= len(self.chunks)

        return self.reading(work)


class LocalStream(Stream):
    def __init__(self, space: Space) -> None:
        self._space = space

    def _file(self, stream_id: str) -> StreamFile:
        return self._space.file(StreamFile, stream_id)

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        validate_write(stream_id, chunks, expect_next=expect_next)
        frame = encode_frame({"chunks": len(chunks)}, list(chunks))
        file = self._file(stream_id)

        def work(fd: int | None) -> int:
            assert fd is not None
            if file.closed:
                raise ClosedError(f"stream {stream_id!r} is closed; write to a new stream")
            if expect_next is not None and expect_next != len(file.chunks):
                raise ConflictError(
                    f"stream {stream_id!r} is at index {len(file.chunks)}, not {expect_next}",
                    expected=expect_next,
                    actual=len(file.chunks),
                )
            file.commit(fd, frame)
            return len(file.chunks)

        next_index = await self._space.run(lambda: file.writing(work), creates=True)
        self._space.changed(StreamFile.kind, stream_id)
        return next_index

    async def close(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        file = self._file(stream_id)

        def work(fd: int | None) -> None:
            assert fd is not None
            if not file.closed:
                file.commit(fd, encode_frame({"closed": True}))

        await self._space.run(lambda: file.writing(work), creates=True)
        self._space.changed(StreamFile.kind, stream_id)

    async def info(self, stream_id: str) -> StreamInfo:
        validate_id(stream_id, "stream_id")
        file = self._file(stream_id)
        return await self._space.run(lambda: file.reading(lambda _: file.info()))

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_stream_read(stream_id, start=start)
        if self._space.closed:
            raise ClosedError("this local World was closed; open a new one")
        return self._read(stream_id, start)

    async def _read(self, stream_id: str, start: int) -> AsyncIterator[Chunk]:
        file = self._file(stream_id)
        if start < 0:
            info = await self.info(stream_id)
            start = max(0, info.next_index + start)
        delay = POLL_MIN
        while True:
            with self._space.wake_up(StreamFile.kind, stream_id) as changed:
                found, ended = await self._space.run(partial(file.fetch, start, MAX_PAYLOAD_BYTES))
                for chunk in found:
                    yield chunk
                    start = chunk.index + 1
                if ended:
                    return
                if found:
                    delay = POLL_MIN
                    continue
                await pause(changed, delay)
            delay = min(delay * 2, POLL_MAX)

    async def delete(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        file = self._file(stream_id)

        def work(fd: int | None) -> None:
            if fd is not None:
                file.remove()

        await self._space.run(lambda: file.writing(work, create=False))
        self._space.changed(StreamFile.kind, stream_id)
