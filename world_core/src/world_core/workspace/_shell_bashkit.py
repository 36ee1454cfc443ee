"""The bashkit engine behind :class:`~world_core.workspace.Shell` (the optional extra ``shell``).

bashkit interprets bash in Rust over a filesystem in memory; it has no way to the host's
files (no real mount is configured), starts no process (``python3`` and ``sqlite`` builtins
are off) and has no network (no allowlist given: ``curl``/``wget`` refuse). Each run gets a
fresh interpreter, so nothing leaks from one script to the next.

Its knobs cover time (``timeout_seconds``), loop iterations and commands; the rest is
enforced around it: output is counted as it streams and the run cancelled past
``max_output_bytes``; the tree's bytes are checked before and after against
``max_memory_bytes``; a deadline a little past ``timeout`` cancels a run the engine did not
stop itself.

bashkit also caps some commands on its own, with no knob in its Python API (checked in
0.20.1: neither ``max_loop_iterations``, ``max_commands`` nor an ``ExecutionProfile`` moves
them): ``seq`` prints at most 100,000 lines, ``yes`` 10,000, ``printf`` refuses a width over
10,000, a job in the background (``f &``) that nests functions too deep ends alone, and a
read of ``/dev/zero`` ends after 1 MiB, of ``/dev/urandom`` after 8 KiB. It reports the first
four only as a line on stderr, which goes where the script sends its stderr (``2>/dev/null``
discards it), and the devices not at all; the script goes on with the output cut short, its
exit code 0 on a wrong answer. So three commands stand before bashkit's own (it runs custom
commands first) and record a cut out of the script's reach (live commands of
:mod:`~world_core.workspace._shell_commands`):

- ``yes`` streams its lines until its reader is done, as the real one does (``yes | head -n
  9000`` is right, no cut); past ``YES_MAX_BYTES`` (4 MiB), a cut. Under a command that
  collects output before passing it on (``bash -c``, ``timeout``, ``xargs``), or before one of
  bashkit's many commands that read all their input first (``sed``, ``awk``, ``cut``,
  ``fold``), nothing stops it early: it runs to that cap (as bashkit's own ran to its 10,000
  lines).
- ``head`` (GNU's, streaming) reads ``/dev/zero``, ``/dev/urandom`` and ``/dev/random`` named
  as files as endless (``head -c 2000000 /dev/zero`` is right); past ``STREAM_MAX_BYTES`` (16
  MiB), a cut. Other readers of the devices (``cat /dev/zero``, ``head < /dev/zero``, ``od``)
  get bashkit's short devices, and that cut is not seen.
- ``seq`` counts integers itself (``seq 1 300000 | tail -1`` is right), streaming, until its
  reader is done or past ``STREAM_MAX_BYTES``, a cut; anything else (``-w``, decimals) is
  bashkit's own, run apart, whose cap of 100,000 lines is a cut when its reader takes all of
  them.

The other caps (``printf``, a job in the background) are matched in the script's stderr
(:data:`_ENGINE_CAPS`): a script that discards its stderr discards those, and they are then
not seen. A recorded or matched cut stops the run as a limit does (``engine``, or ``depth``).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import bashkit

from world_core.errors import InvalidArgumentError
from world_core.workspace._fs import TreeLike
from world_core.workspace._shell import (
    LIMIT_EXIT_CODE,
    SHELL_ENVIRONMENT,
    WORKSPACE_ROOT,
    Limit,
    ShellLimits,
    ShellResult,
    Tree,
    check_script,
    limit_message,
)
from world_core.workspace._shell_commands import Cut, head_command, seq_command, yes_command

__all__ = ["BashkitShell"]

_GRACE = 1.0
"""Seconds past ``timeout`` before the run is cancelled from outside."""

ENGINE_MAX_FILE_BYTES = 10_000_000
"""bashkit's own cap on one file (a script writing more gets "file too large", as ``EFBIG``)."""

ENGINE_MAX_OUTPUT_BYTES = 1 << 20
"""bashkit's own cap on a script's stdout, and on its stderr (its ``Standard`` profile): past
it the rest is dropped, and the run is stopped by the ``output`` limit (``engine`` when
``max_output_bytes`` is set higher, which cannot take effect)."""

_ENGINE_LIMITS: tuple[tuple[re.Pattern[str], Limit], ...] = (
    # bashkit's budget for the bytes between the commands of a pipeline (32,000,000): no knob
    (re.compile(r"intermediate bytes"), "engine"),
    (re.compile(r"execution timeout"), "time"),
    (re.compile(r"loop iterations"), "loop"),
    (re.compile(r"command (count|limit)"), "commands"),
    (re.compile(r"function depth"), "depth"),
    (re.compile(r"memory"), "memory"),
)


