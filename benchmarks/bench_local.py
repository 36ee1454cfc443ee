"""Benchmark of the local (files) World against its floor, a raw append + fsync (not a test).

    uv run python benchmarks/bench_local.py [--appends N] [--messages M] [--chunks K]
                                            [--folder DIR] [--quick] [--json]

Everything runs in one temporary folder (``--folder``: a folder to make it in, on the disk to
measure; the system's temporary folder by default), removed at the end. One run prints a table
and one JSON line:

* append: ``Log.append`` of one 256-byte event against the floor: ``os.write`` of the same
  256 bytes to a file opened once with ``O_APPEND``, then ``os.fsync``, on the caller's thread.
  That is the durability the World promises for an append (the frame is fsynced before
  ``append`` returns; a directory is fsynced only when a file is created). Samples are
  interleaved (floor, append, floor, ...) so drift on a shared machine hits both alike; the
  first 20 pairs warm up. The CPU column is the mean CPU time of this process (all threads)
  per call: steadier than the wall clock on a loaded machine.
* what remains, in two more interleaved phases, each with a floor of its own:

  - ``file work``: the World's file work for that append (``LocalLog._write``: mutex, open,
    flock, path check, header and tail read, frame encode, write, fsync, fold), called on
    the caller's thread. Its ratio is what the file format and locking add to write + fsync.
  - ``floor in a worker thread``: the floor itself through the World's hand-off to its
    worker threads (``world_local._threads.run_sync``), as the World runs its file work (an
    fsync must not stall the event loop). Its ratio is the thread hop's part, which the fsync
    makes costlier than an idle hop: the event loop sleeps in epoll meanwhile and must be
    woken, on a loaded machine behind other processes.

  - ``append, never inline``: the append with every call through a worker thread, as before
    appends could run on the event loop's thread (``world_local/README.md``, Locking): the
    inline policy held paused for it.

  An append on a file held open runs on the caller's thread when the policy allows (nothing
  else in a thread, no slow inline append shortly before), else in a thread: its ratio lies
  between the file work's and the never-inline append's, nearer the first the fewer of its
  samples were sent to threads (a loaded machine or disk sends more). What it adds beyond
  these (validation, the ``NewEvent``, the wake-up of this process's watchers, one yield to
  the loop) is the rest of its ratio.
* queue: messages per second through enqueue, then claim + ack until empty, with 1 and 8
  worker tasks on one World.
* stream: latency from the start of a 4-byte ``Stream.write`` to a reader on the same World
  (another task, woken in-process) yielding the chunk.

What remains, as measured (2026-12-02, two runs of ``--messages 40 --chunks 20`` each, the
code before and after alternating, load average 13 on two shared cores): the append is 2.06x
and 1.97x its floor at p50 (2.35x and 2.43x before files were kept open and the hand-off was
the World's own). Its parts: the thread hop, 1.37x to 1.41x on its own (1.48x to 1.67x
through ``anyio.to_thread.run_sync``); the file work, 1.41x to 1.44x (1.55x to 1.68x before),
now five system calls besides the floor's write and fsync (flock, fstat, unlock; no open,
close, header or tail read, outbox probe) plus the frame's encoding, its fold and the locks in
Python. Since then a writer also stats the path once locked (a hard link made elsewhere kept
a deleted file's link count above 0): 1.9 to 2.0 us a stat against 114 to 125 us a pwrite and
fsync on this machine (load 1.0), not rerun through this benchmark. The CPU column of the
append (234 to 341 us against the floor's 70 to 112; 432 to 459 before) is mostly the two
wake-ups of the hop and the Python around it.

Since appends may run on the event loop's thread (2026-12-02 08:26 UTC, two runs of
``--messages 40 --chunks 20`` each, the code before and after alternating, load average 4.7
to 5.2 on two shared cores, floors 0.39 to 1.6 ms as other work flushed the same disk): the
append is 1.29x and 1.41x its floor at p50 (2.54x and 2.42x before, in the runs between),
407 and 272 us of CPU a call against 532 and 461 before; in the same runs, the append never
inline is 2.62x and 2.46x, the file work on the caller's thread 1.32x and 1.47x. So the
inline append costs about its file work: the hop is gone. What remains is the file work's
system calls (``flock``, ``fstat``, ``stat``, ``pwrite``, ``fsync``, unlock: none can go
without weakening a check; ``fdatasync`` instead of ``fsync`` measured the same, one run at
load 3) and about 36 us of Python for the frame, its fold and the locks (without the fsync,
under cProfile: ``json`` encode 6 us, the fold's ``json.loads`` of the frame just made 8 us,
the system calls 20 us).

Timings on a shared machine are noisy: compare the rows of one run, not runs. Bounded: a few
seconds with ``--quick``, about half a minute with the defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import anyio
from _world_rows import Row, drain, ms, pair_rows, pairs, run_and_print, write_to_read

from world_core import NewEvent
from world_local import LocalWorld, _threads, connect
from world_local._log import LocalLog
from world_local._threads import run_sync

PAYLOAD = b"e" * 256
WARMUP = 20


class Floor:
    """A raw append: the same bytes, written to a file opened once, then fsynced."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def op(self) -> None:
        os.write(self.fd, PAYLOAD)
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


