"""Benchmark of the MongoDB World (not a test).

    uv run python benchmarks/bench_mongo.py [--url URL] [--appends N] [--messages M]
                                            [--chunks K] [--json]

The URL defaults to WORLD_TEST_MONGO_URL, then WORKFLOW_MONGO_URL. Side by side on one server:

* ``world append``: ``MongoWorld.log.append`` of one 256-byte event (head read, copy of the
  previous batch to segments, conditional head update: three round trips).
* ``raw insert_one``: the floor: the same client library inserting a document holding the
  same bytes, one round trip.
* The two take turns in 5 rounds, so the machine's load falls on both alike.
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

PAYLOAD = b"e" * 256
ROUNDS = 5
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
    per_round = max(1, n // ROUNDS)
    ours: list[float] = []
    raw: list[float] = []
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    coll = client[database][f"world.{world.namespace}.bench_raw"]
    try:
        await world.log.append("bench", [NewEvent(data=PAYLOAD)])  # warm up both paths
        await coll.insert_one({"d": PAYLOAD})
        for _ in range(ROUNDS):
            for _ in range(per_round):
                started = time.perf_counter()
                await world.log.append("bench", [NewEvent(data=PAYLOAD)])
                ours.append(time.perf_counter() - started)
            for _ in range(per_round):
                started = time.perf_counter()
                await coll.insert_one({"d": PAYLOAD})
                raw.append(time.perf_counter() - started)
        await coll.drop()
    finally:
        await client.close()
    return [_stats("world append (1 event)", ours), _stats("raw insert_one (floor)", raw)]


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
    header = f"{'measure':<46}{'ops':>6}{'ops/s':>10}{'p50 ms':>10}{'p99 ms':>10}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['name']:<46}{r['ops']:>6}{r['ops_per_s'] or '':>10}{r['p50_ms']:>10}"
            f"{r['p99_ms']:>10}"
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
    parser.add_argument("--json", action="store_true", help="print JSON after the table")
    parser.add_argument("--quick", action="store_true", help="a tenth of the work: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.appends, args.messages, args.chunks = (
            max(1, n // 10) for n in (args.appends, args.messages, args.chunks)
        )
    if not args.url:
        sys.exit("set WORLD_TEST_MONGO_URL or WORKFLOW_MONGO_URL, or pass --url")
    result = asyncio.run(run(args))
    if result["server"] == "mongoeco":
        print(f"!!! {MONGOECO_WARNING}")
    print(f"server: {result['server']} {result['version']}; shared machine: numbers are noisy")
    print(_table(result["rows"]))
    if result["server"] == "mongoeco":
        print(f"!!! {MONGOECO_WARNING}")
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
