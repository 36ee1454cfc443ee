"""The bash tool: scripts edit the session's virtual filesystem, committed with the outcome."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from world_core import (
    Client,
    CrashPoint,
    Journal,
    SimulatedCrash,
    Tool,
    Workspace,
    WorkspaceLimits,
    World,
    open_world,
    session_log_id,
    virtual,
)
from world_core.errors import InvalidArgumentError, ToolError
from world_core.workspace import (
    LIMIT_EXIT_CODE,
    FileTree,
    ShellLimits,
    ShellResult,
    Tree,
    TreeLike,
    bash_tool,
    default_shell,
)

pytestmark = pytest.mark.anyio
LOG = session_log_id("s")
Limits = ShellLimits | None

FIRST = "mkdir -p src && printf 'def add(a, b):\\n    return a - b\\n' > src/lib.py && ls src"
SECOND = "sed -i 's/a - b/a + b/' src/lib.py && echo '# lib' > README.md && cat src/lib.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="sh") as opened:
        yield opened


async def _turn(world: World, turn: str = "t", crash: CrashPoint | None = None) -> Journal:
    await Client(world).submit("s", "hello", turn_id=turn)
    # defer_safe=False: each outcome is durable before the next step (by default a safe
    # tool's outcome rides with the next append, and a crash re-runs it too)
    return await Journal.open(world, "s", turn, crash=crash, defer_safe=False)


async def _run_both(journal: Journal, bash: Tool) -> None:
    for script in (FIRST, SECOND):
        await journal.call(bash, {"script": script})


async def _files(world: World) -> dict[str, bytes]:
    workspace = Workspace(world)
    tree = await workspace.tree("s")
    return {path: await workspace.read("s", path) for path in tree.files}


async def test_two_scripts_edit_the_tree_each_committed_with_its_outcome(world: World) -> None:
    bash = bash_tool()
    assert bash.replay == "safe"
    journal = await _turn(world)
    first = await journal.call(bash, {"script": FIRST})
    assert first == {"stdout": "lib.py\n", "stderr": "", "exit_code": 0}
    second = await journal.call(bash, {"script": SECOND})
    assert second["stdout"] == "def add(a, b):\n    return a + b\n"
    await journal.finish("done")
    assert await _files(world) == {
        "src/lib.py": b"def add(a, b):\n    return a + b\n",
        "README.md": b"# lib\n",
    }
    keys = [event.key for event in await world.log.read(LOG)]
    for step in (0, 1):
        outcome = keys.index(f"turn/t/step/{step}/outcome")
        tree_record = keys[outcome + 1] or ""  # the tree's new version, in the same append
        assert not tree_record.startswith("turn/"), keys
    # Replay: no script runs again, nothing is written again.
    again = await Journal.open(world, "s", "t")
    assert await again.call(bash, {"script": FIRST}) == first
    assert await again.call(bash, {"script": SECOND}) == second
    assert again.tool_runs == 0
    assert len(keys) == len(await world.log.read(LOG))


async def test_a_script_that_changes_nothing_stages_nothing(world: World) -> None:
    journal = await _turn(world)
    result = await journal.call(bash_tool(), {"script": "ls; echo none >&2; exit 3"})
    assert result == {"stdout": "", "stderr": "none\n", "exit_code": 3}
    await journal.finish("done")
    keys = [event.key for event in await world.log.read(LOG)]
    assert all((key or "").startswith("turn/") for key in keys), keys  # no tree record


async def test_a_script_setting_setuid_or_sticky_bits_keeps_its_files(world: World) -> None:
    """``chmod 4755`` (or ``+t``) is valid bash; the workspace keeps permission bits only, so
    the files are committed with ``0o755``. Before, the engine's tree held ``0o4755`` and the
    whole call failed with "mode must be permission bits 0 to 0o777, got 2541", losing every
    file the script wrote."""
    journal = await _turn(world)
    script = "printf 'echo hi\\n' > run.sh && chmod 4755 run.sh && echo kept > note.txt"
    result = await journal.call(bash_tool(), {"script": script})
    assert result == {"stdout": "", "stderr": "", "exit_code": 0}
    await journal.finish("done")
    tree = await Workspace(world).tree("s")
    assert {path: entry.mode for path, entry in tree.files.items()} == {
        "run.sh": 0o755,
        "note.txt": 0o644,
    }
    assert await _files(world) == {"run.sh": b"echo hi\n", "note.txt": b"kept\n"}


@pytest.mark.parametrize("when", ["before_run", "after_run"])
@pytest.mark.parametrize("step", [0, 1])
async def test_a_crash_at_any_step_ends_with_the_clean_runs_tree(
    tmp_path: Path, step: int, when: str
) -> None:
    bash = bash_tool()
    async with open_world("local", url=str(tmp_path / "clean"), namespace="sh") as clean:
        journal = await _turn(clean)
        expected = [await journal.call(bash, {"script": s}) for s in (FIRST, SECOND)]
        await journal.finish("done")
        clean_files = await _files(clean)
    async with open_world("local", url=str(tmp_path / "crash"), namespace="sh") as world:
        # why: the crash moment is a plain str here, one of CrashPoint's two literals
        crash = CrashPoint(step, when, in_process=True)  # type: ignore[arg-type]
        dying = await _turn(world, crash=crash)
        with pytest.raises(SimulatedCrash):
            await _run_both(dying, bash)
        journal = await Journal.open(world, "s", "t")
        assert [await journal.call(bash, {"script": s}) for s in (FIRST, SECOND)] == expected
        assert journal.tool_runs == 2 - step  # the steps before the crash are read back
        await journal.finish("done")
        assert await _files(world) == clean_files


async def test_a_script_stopped_by_a_limit_changes_no_file(world: World) -> None:
    bash = bash_tool(limits=ShellLimits(max_loop_iterations=5))
    journal = await _turn(world)
    await journal.call(bash, {"script": "echo kept > a.txt"})
    result = await journal.call(bash, {"script": "rm a.txt; for i in $(seq 9); do :; done"})
    assert result["exit_code"] == LIMIT_EXIT_CODE
    assert "ShellLimits.max_loop_iterations" in result["stderr"]
    await journal.finish("done")
    assert await _files(world) == {"a.txt": b"kept\n"}


async def test_a_link_the_script_makes_is_named_in_the_outcome_not_lost(world: World) -> None:
    """A workspace keeps no links, so ``ln -s`` under /workspace saves no file; before, the
    link vanished with nothing said. Now the outcome's stderr names each path not saved and
    why, and the rest of the script's files are committed."""
    journal = await _turn(world)
    script = "echo data > target.txt && ln -s target.txt alias.txt && echo made"
    result = await journal.call(bash_tool(), {"script": script})
    assert result["exit_code"] == 0
    assert result["stdout"] == "made\n"
    assert "'alias.txt'" in result["stderr"]
    assert "not saved" in result["stderr"]
    await journal.finish("done")
    assert await _files(world) == {"target.txt": b"data\n"}


