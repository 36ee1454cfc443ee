"""Benchmark of the MongoDB World (not a test).

    uv run python benchmarks/bench_mongo.py [--url URL] [--appends N] [--messages M]
                                            [--chunks K] [--quick] [--json]

The URL defaults to WORLD_TEST_MONGO_URL, then WORKFLOW_MONGO_URL. Side by side on one server:

* ``world append``: ``MongoWorld.log.append`` of one 256-byte event. A writer that committed
  the log's last batch itself remembers the head, so it makes two round trips: the copy of
  the previous batch into segments (``insert_one`` into a collection with three indexes
  besides ``_id``, four for logs), then the conditional head update (``update_one``) that is
  the commit point. Without a remembered head (another writer, a new process) a head read
  comes first: three.
* ``raw insert_one``: the floor: the same client library inserting a document holding the
  same bytes, one round trip, into a collection with only ``_id``.
* Samples are interleaved (floor, append, floor, ...), so the machine's load falls on both
  alike; the first 20 pairs warm up.
* what remains: the append's two round trips, timed inside it (``Segments.flush`` and
  ``Segments.try_commit`` wrapped for this run), and the rest: the client's own work
  (validation, documents, the driver's encoding). On mongoeco the segment copy is the
  costlier of the two round trips (its indexes are kept by a Python engine) and the rest is
  well under a millisecond: the gap to the floor is the second round trip, by design (the
  copy must be done before the commit replaces the inline batch). Closing it would take a
  head that keeps two inline batches, so that the copy of one runs alongside the commit of
  the next: a change of the storage format, not made here. Measured on mongoeco
  (``--messages 20 --chunks 10``, load average 23, two cores shared): floor 6.1 ms, append
  21.6 ms (3.55x): segment copy 14.8 ms, head commit 6.8 ms, the rest 0.07 ms.
* queue throughput (enqueue M, then claim + ack until empty) with 1 and 8 worker tasks on one
  World.
* stream write-to-read latency: a reader on the same World (woken in-process) and a reader in
  a child process (woken by bounded polling, 10 ms doubling to 500 ms while idle).

When the server is mongoeco (the wire-protocol test server used where no mongod can be
installed), the output says so: those numbers do NOT represent MongoDB. Bounded (about a
minute with the defaults on mongoeco); data is small and the namespace is purged at the end.
Timings on a shared machine are noisy: compare columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

import anyio
from pymongo import AsyncMongoClient

from world_core import NewEvent
from world_mongo import MongoWorld, connect
from world_mongo._log import MongoLog

PAYLOAD = b"e" * 256
WARMUP = 20
MONGOECO_WARNING = (
    "SERVER IS MONGOECO (a Python wire-protocol test server), NOT MongoDB: "
    "these numbers do not represent MongoDB's performance."
)

Row = dict[str, Any]


def _stats(name: str, seconds: list[float], ops: int | None = None) -> Row:
    ordered = sorted(seconds)
    count = ops if ops is not None else len(seconds)
    total = sum(seconds)
    return {
        "name": name,
        "ops": count,
        "ops_per_s": round(count / total, 1) if total else None,
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
    }


async def bench_append(world: MongoWorld, url: str, database: str, n: int) -> list[Row]:
    """Interleaved samples (floor, append), after WARMUP pairs; the append's two round trips
    timed inside it (see the module docstring)."""
    floor: list[float] = []
    ours: list[float] = []
    copies: list[float] = []
    commits: list[float] = []
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    coll = client[database][f"world.{world.namespace}.bench_raw"]
    log = world.log
    assert isinstance(log, MongoLog)
    segments = log._seg
    flush, try_commit = segments.flush, segments.try_commit

    async def timed_flush(owner: str, head: dict[str, Any]) -> None:
        started = time.perf_counter()
        await flush(owner, head)
        copies.append(time.perf_counter() - started)

    async def timed_commit(*args: Any, **kwargs: Any) -> int | None:
        started = time.perf_counter()
        result = await try_commit(*args, **kwargs)
        commits.append(time.perf_counter() - started)
        return result

    segments.flush = timed_flush  # type: ignore[method-assign]  # timed for this run only
    segments.try_commit = timed_commit  # type: ignore[method-assign]  # likewise
    try:
        for i in range(WARMUP + n):
            t0 = time.perf_counter()
            await coll.insert_one({"d": PAYLOAD})
            t1 = time.perf_counter()
            await log.append("bench", [NewEvent(data=PAYLOAD)])
            t2 = time.perf_counter()
            if i < WARMUP:
                copies.clear()
                commits.clear()
                continue
            floor.append(t1 - t0)
            ours.append(t2 - t1)
        await coll.drop()
    finally:
        del segments.flush, segments.try_commit
        await client.close()
    if not len(copies) == len(commits) == len(ours):
        raise RuntimeError("an append retried (another writer?): the split would not add up")
    rest = [total - a - b for total, a, b in zip(ours, copies, commits, strict=True)]
    append = _stats("world append (1 event)", ours)
    append["ratio_p50"] = round(statistics.median(ours) / statistics.median(floor), 2)
    return [
        _stats("raw insert_one (floor)", floor),
        append,
        _stats("  what remains: segment copy (insert_one)", copies),
        _stats("  what remains: head commit (update_one)", commits),
        _stats("  what remains: the rest (client work)", rest),
    ]


async def bench_queue(world: MongoWorld, m: int, workers: int) -> Row:
    queue = f"bench-{workers}"
    for i in range(m):
        await world.queue.enqueue(queue, PAYLOAD + str(i).encode())
    latencies: list[float] = []

    async def work(name: str) -> None:
        while True:
            started = time.perf_counter()
            leases = await world.queue.claim(queue, name, lease=30)
            if not leases:
                return
            await world.queue.ack(leases[0])
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(workers):
            tg.start_soon(work, f"w{w}")
    elapsed = time.perf_counter() - started
    row = _stats(f"queue claim+ack, {workers} worker(s)", latencies)
    row["ops_per_s"] = round(len(latencies) / elapsed, 1)
    return row


_CHILD_READER = """
import asyncio, struct, sys, time
from world_mongo import connect

