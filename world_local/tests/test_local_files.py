"""What is particular to the local World: its folder, file names, torn tails, compaction."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from world_core import open_world
from world_core.errors import (
    ClosedError,
    ConfigurationError,
    ConflictError,
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidIdentifierError,
    WorldError,
)
from world_core.spi import MAX_ID_BYTES, NewEvent, OutboxMessage
from world_local import LocalWorld, _space, connect
from world_local import _outbox as outbox
from world_local._files import encode_frame
from world_local._log import LogFile
from world_local._queue import COMPACT_BYTES

pytestmark = pytest.mark.anyio

WAIT = 30.0
"""Bound of every wait: a healthy store answers in milliseconds; this only stops a hang."""


@pytest.fixture
def world(local_world: LocalWorld) -> LocalWorld:
    return local_world


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _only_file(folder: Path) -> Path:
    (path,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
    return path


async def test_url_forms_and_the_default_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await connect(url=f"file://{tmp_path}/a%20b") as world:
        assert world.settings()["WORKFLOW_LOCAL_DIR"] == str(tmp_path / "a b")
        assert not (tmp_path / "a b").exists(), "opening made the folder"
        await world.stream.close("s")
        assert (tmp_path / "a b" / "default" / "logs").is_dir()
    monkeypatch.setenv("WORKFLOW_LOCAL_DIR", str(tmp_path / "env"))
    async with open_world("local", namespace="ns1") as world:
        assert world.settings()["path"] == str(tmp_path / "env" / "ns1")
    monkeypatch.delenv("WORKFLOW_LOCAL_DIR")
    monkeypatch.chdir(tmp_path)
    async with await connect() as world:
        assert world.settings()["WORKFLOW_LOCAL_DIR"] == str(tmp_path / ".workflow-data")
    with pytest.raises(ConfigurationError, match="file:///absolute/path"):
        await connect(url="file://otherhost/x")


IDS = [
    "../../escape",
    "/etc/passwd",
    "..",
    ".",
    "a/b/../../c",
    "\\..\\x",
    "$HOME{}*:'\"; DROP TABLE logs",
    "ünïcødé 😀",
    "x" * MAX_ID_BYTES,
]


async def test_hostile_identifiers_stay_inside_the_namespace_folder(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with await connect(url=str(root), namespace="t") as world:
        for ident in IDS:
            await world.log.append(ident, [NewEvent(data=ident.encode(), key=ident)])
            await world.queue.enqueue(ident, ident.encode(), dedup_key=ident)
            await world.stream.write(ident, [ident.encode()])
        page = await world.log.list_logs(limit=1000)
        assert [info.log_id for info in page.items] == sorted(IDS)
        for ident in IDS:
            assert (await world.log.read(ident))[0].data == ident.encode()
            (lease,) = await world.queue.claim(ident, ident, lease=30)
            assert lease.payload == ident.encode()
    assert sorted(os.listdir(tmp_path)) == ["store"]
    assert os.listdir(root) == ["t"]
    for path in _files(root):
        assert path.parent.parent == root / "t"
        assert len(path.name) == 64  # sha-256 hex: nothing of the identifier reaches the path


async def test_list_logs_code_point_order_prefix_status_and_pages(world: LocalWorld) -> None:
    ids = ["b", "a", "ab", "a\u00ff", "a\U0001f600", "a\uffff", "A", "a/b"]
    for i, ident in enumerate(ids):
        await world.log.append(ident, [NewEvent(data=b"")], status="odd" if i % 2 else "even")
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await world.log.list_logs(prefix="a", cursor=cursor, limit=2)
        seen += [info.log_id for info in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted(i for i in ids if i.startswith("a"))
    odd = await world.log.list_logs(status="odd")
    assert [info.log_id for info in odd.items] == sorted(ids[1::2])


async def test_torn_log_tail_is_ignored_then_cut_off_by_the_next_writer(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with await connect(url=str(root), namespace="t") as world:
        await world.log.append("l", [NewEvent(data=b"one", key="k1")])
        await world.log.append("l", [NewEvent(data=b"two"), NewEvent(data=b"three")])
        path = _only_file(root / "t" / "logs")
        whole = path.stat().st_size
        frame = encode_frame({"keys": [None]}, [b"torn"])
        with path.open("ab") as raw:  # what a crash mid-write leaves: half a frame
            raw.write(frame[: len(frame) // 2])
        assert [e.data for e in await world.log.read("l")] == [b"one", b"two", b"three"]
    async with await connect(url=str(root), namespace="t") as world:  # a fresh process's view
        assert await world.log.tail("l") == 3
        assert await world.log.append("l", [NewEvent(data=b"four")]) == 4
        assert path.stat().st_size == whole + len(encode_frame({"keys": [None]}, [b"four"]))
        assert [e.data for e in await world.log.read("l")] == [b"one", b"two", b"three", b"four"]


async def test_a_whole_length_frame_with_a_bad_checksum_is_torn_too(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with await connect(url=str(root), namespace="t") as world:
        await world.stream.write("s", [b"a"])
        path = _only_file(root / "t" / "streams")
        frame = bytearray(encode_frame({"chunks": 1}, [b"b"]))
        frame[-1] ^= 0xFF
        with path.open("ab") as raw:
            raw.write(bytes(frame))
        assert (await world.stream.info("s")).next_index == 1
        assert await world.stream.write("s", [b"c"]) == 2
        chunks = []
        with anyio.fail_after(WAIT):
            async for chunk in world.stream.read("s"):
                chunks.append(chunk.data)
                if len(chunks) == 2:
                    break
        assert chunks == [b"a", b"c"]


async def test_torn_queue_tail_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with await connect(url=str(root), namespace="t") as world:
        kept = await world.queue.enqueue("q", b"kept")
        path = _only_file(root / "t" / "queues")
        frame = encode_frame({"ops": [{"op": "del", "id": kept}]})
        with path.open("ab") as raw:
            raw.write(frame[:-3])
        (lease,) = await world.queue.claim("q", "w", lease=30)
        assert lease.message_id == kept


async def test_a_file_replaced_behind_a_cached_view_is_read_afresh(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    async with (
        await connect(url=root, namespace="t") as one,
        await connect(url=root, namespace="t") as two,
    ):
        await one.log.append("l", [NewEvent(data=b"old-1"), NewEvent(data=b"old-2")])
        assert await two.log.tail("l") == 2  # two caches the file's state
        await one.log.delete("l")
        await one.log.append("l", [NewEvent(data=b"new", key="n")])
        assert [e.data for e in await two.log.read("l")] == [b"new"]
        assert await two.log.get("l", "n") is not None


async def test_queue_file_is_compacted_and_keeps_its_state(tmp_path: Path) -> None:
    root = tmp_path / "store"
    big = b"x" * (COMPACT_BYTES // 8)
    async with await connect(url=str(root), namespace="t") as world:
        ids = [await world.queue.enqueue("q", big + b"%d" % i) for i in range(12)]
        await world.queue.enqueue("q", b"dead", max_attempts=1)
        leases = await world.queue.claim("q", "w", lease=30, limit=13)
        dead = next(lease for lease in leases if lease.payload == b"dead")
        await world.queue.release(dead)
        for lease in leases:
            if lease.message_id not in (ids[0], dead.message_id):
                await world.queue.ack(lease)
        path = _only_file(root / "t" / "queues")
        assert path.stat().st_size < COMPACT_BYTES
    async with await connect(url=str(root), namespace="t") as world:
        (letter,) = await world.queue.dead_letters("q")
        assert letter.payload == b"dead"
        kept = next(lease for lease in leases if lease.message_id == ids[0])
        await world.queue.release(kept)
        (again,) = await world.queue.claim("q", "w", lease=30, limit=5)
        assert (again.message_id, again.attempt, again.payload) == (ids[0], 2, kept.payload)


async def test_purge_empties_only_its_namespace(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    async with (
        await connect(url=root, namespace="one") as one,
        await connect(url=root, namespace="two") as two,
    ):
        for world in (one, two):
            await world.log.append("l", [NewEvent(data=b"x")])
            await world.queue.enqueue("q", b"x")
            await world.stream.write("s", [b"x"])
        await one.purge()
        assert await one.log.info("l") is None
        assert await one.queue.claim("q", "w", lease=1) == []
        assert (await one.stream.info("s")).next_index == 0
        assert await two.log.tail("l") == 1
        assert len(await two.queue.claim("q", "w", lease=1)) == 1
        assert (await two.stream.info("s")).next_index == 1


def test_one_world_used_by_one_event_loop_after_another(tmp_path: Path) -> None:
    world = anyio.run(lambda: connect(url=str(tmp_path), namespace="t"))

    async def claim_nothing() -> None:
        assert await world.queue.claim("q", "w", lease=1, wait=0.01) == []

    async def claim_woken() -> list[bytes]:
        async with anyio.create_task_group() as group:
            group.start_soon(world.queue.enqueue, "q", b"x")
            leases = await world.queue.claim("q", "w", lease=1, wait=WAIT)
        return [lease.payload for lease in leases]

    anyio.run(claim_nothing)
    assert anyio.run(claim_woken) == [b"x"]
    anyio.run(world.aclose)


async def test_closed_world_refuses_calls(world: LocalWorld) -> None:
    await world.aclose()
    await world.aclose()
    with pytest.raises(ClosedError):
        await world.log.tail("l")
    with pytest.raises(ClosedError):
        await world.queue.enqueue("q", b"")


async def test_a_damaged_file_is_reported_not_overwritten(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with await connect(url=str(root), namespace="t") as world:
        await world.log.append("l", [NewEvent(data=b"x")])
        path = _only_file(root / "t" / "logs")
        path.write_bytes(b"not a record file")
        with pytest.raises(WorldError, match="damaged"):
            await world.log.append("l", [NewEvent(data=b"y")])
        assert path.read_bytes() == b"not a record file"


def _crashed_outbox_append(world: LocalWorld, log_id: str, *, committed: bool) -> None:
    """Do what an outbox append does up to its commit point (included or not), then stop as
    a killed process would: the intent stays, the messages are not delivered."""
    space = world._space
    file = space.file(LogFile, log_id)

    def work(fd: int | None) -> None:
        assert fd is not None
        pending = outbox.begin(space, file, [OutboxMessage(queue="q", payload=b"m")])
        ids = [message.id for _, message in pending]
        if committed:
            file.commit(fd, encode_frame({"keys": [None], "outbox": ids}, [b"e"]))

    file.writing(work)


@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "after-commit"])
@pytest.mark.parametrize("finisher", ["claim", "append", "delete"])
async def test_outbox_append_cut_short_is_finished_or_dropped_whole(
    tmp_path: Path, committed: bool, finisher: str
) -> None:
    root = str(tmp_path / "store")
    async with await connect(url=root, namespace="t") as world:
        await world.log.append("l", [NewEvent(data=b"before")])
        await anyio.to_thread.run_sync(
            lambda: _crashed_outbox_append(world, "l", committed=committed)
        )
        assert len(os.listdir(tmp_path / "store" / "t" / "outbox")) == 1
    async with await connect(url=root, namespace="t") as world:  # another process
        if finisher == "append":
            await world.log.append("l", [NewEvent(data=b"after")])
        elif finisher == "delete":
            await world.log.delete("l")
        leases = await world.queue.claim("q", "w", lease=30, limit=10)
        assert [lease.payload for lease in leases] == ([b"m"] if committed else [])
        if finisher != "delete":
            data = [e.data for e in await world.log.read("l")]
            assert (b"e" in data) is committed
        assert os.listdir(tmp_path / "store" / "t" / "outbox") == []


async def test_followers_return_big_items_across_several_reads(world: LocalWorld) -> None:
    big = [bytes([i]) * (5 * 1024 * 1024) for i in range(3)]
    for data in big:
        await world.log.append("l", [NewEvent(data=data)])
        await world.stream.write("s", [data])
    await world.stream.close("s")
    watched: list[bytes] = []
    with anyio.fail_after(WAIT):
        async for event in world.log.watch("l"):
            watched.append(event.data)
            if event.seq == 3:
                break
        assert [chunk.data async for chunk in world.stream.read("s")] == big
    assert watched == big


async def test_followers_refuse_bad_arguments_when_called(world: LocalWorld) -> None:
    with pytest.raises(InvalidIdentifierError):
        world.log.watch("bad\x00id")
    with pytest.raises(InvalidArgumentError):
        world.log.watch("l", after=-1)
    with pytest.raises(InvalidIdentifierError):
        world.stream.read("")
    with pytest.raises(InvalidArgumentError):
        world.stream.read("s", start=1.5)  # type: ignore[arg-type]  # refusal under test


async def test_connect_removes_temporaries_of_dead_writers_only(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with await connect(url=str(root), namespace="t") as world:
        await world.queue.enqueue("q", b"m")  # makes the folders
    dead = root / "t" / "queues" / ".tmp-dead"
    alive = root / "t" / "queues" / ".tmp-alive"
    dead.write_bytes(b"half a compaction")
    alive.write_bytes(b"being written")
    with alive.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as its writer holds it while writing
        async with await connect(url=str(root), namespace="t"):
            assert not dead.exists()
            assert alive.exists()


async def test_refused_first_append_leaves_no_visible_log(world: LocalWorld) -> None:
    # The file (header only) may now exist; the log must not.
    with pytest.raises(ConflictError):
        await world.log.append("new", [NewEvent(data=b"x")], expect_tail=3)
    assert await world.log.info("new") is None
    assert (await world.log.list_logs()).items == []
    with pytest.raises(ConflictError):
        await world.stream.write("new", [b"x"], expect_next=2)
    assert (await world.stream.info("new")).next_index == 0


def _small_cache(monkeypatch: pytest.MonkeyPatch, records: int, recent: int = 1) -> None:
    monkeypatch.setattr(_space, "CACHED_RECORDS", records)
    monkeypatch.setattr(_space, "CACHED_RECENT", recent)


def _held(world: LocalWorld) -> list[int]:
    """The records each cached file indexes, checking the namespace's running total."""
    space = world._space
    held = [file.held for file in space._files.values()]
    assert space._held == sum(held)
    return held


