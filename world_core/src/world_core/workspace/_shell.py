"""The shell: a bash-compatible interpreter that runs a script against a file tree in memory.

A :class:`Shell` runs a script on a copy of a workspace's files (a :class:`Tree`) and answers
with the script's output, its exit code and the tree as the script left it
(:class:`ShellResult`). Nothing else is reachable: the script sees a virtual filesystem with
the workspace at ``/workspace`` (its working directory and ``$HOME``), no host file, no
process, no network. Files it writes outside ``/workspace`` (``/tmp``) live for that run only.

The engine is chosen by measurement (the compatibility corpus in ``world_core/tests/
shell_corpus``, every script compared with real ``/bin/bash``): `bashkit
<https://pypi.org/project/bashkit/>`_, a bash interpreter in Rust, is the default
(:func:`default_shell`). It is a native dependency, so it comes with the optional extra
``shell`` (``pip install 'world-core[shell]'``). Any other engine can stand behind the
:class:`Shell` protocol.

Limits (:class:`ShellLimits`): wall time, output size, loop iterations, commands and memory
(the bytes of the tree). A script stopped by a limit exits with :data:`LIMIT_EXIT_CODE`, the
result names the limit (:attr:`ShellResult.limit`) and says which setting to raise in its
``stderr``, and the tree is returned unchanged: a stopped script changes no file. The
interpreter's own caps count as limits too (``depth``, and ``engine`` for a command whose
output the engine cut short), so a cut the engine reports is not answered with exit code 0.
:meth:`ShellResult.raise_for_limit` turns that into a :class:`~world_core.errors.ShellLimitError`.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from world_core.errors import ConfigurationError, InvalidArgumentError, ShellLimitError
from world_core.workspace._fs import TreeLike

__all__ = [
    "LIMIT_EXIT_CODE",
    "MAX_COMMANDS",
    "MAX_FUNCTION_DEPTH",
    "SHELL_ENVIRONMENT",
    "WORKSPACE_ROOT",
    "Limit",
    "Shell",
    "ShellLimits",
    "ShellResult",
    "Tree",
    "default_shell",
]

WORKSPACE_ROOT = "/workspace"
"""Where the tree is inside the shell: the script's working directory and ``$HOME``."""

LIMIT_EXIT_CODE = 124
"""The exit code of a script stopped by a limit (as ``timeout(1)`` uses)."""

Limit = Literal["time", "output", "loop", "commands", "memory", "depth", "engine"]
"""What stopped a script: a :class:`ShellLimits` setting; ``depth`` (functions nested deeper
than the interpreter allows: :data:`MAX_FUNCTION_DEPTH`); or ``engine``, a cap of the
interpreter's own that cut a command's output short (bashkit: ``seq`` past 16 MiB of integers or
100,000 other lines, ``yes`` past 4 MiB, ``head`` past 16 MiB of ``/dev/zero``, a ``printf``
width over 10,000, a pipeline past 32,000,000 bytes, stdout or stderr past 1 MiB with
``max_output_bytes`` set higher), which no setting raises."""

MAX_COMMANDS = 100_000
"""The most :attr:`ShellLimits.max_commands` may be (bashkit's own ceiling per script)."""

MAX_FUNCTION_DEPTH = 16
"""How deep bashkit lets functions call functions (recursion included); no setting raises it."""

_LIMIT_SETTING: dict[str, str] = {
    "time": "timeout",
    "output": "max_output_bytes",
    "loop": "max_loop_iterations",
    "commands": "max_commands",
    "memory": "max_memory_bytes",
}

SHELL_ENVIRONMENT: Mapping[str, str] = {
    "HOME": WORKSPACE_ROOT,
    "PWD": WORKSPACE_ROOT,
    "USER": "user",
    "LOGNAME": "user",
    "LC_ALL": "C",
    "LANG": "C",
    "TZ": "UTC",
    "PATH": "/usr/bin:/bin",
}
"""The environment every script starts with (the corpus runs real bash with the same)."""


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(f"ShellLimits.{name} must be an int > 0, got {value!r}")
    return value


