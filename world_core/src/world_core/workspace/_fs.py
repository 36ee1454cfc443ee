"""The virtual filesystem: a session's file tree kept in its log, file contents in blobs.

``virtual()`` (the default, ``context.fs``): the tree is the session document
:data:`TREE_DOCUMENT` (``"workspace"``, a :class:`TreeDocument` of paths, sizes, modes and
sha-256 digests, versioned and stored by ``world_core.workspace._documents``: small changes
are deltas); each file's bytes are a content-addressed blob (``world_core.journal.Blobs``),
so a file unchanged across versions, or the same bytes under two names, is stored once. A
tool reads and writes through ``context.fs`` (:class:`Files`); its changes are kept in the
call's working copy (reads see the call's own writes) and reach the log only when the call
returns: the new contents are stored as blobs (``ToolContext.before_commit``) and the new
tree is a document edit, committed in the same atomic append as the call's outcome, or not
at all. A call that fails, times out, is interrupted or crashes changes no file; a ``safe``
call run again after a crash starts from the same committed tree and so leaves the same
files.

Conflicts follow the documents' rules. A call reads the tree's latest committed version on
its first use of ``context.fs``; its change set is claimed on that version. If another
writer (an app, another turn's tool) committed a newer version meanwhile, nothing of the
call is written: a ``safe`` call runs again on the new tree (up to 3 runs, then it fails
naming the conflict); a ``never`` call is not run again and its outcome says its changes
were not saved, so the model can read the files again. No edit is ever lost silently.

``virtual(durable=False)``: the same API over a tree held in this process's memory for draft
work. It costs nothing in the log or the blob store and is cleared at the end of each turn
(the next turn of the session starts empty; a turn resumed by another process starts empty
too). Changes are applied when the call's outcome is kept, so a failing call changes nothing
here either.

Paths and limits: see :mod:`world_core.workspace._fs_paths` (relative, normalised, confined;
no links of any kind) and :class:`WorkspaceLimits`. Apps: :class:`Workspace`.

For engines that work on a copy (the shell): :meth:`Files.snapshot` gives the whole tree as
a :class:`Snapshot` (``files`` path to bytes, ``dirs``, ``modes``) and :meth:`Files.apply`
makes the workspace hold a changed tree, as one change set of the call.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import itertools
import os
import re
import tarfile
import weakref
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import aclosing, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import lru_cache, partial, wraps
from pathlib import Path
from typing import IO, Any, Literal, ParamSpec, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, ValidationError

from world_core.errors import (
    DocumentConflictError,
    DocumentSchemaError,
    InvalidArgumentError,
    PathError,
    PathNotFoundError,
)
from world_core.journal import BlobRef, Blobs, ToolContext, canonical_json, session_blobs
from world_core.spi import World
from world_core.workspace._documents import DocumentEdits, Documents, session_writes
from world_core.workspace._fs_paths import (
    WorkspaceLimits,
    ancestors,
    glob_regex,
    normalize_path,
    parent_of,
)

__all__ = [
    "DEFAULT_DIR_MODE",
    "DEFAULT_FILE_MODE",
    "TREE_DOCUMENT",
    "FileEntry",
    "FileStat",
    "BlockingFiles",
    "FileTree",
    "Files",
    "Snapshot",
    "TreeDocument",
    "TreeLike",
    "VirtualWorkspace",
    "Workspace",
    "virtual",
]

T = TypeVar("T")
P = ParamSpec("P")

TREE_DOCUMENT = "workspace"
"""The session document that holds a durable workspace's tree (:class:`TreeDocument`)."""

DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755
_EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """A file in a tree: its content's sha-256, its size and its permission bits."""

    digest: str
    size: int
    mode: int = DEFAULT_FILE_MODE


@dataclass(frozen=True)
class FileStat:
    """What :meth:`Files.stat` tells about a path.

    Attributes:
        path: the normalised path (``""`` for the root).
        kind: ``"file"`` or ``"dir"``.
        size: bytes (0 for a directory).
        mode: permission bits (``0o644`` for files unless set, ``0o755`` for directories).
        digest: the content's sha-256 (None for a directory).
    """

    path: str
    kind: Literal["file", "dir"]
    size: int
    mode: int
    digest: str | None


@dataclass(frozen=True)
class FileTree:
    """One version of a workspace's tree: metadata only, the bytes are blobs.

    Attributes:
        version: 0 for a workspace never written, then one more per committed change set.
        files: normalised path to :class:`FileEntry`.
        dirs: every directory, empty or not (a file's parents are always in it).
    """

    version: int = 0
    files: Mapping[str, FileEntry] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()

    @property
    def total_bytes(self) -> int:
        """The size of all files together."""
        return sum(entry.size for entry in self.files.values())

    def digest(self) -> str:
        """sha-256 of the tree's content (paths, modes, content digests; not the version):
        two trees with the same files and directories have the same digest."""
        return _tree_digest(self.files, self.dirs)

    def document(self) -> TreeDocument:
        """The document kept in the session (:data:`TREE_DOCUMENT`)."""
        return TreeDocument(
            files={p: (e.digest, e.size, e.mode) for p, e in sorted(self.files.items())},
            dirs=sorted(self.dirs),
        )

    @classmethod
    def from_document(cls, version: int, document: TreeDocument | None) -> FileTree:
        """The tree that version ``version`` of the document holds (None: empty).

        Every path is checked again (a document is data anyone with the World can write):
        a path that is not normalised and confined, a digest that is not 64 hex digits, a
        negative size or a mode outside ``0..0o777`` is refused, so nothing read from a tree
        can name a place outside the workspace.

        Raises:
            PathError: such an entry; the message names it.
        """
        if document is None:
            return cls(version)
        files: dict[str, FileEntry] = {}
        for path, (digest, size, mode) in document.files.items():
            _check_stored(path, "file")
            if not _DIGEST.fullmatch(digest) or size < 0 or not 0 <= mode <= 0o777:
                raise PathError(
                    f"the workspace tree's entry {path!r} is damaged (digest {digest[:80]!r}, "
                    f"size {size}, mode {mode:o}); restore the session from a backup",
                    path=path,
                )
            files[path] = FileEntry(digest, size, mode)
        for path in document.dirs:
            _check_stored(path, "directory")
        return cls(version, files, frozenset(document.dirs))


_DIGEST = re.compile(r"[0-9a-f]{64}")


@contextmanager
def _tree_errors() -> Iterator[None]:
    """A session document named like the tree that is not a tree: a clear error."""
    try:
        yield
    except (ValidationError, DocumentSchemaError) as error:
        exc = error.__cause__ if isinstance(error, DocumentSchemaError) else error
        if not isinstance(exc, ValidationError):
            raise
        raise InvalidArgumentError(
            f"the session document {TREE_DOCUMENT!r} is not a workspace tree "
            f"({exc.error_count()} errors, first: {exc.errors()[0]['msg']}); another writer "
            "used the name: rename that document"
        ) from None


def _check_stored(path: str, kind: str) -> None:
    problem = _stored_path_problem(path, kind)
    if problem is not None:
        raise PathError(problem, path=path)


