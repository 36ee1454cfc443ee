"""Benchmark of the PostgreSQL World against the raw driver, procrastinate and PgQueuer, on one
server.

    uv run --group bench python benchmarks/bench_postgres.py [--url postgresql://...] [--quick]

The URL defaults to WORLD_TEST_POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/postgres.
One run prints a table and one JSON line:

* append: ``Log.append`` of one 256-byte event against the floor, one raw asyncpg INSERT of the
  same bytes into a (log_id, seq) table, each committed on its own. Samples are interleaved,
  each pair in a random order, so drift on a shared machine hits both alike. The next row is the
  profile of what remains: the World's own single-event INSERT through the raw driver,
  interleaved the same way with a floor of its own (its ratio is the server's part: the tail
  event's fetch by its ctid and its row lock, wake; the rest of the append's ratio is the
  client's: pool, retries, validation, building the NewEvent), and this process's CPU time per
  call (``time.process_time`` around each call, read outside the wall clock's window) for the
  floor and the append: the client's part in microseconds. Building the ``NewEvent`` is inside
  the append's timed section (it is what a caller of ``Log.append`` pays; the floor's bytes and
  the append's are prebuilt).
* queue: messages per second through enqueue then claim + ack, with 1 and 8 concurrent
  producers and workers in this process (claim takes one message per call, like procrastinate's
  fetch), against procrastinate deferring and running the same number of no-op jobs with the
  same concurrency (its worker with ``wait=False`` and ``delete_jobs="always"``), and against
  PgQueuer (a batching queue: one queue manager per worker, each on its own connection,
  fetching 10 jobs a round trip, in drain mode) on a database of its own. Against PgQueuer our
  workers batch too: each claims up to 10 messages a call (``claim(limit=10)``) and acks that
  claim's leases concurrently, one call each, which the World merges into a statement or two
  (PgQueuer buffers its completions and writes 10 at a time). Both sides enqueue one message a
  call from 8 producers (the World merges calls made at once, see world_postgres/_merge.py),
  run a no-op per message, and commit everything durably (logged tables, the server's
  ``synchronous_commit``); PgQueuer also writes a log row per status change and NOTIFYs from
  each statement that changes its queue table, which is its design, not this script's doing.
* stream: latency from the start of a 64-byte ``Stream.write`` to a live reader (another task,
  woken through LISTEN/NOTIFY) yielding the chunk.

Everything is written to a fresh namespace, a floor schema and a procrastinate database, all
dropped at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg

from world_core import NewEvent
from world_postgres import PostgresWorld, connect
from world_postgres._db import tag, tag_key
from world_postgres._log import PostgresLog

PGQUEUER_BATCH = 10
"""PgQueuer's queue manager fetches this many jobs a round trip; our batched row claims as many."""