async def test_cached_records_are_bounded_and_a_dropped_log_is_read_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_cache(monkeypatch, 50)
    async with await connect(url=str(tmp_path / "store"), namespace="t") as world:
        for i in range(10):
            for n in range(4):
                batch = [NewEvent(data=f"{i}.{n}.{k}".encode(), key=f"k{n}.{k}") for k in range(5)]
                await world.log.append(f"l{i}", batch)
                assert sum(_held(world)) <= 50
        assert ("logs", "l0") not in world._space._files
        events = await world.log.read("l0")
        assert [(e.seq, e.data, e.key) for e in events] == [
            (n * 5 + k + 1, f"0.{n}.{k}".encode(), f"k{n}.{k}") for n in range(4) for k in range(5)
        ]
        await world.log.append("l9", [NewEvent(data=b"x")] * 40)  # drops l0 again
        assert ("logs", "l0") not in world._space._files
        found = await world.log.get("l0", "k2.3")
        assert found is not None
        assert (found.seq, found.data) == (14, b"0.2.3")
        with pytest.raises(DuplicateKeyError):
            await world.log.append("l0", [NewEvent(data=b"again", key="k0.0")])
        with pytest.raises(ConflictError):
            await world.log.append("l0", [NewEvent(data=b"late")], expect_tail=19)
        assert await world.log.append("l0", [NewEvent(data=b"next")], expect_tail=20) == 21
        assert await world.log.tail("l0") == 21
        # One file over the bound alone is kept (it is in use), and streams count too.
        await world.stream.write("s", [b"c"] * 60)
        assert _held(world) == [60]
        await world.stream.close("s")
        assert len([chunk async for chunk in world.stream.read("s", start=0)]) == 60


