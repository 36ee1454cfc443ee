"""The ``bash`` tool: the model runs a script against the session's virtual filesystem.

Each call takes the workspace's committed tree (``context.fs.snapshot()``), runs the script
on a copy of it in the :class:`~world_core.workspace.Shell`, and hands the tree the script
left to ``context.fs.apply``: the file changes are committed in the same atomic append as
the call's outcome ``{stdout, stderr, exit_code}``, or not at all.

Why it is ``replay="safe"``: the shell has no effect outside that copy (no host file, no
process, no network), so running a script again is harmless. A call interrupted by a crash
left nothing in the log; the worker that takes the turn over runs the script again against
the same committed tree and gets the same files. A finished call is never run again: its
outcome and its files are in the log.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from world_core.errors import InvalidArgumentError
from world_core.journal import Tool, ToolContext, tool
from world_core.workspace._fs import VirtualWorkspace, virtual
from world_core.workspace._shell import Shell, ShellLimits, Tree, default_shell

__all__ = ["SHELL_TOOL_DESCRIPTION", "bash_tool"]

SHELL_TOOL_DESCRIPTION = (
    "Run a bash script in the session's workspace (the working directory, /workspace) and get "
    "its stdout, stderr and exit_code. Pipes, redirections, here-documents, variables, loops, "
    "functions and the usual commands work (cat ls mkdir rm mv cp touch find grep sed awk sort "
    "uniq wc head tail cut tr diff xargs echo printf tee jq ...). File changes under "
    "/workspace are kept; there is no network, no host file and no other program. A script "
    "stopped by a limit (time, output, loops) exits with 124 and changes no file."
)
"""What the model reads about the tool. Part of every model request of a turn that offers the
tool, so it is kept word for word across releases: a turn in flight during an upgrade would
otherwise find its recorded requests changed on resume (a NonDeterminismError). What the
model must know beyond it comes in the call's ``stderr``: the limit a stopped script hit
(``engine`` included: output the interpreter cut short) and the links it made, not saved."""


def bash_tool(
    *,
    name: str = "bash",
    shell: Shell | None = None,
    limits: ShellLimits | None = None,
    workspace: VirtualWorkspace | None = None,
    timeout: float | None = None,
    description: str = SHELL_TOOL_DESCRIPTION,
) -> Tool:
    """The ``bash`` tool for an agent's :class:`~world_core.journal.ToolRegistry`.

    Args:
        name: the tool's name as the model sees it.
        shell: the engine (default :func:`~world_core.workspace.default_shell`: bashkit).
        limits: what one script may use (default :class:`ShellLimits()`).
        workspace: which workspace the scripts edit (default ``virtual()``, the session's
            durable tree; ``virtual(durable=False)`` for a draft tree cleared every turn).
        timeout: the tool call's timeout in seconds (default the script's ``limits.timeout``
            plus 30 s, for reading and committing the tree); at least ``limits.timeout``.
        description: what the model reads about the tool.

    Returns:
        A ``replay="safe"`` tool taking ``script`` and returning ``{"stdout", "stderr",
        "exit_code"}``. A script that fails, or is stopped by a limit, is an outcome like any
        other (exit code and stderr say why); a tree the workspace refuses (its
        ``WorkspaceLimits``) fails the call with ``WorkspaceLimitError`` and changes nothing.
        Files keep their permission bits (``0o777``); setuid, setgid and sticky bits a
        script sets are dropped. A symbolic link the script makes under ``/workspace`` is
        not saved (a workspace holds only files and directories); the outcome's ``stderr``
        ends with a line naming each such path.

    Raises:
        ConfigurationError: no ``shell`` given and bashkit is not installed
            (``pip install 'world-core[shell]'``).
        InvalidArgumentError: ``limits`` not :class:`ShellLimits`, ``workspace`` not made by
            ``virtual()``, ``shell`` not a :class:`Shell`, or ``timeout`` shorter than the
            script's time limit.
    """
    if limits is None:
        limits = ShellLimits()
    elif not isinstance(limits, ShellLimits):
        raise InvalidArgumentError(f"limits must be ShellLimits, got {limits!r}")
    if workspace is None:
        workspace = virtual()
    elif not isinstance(workspace, VirtualWorkspace):
        raise InvalidArgumentError(f"workspace must be made by virtual(), got {workspace!r}")
    if shell is None:
        shell = default_shell()
    elif not isinstance(shell, Shell):
        raise InvalidArgumentError(f"shell must be a Shell (async run(...)), got {shell!r}")
    if timeout is None:
        timeout = limits.timeout + 30.0
    elif (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and timeout < limits.timeout
    ):
        raise InvalidArgumentError(
            f"timeout={timeout!r} is shorter than the script's limit "
            f"ShellLimits.timeout={limits.timeout!r}: raise it, or lower the limit"
        )
    engine, files_of, script_limits = shell, workspace.files, limits

    async def run_script(
        script: Annotated[str, Field(description="the bash script to run in /workspace")],
        context: ToolContext,
    ) -> dict[str, Any]:
        files = files_of(context)
        snapshot = await files.snapshot()
        before = Tree.of(snapshot)
        result = await engine.run(script, before, script_limits)
        if result.tree != before:
            await files.apply(_permission_bits_only(result.tree))
        return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}

    return tool(run_script, replay="safe", name=name, description=description, timeout=timeout)


def _permission_bits_only(tree: Tree) -> Tree:
    """``tree`` with each file's mode cut to its permission bits (``0o777``), which is all a
    workspace keeps: ``chmod u+s`` or ``chmod +t`` in a script leaves setuid, setgid or sticky
    bits, which mean nothing in a workspace and would make the whole tree refused."""
    if all(mode <= 0o777 for mode in tree.modes.values()):
        return tree
    modes = {path: mode & 0o777 for path, mode in tree.modes.items()}
    return Tree(files=tree.files, dirs=tree.dirs, modes=modes)
