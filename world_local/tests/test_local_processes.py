"""Real processes sharing one folder: SIGKILL at random instants, concurrent appenders and
claimers, leases expiring across processes, cross-process wake-ups.

The tests are synchronous (the children are plain subprocesses) and check the store through
the public API with ``anyio.run``. Every wait is bounded by WAIT; none asserts a duration.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from world_core.spi import Chunk, Event, NewEvent
from world_local import LocalWorld, connect
from world_local._queue import COMPACT_BYTES

CHILD = Path(__file__).with_name("child.py")
WAIT = 60.0
NS = "procs"
ROUNDS = 6
T = TypeVar("T")


def _run(fn: Callable[[LocalWorld], Awaitable[T]], folder: Path) -> T:
    async def main() -> T:
        with anyio.fail_after(WAIT):
            async with await connect(url=str(folder), namespace=NS) as world:
                return await fn(world)

    return anyio.run(main)


class Child:
    """A child process; its stderr goes to ``<report>.err`` (no pipe to leak or fill)."""

    def __init__(self, mode: str, folder: Path, target: str, report: Path, arg: str) -> None:
        self.errors = report.with_suffix(".err")
        args = [sys.executable, str(CHILD), mode, str(folder), NS, target, str(report), arg]
        with self.errors.open("wb") as err:
            self.process = subprocess.Popen(args, stderr=err)

    def failure(self) -> str | None:
        """Why the child failed, if it exited with an error."""
        code = self.process.poll()
        if code is None or code == 0:
            return None
        return f"child exited with {code}: {self.errors.read_text(errors='replace')}"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(WAIT)

    def finish(self) -> None:
        """Wait for a normal exit and fail the test on any other."""
        self.process.wait(WAIT)
        assert self.process.returncode == 0, self.failure()


@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    yield
    for child in _children:
        if child.process.poll() is None:
            child.kill()
    _children.clear()


_children: list[Child] = []


def _spawn(mode: str, folder: Path, target: str, report: Path, arg: str = "") -> Child:
    child = Child(mode, folder, target, report, arg)
    _children.append(child)
    return child


def _lines(report: Path) -> list[str]:
    try:
        text = report.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return text.splitlines()[: text.count("\n")]  # a line still being written is not yet one


def _wait_until(ready: Callable[[], bool], what: str, child: Child | None = None) -> None:
    give_up = time.monotonic() + WAIT
    while not ready():
        if child is not None and child.process.poll() is not None:
            pytest.fail(f"{child.failure() or 'child exited'} before {what}")
        if time.monotonic() > give_up:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def _kill_midway(child: Child, report: Path, lines: int = 2) -> None:
    """Let the child report ``lines`` calls, then SIGKILL it at a random instant."""
    _wait_until(lambda: len(_lines(report)) >= lines, f"{lines} calls of the child", child)
    time.sleep(random.uniform(0, 0.02))
    child.kill()


def _outlive_leases(killed_at: float, lease: float) -> None:
    """Deadlines are absolute store-clock times: once this returns, every lease a child killed
    at ``killed_at`` took has expired, whatever the scheduling."""
    _wait_until(lambda: time.time() > killed_at + lease, "the killed child's leases to expire")


def _check_batches(items: Iterable[tuple[int, str]], acked: dict[str, set[int]]) -> None:
    """Positions dense from the first; whole batches of 3 labelled ``<tag><n>/<i>``; each
    writer's batches in order with no gap; every acknowledged batch present; at most one batch
    per writer beyond the last acknowledged (the call in flight when it was killed)."""
    items = list(items)
    assert [position for position, _ in items] == list(range(items[0][0], items[0][0] + len(items)))
    assert len(items) % 3 == 0, "a batch was torn"
    found: dict[str, list[int]] = {}
    for start in range(0, len(items), 3):
        labels = [label for _, label in items[start : start + 3]]
        batch = labels[0].rsplit("/", 1)[0]
        assert labels == [f"{batch}/{i}" for i in range(3)], f"torn batch {labels}"
        tag, n = batch.split("-")
        found.setdefault(tag, []).append(int(n))
    for tag, numbers in acked.items():
        stored = found.get(tag, [])
        assert stored == list(range(len(stored))), f"writer {tag} has a gap or a duplicate"
        assert numbers <= set(stored), f"acknowledged batches of {tag} are missing"
        assert len(stored) <= max(numbers, default=-1) + 2


def _acked(report: Path) -> set[int]:
    return {int(line) for line in _lines(report)}


def test_appender_killed_at_random_instants_leaves_whole_batches(tmp_path: Path) -> None:
    acked: dict[str, set[int]] = {}
    for round_ in range(ROUNDS):
        tag, report = f"r{round_}", tmp_path / f"append-{round_}.txt"
        _kill_midway(_spawn("append", tmp_path, "log/1", report, f"{tag}-"), report)
        acked[tag] = _acked(report)

        async def events(world: LocalWorld) -> list[Event]:
            return await world.log.read("log/1")

        stored = _run(events, tmp_path)
        _check_batches(((e.seq, e.data.decode()) for e in stored), acked)
        assert [e.key for e in stored] == [e.data.decode() for e in stored]
        assert stored[0].seq == 1


def test_outbox_appender_killed_at_random_instants_keeps_events_and_messages_together(
    tmp_path: Path,
) -> None:
    acked: dict[str, set[int]] = {}
    delivered: list[str] = []

    async def events_and_messages(world: LocalWorld) -> tuple[list[Event], list[str]]:
        events = await world.log.read("log")
        payloads: list[str] = []
        # A claim first finishes any outbox append the kill interrupted.
        while leases := await world.queue.claim("log.q", "check", lease=60, limit=100):
            for held in leases:
                payloads.append(held.payload.decode())
                await world.queue.ack(held)
        return events, payloads

    for round_ in range(ROUNDS):
        tag, report = f"r{round_}", tmp_path / f"outbox-{round_}.txt"
        _kill_midway(_spawn("outbox", tmp_path, "log", report, f"{tag}-"), report)
        acked[tag] = _acked(report)
        stored, payloads = _run(events_and_messages, tmp_path)
        delivered += payloads
        _check_batches(((e.seq, e.data.decode()) for e in stored), acked)
        batches = [e.data.decode().rsplit("/", 1)[0] for e in stored[::3]]
        assert sorted(delivered) == sorted(batches), "an event without its message or back"
    assert not os.listdir(tmp_path / NS / "outbox")


def test_stream_writer_killed_at_random_instants_leaves_whole_batches(tmp_path: Path) -> None:
    acked: dict[str, set[int]] = {}
    for round_ in range(ROUNDS):
        tag, report = f"r{round_}", tmp_path / f"stream-{round_}.txt"
        _kill_midway(_spawn("stream", tmp_path, "out", report, f"{tag}-"), report)
        acked[tag] = _acked(report)

        async def chunks(world: LocalWorld) -> list[Chunk]:
            info = await world.stream.info("out")
            await world.stream.close("reader-end")  # unrelated stream: proves writes still work
            found: list[Chunk] = []
            async for chunk in world.stream.read("out"):
                found.append(chunk)
                if chunk.index + 1 == info.next_index:
                    break
            return found

        stored = _run(chunks, tmp_path)
        _check_batches(((c.index, c.data.decode()) for c in stored), acked)
        assert stored[0].index == 0


def _claim_round(folder: Path, queue: str, report: Path, lease: float) -> None:
    async def fill(world: LocalWorld) -> set[str]:
        return {await world.queue.enqueue(queue, b"%d" % i) for i in range(40)}

    async def drain(world: LocalWorld) -> list[str]:
        ids: list[str] = []
        while leases := await world.queue.claim(queue, "parent", lease=60, limit=50):
            ids += [held.message_id for held in leases]
        return ids

    everything = _run(fill, folder)
    _kill_midway(_spawn("claim", folder, queue, report, str(lease)), report)
    _outlive_leases(time.time(), lease)
    claimed = {line.split()[1] for line in _lines(report) if line.startswith("claimed")}
    acked = {line.split()[1] for line in _lines(report) if line.startswith("acked")}
    left = _run(drain, folder)
    assert len(left) == len(set(left)), "a message was delivered twice at once"
    assert not set(left) & acked, "an acknowledged ack was undone"
    assert everything - claimed <= set(left), "a message nobody took was lost"
    assert len((claimed - acked) - set(left)) <= 1, "more than the ack in flight vanished"
    assert set(left) <= everything


def test_claimer_killed_at_random_instants_loses_no_message(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        _claim_round(tmp_path, f"jobs-{round_}", tmp_path / f"claim-{round_}.txt", lease=0.5)


def test_concurrent_appenders_in_several_processes_stay_dense(tmp_path: Path) -> None:
    reports = [tmp_path / f"writer-{i}.txt" for i in range(3)]
    children = [_spawn("append", tmp_path, "shared", r, f"w{i}-") for i, r in enumerate(reports)]
    for child, report in zip(children, reports, strict=True):
        # The default argument binds this iteration's report; mypy cannot type such a lambda.
        _wait_until(lambda r=report: len(_lines(r)) >= 15, "15 batches from each writer", child)  # type: ignore[misc]
    for child in children:
        child.kill()

    async def events(world: LocalWorld) -> list[Event]:
        return await world.log.read("shared")

    stored = _run(events, tmp_path)
    acked = {f"w{i}": _acked(r) for i, r in enumerate(reports)}
    _check_batches(((e.seq, e.data.decode()) for e in stored), acked)
    assert stored[0].seq == 1


def test_two_processes_claiming_one_queue_never_share_a_message(tmp_path: Path) -> None:
    async def fill(world: LocalWorld) -> set[str]:
        return {await world.queue.enqueue("work", b"%d" % i) for i in range(150)}

    everything = _run(fill, tmp_path)
    reports = [tmp_path / f"drain-{i}.txt" for i in range(2)]
    children = [_spawn("drain", tmp_path, "work", report) for report in reports]
    for child in children:
        child.finish()
    taken = [[line.split()[1] for line in _lines(report)] for report in reports]
    assert sorted(taken[0] + taken[1]) == sorted(everything)


def test_processes_enqueuing_and_acking_while_the_queue_is_compacted(tmp_path: Path) -> None:
    reports = [tmp_path / f"churn-{i}.txt" for i in range(3)]
    children = [_spawn("churn", tmp_path, "q", report, "60:60") for report in reports]
    for child in children:
        child.finish()
    drained = tmp_path / "drain.txt"
    _spawn("drain", tmp_path, "q", drained).finish()
    lines = [line.split() for report in [*reports, drained] for line in _lines(report)]
    enqueued = [ident for kind, ident in lines if kind == "enqueued"]
    acked = [ident for kind, ident in lines if kind == "acked"]
    assert len(enqueued) == 180
    assert sorted(acked) == sorted(enqueued), "a message was lost or delivered twice"
    (queue_file,) = (tmp_path / NS / "queues").iterdir()
    assert queue_file.stat().st_size < 2 * COMPACT_BYTES, "18 MB went in: it was compacted"


def test_process_killed_while_the_queue_is_compacted_loses_nothing(tmp_path: Path) -> None:
    lease = 0.5
    for round_ in range(ROUNDS):
        report = tmp_path / f"churn-{round_}.txt"
        child = _spawn("churn", tmp_path, "q", report, f"1000:{lease}")
        _kill_midway(child, report, lines=random.randrange(20, 60))  # compacting by then
        _outlive_leases(time.time(), lease)
        drained = tmp_path / f"drain-{round_}.txt"
        _spawn("drain", tmp_path, "q", drained).finish()  # connecting sweeps temporaries
        lines = [line.split() for line in _lines(report)]
        enqueued = {ident for kind, ident in lines if kind == "enqueued"}
        acked = [ident for kind, ident in lines if kind == "acked"]
        left = [line.split()[1] for line in _lines(drained)]
        assert len(set(acked + left)) == len(acked + left), "a message was delivered twice"
        assert len(enqueued - set(acked + left)) <= 1, "more than the ack in flight vanished"
        assert not [n for n in os.listdir(tmp_path / NS / "queues") if n.startswith(".")]


def test_lease_taken_in_one_process_expires_and_is_redelivered_in_another(
    tmp_path: Path,
) -> None:
    report = tmp_path / "hold.txt"

    async def enqueue(world: LocalWorld) -> str:
        return await world.queue.enqueue("q", b"job")

    message_id = _run(enqueue, tmp_path)
    child = _spawn("hold", tmp_path, "q", report, "0.3")
    child.finish()  # claimed, then exited without acking
    assert _lines(report) == [f"claimed {message_id} 1"]

    async def reclaim(world: LocalWorld) -> tuple[str, int]:
        (held,) = await world.queue.claim("q", "parent", lease=0.3, wait=WAIT)
        return held.message_id, held.attempt

    assert _run(reclaim, tmp_path) == (message_id, 2)
    # And back: the parent's lease (not acked) expires and the child gets attempt 3.
    child = _spawn("hold", tmp_path, "q", report, "30")
    child.finish()
    assert _lines(report)[-1] == f"claimed {message_id} 3"


def test_watch_in_another_process_sees_appends(tmp_path: Path) -> None:
    report = tmp_path / "watch.txt"
    child = _spawn("watch", tmp_path, "live", report, "3")
    _wait_until(lambda: _lines(report) == ["ready"], "the watcher to start", child)

    async def append(world: LocalWorld) -> None:
        for i in range(3):
            await world.log.append("live", [NewEvent(data=b"e%d" % i)])

    _run(append, tmp_path)
    child.finish()
    assert _lines(report) == ["ready", "e0", "e1", "e2"]


def test_nothing_is_left_outside_the_namespace_folder(tmp_path: Path) -> None:
    """The processes above write only where they are told (a sanity check of the helpers)."""
    report = tmp_path / "a.txt"
    _kill_midway(_spawn("append", tmp_path / "root", "x", report, "t-"), report)
    assert sorted(os.listdir(tmp_path)) == ["a.err", "a.txt", "root"]
    assert os.listdir(tmp_path / "root") == [NS]


@pytest.mark.parametrize("held", ["file", "cache"])
def test_a_child_forked_while_another_thread_holds_a_lock_uses_the_world(
    tmp_path: Path, held: str
) -> None:
    """``fork`` copies only the thread that called it: a lock another thread held at that
    instant stays held in the child for ever. A child that goes on with the parent's World (a
    ``multiprocessing`` child of the fork start method) must not wait for it: its appends go
    through, and the parent sees them. ``held``: a folded file's mutex (a thread amid a file
    call), or the namespace's file-cache mutex."""
    from world_local._log import LogFile

    async def first(world: LocalWorld) -> None:
        await world.log.append("forked", [NewEvent(key="parent", data=b"p")])

    world = anyio.run(partial(connect, url=str(tmp_path), namespace=NS))
    anyio.run(first, world)
    space = world._space
    lock = space.file(LogFile, "forked").mutex if held == "file" else space._files_mutex
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(WAIT)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(WAIT)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:

                async def child() -> None:
                    with anyio.fail_after(WAIT):
                        await world.log.append("forked", [NewEvent(key="child", data=b"c")])

                anyio.run(child)
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + WAIT
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the child waited {WAIT} s for a lock held by the parent's thread")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join(WAIT)

    async def check(world: LocalWorld) -> list[Event]:
        try:
            return await world.log.read("forked")
        finally:
            await world.aclose()

    events = anyio.run(check, world)
    assert [(e.seq, e.key) for e in events] == [(1, "parent"), (2, "child")]