async def test_an_interpreter_cap_reaches_the_model_as_a_limit(world: World) -> None:
    """``seq 1 100000000 | tail -1`` printed 100000 with exit code 0 (bashkit cuts seq at
    100,000 lines); the outcome now carries the limit's exit code and says why, also when the
    script discards its stderr (the cut was seen only in a line on it)."""
    journal = await _turn(world)
    script = "seq 1 100000000 2>/dev/null | tail -1 > n.txt"
    result = await journal.call(bash_tool(), {"script": script})
    assert result["exit_code"] == LIMIT_EXIT_CODE
    assert "seq: output limit (16777216 bytes) exceeded" in result["stderr"]
    assert "incomplete" in result["stderr"]
    await journal.finish("done")
    assert await _files(world) == {}


async def test_a_tree_over_the_workspace_limits_fails_the_call(world: World) -> None:
    small = virtual(limits=WorkspaceLimits(max_file_bytes=100))
    bash = bash_tool(workspace=small)
    journal = await _turn(world)
    with pytest.raises(ToolError, match="max_file_bytes"):
        await journal.call(bash, {"script": "echo ok > small; head -c 500 /dev/zero > big"})
    assert await Workspace(world).tree("s") == FileTree()


async def test_a_draft_workspace_is_edited_in_memory(world: World) -> None:
    bash = bash_tool(workspace=virtual(durable=False))
    journal = await _turn(world)
    await journal.call(bash, {"script": "echo draft > d.txt"})
    assert (await journal.call(bash, {"script": "cat d.txt"}))["stdout"] == "draft\n"
    await journal.finish("done")
    assert await Workspace(world).tree("s") == FileTree()


