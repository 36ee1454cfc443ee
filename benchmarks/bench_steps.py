"""Step overhead of the durable journal, side by side with DBOS Transact (not a test).

    uv run --group bench python benchmarks/bench_steps.py [--rounds R] [--json]

A turn of N no-op steps, N = 0, 1, 10, 100; per-step overhead = (T(N) - T(0)) / N, from the
median of R rounds of each T. Our turn: ``Journal.open`` (one read), N tool steps, ``finish``
(one append). ``safe`` steps (the default) append nothing of their own: their outcomes ride
with the next append (here the reply); ``safe-imm`` (``defer_safe=False``) appends each outcome
at once; ``never`` steps append the intent (committed before the call), then the outcome.
DBOS: a workflow of N ``@DBOS.step()`` no-ops (one checkpoint row per step), in a child
process.

Pairs on the same store:

* PostgreSQL (127.0.0.1:5432, or ``--postgres-url``): our ``postgres`` World in a temporary
  namespace (schema, dropped after) vs DBOS with a temporary system database (dropped after).
* Embedded, on one temporary folder of the same disk: our ``local`` World and our ``turso``
  World (a libSQL file) vs DBOS on a SQLite file.

Targets (issue 7): safe <= 0.3x DBOS's per-step overhead, never <= 0.6x, on the same database.
Timings on a shared machine are noisy: compare columns of one run, not runs. Bounded: about a
minute with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from world_core import Client, Journal, Replay, World, list_worlds, open_world, tool

SIZES = (0, 1, 10, 100)
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


async def noop(i: int) -> int:
    """Do nothing."""
    return i


VARIANTS: dict[str, tuple[Replay, bool]] = {
    "safe": ("safe", True),  # the default: outcomes ride with the next append
    "safe-imm": ("safe", False),  # defer_safe=False: one append per step
    "never": ("never", True),  # intent, then outcome: two appends per step
}


async def _our_turn(world: World, session: str, n: int, variant: str) -> float:
    replay, defer = VARIANTS[variant]
    step = tool(noop, replay=replay)
    started = time.perf_counter()
    journal = await Journal.open(world, session, "t", defer_safe=defer)
    for i in range(n):
        await journal.call(step, {"i": i})
    await journal.finish("done")
    return time.perf_counter() - started


async def ours(world_name: str, url: str | None, rounds: int) -> dict[str, dict[int, float]]:
    """Median T(N) per replay label, on a temporary namespace (purged after)."""
    namespace = f"bench_{secrets.token_hex(4)}"
    times: dict[str, dict[int, list[float]]] = {variant: {} for variant in VARIANTS}
    async with open_world(world_name, url=url, namespace=namespace) as world:
        try:
            client = Client(world, queue="bench")
            counter = 0
            for _ in range(rounds + 1):  # the first round warms up, and is dropped
                for variant in VARIANTS:
                    for n in SIZES:
                        # A session per turn: Journal.open reads the session's log, which
                        # must not grow from one measurement to the next.
                        counter += 1
                        session = f"bench-{counter}"
                        await client.submit(session, "go", turn_id="t")
                        elapsed = await _our_turn(world, session, n, variant)
                        times[variant].setdefault(n, []).append(elapsed)
        finally:
            await world.purge()
    return {
        replay: {n: statistics.median(values[1:]) for n, values in per.items()}
        for replay, per in times.items()
    }


def _dbos_child(url: str, rounds: int) -> None:
    """Run in a child process: median T(N) of DBOS workflows of N no-op steps."""
    from dbos import DBOS

    config: Any = {"name": "bench-steps", "system_database_url": url, "log_level": "ERROR"}
    DBOS(config=config)

    @DBOS.step()
    def step(i: int) -> int:
        return i

    @DBOS.workflow()
    def turn(n: int) -> str:
        for i in range(n):
            step(i)
        return "done"

    DBOS.launch()
    times: dict[int, list[float]] = {}
    for _ in range(rounds + 1):
        for n in SIZES:
            started = time.perf_counter()
            turn(n)
            times.setdefault(n, []).append(time.perf_counter() - started)
    DBOS.destroy()
    medians = {n: statistics.median(values[1:]) for n, values in times.items()}
    print(json.dumps(medians))


def dbos(url: str, rounds: int) -> dict[int, float]:
    # The URL goes by environment, not argv: a password would show in the process list.
    command = [sys.executable, __file__, "--dbos-child", "--rounds", str(rounds)]
    env = {**os.environ, "WORLD_BENCH_DBOS_URL": url}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"DBOS child failed:\n{done.stderr[-3000:]}")
    last = done.stdout.strip().splitlines()[-1]
    return {int(n): t for n, t in json.loads(last).items()}


def per_step(medians: dict[int, float]) -> dict[int, float]:
    """(T(N) - T(0)) / N in milliseconds, for N > 0."""
    return {n: (medians[n] - medians[0]) / n * 1000 for n in SIZES if n}


def _pg_admin(url: str, sql: str) -> None:
    async def run() -> None:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--postgres-url", default=os.environ.get("WORLD_BENCH_POSTGRES_URL", PG_URL)
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one round: a smoke run")
    parser.add_argument("--dbos-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    if args.dbos_child:
        _dbos_child(os.environ["WORLD_BENCH_DBOS_URL"], args.rounds)
        return 0

    installed = {entry.name for entry in list_worlds()}
    folder = Path(tempfile.mkdtemp(prefix="bench-steps-"))
    rows: list[dict[str, Any]] = []

    def report(store: str, who: str, medians: dict[str, dict[int, float]]) -> None:
        for label, values in medians.items():
            rows.append(
                {
                    "store": store,
                    "system": who,
                    "step": label,
                    "turn_ms": {n: round(t * 1000, 3) for n, t in values.items()},
                    "per_step_ms": {n: round(v, 3) for n, v in per_step(values).items()},
                }
            )
        print(f"  measured {who} on {store}", file=sys.stderr, flush=True)

    try:
        if "postgres" in installed:
            database = f"bench_dbos_{secrets.token_hex(4)}"
            base = args.postgres_url.rsplit("/", 1)[0]
            try:
                report(
                    "postgres", "world", anyio.run(ours, "postgres", args.postgres_url, args.rounds)
                )
                _pg_admin(args.postgres_url, f'CREATE DATABASE "{database}"')
                report("postgres", "dbos", {"step": dbos(f"{base}/{database}", args.rounds)})
                # Absurd (absurd-sdk): spawn, claim, N checkpointed steps, complete; in a
                # temporary database of its own (benchmarks/_absurd_peer.py says why that way).
                from _absurd_peer import absurd_medians

                absurd = anyio.run(absurd_medians, args.postgres_url, args.rounds, SIZES)
                report("postgres", "absurd", {"step": absurd})
            finally:
                _pg_admin(args.postgres_url, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        else:
            print("postgres World not installed: skipping the PostgreSQL pair", file=sys.stderr)
        report("file", "world local", anyio.run(ours, "local", str(folder / "local"), args.rounds))
        if "turso" in installed:
            turso = f"file:{folder / 'turso.db'}"
            report("file", "world turso", anyio.run(ours, "turso", turso, args.rounds))
        sqlite = f"sqlite:///{folder / 'dbos.sqlite'}"
        report("file", "dbos sqlite", {"step": dbos(sqlite, args.rounds)})
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def overhead(store: str, system: str, step: str) -> float | None:
        for row in rows:
            if (row["store"], row["system"], row["step"]) == (store, system, step):
                value: float = row["per_step_ms"][100]
                return value
        return None

    ratios: list[dict[str, Any]] = []
    pairs = [("postgres", "world", "dbos"), ("file", "world local", "dbos sqlite")]
    pairs.append(("file", "world turso", "dbos sqlite"))
    for store, ours_name, peer in pairs:
        peer_value = overhead(store, peer, "step")
        for step, target in (("safe", 0.3), ("safe-imm", 0.3), ("never", 0.6)):
            value = overhead(store, ours_name, step)
            if value is None or peer_value is None or peer_value <= 0:
                continue
            ratio = value / peer_value
            ratios.append(
                {
                    "store": store,
                    "system": ours_name,
                    "step": step,
                    "ratio_to_dbos": round(ratio, 3),
                    "target": target,
                    "met": ratio <= target,
                }
            )
    if args.json:
        print(json.dumps({"rounds": args.rounds, "rows": rows, "ratios": ratios}, indent=2))
        return 0
    print(f"\nper-step overhead, ms = (T(N) - T(0)) / N; medians of {args.rounds} rounds")
    print(
        f"{'store':<10}{'system':<14}{'step':<9}{'T(0) ms':>9}"
        + "".join(f"{'N=' + str(n):>9}" for n in SIZES if n)
    )
    for row in rows:
        cells = "".join(f"{row['per_step_ms'][n]:>9.3f}" for n in SIZES if n)
        print(
            f"{row['store']:<10}{row['system']:<14}{row['step']:<9}{row['turn_ms'][0]:>9.2f}{cells}"
        )
    print("\nratio to DBOS on the same store (N=100):")
    for item in ratios:
        verdict = "met" if item["met"] else "NOT met"
        print(
            f"  {item['store']:<9}{item['system']:<13}{item['step']:<9}"
            f"{item['ratio_to_dbos']:>6.2f}x  (target <= {item['target']}x: {verdict})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
