"""Measurements shared by the local and Turso benchmarks: interleaved pairs against a floor,
queue draining, stream write-to-read latency."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from world_core import World

WARMUP = 20

Row = dict[str, Any]


def ms(seconds: list[float], q: float = 0.5) -> float:
    """The median (or the ``q`` quantile) of ``seconds``, in milliseconds."""
    ordered = sorted(seconds)
    if q == 0.5:
        return statistics.median(ordered) * 1e3
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


@dataclass
class Sample:
    """Per-call seconds: wall clock, and CPU time of this process (all its threads)."""

    wall: list[float]
    cpu: list[float]


async def pairs(
    count: int, floor: Callable[[], Awaitable[None]], other: Callable[[], Awaitable[None]]
) -> tuple[Sample, Sample]:
    """``count`` interleaved samples of (floor, other), after ``WARMUP`` pairs not kept: drift
    on a shared machine then hits both alike."""
    floors = Sample([], [])
    others = Sample([], [])
    for i in range(WARMUP + count):
        t0, c0 = time.perf_counter(), time.process_time()
        await floor()
        t1, c1 = time.perf_counter(), time.process_time()
        await other()
        t2, c2 = time.perf_counter(), time.process_time()
        if i >= WARMUP:
            floors.wall.append(t1 - t0)
            floors.cpu.append(c1 - c0)
            others.wall.append(t2 - t1)
            others.cpu.append(c2 - c1)
    return floors, others


def pair_rows(name: str, floor_name: str, floor: Sample, other: Sample) -> list[Row]:
    """The rows of a pair: p50, p99 and mean CPU time of each, the ratio of p50s on the
    second."""

    def row(name: str, sample: Sample) -> Row:
        return {
            "name": name,
            "ops": len(sample.wall),
            "p50_ms": ms(sample.wall),
            "p99_ms": ms(sample.wall, 0.99),
            "cpu_us": statistics.fmean(sample.cpu) * 1e6,
        }

    ratio = statistics.median(other.wall) / statistics.median(floor.wall)
    return [row(floor_name, floor), {**row(name, other), "ratio_p50": ratio}]


def table(rows: list[Row]) -> str:
    """A Markdown table of ``rows``; a value a row lacks is shown as -."""

    def cell(row: Row, key: str, spec: str) -> str:
        value = row.get(key)
        width = int(spec.split(".")[0])
        return f"{'-':>{width}}" if value is None else format(value, spec)

    header = (
        f"| {'measurement':<46} | {'ops':>5} | {'p50 ms':>7} | {'p99 ms':>7} | {'ratio':>5} |"
        f" {'CPU us':>6} | {'ops/s':>7} |"
    )
    lines = [header, "|" + "|".join("-" * len(part) for part in header.split("|")[1:-1]) + "|"]
    for row in rows:
        lines.append(
            f"| {row['name']:<46} | {row['ops']:>5} | {cell(row, 'p50_ms', '7.3f')} |"
            f" {cell(row, 'p99_ms', '7.3f')} | {cell(row, 'ratio_p50', '5.2f')} |"
            f" {cell(row, 'cpu_us', '6.0f')} | {cell(row, 'ops_per_s', '7.0f')} |"
        )
    return "\n".join(lines)


async def write_to_read(writer: World, reader: World, stream: str, count: int) -> list[float]:
    """Seconds from the start of each ``Stream.write`` of one 4-byte chunk on ``writer`` to
    ``reader`` yielding it, one chunk at a time (the next is written once the last arrived).
    Bounded: two minutes in all."""
    times: list[float] = []
    arrived = anyio.Event()
    sent_at = 0.0

    async def read() -> None:
        nonlocal arrived
        async for chunk in reader.stream.read(stream):
            times.append(time.perf_counter() - sent_at)
            arrived.set()
            if chunk.index + 1 == count:
                return

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            for i in range(count):
                arrived = anyio.Event()
                sent_at = time.perf_counter()
                await writer.stream.write(stream, [i.to_bytes(4, "big")])
                await arrived.wait()
    return times


async def drain(world: World, queue: str, messages: int, workers: int) -> float:
    """Enqueue ``messages`` to ``queue``, then the seconds ``workers`` tasks take to claim
    and ack them all. Bounded: two minutes for the draining."""
    for i in range(messages):
        await world.queue.enqueue(queue, i.to_bytes(4, "big"))
    done = 0

    async def worker(name: str) -> None:
        nonlocal done
        while leases := await world.queue.claim(queue, name, lease=60):
            for lease in leases:
                await world.queue.ack(lease)
                done += 1

    start = time.perf_counter()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for n in range(workers):
                tg.start_soon(worker, f"w{n}")
    elapsed = time.perf_counter() - start
    if done != messages:
        raise RuntimeError(f"the queue run processed {done} of {messages} messages")
    return elapsed


def run_and_print(run: Callable[[Path], list[Row]], folder: Path, about: str, indent: bool) -> None:
    """``run(folder)``, the folder removed after; then ``about`` with the load average at the
    start and the time taken, the table, and one JSON summary (indented with ``indent``)."""
    load = os.getloadavg()
    try:
        started = time.perf_counter()
        rows = run(folder)
        elapsed = time.perf_counter() - started
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{about}; load average {load[0]:.2f} at the start; {elapsed:.1f} s in all")
    print(table(rows))
    summary = {"load_average": load[0], "elapsed_s": elapsed, "rows": rows}
    print(json.dumps(summary, indent=2) if indent else json.dumps(summary))
