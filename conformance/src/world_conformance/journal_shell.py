"""JournalShellContract: the ``bash`` tool on the World under test.

A turn whose (scripted) model calls ``bash`` twice, crashed before and after each of its
five steps (in process: the journal a crash leaves behind, then a fresh journal continues),
ends with the clean run's file tree and reply and no repeated model call; limits stop a
script with a clear error and change no file; a script reaches nothing of the host. The
exhaustive cases (the compatibility corpus, every limit, every confinement attack) run on
the local World in ``world_core/tests``: the shell itself is the same code on every World.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import WAIT
from world_core import (
    Agent,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    Workspace,
    World,
    digest_of,
    session_log_id,
)
from world_core.workspace import LIMIT_EXIT_CODE, ShellLimits, bash_tool

__all__ = ["JournalShellContract"]

MESSAGE = "Fix the bug in src/lib.py."
FIRST = (
    "mkdir -p src tests && printf 'def add(a, b):\\n    return a - b\\n' > src/lib.py && "
    "echo 'assert add(2, 3) == 5' > tests/test_lib.py && ls -R"
)
SECOND = (
    "sed -i 's/a - b/a + b/' src/lib.py && grep -c '+' src/lib.py > fixed.txt && "
    "cat src/lib.py && rm tests/test_lib.py"
)
When = Literal["before_run", "after_run"]
WHENS: tuple[When, ...] = ("before_run", "after_run")
CRASH_POINTS: list[tuple[int, When]] = [(step, when) for step in range(5) for when in WHENS]
"""The turn's steps: 0 model, 1 bash, 2 model, 3 bash, 4 model."""


def _policy(request: ModelRequest) -> ModelReply:
    """bash FIRST, then bash SECOND, then answer with the second script's output."""
    results = [m for m in request.messages if m["role"] == "tool"]
    if len(results) < 2:
        script = FIRST if not results else SECOND
        arguments = json.dumps({"script": script})
        return ModelReply(
            tool_calls=[ToolCall(id=f"b{len(results)}", name="bash", arguments=arguments)]
        )
    output = json.loads(str(results[-1]["content"]))
    return ModelReply(content=f"Fixed (exit {output['exit_code']}): {output['stdout']}")


def _agent(model: ScriptedModel) -> Agent:
    return Agent(model=model, tools=[bash_tool()])


async def _model_outcomes(world: World, session: str) -> set[str]:
    """Digests of the model requests whose outcomes the session's log holds."""
    found: set[str] = set()
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") == "outcome" and body.get("kind") == "model":
            found.add(str(body["digest"]))
    return found


async def _tree(world: World, session: str) -> dict[str, bytes]:
    workspace = Workspace(world)
    tree = await workspace.tree(session)
    return {path: await workspace.read(session, path) for path in tree.files}


def _needs_shell_engine() -> None:
    """The shell is an optional extra of world-core: without its engine a shell contract skips,
    saying what to install (every in-repo backend runs them with it). Per test, not an autouse
    fixture: a backend's suite class inherits every contract class, and a fixture would apply
    to all of them."""
    pytest.importorskip(
        "bashkit",
        reason="the shell contracts need the shell engine: pip install 'world-core[shell]'",
    )