TARGETS = {
    "append_ratio": 1.15,
    "queue_8_vs_procrastinate": 3.0,
    "queue_8_vs_pgqueuer": 1.5,
    "stream_p50_ms": 3.0,
}


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(call: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """One call's wall time, and this process's CPU time around it (read outside the wall
    clock's window)."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    await call()
    t1 = time.perf_counter()
    return t1 - t0, time.process_time() - c0


async def _pair(
    rng: random.Random,
    floor: Callable[[], Awaitable[object]],
    other: Callable[[], Awaitable[object]],
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Time the floor and the other call once each, in a random order (neither is always the
    one after the other); returns their (wall, CPU) seconds, floor first."""
    if rng.random() < 0.5:
        floor_took = await _timed(floor)
        return floor_took, await _timed(other)
    other_took = await _timed(other)
    return await _timed(floor), other_took


async def bench_append(world: PostgresWorld, url: str, rounds: int) -> dict[str, float]:
    conn: Any = await asyncpg.connect(url)
    raw: Any = await asyncpg.connect(url)
    schema = f"bench_floor_{secrets.token_hex(4)}"
    data = secrets.token_bytes(256)
    floor: list[float] = []
    append: list[float] = []
    floor_cpu: list[float] = []
    append_cpu: list[float] = []
    statement: list[float] = []
    statement_floor: list[float] = []
    log = world.log
    assert isinstance(log, PostgresLog)
    wake_tag = tag("l", "bench-raw")
    wake_key = tag_key(wake_tag)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        await conn.execute(
            f"CREATE TABLE {schema}.events (log_id text NOT NULL, seq bigint NOT NULL,"
            " data bytea NOT NULL, PRIMARY KEY (log_id, seq))"
        )
        insert = f"INSERT INTO {schema}.events (log_id, seq, data) VALUES ($1, $2, $3)"
        await world.log.append("bench-raw", [NewEvent(data=data)])  # a tail for the statement
        # Each pair runs in a random order, so that neither call always follows the other (what
        # precedes a commit changes its time on a server other sessions also write to).
        rng = random.Random(17)

        async def floor_one(seq: int) -> None:
            await conn.execute(insert, "bench-log", seq, data)

        async def append_one() -> None:
            await world.log.append("bench-log", [NewEvent(data=data)])

        named: list[Any] = []  # the seq and ctid of the event statement_one appended last

        async def statement_one() -> None:
            # As Log.append appending alone to a log: the INSERT naming the event it appended
            # last (_APPEND_AFTER), after one probe for the tail (_APPEND_ONE).
            head = ("bench-raw", data, None, os.urandom(16).hex())
            if named:
                rows = await raw.fetch(
                    log._append_after, *head, named[0], wake_key, wake_tag, named[1]
                )
            else:
                rows = await raw.fetch(log._append_one, *head, None, wake_key, wake_tag)
            assert rows, "the single-event INSERT found no tail event"
            named[:] = rows[0][:2]

        # The first 100 of each phase warm up: connections, prepared statements, plans.
        for seq in range(1, 101 + rounds):
            floor_took, append_took = await _pair(
                rng, functools.partial(floor_one, seq), append_one
            )
            if seq > 100:
                floor.append(floor_took[0])
                append.append(append_took[0])
                floor_cpu.append(floor_took[1])
                append_cpu.append(append_took[1])
        # The statement Log.append sends for one event (log, data, key, batch, the seq of the
        # event it names, wake key, wake tag, that event's ctid; see _log.py), on a connection
        # of its own, against a floor of its own: a third call in the loop above would change
        # what precedes the floor.
        for seq in range(101 + rounds, 201 + 2 * rounds):
            floor_took, statement_took = await _pair(
                rng, functools.partial(floor_one, seq), statement_one
            )
            if seq > 200 + rounds:
                statement_floor.append(floor_took[0])
                statement.append(statement_took[0])
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()
        await raw.close()
    return {
        "floor_p50_ms": statistics.median(floor) * 1e3,
        "append_p50_ms": statistics.median(append) * 1e3,
        "floor_mean_ms": statistics.fmean(floor) * 1e3,
        "append_mean_ms": statistics.fmean(append) * 1e3,
        "ratio_p50": statistics.median(append) / statistics.median(floor),
        "statement_p50_ms": statistics.median(statement) * 1e3,
        "statement_floor_p50_ms": statistics.median(statement_floor) * 1e3,
        "statement_ratio_p50": statistics.median(statement) / statistics.median(statement_floor),
        "ratio_mean": statistics.fmean(append) / statistics.fmean(floor),
        "floor_cpu_p50_us": statistics.median(floor_cpu) * 1e6,
        "append_cpu_p50_us": statistics.median(append_cpu) * 1e6,
    }


async def _split(total: int, parts: int, work: Any) -> None:
    async with anyio.create_task_group() as tg:
        for part in range(parts):
            tg.start_soon(work, total // parts + (part < total % parts))


async def bench_world_queue(
    world: PostgresWorld, workers: int, count: int, batch: int = 1
) -> dict[str, float]:
    """Each worker claims up to ``batch`` messages a call; with more than one it acks the leases
    of a claim concurrently (a worker handling a claimed batch at once), one call each."""
    queue = f"bench-{workers}-{batch}"
    payload = b'{"n": 1}'
    done = 0

    async def produce(n: int) -> None:
        for _ in range(n):
            await world.queue.enqueue(queue, payload)

    async def work(_: int) -> None:
        nonlocal done
        while done < count:
            leases = await world.queue.claim(queue, "w", lease=30, limit=batch)
            if not leases:
                return
            if batch == 1:
                await world.queue.ack(leases[0])
            else:
                async with anyio.create_task_group() as acks:
                    for lease in leases:
                        acks.start_soon(world.queue.ack, lease)
            done += len(leases)

    t0 = time.perf_counter()
    await _split(count, workers, produce)
    t1 = time.perf_counter()
    await _split(workers, workers, work)
    t2 = time.perf_counter()
    assert done == count, f"drained {done} of {count}"
    return {
        "enqueue_per_s": count / (t1 - t0),
        "claim_ack_per_s": count / (t2 - t1),
        "end_to_end_per_s": count / (t2 - t0),
    }


async def bench_procrastinate(url: str, workers: int, count: int) -> dict[str, float]:
    import procrastinate

    admin: Any = await asyncpg.connect(url)
    database = f"bench_procrastinate_{secrets.token_hex(4)}"
    await admin.execute(f"CREATE DATABASE {database}")
    try:
        base, _, _ = url.rpartition("/")
        app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(
                conninfo=f"{base}/{database}", min_size=1, max_size=workers + 2
            )
        )
        ran = 0

        @app.task(name="noop", queue="bench")
        async def noop(n: int) -> None:
            nonlocal ran
            ran += 1

        async with app.open_async():
            await app.schema_manager.apply_schema_async()

            async def produce(n: int) -> None:
                for _ in range(n):
                    await noop.defer_async(n=1)

            t0 = time.perf_counter()
            await _split(count, workers, produce)
            t1 = time.perf_counter()
            await app.run_worker_async(
                queues=["bench"],
                concurrency=workers,
                wait=False,
                delete_jobs="always",
                install_signal_handlers=False,
                listen_notify=False,
            )
            t2 = time.perf_counter()
        assert ran == count, f"procrastinate ran {ran} of {count}"
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.close()
    return {
        "enqueue_per_s": count / (t1 - t0),
        "claim_ack_per_s": count / (t2 - t1),
        "end_to_end_per_s": count / (t2 - t0),
    }


async def bench_pgqueuer(url: str, workers: int, count: int) -> dict[str, float]:
    """PgQueuer on its own database: ``workers`` producers enqueue one job per call, then
    ``workers`` queue managers (a connection each, batch size 10, drain mode) run no-op jobs."""
    import pgqueuer
    from pgqueuer.domain.types import QueueExecutionMode

    admin: Any = await asyncpg.connect(url)
    database = f"bench_pgqueuer_{secrets.token_hex(4)}"
    await admin.execute(f"CREATE DATABASE {database}")
    connections: list[Any] = []
    try:
        base, _, _ = url.rpartition("/")
        for _ in range(workers + 1):
            connections.append(await asyncpg.connect(f"{base}/{database}"))
        setup = pgqueuer.Queries(pgqueuer.AsyncpgDriver(connections[0]))
        await setup.install()
        ran = 0

        async def produce_on(conn: Any, n: int) -> None:
            queries = pgqueuer.Queries(pgqueuer.AsyncpgDriver(conn))
            for _ in range(n):
                await queries.enqueue("noop", b"1")

        producers = iter(connections[1:])

        async def produce(n: int) -> None:
            await produce_on(next(producers), n)

        t0 = time.perf_counter()
        await _split(count, workers, produce)
        t1 = time.perf_counter()

        async def consume(conn: Any) -> None:
            manager = pgqueuer.QueueManager(pgqueuer.Queries(pgqueuer.AsyncpgDriver(conn)))

            @manager.entrypoint("noop")
            async def noop(job: pgqueuer.Job) -> None:
                nonlocal ran
                ran += 1

            await manager.run(batch_size=PGQUEUER_BATCH, mode=QueueExecutionMode.drain)

        async with anyio.create_task_group() as tg:
            for conn in connections[1:]:
                tg.start_soon(consume, conn)
        t2 = time.perf_counter()
        assert ran == count, f"pgqueuer ran {ran} of {count}"
    finally:
        for conn in connections:
            await conn.close()
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.close()
    return {
        "enqueue_per_s": count / (t1 - t0),
        "claim_ack_per_s": count / (t2 - t1),
        "end_to_end_per_s": count / (t2 - t0),
    }


async def bench_stream(world: PostgresWorld, rounds: int) -> dict[str, float]:
    chunk = secrets.token_bytes(64)
    latencies: list[float] = []
    writes: list[float] = []
    arrived = anyio.Event()
    started = 0.0

    async def reader() -> None:
        nonlocal arrived
        async for _ in world.stream.read("bench-stream"):
            latencies.append(time.perf_counter() - started)
            arrived.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        for n in range(rounds + 20):
            arrived = anyio.Event()
            started = time.perf_counter()
            await world.stream.write("bench-stream", [chunk])
            writes.append(time.perf_counter() - started)
            with anyio.fail_after(10):
                await arrived.wait()
            if n == 19:
                latencies.clear()  # warm-up done: the reader is subscribed and listening
                writes.clear()
        await world.stream.close("bench-stream")
    return {
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": _pct(latencies, 0.99) * 1e3,
        "mean_ms": statistics.fmean(latencies) * 1e3,
        # The write's own round trip (commit included): the floor of write-to-read latency.
        "write_p50_ms": statistics.median(writes) * 1e3,
    }


def _row(name: str, ours: str, theirs: str, ratio: str, target: str) -> str:
    return f"{name:<34}{ours:>14}{theirs:>16}{ratio:>9}  {target}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get(
            "WORLD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    parser.add_argument(
        "--append-only", action="store_true", help="only the append rows (no queue, no stream)"
    )
    args = parser.parse_args()
    quick = args.quick
    rounds = 300 if quick else 2000
    counts = {1: 300 if quick else 1500, 8: 600 if quick else 3000}
    logging.getLogger("procrastinate").setLevel(logging.WARNING)

    world = await connect(url=args.url, namespace=f"bench_{secrets.token_hex(4)}")
    results: dict[str, Any] = {}
    try:
        results["append"] = await bench_append(world, args.url, rounds)
        for workers, count in {} if args.append_only else counts.items():
            results[f"queue_{workers}"] = {
                "world": await bench_world_queue(world, workers, count),
                "world_batch": await bench_world_queue(world, workers, count, PGQUEUER_BATCH),
                "procrastinate": await bench_procrastinate(args.url, workers, count),
                "pgqueuer": await bench_pgqueuer(args.url, workers, count),
                "messages": count,
            }
        if not args.append_only:
            results["stream"] = await bench_stream(world, rounds // 4)
    finally:
        await world.purge()
        await world.aclose()

    results["load_average"] = os.getloadavg()  # the 1, 5 and 15 minute averages, at the end
    a = results["append"]
    print(_row("measure", "world", "peer/floor", "ratio", "target"))
    print(
        _row(
            "append 1 event, p50 (ms)",
            f"{a['append_p50_ms']:.3f}",
            f"{a['floor_p50_ms']:.3f}",
            f"{a['ratio_p50']:.2f}x",
            f"<= {TARGETS['append_ratio']}x floor",
        )
    )
    print(
        _row(
            "  its INSERT alone, raw driver, p50",
            f"{a['statement_p50_ms']:.3f}",
            f"{a['statement_floor_p50_ms']:.3f}",
            f"{a['statement_ratio_p50']:.2f}x",
            "the server's part",
        )
    )
    print(
        _row(
            "  client CPU per call, p50 (us)",
            f"{a['append_cpu_p50_us']:.0f}",
            f"{a['floor_cpu_p50_us']:.0f}",
            f"+{a['append_cpu_p50_us'] - a['floor_cpu_p50_us']:.0f}",
            "the client's part",
        )
    )
    print(
        _row(
            "append 1 event, mean (ms)",
            f"{a['append_mean_ms']:.3f}",
            f"{a['floor_mean_ms']:.3f}",
            f"{a['ratio_mean']:.2f}x",
            "",
        )
    )
    if args.append_only:
        results["targets_met"] = {"append": a["ratio_p50"] <= TARGETS["append_ratio"]}
        print(json.dumps(results, sort_keys=True))
        return
    for peer, ours_key in (("procrastinate", "world"), ("pgqueuer", "world_batch")):
        if ours_key == "world_batch":
            print(f"  (against PgQueuer: both claim up to {PGQUEUER_BATCH} messages a round trip)")
        for workers in counts:
            q = results[f"queue_{workers}"]
            for key, label in (
                ("enqueue_per_s", "enqueue"),
                ("claim_ack_per_s", "claim+ack"),
                ("end_to_end_per_s", "end to end"),
            ):
                ours, theirs = q[ours_key][key], q[peer][key]
                target = (
                    f">= {TARGETS[f'queue_8_vs_{peer}']}x {peer}"
                    if workers == 8 and key == "end_to_end_per_s"
                    else ""
                )
                print(
                    _row(
                        f"queue {workers} worker(s), {label} (msg/s)",
                        f"{ours:.0f}",
                        f"{theirs:.0f} {peer[:5]}",
                        f"{ours / theirs:.2f}x",
                        target,
                    )
                )
    s = results["stream"]
    print(_row("stream write->read p50 (ms)", f"{s['p50_ms']:.3f}", "", "", "< 3 ms"))
    print(_row("stream write->read p99 (ms)", f"{s['p99_ms']:.3f}", "", "", ""))
    print(_row("stream write call alone p50 (ms)", f"{s['write_p50_ms']:.3f}", "", "", ""))
    q8 = results["queue_8"]
    results["targets_met"] = {
        "append": a["ratio_p50"] <= TARGETS["append_ratio"],
        "queue_8": q8["world"]["end_to_end_per_s"] / q8["procrastinate"]["end_to_end_per_s"]
        >= TARGETS["queue_8_vs_procrastinate"],
        "queue_8_pgqueuer": q8["world_batch"]["end_to_end_per_s"]
        / q8["pgqueuer"]["end_to_end_per_s"]
        >= TARGETS["queue_8_vs_pgqueuer"],
        "stream": s["p50_ms"] < TARGETS["stream_p50_ms"],
    }
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    anyio.run(main)
