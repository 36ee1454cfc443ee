"""The local World: logs, queues and streams in files under one folder (Linux / POSIX).

The embedded default backend of `world`, and the reference a new backend author reads first.
Several processes on one machine may share the folder. See README.md for the design.

    world = await connect(url="/var/lib/myapp/world", namespace="default")
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio.to_thread

from world_core.errors import ConfigurationError
from world_core.spi import Capabilities, World, validate_namespace
from world_local._files import sweep_temps
from world_local._log import LocalLog
from world_local._queue import LocalQueue
from world_local._space import ENV_DIR, KINDS, Space, translate
from world_local._stream import LocalStream

__all__ = ["DEFAULT_DIR", "ENV_DIR", "LocalWorld", "connect"]

DEFAULT_DIR = ".workflow-data"


class LocalWorld(World):
    """Logs, queues and streams of one namespace in ``<folder>/<namespace>/``.

    Lease deadlines use this machine's clock (``time.time()``): the machine is the store.
    """

    name = "local"

    def __init__(self, folder: Path, namespace: str, setting: str = ENV_DIR) -> None:
        self.folder = folder
        self.namespace = validate_namespace(namespace)
        self._space = Space(folder / namespace, setting)
        self.log = LocalLog(self._space)
        self.queue = LocalQueue(self._space, self.log.finish_outbox)
        self.stream = LocalStream(self._space)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(outbox=True, shared=True, native_wakeups=False)

    def settings(self) -> Mapping[str, str]:
        return {ENV_DIR: str(self.folder), "path": str(self._space.folder)}

    async def purge(self) -> None:
        def work() -> None:
            if self._space.folder.is_dir():  # else nothing was ever stored: nothing to make
                for kind in KINDS:
                    shutil.rmtree(self._space.folder / kind, ignore_errors=True)
                    (self._space.folder / kind).mkdir()
            self._space.forget()

        await self._space.run(work)

    async def aclose(self) -> None:
        self._space.closed = True
        self._space.forget()  # closes its files (a call still running closes its own after)


def _folder(url: str | None) -> tuple[Path, str]:
    """The folder, and where it came from (``url=`` or ``WORKFLOW_LOCAL_DIR``)."""
    setting = "url=" if url is not None else ENV_DIR
    raw = url if url is not None else os.environ.get(ENV_DIR) or DEFAULT_DIR
    if raw.startswith("file:"):
        parts = urlsplit(raw)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise ConfigurationError(
                f"{raw!r} (from {setting}) is not a local folder URL; use file:///absolute/path "
                "or a plain path"
            )
        raw = unquote(parts.path)
    if not raw:
        raise ConfigurationError(f"the local World needs a folder: set {ENV_DIR}")
    return Path(raw).expanduser().absolute(), setting


async def connect(*, url: str | None = None, namespace: str = "default") -> LocalWorld:
    """Open the local World in folder ``url`` (a path or ``file://`` URL; default
    ``$WORKFLOW_LOCAL_DIR``, else ``.workflow-data`` in the current directory).

    Opening creates nothing: the folder, its parents and the namespace's folders are created
    by the first call that stores something (an append, an enqueue, a stream write or close).
    Until then reads answer as for an empty namespace. Opening only looks: a folder that could
    never be created is refused now rather than at the first write, and the temporary files
    that killed writers left in existing folders are removed.

    Raises:
        ConfigurationError: ``url`` is not a local folder, or the folder cannot be used: a file
            stands where a folder should be, no permission, a read-only file system (the
            message names the path and ``WORKFLOW_LOCAL_DIR`` or ``url=``).
        BackendUnavailableError: another fault of the file system (a full disk ...).
    """
    validate_namespace(namespace)
    folder, setting = _folder(url)

    def look() -> None:
        _check_usable(folder / namespace)
        for kind in KINDS:
            with suppress(FileNotFoundError):  # made by the first write
                sweep_temps(folder / namespace / kind)

    with translate(folder, setting):
        await anyio.to_thread.run_sync(look)
    return LocalWorld(folder, namespace, setting)


def _check_usable(path: Path) -> None:
    """Raise the OSError that creating ``path`` (with its parents) and writing in it would
    meet, creating nothing: a file in the way, or a closest existing folder this user cannot
    write (no permission, a read-only file system)."""
    existing = path
    while True:
        try:
            mode = existing.stat().st_mode
            break
        except FileNotFoundError:
            existing = existing.parent  # the root always exists
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
    if existing != path and not os.access(existing, os.W_OK | os.X_OK):
        # To be created in ``existing`` by the first write, which could not.
        code = errno.EROFS if _read_only(existing) else errno.EACCES
        raise OSError(code, os.strerror(code), str(existing))


def _read_only(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
