"""The folders of a namespace are made by its first write, never by opening or reading: `world
info` with a mistyped folder or namespace leaves the disk as it was."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from world_conformance.connect_errors import world_info
from world_core import NewEvent
from world_local import connect

pytestmark = pytest.mark.anyio


def _tree(root: Path) -> list[str] | None:
    """Everything under ``root`` (None when it does not exist)."""
    if not root.exists():
        return None
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_cli_info_makes_no_folder(tmp_path: Path) -> None:
    result = world_info("local", cwd=tmp_path, WORKFLOW_LOCAL_DIR=str(tmp_path / "data"))
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "data").exists(), "world info made WORKFLOW_LOCAL_DIR"
    result = world_info("local", "--namespace", "typo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _tree(tmp_path) == [], "world info made .workflow-data in the current folder"


async def test_cli_info_on_a_mistyped_namespace_leaves_the_folder_as_it_was(
    tmp_path: Path,
) -> None:
    async with await connect(url=str(tmp_path / "data"), namespace="real") as world:
        await world.log.append("l", [NewEvent(data=b"x")])
    before = _tree(tmp_path)
    result = world_info(
        "local", "--namespace", "rael", cwd=tmp_path, WORKFLOW_LOCAL_DIR=str(tmp_path / "data")
    )
    assert result.returncode == 0, result.stderr
    assert _tree(tmp_path) == before


async def test_reads_make_nothing_and_the_first_write_makes_the_folders(tmp_path: Path) -> None:
    root = tmp_path / "data"
    async with await connect(url=str(root), namespace="ns") as world:
        assert await world.log.read("l") == []
        assert (await world.log.list_logs()).items == []
        assert await world.queue.claim("q", "w", lease=5.0, wait=0.1) == []
        assert await world.queue.dead_letters("q") == []
        assert (await world.stream.info("s")).next_index == 0
        await world.log.delete("l")
        await world.purge()
        assert not root.exists()
        with anyio.fail_after(20):
            await world.stream.write("s", [b"c"])
        assert _tree(root) == [
            "ns",
            "ns/logs",
            "ns/outbox",
            "ns/queues",
            "ns/streams",
            f"ns/streams/{_only(root / 'ns' / 'streams')}",
        ]


def _only(folder: Path) -> str:
    (name,) = [path.name for path in folder.iterdir()]
    return name
