"""Step overhead of the durable journal, against its floor and DBOS Transact (not a test).

    uv run --group bench python benchmarks/bench_steps.py [--rounds R] [--steps S] [--json]
        [--postgres-url URL] [--redis-url URL] [--mongo-url URL] [--quick]

Two measures per store, side by side in one run:

* Per-step overhead: a turn of N no-op steps, N = 0, 1, 10, 100; per-step overhead =
  (T(N) - T(0)) / N, from the median of R rounds of each T. Our turn: ``Journal.open`` (one
  read), N tool steps, ``finish`` (one append). ``safe`` steps (the default) append nothing of
  their own: their outcomes ride with the next append (here the reply); ``safe-imm``
  (``defer_safe=False``) appends each outcome at once; ``never`` steps append the intent
  (committed before the call), then the outcome. DBOS: a workflow of N ``@DBOS.step()``
  no-ops (one checkpoint row per step), in a child process.
* The floor of a ``never`` step: its two durable commits done by the raw driver, each
  committed on its own with the World's durability, the same bytes as the step's intent and
  outcome. S times, in a random order each time (so the machine's load falls on all alike):
  the floor pair, the World's two ``log.append`` calls of those events (keyed, like the
  journal's), a *bare* step, one ``never`` step. ``never / floor`` is the target; ``world
  pair - floor`` is the backend's part of what remains, ``never - world pair`` the journal's
  (ids, JSON, events, cancel scopes); in wall time, and in this process's CPU time (the
  client's part, less moved by a loaded machine; a server's work is in its own process).
  The bare step is the least any journal step written in Python must do on this World: the
  arguments' digest (replay's identity check), a keyed intent record encoded as JSON and
  appended, the call, the outcome record encoded and appended; no shield, no deadline, no
  bookkeeping. ``bare / floor`` is how far the target is reachable at all on this store.

Stores and floors:

* ``postgres`` (127.0.0.1:5432, ``--postgres-url``): our World in a temporary namespace;
  floor: asyncpg INSERTs into a table of (log, seq, data), autocommit (each its own
  transaction and WAL flush). Peers: DBOS with a temporary system database (dropped after).
* ``redis`` (127.0.0.1:6379, ``--redis-url``): our World; floor: ``XADD`` through redis-py
  on the same server (the World writes with ``EVALSHA``; neither waits for a replica or an
  fsync beyond the server's own ``appendfsync``). No peer: DBOS does not run on Redis.
* ``local`` and ``turso``, on one temporary folder of the same disk: floors ``os.write`` +
  ``os.fsync`` of a file (what the local World's commit does), and libsql ``BEGIN
  IMMEDIATE`` / ``INSERT`` / ``COMMIT`` with WAL and ``synchronous=FULL`` (the turso World's
  settings), both on the caller's thread. Peer: DBOS on a SQLite file in that folder.
* ``mongo`` (only with ``--mongo-url`` or ``WORLD_TEST_MONGO_URL``, as ``.ci/with-servers``
  sets it): floor ``insert_one`` per event; the floor pairs only (at most 20). Labelled
  ``mongoeco`` when the server is mongoeco's wire server: those figures are not MongoDB's.

Targets (issue 17): ``never`` step <= 1.2x its floor on every store; ``safe`` step <= 0.05x
DBOS's per-step overhead on the same store; every step ahead of each peer (below 1.0x).
Timings on a shared machine are noisy: compare columns of one run, not runs (the load average
is printed). Bounded: a few minutes with the defaults; ``--quick`` takes seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import anyio

from world_core import (
    BackendUnavailableError,
    Client,
    Journal,
    NewEvent,
    Replay,
    World,
    canonical_json,
    list_worlds,
    open_world,
    tool,
)

SIZES = (0, 1, 10, 100)
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
FLOOR_WARMUP = 10  # pairs and steps measured first and dropped: connections, plans, caches
TARGET_NEVER_FLOOR = 1.2  # never step / its two raw commits
TARGET_SAFE_DBOS = 0.05  # safe step / DBOS's step
PEER_NAMES = {"dbos": "DBOS", "absurd": "Absurd"}
STORES = ("postgres", "redis", "local", "turso", "mongo")
SAME_DISK = {"local": "sqlite", "turso": "sqlite"}  # our embedded stores, DBOS's SQLite file


async def noop(i: int) -> int:
    """Do nothing."""
    return i


VARIANTS: dict[str, tuple[Replay, bool]] = {
    "safe": ("safe", True),  # the default: outcomes ride with the next append
    "safe-imm": ("safe", False),  # defer_safe=False: one append per step
    "never": ("never", True),  # intent, then outcome: two appends per step
}


class Floor(Protocol):
    """The raw driver committing one event, with the World's durability."""

    async def append(self, data: bytes) -> None: ...
    async def aclose(self) -> None: ...


