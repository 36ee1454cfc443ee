"""Benchmark of the Redis World against the raw driver on the same server (a script, not a test).

    uv run python benchmarks/bench_redis.py [--url redis://127.0.0.1:6379/0] [--quick]

One run prints a table and one JSON line:

* append: ``Log.append`` of one 256-byte event, sequentially, against two floors doing one round
  trip with the same bytes: a raw ``XADD`` and a raw ``EVALSHA`` of a one-line XADD script.
  Samples are interleaved (floor, world, floor ...) so drift on a shared machine hits both.
* queue: messages per second through enqueue + claim + ack with 1 and 8 concurrent workers in
  this process, and with 8 worker processes (claim takes up to 16 leases per call; ack is one
  call per lease; each worker also enqueues its share).
* stream: write-to-read latency of a 64-byte chunk, writer and blocked reader in this process.

Everything is written under a fresh namespace (and one floor key) that is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import statistics
import time
from typing import Any

import anyio

from world_core import NewEvent
from world_redis import RedisWorld, connect

TARGETS = {"append_ratio": 1.3, "queue_8_per_s": 10_000.0, "stream_p50_ms": 1.0}
FLOOR_SCRIPT = "return redis.call('XADD', KEYS[1], '*', 'd', ARGV[1])"


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bench_append(world: RedisWorld, rounds: int) -> dict[str, float]:
    client: Any = world._conn.main  # the raw driver, same pool and server
    floor_key = f"bench_floor:{{{secrets.token_hex(6)}}}"
    sha = await client.execute_command("SCRIPT", "LOAD", FLOOR_SCRIPT)
    data = secrets.token_bytes(256)
    xadd: list[float] = []
    evalsha: list[float] = []
    append: list[float] = []
    try:
        for _ in range(50):  # warm-up: connections, script caches
            await client.execute_command("XADD", floor_key, "*", "d", data)
            await world.log.append("bench-log", [NewEvent(data=data)])
        for _ in range(rounds):
            t0 = time.perf_counter()
            await client.execute_command("XADD", floor_key, "*", "d", data)
            t1 = time.perf_counter()
            await client.execute_command("EVALSHA", sha, 1, floor_key, data)
            t2 = time.perf_counter()
            await world.log.append("bench-log", [NewEvent(data=data)])
            t3 = time.perf_counter()
            xadd.append(t1 - t0)
            evalsha.append(t2 - t1)
            append.append(t3 - t2)
    finally:
        await client.execute_command("DEL", floor_key)
    ms = 1000.0
    return {
        "xadd_p50_ms": statistics.median(xadd) * ms,
        "evalsha_p50_ms": statistics.median(evalsha) * ms,
        "append_p50_ms": statistics.median(append) * ms,
        "append_p99_ms": _pct(append, 0.99) * ms,
        "ratio_vs_xadd": statistics.median(append) / statistics.median(xadd),
        "ratio_vs_evalsha": statistics.median(append) / statistics.median(evalsha),
    }


async def bench_queue(world: RedisWorld, workers: int, messages: int) -> float:
    queue = f"bench-q-{workers}"
    payload = secrets.token_bytes(128)
    done = 0
    finished = anyio.Event()
    ended: list[float] = []

    async def producer(count: int) -> None:
        for _ in range(count):
            await world.queue.enqueue(queue, payload)

    async def worker(name: str) -> None:
        nonlocal done
        while done < messages:
            leases = await world.queue.claim(queue, name, lease=30, limit=16, wait=0.2)
            for lease in leases:
                await world.queue.ack(lease)
            done += len(leases)
        if not finished.is_set():
            ended.append(time.perf_counter())
            finished.set()

    start = time.perf_counter()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            share, extra = divmod(messages, workers)
            for i in range(workers):
                tg.start_soon(producer, share + (1 if i < extra else 0))
                tg.start_soon(worker, f"w{i}")
            await finished.wait()
    return messages / (ended[0] - start)


def _process_worker(
    url: str, namespace: str, share: int, ready: Any, go: Any, results: Any
) -> None:
    """One worker process: enqueue its share, then claim + ack that many (any messages)."""

    async def run() -> None:
        world = await connect(url=url, namespace=namespace)
        try:
            payload = secrets.token_bytes(128)
            ready.put(True)
            go.wait(60)
            start = time.time()  # wall clock: compared across processes of one machine
            acked = 0

            async def producer() -> None:
                for _ in range(share):
                    await world.queue.enqueue("bench-q-proc", payload)

            async with anyio.create_task_group() as tg:
                tg.start_soon(producer)
                while acked < share:
                    leases = await world.queue.claim(
                        "bench-q-proc", "w", lease=30, limit=min(16, share - acked), wait=0.2
                    )
                    for lease in leases:
                        await world.queue.ack(lease)
                    acked += len(leases)
            results.put((start, time.time()))
        finally:
            await world.aclose()

    anyio.run(run)


def bench_queue_processes(url: str, namespace: str, workers: int, messages: int) -> float:
    """enqueue + claim + ack in ``workers`` processes at once (the GIL is per process)."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    share = messages // workers
    procs = [
        ctx.Process(target=_process_worker, args=(url, namespace, share, ready, go, results))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=60)
        go.set()
        spans: list[tuple[float, float]] = [results.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return share * workers / (max(end for _, end in spans) - min(start for start, _ in spans))


async def bench_stream(world: RedisWorld, rounds: int) -> dict[str, float]:
    latencies: list[float] = []
    received = anyio.Event()
    sent_at = 0.0

    async def reader() -> None:
        nonlocal received
        async for _chunk in world.stream.read("bench-stream"):
            latencies.append(time.perf_counter() - sent_at)
            received.set()

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.sleep(0.05)
            chunk = secrets.token_bytes(64)
            for i in range(rounds + 20):
                received = anyio.Event()
                sent_at = time.perf_counter()
                await world.stream.write("bench-stream", [chunk])
                await received.wait()
                if i == 19:
                    latencies.clear()  # warm-up done
            await world.stream.close("bench-stream")
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": _pct(latencies, 0.99) * 1000,
    }


