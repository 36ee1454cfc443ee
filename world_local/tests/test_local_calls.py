"""What the local World's calls cost, counted (system calls, trips to a worker thread), never
timed: files kept open, one look per idle poll, the fsync of a queue write after its locks,
the hand-off to worker threads keeping anyio's cancellation semantics, and when an append
runs on the event loop's thread instead."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from world_core.spi import NewEvent, OutboxMessage
from world_local import LocalWorld, _space, _threads, connect
from world_local._queue import QueueFile
from world_local._space import Space

pytestmark = pytest.mark.anyio

WAIT = 30.0
"""Bound of every wait: a healthy store answers in milliseconds; this only stops a hang."""


@pytest.fixture
def world(local_world: LocalWorld) -> LocalWorld:
    return local_world


@contextmanager
def _counting(monkeypatch: pytest.MonkeyPatch, *names: str) -> Iterator[list[str]]:
    """Record every call of ``os.<name>`` (or ``fcntl.flock``) made meanwhile, in order, as
    ``name`` or ``flock:<operation>``; the module functions are swapped, so every caller is
    seen (worker threads included)."""
    calls: list[str] = []
    with monkeypatch.context() as patch:
        for name in names:
            module: Any = fcntl if name == "flock" else os
            real: Callable[..., Any] = getattr(module, name)

            def wrapper(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                if _name == "flock":
                    calls.append(f"flock:{'UN' if args[1] == fcntl.LOCK_UN else 'EX'}")
                else:
                    calls.append(_name)
                return _real(*args, **kw)

            patch.setattr(module, name, wrapper)
        yield calls


async def test_an_append_to_a_file_held_open_opens_and_reads_nothing(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.log.append("l", [NewEvent(data=b"first")])  # opens the file, reads its header
    with _counting(monkeypatch, "open", "stat", "pread", "fstat", "fsync", "flock") as calls:
        for n in range(5):
            assert await world.log.append("l", [NewEvent(data=b"x")]) == n + 2
    # Per append: lock, one stat (does the path still name it? then its size says whether
    # another process appended), fsync, unlock. No fstat (the open file's identity was taken
    # when it was opened), no open (nor the outbox intent's: nothing this process did not
    # write changed), no header or tail read.
    assert calls == ["flock:EX", "stat", "fsync", "flock:UN"] * 5


async def test_an_outbox_append_reads_back_nothing_it_wrote(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append wrote the intent and committed the frame holding the lock: it delivers the
    messages it holds. Before, it opened and read back its own intent, and the frame at its
    offset, as for an intent a crash left. On disk the same steps, in the same order."""
    message = OutboxMessage(queue="q", payload=b"m")
    await world.log.append("l", [NewEvent(data=b"first")], messages=[message])
    with _counting(monkeypatch, "open", "pread", "rename", "fsync", "unlink") as calls:
        for n in range(3):
            assert await world.log.append("l", [NewEvent(data=b"x")], messages=[message]) == n + 2
    intent = ["open", "fsync", "rename", "unlink", "open", "fsync"]  # temp, fsynced, renamed
    commit = ["fsync"]
    deliver = ["fsync", "unlink", "open", "fsync"]  # the queue's late fsync, the intent removed
    assert calls == (intent + commit + deliver) * 3
    assert [e.data for e in await world.log.read("l")] == [b"first", b"x", b"x", b"x"]
    leases = await world.queue.claim("q", "w", lease=30, limit=10)
    assert [lease.payload for lease in leases] == [b"m"] * 4


