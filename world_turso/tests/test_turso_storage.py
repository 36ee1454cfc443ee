"""A namespace's tables, and a local database file that does not exist yet, are made by the
first write, never by opening or reading: `world info` with a mistyped file or namespace
leaves the disk as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

import anyio
import libsql
import pytest

from world_conformance.connect_errors import world_info
from world_core import NewEvent
from world_turso import TursoWorld, connect

pytestmark = pytest.mark.anyio

WAIT = 20.0


def _names(path: Path) -> list[str]:
    raw = libsql.connect(str(path), isolation_level=None)
    try:
        rows = raw.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    finally:
        raw.close()
    return [str(row[0]) for row in rows]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listing(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_cli_info_on_a_missing_file_makes_no_file(tmp_path: Path) -> None:
    result = world_info("turso", cwd=tmp_path, WORKFLOW_TURSO_URL=f"file:{tmp_path / 'w.db'}")
    assert result.returncode == 0, result.stderr
    assert _listing(tmp_path) == [], "world info made the database file"


async def test_cli_info_on_a_mistyped_namespace_leaves_the_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    async with await connect(url=f"file:{path}", namespace="real") as world:
        await world.log.append("l", [NewEvent(data=b"x")])
    names, digest = _names(path), _digest(path)
    result = world_info(
        "turso", "--namespace", "rael", cwd=tmp_path, WORKFLOW_TURSO_URL=f"file:{path}"
    )
    assert result.returncode == 0, result.stderr
    assert _names(path) == names, "world info made tables"
    assert _digest(path) == digest, "world info changed the file"
    assert _listing(tmp_path) == ["w.db"]


async def test_reads_make_nothing_and_the_first_write_makes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    async with await connect(url=f"file:{path}", namespace="ns") as world:
        assert await world.log.read("l") == []
        assert (await world.log.list_logs()).items == []
        assert await world.queue.claim("q", "w", lease=5.0, wait=0.1) == []
        assert await world.queue.dead_letters("q") == []
        assert (await world.stream.info("s")).next_index == 0
        await world.log.delete("l")
        await world.purge()
        assert _listing(tmp_path) == []
        await world.queue.enqueue("q", b"m")
    assert "w_ns_messages" in _names(path)


async def test_first_writes_to_a_missing_file_race_and_a_waiter_sees_them(tmp_path: Path) -> None:
    """Two Worlds make the file with their first appends at once; a third, opened before the
    file existed and watching, sees both appends."""
    url = f"file:{tmp_path / 'w.db'}"
    async with (
        await connect(url=url, namespace="ns") as watcher,
        await connect(url=url, namespace="ns") as one,
        await connect(url=url, namespace="ns") as two,
    ):
        seen: list[bytes] = []

        async def watch() -> None:
            async for event in watcher.log.watch("l"):
                seen.append(event.data)
                if len(seen) == 2:
                    return

        tails: list[int] = []

        async def append(world: TursoWorld, data: bytes) -> None:
            tails.append(await world.log.append("l", [NewEvent(data=data)]))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as group:
                group.start_soon(watch)
                await anyio.sleep(0.2)  # the watcher waits on a file that does not exist
                group.start_soon(append, one, b"one")
                group.start_soon(append, two, b"two")
        assert sorted(tails) == [1, 2]
        assert sorted(seen) == [b"one", b"two"]


async def test_an_append_without_a_status_leaves_the_status_index_alone(tmp_path: Path) -> None:
    """An append commits the event's page and the tail's, not the status index's too: the
    WAL grows by fewer than three pages an append (3.5 when the upsert assigned the status
    it kept, which rewrites its index entry)."""
    path = tmp_path / "w.db"
    appends = 40
    async with await connect(url=f"file:{path}", namespace="pages") as world:
        await world.log.append("l", [NewEvent(data=b"x" * 256)], status="open")
        wal = anyio.Path(f"{path}-wal")
        before = (await wal.stat()).st_size
        for _ in range(appends):
            await world.log.append("l", [NewEvent(data=b"x" * 256)])
        grown = (await wal.stat()).st_size - before
        info = await world.log.info("l")
    assert info is not None
    assert info.status == "open", "an append without a status keeps the log's status"
    frame = 4096 + 24  # libsql's default page size, and a WAL frame's header
    assert grown > 0, "the WAL was checkpointed and restarted: the count means nothing"
    assert grown / frame / appends < 3, f"{grown / frame / appends:.2f} WAL pages an append"
