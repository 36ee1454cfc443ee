"""Log: one framed file per log; one frame per appended batch."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import suppress
from functools import partial
from typing import Any

from world_core.errors import (
    ClosedError,
    ConflictError,
    DuplicateKeyError,
)
from world_core.spi import (
    MAX_PAYLOAD_BYTES,
    Event,
    Log,
    LogInfo,
    NewEvent,
    OutboxMessage,
    Page,
    list_cursor,
    validate_append,
    validate_id,
    validate_list,
    validate_read,
)
from world_local import _outbox as outbox
from world_local._files import Blob, Busy, FoldedFile, read_exact
from world_local._queue import QueueFile
from world_local._space import POLL_MAX, POLL_MIN, Space, pause

__all__ = ["LocalLog"]


class LogFile(FoldedFile):
    """Frames: ``{"keys": [key or null per event], "status"?: str}`` with one blob per event."""

    kind = "logs"
    intent = False
    """An outbox append of this process may have left its intent (it raised before finishing
    it): the next append looks for one even if nothing else changed."""

    def reset(self) -> None:
        self.events: list[tuple[int, int, str | None]] = []  # (offset, size, key) of seq i+1
        self.keys: dict[str, int] = {}
        self.status: str | None = None

    def apply(self, meta: dict[str, Any], blobs: list[Blob]) -> None:
        for key, (offset, data) in zip(meta["keys"], blobs, strict=True):
            self.events.append((offset, len(data), key))
            if key is not None:
                self.keys[key] = len(self.events)
        if "status" in meta:
            self.status = meta["status"]

    @property
    def held(self) -> int:
        return len(self.events)

    @property
    def tail(self) -> int:
        return len(self.events)

    def info(self) -> LogInfo | None:
        return LogInfo(log_id=self.ident, tail=self.tail, status=self.status) if self.tail else None

    def fetch(self, after: int, limit: int | None, budget: int | None = None) -> list[Event]:
        return self.reading(lambda fd: self.read(fd, after, limit, budget))

    def current_info(self) -> LogInfo | None:
        return self.reading(lambda _: self.info())

    def event(self, fd: int, seq: int) -> Event:
        offset, size, key = self.events[seq - 1]
        return Event(seq=seq, data=read_exact(fd, size, offset), key=key)

    def read(
        self, fd: int | None, after: int, limit: int | None, budget: int | None = None
    ) -> list[Event]:
        """Events after ``after``, at most ``limit``, and once ``budget`` data bytes are
        reached no more (but at least one)."""
        if fd is None:
            return []
        stop = self.tail if limit is None else min(self.tail, after + limit)
        found: list[Event] = []
        size = 0
        for seq in range(after + 1, stop + 1):
            if budget is not None and found and size + self.events[seq - 1][1] > budget:
                break
            found.append(self.event(fd, seq))
            size += len(found[-1].data)
        return found


class LocalLog(Log):
    def __init__(self, space: Space) -> None:
        self._space = space

    def _file(self, log_id: str) -> LogFile:
        return self._space.file(LogFile, log_id)

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
        write = partial(self._write, log_id, events, expect_tail, status, messages)
        # An append with messages writes several files and fsyncs each: never inline.
        quick = None if messages else partial(write, quick=True)
        tail, queues = await self._space.run(write, creates=True, quick=quick)
        self._changed(log_id, queues)
        return tail

    def _write(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        expect_tail: int | None,
        status: str | None,
        messages: Sequence[OutboxMessage],
        *,
        quick: bool = False,
    ) -> tuple[int, list[str]]:
        """The file work of :meth:`append` (arguments validated): the new tail and the queues
        that received messages. Blocking: runs in a worker thread, or (``quick``, see
        ``FoldedFile.writing``) on the event loop's thread, raising Busy instead of waiting or
        of finishing an outbox append left behind."""
        meta: dict[str, Any] = {"keys": [event.key for event in events]}
        if status is not None:
            meta["status"] = status
        space, file = self._space, self._file(log_id)

        def work(fd: int | None) -> tuple[int, list[str]]:
            assert fd is not None
            if quick and file.intent:
                raise Busy(file.path)
            # What a crashed append left, first. An intent can only be left with the file
            # changed by another process (its frame, or a torn one), or by this process
            # (file.intent); an intent whose frame was never written is harmless, as finish()
            # compares the frame found at its offset, and is removed by the next claim.
            queues = outbox.finish(space, file, fd) if file.foreign or file.intent else []
            file.intent = False
            if expect_tail is not None and expect_tail != file.tail:
                raise ConflictError(
                    f"log {log_id!r} has tail {file.tail}, not {expect_tail}: read it and retry",
                    expected=expect_tail,
                    actual=file.tail,
                )
            for event in events:
                if event.key is not None and event.key in file.keys:
                    existing = file.event(fd, file.keys[event.key])
                    raise DuplicateKeyError(
                        f"log {log_id!r} already holds key {event.key!r} (seq {existing.seq}); "
                        "nothing of the batch was written",
                        key=event.key,
                        existing=existing,
                    )
            pending: outbox.Pending = []
            if messages:
                file.intent = True
                pending = outbox.begin(space, file, messages)
                meta["outbox"] = [message.id for _, message in pending]
            file.commit_fresh(fd, meta, [event.data for event in events])
            if messages:  # without, there is no intent: the one a crash left went first
                # Committed just now, under the lock: its messages go out as begin() made
                # them, with nothing read back. On disk the steps are finish()'s, in its
                # order (the frame fsynced, then the queues, then the intent removed).
                queues += outbox.complete(space, file, pending)
                file.intent = False
            return file.tail, queues

        return file.writing(work, quick=quick)

    def _changed(self, log_id: str, queues: list[str]) -> None:
        self._space.changed(LogFile.kind, log_id)
        for queue in queues:
            self._space.changed(QueueFile.kind, queue)

    def finish_outbox(self) -> list[str]:
        """Finish the outbox appends that crashed processes left, where the log is free; the
        queues that received messages. Blocking: call in a worker thread."""
        queues: list[str] = []
        for log_id in outbox.pending_logs(self._space):
            file = self._file(log_id)
            with suppress(Busy):  # its holder finishes it
                finish = partial(outbox.finish, self._space, file)
                queues += file.writing(finish, create=False, block=False)
        return queues

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        validate_read(log_id, after=after, limit=limit)
        file = self._file(log_id)
        return await self._space.run(partial(file.fetch, after, limit))

    async def get(self, log_id: str, key: str) -> Event | None:
        validate_id(log_id, "log_id")
        validate_id(key, "key")
        file = self._file(log_id)

        def work(fd: int | None) -> Event | None:
            seq = file.keys.get(key)
            return None if fd is None or seq is None else file.event(fd, seq)

        return await self._space.run(lambda: file.reading(work))

    async def tail(self, log_id: str) -> int:
        validate_id(log_id, "log_id")
        file = self._file(log_id)
        return await self._space.run(lambda: file.reading(lambda _: file.tail))

    async def info(self, log_id: str) -> LogInfo | None:
        validate_id(log_id, "log_id")
        file = self._file(log_id)
        return await self._space.run(lambda: file.reading(lambda _: file.info()))

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_read(log_id, after=after)
        if self._space.closed:
            raise ClosedError("this local World was closed; open a new one")
        return self._watch(log_id, after)

    async def _watch(self, log_id: str, after: int) -> AsyncIterator[Event]:
        file = self._file(log_id)
        delay = POLL_MIN
        while True:
            with self._space.wake_up(LogFile.kind, log_id) as changed:
                batch = await self._space.run(partial(file.fetch, after, None, MAX_PAYLOAD_BYTES))
                for event in batch:
                    yield event
                    after = event.seq
                if batch:
                    delay = POLL_MIN
                    continue
                await pause(changed, delay)
            delay = min(delay * 2, POLL_MAX)

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        after = validate_list(prefix=prefix, status=status, cursor=cursor, limit=limit) or ""
        folder = self._space.folder / LogFile.kind

        def work() -> Page[LogInfo]:
            try:
                names = [n for n in os.listdir(folder) if not n.startswith(".")]
            except FileNotFoundError:  # nothing stored in this namespace yet
                return Page(items=[])
            ids = sorted(
                ident
                for ident in (self._space.ident_of(LogFile, folder / name) for name in names)
                if ident is not None and ident.startswith(prefix) and ident > after
            )
            found: list[LogInfo] = []
            for ident in ids:
                info = self._file(ident).current_info()
                if info is not None and (status is None or info.status == status):
                    found.append(info)
                    if len(found) > limit:
                        break
            if len(found) > limit:
                last = found[limit - 1].log_id
                return Page(
                    items=found[:limit], next_cursor=list_cursor(last, prefix=prefix, status=status)
                )
            return Page(items=found)

        return await self._space.run(work)

    async def delete(self, log_id: str) -> None:
        validate_id(log_id, "log_id")
        file = self._file(log_id)

        def work(fd: int | None) -> list[str]:
            queues = outbox.finish(self._space, file, fd)  # a committed outbox outlives its log
            if fd is not None:
                file.remove()
            return queues

        queues = await self._space.run(lambda: file.writing(work, create=False))
        self._changed(log_id, queues)