async def test_an_enqueue_looks_its_dedup_key_up_without_going_through_the_queue(
    tmp_path: Path,
) -> None:
    """A dedup key is looked up in an index of the keys. Before, every enqueue and every
    outbox delivery (a submit's) went through all the queue's messages, holding its lock.
    What a key answers is unchanged: the last message enqueued with it that is not dead."""
    url = str(tmp_path / "store")
    looked: list[str] = []

    class Messages(dict[str, Any]):
        def values(self) -> Any:
            looked.append("values")
            return super().values()

    async with await connect(url=url, namespace="t") as world:
        for n in range(50):
            await world.queue.enqueue("q", b"other", dedup_key=f"other{n}")
        first = await world.queue.enqueue("q", b"m", dedup_key="k", max_attempts=1)
        file = world._space.file(QueueFile, "q")
        file.messages = Messages(file.messages)
        assert await world.queue.enqueue("q", b"m", dedup_key="k") == first
        assert await world.queue.enqueue("q", b"m", dedup_key="new") != first
        assert looked == []
        while leases := await world.queue.claim("q", "w", lease=30, limit=100):
            for lease in leases:
                if lease.message_id == first:
                    await world.queue.release(lease)  # its last delivery: dead-lettered
                else:
                    await world.queue.ack(lease)
        second = await world.queue.enqueue("q", b"m", dedup_key="k")
        assert second != first  # a dead message's key is free
        await world.queue.requeue("q", first)
        assert await world.queue.enqueue("q", b"m", dedup_key="k") == second  # the last one
        (lease,) = await world.queue.claim("q", "w", lease=30)
        assert lease.message_id == second
        await world.queue.ack(lease)
        assert await world.queue.enqueue("q", b"m", dedup_key="k") == first
    async with await connect(url=url, namespace="t") as again:  # folded anew from the file
        assert await again.queue.enqueue("q", b"m", dedup_key="k") == first


async def test_a_change_by_another_process_is_read_then_nothing_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "store")
    async with (
        await connect(url=url, namespace="t") as mine,
        await connect(url=url, namespace="t") as other,  # its own open files: as a process
    ):
        await mine.log.append("l", [NewEvent(data=b"m")])
        await other.log.append("l", [NewEvent(data=b"o")])
        with _counting(monkeypatch, "open", "pread") as calls:
            assert await mine.log.tail("l") == 2
        assert "open" not in calls
        assert calls  # the header and the new frame, read
        with _counting(monkeypatch, "open", "pread") as calls:
            assert await mine.log.tail("l") == 2
        assert calls == []


async def test_a_file_deleted_and_made_again_elsewhere_is_not_written_through_the_old_one(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "store")
    async with (
        await connect(url=url, namespace="t") as mine,
        await connect(url=url, namespace="t") as other,
    ):
        await mine.log.append("l", [NewEvent(data=b"old")] * 3)  # mine keeps it open
        await other.log.delete("l")
        await other.log.append("l", [NewEvent(data=b"new")])
        assert await mine.log.append("l", [NewEvent(data=b"mine")]) == 2
        assert [e.data for e in await other.log.read("l")] == [b"new", b"mine"]


async def test_a_file_deleted_while_hard_linked_elsewhere_is_not_written_through(
    tmp_path: Path,
) -> None:
    """A hard link made elsewhere (``cp -al`` of a live store) keeps a deleted file's link
    count above 0: an append through the old descriptor would be acknowledged and lost."""
    url = str(tmp_path / "store")
    async with (
        await connect(url=url, namespace="t") as mine,
        await connect(url=url, namespace="t") as other,
    ):
        await mine.log.append("l", [NewEvent(data=b"old")])  # mine keeps it open
        backup = tmp_path / "backup"
        backup.mkdir()
        for path in (tmp_path / "store" / "t" / "logs").iterdir():
            os.link(path, backup / path.name)
        await other.log.delete("l")
        await other.log.append("l", [NewEvent(data=b"new")])
        assert await mine.log.append("l", [NewEvent(data=b"mine")]) == 2
        assert [e.data for e in await other.log.read("l")] == [b"new", b"mine"]


async def test_open_files_are_bounded(world: LocalWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_space, "OPEN_FILES", 4)
    for n in range(12):
        await world.log.append(f"l{n}", [NewEvent(data=b"x")])
    store = str(world._space.folder)
    held = [
        target
        for fd in os.listdir("/proc/self/fd")
        if (target := _link(f"/proc/self/fd/{fd}")).startswith(store)
    ]
    assert len(held) == 4
    await world.aclose()
    assert not [
        fd for fd in os.listdir("/proc/self/fd") if _link(f"/proc/self/fd/{fd}").startswith(store)
    ]


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since listed
        return ""