class JournalShellContract(ContractBase):
    """The bash tool's promises, end to end, on the World under test."""

    contract_area: ClassVar[str] = "shell"

    async def test_shell_crash_before_and_after_every_step_leaves_the_clean_tree(
        self, world: World
    ) -> None:
        """Crashed before and after each of the turn's five steps, then continued by a fresh
        journal: the clean run's files, modes and folders (the same tree digest), the same
        reply, and no model call repeated for a step that had finished."""
        _needs_shell_engine()
        client = Client(world, queue="q")
        await client.submit("clean", MESSAGE, turn_id="t")
        clean = await Journal.open(world, "clean", "t")
        with anyio.fail_after(WAIT):
            reply = await _agent(ScriptedModel(_policy)).run_turn(clean)
        assert reply == "Fixed (exit 0): def add(a, b):\n    return a + b\n"
        expected = await _tree(world, "clean")
        assert expected == {
            "src/lib.py": b"def add(a, b):\n    return a + b\n",
            "fixed.txt": b"1\n",
        }
        digest = await Workspace(world).digest("clean")
        rows: dict[str, tuple[bool, int, bool]] = {}

        async def point(step: int, when: When) -> None:
            session = f"crash-{step}-{when}"
            await client.submit(session, MESSAGE, turn_id="t")
            crash = CrashPoint(step, when, in_process=True)
            dying = await Journal.open(world, session, "t", crash=crash)
            with anyio.fail_after(WAIT), pytest.raises(SimulatedCrash):
                await _agent(ScriptedModel(_policy)).run_turn(dying)
            finished = await _model_outcomes(world, session)
            model = ScriptedModel(_policy)
            journal = await Journal.open(world, session, "t")
            with anyio.fail_after(WAIT):
                again = await _agent(model).run_turn(journal)
            repeated = sum(digest_of(r.model_dump(mode="json")) in finished for r in model.calls)
            same_tree = await Workspace(world).digest(session) == digest
            rows[f"{step}:{when}"] = (same_tree, repeated, again == reply)
            # Teeth: the model steps before the crash (0, 2, 4) were journaled, so "repeated"
            # counts against real records.
            assert len(finished) == len([m for m in (0, 2, 4) if m < step]), (step, when)

        async with anyio.create_task_group() as tg:
            for step, when in CRASH_POINTS:
                tg.start_soon(point, step, when)
        assert rows == {f"{s}:{w}": (True, 0, True) for s, w in CRASH_POINTS}, (
            "crash point: (tree equals the clean run's, repeated model calls, same reply)"
        )

    async def test_shell_limits_stop_a_script_and_change_no_file(self, world: World) -> None:
        """A script past its time or loop limit exits 124 naming the setting; the tree stays
        as the previous call committed it."""
        _needs_shell_engine()
        await Client(world, queue="q").submit("s", MESSAGE, turn_id="t")
        journal = await Journal.open(world, "s", "t")
        bash = bash_tool(limits=ShellLimits(timeout=0.5, max_loop_iterations=100))
        await journal.call(bash, {"script": "echo kept > a.txt"})
        with anyio.fail_after(WAIT):
            slow = await journal.call(bash, {"script": "rm a.txt; echo x > b.txt; sleep 30"})
            loop = await journal.call(bash, {"script": "rm a.txt; for i in $(seq 500); do :; done"})
        assert slow["exit_code"] == LIMIT_EXIT_CODE, slow
        assert "ShellLimits.timeout" in slow["stderr"], slow
        assert loop["exit_code"] == LIMIT_EXIT_CODE, loop
        assert "ShellLimits.max_loop_iterations" in loop["stderr"], loop
        await journal.finish("done")
        assert await _tree(world, "s") == {"a.txt": b"kept\n"}

    async def test_shell_scripts_reach_nothing_of_the_host(
        self, world: World, tmp_path: Path
    ) -> None:
        """Reading host files, writing through ``../..`` or an absolute path, starting a
        program: nothing of the host is read or written, only /workspace is kept."""
        _needs_shell_engine()
        secret = tmp_path / "secret.txt"
        secret.write_text("host-secret-17\n")
        marker = tmp_path / "marker"
        await Client(world, queue="q").submit("s", MESSAGE, turn_id="t")
        journal = await Journal.open(world, "s", "t")
        result = await journal.call(
            bash_tool(),
            {
                "script": f"cat {secret}; cat /etc/shadow; echo x > {marker}; "
                f"echo x > ../../..{marker}; cd /; echo x > {str(marker).lstrip('/')}; "
                f"/bin/sh -c 'touch {marker}'; echo kept > /workspace/k; exec touch {marker}"
            },
        )
        await journal.finish("done")
        assert "host-secret-17" not in json.dumps(result)
        assert not marker.exists(), "a script wrote a host file"
        assert await _tree(world, "s") == {"k": b"kept\n"}, "only /workspace is kept"