async def main(url: str, quick: bool) -> None:
    world = await connect(url=url, namespace=f"bench_{secrets.token_hex(4)}")
    scale = 0.2 if quick else 1.0
    results: dict[str, Any] = {"url": world.settings()["url"]}
    try:
        results["append"] = await bench_append(world, int(2000 * scale))
        results["queue_1_per_s"] = await bench_queue(world, 1, int(5000 * scale))
        results["queue_8_per_s"] = await bench_queue(world, 8, int(20000 * scale))
        results["queue_8_processes_per_s"] = await anyio.to_thread.run_sync(
            bench_queue_processes, url, world.namespace, 8, int(20000 * scale)
        )
        results["stream"] = await bench_stream(world, int(2000 * scale))
    finally:
        await world.purge()
        await world.aclose()
    append, stream = results["append"], results["stream"]
    rows = [
        ("raw XADD round trip p50", f"{append['xadd_p50_ms']:.3f} ms", ""),
        ("raw EVALSHA round trip p50", f"{append['evalsha_p50_ms']:.3f} ms", ""),
        (
            "Log.append p50 / p99",
            f"{append['append_p50_ms']:.3f} / {append['append_p99_ms']:.3f} ms",
            "",
        ),
        (
            "append / XADD floor",
            f"{append['ratio_vs_xadd']:.2f}x",
            f"<= {TARGETS['append_ratio']}x",
        ),
        (
            "append / EVALSHA floor",
            f"{append['ratio_vs_evalsha']:.2f}x",
            f"<= {TARGETS['append_ratio']}x",
        ),
        ("queue, 1 worker", f"{results['queue_1_per_s']:,.0f} msg/s", ""),
        (
            "queue, 8 workers (1 process)",
            f"{results['queue_8_per_s']:,.0f} msg/s",
            f">= {TARGETS['queue_8_per_s']:,.0f}",
        ),
        (
            "queue, 8 worker processes",
            f"{results['queue_8_processes_per_s']:,.0f} msg/s",
            f">= {TARGETS['queue_8_per_s']:,.0f}",
        ),
        (
            "stream write->read p50 / p99",
            f"{stream['p50_ms']:.3f} / {stream['p99_ms']:.3f} ms",
            f"p50 < {TARGETS['stream_p50_ms']} ms",
        ),
    ]
    print(f"{'measure':<32}{'result':>24}   target")
    for name, value, target in rows:
        print(f"{name:<32}{value:>24}   {target}")
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("WORKFLOW_REDIS_URL") or os.environ.get(
        "WORLD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"
    )
    parser.add_argument("--url", default=default)
    parser.add_argument("--quick", action="store_true", help="a fifth of the rounds")
    args = parser.parse_args()
    anyio.run(main, args.url, args.quick)
