"""WorkspaceContract: the virtual filesystem's promises, on the World under test.

An agent edits files through ``context.fs`` with ``safe`` tools (the tree is a document in
the session log, contents are blobs). A crash before and after every file-changing step,
resumed by a fresh journal, must leave the tree equal (by digest) to a clean run's; a failing
call changes nothing; an app's stale edit and a tool's edit over an app's newer one are
detected; paths that would escape and archives that carry escapes, links or devices are
refused; limits hold. Crashes are in process (``CrashPoint(in_process=True)``): the journal
a crash leaves behind is the same, without a process per point. Exhaustive cases are in
``world_core/tests/test_workspace_fs.py`` (local only).
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any, ClassVar, Literal

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import WAIT
from world_core import (
    Agent,
    Client,
    CrashPoint,
    Files,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    ToolContext,
    Workspace,
    WorkspaceLimits,
    World,
    tool,
    virtual,
)
from world_core.errors import (
    ConflictError,
    PathError,
    ToolError,
    WorkspaceLimitError,
)

__all__ = ["WorkspaceContract"]

TURN = "t"

PLAN: list[tuple[str, dict[str, str]]] = [
    ("write_file", {"path": "notes/todo.md", "text": "# todo\n"}),
    ("append_file", {"path": "notes/todo.md", "text": "- buy milk\n"}),
    ("move", {"source": "notes", "target": "docs/notes"}),
]
"""The file-changing calls the scripted model makes, one per reply: tool steps 1, 3 and 5
(few, so the matrix stays fast on the slowest backend; ``world_core/tests`` crashes a longer
plan with every operation on local)."""

REPLY = "files edited"


def _fs(context: ToolContext) -> Files:
    files: Files = context.fs
    return files


async def write_file(path: str, text: str, context: ToolContext) -> int:
    """Create or replace a file."""
    return await _fs(context).write(path, text)


async def append_file(path: str, text: str, context: ToolContext) -> int:
    """Append text to a file."""
    return await _fs(context).append(path, text)


async def move(source: str, target: str, context: ToolContext) -> str:
    """Move a file or directory."""
    await _fs(context).rename(source, target)
    return "moved"


def _policy(request: ModelRequest) -> ModelReply:
    done = sum(1 for message in request.messages if message["role"] == "tool")
    if done == len(PLAN):
        return ModelReply(content=REPLY)
    name, arguments = PLAN[done]
    return ModelReply(
        tool_calls=[ToolCall(id=f"c{done}", name=name, arguments=json.dumps(arguments))]
    )


def _agent() -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(_policy)
    tools = [tool(fn, replay="safe") for fn in (write_file, append_file, move)]
    return Agent(model=model, tools=tools), model


When = Literal["before_run", "after_run"]
WHENS: tuple[When, When] = ("before_run", "after_run")
CRASH_POINTS: list[tuple[int, When]] = [(step, when) for step in (1, 3, 5) for when in WHENS]


class WorkspaceContract(ContractBase):
    """The virtual filesystem, end to end, on the World under test."""

    contract_area: ClassVar[str] = "workspace"

    async def test_workspace_crash_at_every_file_step_leaves_the_clean_runs_tree(
        self, world: World
    ) -> None:
        client = Client(world)
        workspace = Workspace(world)
        await client.submit("clean", "edit the files", turn_id=TURN)
        agent, _ = _agent()
        with anyio.fail_after(WAIT):
            assert await agent.run_turn(await Journal.open(world, "clean", TURN)) == REPLY
        clean = await workspace.digest("clean")
        assert sorted((await workspace.tree("clean")).files) == ["docs/notes/todo.md"]
        assert await workspace.read_text("clean", "docs/notes/todo.md") == "# todo\n- buy milk\n"
        rows: dict[str, tuple[bool, int, bool]] = {}

        async def point(step: int, when: When) -> None:
            session = f"crash-{step}-{when}"
            await client.submit(session, "edit the files", turn_id=TURN)
            dying, _ = _agent()
            crash = CrashPoint(step, when, in_process=True)
            with pytest.raises(SimulatedCrash):
                await dying.run_turn(await Journal.open(world, session, TURN, crash=crash))
            again, model = _agent()
            reply = await again.run_turn(await Journal.open(world, session, TURN))
            # Model calls before the crash were journaled: the resumed run pays only the rest.
            calls = len(PLAN) + 1
            paid_before = len([m for m in range(0, 2 * calls, 2) if m < step])
            rows[f"{step}:{when}"] = (
                await workspace.digest(session) == clean,
                len(model.calls) + paid_before - calls,
                reply == REPLY,
            )

        with anyio.fail_after(WAIT * 2):
            async with anyio.create_task_group() as tg:
                for step, when in CRASH_POINTS:
                    tg.start_soon(point, step, when)
        expected = {f"{step}:{when}": (True, 0, True) for step, when in CRASH_POINTS}
        assert rows == expected, "crash point: (tree matches, repeated model calls, same reply)"

    async def test_workspace_a_failing_tool_changes_no_file(self, world: World) -> None:
        async def seed(context: ToolContext) -> None:
            await _fs(context).write("keep.txt", "kept")

        async def fail(context: ToolContext) -> None:
            await _fs(context).write("keep.txt", "overwritten")
            await _fs(context).write("new/file.txt", "new")
            await _fs(context).remove("keep.txt")
            raise RuntimeError("failed after editing")

        await Client(world).submit("s", "go", turn_id=TURN)
        journal = await Journal.open(world, "s", TURN)
        await journal.call(_step(seed, "seed", "never"), {})
        with pytest.raises(ToolError, match="failed after editing"):
            await journal.call(_step(fail, "fail", "never"), {})
        await journal.finish("done")
        workspace = Workspace(world)
        tree = await workspace.tree("s")
        assert sorted(tree.files) == ["keep.txt"], "a failing call's file changes were kept"
        assert await workspace.read_text("s", "keep.txt") == "kept"

    async def test_workspace_app_and_tool_conflicts_are_detected(self, world: World) -> None:
        workspace = Workspace(world)
        first = await workspace.write("s", "plan.md", "v1")
        await workspace.write("s", "plan.md", "v2 by the app", expected_version=first.version)
        with pytest.raises(ConflictError):
            await workspace.write("s", "plan.md", "stale", expected_version=first.version)
        # A never tool reads the tree, the app edits it meanwhile, the tool then writes.
        read = anyio.Event()
        edited = anyio.Event()

        async def edit(context: ToolContext) -> str:
            text = await _fs(context).read_text("plan.md")
            read.set()
            await edited.wait()
            await _fs(context).write("plan.md", text + " + tool")
            return text

        await Client(world).submit("s", "go", turn_id=TURN)
        journal = await Journal.open(world, "s", TURN)

        async def app_edits() -> None:
            await read.wait()
            await workspace.write("s", "plan.md", "v3 by the app")
            edited.set()

        refused: list[ToolError] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(app_edits)
                try:
                    await journal.call(_step(edit, "edit", "never"), {})
                except ToolError as exc:  # ran, but its edit was refused
                    refused.append(exc)
        assert await workspace.read_text("s", "plan.md") == "v3 by the app", (
            "a tool's edit overwrote an app's edit made after the tool read the file"
        )
        assert refused, "a never tool's edit over a newer app edit was not refused"

    async def test_workspace_confinement_attacks_are_refused(self, world: World) -> None:
        attacks = ["../escape", "a/../../escape", "/etc/passwd", "a\\..\\b", "a\x00b"]

        async def attack(context: ToolContext) -> int:
            refused = 0
            for path in attacks:
                for operation in (
                    _fs(context).write(path, "x"),
                    _fs(context).read(path),
                    _fs(context).rename("ok.txt", path),
                ):
                    with pytest.raises(PathError):
                        await operation
                    refused += 1
            await _fs(context).write("ok.txt", "still fine")
            return refused

        await Client(world).submit("s", "go", turn_id=TURN)
        journal = await Journal.open(world, "s", TURN)
        await journal.call(_step(_seed_ok, "seed", "never"), {})
        assert await journal.call(_step(attack, "attack", "never"), {}) == 3 * len(attacks)
        workspace = Workspace(world)
        for path in attacks:
            with pytest.raises(PathError):
                await workspace.write("s", path, "x")
        for member in (_member("../escape"), _member("/abs"), _member("l", tarfile.SYMTYPE)):
            with pytest.raises(PathError):
                await workspace.import_tar("s", _tar(member))
        assert sorted((await workspace.tree("s")).files) == ["ok.txt"]

    async def test_workspace_limits_are_enforced(self, world: World) -> None:
        small = virtual(limits=WorkspaceLimits(max_file_bytes=100, max_total_bytes=150))

        async def fill(context: ToolContext) -> list[str]:
            files = small.files(context)
            await files.write("a", b"x" * 100)
            hit: list[str] = []
            for path, size in (("big", 101), ("b", 60)):
                try:
                    await files.write(path, b"y" * size)
                except WorkspaceLimitError as exc:
                    hit.append(exc.limit)
            return hit

        await Client(world).submit("s", "go", turn_id=TURN)
        journal = await Journal.open(world, "s", TURN)
        assert await journal.call(_step(fill, "fill", "never"), {}) == [
            "max_file_bytes",
            "max_total_bytes",
        ]
        assert sorted((await Workspace(world).tree("s")).files) == ["a"]


async def _seed_ok(context: ToolContext) -> None:
    await _fs(context).write("ok.txt", "ok")


def _step(body: Any, name: str, replay: Literal["safe", "never"]) -> Any:
    async def run(context: ToolContext) -> Any:
        return await body(context)

    run.__name__ = name
    run.__doc__ = f"{name} (a workspace contract's tool)"
    return tool(run, replay=replay, name=name)


def _member(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    return info


def _tar(member: tarfile.TarInfo) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(member, io.BytesIO(b"") if member.isfile() else None)
    return buffer.getvalue()
