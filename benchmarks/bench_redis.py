"""Benchmark of the Redis World against the raw driver and saq on the same server (a script).

    uv run --group bench python benchmarks/bench_redis.py [--url redis://127.0.0.1:6379/0]
        [--cluster-url redis+cluster://127.0.0.1:7000] [--quick]

One run prints a table and one JSON line:

* append: ``Log.append`` of one 256-byte event, sequentially, against two floors doing one round
  trip with the same bytes through redis-py's client: a raw ``XADD`` and a raw ``EVALSHA`` of a
  one-line XADD script. A third, the wire floor, sends an ``XADD`` encoded beforehand on a bare
  redis-py connection (no client, pool or encoder): the least any Python call can take. Samples
  are interleaved (floor, world, floor ...) so drift on a shared machine hits all.
* queue: messages per second through enqueue + claim + ack with 1 and 8 concurrent workers in
  this process, and with 8 worker processes (claim takes up to 16 leases per call; ack is one
  call per lease; each worker also enqueues its share). A worker process runs 16 enqueuing
  tasks and acks the leases of one claim at once, as a worker that handles a claimed batch
  concurrently does: its pipe merges those calls into a few script calls per round trip (calls
  of different processes cannot merge). The row "1 by 1" is the same with one enqueuing task
  and one ack after another, a round trip each. The process rows also give the CPU spent per
  message by the worker processes (their rusage) and by the Redis server (INFO cpu), the
  load-independent part of the figure: on a 2-core machine, 10,000 msg/s needs both to sum
  to at most 200 us with nothing else running.
* stream: write-to-read latency of a 64-byte chunk, writer and blocked reader in this process.
* cluster (only with ``--cluster-url redis+cluster://host:port``): the in-process queue rows
  again on a Redis Cluster (one queue lives on one primary).
* saq queue (the named peer, https://github.com/tobymao/saq, an asyncio job queue on redis-py):
  the same workload shape as our in-process queue rows (W producers each enqueuing its share,
  W consumers each taking one job and marking it done, 1 and 8 workers, one process, one
  connection pool). A job is ``RedisQueue.enqueue`` + ``dequeue`` + ``job.finish(COMPLETE)``,
  called directly: no saq ``Worker``, so no job function runs, no retries, and none of the
  worker's own writes (the ``update(status=ACTIVE)`` SET + PUBLISH it does before running a
  job, its stats, schedule and sweep loops); a real saq worker does more per job than this.
  saq's Redis queue does five round trips per job and batches nothing: enqueue is one EVALSHA
  (ZSCORE + EXISTS on the job's abort key, SET of the job's JSON under its own key, ZADD to the
  queue's ``incomplete`` sorted set, RPUSH of the job id to ``queued``); dequeue is a BLMOVE
  ``queued`` -> ``active`` then a GET of the job; finish is a MULTI/EXEC of LREM ``active`` +
  ZREM ``incomplete`` + SETEX of the finished job (kept for its ttl, saq's default 600 s) and
  then a separate PUBLISH of the status on the job's channel. Each job is one JSON document
  (about 330 bytes queued, 380 finished) serialized and parsed in Python on every step; saq's
  default ``json.dumps`` cannot carry bytes, so the 128-byte payload travels base64-coded (172
  characters) as the job kwarg ``data``. Ours, per message: one enqueue script call, one
  claim call per up to 16 messages, one ack script call, with concurrent enqueues and acks of
  one process merged into one call; its records are hashes and sorted sets per queue, deleted
  at ack; lost leases are reclaimed by deadline and fenced by a token. saq has no per-delivery
  token: a job stuck in ``active`` past its timeout is requeued by a worker's periodic sweep.
  The saq process row has our process layout: 8 processes, each with 16 enqueuing tasks and 16
  consumer tasks (dequeue + finish, one job each, as many as our claim's limit).

Everything is written under a fresh namespace (and one floor key) that is deleted at the end;
the saq rows use a fresh saq queue name whose keys (``saq:<name>:*``, ``saq:job:<name>:*``) are
deleted afterwards.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import resource
import secrets
import statistics
import time
from importlib.metadata import version
from typing import Any

import anyio
import redis
from saq.job import Status
from saq.queue.redis import RedisQueue

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
    pool = client.connection_pool
    bare = pool.connection_class(**pool.connection_kwargs)
    encoded = b"".join(bare.pack_command("XADD", floor_key, "*", "d", data))
    xadd: list[float] = []
    evalsha: list[float] = []
    wire: list[float] = []
    append: list[float] = []

    async def wire_xadd() -> None:
        await bare.send_packed_command(encoded, check_health=False)
        await bare.read_response()

    try:
        for _ in range(50):  # warm-up: connections, script caches
            await client.execute_command("XADD", floor_key, "*", "d", data)
            await wire_xadd()
            await world.log.append("bench-log", [NewEvent(data=data)])
        for _ in range(rounds):
            t0 = time.perf_counter()
            await client.execute_command("XADD", floor_key, "*", "d", data)
            t1 = time.perf_counter()
            await client.execute_command("EVALSHA", sha, 1, floor_key, data)
            t2 = time.perf_counter()
            await wire_xadd()
            t3 = time.perf_counter()
            await world.log.append("bench-log", [NewEvent(data=data)])
            t4 = time.perf_counter()
            xadd.append(t1 - t0)
            evalsha.append(t2 - t1)
            wire.append(t3 - t2)
            append.append(t4 - t3)
    finally:
        await client.execute_command("DEL", floor_key)
        await bare.disconnect()
    ms = 1000.0
    return {
        "xadd_p50_ms": statistics.median(xadd) * ms,
        "evalsha_p50_ms": statistics.median(evalsha) * ms,
        "wire_p50_ms": statistics.median(wire) * ms,
        "append_p50_ms": statistics.median(append) * ms,
        "append_p99_ms": _pct(append, 0.99) * ms,
        "ratio_vs_xadd": statistics.median(append) / statistics.median(xadd),
        "ratio_vs_evalsha": statistics.median(append) / statistics.median(evalsha),
        "ratio_vs_wire": statistics.median(append) / statistics.median(wire),
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


async def bench_saq_queue(url: str, workers: int, messages: int) -> float:
    """saq's enqueue + dequeue + finish(COMPLETE), shaped like ``bench_queue`` (see the docstring).

    The 128-byte payload is the job kwarg ``data``, base64-coded (saq serializes jobs as JSON).
    """
    name = f"bench-saq-{secrets.token_hex(4)}-{workers}"
    queue = RedisQueue.from_url(url, name=name)
    data = base64.b64encode(secrets.token_bytes(128)).decode()
    done = 0
    finished = anyio.Event()
    ended: list[float] = []

    async def producer(count: int) -> None:
        for _ in range(count):
            await queue.enqueue("bench", data=data)

    async def consumer() -> None:
        nonlocal done
        while done < messages:
            job = await queue.dequeue(timeout=0.2)
            if job is not None:
                await job.finish(Status.COMPLETE)
                done += 1
        if not finished.is_set():
            ended.append(time.perf_counter())
            finished.set()

    async def warm_up() -> None:  # connections, the enqueue script, the cached server version
        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(producer, 1)
        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(_take_one, queue)

    await queue.connect()
    try:
        with anyio.fail_after(120):
            await warm_up()
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                share, extra = divmod(messages, workers)
                for i in range(workers):
                    tg.start_soon(producer, share + (1 if i < extra else 0))
                    tg.start_soon(consumer)
                await finished.wait()
    finally:
        with anyio.CancelScope(shield=True):
            await _delete_saq_keys(queue)
            await queue.disconnect()
    return messages / (ended[0] - start)


async def _take_one(queue: RedisQueue) -> None:
    job = await queue.dequeue(timeout=5)
    if job is None:
        raise RuntimeError("saq warm-up: no job dequeued within 5 s")
    await job.finish(Status.COMPLETE)


async def _delete_saq_keys(queue: RedisQueue) -> None:
    """Delete every key of this saq queue (its lists, sets and job records), nothing else."""
    for pattern in (f"saq:{queue.name}:*", f"saq:job:{queue.name}:*"):
        batch: list[bytes] = []
        async for key in queue.redis.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await queue.redis.delete(*batch)
                batch.clear()
        if batch:
            await queue.redis.delete(*batch)


CLAIM_LIMIT = 16
"""Most leases one claim of the process rows takes."""
PROCESS_PRODUCERS = CLAIM_LIMIT
"""Enqueuing tasks per worker process in the concurrent layout (see ``_process_worker``): it
enqueues as many messages at once as it acks."""
SAQ_PROCESS_CONSUMERS = CLAIM_LIMIT
"""saq consumer tasks per process in that layout: one job each, as many as our claim limit."""


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_worker(
    url: str, namespace: str, share: int, concurrent: bool, ready: Any, go: Any, results: Any
) -> None:
    """One worker process: enqueue its share, then claim + ack that many (any messages).

    ``concurrent``: PROCESS_PRODUCERS tasks enqueue and the acks of one claim run at once, so
    the process's pipe merges them into few script calls; otherwise one task enqueues and the
    claiming loop acks one lease after another (a round trip each).
    """

    async def run() -> None:
        world = await connect(url=url, namespace=namespace)
        try:
            payload = secrets.token_bytes(128)
            ready.put(True)
            go.wait(60)
            cpu = _cpu_seconds()
            start = time.time()  # wall clock: compared across processes of one machine
            acked = 0
            producers = PROCESS_PRODUCERS if concurrent else 1

            async def producer(count: int) -> None:
                for _ in range(count):
                    await world.queue.enqueue("bench-q-proc", payload)

            async with anyio.create_task_group() as tg:
                part, extra = divmod(share, producers)
                for i in range(producers):
                    tg.start_soon(producer, part + (1 if i < extra else 0))
                while acked < share:
                    leases = await world.queue.claim(
                        "bench-q-proc",
                        "w",
                        lease=30,
                        limit=min(CLAIM_LIMIT, share - acked),
                        wait=0.2,
                    )
                    if concurrent:
                        async with anyio.create_task_group() as acks:
                            for lease in leases:
                                acks.start_soon(world.queue.ack, lease)
                    else:
                        for lease in leases:
                            await world.queue.ack(lease)
                    acked += len(leases)
            results.put((start, time.time(), _cpu_seconds() - cpu))
        finally:
            await world.aclose()

    anyio.run(run)


def _saq_process_worker(
    url: str, name: str, share: int, concurrent: bool, ready: Any, go: Any, results: Any
) -> None:
    """saq in one worker process, laid out as ``_process_worker``: its producers enqueue its
    share while its consumers (SAQ_PROCESS_CONSUMERS tasks, or one) dequeue + finish that many
    jobs (any jobs); a consumer takes a slot of the share before it dequeues, so no process
    takes more than its share."""

    async def run() -> None:
        queue = RedisQueue.from_url(url, name=name)
        await queue.connect()
        try:
            data = base64.b64encode(secrets.token_bytes(128)).decode()
            ready.put(True)
            go.wait(60)
            cpu = _cpu_seconds()
            start = time.time()
            taken = 0

            async def producer(count: int) -> None:
                for _ in range(count):
                    await queue.enqueue("bench", data=data)

            async def consumer() -> None:
                nonlocal taken
                while taken < share:
                    taken += 1
                    job = await queue.dequeue(timeout=0.2)
                    if job is None:
                        taken -= 1
                    else:
                        await job.finish(Status.COMPLETE)

            producers = PROCESS_PRODUCERS if concurrent else 1
            async with anyio.create_task_group() as tg:
                part, extra = divmod(share, producers)
                for i in range(producers):
                    tg.start_soon(producer, part + (1 if i < extra else 0))
                for _ in range(SAQ_PROCESS_CONSUMERS if concurrent else 1):
                    tg.start_soon(consumer)
            results.put((start, time.time(), _cpu_seconds() - cpu))
        finally:
            await queue.disconnect()

    anyio.run(run)


def _redis_cpu(client: redis.Redis) -> float:
    """The server's CPU seconds so far (user + system), from INFO cpu."""
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def bench_queue_processes(
    url: str, namespace: str, workers: int, messages: int, *, concurrent: bool, saq: bool = False
) -> dict[str, float]:
    """enqueue + claim + ack in ``workers`` processes at once (the GIL is per process).

    Returns msg/s and the CPU spent per message: by the worker processes (their own rusage
    over the run) and by the Redis server (its INFO cpu before and after; anything else
    using the server meanwhile counts too).
    """
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    share = messages // workers
    target = _saq_process_worker if saq else _process_worker
    procs = [
        ctx.Process(target=target, args=(url, namespace, share, concurrent, ready, go, results))
        for _ in range(workers)
    ]
    server = redis.Redis.from_url(url)
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=60)
        server_cpu = _redis_cpu(server)
        go.set()
        spans: list[tuple[float, float, float]] = [results.get(timeout=300) for _ in procs]
        server_cpu = _redis_cpu(server) - server_cpu
    finally:
        server.close()
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    total = share * workers
    return {
        "per_s": total / (max(end for _, end, _ in spans) - min(start for start, _, _ in spans)),
        "client_cpu_us_per_msg": sum(cpu for _, _, cpu in spans) / total * 1e6,
        "redis_cpu_us_per_msg": server_cpu / total * 1e6,
    }


