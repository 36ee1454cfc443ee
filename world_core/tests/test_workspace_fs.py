"""The virtual filesystem: a tool's file changes commit with its outcome; paths are confined;
limits hold; apps read, edit, export and import a session's workspace."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel

from world_core import (
    Agent,
    BlobRef,
    Blobs,
    Client,
    CrashPoint,
    Documents,
    Files,
    Journal,
    ModelReply,
    ModelRequest,
    Replay,
    ScriptedModel,
    SimulatedCrash,
    Snapshot,
    ToolCall,
    ToolContext,
    Workspace,
    WorkspaceLimits,
    World,
    open_world,
    session_blobs,
    session_log_id,
    tool,
    virtual,
)
from world_core.errors import (
    BackendUnavailableError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PathError,
    PathNotFoundError,
    PossiblyRanError,
    ToolError,
    WorkspaceLimitError,
)
from world_core.workspace import TREE_DOCUMENT, FileTree, TreeDocument, normalize_path
from world_core.workspace import _fs as fs_module

pytestmark = pytest.mark.anyio
LOG = session_log_id("s")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="fs") as opened:
        yield opened


async def _turn(world: World, turn: str = "t") -> Journal:
    await Client(world).submit("s", "hello", turn_id=turn)
    return await Journal.open(world, "s", turn)


Body = Callable[[ToolContext], Awaitable[Any]]


def _fs(context: ToolContext) -> Files:
    """``context.fs``, typed (``ToolContext`` extensions are attributes mypy cannot see)."""
    files: Files = context.fs
    return files


def _tool(body: Body, replay: Replay = "safe", name: str = "work", timeout: float = 60.0) -> Any:
    async def work(label: str, context: ToolContext) -> Any:
        """Work on files."""
        return await body(context)

    return tool(work, replay=replay, name=name, timeout=timeout)


async def test_a_tools_file_changes_commit_with_its_outcome(world: World) -> None:
    async def write(context: ToolContext) -> str:
        await context.fs.write("notes/todo.txt", "buy milk\n")
        await context.fs.append("notes/todo.txt", b"call bob\n")
        assert await context.fs.read_text("notes/todo.txt") == "buy milk\ncall bob\n"
        return "ok"

    async def read(context: ToolContext) -> str:
        return str(await context.fs.read_text("notes/todo.txt"))

    journal = await _turn(world)
    assert await journal.call(_tool(write, "never"), {"label": "a"}) == "ok"
    assert await journal.call(_tool(read, name="read"), {"label": "b"}) == "buy milk\ncall bob\n"
    await journal.finish("done")
    keys = [event.key for event in await world.log.read(LOG)]
    outcome = keys.index("turn/t/step/0/outcome")
    assert keys[outcome + 1] == f"doc/{TREE_DOCUMENT}/v/1"
    workspace = Workspace(world)
    tree = await workspace.tree("s")
    assert tree.version == 1
    assert sorted(tree.files) == ["notes/todo.txt"]
    assert tree.dirs == {"notes"}
    assert await workspace.read_text("s", "notes/todo.txt") == "buy milk\ncall bob\n"
    # Replay: nothing runs, nothing is written again.
    again = await Journal.open(world, "s", "t")
    assert await again.call(_tool(write, "never"), {"label": "a"}) == "ok"
    assert again.tool_runs == 0
    assert len(keys) == len(await world.log.read(LOG))


async def test_contents_are_blobs_shared_between_versions(world: World) -> None:
    big = b"x" * 100_000

    async def first(context: ToolContext) -> None:
        await _fs(context).write("a.bin", big)
        await _fs(context).write("same.bin", big)  # the same bytes under another name

    async def second(context: ToolContext) -> None:
        await _fs(context).write("b.txt", "small")  # a.bin unchanged
        await _fs(context).copy("a.bin", "c.bin")

    journal = await _turn(world)
    await journal.call(_tool(first), {"label": "1"})
    await journal.call(_tool(second, name="second"), {"label": "2"})
    await journal.finish("done")
    tree = await Workspace(world).tree("s")
    digests = {entry.digest for entry in tree.files.values()}
    assert len(digests) == 2
    blobs = session_blobs(world, "s")
    for digest in digests:
        info = await world.stream.info(blobs.stream_id(BlobRef(digest=digest, size=0)))
        assert info.closed
    stream_id = blobs.stream_id(BlobRef(digest=tree.files["a.bin"].digest, size=len(big)))
    data = b"".join([chunk.data async for chunk in world.stream.read(stream_id)])
    assert data == big  # stored once, whole, under its digest, in the session's own blobs


@pytest.mark.parametrize("replay", ["safe", "never"])
async def test_a_failing_timed_out_or_crashed_call_changes_no_file(
    world: World, replay: Replay
) -> None:
    async def seed(context: ToolContext) -> None:
        await _fs(context).write("keep.txt", "kept")

    async def fail(context: ToolContext) -> None:
        await _fs(context).write("keep.txt", "changed")
        await _fs(context).write("new.txt", "new")
        raise RuntimeError("failed after writing")

    async def hang(context: ToolContext) -> None:
        await _fs(context).remove("keep.txt")
        await anyio.sleep_forever()

    async def finish(context: ToolContext) -> None:
        await _fs(context).write("crash.txt", "written before the crash")

    journal = await _turn(world)
    await journal.call(_tool(seed, replay, "seed"), {"label": "0"})
    before = await journal.call(_tool(_digest, replay, "digest"), {"label": "1"})
    with pytest.raises(ToolError, match="failed after writing"):
        await journal.call(_tool(fail, replay, "fail"), {"label": "2"})
    with anyio.fail_after(10), pytest.raises((ToolError, PossiblyRanError)):
        await journal.call(_tool(hang, replay, "hang", timeout=0.2), {"label": "3"})
    assert await journal.call(_tool(_digest, replay, "digest"), {"label": "4"}) == before
    crash = CrashPoint(5, "after_run", in_process=True)
    steps: list[tuple[Body, str, float]] = [
        (seed, "seed", 60),
        (_digest, "digest", 60),
        (fail, "fail", 60),
        (hang, "hang", 0.2),
        (_digest, "digest", 60),
        (finish, "finish", 60),
    ]

    async def run(journal: Journal) -> list[str]:
        failed: list[str] = []
        for index, (body, name, timeout) in enumerate(steps):
            try:
                await journal.call(_tool(body, replay, name, timeout), {"label": str(index)})
            except ToolError:
                failed.append(name)
        return failed

    with pytest.raises(SimulatedCrash):
        await run(await Journal.open(world, "s", "t", crash=crash))
    workspace = Workspace(world)
    assert "crash.txt" not in (await workspace.tree("s")).files
    # Past the never call's deadline, the takeover answers for it: it may have run.
    final = await Journal.open(world, "s", "t", clock=lambda: time.time() + 3600)
    failed = await run(final)
    assert failed == (["fail", "hang", "finish"] if replay == "never" else ["fail", "hang"])
    await final.finish("done")
    tree = await workspace.tree("s")
    # The interrupted never call's files were never committed; the safe one ran again.
    expected = ["crash.txt", "keep.txt"] if replay == "safe" else ["keep.txt"]
    assert sorted(tree.files) == expected
    assert await workspace.read_text("s", "keep.txt") == "kept"


async def _digest(context: ToolContext) -> str:
    return await _fs(context).digest()


async def test_a_safe_call_rerun_after_a_crash_leaves_the_clean_runs_tree(
    world: World, tmp_path: Path
) -> None:
    async def build(context: ToolContext) -> str:
        await _fs(context).write("src/main.py", "print('hi')\n", mode=0o755)
        await _fs(context).mkdir("empty/dir")
        await _fs(context).append("log.txt", "line\n")
        await _fs(context).rename("src", "app")
        return await _fs(context).digest()

    clean = await _turn(world, "clean")
    expected = await clean.call(_tool(build), {"label": "x"})
    await clean.finish("done")
    async with open_world("local", url=str(tmp_path / "other"), namespace="fs") as other:
        await Client(other).submit("s", "hello", turn_id="t")
        for when in ("before_run", "after_run"):
            crash = CrashPoint(0, when, in_process=True)
            dying = await Journal.open(other, "s", "t", crash=crash)
            with pytest.raises(SimulatedCrash):
                await dying.call(_tool(build), {"label": "x"})
            assert await Workspace(other).tree("s") == FileTree()
        journal = await Journal.open(other, "s", "t")
        assert await journal.call(_tool(build), {"label": "x"}) == expected
        await journal.finish("done")
        assert await Workspace(other).digest("s") == expected


async def test_every_operation(world: World) -> None:
    async def work(context: ToolContext) -> dict[str, Any]:
        fs = _fs(context)
        await fs.write("a/b/c.txt", "c")
        await fs.write_bytes("a/d.txt", b"\x00\xff")
        with pytest.raises(InvalidArgumentError, match="takes bytes"):
            await fs.write_bytes("a/x", "text")  # type: ignore[arg-type]  # refusal under test
        with pytest.raises(InvalidArgumentError, match="takes a str"):
            await fs.write_text("a/x", b"bytes")  # type: ignore[arg-type]  # refusal under test
        assert await fs.write_text("a/latin.txt", "é", "latin-1") == 1
        await fs.remove("a/latin.txt")
        await fs.mkdir("e")
        out: dict[str, Any] = {
            "root": await fs.list(),
            "a": await fs.list("a"),
            "stat_file": (await fs.stat("a/d.txt")).size,
            "stat_dir": (await fs.stat("a/b")).kind,
            "glob": await fs.glob("**/*.txt"),
            "glob_top": await fs.glob("a/*"),
            "exists": [await fs.exists("a/b"), await fs.exists("zz")],
        }
        await fs.copy("a", "copy")
        await fs.rename("a/d.txt", "e/moved.bin")
        await fs.remove("a/b", recursive=True)
        out["after"] = await fs.glob("**")
        snapshot = await fs.snapshot()
        out["snapshot"] = sorted(snapshot.files)
        await fs.apply(
            Snapshot({**snapshot.files, "new.txt": b"new"}, snapshot.dirs - {"e"} | {"f"})
        )
        out["applied"] = await fs.glob("**")
        return out

    journal = await _turn(world)
    out = await journal.call(_tool(work), {"label": "x"})
    assert out["root"] == ["a", "e"]
    assert out["a"] == ["b", "d.txt"]
    assert out["stat_file"] == 2
    assert out["stat_dir"] == "dir"
    assert out["glob"] == ["a/b/c.txt", "a/d.txt"]
    assert out["glob_top"] == ["a/b", "a/d.txt"]
    assert out["exists"] == [True, False]
    assert out["after"] == [
        "a", "copy", "copy/b", "copy/b/c.txt", "copy/d.txt", "e", "e/moved.bin"
    ]  # fmt: skip
    assert out["snapshot"] == ["copy/b/c.txt", "copy/d.txt", "e/moved.bin"]
    # "e" holds a file, so it stays a directory; "f" is added
    assert out["applied"] == [
        "a", "copy", "copy/b", "copy/b/c.txt", "copy/d.txt", "e", "e/moved.bin", "f", "new.txt"
    ]  # fmt: skip


async def test_wrong_kinds_are_refused_and_change_nothing(world: World) -> None:
    async def work(context: ToolContext) -> list[str]:
        fs = _fs(context)
        await fs.write("f.txt", "x")
        await fs.mkdir("d/inner")
        refused: list[str] = []
        attempts: list[Callable[[], Awaitable[Any]]] = [
            lambda: fs.read("d"),
            lambda: fs.read("missing"),
            lambda: fs.write("d", "x"),
            lambda: fs.write("f.txt/child", "x"),
            lambda: fs.write("", "x"),
            lambda: fs.list("f.txt"),
            lambda: fs.remove("d"),
            lambda: fs.remove(""),
            lambda: fs.rename("d", "d/inner/x"),
            lambda: fs.rename("missing", "x"),
            lambda: fs.copy("f.txt", "d"),
            lambda: fs.mkdir("f.txt"),
            lambda: fs.mkdir("d", exist_ok=False),
            lambda: fs.write("no/parent.txt", "x", parents=False),
        ]
        for attempt in attempts:
            with pytest.raises((PathError, PathNotFoundError)) as caught:
                await attempt()
            refused.append(type(caught.value).__name__)
        return refused

    journal = await _turn(world)
    refused = await journal.call(_tool(work), {"label": "x"})
    assert set(refused) == {"PathNotFoundError", "PathError"}
    with pytest.raises(FileNotFoundError):  # PathNotFoundError is one
        await Workspace(world).read("s", "missing")


ATTACKS = [
    "../etc/passwd",
    "a/../../etc/passwd",
    "/etc/passwd",
    "//etc/passwd",
    "a\\..\\..\\x",
    "a\x00b",
    "a\nb",
    "a\x85b",
    "a\u2028b",
    "x" * 256,
    "/".join(["d"] * 65),
    ("y" * 200 + "/") * 6,
    "\ud800",
]


@pytest.mark.parametrize("path", ATTACKS, ids=range(len(ATTACKS)))
async def test_paths_that_would_escape_are_refused(world: World, path: str) -> None:
    async def attack(context: ToolContext) -> str:
        operations: list[Callable[[], Awaitable[Any]]] = [
            lambda: _fs(context).symlink("/etc/passwd", "ok-link"),
            lambda: _fs(context).write(path, "pwned"),
            lambda: _fs(context).read(path),
            lambda: _fs(context).mkdir(path),
            lambda: _fs(context).rename("ok.txt", path),
            lambda: _fs(context).copy(path, "ok2.txt"),
        ]
        for operation in operations:
            with pytest.raises(PathError):
                await operation()
        return "refused"

    async def seed(context: ToolContext) -> None:
        await _fs(context).write("ok.txt", "ok")

    journal = await _turn(world)
    await journal.call(_tool(seed, "never", "seed"), {"label": "s"})
    assert await journal.call(_tool(attack), {"label": "x"}) == "refused"
    with pytest.raises(PathError):
        await Workspace(world).write("s", path, "pwned")
    assert sorted((await Workspace(world).tree("s")).files) == ["ok.txt"]


def test_normalisation_inside_the_root() -> None:
    assert normalize_path("a/./b//c/") == "a/b/c"
    assert normalize_path("a/b/../c") == "a/c"
    assert normalize_path("") == normalize_path(".") == normalize_path("./") == ""
    assert normalize_path("a/..") == ""
    assert normalize_path("ünï cödé/ok") == "ünï cödé/ok"
    with pytest.raises(PathError, match="must be a str"):
        normalize_path(b"a")
    with pytest.raises(PathError, match="absolute"):
        normalize_path("/a")


@pytest.mark.parametrize("character", ["\x80", "\x85", "\x9f", "\u2028", "\u2029"])
def test_c1_controls_and_line_separators_are_refused_like_other_controls(
    character: str,
) -> None:
    """C1 controls (U+0080 to U+009F: U+0085 is NEXT LINE) and the line and paragraph
    separators end a line in many readers, as a newline does: a path is refused with the
    control-character error, naming the character. They were accepted before (only C0 and DEL
    were refused)."""
    with pytest.raises(PathError, match=f"control character U\\+{ord(character):04X}"):
        normalize_path(f"notes/a{character}b.txt")
    assert normalize_path("notes/\xa0\u2027\u202f.txt") == "notes/\xa0\u2027\u202f.txt"


async def test_limits_are_enforced_with_errors_that_name_them(world: World) -> None:
    limits = WorkspaceLimits(max_file_bytes=10, max_total_bytes=25, max_entries=4)
    small = virtual(limits=limits)

    async def work(context: ToolContext) -> list[str]:
        fs = small.files(context)
        await fs.write("a", b"1234567890")
        hit: list[str] = []
        attempts: list[Callable[[], Awaitable[Any]]] = [
            lambda: fs.write("big", b"x" * 11),
            lambda: fs.append("a", b"x"),
            lambda: fs.write("d/b", b"1234567890"),  # fits alone, but d + b + c are too many
            lambda: fs.write("b", b"x" * 10),
        ]
        for attempt in attempts:
            try:
                await attempt()
                await fs.write("c", b"1234567890")
            except WorkspaceLimitError as exc:
                hit.append(exc.limit if "virtual(limits=WorkspaceLimits(" in str(exc) else "?")
        return hit

    journal = await _turn(world)
    hit = await journal.call(_tool(work, "never"), {"label": "x"})
    assert hit[:2] == ["max_file_bytes", "max_file_bytes"]
    assert set(hit) >= {"max_file_bytes", "max_total_bytes"}
    tree = await Workspace(world).tree("s")
    assert tree.total_bytes <= 25
    assert len(tree.files) + len(tree.dirs) <= 4
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        WorkspaceLimits(max_entries=0)
    entries = len(tree.files) + len(tree.dirs)
    tight = Workspace(world, limits=WorkspaceLimits(max_entries=entries))
    with pytest.raises(WorkspaceLimitError, match="max_entries") as caught:
        await tight.write("s", "another", "x")
    assert (caught.value.allowed, caught.value.needed) == (entries, entries + 1)


async def test_draft_workspaces_live_in_memory_for_one_turn(world: World) -> None:
    draft = virtual(durable=False)

    async def write(context: ToolContext) -> None:
        await draft.files(context).write("scratch.txt", "draft")

    async def read(context: ToolContext) -> list[str]:
        return await draft.files(context).glob("**")

    async def fail(context: ToolContext) -> None:
        await draft.files(context).write("failed.txt", "x")
        raise RuntimeError("no")

    journal = await _turn(world)
    tail = await world.log.tail(LOG)
    await journal.call(_tool(write, "never"), {"label": "w"})
    with pytest.raises(ToolError):
        await journal.call(_tool(fail, name="fail"), {"label": "f"})
    assert await journal.call(_tool(read, name="read"), {"label": "r"}) == ["scratch.txt"]
    events = await world.log.read(LOG, after=tail)
    assert not any((event.key or "").startswith("doc/") for event in events)
    assert not any(b"scratch" in event.data for event in events)  # nothing of the draft
    assert await Workspace(world).tree("s") == FileTree()
    await journal.finish("done")
    nxt = await _turn(world, "t2")
    assert await nxt.call(_tool(read, name="read"), {"label": "r"}) == []


async def test_apps_edit_with_compare_and_set(world: World) -> None:
    workspace = Workspace(world)
    tree = await workspace.write("s", "plan.md", "# plan\n")
    assert tree.version == 1
    await workspace.write("s", "plan.md", "# plan v2\n", expected_version=1)
    with pytest.raises(ConflictError) as caught:
        await workspace.write("s", "plan.md", "# stale\n", expected_version=1)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    async with workspace.edit("s", expected_version=2) as files:
        await files.write("a.txt", "a")
        await files.remove("plan.md")
    assert sorted((await workspace.tree("s")).files) == ["a.txt"]
    with pytest.raises(RuntimeError):  # noqa: PT012 - the block's error is the point
        async with workspace.edit("s") as files:
            await files.write("b.txt", "b")
            raise RuntimeError("changed my mind")
    assert (await workspace.tree("s")).version == 3

    async def read(context: ToolContext) -> str:
        return await _fs(context).read_text("a.txt")

    journal = await _turn(world)
    assert await journal.call(_tool(read), {"label": "r"}) == "a"


async def test_concurrent_app_writes_of_one_process_all_land(world: World) -> None:
    """Eight tasks of one app write files to one session's workspace at once, five each,
    without expected_version: each write lands. (Each read the tree, then committed only if
    it had not moved; five tries with no pause, and a writer that kept losing to the others
    gave up with DocumentConflictError.)"""

    async def write(writer: int) -> None:
        workspace = Workspace(world)  # one of the app's handlers: its own Workspace
        for index in range(5):
            await workspace.write("s", f"w{writer}/{index}.txt", f"{writer}-{index}")

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for writer in range(8):
                group.start_soon(write, writer)
    tree = await Workspace(world).tree("s")
    assert tree.version == 40
    assert len(tree.files) == 40


async def test_tar_and_folder_round_trips(world: World, tmp_path: Path) -> None:
    workspace = Workspace(world)
    async with workspace.edit("s") as files:
        await files.write("src/run.sh", "#!/bin/sh\necho hi\n", mode=0o755)
        await files.write("data/blob.bin", bytes(range(256)))
        await files.mkdir("empty")
    digest = await workspace.digest("s")
    buffer = io.BytesIO()
    assert await workspace.export_tar("s", buffer) == 2
    first = buffer.getvalue()
    again = io.BytesIO()
    await workspace.export_tar("s", again)
    assert again.getvalue() == first  # deterministic
    await workspace.import_tar("other", first)
    assert await workspace.digest("other") == digest
    folder = tmp_path / "out"
    assert await workspace.export_dir("s", folder) == 2
    assert (folder / "src/run.sh").stat().st_mode & 0o777 == 0o755
    assert (folder / "empty").is_dir()
    await workspace.import_dir("third", folder)
    assert await workspace.digest("third") == digest
    with pytest.raises(InvalidArgumentError, match="not empty"):
        await workspace.export_dir("s", folder)


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            if info.isfile():
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


TAR_ATTACKS = {
    "dotdot": _tar((_member("../evil.txt"), b"x")),
    "nested-dotdot": _tar((_member("a/../../evil.txt"), b"x")),
    "absolute": _tar((_member("/etc/evil"), b"x")),
    "symlink": _tar((_member("link", tarfile.SYMTYPE, "/etc/passwd"), b"")),
    "hardlink": _tar((_member("ok.txt"), b"x"), (_member("hard", tarfile.LNKTYPE, "ok.txt"), b"")),
    "device": _tar((_member("dev", tarfile.CHRTYPE), b"")),
    "fifo": _tar((_member("fifo", tarfile.FIFOTYPE), b"")),
    "backslash": _tar((_member("a\\..\\..\\evil"), b"x")),
}


@pytest.mark.parametrize("name", sorted(TAR_ATTACKS))
async def test_imports_refuse_escapes_links_and_devices(
    world: World, tmp_path: Path, name: str
) -> None:
    workspace = Workspace(world)
    await workspace.write("s", "keep.txt", "kept")
    before = await workspace.tree("s")
    with pytest.raises(PathError):
        await workspace.import_tar("s", TAR_ATTACKS[name])
    assert await workspace.tree("s") == before
    assert not (tmp_path.parent / "evil.txt").exists()


async def test_a_directory_imported_without_its_parents_gets_them(world: World) -> None:
    """A tar may list ``a/b/`` without ``a/`` (tar does for ``tar cf x.tar a/b``): the tree
    holds every directory, so ``a`` is there too, listed and found like any directory. It was
    missing before: ``a/b`` existed, yet ``list("")`` did not show ``a`` and ``stat("a")``
    raised PathNotFoundError."""
    workspace = Workspace(world)
    tree = await workspace.import_tar("s", _tar((_member("a/b/", tarfile.DIRTYPE), b"")))
    assert tree.dirs == {"a", "a/b"}
    assert await workspace.list("s") == ["a"]
    assert (await workspace.stat("s", "a")).kind == "dir"


async def test_folder_imports_refuse_symlinks(world: World, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "ok.txt").write_text("ok")
    (folder / "link").symlink_to("/etc/passwd")
    with pytest.raises(PathError, match="symlink"):
        await Workspace(world).import_dir("s", folder)
    (folder / "link").unlink()
    os.mkfifo(folder / "fifo")
    with pytest.raises(PathError, match="not a regular file"):
        await Workspace(world).import_dir("s", folder)
    assert await Workspace(world).tree("s") == FileTree()
    big = tmp_path / "big"
    big.mkdir()
    (big / "f").write_bytes(b"x" * 20)
    small = Workspace(world, limits=WorkspaceLimits(max_file_bytes=10))
    with pytest.raises(WorkspaceLimitError, match="max_file_bytes"):
        await small.import_dir("s", big)


async def test_a_safe_tool_that_conflicts_with_an_app_runs_again_on_the_new_tree(
    world: World,
) -> None:
    workspace = Workspace(world)
    await workspace.write("s", "count.txt", "1")
    runs: list[str] = []

    async def bump(context: ToolContext) -> str:
        fs = _fs(context)
        text = await fs.read_text("count.txt")
        runs.append(text)
        if len(runs) == 1:  # the app changes the file while the first run works
            await workspace.write("s", "count.txt", "10")
        await fs.write("count.txt", str(int(text) + 1))
        return text

    journal = await _turn(world)
    assert await journal.call(_tool(bump, "safe", "bump"), {"label": "x"}) == "10"
    assert runs == ["1", "10"]
    assert await workspace.read_text("s", "count.txt") == "11"  # no edit lost


async def test_apps_watch_the_tree_change_live(world: World) -> None:
    workspace = Workspace(world)
    await workspace.write("s", "a.txt", "a")
    seen: list[tuple[int, list[str]]] = []

    async def follow() -> None:
        async for tree in workspace.watch("s", idle_timeout=5):
            seen.append((tree.version, sorted(tree.files)))
            if tree.version == 3:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await workspace.write("s", "b.txt", "b")
        await workspace.remove("s", "a.txt")
    assert seen == [(1, ["a.txt"]), (2, ["a.txt", "b.txt"]), (3, ["b.txt"])]


WHENS: tuple[Literal["before_run"], Literal["after_run"]] = ("before_run", "after_run")
FULL_PLAN: list[tuple[str, dict[str, Any]]] = [
    ("op", {"op": "write", "a": "src/app.py", "b": "print('v1')\n"}),
    ("op", {"op": "append", "a": "src/app.py", "b": "print('v2')\n"}),
    ("op", {"op": "mkdir", "a": "build/out", "b": ""}),
    ("op", {"op": "copy", "a": "src", "b": "backup/src"}),
    ("op", {"op": "rename", "a": "src/app.py", "b": "src/main.py"}),
    ("op", {"op": "remove", "a": "build", "b": ""}),
    ("op", {"op": "shout", "a": "", "b": ""}),
]


async def _op(op: str, a: str, b: str, context: ToolContext) -> str:
    """Change the workspace one way."""
    fs = _fs(context)
    if op == "write":
        await fs.write(a, b)
    elif op == "append":
        await fs.append(a, b)
    elif op == "mkdir":
        await fs.mkdir(a)
    elif op == "copy":
        await fs.copy(a, b)
    elif op == "rename":
        await fs.rename(a, b)
    elif op == "remove":
        await fs.remove(a, recursive=True)
    else:  # a whole-tree change through snapshot and apply, as the shell makes
        snapshot = await fs.snapshot()
        files = {path: data.upper() for path, data in snapshot.files.items()}
        await fs.apply(Snapshot(files, snapshot.dirs, snapshot.modes))
    return await fs.digest()


def _plan_policy(request: ModelRequest) -> ModelReply:
    done = sum(1 for message in request.messages if message["role"] == "tool")
    if done == len(FULL_PLAN):
        return ModelReply(content="done")
    name, arguments = FULL_PLAN[done]
    return ModelReply(
        tool_calls=[ToolCall(id=f"c{done}", name=name, arguments=json.dumps(arguments))]
    )


def _plan_agent(replay: Replay) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(_plan_policy)
    return Agent(model=model, tools=[tool(_op, replay=replay, name="op")]), model


@pytest.mark.parametrize("replay", ["safe", "never"])
async def test_a_crash_before_and_after_every_file_step_leaves_the_clean_tree(
    world: World, replay: Replay
) -> None:
    """Every operation, both labels, a crash before and after each tool step (1, 3, ... 13).
    A ``safe`` call runs again: the tree equals the clean run's. A cut-off ``never`` call is
    not run again (the model is told it may have happened) and its changes were not saved, so
    the tree lacks them: file tools, like the shell, should be ``safe``."""
    client = Client(world)
    workspace = Workspace(world)
    await client.submit("clean", "go", turn_id="t")
    agent, _ = _plan_agent(replay)
    assert await agent.run_turn(await Journal.open(world, "clean", "t")) == "done"
    clean = await workspace.digest("clean")
    assert sorted((await workspace.tree("clean")).files) == ["backup/src/app.py", "src/main.py"]
    assert await workspace.read_text("clean", "src/main.py") == "PRINT('V1')\nPRINT('V2')\n"
    later = time.time() + 3600  # every never call's deadline has passed on this clock
    rows: dict[tuple[int, str], tuple[bool, int, bool]] = {}

    async def point(step: int, when: Literal["before_run", "after_run"]) -> None:
        session = f"s-{step}-{when}"
        await client.submit(session, "go", turn_id="t")
        dying, _ = _plan_agent(replay)
        crash = CrashPoint(step, when, in_process=True)
        with pytest.raises(SimulatedCrash):
            await dying.run_turn(await Journal.open(world, session, "t", crash=crash))
        again, model = _plan_agent(replay)
        resumed = await Journal.open(world, session, "t", clock=lambda: later)
        assert await again.run_turn(resumed) == "done"
        told = "may or may not have happened" in str(model.calls[0].messages[-1]["content"])
        repeated = len(model.calls) - (len(FULL_PLAN) + 1 - len(range(0, step, 2)))
        rows[(step, when)] = (await workspace.digest(session) == clean, repeated, told)

    steps = range(1, 2 * len(FULL_PLAN), 2)
    async with anyio.create_task_group() as tg:
        for step in steps:
            tg.start_soon(point, step, "before_run")
            tg.start_soon(point, step, "after_run")
    if replay == "safe":
        expected = {(step, when): (True, 0, False) for step in steps for when in WHENS}
    else:  # the cut-off never call is not run again: its changes are not there, the model
        # is told (step 5 makes build/out, which step 11 removes: without it, the same tree)
        expected = {(step, when): (step == 5, 0, True) for step in steps for when in WHENS}
    assert rows == expected


async def test_sync_tools_use_the_blocking_view(world: World) -> None:
    def sync_tool(label: str, context: ToolContext) -> list[str]:
        """Write and list files from a worker thread."""
        files = _fs(context).blocking
        files.write_text("sync/a.txt", label)
        files.append("sync/a.txt", "!")
        files.write_bytes("sync/raw.bin", b"\x00")
        assert files.read_bytes("sync/raw.bin") == b"\x00"
        files.remove("sync/raw.bin")
        files.mkdir("sync/empty")
        files.copy("sync/a.txt", "sync/b.txt")
        assert files.read_text("sync/b.txt") == label + "!"
        assert files.exists("sync/empty")
        assert files.stat("sync/a.txt").size == len(label) + 1
        return files.glob("sync/**")

    async def from_the_loop(context: ToolContext) -> None:
        _fs(context).blocking.read("x")  # the event loop cannot wait for itself

    journal = await _turn(world)
    listed = await journal.call(tool(sync_tool, replay="safe"), {"label": "hi"})
    assert listed == ["sync/a.txt", "sync/b.txt", "sync/empty"]
    with pytest.raises(ToolError, match="blocking is for sync tools"):
        await journal.call(_tool(from_the_loop, name="loop"), {"label": "x"})
    await journal.finish("done")
    assert await Workspace(world).read_text("s", "sync/b.txt") == "hi!"


async def test_a_sync_tool_that_forgets_blocking_is_refused_not_silently_dropped(
    world: World,
) -> None:
    def forgetful(label: str, context: ToolContext) -> str:
        """Calls the async method from its worker thread: the coroutine would never run."""
        # why: the mistake under test: the coroutine is never awaited
        _fs(context).write("lost.txt", label)  # type: ignore[unused-coroutine]
        return "written"

    journal = await _turn(world)
    with pytest.raises(ToolError, match=r"context\.fs\.blocking\.write"):
        await journal.call(tool(forgetful, replay="safe"), {"label": "hi"})
    await journal.finish("done")
    with pytest.raises(PathNotFoundError):
        await Workspace(world).read("s", "lost.txt")


async def test_a_draft_replayed_in_the_same_process_starts_from_the_earlier_calls(
    world: World,
) -> None:
    draft = virtual(durable=False)

    async def add(context: ToolContext) -> str:
        files = draft.files(context)
        await files.append("log.txt", "line\n")
        return await files.read_text("log.txt")

    tools = [_tool(add, name="add")] * 3
    journal = await _turn(world)
    first = [await journal.call(item, {"label": str(i)}) for i, item in enumerate(tools)]
    assert first == ["line\n", "line\nline\n", "line\nline\nline\n"]
    # A journal opened again (the safe outcomes were never appended) runs the calls again:
    # each starts from the draft the calls before it left, not from the last run's end.
    again = await Journal.open(world, "s", "t")
    second = [await again.call(item, {"label": str(i)}) for i, item in enumerate(tools)]
    assert second == first


async def test_imports_refuse_archives_larger_than_the_limits(world: World, tmp_path: Path) -> None:
    small = Workspace(world, limits=WorkspaceLimits(max_total_bytes=1000, max_entries=2))
    big = tmp_path / "big.tar"
    big.write_bytes(b"\0" * 100_000)
    with pytest.raises(WorkspaceLimitError, match="max_total_bytes"):
        await small.import_tar("s", big)
    with pytest.raises(WorkspaceLimitError, match="max_total_bytes"):
        await small.import_tar("s", io.BytesIO(b"\0" * 100_000))
    three = _tar(*((_member(f"f{i}"), b"x") for i in range(3)))
    with pytest.raises(WorkspaceLimitError, match="max_entries"):
        await small.import_tar("s", three)
    with pytest.raises(InvalidArgumentError, match="not a tar"):
        await small.import_tar("s", b"not a tar at all")
    assert await small.tree("s") == FileTree()


async def test_a_repeated_tar_member_counts_once_against_the_limits(world: World) -> None:
    """A tar may hold a path twice (``tar rf`` appends a newer copy); the later member
    replaces the earlier, as extracting does, and only what is kept counts against the
    limits. The earlier copy was counted too: an archive whose kept files fit was refused
    with max_total_bytes (and, with another file between, max_entries)."""
    small = Workspace(world, limits=WorkspaceLimits(max_total_bytes=10, max_entries=2))
    first, other, later = _member("a.txt"), _member("b.txt"), _member("a.txt")
    first.mode = 0o600
    archive = _tar((first, b"old-a"), (other, b"b"), (later, b"new-a"))
    tree = await small.import_tar("s", archive)
    assert sorted(tree.files) == ["a.txt", "b.txt"]
    assert await small.read_text("s", "a.txt") == "new-a"
    assert (await small.stat("s", "a.txt")).mode == 0o644  # the later member's mode
    too_big = _tar((first, b"old-a"), (later, b"new-a-and-more"))
    with pytest.raises(WorkspaceLimitError, match="max_total_bytes"):
        await small.import_tar("s", too_big)


async def test_a_cold_snapshot_reads_every_file_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = Workspace(world)
    async with workspace.edit("s") as files:
        for index in range(40):
            await files.write(f"d{index % 4}/f{index}.txt", f"content {index % 10}")
    monkeypatch.setattr(fs_module, "_CACHE", fs_module._ContentCache())  # a fresh process
    snapshot = await workspace.snapshot("s")
    assert len(snapshot.files) == 40
    assert all(
        data == f"content {int(path.rsplit('f', 1)[1].removesuffix('.txt')) % 10}".encode()
        for path, data in snapshot.files.items()
    )
    assert snapshot.digest() == await workspace.digest("s")


async def test_unchanged_contents_are_never_stored_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a 200 KB file is stored once, later versions that keep, copy, rename or rewrite
    it with the same bytes store none of it again (counted at the stream)."""
    big = os.urandom(200_000)
    written: list[int] = []
    write = world.stream.write

    async def counting(stream_id: str, chunks: Any, *, expect_next: int | None = None) -> int:
        written.append(sum(len(chunk) for chunk in chunks))
        return await write(stream_id, chunks, expect_next=expect_next)

    monkeypatch.setattr(world.stream, "write", counting)

    async def first(context: ToolContext) -> None:
        await _fs(context).write("big.bin", big)

    async def later(context: ToolContext) -> None:
        fs = _fs(context)
        await fs.write("small.txt", "small")
        await fs.copy("big.bin", "copy.bin")
        await fs.rename("big.bin", "moved/big.bin")
        await fs.write("again.bin", big)  # the same bytes under a new name

    journal = await _turn(world)
    await journal.call(_tool(first, name="first"), {"label": "1"})
    assert sum(written) >= len(big)
    written.clear()
    await journal.call(_tool(later, name="later"), {"label": "2"})
    await journal.finish("done")
    assert sum(written) < 10_000, written  # the small file and the tree's delta at most
    workspace = Workspace(world)
    for path in ("copy.bin", "moved/big.bin", "again.bin"):
        assert await workspace.read("s", path) == big


