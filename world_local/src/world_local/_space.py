"""What the log, queue and stream of one namespace share: folders, file cache, threads, wake-ups."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.lowlevel

from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    WorldError,
)
from world_local._files import Busy, DamagedStoreError, FoldedFile, fsync_dir, read_frame
from world_local._threads import inline_ok, run_inline, run_sync

__all__ = [
    "CACHED_FILES",
    "CACHED_NAMES",
    "CACHED_RECENT",
    "CACHED_RECORDS",
    "OPEN_FILES",
    "ENV_DIR",
    "KINDS",
    "POLL_MAX",
    "POLL_MIN",
    "Space",
    "file_name",
    "pause",
    "translate",
]

R = TypeVar("R")
F = TypeVar("F", bound=FoldedFile)

ENV_DIR = "WORKFLOW_LOCAL_DIR"

KINDS = ("logs", "queues", "streams", "outbox")
"""The folders of a namespace: one file per log, queue, stream, and outbox intents."""

CACHED_FILES = 4096
"""Folded files kept in memory per namespace; the least recently used go beyond that."""
CACHED_RECORDS = 16_384
"""Records (log events, stream chunks, queue messages) the folded files kept in memory per
namespace index together, at about 300 bytes each (about 5 MiB). Beyond that the least
recently used files go, down to the CACHED_RECENT used last whatever their size. A file that
went is folded again from disk when next used, as one never cached."""
CACHED_RECENT = 16
"""The files used last, kept over CACHED_RECORDS: a long log and the queue a worker uses with
it do not push each other out (and get folded again from disk) at every call."""
OPEN_FILES = 64
"""Files kept open per namespace between calls (the least recently opened are closed beyond
that): a call on an open file saves its open, close and header read."""
CACHED_NAMES = 4096
"""File names whose identifier (read from the file's header, for listings) is kept per
namespace; the least recently used go beyond that and are read from the header again."""

POLL_MIN = 0.005
"""First wait between two looks at a file another process may change (seconds)."""
POLL_MAX = 0.1
"""Longest wait between two looks; waits double from POLL_MIN up to this."""


_SPACES: weakref.WeakSet[Space] = weakref.WeakSet()
"""Every Space of this process, for :func:`_after_fork`."""


def _after_fork() -> None:
    for space in list(_SPACES):
        space._forked()


os.register_at_fork(after_in_child=_after_fork)


def file_name(ident: str) -> str:
    """The file name of an identifier: its SHA-256, so no identifier can name a path. The
    identifier itself is kept in the file's header."""
    return hashlib.sha256(ident.encode("utf-8")).hexdigest()


class Space:
    """One namespace folder: ``logs/``, ``queues/``, ``streams/`` (one file per object) and
    ``outbox/``; the folded files this process keeps, its worker threads and its wake-ups.

    The folders are made by the first call that stores something (:meth:`run` with
    ``creates``), not when the World opens: until then every read finds no file and answers
    as for an empty namespace, and calls that store nothing leave the disk as it was.
    """

    def __init__(self, folder: Path, setting: str = ENV_DIR) -> None:
        self.folder = folder
        self.setting = setting
        """Where the folder came from, for messages: ``WORKFLOW_LOCAL_DIR`` or ``url=``."""
        self._translate = translate(folder, setting)
        self.closed = False
        self._made = False  # the folders exist: made (or found) by this process's first write
        self._files: OrderedDict[tuple[str, str], FoldedFile] = OrderedDict()
        self._files_mutex = threading.Lock()
        self._held = 0  # records the cached files index: the sum of their ``reported``
        self._names: OrderedDict[tuple[str, str], str] = OrderedDict()  # guarded by _files_mutex
        self._open: OrderedDict[FoldedFile, None] = OrderedDict()  # in order of opening
        # Per object, one wake-up per event loop: a World may be used by one loop after
        # another. Only while a waiter holds it: a process that waited on many objects once
        # (a client waiting for the replies of many sessions) keeps none of them.
        self._events: dict[tuple[str, str], dict[object, _Wake]] = {}
        self._pollers: dict[tuple[str, str], dict[object, anyio.Lock]] = {}
        _SPACES.add(self)

    def _forked(self) -> None:
        """In a child after ``fork``, which copied only the thread that called it: a mutex
        another thread held at that instant would stay held for ever, and what it guarded may
        be half changed. So the child starts afresh: new mutexes, no folded or open files (it
        folds each file again from disk at its next use; the dropped ones close their
        descriptors when collected), no cached names. Its wake-ups and pollers belong to
        event loops, which a child does not go on with."""
        self._files_mutex = threading.Lock()
        self._files = OrderedDict()
        self._open = OrderedDict()
        self._names = OrderedDict()
        self._held = 0

    def file(self, cls: type[F], ident: str) -> F:
        """The (cached) folded file of ``ident`` in the ``cls.kind`` folder."""
        key = (cls.kind, ident)
        with self._files_mutex:
            found = self._files.get(key)
            if found is None:
                path = self.folder / cls.kind / file_name(ident)
                found = self._files[key] = cls(path, ident, self._resized, self._opened)
                self._trim()
            else:
                self._files.move_to_end(key)
        assert isinstance(found, cls)
        return found

    def _resized(self, file: FoldedFile) -> None:
        """Count the change of ``file.held`` (called holding ``file.mutex``), then trim."""
        with self._files_mutex:
            held, before = file.held, file.reported
            file.reported = held
            if self._files.get((file.kind, file.ident)) is file:  # not a file trimmed away
                self._held += held - before
                self._trim()

    def _opened(self, file: FoldedFile) -> None:
        """Count ``file`` as open (called holding its mutex); close the least recently opened
        beyond OPEN_FILES (at once if not in use, else after their use)."""
        with self._files_mutex:
            self._open[file] = None
            self._open.move_to_end(file)
            while len(self._open) > OPEN_FILES:
                old, _ = self._open.popitem(last=False)
                old.let_go()

    def _trim(self) -> None:
        """Drop the least recently used files while over CACHED_FILES, or over CACHED_RECORDS
        beyond the CACHED_RECENT used last; call holding ``_files_mutex``. Safe even for a
        file in use: a second FoldedFile of the same file is excluded by flock like another
        process's, and folds the file afresh (each use reads what was committed since it last
        looked)."""
        while len(self._files) > CACHED_FILES or (
            self._held > CACHED_RECORDS and len(self._files) > CACHED_RECENT
        ):
            _, old = self._files.popitem(last=False)
            self._held -= old.reported

    def ident_of(self, cls: type[FoldedFile], path: Path) -> str | None:
        """The identifier kept in the header of the file at ``path``; None if it is gone."""
        key = (cls.kind, path.name)
        with self._files_mutex:
            found = self._names.get(key)
            if found is not None:
                self._names.move_to_end(key)
                return found
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
            while len(self._names) > CACHED_NAMES:
                self._names.popitem(last=False)
        return ident

    def forget(self) -> None:
        """Drop every folded file and close the open ones (those in use after their use)."""
        with self._files_mutex:
            self._files.clear()
            self._held = 0
            while self._open:
                self._open.popitem()[0].let_go()

    def make_folders(self) -> None:
        """Create the namespace's folders (and their parents) if missing; blocking. Safe in any
        number of threads and processes at once: ``mkdir`` of an existing folder is a no-op."""
        for kind in KINDS:
            (self.folder / kind).mkdir(parents=True, exist_ok=True)
        fsync_dir(self.folder)  # the folders hold acknowledged files from now on
        fsync_dir(self.folder.parent)
        self._made = True

    async def run(
        self, fn: Callable[[], R], *, creates: bool = False, quick: Callable[[], R] | None = None
    ) -> R:
        """Run blocking file work in a worker thread, with OS errors translated.

        ``creates``: ``fn`` may create a file, so the folders are made first (once per
        process; afterwards this costs one flag test).

        ``quick``: the same work, raising :class:`Busy` before doing anything if it would wait
        (``FoldedFile.writing``'s ``quick``). When the hand-off policy allows
        (``_threads.inline_ok``) it runs on this thread instead of ``fn`` in a worker thread,
        after one checkpoint: the other tasks' turn, as a hop gives, and the call's only
        cancellation point, before anything is done (nothing awaits after the work, so its
        result is returned); ``fn`` runs if it raised Busy.
        """
        self._check_open()
        if quick is not None and inline_ok():
            await anyio.lowlevel.checkpoint()
            self._check_open()  # closed meanwhile
            if inline_ok():
                try:
                    with self._translate:
                        return run_inline(quick)
                except Busy:
                    pass
        work = partial(self._in_folders, fn) if creates and not self._made else fn
        with self._translate:
            return await run_sync(work)

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("this local World was closed; open a new one")

    def _in_folders(self, fn: Callable[[], R]) -> R:
        self.make_folders()
        return fn()

    # Wake-ups: writers of this process set an Event per object; other processes are noticed
    # by polling with backoff (POLL_MIN doubling to POLL_MAX).

    @contextmanager
    def wake_up(self, kind: str, ident: str) -> Iterator[anyio.Event]:
        """The event the next change of (kind, ident) in this process sets, held for the
        block. Take it *before* looking at the state, so a change between the look and the
        wait is not missed. Forgotten when the last block holding it ends unset."""
        key = (kind, ident)
        wake = _of_this_loop(self._events.setdefault(key, {}), _Wake)
        wake.holders += 1
        try:
            yield wake.event
        finally:
            wake.holders -= 1
            held = self._events.get(key)
            loop = anyio.lowlevel.current_token()
            if not wake.holders and held is not None and held.get(loop) is wake:
                del held[loop]
                if not held:
                    del self._events[key]

    def poller(self, kind: str, ident: str) -> anyio.Lock:
        """The lock that the one waiter of this process polling (kind, ident) holds; give it
        back with :meth:`poller_done`."""
        return _of_this_loop(self._pollers.setdefault((kind, ident), {}), anyio.Lock)

    def poller_done(self, kind: str, ident: str, lock: anyio.Lock) -> None:
        lock.release()
        if not lock.locked() and not lock.statistics().tasks_waiting:  # nobody polls: forget it
            by_loop = self._pollers.get((kind, ident), {})
            by_loop.pop(anyio.lowlevel.current_token(), None)
            if not by_loop:
                self._pollers.pop((kind, ident), None)

    def changed(self, kind: str, ident: str) -> None:
        for wake in self._events.pop((kind, ident), {}).values():
            wake.event.set()  # an event of a finished loop has no waiter left: harmless


class _Wake:
    """One object's wake-up event in one event loop, and how many waiters hold it."""

    __slots__ = ("event", "holders")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.holders = 0


T = TypeVar("T")


def _of_this_loop(by_loop: dict[object, T], make: Callable[[], T]) -> T:
    """The object of the running event loop in ``by_loop``, made if missing."""
    loop = anyio.lowlevel.current_token()
    found = by_loop.get(loop)
    if found is None:
        found = by_loop[loop] = make()
    return found


# A folder that cannot be used as it is set: retrying will not help, the setting must change.
_SETTINGS_ERRORS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP}
)