class PostgresFloor:
    """asyncpg, autocommit: each INSERT its own transaction (and WAL flush at commit)."""

    def __init__(self, conn: Any, schema: str) -> None:
        self._conn, self._schema, self._seq = conn, schema, 0

    @classmethod
    async def open(cls, url: str) -> PostgresFloor:
        import asyncpg

        conn = await asyncpg.connect(url)
        schema = f"bench_floor_{secrets.token_hex(4)}"
        await conn.execute(f"CREATE SCHEMA {schema}")
        await conn.execute(
            f"CREATE TABLE {schema}.events (log_id text NOT NULL, seq bigint NOT NULL,"
            " data bytea NOT NULL, PRIMARY KEY (log_id, seq))"
        )
        return cls(conn, schema)

    async def append(self, data: bytes) -> None:
        self._seq += 1
        await self._conn.execute(
            f"INSERT INTO {self._schema}.events (log_id, seq, data) VALUES ($1, $2, $3)",
            "floor",
            self._seq,
            data,
        )

    async def aclose(self) -> None:
        try:
            await self._conn.execute(f"DROP SCHEMA IF EXISTS {self._schema} CASCADE")
        finally:
            await self._conn.close()


class RedisFloor:
    """redis-py's asyncio client: one XADD per event (the server's appendfsync applies)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._key = f"bench_floor:{{{secrets.token_hex(6)}}}"

    @classmethod
    async def open(cls, url: str) -> RedisFloor:
        import redis.asyncio

        return cls(redis.asyncio.from_url(url))

    async def append(self, data: bytes) -> None:
        await self._client.execute_command("XADD", self._key, "*", "d", data)

    async def aclose(self) -> None:
        try:
            await self._client.execute_command("DEL", self._key)
        finally:
            await self._client.aclose()


class FileFloor:
    """A file appended to and fsynced per event (the local World's commit), on this thread."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @classmethod
    async def open(cls, path: Path) -> FileFloor:
        return cls(path)

    async def append(self, data: bytes) -> None:
        os.write(self._fd, data)
        os.fsync(self._fd)

    async def aclose(self) -> None:
        os.close(self._fd)


class LibsqlFloor:
    """libsql with the turso World's settings (WAL, synchronous=FULL): BEGIN IMMEDIATE,
    INSERT, COMMIT per event, on this thread (no thread hop)."""

    def __init__(self, path: Path) -> None:
        import libsql

        self._conn: Any = libsql.connect(str(path), isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL").fetchall()
        self._conn.execute("PRAGMA synchronous=FULL").fetchall()
        self._conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, data BLOB)").fetchall()

    @classmethod
    async def open(cls, path: Path) -> LibsqlFloor:
        return cls(path)

    async def append(self, data: bytes) -> None:
        self._conn.execute("BEGIN IMMEDIATE").fetchall()
        self._conn.execute("INSERT INTO floor (data) VALUES (?)", (data,)).fetchall()
        self._conn.execute("COMMIT").fetchall()

    async def aclose(self) -> None:
        self._conn.close()


class MongoFloor:
    """pymongo's async client: one insert_one per event (the server's default write concern,
    as the World's)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._coll = client.get_default_database("world")[f"bench_floor_{secrets.token_hex(4)}"]

    @classmethod
    async def open(cls, url: str) -> MongoFloor:
        from pymongo import AsyncMongoClient

        return cls(AsyncMongoClient(url))

    async def append(self, data: bytes) -> None:
        await self._coll.insert_one({"d": data})

    async def aclose(self) -> None:
        try:
            await self._coll.drop()
        finally:
            await self._client.close()


async def _our_turn(world: World, session: str, n: int, variant: str) -> float:
    replay, defer = VARIANTS[variant]
    step = tool(noop, replay=replay)
    started = time.perf_counter()
    journal = await Journal.open(world, session, "t", defer_safe=defer)
    for i in range(n):
        await journal.call(step, {"i": i})
    await journal.finish("done")
    return time.perf_counter() - started


async def _turns(world: World, client: Client, rounds: int) -> dict[str, dict[int, float]]:
    """Median T(N) per variant."""
    times: dict[str, dict[int, list[float]]] = {variant: {} for variant in VARIANTS}
    for _ in range(rounds + 1):  # the first round warms up, and is dropped
        for variant in VARIANTS:
            for n in SIZES:
                # A session per turn: Journal.open reads the session's log, which must not
                # grow from one measurement to the next.
                session = f"bench-{secrets.token_hex(6)}"
                await client.submit(session, "go", turn_id="t")
                elapsed = await _our_turn(world, session, n, variant)
                times[variant].setdefault(n, []).append(elapsed)
    return {
        variant: {n: statistics.median(values[1:]) for n, values in per.items()}
        for variant, per in times.items()
    }


async def _floor_pairs(world: World, client: Client, floor: Floor, steps: int) -> dict[str, Any]:
    """``steps`` times in turn: the floor pair, the World's two appends, one never step."""
    step = tool(noop, replay="never")
    await client.submit("bench-floor", "go", turn_id="t")
    journal = await Journal.open(world, "bench-floor", "t")
    await journal.call(step, {"i": -1})
    # The bytes one never step appends (intent, outcome): the floor and the World write them.
    size = journal._appended_bytes // 2
    intent, outcome = b"i" * size, b"o" * size
    # Wall time, and this process's CPU time (less moved by other processes on a loaded
    # machine: the client's part; a server's work is in its own process). The three take
    # turns in a random order each time, so none is always the one after another (what runs
    # just before a commit changes what it costs).
    walls: dict[str, list[float]] = {"floor": [], "world": [], "bare": [], "never": []}
    cpus: dict[str, list[float]] = {what: [] for what in walls}
    order = random.Random(17)
    # The bare step's records: the least any journal step must append (the call's identity,
    # its key, its result), encoded for each step as the journal does.

    async def bare(i: int) -> None:
        arguments = {"i": i}
        digest = hashlib.sha256(canonical_json(arguments)).hexdigest()  # replay's identity check
        head = {"turn": "t", "step": i, "name": "noop", "digest": digest, "key": f"t/{i}"}
        await world.log.append(
            "bench-bare",
            [NewEvent(key=f"step/{i}/intent", data=canonical_json({"t": "intent", **head}))],
        )
        output = await noop(**arguments)
        body = {"t": "outcome", **head, "result": {"output": output}}
        await world.log.append(
            "bench-bare", [NewEvent(key=f"step/{i}/outcome", data=canonical_json(body))]
        )

    async def run(what: str, i: int) -> None:
        if what == "floor":
            await floor.append(intent)
            await floor.append(outcome)
        elif what == "world":
            await world.log.append("bench-pair", [NewEvent(key=f"step/{i}/intent", data=intent)])
            await world.log.append("bench-pair", [NewEvent(key=f"step/{i}/outcome", data=outcome)])
        elif what == "bare":
            await bare(i)
        else:
            await journal.call(step, {"i": i})

    for i in range(FLOOR_WARMUP + steps):
        for what in order.sample(list(walls), len(walls)):
            t0, c0 = time.perf_counter(), time.process_time()
            await run(what, i)
            t1, c1 = time.perf_counter(), time.process_time()
            if i >= FLOOR_WARMUP:
                walls[what].append(t1 - t0)
                cpus[what].append(c1 - c0)
    floor_us, pair_us, bare_us, never_us = (statistics.median(walls[w]) * 1e6 for w in walls)
    cpu_us = {what: round(statistics.median(values) * 1e6, 1) for what, values in cpus.items()}
    return {
        "event_bytes": size,
        "cpu_us": cpu_us,
        "floor_pair_us": round(floor_us, 1),
        "world_pair_us": round(pair_us, 1),
        "bare_us": round(bare_us, 1),
        "bare_over_floor": round(bare_us / floor_us, 3),
        "never_us": round(never_us, 1),
        "never_over_floor": round(never_us / floor_us, 3),
        "backend_us": round(pair_us - floor_us, 1),
        "journal_us": round(never_us - pair_us, 1),
    }


async def ours(
    world_name: str,
    url: str | None,
    open_floor: Callable[[], Awaitable[Floor]],
    rounds: int,
    steps: int,
) -> tuple[dict[str, dict[int, float]], dict[str, Any]]:
    """Median T(N) per variant (none when ``rounds`` is 0), and the never step against its
    floor, on a temporary namespace (purged after; the floor is closed)."""
    namespace = f"bench_{secrets.token_hex(4)}"
    async with open_world(world_name, url=url, namespace=namespace) as world:
        try:
            client = Client(world, queue="bench")
            medians = await _turns(world, client, rounds) if rounds else {}
            floor = await open_floor()
            try:
                return medians, await _floor_pairs(world, client, floor, steps)
            finally:
                await floor.aclose()
        finally:
            await world.purge()


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


def _mongo_label(url: str) -> str:
    """``mongoeco`` when the server is mongoeco's wire server (not MongoDB), else ``mongo``."""

    async def ask() -> str:
        from pymongo import AsyncMongoClient

        client: Any = AsyncMongoClient(url, serverSelectionTimeoutMS=5000)
        try:
            build = await client.admin.command("buildInfo")
        finally:
            await client.close()
        return "mongoeco" if build.get("gitVersion") == "mongoeco" else "mongo"

    return anyio.run(ask)


def _ratios(rows: list[dict[str, Any]], floors: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """never / floor per store; each of our steps against each peer on the same store (a
    peer is any row whose system is not ``world``; embedded stores meet DBOS's SQLite). Each
    ratio carries its two sides: ``ours`` and ``theirs`` (the floor or the peer, on
    ``peer_store``) in ``unit`` (``us`` for a never step and its floor, ``ms`` per step
    against a peer)."""
    ratios: list[dict[str, Any]] = []
    for store, floor in floors.items():
        value = floor["never_over_floor"]
        ratios.append(
            {
                "store": store,
                "what": "never / floor",
                "ratio": value,
                "ours": floor["never_us"],
                "theirs": floor["floor_pair_us"],
                "unit": "us",
                "target": TARGET_NEVER_FLOOR,
                "met": value <= TARGET_NEVER_FLOOR,
            }
        )
    for ours_row in rows:
        if ours_row["system"] != "world":
            continue
        store = ours_row["store"]
        for peer in rows:
            if peer["system"] == "world" or peer["store"] not in (store, SAME_DISK.get(store)):
                continue
            peer_ms = peer["per_step_ms"][100]
            if peer_ms <= 0:
                continue
            value = ours_row["per_step_ms"][100] / peer_ms
            target = 1.0  # ahead of the peer
            if ours_row["step"] == "safe" and peer["system"] == "dbos":
                target = TARGET_SAFE_DBOS
            ratios.append(
                {
                    "store": store,
                    "what": f"{ours_row['step']} / {peer['system']}",
                    "peer": peer["system"],
                    "peer_store": peer["store"],
                    "step": ours_row["step"],
                    "ratio": round(value, 3),
                    "ours": ours_row["per_step_ms"][100],
                    "theirs": peer_ms,
                    "unit": "ms",
                    "target": target,
                    "met": value <= target if target != 1.0 else value < 1.0,
                }
            )
    return ratios


def _ahead(ratios: list[dict[str, Any]]) -> list[str]:
    """Per store with peers: whether each of our steps is ahead of every peer (per-step
    overhead, N=100). A peer's step checkpoints once, after the call, like ``safe-imm``;
    ``never`` commits twice (its intent before the call)."""
    lines: list[str] = []
    stores = dict.fromkeys(r["store"] for r in ratios if "peer" in r)
    for store in stores:
        mine = [r for r in ratios if r["store"] == store and "peer" in r]
        peers = sorted({PEER_NAMES.get(r["peer"], r["peer"]) for r in mine})
        verdicts = []
        for step in VARIANTS:
            of_step = [r for r in mine if r["step"] == step]
            if of_step:
                met = all(r["ratio"] < 1.0 for r in of_step)
                verdicts.append(f"{step} {'met' if met else 'NOT met'}")
        lines.append(
            f"  {store:<9}ahead of {' and '.join(peers)} on step overhead: {', '.join(verdicts)}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="never steps against the floor")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("WORLD_BENCH_POSTGRES_URL", PG_URL)
    )
    parser.add_argument("--redis-url", default=os.environ.get("WORLD_TEST_REDIS_URL", REDIS_URL))
    parser.add_argument(
        "--mongo-url",
        default=os.environ.get("WORLD_TEST_MONGO_URL"),
        help="the mongo World runs only with one (default: WORLD_TEST_MONGO_URL)",
    )
    parser.add_argument(
        "--stores",
        default=",".join(STORES),
        help=f"a comma-separated subset of {','.join(STORES)} (mongo needs --mongo-url too)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one round: a smoke run")
    parser.add_argument("--dbos-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    stores = set(args.stores.split(","))
    if not stores <= set(STORES):
        parser.error(f"--stores takes names from {','.join(STORES)}, got {args.stores!r}")
    if args.quick:
        args.rounds, args.steps = 1, 10
    if args.dbos_child:
        _dbos_child(os.environ["WORLD_BENCH_DBOS_URL"], args.rounds)
        return 0

    installed = {entry.name for entry in list_worlds()}
    folder = Path(tempfile.mkdtemp(prefix="bench-steps-"))
    rows: list[dict[str, Any]] = []
    floors: dict[str, dict[str, Any]] = {}

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

    def measure(
        store: str,
        world_name: str,
        url: str | None,
        floor: Callable[[], Awaitable[Floor]],
        rounds: int = args.rounds,
        steps: int = args.steps,
    ) -> None:
        medians, floors[store] = anyio.run(ours, world_name, url, floor, rounds, steps)
        if medians:
            report(store, "world", medians)

    try:
        if "postgres" not in stores:
            pass
        elif "postgres" in installed:
            database = f"bench_dbos_{secrets.token_hex(4)}"
            base = args.postgres_url.rsplit("/", 1)[0]
            try:
                measure(
                    "postgres",
                    "postgres",
                    args.postgres_url,
                    partial(PostgresFloor.open, args.postgres_url),
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
            print("postgres World not installed: skipping PostgreSQL", file=sys.stderr)
        if "redis" not in stores:
            pass
        elif "redis" in installed:
            try:
                measure("redis", "redis", args.redis_url, partial(RedisFloor.open, args.redis_url))
            except BackendUnavailableError as exc:
                print(f"redis at --redis-url unreachable ({exc}): skipping", file=sys.stderr)
        else:
            print("redis World not installed: skipping Redis", file=sys.stderr)
        if "local" in stores:
            local = str(folder / "local")
            measure("local", "local", local, partial(FileFloor.open, folder / "floor.bin"))
        if "turso" not in stores:
            pass
        elif "turso" in installed:
            turso = f"file:{folder / 'turso.db'}"
            measure("turso", "turso", turso, partial(LibsqlFloor.open, folder / "floor.db"))
        else:
            print("turso World not installed: skipping Turso", file=sys.stderr)
        if stores & {"local", "turso"}:
            sqlite = f"sqlite:///{folder / 'dbos.sqlite'}"
            report("sqlite", "dbos", {"step": dbos(sqlite, args.rounds)})
        if "mongo" in stores and args.mongo_url and "mongo" in installed:
            label = _mongo_label(args.mongo_url)  # mongoeco: not MongoDB's figures
            # The floor pairs only, few of them: mongoeco slows down as collections grow, and
            # has no peer here to compare per-step overheads with.
            floor = partial(MongoFloor.open, args.mongo_url)
            measure(label, "mongo", args.mongo_url, floor, 0, min(args.steps, 20))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    ratios = _ratios(rows, floors)
    load = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        result = {"rounds": args.rounds, "steps": args.steps, "load": load}
        print(json.dumps({**result, "rows": rows, "floors": floors, "ratios": ratios}))
        return 0
    print(f"\nper-step overhead, ms = (T(N) - T(0)) / N; medians of {args.rounds} rounds")
    print(
        f"{'store':<10}{'system':<8}{'step':<9}{'T(0) ms':>9}"
        + "".join(f"{'N=' + str(n):>9}" for n in SIZES if n)
    )
    for row in rows:
        cells = "".join(f"{row['per_step_ms'][n]:>9.3f}" for n in SIZES if n)
        print(
            f"{row['store']:<10}{row['system']:<8}{row['step']:<9}{row['turn_ms'][0]:>9.2f}{cells}"
        )
    print(f"\nnever step against its floor (two raw commits), medians of {args.steps}, us")
    print(
        f"{'store':<10}{'bytes':>6}{'floor':>9}{'world 2x':>10}{'bare':>7}{'never':>9}"
        f"{'bare/floor':>12}{'never/floor':>13}{'backend':>9}{'journal':>9}"
    )
    for store, f in floors.items():
        print(
            f"{store:<10}{f['event_bytes']:>6}{f['floor_pair_us']:>9.0f}{f['world_pair_us']:>10.0f}"
            f"{f['bare_us']:>7.0f}{f['never_us']:>9.0f}{f['bare_over_floor']:>11.2f}x"
            f"{f['never_over_floor']:>12.2f}x{f['backend_us']:>9.0f}{f['journal_us']:>9.0f}"
        )
    print("  backend = world 2x - floor; journal = never - world 2x")
    print("  bare = two minimal records, each encoded and appended per step, and the call")
    print("\nthis process's CPU time for the same, medians, us (the client's part of each)")
    print(f"{'store':<10}{'floor':>9}{'world 2x':>10}{'bare':>7}{'never':>9}{'journal':>9}")
    for store, f in floors.items():
        cpu = f["cpu_us"]
        print(
            f"{store:<10}{cpu['floor']:>9.0f}{cpu['world']:>10.0f}{cpu['bare']:>7.0f}"
            f"{cpu['never']:>9.0f}{cpu['never'] - cpu['world']:>9.0f}"
        )
    print("\nratios (targets of issue 17; steps against peers: per-step overhead at N=100):")
    for item in ratios:
        verdict = "met" if item["met"] else "NOT met"
        bound = f"< {item['target']}" if item["target"] == 1.0 else f"<= {item['target']}"
        print(
            f"  {item['store']:<9}{item['what']:<18}{item['ratio']:>7.2f}x  "
            f"(target {bound}x: {verdict})"
        )
    for line in _ahead(ratios):
        print(line)
    if any(store == "mongoeco" for store in floors):
        print("mongoeco: the figures of mongoeco's wire server, not of MongoDB")
    print(f"load average: {load[0]} {load[1]} {load[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