@lru_cache(maxsize=1 << 16)
def _stored_path_problem(path: str, kind: str) -> str | None:
    """Why a stored path is refused, or None (cached: a tree's paths are read again by every
    call, and checking each one cost more than the rest of reading the tree)."""
    try:
        normal = normalize_path(path, what=f"stored {kind}")
    except PathError as exc:
        return (
            f"the workspace tree holds a {kind} path it must not: {exc}; restore the session "
            "from a backup"
        )
    if normal != path or not path:
        return (
            f"the workspace tree holds the {kind} path {path!r}, which is not normalised; "
            "restore the session from a backup"
        )
    return None


class TreeDocument(BaseModel):
    """The tree as a session document (``Documents(world).watch(session, TREE_DOCUMENT,
    TreeDocument)`` follows a workspace's changes live).

    Attributes:
        files: path to ``(sha-256 of the content, size, mode)``.
        dirs: every directory, sorted.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: dict[str, tuple[str, int, int]] = {}
    dirs: list[str] = []


def _tree_digest(files: Mapping[str, FileEntry], dirs: Iterable[str]) -> str:
    document = {
        "files": {p: [e.digest, e.size, e.mode] for p, e in sorted(files.items())},
        "dirs": sorted(dirs),
    }
    return hashlib.sha256(canonical_json(document)).hexdigest()


class TreeLike(Protocol):
    """Anything :meth:`Files.apply` takes: files with their bytes, every directory, and the
    modes of files whose mode is not ``0o644`` (:class:`Snapshot`, the shell's ``Tree``)."""

    @property
    def files(self) -> Mapping[str, bytes]: ...

    @property
    def dirs(self) -> Iterable[str]: ...

    @property
    def modes(self) -> Mapping[str, int]: ...


@dataclass(frozen=True)
class Snapshot:
    """A whole tree with its bytes, for engines that work on a copy (the shell).

    Attributes:
        files: normalised path to content.
        dirs: every directory (a file's parents included).
        modes: modes of the files whose mode is not :data:`DEFAULT_FILE_MODE`.
    """

    files: Mapping[str, bytes] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()
    modes: Mapping[str, int] = field(default_factory=dict)

    def digest(self) -> str:
        """The same digest as :meth:`FileTree.digest` of the tree it holds."""
        entries = {
            path: FileEntry(
                hashlib.sha256(data).hexdigest(),
                len(data),
                self.modes.get(path, DEFAULT_FILE_MODE),
            )
            for path, data in self.files.items()
        }
        return _tree_digest(entries, self.dirs)


def _check_mode(mode: object, default: int) -> int:
    if mode is None:
        return default
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise InvalidArgumentError(f"mode must be permission bits 0 to 0o777, got {mode!r}")
    return mode


def _as_bytes(data: object, encoding: str = "utf-8") -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        try:
            return data.encode(encoding)
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(f"text cannot be encoded as {encoding}: {exc}") from None
    raise InvalidArgumentError(f"file content must be bytes or str, got {type(data).__name__}")


class _ContentCache:
    """Bytes by (store, digest), shared by every workspace of the process (content-addressed,
    so never stale; scoped by store, so a blob missing from one World is never served from
    another's), bounded by total size, least recently used out first."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._items: OrderedDict[tuple[int, str], bytes] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes

    def get(self, key: tuple[int, str]) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def put(self, key: tuple[int, str], data: bytes) -> None:
        if key in self._items or len(data) > self._max // 4:
            return
        self._items[key] = data
        self._bytes += len(data)
        while self._bytes > self._max:
            _, dropped = self._items.popitem(last=False)
            self._bytes -= len(dropped)


_CACHE = _ContentCache()
_SCOPES: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
_SCOPE_COUNTER = itertools.count(1)


def _scope(store: object) -> int:
    """A number for ``store`` (a World's stream) that no other live store has: the cache's
    scope (never ``id()``, which a new object may reuse)."""
    try:
        found = _SCOPES.get(store)
        if found is None:
            found = _SCOPES[store] = next(_SCOPE_COUNTER)
        return found
    except TypeError:  # not weak-referenceable: no cache for it
        return 0


_PARALLEL_READS = 16
"""Blob reads a snapshot keeps in flight at once."""

_PARALLEL_WRITES = 16
"""Blob writes a commit keeps in flight at once."""


class _Draft:
    """A mutable working copy of a tree: every operation checks all it needs first, then
    changes the copy, so a refused operation leaves it as it was."""

    def __init__(
        self,
        base: FileTree,
        limits: WorkspaceLimits,
        load: Callable[[FileEntry], Awaitable[bytes]],
        scope: int = 0,
    ) -> None:
        self.base = base
        self._scope = scope
        self.limits = limits
        self._load = load
        self.files: dict[str, FileEntry] = dict(base.files)
        self.dirs: set[str] = set(base.dirs)
        self.total = base.total_bytes
        self.new: dict[str, bytes] = {}  # digest -> bytes written in this draft

    # -- reading ---------------------------------------------------------------------------

    @property
    def changed(self) -> bool:
        return self.files != dict(self.base.files) or self.dirs != set(self.base.dirs)

    def result(self) -> FileTree:
        return FileTree(self.base.version + 1, dict(self.files), frozenset(self.dirs))

    def is_dir(self, path: str) -> bool:
        return path == "" or path in self.dirs

    def _file(self, path: str, what: str = "path") -> FileEntry:
        entry = self.files.get(path)
        if entry is None:
            if self.is_dir(path):
                raise PathError(f"{what} {path!r} is a directory, not a file", path=path)
            raise PathNotFoundError(f"no file {path!r} in the workspace", path=path)
        return entry

    async def content(self, entry: FileEntry) -> bytes:
        if entry.size == 0:
            return b""
        data = self.new.get(entry.digest)
        if data is None and self._scope:
            data = _CACHE.get((self._scope, entry.digest))
        if data is None:
            data = await self._load(entry)
            if self._scope:
                _CACHE.put((self._scope, entry.digest), data)
        return data

    async def read(self, path: str) -> bytes:
        return await self.content(self._file(path))

    def stat(self, path: str) -> FileStat:
        entry = self.files.get(path)
        if entry is not None:
            return FileStat(path, "file", entry.size, entry.mode, entry.digest)
        if self.is_dir(path):
            return FileStat(path, "dir", 0, DEFAULT_DIR_MODE, None)
        raise PathNotFoundError(f"no file or directory {path!r} in the workspace", path=path)

    def children(self, path: str) -> list[str]:
        if path in self.files:
            raise PathError(f"{path!r} is a file, not a directory", path=path)
        if not self.is_dir(path):
            raise PathNotFoundError(f"no directory {path!r} in the workspace", path=path)
        prefix = f"{path}/" if path else ""
        names = {
            entry[len(prefix) :]
            for entry in (*self.files, *self.dirs)
            if entry.startswith(prefix) and "/" not in entry[len(prefix) :]
        }
        return sorted(names)

    def under(self, path: str) -> tuple[list[str], list[str]]:
        """The files and directories strictly inside directory ``path``."""
        prefix = f"{path}/" if path else ""
        return (
            sorted(p for p in self.files if p.startswith(prefix)),
            sorted(p for p in self.dirs if p.startswith(prefix)),
        )

    def glob(self, pattern: str) -> list[str]:
        regex = glob_regex(pattern)
        return sorted(p for p in (*self.files, *self.dirs) if regex.match(p))

    # -- changing --------------------------------------------------------------------------

    def _parents_for(self, path: str, parents: bool) -> list[str]:
        """The directories to create for ``path``; refuses a file in the way."""
        missing: list[str] = []
        for ancestor in ancestors(path):
            if ancestor in self.files:
                raise PathError(
                    f"cannot create {path!r}: {ancestor!r} is a file, not a directory",
                    path=path,
                )
            if ancestor not in self.dirs:
                missing.append(ancestor)
        if missing and not parents:
            raise PathNotFoundError(
                f"no directory {parent_of(path)!r} for {path!r}; create it first (mkdir) or "
                "pass parents=True",
                path=path,
            )
        return missing

    def _check_entries(self, added: int, what: str) -> None:
        count = len(self.files) + len(self.dirs) + added
        if added > 0 and count > self.limits.max_entries:
            raise self.limits.refuse("max_entries", count, what)

    def put(self, path: str, data: bytes, mode: int | None, parents: bool = True) -> None:
        if path == "":
            raise PathError("cannot write to the workspace root; name a file", path=path)
        if path in self.dirs:
            raise PathError(f"{path!r} is a directory, not a file", path=path)
        limits = self.limits
        if len(data) > limits.max_file_bytes:
            raise limits.refuse("max_file_bytes", len(data), f"file {path!r}")
        old = self.files.get(path)
        total = self.total - (old.size if old is not None else 0) + len(data)
        if total > limits.max_total_bytes:
            raise limits.refuse("max_total_bytes", total, f"writing {path!r}")
        missing = self._parents_for(path, parents)
        self._check_entries(len(missing) + (old is None), f"writing {path!r}")
        digest = hashlib.sha256(data).hexdigest()
        self.dirs.update(missing)
        keep = old.mode if old is not None else DEFAULT_FILE_MODE
        self.files[path] = FileEntry(digest, len(data), _check_mode(mode, keep))
        self.total = total
        if data:
            self.new[digest] = data

    def mkdir(self, path: str, parents: bool, exist_ok: bool) -> None:
        if path == "" or path in self.dirs:
            if exist_ok:
                return
            raise PathError(f"directory {path!r} already exists", path=path)
        if path in self.files:
            raise PathError(f"{path!r} is a file; cannot make it a directory", path=path)
        missing = self._parents_for(path, parents)
        self._check_entries(len(missing) + 1, f"mkdir {path!r}")
        self.dirs.update(missing)
        self.dirs.add(path)

    def remove(self, path: str, recursive: bool) -> None:
        if path == "":
            raise PathError("cannot remove the workspace root", path=path)
        entry = self.files.get(path)
        if entry is not None:
            del self.files[path]
            self.total -= entry.size
            return
        if path not in self.dirs:
            raise PathNotFoundError(f"no file or directory {path!r} in the workspace", path=path)
        files, dirs = self.under(path)
        if (files or dirs) and not recursive:
            raise PathError(
                f"directory {path!r} is not empty; pass recursive=True to remove it and "
                "everything in it",
                path=path,
            )
        for inner in files:
            self.total -= self.files.pop(inner).size
        self.dirs.difference_update(dirs)
        self.dirs.discard(path)

    def move(self, source: str, target: str, keep: bool) -> None:
        """Rename (``keep=False``) or copy (``keep=True``) a file or directory tree."""
        verb = "copy" if keep else "rename"
        if source == "" or target == "":
            raise PathError(f"cannot {verb} the workspace root", path=source or target)
        if source == target:
            if source not in self.files and source not in self.dirs:
                raise PathNotFoundError(f"no file or directory {source!r}", path=source)
            if keep:
                raise PathError(f"cannot copy {source!r} onto itself", path=source)
            return
        if target.startswith(f"{source}/"):
            raise PathError(f"cannot {verb} {source!r} into itself ({target!r})", path=target)
        if source in self.files:
            entry = self.files[source]
            if target in self.dirs:
                raise PathError(f"{verb}: {target!r} is a directory", path=target)
            old = self.files.get(target)
            total = self.total - (old.size if old is not None else 0)
            total += entry.size if keep else 0
            if keep and total > self.limits.max_total_bytes:
                raise self.limits.refuse("max_total_bytes", total, f"copying to {target!r}")
            missing = self._parents_for(target, True)
            added = len(missing) + (old is None) - (0 if keep else 1)
            self._check_entries(added, f"{verb} to {target!r}")
            self.dirs.update(missing)
            if not keep:
                del self.files[source]
            self.files[target] = entry
            self.total = total if keep else self.total - (old.size if old is not None else 0)
            return
        if source not in self.dirs:
            raise PathNotFoundError(
                f"no file or directory {source!r} in the workspace", path=source
            )
        if target in self.files or target in self.dirs:
            raise PathError(f"{verb}: {target!r} already exists", path=target)
        files, dirs = self.under(source)
        missing = self._parents_for(target, True)
        moved_files = {f"{target}{p[len(source) :]}": self.files[p] for p in files}
        moved_dirs = {f"{target}{p[len(source) :]}" for p in dirs} | {target}
        for new in (*moved_files, *moved_dirs):
            normalize_path(new, what=f"{verb} destination")  # a deep tree can get too deep
        if keep:
            total = self.total + sum(e.size for e in moved_files.values())
            if total > self.limits.max_total_bytes:
                raise self.limits.refuse("max_total_bytes", total, f"copying to {target!r}")
            self._check_entries(
                len(missing) + len(moved_files) + len(moved_dirs), f"copy to {target!r}"
            )
            self.total = total
        else:
            self._check_entries(len(missing), f"rename to {target!r}")
            for p in files:
                del self.files[p]
            self.dirs.difference_update(dirs)
            self.dirs.discard(source)
        self.dirs.update(missing)
        self.dirs.update(moved_dirs)
        self.files.update(moved_files)

    def replace(self, tree: TreeLike) -> None:
        """Make the copy hold exactly ``tree`` (checked whole first)."""
        files: dict[str, FileEntry] = {}
        contents: dict[str, bytes] = {}
        modes = dict(tree.modes)
        dirs: set[str] = set()
        for raw in tree.dirs:
            path = normalize_path(raw, what="directory")
            if path:
                dirs.add(path)
                dirs.update(ancestors(path))  # a tar may list "a/b/" without "a/"
        for raw, data in tree.files.items():
            path = normalize_path(raw, what="file")
            if path == "":
                raise PathError("a file cannot be the workspace root", path=raw)
            data = _as_bytes(data)
            if len(data) > self.limits.max_file_bytes:
                raise self.limits.refuse("max_file_bytes", len(data), f"file {path!r}")
            digest = hashlib.sha256(data).hexdigest()
            mode = _check_mode(modes.pop(raw, None), DEFAULT_FILE_MODE)
            files[path] = FileEntry(digest, len(data), mode)
            if data:
                contents[digest] = data
            dirs.update(ancestors(path))
        if modes:
            raise InvalidArgumentError(f"modes given for paths that are not files: {sorted(modes)}")
        clash = sorted(set(files) & dirs)
        if clash:
            raise PathError(f"{clash[0]!r} is both a file and a directory", path=clash[0])
        total = sum(entry.size for entry in files.values())
        if total > self.limits.max_total_bytes:
            raise self.limits.refuse("max_total_bytes", total, "the tree")
        count = len(files) + len(dirs)
        if count > self.limits.max_entries:
            raise self.limits.refuse("max_entries", count, "the tree")
        self.files, self.dirs, self.total = files, dirs, total
        self.new.update(contents)

    async def snapshot(self) -> Snapshot:
        # Contents not in memory are read from the blob store a few at a time, not one by one:
        # a cold worker's first snapshot of a tree on a remote World is bounded by round trips.
        loaded: dict[str, bytes] = {}
        limiter = anyio.CapacityLimiter(_PARALLEL_READS)

        async def load(digest: str, entry: FileEntry) -> None:
            async with limiter:
                loaded[digest] = await self.content(entry)

        async with anyio.create_task_group() as tg:
            for digest, entry in {e.digest: e for e in self.files.values()}.items():
                tg.start_soon(load, digest, entry)
        files = {path: loaded[entry.digest] for path, entry in sorted(self.files.items())}
        modes = {p: e.mode for p, e in self.files.items() if e.mode != DEFAULT_FILE_MODE}
        return Snapshot(files, frozenset(self.dirs), modes)

    async def store_new(self, blobs: Blobs) -> None:
        """Store, as blobs, the new contents the copy still names, a few at a time. The
        first error is raised as itself (not in a group), so a caller retrying transient
        faults (the journal, for a commit hook) sees what it retries."""
        named = {entry.digest for entry in self.files.values()}
        pending = [data for digest, data in self.new.items() if digest in named]
        if len(pending) == 1:
            await blobs.put(pending[0])
            return
        limiter = anyio.CapacityLimiter(_PARALLEL_WRITES)
        failed: list[Exception] = []

        async def put(data: bytes) -> None:
            async with limiter:
                if failed:
                    return
                try:
                    await blobs.put(data)  # one round trip when the blob is already there
                except Exception as exc:  # raised below, once every task has stopped
                    failed.append(exc)

        async with anyio.create_task_group() as tg:
            for data in pending:
                tg.start_soon(put, data)
        if failed:
            raise failed[0]


def _async_only(
    method: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Refuse, at once, a call from outside the event loop: from a sync tool's worker thread the
    coroutine would never be awaited and the change silently lost."""

    @wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
        try:
            anyio.get_current_task()
        except RuntimeError:  # no event loop in this thread: a sync tool
            raise InvalidArgumentError(
                f"context.fs.{method.__name__}() was called from a sync tool (it runs in a "
                "worker thread, where the coroutine would never run and nothing would be "
                f"changed): call context.fs.blocking.{method.__name__}(...) instead, or make "
                "the tool async"
            ) from None
        return method(*args, **kwargs)

    return call


class Files:
    """A tool's view of a workspace (``context.fs``, or ``virtual(...).files(context)``).

    Every method takes paths relative to the workspace root (see
    :func:`~world_core.workspace._fs_paths.normalize_path`). The first use in a call reads
    the tree's latest committed version; later reads in the call see that version plus the
    call's own changes. Changes are committed with the call's outcome, only if the call
    returns, and only if the tree is still at the version read (the documents' rules: a
    conflicting ``safe`` call runs again, a ``never`` call's outcome says its changes were
    not saved).

    Raises (every method, as it applies):
        PathError: a path refused by the confinement rules, or naming the wrong kind of entry.
        PathNotFoundError: nothing at the path (also a ``FileNotFoundError``).
        WorkspaceLimitError: a change would pass a :class:`WorkspaceLimits` limit; nothing
            was changed.
    """

    def __init__(self, load: Callable[[], Awaitable[_Draft]], *, durable: bool) -> None:
        self._load = load
        self._loaded: _Draft | None = None
        self._lock = anyio.Lock()
        self.durable = durable

    @property
    def blocking(self) -> BlockingFiles:
        """The same methods, not ``async``, for a sync tool (it runs in a worker thread):
        ``context.fs.blocking.write("a.txt", "x")``."""
        return BlockingFiles(self)

    async def _draft(self) -> _Draft:
        if self._loaded is None:
            async with self._lock:
                if self._loaded is None:
                    self._loaded = await self._load()
        return self._loaded

    @_async_only
    async def version(self) -> int:
        """The committed tree version this call started from (0: never written)."""
        return (await self._draft()).base.version

    @_async_only
    async def read(self, path: str) -> bytes:
        """The file's bytes."""
        normal = normalize_path(path)
        return await (await self._draft()).read(normal)

    @_async_only
    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The file's text.

        Raises:
            InvalidArgumentError: the bytes are not valid ``encoding``.
        """
        data = await self.read(path)
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(
                f"{path!r} is not {encoding} text ({exc}); read it with read()"
            ) from None

    @_async_only
    async def write(
        self, path: str, data: bytes | str, *, mode: int | None = None, parents: bool = True
    ) -> int:
        """Create or replace a file (``str`` is written as UTF-8); returns its size.

        Args:
            mode: permission bits (default: the old file's, or ``0o644``).
            parents: create missing parent directories (default); False refuses instead.
        """
        normal = normalize_path(path)
        content = _as_bytes(data)
        (await self._draft()).put(normal, content, mode, parents)
        return len(content)

    @_async_only
    async def read_bytes(self, path: str) -> bytes:
        """The file's bytes (:meth:`read`)."""
        return await self.read(path)

    @_async_only
    async def write_bytes(self, path: str, data: bytes, *, mode: int | None = None) -> int:
        """Create or replace a file with ``data``; returns its size.

        Raises:
            InvalidArgumentError: ``data`` is not bytes.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"write_bytes takes bytes, got {type(data).__name__}")
        return await self.write(path, bytes(data), mode=mode)

    @_async_only
    async def write_text(
        self, path: str, text: str, encoding: str = "utf-8", *, mode: int | None = None
    ) -> int:
        """Create or replace a file with ``text`` in ``encoding``; returns its size in bytes.

        Raises:
            InvalidArgumentError: ``text`` is not a str, or cannot be encoded.
        """
        if not isinstance(text, str):
            raise InvalidArgumentError(f"write_text takes a str, got {type(text).__name__}")
        return await self.write(path, _as_bytes(text, encoding), mode=mode)

    @_async_only
    async def append(self, path: str, data: bytes | str) -> int:
        """Add to the end of a file (created if missing); returns its new size."""
        normal = normalize_path(path)
        content = _as_bytes(data)
        draft = await self._draft()
        old = draft.files.get(normal)
        before = await draft.content(old) if old is not None else b""
        draft.put(normal, before + content, None)
        return len(before) + len(content)

    @_async_only
    async def exists(self, path: str) -> bool:
        """Whether a file or directory is at ``path``."""
        normal = normalize_path(path)
        draft = await self._draft()
        return normal in draft.files or draft.is_dir(normal)

    @_async_only
    async def stat(self, path: str) -> FileStat:
        """Kind, size, mode and digest of the entry at ``path``."""
        normal = normalize_path(path)
        return (await self._draft()).stat(normal)

    @_async_only
    async def list(self, path: str = "") -> builtins.list[str]:
        """The names in a directory (the root by default), sorted."""
        normal = normalize_path(path)
        return (await self._draft()).children(normal)

    @_async_only
    async def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True) -> None:
        """Create a directory (and its parents, by default)."""
        normal = normalize_path(path)
        (await self._draft()).mkdir(normal, parents, exist_ok)

    @_async_only
    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or an empty directory (``recursive=True``: any directory)."""
        normal = normalize_path(path)
        (await self._draft()).remove(normal, recursive)

    @_async_only
    async def rename(self, source: str, target: str) -> None:
        """Move a file (replacing a file at ``target``) or a directory (``target`` must not
        exist); missing parents of ``target`` are created."""
        old, new = normalize_path(source, what="source"), normalize_path(target, what="target")
        (await self._draft()).move(old, new, False)

    @_async_only
    async def copy(self, source: str, target: str) -> None:
        """Copy a file (replacing a file at ``target``) or a directory tree (``target`` must
        not exist). No bytes are copied: the copy names the same blob."""
        old, new = normalize_path(source, what="source"), normalize_path(target, what="target")
        (await self._draft()).move(old, new, True)

    @_async_only
    async def symlink(self, target: str, path: str) -> None:
        """Refused: a workspace holds files and directories only, never links (so no path can
        resolve outside it).

        Raises:
            PathError: always; nothing is changed.
        """
        raise PathError(
            f"cannot link {path!r} to {target!r}: a workspace has no symbolic or hard links "
            "(copy the file instead)",
            path=str(path),
        )

    @_async_only
    async def glob(self, pattern: str) -> builtins.list[str]:
        """Paths of files and directories matching ``pattern``, sorted: ``*``, ``?``,
        ``[abc]``, ``[!abc]`` within a name (names starting with ``.`` included), ``**`` for
        any number of directories (``src/**/*.py``)."""
        normal = normalize_path(pattern, what="pattern")
        return (await self._draft()).glob(normal)

    @_async_only
    async def tree(self) -> FileTree:
        """The tree as this call sees it (metadata; its version is the one it started from)."""
        draft = await self._draft()
        return FileTree(draft.base.version, dict(draft.files), frozenset(draft.dirs))

    @_async_only
    async def digest(self) -> str:
        """:meth:`FileTree.digest` of the tree as this call sees it."""
        draft = await self._draft()
        return _tree_digest(draft.files, draft.dirs)

    @_async_only
    async def snapshot(self) -> Snapshot:
        """The whole tree with every file's bytes (for an engine that works on a copy, such
        as the shell): ``files`` path to bytes, ``dirs`` every directory, ``modes`` of files
        whose mode is not ``0o644``."""
        return await (await self._draft()).snapshot()

    @_async_only
    async def apply(self, tree: TreeLike) -> None:
        """Make the workspace hold exactly ``tree`` (a :class:`Snapshot` or the shell's
        ``Tree``), as one change set of this call: files missing from it are removed,
        directories not in it (and not a file's parent) too. Checked whole first: a refused
        tree changes nothing."""
        (await self._draft()).replace(tree)


def _blocking(fn: Callable[..., Coroutine[Any, Any, T]], *args: object) -> T:
    try:
        anyio.get_current_task()
    except RuntimeError:  # not in the event loop: a sync tool's worker thread
        return anyio.from_thread.run(fn, *args)
    raise InvalidArgumentError(
        "context.fs.blocking is for sync tools (they run in a worker thread); in an async "
        "tool, await the context.fs method itself"
    )


class BlockingFiles:
    """:class:`Files` for sync tools, which run in a worker thread: each method runs its
    ``async`` twin in the event loop and waits for it (see :class:`Files` for what each does
    and raises).

    Raises (every method, besides those of its twin):
        InvalidArgumentError: called in the event loop itself (an async tool: ``await`` the
            :class:`Files` method instead).
    """

    def __init__(self, files: Files) -> None:
        self._files = files

    def read(self, path: str) -> bytes:
        """:meth:`Files.read`, blocking."""
        return _blocking(self._files.read, path)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """:meth:`Files.read_text`, blocking."""
        return _blocking(self._files.read_text, path, encoding)

    def write(
        self, path: str, data: bytes | str, *, mode: int | None = None, parents: bool = True
    ) -> int:
        """:meth:`Files.write`, blocking."""
        return _blocking(partial(self._files.write, mode=mode, parents=parents), path, data)

    def read_bytes(self, path: str) -> bytes:
        """:meth:`Files.read_bytes`, blocking."""
        return _blocking(self._files.read_bytes, path)

    def write_bytes(self, path: str, data: bytes, *, mode: int | None = None) -> int:
        """:meth:`Files.write_bytes`, blocking."""
        return _blocking(partial(self._files.write_bytes, mode=mode), path, data)

    def write_text(
        self, path: str, text: str, encoding: str = "utf-8", *, mode: int | None = None
    ) -> int:
        """:meth:`Files.write_text`, blocking."""
        return _blocking(partial(self._files.write_text, mode=mode), path, text, encoding)

    def append(self, path: str, data: bytes | str) -> int:
        """:meth:`Files.append`, blocking."""
        return _blocking(self._files.append, path, data)

    def exists(self, path: str) -> bool:
        """:meth:`Files.exists`, blocking."""
        return _blocking(self._files.exists, path)

    def stat(self, path: str) -> FileStat:
        """:meth:`Files.stat`, blocking."""
        return _blocking(self._files.stat, path)

    def list(self, path: str = "") -> builtins.list[str]:
        """:meth:`Files.list`, blocking."""
        return _blocking(self._files.list, path)

    def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True) -> None:
        """:meth:`Files.mkdir`, blocking."""
        _blocking(partial(self._files.mkdir, parents=parents, exist_ok=exist_ok), path)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """:meth:`Files.remove`, blocking."""
        _blocking(partial(self._files.remove, recursive=recursive), path)

    def rename(self, source: str, target: str) -> None:
        """:meth:`Files.rename`, blocking."""
        _blocking(self._files.rename, source, target)

    def copy(self, source: str, target: str) -> None:
        """:meth:`Files.copy`, blocking."""
        _blocking(self._files.copy, source, target)

    def symlink(self, target: str, path: str) -> None:
        """:meth:`Files.symlink`, blocking (refused)."""
        _blocking(self._files.symlink, target, path)

    def glob(self, pattern: str) -> builtins.list[str]:
        """:meth:`Files.glob`, blocking."""
        return _blocking(self._files.glob, pattern)

    def tree(self) -> FileTree:
        """:meth:`Files.tree`, blocking."""
        return _blocking(self._files.tree)

    def digest(self) -> str:
        """:meth:`Files.digest`, blocking."""
        return _blocking(self._files.digest)

    def snapshot(self) -> Snapshot:
        """:meth:`Files.snapshot`, blocking."""
        return _blocking(self._files.snapshot)

    def apply(self, tree: TreeLike) -> None:
        """:meth:`Files.apply`, blocking."""
        _blocking(self._files.apply, tree)


class _DraftStore:
    """The in-memory trees of ``virtual(durable=False)``, per session, for one turn.

    Each tree is kept with the step of the call that made it, and a call at step ``n`` starts
    from the latest tree made before ``n``: a turn replayed in the same process (its Journal
    opened again after an error) does not see the changes of calls it is running again.
    Bounded: at most ``max_sessions`` sessions and ``max_bytes`` of contents in all, the least
    recently used session dropped first (its draft is then empty, as after a restart)."""

    def __init__(self, max_sessions: int = 64, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._sessions: OrderedDict[str, _SessionDrafts] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes

    def get(self, session_id: str, turn_id: str, step: int) -> tuple[FileTree, dict[str, bytes]]:
        found = self._sessions.get(session_id)
        if found is None or found.turn_id != turn_id:
            self._sessions.pop(session_id, None)  # a new turn: the last turn's draft is gone
            return FileTree(), {}
        self._sessions.move_to_end(session_id)
        earlier = [tree for made_at, tree in found.trees if made_at < step]
        return (earlier[-1] if earlier else FileTree()), found.contents

    def put(
        self, session_id: str, turn_id: str, step: int, tree: FileTree, new: dict[str, bytes]
    ) -> None:
        found = self._sessions.get(session_id)
        if found is None or found.turn_id != turn_id:
            found = self._sessions[session_id] = _SessionDrafts(turn_id)
        found.trees = [(made_at, t) for made_at, t in found.trees if made_at < step]
        found.trees.append((step, tree))
        del found.trees[:-_DRAFT_VERSIONS]
        named = {entry.digest for _, t in found.trees for entry in t.files.values()}
        found.contents = {d: b for d, b in {**found.contents, **new}.items() if d in named}
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self._max_sessions or (
            len(self._sessions) > 1 and self._bytes() > self._max_bytes
        ):
            self._sessions.popitem(last=False)

    def _bytes(self) -> int:
        return sum(len(b) for d in self._sessions.values() for b in d.contents.values())


_DRAFT_VERSIONS = 64
"""The draft trees kept per session (one per call that changed files; older are dropped)."""


@dataclass
class _SessionDrafts:
    turn_id: str
    trees: list[tuple[int, FileTree]] = field(default_factory=list)
    contents: dict[str, bytes] = field(default_factory=dict)


_DRAFTS = _DraftStore()


@dataclass(frozen=True)
class VirtualWorkspace:
    """What :func:`virtual` returns: which workspace a tool works on, and its limits."""

    durable: bool = True
    limits: WorkspaceLimits = field(default_factory=WorkspaceLimits)

    def files(self, context: ToolContext) -> Files:
        """This call's view of the session's workspace: the same object for the whole call
        (a second ``virtual(...)`` of the same kind in the call gets it too, with the first's
        limits). Nothing is read until the view's first use."""
        per_call = _VIEWS.setdefault(context, {})
        view = per_call.get(self.durable)
        if view is not None:
            return view
        view = self._durable(context) if self.durable else self._draft(context)
        per_call[self.durable] = view
        return view

    def _durable(self, context: ToolContext) -> Files:
        docs: DocumentEdits = context.docs
        blobs = context.blobs
        limits = self.limits
        made: list[_Draft] = []

        async def load() -> _Draft:
            with _tree_errors():
                document = await docs.read(TREE_DOCUMENT, TreeDocument)
            base = FileTree.from_document(await docs.version(TREE_DOCUMENT), document)
            scope = _scope(context.world.stream)
            draft = _Draft(base, limits, lambda entry: _load(blobs, entry), scope)
            made.append(draft)
            return draft

        async def commit() -> None:
            if not made or not made[0].changed:
                return
            draft = made[0]
            await draft.store_new(blobs)
            docs.put(TREE_DOCUMENT, draft.result().document())

        context.before_commit(commit)
        return Files(load, durable=True)

    def _draft(self, context: ToolContext) -> Files:
        session, turn, step = context.session_id, context.turn_id, context.step
        base, contents = _DRAFTS.get(session, turn, step)

        async def missing(entry: FileEntry) -> bytes:
            raise AssertionError(f"draft workspace lost the bytes of {entry.digest}")

        draft = _Draft(base, self.limits, missing)
        draft.new.update(contents)

        def commit() -> None:
            if draft.changed:
                _DRAFTS.put(session, turn, step, draft.result(), draft.new)

        async def ready() -> _Draft:
            return draft

        context.after_commit(commit)
        return Files(ready, durable=False)


_VIEWS: weakref.WeakKeyDictionary[ToolContext, dict[bool, Files]] = weakref.WeakKeyDictionary()


def virtual(*, durable: bool = True, limits: WorkspaceLimits | None = None) -> VirtualWorkspace:
    """A virtual workspace: ``durable=True`` (default) keeps the tree in the session log,
    ``durable=False`` in this process's memory for the current turn only. A tool gets its
    view with ``virtual(...).files(context)``; ``context.fs`` is ``virtual().files(context)``.

    Raises:
        InvalidArgumentError: ``durable`` is not a bool, or ``limits`` not
            :class:`WorkspaceLimits`.
    """
    if not isinstance(durable, bool):
        raise InvalidArgumentError(f"durable must be True or False, got {durable!r}")
    if limits is not None and not isinstance(limits, WorkspaceLimits):
        raise InvalidArgumentError(f"limits must be WorkspaceLimits, got {limits!r}")
    return VirtualWorkspace(durable, limits if limits is not None else WorkspaceLimits())


_CHANGE_ATTEMPTS = 5
"""How often :meth:`Workspace.write` / :meth:`Workspace.remove` without ``expected_version``
read the tree again after a concurrent change."""

_DEFAULT = virtual()
ToolContext.extend("fs", _DEFAULT.files)


async def _load(blobs: Blobs, entry: FileEntry) -> bytes:
    return await blobs.get(BlobRef(digest=entry.digest, size=entry.size))


# -- apps ------------------------------------------------------------------------------------


class Workspace:
    """Read, edit, export and import a session's durable workspace from outside a turn.

    The tree is the session document :data:`TREE_DOCUMENT`, so the documents' rules hold:
    each change set is one new version, appended once its new contents are stored as blobs,
    and only if the tree is still at the version the change was made from; otherwise it is
    refused with :class:`~world_core.errors.DocumentConflictError` (a
    :class:`~world_core.errors.ConflictError`; ``expected`` and ``actual`` are tree versions)
    and nothing is written. ``expected_version`` states the version the caller read (for
    instance before showing the files to a person): the change is refused if a tool or
    another app changed the tree since. :meth:`write` and :meth:`remove` without it apply
    their one change to the latest tree, reading it again if it moved meanwhile.

    Args:
        world: the World the sessions live in.
        limits: the limits changes are checked against (the tools' defaults unless given).
    """

    def __init__(self, world: World, *, limits: WorkspaceLimits | None = None) -> None:
        if limits is not None and not isinstance(limits, WorkspaceLimits):
            raise InvalidArgumentError(f"limits must be WorkspaceLimits, got {limits!r}")
        self._world = world
        self._documents = Documents(world)
        self.limits = limits if limits is not None else WorkspaceLimits()

    async def tree(self, session_id: str) -> FileTree:
        """The session's tree as committed now (version 0 and empty if never written)."""
        with _tree_errors():
            read = await self._documents.read(session_id, TREE_DOCUMENT, TreeDocument)
        version, document = read
        return FileTree.from_document(version, document)

    async def watch(
        self, session_id: str, *, after_version: int = 0, idle_timeout: float | None = None
    ) -> AsyncIterator[FileTree]:
        """Every version of the tree after ``after_version``, then each new one as it commits
        (see ``Documents.watch``: resume with the last version seen; stop by leaving the
        loop, cancelling, or ``idle_timeout``)."""
        versions = self._documents.watch(
            session_id,
            TREE_DOCUMENT,
            TreeDocument,
            after_version=after_version,
            idle_timeout=idle_timeout,
        )
        async with aclosing(versions):
            async for version, document in versions:
                yield FileTree.from_document(version, document)

    async def _draft(self, session_id: str) -> _Draft:
        blobs = session_blobs(self._world, session_id)
        return _Draft(
            await self.tree(session_id),
            self.limits,
            lambda entry: _load(blobs, entry),
            _scope(self._world.stream),
        )

    async def read(self, session_id: str, path: str) -> bytes:
        """A file's bytes."""
        normal = normalize_path(path)
        return await (await self._draft(session_id)).read(normal)

    async def read_text(self, session_id: str, path: str, encoding: str = "utf-8") -> str:
        """A file's text.

        Raises:
            InvalidArgumentError: the bytes are not valid ``encoding``.
        """
        data = await self.read(session_id, path)
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(f"{path!r} is not {encoding} text ({exc})") from None

    async def list(self, session_id: str, path: str = "") -> builtins.list[str]:
        """The names in a directory, sorted."""
        normal = normalize_path(path)
        return (await self._draft(session_id)).children(normal)

    async def stat(self, session_id: str, path: str) -> FileStat:
        """Kind, size, mode and digest of the entry at ``path``."""
        normal = normalize_path(path)
        return (await self._draft(session_id)).stat(normal)

    async def glob(self, session_id: str, pattern: str) -> builtins.list[str]:
        """Paths matching ``pattern`` (see :meth:`Files.glob`)."""
        normal = normalize_path(pattern, what="pattern")
        return (await self._draft(session_id)).glob(normal)

    async def snapshot(self, session_id: str) -> Snapshot:
        """The whole tree with its bytes."""
        return await (await self._draft(session_id)).snapshot()

    async def digest(self, session_id: str) -> str:
        """:meth:`FileTree.digest` of the committed tree."""
        return (await self.tree(session_id)).digest()

    @asynccontextmanager
    async def edit(
        self, session_id: str, *, expected_version: int | None = None
    ) -> AsyncIterator[Files]:
        """Edit the tree as one change set: ``async with workspace.edit(s) as files:`` gives
        a :class:`Files` over the latest tree (or the one at ``expected_version``); the changes
        are committed when the block ends without an error, only if the tree is still at the
        version the block started from. Nothing is written when the block raises or changes
        nothing.

        Raises:
            DocumentConflictError: the tree is not at ``expected_version`` (on entry), or moved
                on before the commit.
        """
        draft = await self._draft(session_id)
        if expected_version is not None and draft.base.version != expected_version:
            raise self._conflict(session_id, expected_version, draft.base.version)

        async def ready() -> _Draft:
            return draft

        yield Files(ready, durable=True)
        await self._commit(session_id, draft)

    def _conflict(self, session_id: str, expected: int, actual: int) -> DocumentConflictError:
        return DocumentConflictError(
            f"session {session_id!r}: the workspace is at version {actual}, not {expected}: "
            "it changed since it was read; read it again and redo the change",
            document=TREE_DOCUMENT,
            expected=expected,
            actual=actual,
        )

    async def _commit(self, session_id: str, draft: _Draft) -> None:
        if not draft.changed:
            return
        await draft.store_new(session_blobs(self._world, session_id))
        await self._documents.put(
            session_id,
            TREE_DOCUMENT,
            draft.result().document(),
            expected_version=draft.base.version,
        )

    async def _change(
        self,
        session_id: str,
        change: Callable[[Files], Awaitable[object]],
        expected_version: int | None,
    ) -> FileTree:
        for attempt in range(_CHANGE_ATTEMPTS):
            try:
                # The read and the commit made of it take one turn among this process's
                # writers of the session: racing, one of eight writers lost five times.
                async with (
                    session_writes(self._world, session_id),
                    self.edit(session_id, expected_version=expected_version) as files,
                ):
                    await change(files)
            except DocumentConflictError:
                if expected_version is not None or attempt == _CHANGE_ATTEMPTS - 1:
                    raise
                continue
            break
        return await self.tree(session_id)

    async def write(
        self,
        session_id: str,
        path: str,
        data: bytes | str,
        *,
        mode: int | None = None,
        expected_version: int | None = None,
    ) -> FileTree:
        """Create or replace one file; returns the new tree.

        Raises:
            DocumentConflictError: the tree is not at ``expected_version``.
        """
        return await self._change(
            session_id, lambda files: files.write(path, data, mode=mode), expected_version
        )

    async def remove(
        self,
        session_id: str,
        path: str,
        *,
        recursive: bool = False,
        expected_version: int | None = None,
    ) -> FileTree:
        """Remove a file or directory (``recursive=True`` for a directory with content);
        returns the new tree.

        Raises:
            DocumentConflictError: the tree is not at ``expected_version``.
        """
        return await self._change(
            session_id, lambda files: files.remove(path, recursive=recursive), expected_version
        )

    # -- tar and folders ----------------------------------------------------------------------

    async def export_tar(self, session_id: str, target: str | os.PathLike[str] | IO[bytes]) -> int:
        """Write the tree as an uncompressed POSIX tar (a file path or a binary file object);
        returns the number of files. Directories come first, then files, sorted, with their
        modes and a fixed time (0), so the same tree gives the same bytes."""
        snapshot = await self.snapshot(session_id)
        data = _tar_bytes(snapshot)
        if isinstance(target, str | os.PathLike):
            await anyio.Path(os.fspath(target)).write_bytes(data)
        else:
            await anyio.to_thread.run_sync(target.write, data)
        return len(snapshot.files)

    async def import_tar(
        self,
        session_id: str,
        source: str | os.PathLike[str] | IO[bytes] | bytes,
        *,
        expected_version: int | None = None,
    ) -> FileTree:
        """Replace the tree with a tar's content (plain or gzip/bz2/xz compressed), as one
        change set; returns the new tree. A path the tar holds twice gets its later member
        (as extracting does), and only that one counts against the limits.

        Raises:
            PathError: a member that is a link, a device, a FIFO, or whose name is absolute,
                climbs out with ``..`` or breaks another path rule; nothing is written.
            WorkspaceLimitError: the content passes a limit; nothing is written.
            DocumentConflictError: the tree is not at ``expected_version``, or changed while
                the archive was read; nothing is written.
        """
        most = self.limits.max_total_bytes + 2048 * (self.limits.max_entries + 8)
        if isinstance(source, bytes):
            raw = source
        elif isinstance(source, str | os.PathLike):
            file = anyio.Path(os.fspath(source))
            size = (await file.stat()).st_size
            if size > most:
                raise self.limits.refuse("max_total_bytes", size, "the tar archive")
            raw = await file.read_bytes()
        else:
            raw = await anyio.to_thread.run_sync(source.read, most + 1)
        if len(raw) > most:  # a tar holding less than the limits is not this large
            raise self.limits.refuse("max_total_bytes", len(raw), "the tar archive")
        snapshot = await anyio.to_thread.run_sync(_read_tar, raw, self.limits)
        async with self.edit(session_id, expected_version=expected_version) as files:
            await files.apply(snapshot)
        return await self.tree(session_id)

    async def export_dir(self, session_id: str, folder: str | os.PathLike[str]) -> int:
        """Write the tree into ``folder`` (created if missing; it must be empty), with each
        file's mode; returns the number of files."""
        snapshot = await self.snapshot(session_id)
        await anyio.to_thread.run_sync(_write_dir, snapshot, Path(folder))
        return len(snapshot.files)

    async def import_dir(
        self,
        session_id: str,
        folder: str | os.PathLike[str],
        *,
        expected_version: int | None = None,
    ) -> FileTree:
        """Replace the tree with a folder's files and directories (modes kept), as one change
        set; returns the new tree.

        Raises:
            PathError: the folder holds a symlink, a device, a FIFO or a socket, or a name
                the workspace refuses; nothing is written.
            WorkspaceLimitError: the content passes a limit; nothing is written.
            DocumentConflictError: the tree is not at ``expected_version``, or changed while
                the folder was read; nothing is written.
        """
        snapshot = await anyio.to_thread.run_sync(_read_dir, Path(folder), self.limits)
        async with self.edit(session_id, expected_version=expected_version) as files:
            await files.apply(snapshot)
        return await self.tree(session_id)


def _tar_bytes(snapshot: Snapshot) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(snapshot.dirs):
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, DEFAULT_DIR_MODE, 0
            archive.addfile(info)
        for path, data in sorted(snapshot.files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mtime = len(data), 0
            info.mode = snapshot.modes.get(path, DEFAULT_FILE_MODE)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _read_tar(raw: bytes, limits: WorkspaceLimits) -> Snapshot:
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    dirs: set[str] = set()
    total = 0
    try:
        archive = tarfile.open(fileobj=io.BytesIO(raw), mode="r:*")  # noqa: SIM115 - with below
    except tarfile.TarError as exc:
        raise InvalidArgumentError(f"not a tar archive: {exc}") from None
    with archive:
        for member in archive:
            name = member.name
            if not (member.isfile() or member.isdir()):
                kind = "link" if member.issym() or member.islnk() else "device, FIFO or special"
                raise PathError(
                    f"tar member {name!r} is a {kind}; a workspace holds only files and "
                    "directories (nothing was imported)",
                    path=name,
                )
            path = normalize_path(name.removesuffix("/") or ".", what="tar member")
            if member.isdir():
                if path:
                    dirs.add(path)
                continue
            if member.size > limits.max_file_bytes:
                raise limits.refuse("max_file_bytes", member.size, f"tar member {name!r}")
            # A later member of a path replaces the earlier one (as extracting does): what
            # counts against the limits is what is kept.
            replaced = files.get(path)
            total += member.size - (0 if replaced is None else len(replaced))
            if total > limits.max_total_bytes:
                raise limits.refuse("max_total_bytes", total, "the tar's files")
            if replaced is None and len(files) + len(dirs) >= limits.max_entries:
                raise limits.refuse("max_entries", len(files) + len(dirs) + 1, "the tar")
            handle = archive.extractfile(member)
            if handle is None:
                raise PathError(f"tar member {name!r} has no content", path=name)
            files[path] = handle.read()
            mode = member.mode & 0o777
            if mode != DEFAULT_FILE_MODE:
                modes[path] = mode
            else:
                modes.pop(path, None)
    return Snapshot(files, frozenset(dirs), modes)


def _read_dir(folder: Path, limits: WorkspaceLimits) -> Snapshot:
    if not folder.is_dir() or folder.is_symlink():
        raise InvalidArgumentError(f"{str(folder)!r} is not a folder")
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    dirs: set[str] = set()
    total = 0
    for current, names, found in os.walk(folder):
        base = Path(current)
        for name in sorted(names) + sorted(found):
            item = base / name
            relative = item.relative_to(folder).as_posix()
            if item.is_symlink():
                raise PathError(
                    f"{relative!r} is a symlink; a workspace holds only files and directories "
                    "(nothing was imported)",
                    path=relative,
                )
            path = normalize_path(relative, what="folder entry")
            if item.is_dir():
                dirs.add(path)
                continue
            if not item.is_file():
                raise PathError(
                    f"{relative!r} is not a regular file (a device, FIFO or socket); nothing "
                    "was imported",
                    path=relative,
                )
            size = item.stat().st_size
            if size > limits.max_file_bytes:
                raise limits.refuse("max_file_bytes", size, f"file {relative!r}")
            total += size
            if total > limits.max_total_bytes:
                raise limits.refuse("max_total_bytes", total, "the folder's files")
            if len(files) + len(dirs) >= limits.max_entries:
                raise limits.refuse("max_entries", len(files) + len(dirs) + 1, "the folder")
            files[path] = item.read_bytes()
            mode = item.stat().st_mode & 0o777
            if mode != DEFAULT_FILE_MODE:
                modes[path] = mode
    return Snapshot(files, frozenset(dirs), modes)


def _write_dir(snapshot: Snapshot, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise InvalidArgumentError(
            f"{str(folder)!r} is not empty; export into an empty or new folder"
        )
    root = folder.resolve()

    def inside(path: str) -> Path:
        target = folder / normalize_path(path, what="exported path")
        if not target.resolve().is_relative_to(root):  # never, with checked paths: a guard
            raise PathError(f"{path!r} would be written outside {str(folder)!r}", path=path)
        return target

    for path in sorted(snapshot.dirs):
        inside(path).mkdir(parents=True, exist_ok=True)
    for path, data in snapshot.files.items():
        target = inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(snapshot.modes.get(path, DEFAULT_FILE_MODE))
