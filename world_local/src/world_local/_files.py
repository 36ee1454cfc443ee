"""Framed record files: the one storage mechanism of the local World.

Every log, queue and stream is one append-only file of *frames*::

    frame = b"WREC" | body length (u32 LE) | crc32(body) (u32 LE) | body
    body  = meta length (u32 LE) | meta (JSON, UTF-8) | blob 1 | blob 2 | ...

``meta["sizes"]`` holds the blob lengths. The first frame is the file's header
(``{"kind", "id", "uuid"}``); it is written into a temporary file, fsynced and hard-linked
into place, so a data file never exists without a whole header. The uuid tells a reader that
the file at a path was replaced (deleted and created again, or compacted) since it last looked.

A frame is one transaction. It is valid only when it is complete and its checksum matches, so
a frame torn by a crash is invisible: readers stop before it and the next writer, holding the
file's lock, truncates it away before appending. Writers hold ``fcntl.flock`` on the data file
itself and check, once locked, that the path still names the file they locked.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar, TypeVar

__all__ = [
    "Blob",
    "Busy",
    "DamagedStoreError",
    "FoldedFile",
    "encode_frame",
    "fsync_dir",
    "read_exact",
    "read_frame",
    "sweep_temps",
    "temp_file",
]

MAGIC = b"WREC"
TEMP_PREFIX = ".tmp-"
_HEAD = struct.Struct("<4sII")
_U32 = struct.Struct("<I")
_to_json = json.JSONEncoder(separators=(",", ":")).encode  # made once: dumps() makes one a call

Blob = tuple[int, bytes]
"""A blob as read back: its offset in the file and its bytes."""

R = TypeVar("R")


class Busy(Exception):
    """A lock asked for without waiting is held by another thread or process."""


class DamagedStoreError(Exception):
    """A file holds something no crash of ours can produce (edited or foreign files)."""


def encode_frame(meta: dict[str, Any], blobs: Sequence[bytes] = ()) -> bytes:
    """One frame holding ``meta`` and ``blobs``."""
    text = _to_json({**meta, "sizes": [len(b) for b in blobs]})
    raw = text.encode("utf-8")
    body = b"".join([_U32.pack(len(raw)), raw, *blobs])
    return _HEAD.pack(MAGIC, len(body), zlib.crc32(body)) + body


def read_exact(fd: int, size: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while size > 0:
        part = os.pread(fd, size, offset)
        if not part:
            break
        parts.append(part)
        size -= len(part)
        offset += len(part)
    return b"".join(parts)


def read_frame(
    fd: int, offset: int, size: int | None = None
) -> tuple[int, dict[str, Any], list[Blob]] | None:
    """The frame at ``offset`` as (end offset, meta, blobs), or None when it is not (yet)
    whole: missing, short, or failing its checksum. ``size``: the file's size if known (an
    fstat saved), else it is looked up."""
    head = read_exact(fd, _HEAD.size, offset)
    if len(head) < _HEAD.size:
        return None
    magic, length, crc = _HEAD.unpack(head)
    if magic != MAGIC:
        return None
    start = offset + _HEAD.size
    if size is None:
        size = os.fstat(fd).st_size
    if start + length > size:  # not yet (or never) whole; don't read garbage
        return None
    body = read_exact(fd, length, start)
    if len(body) < length or zlib.crc32(body) != crc:
        return None
    meta, blobs = _parse_body(body, start)
    return start + length, meta, blobs


def _parse_body(body: bytes, start: int) -> tuple[dict[str, Any], list[Blob]]:
    """The meta and blobs of a whole frame's body that begins at offset ``start``."""
    (meta_len,) = _U32.unpack_from(body)
    meta: dict[str, Any] = json.loads(body[4 : 4 + meta_len])
    blobs: list[Blob] = []
    pos = 4 + meta_len
    for size in meta.pop("sizes"):
        blobs.append((start + pos, body[pos : pos + size]))
        pos += size
    return meta, blobs


