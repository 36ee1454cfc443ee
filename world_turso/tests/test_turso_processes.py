"""Several OS processes on one database file: the schema raced at open, dense appends,
compare-and-set with one winner at a time, a writer SIGKILLed mid-write.

Children are plain subprocesses (turso_child.py); the file is checked afterwards through the
public API and, for its structure, with SQLite's own integrity check. Every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import libsql
import pytest

from world_core import Chunk, NewEvent
from world_turso import connect

CHILD = Path(__file__).with_name("turso_child.py")
WAIT = 60.0
NS = "procs"


def _start(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), args[0], url, NS, *args[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(child: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = child.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    assert child.returncode == 0, f"child failed ({child.returncode}):\n{err[-4000:]}"
    last = json.loads(out.strip().splitlines()[-1])
    assert isinstance(last, dict)
    return last


def _integrity(path: Path) -> str:
    """SQLite's structural check, through libsql (no World of this process has it open)."""
    raw = libsql.connect(str(path), isolation_level=None)
    try:
        rows: list[tuple[object, ...]] = raw.execute("PRAGMA integrity_check").fetchall()
    finally:
        raw.close()
    return "\n".join(str(row[0]) for row in rows)


def test_children_open_together_and_append_dense(tmp_path: Path) -> None:
    """Four children open a fresh file at once (each creating the schema) and append keyed
    batches concurrently: every event lands once, at a dense position, in its writer's order."""
    url = f"file:{tmp_path / 'world.db'}"
    children = [_start(url, "append", "shared", f"c{n}", "25") for n in range(4)]
    for child in children:
        assert _finish(child) == {"done": 25}

    async def check() -> None:
        async with await connect(url=url, namespace=NS) as world:
            events = await world.log.read("shared")
            assert [event.seq for event in events] == list(range(1, len(events) + 1))
            assert await world.log.tail("shared") == len(events)
            keys = [event.key for event in events]
            assert len(set(keys)) == len(keys)
            for n in range(4):
                mine = [e.data.decode() for e in events if e.data.startswith(f"c{n}:".encode())]
                order = [tuple(int(p) for p in item.split(":")[1:]) for item in mine]
                assert order == sorted(order)
                assert {i for i, _ in order} == set(range(25))
            for event in events:
                assert event.key == event.data.decode()
                assert (await world.log.get("shared", event.data.decode())) == event

    anyio.run(check)
    assert _integrity(tmp_path / "world.db") == "ok"


def test_compare_and_set_across_processes_loses_no_update(tmp_path: Path) -> None:
    """Three children append only with expect_tail = the tail they read: every append that
    returned is in the log exactly once, and the log is dense."""
    url = f"file:{tmp_path / 'world.db'}"
    children = [_start(url, "cas", "counter", f"w{n}", "30") for n in range(3)]
    results = [_finish(child) for child in children]
    assert all(result["done"] == 30 for result in results)

    async def check() -> None:
        async with await connect(url=url, namespace=NS) as world:
            events = await world.log.read("counter")
            assert [event.seq for event in events] == list(range(1, 91))
            counts = Counter(event.data.decode() for event in events)
            assert set(counts.values()) == {1}
            assert set(counts) == {f"w{n}:{i}" for n in range(3) for i in range(30)}

    anyio.run(check)


@pytest.mark.parametrize("kill_after", [1, 4, 9])
def test_sigkill_mid_write_leaves_the_file_consistent(tmp_path: Path, kill_after: int) -> None:
    """A child appending 40-event batches (160 KiB) and writing stream chunks in a loop is
    SIGKILLed; the file passes SQLite's integrity check, every batch is whole or absent, positions
    stay dense, and the World takes new writes."""
    path = tmp_path / "world.db"
    url = f"file:{path}"
    child = _start(url, "churn", "journal", "out")
    acknowledged = -1
    give_up = time.monotonic() + WAIT
    assert child.stdout is not None
    try:
        while acknowledged < kill_after:
            assert time.monotonic() < give_up, "the child made no progress"
            line = child.stdout.readline()
            assert line, f"child ended early:\n{child.stderr.read() if child.stderr else ''}"
            acknowledged = json.loads(line)["batch"]
        # Writes continue while the pipe buffers; the kill lands inside some later write.
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.communicate(timeout=WAIT)
    assert child.returncode == -signal.SIGKILL

    assert _integrity(path) == "ok"

    async def check() -> None:
        async with await connect(url=url, namespace=NS) as world:
            events = await world.log.read("journal")
            assert [event.seq for event in events] == list(range(1, len(events) + 1))
            batches = Counter(int(event.data.split(b":", 1)[0]) for event in events)
            assert set(batches.values()) == {40}, "a batch was written in part"
            assert sorted(batches) == list(range(len(batches)))
            assert len(batches) >= acknowledged + 1
            info = await world.stream.info("out")
            chunks = await _first(world.stream.read("out"), info.next_index)
            assert [chunk.index for chunk in chunks] == list(range(info.next_index))
            assert info.next_index % 5 == 0
            assert info.next_index // 5 in (len(batches), len(batches) - 1)
            tail = await world.log.append("journal", [NewEvent(data=b"after the crash")])
            assert tail == len(events) + 1

    anyio.run(check)
    assert _integrity(path) == "ok"


async def _first(chunks: AsyncIterator[Chunk], count: int) -> list[Chunk]:
    """The first ``count`` chunks of an open stream's reader."""
    got: list[Chunk] = []
    if count == 0:
        return got
    with anyio.fail_after(WAIT):
        async for chunk in chunks:
            got.append(chunk)
            if len(got) >= count:
                break
    return got