async def test_any_shell_can_stand_behind_the_tool(world: World) -> None:
    class Recording:
        name = "recording"

        def __init__(self) -> None:
            self.trees: list[Tree] = []

        async def run(
            self,
            script: str,
            tree: TreeLike | Mapping[str, bytes],
            limits: ShellLimits | None = None,
        ) -> ShellResult:
            self.trees.append(Tree.of(tree))
            return await default_shell().run(script, tree, limits)

    shell = Recording()
    journal = await _turn(world)
    bash = bash_tool(shell=shell, name="sh")
    await journal.call(bash, {"script": "mkdir -p a/b; echo 1 > a/f"})
    await journal.call(bash, {"script": "true"})
    assert shell.trees[0] == Tree()
    assert shell.trees[1] == Tree(files={"a/f": b"1\n"}, dirs=frozenset({"a", "a/b"}))


async def test_an_app_edit_during_a_script_makes_it_run_again_on_the_new_tree(
    world: World,
) -> None:
    """The tree moved on while the script ran (an app wrote a file): its changes are not
    committed over the app's; the safe call runs again on the new tree."""

    class AppEditsOnce:
        name = "app-edits-once"

        def __init__(self) -> None:
            self.trees: list[Tree] = []

        async def run(
            self,
            script: str,
            tree: TreeLike | Mapping[str, bytes],
            limits: ShellLimits | None = None,
        ) -> ShellResult:
            self.trees.append(Tree.of(tree))
            if len(self.trees) == 1:
                await Workspace(world).write("s", "app.txt", "from the app\n")
            return await default_shell().run(script, tree, limits)

    shell = AppEditsOnce()
    journal = await _turn(world)
    result = await journal.call(bash_tool(shell=shell), {"script": "ls; echo tool > tool.txt"})
    assert result["stdout"] == "app.txt\n"  # the second run's
    assert [sorted(tree.files) for tree in shell.trees] == [[], ["app.txt"]]
    await journal.finish("done")
    assert await _files(world) == {"app.txt": b"from the app\n", "tool.txt": b"tool\n"}


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"ShellLimits\.timeout"):
        bash_tool(limits=ShellLimits(timeout=20), timeout=5)
    with pytest.raises(InvalidArgumentError, match="limits"):
        # why: the wrong type is the point: its refusal is tested
        bash_tool(limits={"timeout": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="virtual"):
        # why: the wrong type is the point: its refusal is tested
        bash_tool(workspace="/tmp")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="Shell"):
        # why: the wrong type is the point: its refusal is tested
        bash_tool(shell=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="tool name"):
        bash_tool(name="no spaces")


def test_the_tool_description_is_kept_word_for_word() -> None:
    """The description is part of every model request of a turn that offers the tool: a
    changed one makes each turn in flight during an upgrade a NonDeterminismError on resume.
    Change it only with a new tool name (or behind ``Journal.patched``), then update this."""
    import hashlib

    from world_core.workspace import SHELL_TOOL_DESCRIPTION

    digest = hashlib.sha256(SHELL_TOOL_DESCRIPTION.encode()).hexdigest()
    assert digest == "0a4236a9d04e1d983cd2ebfec8ec2310f803adc15dcb8cecbe9aef0bc3518375"