async def test_a_tampered_tree_is_refused_not_followed(world: World, tmp_path: Path) -> None:
    """A tree document is data anyone with the World can write: paths in it are checked
    again on every read, so a tree naming ``../`` never reaches the host's files."""
    digest = (await Blobs(world.stream).put(b"evil")).digest
    bad = TreeDocument(files={"../evil.txt": (digest, 4, 0o644)}, dirs=[])
    await Documents(world).put("s", TREE_DOCUMENT, bad)

    async def read(context: ToolContext) -> list[str]:
        return await _fs(context).glob("**")

    workspace = Workspace(world)
    with pytest.raises(PathError, match="climbs above"):
        await workspace.tree("s")
    with pytest.raises(PathError):
        await workspace.export_dir("s", tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()
    journal = await _turn(world)
    with pytest.raises(ToolError, match="PathError"):
        await journal.call(_tool(read), {"label": "x"})

    class NotATree(BaseModel):
        items: list[str] = []

    await Documents(world).put("other", TREE_DOCUMENT, NotATree(items=["x"]))
    with pytest.raises(InvalidArgumentError, match="not a workspace tree"):
        await workspace.tree("other")


async def test_a_blob_missing_from_one_world_is_not_served_from_anothers(
    world: World, tmp_path: Path
) -> None:
    await Workspace(world).write("s", "a.txt", "only in the first World")
    assert await Workspace(world).read_text("s", "a.txt") == "only in the first World"
    tree = await Workspace(world).tree("s")
    async with open_world("local", url=str(tmp_path / "second"), namespace="fs") as second:
        await Documents(second).put("s", TREE_DOCUMENT, tree.document())  # no blob stored
        with pytest.raises(NotFoundError, match="missing or incomplete"):
            await Workspace(second).read("s", "a.txt")


async def test_a_transient_fault_while_storing_contents_is_retried(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contents are stored in a commit hook the journal retries on transient faults: a
    dropped connection while storing them costs a retry, not the call."""
    write = world.stream.write
    faults = [BackendUnavailableError("connection dropped (injected)")] * 2

    async def flaky(stream_id: str, chunks: Any, *, expect_next: int | None = None) -> int:
        if faults:
            raise faults.pop()
        return await write(stream_id, chunks, expect_next=expect_next)

    monkeypatch.setattr(world.stream, "write", flaky)

    async def work(context: ToolContext) -> None:
        fs = _fs(context)
        for index in range(3):
            await fs.write(f"f{index}.bin", os.urandom(1000))

    journal = await _turn(world)
    with anyio.fail_after(30):
        await journal.call(_tool(work, "never"), {"label": "x"})
    assert not faults
    snapshot = await Workspace(world).snapshot("s")
    assert sorted(snapshot.files) == ["f0.bin", "f1.bin", "f2.bin"]
