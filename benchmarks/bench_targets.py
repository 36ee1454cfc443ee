"""Every target row of issue 17 with its floor or peer, in one run (not a test).

    .ci/with-servers uv run --group bench python benchmarks/bench_targets.py [--quick]
        [--postgres-url URL] [--redis-url URL] [--mongo-url URL] [--memory-turns N]
        [--scale-duration S] [--skip-scale]

(``make bench-targets`` runs it under ``.ci/with-servers``.) Nothing is measured here: each
stage runs the benchmark script that owns the measure, as a subprocess with ``--json`` or by
calling its functions, then one table is printed, one row a target and backend, with the
1-minute load average when that row was measured, and one JSON line. In order:

1. ``bench_steps.py --json``, on postgres, redis, local, turso (and mongo when its URL is
   given: mongoeco's wire server, labelled as not MongoDB): a ``never`` step against its two
   raw appends (<= 1.2x), a ``safe`` step against DBOS's step (<= 0.05x), and each of our
   steps (``safe``, ``safe-imm``, ``never``) ahead of DBOS (postgres; DBOS on SQLite for local
   and turso) and of Absurd (postgres).
2. ``bench_postgres.py``'s ``bench_append`` (the append's p50 against a raw INSERT's, <=
   1.15x) and its 8-worker queue end to end, both batching 10 a round trip, against PgQueuer
   (>= 1.5x).
3. ``bench_redis.py``'s 8-worker-process queue (>= 10,000 msg/s), with saq in the same layout
   alongside (ours twice around saq, the median; once with ``--quick``).
4. ``bench_scale.py --memory N --json`` on local, postgres, redis, turso: a worker's RSS at
   N/10 turns against at N (N = 10,000): flat means at most 1.1x.
5. ``bench_scale.py --json`` (unless ``--skip-scale``): 1k, 10k and 50k sessions at one step a
   minute per backend, ``--scale-duration`` seconds a row (60): sustained against offered
   steps/s, append and turn p50/p99, and the limit each backend hits first.

Then the profile of what remains: per store, a ``never`` step's gap to its floor split into the
backend's part and the journal's, with what a bare step costs (the least any journal step
must do, see ``bench_steps.py``), and the Postgres append's statement and client CPU.

``--quick`` makes every stage a smoke run (a couple of minutes in all: CI's ``make
bench-quick`` runs it). A stage that fails is reported and the others still run; the exit
status is then 1. Timings on a shared machine are noisy: read the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from _targets import (
    MONGOECO,
    Row,
    first_limits,
    memory_rows,
    postgres_append_row,
    queue_row,
    scale_rows,
    steps_rows,
    table,
)
from bench_scale import print_table, server_url_options
from smoke import last_json

HERE = Path(__file__).resolve().parent
EMBEDDED_AND_SERVERS = "local,postgres,redis,turso"


def load() -> float:
    """The 1-minute load average now."""
    return round(os.getloadavg()[0], 2)


def script_json(name: str, *argv: str) -> Any:
    """Run ``benchmarks/<name>`` with ``argv`` (its progress on our stderr) and return the JSON
    its output ends with."""
    command = [sys.executable, str(HERE / name), *argv]
    print(f"  {name} {' '.join(argv)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    value = last_json(done.stdout)
    if done.returncode != 0 or not isinstance(value, dict):
        raise RuntimeError(
            f"{name} exited {done.returncode}; its output's end:\n{done.stdout[-1500:]}"
        )
    return value


async def postgres_stage(url: str, quick: bool) -> list[Row]:
    """The append against the raw INSERT, then 8 workers against PgQueuer, on one server."""
    from bench_postgres import (
        PGQUEUER_BATCH,
        TARGETS,
        bench_append,
        bench_pgqueuer,
        bench_world_queue,
    )

    from world_postgres import connect

    rounds, messages = (300, 600) if quick else (2000, 3000)  # bench_postgres.py's own sizes
    world = await connect(url=url, namespace=f"bench_{secrets.token_hex(4)}")
    try:
        append = await bench_append(world, url, rounds)
        rows = [postgres_append_row(append, TARGETS["append_ratio"], load())]
        ours = await bench_world_queue(world, 8, messages, PGQUEUER_BATCH)
        theirs = await bench_pgqueuer(url, 8, messages)
    finally:
        await world.purge()
        await world.aclose()
    rows.append(
        queue_row(
            f"Postgres queue, 8 workers, end to end ({PGQUEUER_BATCH} a round trip)",
            "postgres",
            ours["end_to_end_per_s"],
            "PgQueuer",
            theirs["end_to_end_per_s"],
            at_least_ratio=TARGETS["queue_8_vs_pgqueuer"],
            load=load(),
        )
    )
    rows[0].reference += f" (statement alone {append['statement_ratio_p50']:.2f}x its floor)"
    return rows


async def redis_stage(url: str, quick: bool) -> list[Row]:
    """8 worker processes, ours then saq then ours again (once with ``quick``)."""
    from bench_redis import TARGETS, bench_queue_processes, bench_saq_processes

    from world_redis import connect

    scale = 0.2 if quick else 1.0  # bench_redis.py's own sizes
    world = await connect(url=url, namespace=f"bench_{secrets.token_hex(4)}")

    async def ours() -> float:
        run = await anyio.to_thread.run_sync(
            lambda: bench_queue_processes(
                url, world.namespace, 8, int(20000 * scale), concurrent=True
            )
        )
        return run["per_s"]

    try:
        rates = [await ours()]
        saq = await bench_saq_processes(url, 8, int(4000 * scale))
        if not quick:
            rates.append(await ours())
    finally:
        await world.purge()
        await world.aclose()
    return [
        queue_row(
            "Redis queue, 8 worker processes, end to end",
            "redis",
            statistics.median(rates),
            "saq",
            saq["per_s"],
            at_least_rate=TARGETS["queue_8_per_s"],
            load=load(),
        )
    ]


def remains(steps: dict[str, Any] | None) -> list[str]:
    """What remains between each store's ``never`` step and its floor, split in two."""
    lines: list[str] = []
    for store, f in (steps or {}).get("floors", {}).items():
        journal_cpu = f["cpu_us"]["never"] - f["cpu_us"]["world"]
        lines.append(
            f"  {store:<9} never {f['never_us']:>7.0f} us = floor {f['floor_pair_us']:>6.0f}"
            f" + backend {f['backend_us']:>6.0f} (the World's two appends - the floor)"
            f" + journal {f['journal_us']:>5.0f} (its CPU {journal_cpu:.0f});"
            f" a bare step {f['bare_us']:.0f} ({f['bare_over_floor']:.2f}x the floor)"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of every stage")
    server_url_options(parser)  # mongo's rows run only with a --mongo-url
    parser.add_argument("--memory-turns", type=int, default=10_000, help="turns of the RSS row")
    parser.add_argument("--scale-duration", type=float, default=60.0, help="seconds a scale row")
    parser.add_argument("--skip-scale", action="store_true", help="no scale run")
    args = parser.parse_args()
    if args.memory_turns < 10 or args.scale_duration <= 0:
        parser.error("--memory-turns must be at least 10 and --scale-duration above 0")
    quick = ["--quick"] if args.quick else []
    urls = ["--postgres-url", args.postgres_url, "--redis-url", args.redis_url]
    mongo = ["--mongo-url", args.mongo_url] if args.mongo_url else []
    started, load_start = time.monotonic(), os.getloadavg()
    rows: list[Row] = []
    failed: list[str] = []
    steps: dict[str, Any] | None = None
    scale: dict[str, Any] | None = None

    def stage(name: str, run: Any) -> Any:
        print(f"{name} ... (load {load()})", file=sys.stderr, flush=True)
        try:
            return run()
        except Exception as exc:  # reported with the table; the other stages still run
            print(f"{name} failed: {exc!r}", file=sys.stderr, flush=True)
            failed.append(f"{name}: {exc!r}"[:300])
            return None

    stores = ["--stores", f"{EMBEDDED_AND_SERVERS},mongo"]
    steps = stage(
        "steps", lambda: script_json("bench_steps.py", "--json", *stores, *urls, *mongo, *quick)
    )
    rows += steps_rows(steps) if steps else []
    rows += (
        stage("postgres", lambda: anyio.run(postgres_stage, args.postgres_url, args.quick)) or []
    )
    rows += stage("redis", lambda: anyio.run(redis_stage, args.redis_url, args.quick)) or []
    turns = ["--memory", str(args.memory_turns), "--world", EMBEDDED_AND_SERVERS]
    memory = stage("memory", lambda: script_json("bench_scale.py", *turns, *urls, "--json", *quick))
    rows += memory_rows(memory) if memory else []
    if not args.skip_scale:
        worlds = EMBEDDED_AND_SERVERS + (",mongo" if args.mongo_url else "")
        duration = ["--duration", str(args.scale_duration)]
        scale = stage(
            "scale",
            lambda: script_json(
                "bench_scale.py", "--world", worlds, *duration, *urls, *mongo, "--json", *quick
            ),
        )
        rows += scale_rows(scale) if scale else []

    mode = "--quick: a smoke run, not figures" if args.quick else "full"
    if args.skip_scale:
        mode += ", no scale run (--skip-scale)"
    print(
        f"\nissue 17's targets, one run ({mode}), {os.cpu_count()} cores;"
        " load = the 1-minute load average when the row was measured"
    )
    print(table(rows))
    if scale:
        print("\nscale run (sustained steps/s, append p50/p99 ms, turn p50/p99 ms):")
        print_table(scale["rows"])
        print("limit hit first:")
        for backend, limit in first_limits(scale).items():
            print(f"  {backend:<9} {limit}")
    print("\nwhat remains between a never step and its floor, medians (us):")
    print("\n".join(remains(steps)) or "  (no steps stage)")
    if any(row.backend == MONGOECO for row in rows):
        print("mongoeco: the figures of mongoeco's wire server, not of MongoDB")
    for why in failed:
        print(f"FAILED {why}")
    seconds = round(time.monotonic() - started, 1)
    print(f"{seconds} s; load average {load_start[0]:.2f} at the start, {load()} at the end")
    result = {
        "quick": args.quick,
        "seconds": seconds,
        "load_start": [round(v, 2) for v in load_start],
        "load_end": [round(v, 2) for v in os.getloadavg()],
        "rows": [row.as_dict() for row in rows],
        "limits": first_limits(scale) if scale else {},
        "floors": (steps or {}).get("floors", {}),
        "failed": failed,
    }
    print(json.dumps(result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