async def bench_append(world: LocalWorld, folder: Path, count: int) -> list[Row]:
    log = world.log
    assert isinstance(log, LocalLog)
    floor = Floor(folder / "floor")
    event = [NewEvent(data=PAYLOAD)]

    async def raw() -> None:
        floor.op()

    async def append() -> None:
        await log.append("bench", event)

    async def file_work() -> None:
        log._write("bench", event, None, None, ())

    async def raw_in_thread() -> None:
        await run_sync(floor.op)

    async def append_in_thread() -> None:
        policy = _threads._policy  # paused: this append goes to a thread, as before inlining
        kept, policy.slow_until = policy.slow_until, float("inf")
        try:
            await log.append("bench", event)
        finally:
            policy.slow_until = kept

    try:
        rows = pair_rows(
            "append (1 event of 256 B)",
            "floor: os.write + fsync",
            *await pairs(count, raw, append),
        )
        rows += pair_rows(
            "what remains: file work, caller's thread",
            "floor (phase 2)",
            *await pairs(count, raw, file_work),
        )
        rows += pair_rows(
            "what remains: the floor in a worker thread",
            "floor (phase 3)",
            *await pairs(count, raw, raw_in_thread),
        )
        rows += pair_rows(
            "append, never inline (always a thread)",
            "floor (phase 4)",
            *await pairs(count, raw, append_in_thread),
        )
    finally:
        floor.close()
    return rows


async def bench_queue(world: LocalWorld, messages: int, workers: int) -> Row:
    elapsed = await drain(world, f"q{workers}", messages, workers)
    return {
        "name": f"queue claim+ack, {workers} worker task(s)",
        "ops": messages,
        "ops_per_s": messages / elapsed,
    }


async def bench_stream(world: LocalWorld, count: int) -> Row:
    times = await write_to_read(world, world, "latency", count)
    return {
        "name": "stream write->read, same World",
        "ops": count,
        "p50_ms": ms(times),
        "p99_ms": ms(times, 0.99),
    }


async def run(args: argparse.Namespace, folder: Path) -> list[Row]:
    async with await connect(url=str(folder / "world"), namespace="bench") as world:
        await world.log.append("bench", [NewEvent(data=PAYLOAD)])  # folders and the file
        rows = await bench_append(world, folder, args.appends)
        for workers in (1, 8):
            rows.append(await bench_queue(world, args.messages, workers))
        rows.append(await bench_stream(world, args.chunks))
        await world.purge()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--appends", type=int, default=400, help="samples per append phase")
    parser.add_argument("--messages", type=int, default=400, help="messages per queue run")
    parser.add_argument("--chunks", type=int, default=200, help="chunks of the stream run")
    parser.add_argument("--folder", default=None, help="where to make the temporary folder")
    parser.add_argument("--json", action="store_true", help="the JSON indented, not on one line")
    parser.add_argument("--quick", action="store_true", help="a tenth of the work: a smoke run")
    args = parser.parse_args()
    for name in ("appends", "messages", "chunks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.quick:
        args.appends, args.messages, args.chunks = (
            max(1, n // 10) for n in (args.appends, args.messages, args.chunks)
        )
    folder = Path(tempfile.mkdtemp(prefix="bench-local-", dir=args.folder))
    about = f"local World on {folder.parent}; Python {sys.version.split()[0]}"
    run_and_print(lambda at: anyio.run(run, args, at), folder, about, args.json)


if __name__ == "__main__":
    main()