async def main() -> None:
    world = await connect(url=sys.argv[1], namespace=sys.argv[2])
    try:
        print("ready", flush=True)
        async for chunk in world.stream.read(sys.argv[3]):
            print(chunk.index, time.time() - struct.unpack("d", chunk.data)[0], flush=True)
    finally:
        await world.aclose()

asyncio.run(main())
"""


async def bench_stream_same_world(world: MongoWorld, k: int) -> Row:
    stream = "lat-same"
    seen: list[float] = []
    done = anyio.Event()

    async def reader() -> None:
        async for chunk in world.stream.read(stream):
            seen.append(time.time() - struct.unpack("d", chunk.data)[0])
        done.set()

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.sleep(0.05)
            for _ in range(k):
                await world.stream.write(stream, [struct.pack("d", time.time())])
                await anyio.sleep(0.01)
            await world.stream.close(stream)
            await done.wait()
    return _stats("stream write->read, same World", seen)


async def bench_stream_other_process(world: MongoWorld, url: str, k: int) -> Row:
    stream = "lat-child"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD_READER,
        url,
        world.namespace,
        stream,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    seen: list[float] = []
    try:
        with anyio.fail_after(120):
            assert (await child.stdout.readline()).strip() == b"ready"
            for _ in range(k):
                await world.stream.write(stream, [struct.pack("d", time.time())])
                # Spaced like a model streaming tokens in bursts: lets the reader idle.
                await anyio.sleep(0.05)
            await world.stream.close(stream)
            for _ in range(k):
                line = await child.stdout.readline()
                seen.append(float(line.split()[1]))
            await child.wait()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    return _stats("stream write->read, other process (polling)", seen)


def _table(rows: list[Row]) -> str:
    header = f"{'measure':<46}{'ops':>6}{'ops/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'ratio':>7}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['name']:<46}{r['ops']:>6}{r['ops_per_s'] or '':>10}{r['p50_ms']:>10}"
            f"{r['p99_ms']:>10}{r.get('ratio_p50', ''):>7}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    url = args.url
    namespace = f"bench_{secrets.token_hex(4)}"
    world = await connect(url=url, namespace=namespace)
    try:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
        try:
            build = await client.admin.command("buildInfo")
        finally:
            await client.close()
        server = "mongoeco" if build.get("gitVersion") == "mongoeco" else "mongod"
        database = world.settings()["database"]
        rows = await bench_append(world, url, database, args.appends)
        for workers in (1, 8):
            rows.append(await bench_queue(world, args.messages, workers))
        rows.append(await bench_stream_same_world(world, args.chunks))
        rows.append(await bench_stream_other_process(world, url, args.chunks))
    finally:
        await world.purge()
        await world.aclose()
    return {"server": server, "version": build.get("version"), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_url = os.environ.get("WORLD_TEST_MONGO_URL") or os.environ.get("WORKFLOW_MONGO_URL")
    parser.add_argument("--url", default=default_url, help="MongoDB URL")
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="the JSON indented, not on one line")
    parser.add_argument("--quick", action="store_true", help="a tenth of the work: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.appends, args.messages, args.chunks = (
            max(1, n // 10) for n in (args.appends, args.messages, args.chunks)
        )
    if not args.url:
        sys.exit("set WORLD_TEST_MONGO_URL or WORKFLOW_MONGO_URL, or pass --url")
    load = os.getloadavg()
    result = asyncio.run(run(args))
    result["load_average"] = load[0]
    if result["server"] == "mongoeco":
        print(f"!!! {MONGOECO_WARNING}")
    print(
        f"server: {result['server']} {result['version']}; load average {load[0]:.2f} at the "
        "start; shared machine: numbers are noisy"
    )
    print(_table(result["rows"]))
    if result["server"] == "mongoeco":
        print(f"!!! {MONGOECO_WARNING}")
    print(json.dumps(result, indent=2) if args.json else json.dumps(result))


if __name__ == "__main__":
    main()