_ENGINE_CAPS = re.compile(
    r"^(?:bash: line \d+: )?(?:[\w.-]+: )?(?:"
    r"(?:line|output) limit \([^)\n]*\) exceeded; output truncated"
    r"|format width \d+ exceeds limit \d+"
    r"|output limit exceeded \([^)\n]*\)"
    r"|resource limit exceeded: [^\n]*"
    r")$",
    re.MULTILINE,
)
"""A line bashkit writes on stderr when one of its own caps cut a command short while the
script went on (``seq: line limit (100000) exceeded; output truncated``, ``printf: format
width 20000 exceeds limit 10000``, ``resource limit exceeded: maximum function depth exceeded
(16)`` from a job in the background). A script that writes such a line on its stderr itself
is stopped the same way."""


def _engine_limit(error: str | None, default: Limit = "commands") -> Limit | None:
    if not error or ("resource limit" not in error and "limit exceeded" not in error):
        return None
    for pattern, limit in _ENGINE_LIMITS:
        if pattern.search(error):
            return limit
    return default


def _engine_cap(stderr: str) -> tuple[Limit, str] | None:
    """The first cap of bashkit's own that ``stderr`` reports, and its line."""
    found = _ENGINE_CAPS.search(stderr)
    if found is None:
        return None
    line = found.group(0)
    return _engine_limit(line, "engine") or "engine", line


def _run_seq(limits: ShellLimits) -> Callable[[list[str]], Awaitable[tuple[bytes, str, int]]]:
    """bashkit's own ``seq``, in an interpreter apart: its stdout, stderr and exit code."""

    async def run(argv: list[str]) -> tuple[bytes, str, int]:
        apart = bashkit.Bash(
            env=dict(SHELL_ENVIRONMENT),
            max_commands=1,
            max_memory=limits.max_memory_bytes,
            timeout_seconds=limits.timeout,
        )
        done = await apart.execute(" ".join(["seq", *map(shlex.quote, argv)]))
        return str(done.stdout).encode(), str(done.stderr), int(done.exit_code)

    return run


def _load(fs: Any, tree: Tree) -> None:
    fs.mkdir(WORKSPACE_ROOT, True)
    for path in sorted(tree.dirs):
        fs.mkdir(f"{WORKSPACE_ROOT}/{path}", True)
    for path, content in tree.files.items():
        fs.write_file(f"{WORKSPACE_ROOT}/{path}", content)
        mode = tree.modes.get(path)
        if mode is not None:
            fs.chmod(f"{WORKSPACE_ROOT}/{path}", mode)


def _walk(fs: Any) -> tuple[Tree, dict[str, str]]:
    """The tree under ``/workspace``, and the entries it cannot hold (path to kind)."""
    files: dict[str, bytes] = {}
    dirs: set[str] = set()
    modes: dict[str, int] = {}
    left_out: dict[str, str] = {}
    if not fs.exists(WORKSPACE_ROOT):
        return Tree(), left_out
    pending = [""]
    while pending:
        relative = pending.pop()
        for entry in fs.read_dir(f"{WORKSPACE_ROOT}/{relative}" if relative else WORKSPACE_ROOT):
            path = posixpath.join(relative, entry["name"]) if relative else entry["name"]
            kind = entry["metadata"]["file_type"]
            if kind == "directory":
                dirs.add(path)
                pending.append(path)
            elif kind == "file":
                files[path] = bytes(fs.read_file(f"{WORKSPACE_ROOT}/{path}"))
                modes[path] = int(entry["metadata"]["mode"]) & 0o7777
            else:  # a symbolic link, a named pipe: the workspace keeps files and folders only
                left_out[path] = str(kind)
    return Tree(files=files, dirs=frozenset(dirs), modes=modes), left_out


def _not_saved_note(left_out: Mapping[str, str]) -> str:
    kinds = {"symlink": "a symbolic link", "fifo": "a named pipe"}
    named = ", ".join(
        f"{path!r} ({kinds.get(kind, kind)})" for path, kind in sorted(left_out.items())
    )
    advice = " Copy (cp, cp -r) instead of linking." if "symlink" in left_out.values() else ""
    return (
        f"shell: not saved in the workspace, which holds only files and directories: "
        f"{named}.{advice}\n"
    )


def _truncate(text: str, limit: int) -> str:
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