@dataclass(frozen=True)
class ShellLimits:
    """What one script may use. Every limit stops the script with a clear error.

    Attributes:
        timeout: seconds of wall time (default 10).
        max_output_bytes: bytes of stdout and of stderr each (default 1 MiB, also the most
            bashkit keeps: past it, set higher, the script is stopped as ``engine``).
        max_loop_iterations: iterations of any one loop (default 100,000).
        max_commands: commands the whole script may run (default and most:
            :data:`MAX_COMMANDS`, 100,000; a long loop counts each command of each round).
        max_memory_bytes: bytes of all files in the tree, before and after the script
            (default 64 MiB); the interpreter's own memory is bounded by the same number.

    Raises:
        InvalidArgumentError: a value that is not a positive number.
    """

    timeout: float = 10.0
    max_output_bytes: int = 1 << 20
    max_loop_iterations: int = 100_000
    max_commands: int = 100_000
    max_memory_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            raise InvalidArgumentError(
                f"ShellLimits.timeout must be a finite number of seconds > 0, got {self.timeout!r}"
            )
        _positive_int("max_output_bytes", self.max_output_bytes)
        _positive_int("max_loop_iterations", self.max_loop_iterations)
        _positive_int("max_commands", self.max_commands)
        if self.max_commands > MAX_COMMANDS:
            raise InvalidArgumentError(
                f"ShellLimits.max_commands must be at most {MAX_COMMANDS} (the interpreter's own "
                f"ceiling per script), got {self.max_commands!r}"
            )
        _positive_int("max_memory_bytes", self.max_memory_bytes)


def _check_path(path: object, what: str) -> str:
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(f"{what} must be a non-empty str, got {path!r}")
    if (
        "\x00" in path
        or path.startswith("/")
        or posixpath.normpath(path) != path
        or (path == ".." or path.startswith("../"))
    ):
        raise InvalidArgumentError(
            f"{what} {path!r} must be a normalised relative path inside the workspace "
            "(no leading '/', no '.', '..' or empty parts, no NUL)"
        )
    return path


@dataclass(frozen=True)
class Tree:
    """A workspace's files: what a script starts from and what it leaves.

    Attributes:
        files: relative path (``src/main.py``) to content.
        dirs: every directory (relative path) that exists, with or without files; a file's
            parent directories are always in it (the constructor adds them).
        modes: permission bits of the files whose mode is not ``0o644`` (``0o755`` for an
            executable script).

    Raises:
        InvalidArgumentError: a path that is absolute, not normalised, or has NUL; content that
            is not bytes; a mode outside ``0..0o7777``; a path both a file and a directory.
    """

    files: Mapping[str, bytes] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()
    modes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        files = dict(self.files)
        dirs = set(self.dirs)
        for path, content in files.items():
            _check_path(path, "a file path")
            if not isinstance(content, bytes):
                raise InvalidArgumentError(
                    f"file {path!r}: content must be bytes, got {type(content).__name__}"
                )
            parent = posixpath.dirname(path)
            while parent:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
        for path in dirs:
            _check_path(path, "a directory path")
            if path in files:
                raise InvalidArgumentError(f"{path!r} is both a file and a directory")
        modes = {}
        for path, mode in self.modes.items():
            if path not in files:
                raise InvalidArgumentError(f"mode given for {path!r}, which is not a file")
            if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
                raise InvalidArgumentError(f"file {path!r}: mode must be 0..0o7777, got {mode!r}")
            if mode != 0o644:
                modes[path] = mode
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "dirs", frozenset(dirs))
        object.__setattr__(self, "modes", modes)

    @property
    def size(self) -> int:
        """Bytes of all files."""
        return sum(len(content) for content in self.files.values())

    @classmethod
    def of(cls, tree: TreeLike | Mapping[str, bytes]) -> Tree:
        """``tree`` as a :class:`Tree`: a Tree as it is; anything with ``files``, ``dirs`` and
        ``modes`` (the workspace's ``Snapshot``, ``context.fs.snapshot()``); or a mapping of
        relative path to bytes.

        Raises:
            InvalidArgumentError: none of those, or a path or content a Tree refuses.
        """
        if isinstance(tree, Tree):
            return tree
        if isinstance(tree, Mapping):
            return cls(files=tree)
        try:
            files, dirs, modes = tree.files, tree.dirs, tree.modes
        except AttributeError:
            raise InvalidArgumentError(
                "tree must be a Tree, a Snapshot (files, dirs, modes) or a mapping of path to "
                f"bytes, got {type(tree).__name__}"
            ) from None
        return cls(files=files, dirs=frozenset(dirs), modes=modes)