def fsync_dir(path: Path) -> None:
    """Make a creation, rename or removal in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    """Write all of ``data``, at ``offset`` if given (else at the file position)."""
    view = memoryview(data)
    while view:
        if offset is None:
            view = view[os.write(fd, view) :]
        else:
            done = os.pwrite(fd, view, offset)
            view, offset = view[done:], offset + done


@contextmanager
def temp_file(folder: Path, data: bytes) -> Iterator[Path]:
    """A new fsynced file in ``folder`` holding ``data``, for the block to link or rename into
    place. It is flocked while the block runs, so :func:`sweep_temps` never takes it, and its
    name is removed afterwards (a no-op once renamed)."""
    tmp = folder / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_all(fd, data)
        os.fsync(fd)
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)
        os.close(fd)


def sweep_temps(folder: Path) -> None:
    """Remove the temporary files that killed processes left in ``folder``."""
    for name in os.listdir(folder):
        if not name.startswith(TEMP_PREFIX):
            continue
        try:
            fd = os.open(folder / name, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, folder / name):  # still a temporary, and its writer is gone
                os.unlink(folder / name)
        except BlockingIOError:
            pass  # its writer is alive
        finally:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


_forks = 0
"""Incremented in a child process after fork: descriptors opened before it are shared with
the parent, and so would be its flocks (a lock belongs to the open file, not the process)."""


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class FoldedFile:
    """One record file folded into in-memory state, kept in step incrementally.

    Subclasses define the state (``reset``) and how a frame changes it (``apply``). Every use
    goes through :meth:`reading` or :meth:`writing`, which run in a worker thread (a ``quick``
    write may run on the event loop's: it waits for no lock): they hold ``self.mutex``
    (threads of this process) and, for writing, the file's flock (processes).

    The file stays open between uses (a few syscalls less each: no open, close, path lookup or
    header read), while its owner (``opened``) lets it: it bounds how many files a process
    keeps open and closes the others with :meth:`let_go`. An open file is checked at every use:
    when the path no longer names it (deleted, purged, or compacted: replaced by a rename) it
    is closed and the path opened again. Readers and writers both look the path up (a hard
    link made elsewhere keeps a deleted file's link count above 0), so no read or write uses a
    file the path no longer names. A file
    held open since the state was folded from it needs no header check: its inode cannot have
    been reused meanwhile, and its size says whether anything was appended.
    """

    kind: ClassVar[str]

    def __init__(
        self,
        path: Path,
        ident: str,
        resized: Callable[[FoldedFile], None] | None = None,
        opened: Callable[[FoldedFile], None] | None = None,
    ) -> None:
        self.path = path
        self.ident = ident
        self.resized = resized
        """Called, holding ``mutex``, when :attr:`held` differs from :attr:`reported`."""
        self.reported = 0
        """:attr:`held` as ``resized`` last recorded it (it sets this)."""
        self.opened = opened
        """Called, holding ``mutex``, when the file was opened (to bound open files)."""
        self.mutex = threading.Lock()
        self.uuid: str | None = None
        self.end = 0
        self.foreign = True
        """The last sync found something this process did not write (the file opened anew,
        frames appended by another process, a torn tail): what a crash elsewhere may have
        left must be looked for."""
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None  # of the open file, once a reader looked
        self._writable = False
        self._forks = _forks
        self._checked = False  # the header of the open file was read since it was opened
        self._drop = False  # the file was unlinked or replaced: close it after this use
        self._unsynced = False  # a frame was committed with sync=False in this use
        self.keep_open = True
        """False once the owner asked to close the file (:meth:`let_go`) while it was in use."""
        self.reset()

    def reset(self) -> None:
        """Forget all state: the file is missing or was replaced."""
        raise NotImplementedError

    def apply(self, meta: dict[str, Any], blobs: list[Blob]) -> None:
        """Fold one committed frame into the state."""
        raise NotImplementedError

    @property
    def held(self) -> int:
        """Records the state indexes in memory (one entry per event, chunk or message): what
        a cache of folded files counts."""
        raise NotImplementedError

    @property
    def exists(self) -> bool:
        return self.uuid is not None

    def _report(self) -> None:
        if self.resized is not None and self.held != self.reported:
            self.resized(self)

    def _open(self, writable: bool) -> int | None:
        """The file at the path, open (kept from an earlier use if still valid to keep); None
        if missing. Holding ``mutex``."""
        fd = self._fd
        if fd is not None and (self._forks != _forks or (writable and not self._writable)):
            self._close()
            fd = None
        if fd is not None:
            return fd
        try:
            fd = os.open(self.path, os.O_RDWR)
            self._writable = True
        except FileNotFoundError:
            return None
        except OSError as exc:  # a read-only store can still be read
            if writable or exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            fd = os.open(self.path, os.O_RDONLY)
            self._writable = False
        self._fd, self._forks, self._checked, self.keep_open = fd, _forks, False, True
        if self.opened is not None:
            self.opened(self)
        return fd

    def _close(self) -> None:
        """Close the open file (releasing its flock, if held). Holding ``mutex``."""
        fd, self._fd, self._drop, self._inode = self._fd, None, False, None
        if fd is not None:
            os.close(fd)

    def _done(self) -> None:
        """After a use, holding ``mutex``: close the file if it went or the owner asked to."""
        if self._drop or not self.keep_open:
            self._close()

    def let_go(self) -> None:
        """Close the file now if it is not in use, else after its current use."""
        if self.mutex.acquire(blocking=False):
            try:
                self._close()
            finally:
                self.mutex.release()
        else:
            self.keep_open = False

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)  # not set if __init__ failed
        if fd is not None:
            with suppress(OSError):
                os.close(fd)

    def _sync(self, fd: int | None, st: os.stat_result | None) -> None:
        """Bring the state up to the last whole frame of the file open at ``fd`` (of stat
        ``st``)."""
        if fd is None or st is None:
            self.uuid, self.end, self.foreign = None, 0, True
            self.reset()
            self._report()
            return
        # Unchanged since this process last used it (the same open file, the size it left):
        # nothing to read. Else the header too is checked, as every file once.
        self.foreign = not self._checked or st.st_size != self.end
        if self.foreign:
            header = read_frame(fd, 0, st.st_size)
            if header is None:  # files are linked into place whole, so this is not a crash
                raise DamagedStoreError(f"{self.path} has no valid header")
            end, meta, _ = header
            if meta["uuid"] != self.uuid:
                if (meta["kind"], meta["id"]) != (self.kind, self.ident):
                    raise DamagedStoreError(f"{self.path} holds {meta['kind']} {meta['id']!r}")
                self.uuid, self.end = meta["uuid"], end
                self.reset()
            elif st.st_size < self.end:  # committed frames gone: no crash does that
                raise DamagedStoreError(f"{self.path} is shorter than its committed frames")
            self._checked = True
        if st.st_size > self.end:  # appended by another process (or a torn tail)
            while (frame := read_frame(fd, self.end, st.st_size)) is not None:
                self.end, meta, blobs = frame
                self.apply(meta, blobs)
        self._report()

    def _current(self, writable: bool) -> tuple[int, os.stat_result] | None:
        """The open file the path names and its stat; None if missing. Holding ``mutex``.

        The path is looked up (one ``stat``, in place of an ``fstat``): a link count above 0
        does not say the path still names the open file. Another name keeps a file deleted or
        compacted here linked: a hard link an operator made, or the temporary name of a
        creation whose process was killed before removing it; the open file would then be
        read, stale, after the path named a new one."""
        while True:
            fd = self._open(writable)
            if fd is None:
                return None
            st = self._named(fd)
            if st is not None:
                return fd, st
            self._close()  # the path names another file, or none

    def _named(self, fd: int) -> os.stat_result | None:
        """The stat of the path if it names the file open at ``fd`` (so it is that file's
        stat too), else None. One ``stat`` a call: the open file's identity is taken once per
        opening. A link count above 0 would not say the path names the file: another name (a
        hard link an operator made: ``ln``, ``cp -al``) keeps a file deleted or compacted here
        linked, and a write to it would be acknowledged and lost."""
        if self._inode is None:
            opened = os.fstat(fd)
            self._inode = (opened.st_dev, opened.st_ino)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st if (st.st_dev, st.st_ino) == self._inode else None

    def reading(self, fn: Callable[[int | None], R]) -> R:
        """Run ``fn(fd)`` on fresh state without taking the file lock; fd is None if missing."""
        with self.mutex:
            try:
                current = self._current(writable=False)
                fd, st = current if current is not None else (None, None)
                self._sync(fd, st)
                return fn(fd)
            finally:
                self._done()

    def writing(
        self,
        fn: Callable[[int | None], R],
        *,
        create: bool = True,
        block: bool = True,
        quick: bool = False,
    ) -> R:
        """Run ``fn(fd)`` holding the file's lock, on state that includes every committed frame
        and with any torn tail cut off. fd is None when the file is missing and not ``create``.

        ``quick``: only if nothing is in the way of ``fn``, as on the event loop's thread: the
        locks are free (not waited for), the file is open already and unchanged since this
        process's last use of it (nothing to read, nothing torn to cut). Else Busy, before
        ``fn`` ran and with nothing changed.

        Raises:
            Busy: ``block`` is false or ``quick`` true, and another thread or process holds the
                lock; or ``quick`` true and the file is not as above.
        """
        if not self.mutex.acquire(blocking=block and not quick):
            raise Busy(self.path)
        unsynced: int | None = None  # a descriptor to fsync once the locks are released
        try:
            if quick and (
                self._fd is None
                or self._forks != _forks
                or not self._writable
                or not self._checked
                or not self.keep_open
            ):
                raise Busy(self.path)
            while True:
                fd = self._open(writable=True)  # checked once locked
                if fd is None:
                    if create:
                        self._create()
                        continue
                    self._sync(None, None)
                    return fn(None)
                wait = block and not quick
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise Busy(self.path) from None
                try:
                    st = self._named(fd)  # and grown? (as locked: nobody else writes)
                    if st is None:
                        self._drop = True
                        if quick:
                            raise Busy(self.path)
                        continue
                    if quick and st.st_size != self.end:
                        raise Busy(self.path)
                    self._sync(fd, st)
                    if st.st_size > self.end:
                        os.ftruncate(fd, self.end)
                    return fn(fd)
                finally:
                    try:
                        if self._unsynced and not self._drop:  # (a replaced file was fsynced)
                            unsynced = os.dup(fd)  # this one may be closed meanwhile
                    finally:
                        self._unsynced = False
                        if self._drop or not self.keep_open:
                            self._close()  # which releases the lock
                        else:
                            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self.mutex.release()
            if unsynced is not None:
                try:
                    os.fsync(unsynced)
                finally:
                    os.close(unsynced)

    def commit(self, fd: int, frame: bytes, *, sync: bool = True) -> None:
        """Append one frame and fold it in; durably now, or (``sync`` false) by the fsync that
        :meth:`writing` makes after releasing the locks, before it returns.

        The late fsync lets the next writer (a thread of this process, another process) go on
        without waiting for the disk; concurrent fsyncs of a file share the journal commits of
        the file system. The next writer may build on a frame not yet durable (a claim of a
        message whose put is being fsynced): its own fsync, which flushes the whole file, makes
        that frame durable before its call returns. Readers that take no lock could always see
        a frame while its writer fsyncs. Use ``sync`` when a later step of the same call must
        not be durable without this frame (the log frame of an outbox append, before its
        messages are delivered and its intent removed), or where writers of one file rarely
        meet (a log, a stream: one writer each, mostly), as the late fsync costs a ``dup``.
        Queues, which every worker writes, use the late fsync.
        """
        self._write(fd, frame, sync)
        # Folded from the bytes in hand, not read back: under the lock, with the state synced
        # by writing(), this frame is the only one after self.end, in the same inode.
        start = self.end + _HEAD.size
        meta, blobs = _parse_body(frame[_HEAD.size :], start)
        self._fold(start + len(frame) - _HEAD.size, meta, blobs)

    def commit_fresh(
        self, fd: int, meta: dict[str, Any], blobs: Sequence[bytes] = (), *, sync: bool = True
    ) -> None:
        """:meth:`commit` of the frame of ``meta`` and ``blobs``, folded from them as given
        rather than decoded back from the frame's JSON: ``meta`` must be what that JSON
        decodes to (lists, not tuples; str keys) and is handed over (the fold may keep it)."""
        frame = encode_frame(meta, blobs)
        self._write(fd, frame, sync)
        end = self.end + len(frame)
        offset = end - sum(len(blob) for blob in blobs)
        placed: list[Blob] = []
        for blob in blobs:
            placed.append((offset, blob))
            offset += len(blob)
        self._fold(end, meta, placed)

    def _write(self, fd: int, frame: bytes, sync: bool) -> None:
        try:
            write_all(fd, frame, self.end)
        except BaseException:
            os.ftruncate(fd, self.end)  # incomplete, so invisible anyway: tidy up at once
            raise
        # If fsync fails the frame stays: it is whole, and readers may already have seen it.
        # The caller gets BackendUnavailableError, which says the outcome is unknown.
        if sync:
            os.fsync(fd)
        else:
            self._unsynced = True

    def _fold(self, end: int, meta: dict[str, Any], blobs: list[Blob]) -> None:
        self.end = end
        self.apply(meta, blobs)
        self._report()

    def replace(self, frames: Sequence[bytes]) -> None:
        """Atomically swap the file for a new one (new uuid) holding ``frames`` after a header.
        Call only under :meth:`writing`; processes waiting for the old file's lock retry."""
        with temp_file(self.path.parent, b"".join([self._header(), *frames])) as tmp:
            os.rename(tmp, self.path)
        self._drop = True
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        """Unlink the file; call only under :meth:`writing`."""
        self.path.unlink(missing_ok=True)
        self._drop = True
        fsync_dir(self.path.parent)

    def _header(self) -> bytes:
        return encode_frame({"kind": self.kind, "id": self.ident, "uuid": uuid.uuid4().hex})

    def _create(self) -> None:
        with temp_file(self.path.parent, self._header()) as tmp:
            try:
                os.link(tmp, self.path)  # unlike rename, never replaces a file just created
            except FileExistsError:
                return
        fsync_dir(self.path.parent)