async def bench_saq_processes(url: str, workers: int, messages: int) -> dict[str, float]:
    """saq with the process layout of ``bench_queue_processes(concurrent=True)``."""
    name = f"bench-saq-{secrets.token_hex(4)}-p{workers}"
    queue = RedisQueue.from_url(url, name=name)
    try:
        return await anyio.to_thread.run_sync(
            lambda: bench_queue_processes(url, name, workers, messages, concurrent=True, saq=True)
        )
    finally:
        with anyio.CancelScope(shield=True):
            await _delete_saq_keys(queue)
            await queue.redis.aclose()


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


async def bench_cluster(url: str, scale: float) -> dict[str, float]:
    world = await connect(url=url, namespace=f"bench_{secrets.token_hex(4)}")
    try:
        return {
            "queue_1_per_s": await bench_queue(world, 1, int(5000 * scale)),
            "queue_8_per_s": await bench_queue(world, 8, int(20000 * scale)),
        }
    finally:
        await world.purge()
        await world.aclose()


def _cpu_note(run: dict[str, float]) -> str:
    return (
        f"CPU/msg: workers {run['client_cpu_us_per_msg']:.0f} us,"
        f" Redis {run['redis_cpu_us_per_msg']:.0f} us"
    )


async def main(url: str, cluster_url: str | None, quick: bool) -> None:
    world = await connect(url=url, namespace=f"bench_{secrets.token_hex(4)}")
    scale = 0.2 if quick else 1.0
    results: dict[str, Any] = {"url": world.settings()["url"]}
    try:
        results["append"] = await bench_append(world, int(2000 * scale))
        results["queue_1_per_s"] = await bench_queue(world, 1, int(5000 * scale))
        results["queue_8_per_s"] = await bench_queue(world, 8, int(20000 * scale))
        messages = int(20000 * scale)

        async def processes(concurrent: bool) -> dict[str, float]:
            return await anyio.to_thread.run_sync(
                lambda: bench_queue_processes(
                    url, world.namespace, 8, messages, concurrent=concurrent
                )
            )

        # Interleaved: 1 by 1, ours, saq, ours again (the median of two; once with --quick).
        results["processes_sequential"] = await processes(False)
        ours = [await processes(True)]
        results["saq_processes"] = await bench_saq_processes(url, 8, int(4000 * scale))
        if not quick:
            ours.append(await processes(True))
        results["processes"] = {key: statistics.median(run[key] for run in ours) for key in ours[0]}
        results["queue_8_processes_per_s"] = results["processes"]["per_s"]
        results["stream"] = await bench_stream(world, int(2000 * scale))
        results["saq_queue_1_per_s"] = await bench_saq_queue(url, 1, int(5000 * scale))
        results["saq_queue_8_per_s"] = await bench_saq_queue(url, 8, int(20000 * scale))
        results["saq_version"] = version("saq")
        if cluster_url:
            results["cluster"] = await bench_cluster(cluster_url, scale)
    finally:
        await world.purge()
        await world.aclose()
    append, stream = results["append"], results["stream"]
    peer = f"peer: saq {results['saq_version']}"
    rows = [
        ("raw XADD round trip p50", f"{append['xadd_p50_ms']:.3f} ms", ""),
        ("raw EVALSHA round trip p50", f"{append['evalsha_p50_ms']:.3f} ms", ""),
        ("wire floor (bare XADD) p50", f"{append['wire_p50_ms']:.3f} ms", ""),
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
        ("append / wire floor", f"{append['ratio_vs_wire']:.2f}x", ""),
        ("queue, 1 worker", f"{results['queue_1_per_s']:,.0f} msg/s", ""),
        ("saq queue, 1 worker", f"{results['saq_queue_1_per_s']:,.0f} msg/s", peer),
        (
            "queue, 8 workers (1 process)",
            f"{results['queue_8_per_s']:,.0f} msg/s",
            f">= {TARGETS['queue_8_per_s']:,.0f}",
        ),
        ("saq queue, 8 workers (1 process)", f"{results['saq_queue_8_per_s']:,.0f} msg/s", peer),
        (
            "queue, 8 processes, 1 by 1",
            f"{results['processes_sequential']['per_s']:,.0f} msg/s",
            _cpu_note(results["processes_sequential"]),
        ),
        (
            "queue, 8 worker processes",
            f"{results['queue_8_processes_per_s']:,.0f} msg/s",
            f">= {TARGETS['queue_8_per_s']:,.0f}; {_cpu_note(results['processes'])}",
        ),
        (
            "saq queue, 8 worker processes",
            f"{results['saq_processes']['per_s']:,.0f} msg/s",
            f"{peer}; {_cpu_note(results['saq_processes'])}",
        ),
        (
            "stream write->read p50 / p99",
            f"{stream['p50_ms']:.3f} / {stream['p99_ms']:.3f} ms",
            f"p50 < {TARGETS['stream_p50_ms']} ms",
        ),
    ]
    if "cluster" in results:
        rows += [
            ("cluster queue, 1 worker", f"{results['cluster']['queue_1_per_s']:,.0f} msg/s", ""),
            (
                "cluster queue, 8 workers",
                f"{results['cluster']['queue_8_per_s']:,.0f} msg/s",
                f">= {TARGETS['queue_8_per_s']:,.0f}",
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
    parser.add_argument(
        "--cluster-url", default=None, help="also run the queue rows on this Redis Cluster"
    )
    parser.add_argument("--quick", action="store_true", help="a fifth of the rounds")
    args = parser.parse_args()
    anyio.run(main, args.url, args.cluster_url, args.quick)