async def test_a_dropped_log_sees_what_another_process_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_cache(monkeypatch, 10)
    url = str(tmp_path / "store")
    async with (
        await connect(url=url, namespace="t") as mine,
        await connect(url=url, namespace="t") as other,
    ):
        assert await mine.log.append("x", [NewEvent(data=b"m")] * 8) == 8
        assert await other.log.append("x", [NewEvent(data=b"o", key="o")]) == 9
        await mine.log.append("y", [NewEvent(data=b"y")] * 8)  # drops x from mine's cache
        assert ("logs", "x") not in mine._space._files
        assert [e.data for e in await mine.log.read("x")] == [b"m"] * 8 + [b"o"]
        with pytest.raises(DuplicateKeyError):
            await mine.log.append("x", [NewEvent(data=b"m", key="o")])
        assert await mine.log.append("x", [NewEvent(data=b"m")], expect_tail=9) == 10
        assert await other.log.tail("x") == 10


async def test_the_files_used_last_stay_cached_over_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_cache(monkeypatch, 10, recent=_space.CACHED_RECENT)
    async with await connect(url=str(tmp_path / "store"), namespace="t") as world:
        await world.log.append("long", [NewEvent(data=b"e")] * 30)
        kept = world._space._files[("logs", "long")]
        for _ in range(3):
            await world.queue.enqueue("q", b"m")
            await world.log.append("long", [NewEvent(data=b"e")])
        assert world._space._files[("logs", "long")] is kept
        assert sorted(_held(world)) == [3, 33]
        for i in range(_space.CACHED_RECENT):
            await world.stream.write(f"s{i}", [b"c"])
        assert ("logs", "long") not in world._space._files
        assert sum(_held(world)) == _space.CACHED_RECENT