@dataclass(frozen=True)
class ShellResult:
    """What a script did.

    Attributes:
        stdout, stderr: its output (UTF-8, undecodable bytes replaced), each at most
            ``max_output_bytes``.
        exit_code: its exit status (:data:`LIMIT_EXIT_CODE` when a limit stopped it).
        tree: the files as it left them (the tree it started from when a limit stopped it).
        limit: the limit that stopped it, or None.
        not_saved: paths under ``/workspace`` the script left that ``tree`` does not hold,
            sorted: symbolic links (a workspace holds only files and directories), and any
            other kind of entry that is neither. ``stderr`` names them too.
    """

    stdout: str
    stderr: str
    exit_code: int
    tree: Tree
    limit: Limit | None = None
    not_saved: tuple[str, ...] = ()

    def raise_for_limit(self) -> ShellResult:
        """Return self, unless a limit stopped the script.

        Raises:
            ShellLimitError: naming the limit and the :class:`ShellLimits` setting to raise.
        """
        if self.limit is not None:
            raise ShellLimitError(limit_message(self.limit), limit=self.limit)
        return self


def limit_message(limit: Limit, detail: str = "") -> str:
    """The message for a script stopped by ``limit`` (what to raise to let it finish)."""
    extra = f" ({detail})" if detail else ""
    if limit == "depth":
        return (
            f"shell: the script was stopped: functions nested more than {MAX_FUNCTION_DEPTH} "
            f"deep{extra}; no file was changed. Use a loop instead of deep recursion."
        )
    if limit == "engine":
        return (
            f"shell: the script was stopped: its output is incomplete, cut short by a cap of the "
            f"interpreter{extra}; no file was changed. No setting raises this cap: make the "
            "command produce less (a smaller range or count, a narrower width)."
        )
    return (
        f"shell: the script was stopped by the {limit} limit{extra}; no file was changed. "
        f"Make the script do less, or raise ShellLimits.{_LIMIT_SETTING[limit]}."
    )


@runtime_checkable
class Shell(Protocol):
    """A bash-compatible interpreter confined to a tree in memory."""

    name: str
    """The engine's name and version (``bashkit 0.20.1``)."""

    async def run(
        self, script: str, tree: TreeLike | Mapping[str, bytes], limits: ShellLimits | None = None
    ) -> ShellResult:
        """Run ``script`` (as ``bash -c``) in ``/workspace`` holding ``tree``.

        Never reaches the host's files, processes or network; ``tree`` is not modified.

        Args:
            script: the bash script.
            tree: the files it starts from: a :class:`Tree`, a ``Snapshot`` or a mapping of
                relative path to bytes (see :meth:`Tree.of`).
            limits: what it may use (default :class:`ShellLimits()`).

        Returns:
            Its output, exit code and the tree as it left it (an entry under ``/workspace``
            that is neither a file nor a directory, such as a symbolic link, is left out and
            named in :attr:`ShellResult.not_saved`). A script that fails, or is stopped by a
            limit, is a result, not an exception.

        Raises:
            InvalidArgumentError: ``script`` is not a str or has NUL; ``tree`` is not a tree;
                ``limits`` is not :class:`ShellLimits`.
        """
        ...


def check_script(script: object) -> str:
    """A script: a str without NUL.

    Raises:
        InvalidArgumentError: anything else.
    """
    if not isinstance(script, str):
        raise InvalidArgumentError(f"script must be a str, got {type(script).__name__}")
    if "\x00" in script:
        raise InvalidArgumentError("script must not contain NUL")
    return script


def default_shell() -> Shell:
    """The default engine: bashkit (the optional extra ``shell``).

    Raises:
        ConfigurationError: bashkit is not installed; the message says how to install it.
    """
    try:
        from world_core.workspace._shell_bashkit import BashkitShell
    except ImportError as exc:
        raise ConfigurationError(
            "the shell needs the bashkit interpreter, which is not installed: "
            "pip install 'world-core[shell]' (or uv add 'world-core[shell]')"
        ) from exc
    return BashkitShell()
