"""Benchmark of the Turso/libSQL World on one local database file (not a test).

    uv run python benchmarks/bench_turso.py [--appends N] [--messages M] [--chunks K] [--json]

Side by side, on the same file, each with WAL and synchronous=FULL:

* ``world append``: ``TursoWorld.log.append`` of one event (worker thread, BEGIN IMMEDIATE,
  tail read, insert, tail upsert, commit).
* ``raw libsql``: the floor: the same driver, a plain INSERT of the same bytes + COMMIT, called
  directly on the caller's thread.
* ``raw sqlite3``: the stdlib ``sqlite3`` module doing the same, in a child process (a second
  SQLite library in one process does not share libsql's file locks).
  The three take turns in 5 rounds, so the machine's load falls on all of them alike.
* queue throughput (enqueue, then claim + ack until empty): 1 and 8 worker tasks on one World,
  and 8 worker processes (one World each, timed from a common start).
* stream write-to-read latency: the reader on the same World, and on a second World (another
  connection, woken by PRAGMA data_version polling).

Bounded (about a minute with the defaults on a loaded machine; every wait has a timeout); the
temporary folder is removed at the end. Timings on a shared machine are noisy: compare the
rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Protocol, cast

import anyio
import libsql
from _world_rows import drain, write_to_read
from anyio.streams.buffered import BufferedByteReceiveStream

from world_core import NewEvent
from world_turso import TursoWorld, connect

PAYLOAD = b"e" * 256
ROUNDS = 5


class _Cursor(Protocol):
    def fetchall(self) -> list[tuple[object, ...]]: ...


class _Raw(Protocol):
    def execute(self, sql: str, parameters: tuple[object, ...] = ()) -> _Cursor: ...
    def close(self) -> None: ...


def _stats(name: str, seconds: list[float], unit_ops: int | None = None) -> dict[str, object]:
    ordered = sorted(seconds)
    ops = unit_ops if unit_ops is not None else len(seconds)
    return {
        "name": name,
        "ops": ops,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "ops_per_s": ops / sum(seconds) if sum(seconds) > 0 else 0.0,
    }


def _timed(count: int, op: Callable[[int], None]) -> list[float]:
    times: list[float] = []
    for i in range(count):
        start = time.perf_counter()
        op(i)
        times.append(time.perf_counter() - start)
    return times


class RawLibsql:
    """The floor: the same driver and file settings, a plain INSERT + COMMIT, no thread hop."""

    def __init__(self, path: Path) -> None:
        self.raw = cast(_Raw, libsql.connect(str(path), isolation_level=None))
        self.raw.execute("PRAGMA journal_mode=WAL").fetchall()
        self.raw.execute("PRAGMA synchronous=FULL").fetchall()
        self.raw.execute(
            "CREATE TABLE IF NOT EXISTS raw_libsql (id INTEGER PRIMARY KEY, data BLOB)"
        ).fetchall()

    def op(self, _: int) -> None:
        self.raw.execute("BEGIN IMMEDIATE").fetchall()
        self.raw.execute("INSERT INTO raw_libsql (data) VALUES (?)", (PAYLOAD,)).fetchall()
        self.raw.execute("COMMIT").fetchall()


def sqlite3_child(path: str, count: int) -> None:
    """Run in a child process: the stdlib sqlite3 reference; prints its timings as JSON."""
    import sqlite3

    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")
    raw.execute("CREATE TABLE IF NOT EXISTS raw_sqlite3 (id INTEGER PRIMARY KEY, data BLOB)")

    def op(_: int) -> None:
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("INSERT INTO raw_sqlite3 (data) VALUES (?)", (PAYLOAD,))
        raw.execute("COMMIT")

    times = _timed(count, op)
    raw.close()
    print(json.dumps({"version": sqlite3.sqlite_version, "times": times}))


def raw_sqlite3(path: Path, count: int) -> tuple[str, list[float]]:
    # A child process: a second SQLite library in this process would not share libsql's locks.
    out = subprocess.run(
        [sys.executable, __file__, "--sqlite3-child", str(path), "--appends", str(count)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return str(result["version"]), [float(t) for t in result["times"]]


async def world_appends(world: TursoWorld, count: int) -> list[float]:
    times: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        await world.log.append("bench", [NewEvent(data=PAYLOAD)])
        times.append(time.perf_counter() - start)
    return times


async def bench_appends(world: TursoWorld, path: Path, count: int) -> list[dict[str, object]]:
    """The three writers take turns in ROUNDS rounds, so that the machine's load (fsync times
    vary a lot on a shared disk) falls on all of them alike."""
    per_round = max(1, count // ROUNDS)
    ours: list[float] = []
    floor: list[float] = []
    stdlib: list[float] = []
    version = "?"
    raw = await anyio.to_thread.run_sync(RawLibsql, path)
    try:
        for _ in range(ROUNDS):
            ours += await world_appends(world, per_round)
            floor += await anyio.to_thread.run_sync(_timed, per_round, raw.op)
            version, times = await anyio.to_thread.run_sync(raw_sqlite3, path, per_round)
            stdlib += times
    finally:
        raw.raw.close()
    return [
        _stats("world log.append (1 event of 256 B)", ours),
        _stats("raw libsql INSERT+COMMIT (floor)", floor),
        _stats(f"raw stdlib sqlite3 {version} INSERT+COMMIT", stdlib),
    ]


async def bench_queue(world: TursoWorld, messages: int, workers: int) -> dict[str, object]:
    elapsed = await drain(world, f"q{workers}", messages, workers)
    return {
        "name": f"queue claim+ack, {workers} worker task(s)",
        "ops": messages,
        "p50_ms": None,
        "p99_ms": None,
        "ops_per_s": messages / elapsed,
    }


async def queue_child(url: str, queue: str) -> None:
    """Run in a child process: claim + ack until the queue is empty; prints how many."""
    async with await connect(url=url, namespace="bench") as world:
        print(json.dumps({"ready": True}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        done = 0
        while leases := await world.queue.claim(queue, f"p{os.getpid()}", lease=60):
            for lease in leases:
                await world.queue.ack(lease)
                done += 1
        print(json.dumps({"done": done}), flush=True)


async def bench_queue_processes(
    world: TursoWorld, url: str, messages: int, workers: int
) -> dict[str, object]:
    """The same job with worker processes, each with its own connection (and its own GIL)."""
    queue = f"p{workers}"
    for i in range(messages):
        await world.queue.enqueue(queue, i.to_bytes(4, "big"))
    argv = [sys.executable, __file__, "--queue-child", url, queue]
    children = [await anyio.open_process(argv) for _ in range(workers)]
    done = 0
    try:
        with anyio.fail_after(120):
            for child in children:
                assert child.stdout is not None
                line = await BufferedByteReceiveStream(child.stdout).receive_until(b"\n", 4096)
                assert json.loads(line) == {"ready": True}
            start = time.perf_counter()
            for child in children:
                assert child.stdin is not None
                await child.stdin.send(b"go\n")
            for child in children:
                assert child.stdout is not None
                line = await BufferedByteReceiveStream(child.stdout).receive_until(b"\n", 4096)
                done += int(json.loads(line)["done"])
            elapsed = time.perf_counter() - start
            for child in children:
                await child.wait()
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
            await child.aclose()
    assert done == messages, f"{done} of {messages} messages processed"
    return {
        "name": f"queue claim+ack, {workers} worker processes",
        "ops": messages,
        "p50_ms": None,
        "p99_ms": None,
        "ops_per_s": messages / elapsed,
    }


async def bench_stream(
    writer: TursoWorld, reader: TursoWorld, count: int, label: str
) -> dict[str, object]:
    return _stats(
        f"stream write->read, {label}", await write_to_read(writer, reader, f"s-{label}", count)
    )


async def run(args: argparse.Namespace, folder: Path) -> list[dict[str, object]]:
    path = folder / "bench.db"
    url = f"file:{path}"
    results: list[dict[str, object]] = []
    async with await connect(url=url, namespace="bench") as world:
        await world.log.append("warmup", [NewEvent(data=PAYLOAD)])
        results += await bench_appends(world, path, args.appends)
        for workers in (1, 8):
            results.append(await bench_queue(world, args.messages, workers))
        results.append(await bench_queue_processes(world, url, args.messages, 8))
        results.append(await bench_stream(world, world, args.chunks, "same World"))
        async with await connect(url=url, namespace="bench") as other:
            results.append(await bench_stream(world, other, args.chunks, "second connection"))
        await world.purge()
    return results


def _table(results: list[dict[str, object]]) -> str:
    def cell(value: object) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = [
        f"| {'measurement':<46} | {'ops':>5} | {'p50 ms':>8} | {'p99 ms':>8} | {'ops/s':>9} |",
        f"|{'-' * 48}|{'-' * 7}|{'-' * 10}|{'-' * 10}|{'-' * 11}|",
    ]
    for r in results:
        ops_per_s = r["ops_per_s"]
        rate = f"{ops_per_s:.0f}" if isinstance(ops_per_s, float) else "-"
        lines.append(
            f"| {r['name']!s:<46} | {r['ops']!s:>5} | {cell(r['p50_ms']):>8} |"
            f" {cell(r['p99_ms']):>8} | {rate:>9} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--appends", type=int, default=500)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--chunks", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print JSON after the table")
    parser.add_argument("--quick", action="store_true", help="a tenth of the work: a smoke run")
    parser.add_argument("--sqlite3-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--queue-child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.appends, args.messages, args.chunks = (
            max(1, n // 10) for n in (args.appends, args.messages, args.chunks)
        )
    if args.sqlite3_child is not None:
        sqlite3_child(args.sqlite3_child, args.appends)
        return
    if args.queue_child is not None:
        anyio.run(queue_child, *args.queue_child)
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-turso-"))
    try:
        started = time.perf_counter()
        results = anyio.run(run, args, folder)
        elapsed = time.perf_counter() - started
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"libsql {metadata.version('libsql')} on one local file, WAL, synchronous=FULL; "
        f"Python {sys.version.split()[0]}; {elapsed:.1f} s in all"
    )
    print(_table(results))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
