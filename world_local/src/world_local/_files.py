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

import fcntl
import json
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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


def read_frame(fd: int, offset: int) -> tuple[int, dict[str, Any], list[Blob]] | None:
    """The frame at ``offset`` as (end offset, meta, blobs), or None when it is not (yet)
    whole: missing, short, or failing its checksum."""
    head = read_exact(fd, _HEAD.size, offset)
    if len(head) < _HEAD.size:
        return None
    magic, length, crc = _HEAD.unpack(head)
    if magic != MAGIC:
        return None
    start = offset + _HEAD.size
    if start + length > os.fstat(fd).st_size:  # not yet (or never) whole; don't read garbage
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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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


class FoldedFile:
    """One record file folded into in-memory state, kept in step incrementally.

    Subclasses define the state (``reset``) and how a frame changes it (``apply``). Every use
    goes through :meth:`reading` or :meth:`writing`, which run in a worker thread: they hold
    ``self.mutex`` (threads of this process) and, for writing, the file's flock (processes).
    """

    kind: ClassVar[str]

    def __init__(
        self, path: Path, ident: str, resized: Callable[[FoldedFile], None] | None = None
    ) -> None:
        self.path = path
        self.ident = ident
        self.resized = resized
        """Called, holding ``mutex``, when :attr:`held` differs from :attr:`reported`."""
        self.reported = 0
        """:attr:`held` as ``resized`` last recorded it (it sets this)."""
        self.mutex = threading.Lock()
        self.uuid: str | None = None
        self.end = 0
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

    def _sync(self, fd: int | None) -> None:
        """Bring the state up to the last whole frame of the file open at ``fd``."""
        if fd is None:
            self.uuid, self.end = None, 0
            self.reset()
            self._report()
            return
        header = read_frame(fd, 0)
        if header is None:  # files are linked into place whole, so this is not a crash
            raise DamagedStoreError(f"{self.path} has no valid header")
        end, meta, _ = header
        if meta["uuid"] != self.uuid:
            if (meta["kind"], meta["id"]) != (self.kind, self.ident):
                raise DamagedStoreError(f"{self.path} holds {meta['kind']} {meta['id']!r}")
            self.uuid, self.end = meta["uuid"], end
            self.reset()
        while (frame := read_frame(fd, self.end)) is not None:
            self.end, meta, blobs = frame
            self.apply(meta, blobs)
        self._report()

    def reading(self, fn: Callable[[int | None], R]) -> R:
        """Run ``fn(fd)`` on fresh state without taking the file lock; fd is None if missing."""
        with self.mutex:
            try:
                fd: int | None = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                fd = None
            try:
                self._sync(fd)
                return fn(fd)
            finally:
                if fd is not None:
                    os.close(fd)

    def writing(
        self, fn: Callable[[int | None], R], *, create: bool = True, block: bool = True
    ) -> R:
        """Run ``fn(fd)`` holding the file's lock, on state that includes every committed frame
        and with any torn tail cut off. fd is None when the file is missing and not ``create``.

        Raises:
            Busy: ``block`` is false and another thread or process holds the lock.
        """
        if not self.mutex.acquire(blocking=block):
            raise Busy(self.path)
        try:
            with self._locked(create, block) as fd:
                self._sync(fd)
                if fd is not None and os.fstat(fd).st_size > self.end:
                    os.ftruncate(fd, self.end)
                return fn(fd)
        finally:
            self.mutex.release()

    def commit(self, fd: int, frame: bytes) -> None:
        """Append one frame durably and fold it in."""
        os.lseek(fd, self.end, os.SEEK_SET)
        try:
            write_all(fd, frame)
        except BaseException:
            os.ftruncate(fd, self.end)  # incomplete, so invisible anyway: tidy up at once
            raise
        # If fsync fails the frame stays: it is whole, and readers may already have seen it.
        # The caller gets BackendUnavailableError, which says the outcome is unknown.
        os.fsync(fd)
        # Folded from the bytes in hand, not read back: under the lock, with the state synced
        # by writing(), this frame is the only one after self.end, in the same inode.
        start = self.end + _HEAD.size
        meta, blobs = _parse_body(frame[_HEAD.size :], start)
        self.end = start + len(frame) - _HEAD.size
        self.apply(meta, blobs)
        self._report()

    def replace(self, frames: Sequence[bytes]) -> None:
        """Atomically swap the file for a new one (new uuid) holding ``frames`` after a header.
        Call only under :meth:`writing`; processes waiting for the old file's lock retry."""
        with temp_file(self.path.parent, b"".join([self._header(), *frames])) as tmp:
            os.rename(tmp, self.path)
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        """Unlink the file; call only under :meth:`writing`."""
        self.path.unlink(missing_ok=True)
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

    @contextmanager
    def _locked(self, create: bool, block: bool) -> Iterator[int | None]:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                if not create:
                    yield None
                    return
                self._create()
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise Busy(self.path) from None
                if not _same_file(fd, self.path):  # deleted or compacted while we waited
                    continue
                yield fd
                return
            finally:
                os.close(fd)