async def test_cache_bound_holds_under_concurrent_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_cache(monkeypatch, 30)
    async with await connect(url=str(tmp_path / "store"), namespace="t") as world:

        async def session(i: int) -> None:
            for n in range(10):
                await world.log.append(f"s{i}", [NewEvent(data=f"{i}.{n}".encode())] * 2)
                assert len(await world.log.read(f"s{(i + 1) % 8}")) % 2 == 0

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(session, i)
        assert sum(_held(world)) <= 30
        for i in range(8):
            assert [e.data for e in await world.log.read(f"s{i}")] == [
                f"{i}.{n}".encode() for n in range(10) for _ in range(2)
            ]


async def test_waits_and_listings_keep_nothing_per_object_once_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that waited once on many logs, streams and queues (a client waiting for many
    sessions' replies) and listed many logs holds no wake-up and a bounded name cache."""
    monkeypatch.setattr(_space, "CACHED_NAMES", 5)
    url = str(tmp_path / "store")
    async with (
        await connect(url=url, namespace="t") as mine,
        await connect(url=url, namespace="t") as other,
    ):
        for i in range(20):
            await other.log.append(f"l{i}", [NewEvent(data=b"x")])
        assert len((await mine.log.list_logs()).items) == 20
        assert len(mine._space._names) == 5
        for i in range(12):
            with anyio.move_on_after(0.02):  # the other process writes nothing more
                async for _ in mine.log.watch(f"l{i}", after=1):
                    pass
            with anyio.move_on_after(0.02):
                async for _ in mine.stream.read(f"s{i}", start=0):
                    pass
            assert await mine.queue.claim(f"q{i}", "w", lease=30, limit=1, wait=0.02) == []
        # A waiter still waiting holds its wake-up, which a write of this process sets.
        async with anyio.create_task_group() as tasks:

            async def wait_for_one() -> None:
                async for event in mine.log.watch("l0", after=1):
                    assert event.data == b"y"
                    return

            tasks.start_soon(wait_for_one)
            await anyio.wait_all_tasks_blocked()
            assert list(mine._space._events) == [("logs", "l0")]
            with anyio.fail_after(10):
                await mine.log.append("l0", [NewEvent(data=b"y")])
        assert mine._space._events == {}
        assert other._space._events == {}


async def test_a_read_after_a_delete_and_a_new_log_sees_the_new_log_despite_another_link(
    tmp_path: Path,
) -> None:
    """A log file with a second name (an operator's hard link, or the temporary name of a
    creation killed before removing it) stays linked when the log is deleted: a process that
    held it open reads the new log at that path, not the old file."""
    url = str(tmp_path / "store")
    async with (
        await connect(url=url, namespace="t") as mine,
        await connect(url=url, namespace="t") as other,
    ):
        await other.log.append("l", [NewEvent(data=b"old")])
        assert [e.data for e in await mine.log.read("l")] == [b"old"]  # mine keeps it open
        os.link(_only_file(tmp_path / "store" / "t" / "logs"), tmp_path / "second-name")
        await other.log.delete("l")
        assert await mine.log.info("l") is None
        await other.log.append("l", [NewEvent(data=b"new")] * 2)
        assert [e.data for e in await mine.log.read("l")] == [b"new"] * 2
        assert await mine.log.tail("l") == 2
