"""Scale run: many agent sessions at one step a minute, simulated on one machine (not a test).

    .ci/with-servers uv run --group bench python benchmarks/bench_scale.py \
        [--world local,postgres,redis,turso] [--sessions 1000,10000,50000] \
        [--processes 2] [--per-process 250] [--duration 60] [--model-latency 0.5] [--json]

The seed's back-of-envelope: 50,000 concurrent agent runs, each doing one step a minute, are
about 830 steps/s and 1,700 appends/s. Here a turn is three steps (the model asks for a tool,
a ``safe`` tool runs, the model replies), so a session doing one step a minute submits a turn
every three minutes: S active sessions offer S / 180 turns/s (278 turns/s, 833 steps/s, at
50,000). Per World and per session count, for ``--duration`` seconds:

* a driver process submits turns to random sessions among S at that rate (open loop, Poisson
  arrivals) with :class:`world_core.Client`;
* ``--processes`` worker processes each run ``--per-process`` :class:`world_core.Worker` loops
  concurrently; the model is scripted and sleeps ``--model-latency`` seconds per call
  (uniformly jittered +-50 %), as a hosted model would;
* a probe appends one 256-byte event every 20 ms to a log of its own and times it: the store's
  append latency under that load.

Reported per row: offered and sustained steps/s (turns finished within the window, times 3),
append p50/p99 (probe), turn latency p50/p99 (submit to reply), the workers' resident memory
at start and end, CPU seconds of workers / driver / server, and the limit hit first: the turn
backlog grows (offered > sustained) while the workers' CPU is saturated (Python), the store's
append latency explodes (the backend), or neither (the run kept up).

``--memory N`` instead runs N turns (no model latency) through one worker process, sampling
its resident memory every N/10 turns: flat means no growth per turn or per session.

Timings on a shared 2-core machine are noisy; the shape (where each backend saturates) is the
result, not the third digit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from world_core import (
    Agent,
    Client,
    Journal,
    ModelReply,
    ModelRequest,
    NewEvent,
    ToolCall,
    ToolRegistry,
    Worker,
    open_world,
    tool,
)

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
STEPS_PER_TURN = 3
QUEUE = "scale"


def lookup(topic: str) -> str:
    """The agent's one tool: ``safe``, instant."""
    return f"notes on {topic}"


class _SlowModel:
    """Asks for ``lookup`` once, then replies; each call takes about ``latency`` seconds."""

    def __init__(self, latency: float, rng: random.Random) -> None:
        self._latency = latency
        self._rng = rng

    async def complete(self, request: ModelRequest) -> ModelReply:
        if self._latency > 0:
            await anyio.sleep(self._latency * self._rng.uniform(0.5, 1.5))
        if request.messages[-1]["role"] == "tool":
            return ModelReply(content="done", usage={"prompt_tokens": 40, "completion_tokens": 2})
        call = ToolCall(id="call_0", name="lookup", arguments='{"topic": "scale"}')
        return ModelReply(tool_calls=[call], usage={"prompt_tokens": 30, "completion_tokens": 8})


class _TimedAgent:
    """The agent, noting when each turn it finished ended (wall clock, shared by processes)."""

    def __init__(self, agent: Agent, done: list[tuple[str, str, float]]) -> None:
        self._agent = agent
        self._done = done

    async def run_turn(self, journal: Journal) -> str:
        reply = await self._agent.run_turn(journal)
        self._done.append((journal.session_id, journal.turn_id, time.time()))
        return reply


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def _server_pids(world: str) -> list[int]:
    names = {"postgres": "postgres", "redis": "redis-server"}.get(world)
    if names is None:
        return []
    done = subprocess.run(["pgrep", "-x", names], capture_output=True, text=True, check=False)
    return [int(pid) for pid in done.stdout.split()]


# --- worker process --------------------------------------------------------------------------