async def test_a_queue_write_is_fsynced_after_its_locks_are_released(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.queue.enqueue("q", b"first")
    with _counting(monkeypatch, "fsync", "flock") as calls:
        await world.queue.enqueue("q", b"m")
    assert calls == ["flock:EX", "flock:UN", "fsync"]  # and enqueue returned after the fsync


def _count_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    trips = [0]
    real = Space.run

    async def run(self: Space, fn: Callable[[], Any], **kw: Any) -> Any:
        trips[0] += 1
        return await real(self, fn, **kw)

    monkeypatch.setattr(Space, "run", run)
    return trips


async def test_idle_claims_of_one_process_share_one_poll(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.queue.enqueue("q", b"m")
    (lease,) = await world.queue.claim("q", "w", lease=30)
    await world.queue.ack(lease)
    trips = _count_trips(monkeypatch)
    claimers, wait = 20, 0.5
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            for _ in range(claimers):
                tg.start_soon(lambda: world.queue.claim("q", "w", lease=30, wait=wait))
    # Each claim looks once at its start; then one of them polls (a look after 5 ms, 10,
    # 20, 40, 80, then every 100: at most 9 in 0.5 s) while the others wait their turn; one
    # handed the turn near its deadline polls only for what is left of it (a loaded machine
    # spreads the starts, so a few looks each at most). Polling on their own, the 20 would
    # make about 9 looks each, 360 trips at two a look.
    assert trips[0] <= 4 * claimers


async def test_an_idle_look_reads_nothing(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.queue.enqueue("q", b"m")
    (lease,) = await world.queue.claim("q", "w", lease=30)
    with _counting(monkeypatch, "open", "pread", "flock") as calls:
        assert await world.queue.claim("q", "w", lease=30) == []
    assert calls == []  # an fstat of the open file and a listing of outbox/: no lock, no read
    await world.queue.ack(lease)


async def test_the_hand_off_starts_nothing_in_a_cancelled_scope() -> None:
    ran: list[bool] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        await _threads.run_sync(lambda: ran.append(True))
    assert ran == []


async def test_the_hand_off_waits_for_started_work_when_cancelled() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def work() -> None:
        started.set()
        release.wait(WAIT)
        finished.append("work done")

    with anyio.fail_after(WAIT):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_once_started() -> None:
                    await anyio.to_thread.run_sync(started.wait, WAIT)
                    scope.cancel()
                    release.set()

                tg.start_soon(cancel_once_started)
                await _threads.run_sync(work)
                finished.append("returned")  # after the work, as anyio.to_thread's
                await anyio.lowlevel.checkpoint()  # where the cancellation takes effect
                finished.append("not reached")
    assert finished == ["work done", "returned"]
    assert scope.cancelled_caught


async def test_the_hand_off_raises_what_the_work_raised() -> None:
    def work() -> None:
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError, match="gone"):
        await _threads.run_sync(work)


@pytest.fixture
def thread_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls handed to a worker thread; inline work is never slow meanwhile (on a
    loaded machine an fsync may take long enough to send the next calls to threads)."""
    monkeypatch.setattr(_threads, "INLINE_SLOW", float("inf"))
    monkeypatch.setattr(_threads._policy, "slow_until", 0.0)
    trips = [0]
    real = _threads._pool.submit

    def submit(job: Any) -> None:
        trips[0] += 1
        real(job)

    monkeypatch.setattr(_threads._pool, "submit", submit)
    return trips


async def test_an_append_to_a_file_held_open_runs_on_the_callers_thread(
    world: LocalWorld, thread_trips: list[int]
) -> None:
    await world.log.append("l", [NewEvent(data=b"first")])  # creates and opens it: a thread
    assert thread_trips == [1]
    for n in range(5):
        assert await world.log.append("l", [NewEvent(data=b"x")]) == n + 2
    assert thread_trips == [1]
    await world.queue.enqueue("q", b"m")  # only a log append runs inline
    await world.log.append(
        "l", [NewEvent(data=b"m")], messages=[OutboxMessage(queue="q", payload=b"m")]
    )
    assert thread_trips == [3]


async def test_an_inline_append_in_a_cancelled_scope_writes_nothing(
    world: LocalWorld, thread_trips: list[int]
) -> None:
    await world.log.append("l", [NewEvent(data=b"first")])  # opens the file: inline from now
    with anyio.CancelScope() as scope:
        scope.cancel()
        await world.log.append("l", [NewEvent(data=b"never")])
    assert scope.cancelled_caught
    assert thread_trips == [1]  # only the first append's: nothing went to a thread either
    assert await world.log.tail("l") == 1


async def test_inline_appends_give_other_tasks_their_turn(
    world: LocalWorld, thread_trips: list[int]
) -> None:
    await world.log.append("l", [NewEvent(data=b"first")])
    turns: list[int] = []

    async def other() -> None:
        while True:
            turns.append(await world.log.tail("l"))  # a thread trip each: the loop moves on
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            await anyio.lowlevel.checkpoint()
            for _ in range(5):
                await world.log.append("l", [NewEvent(data=b"x")])
            tg.cancel_scope.cancel()
    assert turns  # the other task ran while the appends went on


async def test_an_append_never_waits_for_a_lock_on_the_event_loop(
    world: LocalWorld, thread_trips: list[int]
) -> None:
    """Another process holding the file's lock (a stopped one, say) must not freeze the
    event loop: the append waits for it in a worker thread."""
    await world.log.append("l", [NewEvent(data=b"first")])
    (path,) = (world._space.folder / "logs").iterdir()
    other = os.open(path, os.O_RDWR)  # its own open file: excluded by flock as a process
    fcntl.flock(other, fcntl.LOCK_EX)
    done: list[int] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:

            async def append() -> None:
                done.append(await world.log.append("l", [NewEvent(data=b"x")]))

            tg.start_soon(append)
            while thread_trips[0] != 2:  # the loop runs meanwhile: here
                await anyio.lowlevel.checkpoint()
            assert done == []
            os.close(other)  # which releases the lock
    assert done == [2]


async def test_an_append_after_another_process_wrote_reads_its_frames_first(
    tmp_path: Path, thread_trips: list[int]
) -> None:
    url = str(tmp_path / "store")
    async with (
        await connect(url=url, namespace="t") as mine,
        await connect(url=url, namespace="t") as other,
    ):
        await mine.log.append("l", [NewEvent(data=b"m1")])
        await other.log.append("l", [NewEvent(data=b"o")])
        trips = thread_trips[0]
        assert await mine.log.append("l", [NewEvent(data=b"m2")]) == 3
        assert thread_trips[0] == trips + 1  # not inline: there was a frame to read
        assert [e.data for e in await other.log.read("l")] == [b"m1", b"o", b"m2"]


async def test_after_slow_inline_work_appends_go_to_threads(
    world: LocalWorld, thread_trips: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.log.append("l", [NewEvent(data=b"first")])
    monkeypatch.setattr(_threads, "INLINE_SLOW", -1.0)  # every inline run is slow
    monkeypatch.setattr(_threads, "INLINE_PAUSE", 3600.0)
    await world.log.append("l", [NewEvent(data=b"inline, slow")])
    assert thread_trips == [1]
    await world.log.append("l", [NewEvent(data=b"in a thread")])
    assert thread_trips == [2]


async def test_appends_go_to_threads_while_other_file_work_runs_in_one(
    world: LocalWorld, thread_trips: list[int]
) -> None:
    await world.log.append("l", [NewEvent(data=b"first")])
    release = threading.Event()
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_threads.run_sync, partial(release.wait, WAIT))
            while thread_trips[0] != 2:
                await anyio.lowlevel.checkpoint()
            await world.log.append("l", [NewEvent(data=b"x")])
            assert thread_trips == [3]
            release.set()
    await world.log.append("l", [NewEvent(data=b"y")])
    assert thread_trips == [3]


def test_inline_pauses_double_while_inline_work_stays_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_threads, "INLINE_SLOW", -1.0)  # every run is slow
    policy = _threads._Policy()
    policy.timed(time.monotonic())
    assert policy.pause == _threads.INLINE_PAUSE
    for n in (2, 4, 8):
        policy.timed(time.monotonic())  # slow again at once: within one pause of the last
        assert policy.pause == n * _threads.INLINE_PAUSE
    for _ in range(10):
        policy.timed(time.monotonic())
    assert policy.pause == _threads.INLINE_PAUSE_MAX
    policy.slow_until = time.monotonic() - 2 * _threads.INLINE_PAUSE_MAX  # long fast since
    policy.timed(time.monotonic())
    assert policy.pause == _threads.INLINE_PAUSE