def _file_in_the_way(path: Path) -> Path | None:
    """The first part of ``path`` that exists and is not a folder."""
    for part in [*reversed(path.parents), path]:
        try:
            mode = os.stat(part).st_mode
        except OSError:
            return None
        if not stat.S_ISDIR(mode):
            return part
    return None


def _os_error(folder: Path, setting: str, exc: OSError) -> WorldError:
    where = f"the local World's folder {folder} (from {setting})"
    path = Path(os.fsdecode(exc.filename)) if exc.filename is not None else folder
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = _file_in_the_way(path)
        if blocker is not None:
            return ConfigurationError(
                f"{where} cannot be used: {blocker} is a file, not a folder. Point {setting} at "
                "a folder (it is created if missing), or move that file away"
            )
    if exc.errno in _SETTINGS_ERRORS:
        return ConfigurationError(
            f"{where} cannot be used: {reason} for {path}. Point {setting} at a folder this "
            f"user (uid {os.geteuid()}) can create and write, or fix that folder's permissions"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return BackendUnavailableError(
            f"{where}: the disk is full ({reason}); free space, then retry"
        )
    return BackendUnavailableError(f"{where}: {reason} ({path}); check the disk, then retry")


class translate:
    """The one place where file-system errors become World errors. ``setting`` names where
    ``folder`` came from (``WORKFLOW_LOCAL_DIR`` or ``url=``): a folder that cannot be used (a
    file in its path, no permission, a read-only file system) is a ConfigurationError naming
    it; other faults are transient.

    A context manager, and a class rather than a generator: it wraps every call, and a
    generator-based one costs a generator and its frame each time; an instance keeps no state
    between uses, so one may be reused (and nested)."""

    __slots__ = ("folder", "setting")

    def __init__(self, folder: Path, setting: str = ENV_DIR) -> None:
        self.folder = folder
        self.setting = setting

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, DamagedStoreError):
            raise WorldError(
                f"the local store in {self.folder} is damaged ({exc}); restore it from a backup"
            ) from exc
        if isinstance(exc, OSError):
            raise _os_error(self.folder, self.setting, exc) from exc


async def pause(event: anyio.Event, delay: float) -> None:
    """Wait for ``event`` or ``delay`` seconds, whichever comes first."""
    with anyio.move_on_after(delay):
        await event.wait()