async def worker_child(
    world: str, url: str, namespace: str, loops: int, latency: float, out: str
) -> None:
    """Run ``loops`` Worker loops until the stop file appears; write what finished to ``out``."""
    done: list[tuple[str, str, float]] = []
    rng = random.Random(os.getpid())
    agent = Agent(model=_SlowModel(latency, rng), tools=ToolRegistry([tool(lookup, replay="safe")]))
    timed = _TimedAgent(agent, done)
    stop = anyio.Event()
    stop_file = anyio.Path(out + ".stop")

    async def run(worker: Worker) -> None:
        await worker.run(stop=stop, signals=False)

    async with (
        open_world(world, url=url, namespace=namespace) as opened,
        anyio.create_task_group() as tg,
    ):
        for n in range(loops):
            name = f"w{os.getpid()}-{n}"
            tg.start_soon(run, Worker(opened, timed, queue=QUEUE, name=name, crash=None))
        await anyio.Path(out + ".ready").touch()
        while not await stop_file.exists():  # noqa: ASYNC110  (another process makes it)
            await anyio.sleep(0.1)
        stop.set()
    report = {"done": done, "rss_kib": _rss_kib(os.getpid())}
    await anyio.Path(out).write_text(json.dumps(report))


# --- driver ------------------------------------------------------------------------------------


async def _probe(world: Any, until: float, samples: list[float]) -> None:
    log = f"probe-{secrets.token_hex(4)}"
    data = secrets.token_bytes(256)
    while time.monotonic() < until:
        started = time.perf_counter()
        await world.log.append(log, [NewEvent(data=data)])
        samples.append(time.perf_counter() - started)
        await anyio.sleep(0.02)