class BashkitShell:
    """:class:`~world_core.workspace.Shell` on bashkit."""

    name = f"bashkit {bashkit.__version__}"

    async def run(
        self, script: str, tree: TreeLike | Mapping[str, bytes], limits: ShellLimits | None = None
    ) -> ShellResult:
        """See :meth:`Shell.run <world_core.workspace.Shell.run>`.

        Raises:
            InvalidArgumentError: a bad script, tree or limits, or a path of the tree the
                interpreter's filesystem refuses.
        """
        check_script(script)
        tree = Tree.of(tree)
        if limits is None:
            limits = ShellLimits()
        elif not isinstance(limits, ShellLimits):
            raise InvalidArgumentError(f"limits must be ShellLimits, got {limits!r}")
        if tree.size > limits.max_memory_bytes:
            return self._stopped(tree, "memory", f"the tree holds {tree.size} bytes", "", "")
        too_big = [path for path, data in tree.files.items() if len(data) > ENGINE_MAX_FILE_BYTES]
        if too_big:
            detail = (
                f"{too_big[0]!r} is {len(tree.files[too_big[0]])} bytes; the interpreter takes "
                f"files of at most {ENGINE_MAX_FILE_BYTES} bytes"
            )
            return self._stopped(tree, "memory", detail, "", "")
        cuts: list[Cut] = []
        bash = bashkit.Bash(
            username="user",
            hostname="world",
            cwd=WORKSPACE_ROOT,
            env=dict(SHELL_ENVIRONMENT),
            max_commands=limits.max_commands,
            max_loop_iterations=limits.max_loop_iterations,
            max_memory=limits.max_memory_bytes,
            timeout_seconds=limits.timeout,
        )
        bash.add_command("yes", yes_command(cuts))
        bash.add_command("head", head_command(cuts))
        bash.add_command("seq", seq_command(cuts, _run_seq(limits), _engine_cap))
        try:
            _load(bash.fs(), tree)
        except RuntimeError as exc:  # a path the interpreter's filesystem refuses
            raise InvalidArgumentError(f"the shell could not load the tree: {exc}") from exc
        counted = [0]
        overflow = [False]

        async def count(data: bytes) -> None:
            counted[0] += len(data)
            if counted[0] > 2 * limits.max_output_bytes and not overflow[0]:
                overflow[0] = True
                bash.cancel()

        out_limit = limits.max_output_bytes
        result: Any = None
        with anyio.move_on_after(limits.timeout + _GRACE):
            # byte sinks, not on_output: with on_output, bashkit does not flag the stdout it
            # cut at its cap when a live command wrote it (head -c 3M /dev/zero)
            result = await bash.execute(script, capture=out_limit + 1, stdout=count, stderr=count)
        if result is None:
            bash.cancel()
            return self._stopped(tree, "time", f"{limits.timeout} s", "", "")
        stdout, stderr = str(result.stdout), str(result.stderr)
        if overflow[0]:
            return self._stopped(
                tree,
                "output",
                f"more than {limits.max_output_bytes} bytes",
                stdout,
                stderr,
                limits.max_output_bytes,
            )
        limit = _engine_limit(result.error)
        if limit is not None:
            return self._stopped(
                tree, limit, str(result.error), stdout, stderr, limits.max_output_bytes
            )
        if result.stdout_truncated or result.stderr_truncated:
            kept = min(out_limit, ENGINE_MAX_OUTPUT_BYTES)
            detail = f"more than {kept} bytes"
            if out_limit > ENGINE_MAX_OUTPUT_BYTES:
                detail += f"; the interpreter keeps at most {kept} of stdout and of stderr"
            limit = "output" if out_limit <= ENGINE_MAX_OUTPUT_BYTES else "engine"
            return self._stopped(tree, limit, detail, stdout, stderr, out_limit)
        cap = cuts[0] if cuts else _engine_cap(stderr)
        if cap is not None:
            return self._stopped(tree, cap[0], cap[1], stdout, stderr, limits.max_output_bytes)
        after, left_out = _walk(bash.fs())
        if after.size > limits.max_memory_bytes:
            return self._stopped(
                tree,
                "memory",
                f"the files would hold {after.size} bytes",
                stdout,
                stderr,
                limits.max_output_bytes,
            )
        if (
            len(stdout.encode("utf-8", "surrogateescape")) > out_limit
            or len(stderr.encode("utf-8", "surrogateescape")) > out_limit
        ):
            return self._stopped(
                tree, "output", f"more than {out_limit} bytes", stdout, stderr, out_limit
            )
        if left_out:
            if stderr and not stderr.endswith("\n"):
                stderr += "\n"
            stderr += _not_saved_note(left_out)
        return ShellResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=int(result.exit_code),
            tree=after,
            not_saved=tuple(sorted(left_out)),
        )

    @staticmethod
    def _stopped(
        tree: Tree, limit: Limit, detail: str, stdout: str, stderr: str, cap: int = 1 << 20
    ) -> ShellResult:
        message = limit_message(limit, detail)
        stderr = _truncate(stderr, cap)
        if stderr and not stderr.endswith("\n"):
            stderr += "\n"
        return ShellResult(
            stdout=_truncate(stdout, cap),
            stderr=f"{stderr}{message}\n",
            exit_code=LIMIT_EXIT_CODE,
            tree=tree,
            limit=limit,
        )
