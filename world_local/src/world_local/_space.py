"""What the log, queue and stream of one namespace share: folders, file cache, threads, wake-ups."""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from world_core.errors import BackendUnavailableError, ClosedError, WorldError
from world_local._files import DamagedStoreError, FoldedFile, read_frame

__all__ = ["CACHED_FILES", "POLL_MAX", "POLL_MIN", "Space", "file_name", "pause", "translate"]

R = TypeVar("R")
F = TypeVar("F", bound=FoldedFile)

CACHED_FILES = 4096
"""Folded files kept in memory per namespace; the least recently used go beyond that."""

POLL_MIN = 0.005
"""First wait between two looks at a file another process may change (seconds)."""
POLL_MAX = 0.1
"""Longest wait between two looks; waits double from POLL_MIN up to this."""


def file_name(ident: str) -> str:
    """The file name of an identifier: its SHA-256, so no identifier can name a path. The
    identifier itself is kept in the file's header."""
    return hashlib.sha256(ident.encode("utf-8")).hexdigest()


class Space:
    """One namespace folder: ``logs/``, ``queues/``, ``streams/`` (one file per object) and
    ``outbox/``; the folded files this process keeps, its worker threads and its wake-ups."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.closed = False
        self._files: OrderedDict[tuple[str, str], FoldedFile] = OrderedDict()
        self._files_mutex = threading.Lock()
        self._names: dict[tuple[str, str], str] = {}
        # Per object, one event per event loop: a World may be used by one loop after another.
        self._events: dict[tuple[str, str], dict[object, anyio.Event]] = {}

    def file(self, cls: type[F], ident: str) -> F:
        """The (cached) folded file of ``ident`` in the ``cls.kind`` folder."""
        key = (cls.kind, ident)
        with self._files_mutex:
            found = self._files.get(key)
            if found is None:
                found = self._files[key] = cls(self.folder / cls.kind / file_name(ident), ident)
                if len(self._files) > CACHED_FILES:
                    # Safe even while in use: a second FoldedFile of the same file is
                    # excluded by flock like another process, and reads it afresh.
                    self._files.popitem(last=False)
            else:
                self._files.move_to_end(key)
        assert isinstance(found, cls)
        return found

    def ident_of(self, cls: type[FoldedFile], path: Path) -> str | None:
        """The identifier kept in the header of the file at ``path``; None if it is gone."""
        key = (cls.kind, path.name)
        with self._files_mutex:
            if key in self._names:
                return self._names[key]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            header = read_frame(fd, 0)
        finally:
            os.close(fd)
        if header is None or header[1]["kind"] != cls.kind:
            raise DamagedStoreError(f"{path} has no valid header")
        ident: str = header[1]["id"]
        with self._files_mutex:
            self._names[key] = ident  # the name is a hash of the id: this never changes
        return ident

    def forget(self) -> None:
        with self._files_mutex:
            self._files.clear()

    async def run(self, fn: Callable[[], R]) -> R:
        """Run blocking file work in a worker thread, with OS errors translated."""
        if self.closed:
            raise ClosedError("this local World was closed; open a new one")
        with translate(self.folder):
            return await anyio.to_thread.run_sync(fn)

    # Wake-ups: writers of this process set an Event per object; other processes are noticed
    # by polling with backoff (POLL_MIN doubling to POLL_MAX).

    def event(self, kind: str, ident: str) -> anyio.Event:
        """The event the next change of (kind, ident) in this process sets. Take it *before*
        looking at the state, so a change between the look and the wait is not missed."""
        by_loop = self._events.setdefault((kind, ident), {})
        loop = anyio.lowlevel.current_token()
        event = by_loop.get(loop)
        if event is None:
            event = by_loop[loop] = anyio.Event()
        return event

    def changed(self, kind: str, ident: str) -> None:
        for event in self._events.pop((kind, ident), {}).values():
            event.set()  # an event of a finished loop has no waiter left: setting it is harmless


@contextmanager
def translate(folder: Path) -> Iterator[None]:
    """The one place where file-system errors become World errors."""
    try:
        yield
    except DamagedStoreError as exc:
        raise WorldError(
            f"the local store in {folder} is damaged ({exc}); restore it from a backup"
        ) from exc
    except OSError as exc:
        raise BackendUnavailableError(
            f"local store in {folder}: {exc.strerror or exc}; check the disk and permissions, "
            "then retry"
        ) from exc


async def pause(event: anyio.Event, delay: float) -> None:
    """Wait for ``event`` or ``delay`` seconds, whichever comes first."""
    with anyio.move_on_after(delay):
        await event.wait()