def _start_workers(
    args: argparse.Namespace, world: str, url: str, namespace: str, outs: list[str]
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for out in outs:
        argv = [sys.executable, __file__, "--worker-child", world, url, namespace, out]
        argv += ["--per-process", str(args.per_process)]
        argv += ["--model-latency", str(args.model_latency)]
        procs.append(subprocess.Popen(argv))
    return procs


def _wait_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.wait(timeout=120)


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _pct(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_row(args: argparse.Namespace, world: str, url: str, sessions: int) -> dict[str, Any]:
    """One World, one session count: the row of the table."""
    namespace = f"scale_{secrets.token_hex(4)}"
    folder = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    offered_turns = sessions / (60.0 * STEPS_PER_TURN)
    procs: list[subprocess.Popen[bytes]] = []
    outs = [str(folder / f"worker-{n}.json") for n in range(args.processes)]
    try:
        async with open_world(world, url=url, namespace=namespace) as opened:
            procs += _start_workers(args, world, url, namespace, outs)
            deadline = time.monotonic() + 60
            while not all([await anyio.Path(out + ".ready").exists() for out in outs]):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"worker processes did not start on {world}")
                await anyio.sleep(0.1)
            pids = [p.pid for p in procs]
            rss_start = [_rss_kib(pid) for pid in pids]
            server = _server_pids(world)
            cpu0 = (_cpu_seconds(pids), time.process_time(), _cpu_seconds(server))
            client = Client(opened, queue=QUEUE)
            submitted: dict[tuple[str, str], float] = {}
            probe: list[float] = []
            rng = random.Random(1)
            started = time.monotonic()
            wall_started = time.time()
            until = started + args.duration
            count = 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(_probe, opened, until, probe)
                next_at = started
                while True:
                    next_at += rng.expovariate(offered_turns)
                    if next_at >= until:
                        break
                    await anyio.sleep(max(0.0, next_at - time.monotonic()))
                    session = f"s{rng.randrange(sessions)}"
                    count += 1
                    turn = f"t{count}"
                    submitted[(session, turn)] = time.time()
                    tg.start_soon(partial(client.submit, session, "hello", turn_id=turn))
            window_end = time.time()
            # Let turns in flight finish (bounded), then stop the workers.
            await anyio.sleep(min(10.0, args.model_latency * 4 + 2))
            cpu1 = (_cpu_seconds(pids), time.process_time(), _cpu_seconds(server))
            for out in outs:
                await anyio.Path(out + ".stop").touch()
            await anyio.to_thread.run_sync(_wait_all, procs)
            done: list[tuple[str, str, float]] = []
            rss_end: list[int] = []
            for out in outs:
                report = json.loads(await anyio.Path(out).read_text())
                done += [(s, t, end) for s, t, end in report["done"]]
                rss_end.append(report["rss_kib"])
            await opened.purge()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)
    latencies = [end - submitted[(s, t)] for s, t, end in done if (s, t) in submitted]
    # Completions in the window after a warm-up: in a steady state they come as fast as turns
    # arrive; a backlog shows as fewer.
    warm = wall_started + min(10.0, args.duration * 0.25)
    in_window = [end for s, t, end in done if warm <= end <= window_end]
    elapsed = args.duration
    sustained = len(in_window) * STEPS_PER_TURN / max(1e-9, window_end - warm)
    offered = offered_turns * STEPS_PER_TURN
    worker_cpu = (cpu1[0] - cpu0[0]) / elapsed
    server_cpu = (cpu1[2] - cpu0[2]) / elapsed
    append_p99 = _pct(probe, 0.99)
    if sustained >= 0.9 * offered and len(done) >= 0.98 * count:
        limit = "kept up"
    elif append_p99 is not None and append_p99 > 0.25:
        limit = "store: append p99 over 250 ms"
    elif worker_cpu + server_cpu + (cpu1[1] - cpu0[1]) / elapsed > 1.7:
        limit = f"CPU (2 cores): workers {worker_cpu:.0%}, server {server_cpu:.0%}"
    elif offered_turns > 0.9 * args.processes * args.per_process / max(
        0.01, 2 * args.model_latency
    ):
        limit = "worker loops busy with model calls (raise --per-process)"
    else:
        limit = "small backlog, no clear cause (a longer --duration tells)"
    return {
        "world": world,
        "sessions": sessions,
        "offered_steps_per_s": round(offered, 1),
        "sustained_steps_per_s": round(sustained, 1),
        "turns_submitted": count,
        "turns_finished": len(done),
        "append_p50_ms": ms(_pct(probe, 0.5)),
        "append_p99_ms": ms(append_p99),
        "turn_p50_ms": ms(_pct(latencies, 0.5)),
        "turn_p99_ms": ms(_pct(latencies, 0.99)),
        "worker_rss_mib_start": round(sum(rss_start) / 1024, 1),
        "worker_rss_mib_end": round(sum(rss_end) / 1024, 1),
        "worker_cpu": round(worker_cpu, 2),
        "server_cpu": round(server_cpu, 2),
        "limit": limit,
    }


async def memory_run(world: str, url: str, turns: int) -> dict[str, Any]:
    """``turns`` turns (instant model) through one Worker in this process; RSS every tenth."""
    namespace = f"scale_mem_{secrets.token_hex(4)}"
    samples: list[dict[str, int]] = []
    agent = Agent(
        model=_SlowModel(0.0, random.Random(0)), tools=ToolRegistry([tool(lookup, replay="safe")])
    )
    async with open_world(world, url=url, namespace=namespace) as opened:
        client = Client(opened, queue=QUEUE)
        worker = Worker(opened, agent, queue=QUEUE, name="mem", crash=None)
        step = max(1, turns // 10)
        try:
            for n in range(turns):
                await client.submit(f"m{n}", "hello", turn_id="t1")
                result = await worker.run_once(wait=5.0)
                if result is None or result.status != "done":
                    raise RuntimeError(f"turn {n} did not finish on {world}: {result}")
                if (n + 1) % step == 0:
                    samples.append({"turns": n + 1, "rss_kib": _rss_kib(os.getpid())})
        finally:
            await opened.purge()
    first, last = samples[0]["rss_kib"], samples[-1]["rss_kib"]
    return {
        "world": world,
        "turns": turns,
        "sessions": turns,
        "rss_mib": [round(s["rss_kib"] / 1024, 1) for s in samples],
        "growth_mib": round((last - first) / 1024, 1),
        "growth_kib_per_1000_turns": round((last - first) / max(1, turns - step) * 1000, 1),
    }


def _urls(args: argparse.Namespace, folder: Path) -> dict[str, str]:
    return {
        "local": str(folder / "local"),
        "postgres": args.postgres_url,
        "redis": args.redis_url,
        "turso": f"file:{folder / 'turso.db'}",
    }


def _print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'world':<9}{'sessions':>9}{'offered/s':>10}{'steps/s':>9}{'append p50':>11}"
        f"{'p99':>8}{'turn p50':>10}{'p99':>9}{'RSS MiB':>13}  limit"
    )
    print(head)
    for r in rows:
        print(
            f"{r['world']:<9}{r['sessions']:>9}{r['offered_steps_per_s']:>10}"
            f"{r['sustained_steps_per_s']:>9}{r['append_p50_ms']!s:>11}{r['append_p99_ms']!s:>8}"
            f"{r['turn_p50_ms']!s:>10}{r['turn_p99_ms']!s:>9}"
            f"{str(r['worker_rss_mib_start']) + '->' + str(r['worker_rss_mib_end']):>13}"
            f"  {r['limit']}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default="local,postgres,redis,turso", help="a list of worlds")
    parser.add_argument("--sessions", default="1000,10000,50000", help="active sessions, a list")
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument("--per-process", type=int, default=250, help="worker loops per process")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per row")
    parser.add_argument("--model-latency", type=float, default=0.5, help="seconds per call")
    parser.add_argument("--memory", type=int, default=0, help="instead: N turns, RSS over them")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small and short")
    parser.add_argument("--json", action="store_true", help="print JSON after the table")
    parser.add_argument("--postgres-url", default=os.environ.get("WORLD_TEST_POSTGRES_URL", PG_URL))
    parser.add_argument("--redis-url", default=os.environ.get("WORLD_TEST_REDIS_URL", REDIS_URL))
    parser.add_argument("--worker-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_child:
        world, url, namespace, out = args.worker_child
        anyio.run(worker_child, world, url, namespace, args.per_process, args.model_latency, out)
        return 0
    if args.quick:
        args.sessions, args.duration, args.per_process = "600", 3.0, 20
        args.model_latency = min(args.model_latency, 0.2)
        if args.memory:
            args.memory = min(args.memory, 200)
    worlds = [w.strip() for w in args.world.split(",") if w.strip()]
    folder = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    urls = _urls(args, folder)
    unknown = [w for w in worlds if w not in urls]
    if unknown:
        parser.error(f"--world: no {', '.join(unknown)}; choose from {', '.join(urls)}")
    try:
        sizes = [int(n) for n in args.sessions.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--sessions is a comma-separated list of counts, got {args.sessions!r}")
    if not sizes or min(sizes) < 1 or args.processes < 1 or args.per_process < 1:
        parser.error("--sessions, --processes and --per-process must be at least 1")
    rows: list[dict[str, Any]] = []
    try:
        for world in worlds:
            if args.memory:
                print(f"  memory over {args.memory} turns on {world} ...", file=sys.stderr)
                rows.append(anyio.run(memory_run, world, urls[world], args.memory))
                continue
            for sessions in sizes:
                print(f"  {world}: {sessions} sessions ...", file=sys.stderr, flush=True)
                rows.append(anyio.run(run_row, args, world, urls[world], sessions))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.memory:
        for r in rows:
            print(
                f"{r['world']:<9} {r['turns']} turns: RSS MiB {r['rss_mib']} "
                f"(growth {r['growth_mib']} MiB)"
            )
    else:
        print(
            f"{args.processes} worker processes x {args.per_process} loops, model "
            f"{args.model_latency} s/call, {args.duration} s per row; 2-core shared machine"
        )
        _print_table(rows)
    if args.json:
        print(json.dumps({"settings": vars(args), "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
