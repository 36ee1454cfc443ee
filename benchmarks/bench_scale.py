"""Scale run: many agent sessions at one step a minute, simulated on one machine (not a test).

    .ci/with-servers uv run --group bench python benchmarks/bench_scale.py \
        [--world local,postgres,redis,turso,mongo] [--sessions 1000,10000,50000] \
        [--processes 2] [--per-process 0] [--duration 60] [--model-latency 0.5] \
        [--out rows.json] [--json]

The seed's back-of-envelope: 50,000 concurrent agent runs, each doing one step a minute, are
about 830 steps/s and 1,700 appends/s. Here a turn is three steps (the model asks for a tool,
a ``safe`` tool runs, the model replies), so a session doing one step a minute submits a turn
every three minutes: S active sessions offer S / 180 turns/s (278 turns/s, 833 steps/s, at
50,000). Per World and per session count, for ``--duration`` seconds:

* a driver process submits turns to random sessions among S at that rate (open loop, Poisson
  arrivals) with :class:`world_core.Client`, at most 32 at once; on Postgres its pool holds
  ``--driver-pool`` connections (24 by default; the World's default of 10 made the driver's
  submits wait for a connection: a limit of this one process, not of the World, where an
  app sizes its pool to its load; 24, not 32, keeps the run under the 100 connections of a
  default server, with the workers' pools);
* ``--processes`` worker processes each run ``--per-process`` :class:`world_core.Worker` loops
  concurrently; the model is scripted and sleeps ``--model-latency`` seconds per call
  (uniformly jittered +-50 %), as a hosted model would. ``0`` (the default) sizes the loops to
  the offered load: the turns in flight at that rate (two model calls each) with 50 % headroom,
  at least 8 and at most 100 per process (more processes then: redis-py's pool of blocking
  connections refuses a process's 101st waiting claim); more idle loops only add idle claims
  (on Postgres every enqueue wakes each waiting loop);
* a probe process of its own appends one 256-byte event every 20 ms to a log of its own and
  times it: the store's append latency under that load, not slowed by the driver's loop.

Reported per row: offered and sustained steps/s (turns finished within the window, times 3),
append p50/p99 (probe), turn latency p50/p99 (submit to reply), the workers' resident memory
at start and end, CPU (cores busy) of workers / driver / server and of the whole machine (the
other users of a shared machine included), the load average, how late the driver submitted
(its own lag: above 0.5 s the harness, not the World, is the limit), and the limit hit first:
the turn backlog grows (offered > sustained) while the store's append latency explodes (the
backend), the driver's submits cannot keep up (at most 32 in flight; those still waiting 5 s
after the window are cut and counted: the submit path), or the machine's CPU is saturated (the
driver starved: most submits not done never started, its loop behind its plan); or none of
these (the run kept up). ``--out`` rewrites a JSON file after every row, so a crash loses
nothing. ``mongo`` (only when named; its URL from
``--mongo-url`` or ``WORLD_TEST_MONGO_URL``, as ``.ci/with-servers`` sets it) is labelled
``mongoeco``: the figures are those of mongoeco's wire server, not of MongoDB.

``--memory N`` instead runs N turns (no model latency) through one worker process, sampling
its resident memory every N/10 turns: flat means no growth per turn or per session.

Timings on a shared 2-core machine are noisy; the shape (where each backend saturates) is the
result, not the third digit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from world_core import (
    Agent,
    BackendUnavailableError,
    Client,
    Journal,
    ModelReply,
    ModelRequest,
    NewEvent,
    ToolCall,
    ToolRegistry,
    Worker,
    World,
    open_world,
    tool,
)

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
STEPS_PER_TURN = 3
QUEUE = "scale"
SUBMITS_IN_FLIGHT = 32
POOL_SETTING = "WORKFLOW_POSTGRES_POOL_SIZE"
DRIVER_POOL = 24
"""The driver's Postgres connections (see the module docstring)."""
LABELS = {"mongo": "mongoeco"}  # figures of mongoeco's wire server, not of MongoDB


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


def _server_pids(world: str, url: str) -> list[int]:
    """The server's processes (none for the in-process local and turso): every ``postgres``
    process; the ``redis-server`` or mongoeco process serving ``url``'s port."""
    port = urlsplit(url).port
    pattern = {
        "postgres": ["-x", "postgres"],
        "redis": ["-f", f"^redis-server .*:{port or 6379}( |$)"],
        "mongo": ["-f", f"mongoeco_server.py .*--port {port or 27017}( |$)"],
    }.get(world)
    if pattern is None:
        return []
    done = subprocess.run(["pgrep", *pattern], capture_output=True, text=True, check=False)
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


async def probe_child(world: str, url: str, namespace: str, out: str) -> None:
    """Append 256 bytes every 20 ms to a log of its own until the stop file appears; write the
    latencies to ``out``. A process of its own, so a busy driver does not inflate them."""
    samples: list[float] = []
    log = f"probe-{secrets.token_hex(4)}"
    data = secrets.token_bytes(256)
    stop_file = anyio.Path(out + ".stop")
    async with open_world(world, url=url, namespace=namespace) as opened:
        await opened.log.append(log, [NewEvent(data=data)])  # connected and created: not timed
        await anyio.Path(out + ".ready").touch()
        while not await stop_file.exists():
            started = time.perf_counter()
            await opened.log.append(log, [NewEvent(data=data)])
            samples.append(time.perf_counter() - started)
            await anyio.sleep(0.02)
    await anyio.Path(out).write_text(json.dumps(samples))


def _child(
    args: argparse.Namespace, role: str, world: str, url: str, namespace: str, out: str
) -> subprocess.Popen[bytes]:
    """A worker (``role="worker"``) or probe process for this row."""
    argv = [sys.executable, __file__, f"--{role}-child", world, url, namespace, out]
    argv += ["--per-process", str(args.per_process)]
    argv += ["--model-latency", str(args.model_latency)]
    return subprocess.Popen(argv)


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


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


MAX_LOOPS = 100
"""Loops per process at most when sized to the load: redis-py's pool holds 100 connections for
blocking calls, and each idle loop's claim waits on one (the 101st fails)."""


def loops_for(offered_turns: float, latency: float, processes: int) -> tuple[int, int]:
    """(processes, loops per process) for ``offered_turns`` turns/s: the turns in flight (two
    model calls each, plus 0.3 s of store work) with 50 % headroom, at least 8 loops per
    process, at most MAX_LOOPS (more processes then)."""
    loops = max(8, math.ceil(offered_turns * (2 * latency + 0.3) * 1.5))
    processes = max(processes, math.ceil(loops / MAX_LOOPS))
    return processes, max(8, math.ceil(loops / processes))


async def _wait_ready(outs: list[str], procs: list[subprocess.Popen[bytes]], world: str) -> None:
    deadline = time.monotonic() + 60
    while not all([await anyio.Path(out + ".ready").exists() for out in outs]):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"worker or probe processes did not start on {world}")
        await anyio.sleep(0.1)


@contextlib.asynccontextmanager
async def _driver_world(
    args: argparse.Namespace, world: str, url: str, namespace: str
) -> AsyncIterator[World]:
    """The driver's World. On Postgres its pool holds ``--driver-pool`` connections (0: the
    World's default, 10): each submit holds one connection per call, so a pool smaller than
    the submits in flight makes them wait for a connection, a limit of this one process,
    where an app would size its pool (or run more processes) for its load. The setting is
    the environment's, read when the World opens: it is put back at once, before the worker
    and probe processes start (they keep the default)."""
    async with contextlib.AsyncExitStack() as stack:
        if world != "postgres" or not args.driver_pool:
            yield await stack.enter_async_context(open_world(world, url=url, namespace=namespace))
            return
        before = os.environ.get(POOL_SETTING)
        os.environ[POOL_SETTING] = str(args.driver_pool)
        try:
            opened = await stack.enter_async_context(
                open_world(world, url=url, namespace=namespace)
            )
        finally:
            if before is None:
                del os.environ[POOL_SETTING]
            else:
                os.environ[POOL_SETTING] = before
        yield opened


async def run_row(args: argparse.Namespace, world: str, url: str, sessions: int) -> dict[str, Any]:
    """One World, one session count: the row of the table."""
    namespace = f"scale_{secrets.token_hex(4)}"
    folder = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    offered_turns = sessions / (60.0 * STEPS_PER_TURN)
    row_args = argparse.Namespace(**vars(args))
    if not args.per_process:
        row_args.processes, row_args.per_process = loops_for(
            offered_turns, args.model_latency, args.processes
        )
    procs: list[subprocess.Popen[bytes]] = []
    outs = [str(folder / f"worker-{n}.json") for n in range(row_args.processes)]
    probe_out = str(folder / "probe.json")
    load_start = os.getloadavg()
    try:
        async with _driver_world(args, world, url, namespace) as opened:
            procs += [_child(row_args, "worker", world, url, namespace, out) for out in outs]
            await _wait_ready(outs, procs, world)
            probe_proc = _child(row_args, "probe", world, url, namespace, probe_out)
            procs.append(probe_proc)
            await _wait_ready([probe_out], procs, world)
            pids = [p.pid for p in procs[: row_args.processes]]
            rss_start = [_rss_kib(pid) for pid in pids]
            server = _server_pids(world, url)

            def cpu_now() -> tuple[list[float], float, float, float, tuple[int, int]]:
                per_worker = [_cpu_seconds([pid]) for pid in pids]
                own = time.process_time()
                return (
                    per_worker,
                    own,
                    _cpu_seconds(server),
                    _cpu_seconds([probe_proc.pid]),
                    (_machine_ticks()),
                )

            cpu0 = cpu_now()
            client = Client(opened, queue=QUEUE)
            submitted: dict[tuple[str, str], float] = {}
            submit_times: list[float] = []
            lag: list[float] = []
            rng = random.Random(1)
            started = time.monotonic()
            wall_started = time.time()
            until = started + args.duration
            count = 0

            submit_errors: list[str] = []
            # Submits beyond this wait here, not for a pooled connection whose wait times out
            # (Postgres at 50k sessions): a backlog shows as turn latency, not as errors.
            in_flight = anyio.Semaphore(SUBMITS_IN_FLIGHT)

            pending = 0

            async def submit(session: str, turn: str) -> None:
                nonlocal pending
                began = time.perf_counter()
                pending += 1
                try:
                    async with in_flight:
                        await client.submit(session, "hello", turn_id=turn)
                except BackendUnavailableError as exc:  # the store refused under load: counted
                    submitted.pop((session, turn), None)
                    submit_errors.append(str(exc))
                    return
                finally:
                    pending -= 1
                submit_times.append(time.perf_counter() - began)

            late = 0  # planned within the window, not even started by its end (+ 5 s)
            async with anyio.create_task_group() as tg:
                next_at = started
                while True:
                    next_at += rng.expovariate(offered_turns)
                    if next_at >= until:
                        break
                    if time.monotonic() > until + 5.0:
                        late += 1
                        continue
                    await anyio.sleep(max(0.0, next_at - time.monotonic()))
                    lag.append(time.monotonic() - next_at)
                    session = f"s{rng.randrange(sessions)}"
                    count += 1
                    turn = f"t{count}"
                    submitted[(session, turn)] = time.time()
                    tg.start_soon(submit, session, turn)
                window_end = time.time()
                cpu1 = cpu_now()
                # The window is over: submits still waiting after 5 s more are the driver's
                # backlog (counted), not work to finish before the next row.
                with anyio.move_on_after(5.0):
                    while pending:  # noqa: ASYNC110  (a counter, looked at for 5 s at most)
                        await anyio.sleep(0.05)
                unsubmitted = pending
                tg.cancel_scope.cancel()
            # Let turns in flight finish (bounded), then stop the workers and the probe.
            await anyio.sleep(min(10.0, args.model_latency * 4 + 2))
            for out in [*outs, probe_out]:
                await anyio.Path(out + ".stop").touch()
            await anyio.to_thread.run_sync(_wait_all, procs)
            done: list[tuple[str, str, float]] = []
            rss_end: list[int] = []
            for out in outs:
                report = json.loads(await anyio.Path(out).read_text())
                done += [(s, t, end) for s, t, end in report["done"]]
                rss_end.append(report["rss_kib"])
            probe: list[float] = json.loads(await anyio.Path(probe_out).read_text())
            await opened.purge()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)
    load_end = os.getloadavg()
    latencies = [end - submitted[(s, t)] for s, t, end in done if (s, t) in submitted]
    # Completions in the window after a warm-up: in a steady state they come as fast as turns
    # arrive; a backlog shows as fewer.
    warm = wall_started + min(10.0, args.duration * 0.25)
    in_window = [end for s, t, end in done if warm <= end <= window_end]
    elapsed = window_end - wall_started
    sustained = len(in_window) * STEPS_PER_TURN / max(1e-9, window_end - warm)
    offered = offered_turns * STEPS_PER_TURN
    per_worker = [(b - a) / elapsed for a, b in zip(cpu0[0], cpu1[0], strict=True)]
    worker_cpu = sum(per_worker)
    driver_cpu = (cpu1[1] - cpu0[1]) / elapsed
    server_cpu = (cpu1[2] - cpu0[2]) / elapsed
    probe_cpu = (cpu1[3] - cpu0[3]) / elapsed
    busy = cpu1[4][0] - cpu0[4][0]
    machine_cpu = busy / max(1, cpu1[4][1] - cpu0[4][1]) * (os.cpu_count() or 1)
    others_cpu = max(0.0, machine_cpu - worker_cpu - driver_cpu - server_cpu - probe_cpu)
    append_p99 = _pct(probe, 0.99)
    lag_p99 = _pct(lag, 0.99) or 0.0
    cores = os.cpu_count() or 1
    planned = count + late  # arrivals planned in the window (count: those started)
    cpu_note = (
        f"workers {worker_cpu:.2f}, server {server_cpu:.2f}, driver {driver_cpu:.2f}, "
        f"others {others_cpu:.2f} of {cores} cores"
    )
    if sustained >= 0.9 * offered and len(done) >= 0.98 * count:
        limit = "kept up"
    elif driver_cpu > 0.9:
        limit = f"harness: the driver's CPU is saturated ({cpu_note})"
    elif submit_errors:
        limit = f"store: {len(submit_errors)} submits refused ({submit_errors[0][:80]}...)"
    elif append_p99 is not None and append_p99 > 0.25:  # a slow store slows submits too
        limit = f"store: append p99 over 250 ms ({cpu_note})"
    elif late > unsubmitted and late > 0.02 * planned and machine_cpu > 0.9 * cores:
        # Most submits not done never started: the driver's loop fell behind its plan, not
        # for want of a connection or a store (those that ran say how long a submit took),
        # but of CPU: it is one process among the workers and the server on a full machine.
        limit = (
            f"CPU saturated, the driver starved: {late} of {planned} submits planned in the "
            f"window never started (its loop {lag_p99:.1f} s late at p99; those that ran took "
            f"p99 {_pct(submit_times, 0.99) or 0:.1f} s; {cpu_note})"
        )
    elif late + unsubmitted > 0.02 * planned:
        limit = (
            f"submit path: {late + unsubmitted} of {planned} submits not done by the window's "
            f"end ({unsubmitted} in flight, {late} never started; submit p99 "
            f"{_pct(submit_times, 0.99) or 0:.1f} s; {cpu_note})"
        )
    elif lag_p99 > 0.5 and machine_cpu > 0.9 * cores:
        limit = f"CPU saturated, the driver starved too (lag p99 {lag_p99:.2f} s; {cpu_note})"
    elif machine_cpu > 0.9 * cores:
        limit = f"CPU saturated ({cpu_note})"
    elif offered_turns > 0.9 * row_args.processes * row_args.per_process / max(
        0.01, 2 * args.model_latency
    ):
        limit = "worker loops busy with model calls (raise --per-process)"
    else:
        limit = f"backlog, no clear cause ({cpu_note})"
    return {
        "world": world,
        "label": LABELS.get(world, world),
        "sessions": sessions,
        "processes": row_args.processes,
        "loops_per_process": row_args.per_process,
        "offered_steps_per_s": round(offered, 1),
        "sustained_steps_per_s": round(sustained, 1),
        "turns_submitted": count,
        "turns_planned_not_started": late,
        "submits_cut_at_window_end": unsubmitted,
        "submit_errors": len(submit_errors),
        "submit_error_first": submit_errors[0] if submit_errors else None,
        "turns_finished": len(done),
        "append_p50_ms": ms(_pct(probe, 0.5)),
        "append_p99_ms": ms(append_p99),
        "probe_appends": len(probe),
        "turn_p50_ms": ms(_pct(latencies, 0.5)),
        "turn_p99_ms": ms(_pct(latencies, 0.99)),
        "submit_p50_ms": ms(_pct(submit_times, 0.5)),
        "submit_p99_ms": ms(_pct(submit_times, 0.99)),
        "driver_lag_p99_ms": ms(lag_p99),
        "worker_rss_mib_start": round(sum(rss_start) / 1024, 1),
        "worker_rss_mib_end": round(sum(rss_end) / 1024, 1),
        "worker_cpu": round(worker_cpu, 2),
        "worker_cpu_per_process": [round(c, 2) for c in per_worker],
        "driver_cpu": round(driver_cpu, 2),
        "server_cpu": round(server_cpu, 2),
        "probe_cpu": round(probe_cpu, 2),
        "machine_cpu": round(machine_cpu, 2),
        "others_cpu": round(others_cpu, 2),
        "loadavg_start": [round(v, 2) for v in load_start],
        "loadavg_end": [round(v, 2) for v in load_end],
        "limit": limit,
    }


async def memory_run(
    world: str, url: str, turns: int, sessions: int = 0, trace: bool = False
) -> dict[str, Any]:
    """``turns`` turns (instant model) through one Worker in this process (its Client too);
    RSS every tenth. ``sessions`` 0: a new session per turn (growth per session shows);
    else the turns cycle over that many sessions (growth per turn of a session shows).
    ``trace``: tracemalloc's top growth between the first sample and the last (slow)."""
    namespace = f"scale_mem_{secrets.token_hex(4)}"
    samples: list[dict[str, int]] = []
    agent = Agent(
        model=_SlowModel(0.0, random.Random(0)), tools=ToolRegistry([tool(lookup, replay="safe")])
    )
    if trace:
        tracemalloc.start(8)
    first_snapshot: tracemalloc.Snapshot | None = None
    top: list[str] = []
    async with open_world(world, url=url, namespace=namespace) as opened:
        client = Client(opened, queue=QUEUE)
        worker = Worker(opened, agent, queue=QUEUE, name="mem", crash=None)
        step = max(1, turns // 10)
        try:
            for n in range(turns):
                session = f"m{n % sessions if sessions else n}"
                await client.submit(session, "hello", turn_id=f"t{n}")
                result = await worker.run_once(wait=5.0)
                if result is None or result.status != "done":
                    raise RuntimeError(f"turn {n} did not finish on {world}: {result}")
                if (n + 1) % step == 0:
                    gc.collect()
                    samples.append({"turns": n + 1, "rss_kib": _rss_kib(os.getpid())})
                    print(f"    {n + 1} turns: RSS {samples[-1]['rss_kib']} KiB", file=sys.stderr)
                    if trace and first_snapshot is None:
                        first_snapshot = tracemalloc.take_snapshot()
        finally:
            await opened.purge()
    if trace and first_snapshot is not None:
        diff = tracemalloc.take_snapshot().compare_to(first_snapshot, "traceback")
        for d in diff[:8]:
            where = " <- ".join(str(frame) for frame in reversed(d.traceback))  # newest first
            top.append(f"{d.size_diff:+} B {d.count_diff:+} blocks at {where}")
        tracemalloc.stop()
    first, last = samples[0]["rss_kib"], samples[-1]["rss_kib"]
    return {
        "world": world,
        "turns": turns,
        "sessions": sessions or turns,
        "rss_mib": [round(s["rss_kib"] / 1024, 1) for s in samples],
        "growth_mib": round((last - first) / 1024, 1),
        "growth_kib_per_1000_turns": round((last - first) / max(1, turns - step) * 1000, 1),
        "tracemalloc_top": top,
        "loadavg": [round(v, 2) for v in os.getloadavg()],
    }


def _urls(args: argparse.Namespace, folder: Path) -> dict[str, str]:
    urls = {
        "local": str(folder / "local"),
        "postgres": args.postgres_url,
        "redis": args.redis_url,
        "turso": f"file:{folder / 'turso.db'}",
    }
    if args.mongo_url:
        urls["mongo"] = args.mongo_url
    return urls


def print_table(rows: list[dict[str, Any]]) -> None:
    """The scale run's rows as a table (bench_targets.py prints them too)."""
    head = (
        f"{'world':<9}{'sessions':>9}{'loops':>6}{'offered/s':>10}{'steps/s':>9}"
        f"{'append p50':>11}{'p99':>8}{'turn p50':>10}{'p99':>9}{'RSS MiB':>13}{'load':>6}  limit"
    )
    print(head)
    for r in rows:
        if "error" in r:
            print(
                f"{LABELS.get(r['world'], r['world']):<9}{r['sessions']:>9}  failed: {r['error']}"
            )
            continue
        loops = r["processes"] * r["loops_per_process"]
        print(
            f"{r['label']:<9}{r['sessions']:>9}{loops:>6}{r['offered_steps_per_s']:>10}"
            f"{r['sustained_steps_per_s']:>9}{r['append_p50_ms']!s:>11}{r['append_p99_ms']!s:>8}"
            f"{r['turn_p50_ms']!s:>10}{r['turn_p99_ms']!s:>9}"
            f"{str(r['worker_rss_mib_start']) + '->' + str(r['worker_rss_mib_end']):>13}"
            f"{r['loadavg_end'][0]:>6}  {r['limit']}"
        )
    if any(r["world"] == "mongo" for r in rows):
        print("mongoeco: mongoeco's wire server, not MongoDB")


def _save(path: str | None, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``path`` with every row so far (a crash mid-run loses only the row running)."""
    if path:
        text = json.dumps({"settings": vars(args), "rows": rows}, indent=2, default=str)
        Path(path).write_text(text + "\n")


def server_url_options(parser: argparse.ArgumentParser) -> None:
    """``--postgres-url``, ``--redis-url`` and ``--mongo-url``, from the environment
    ``.ci/with-servers`` sets (WORLD_TEST_*_URL), else the local servers (mongo: none)."""
    parser.add_argument("--postgres-url", default=os.environ.get("WORLD_TEST_POSTGRES_URL", PG_URL))
    parser.add_argument("--redis-url", default=os.environ.get("WORLD_TEST_REDIS_URL", REDIS_URL))
    parser.add_argument(
        "--mongo-url",
        default=os.environ.get("WORLD_TEST_MONGO_URL"),
        help="mongo's URL (default WORLD_TEST_MONGO_URL, set by .ci/with-servers)",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default="local,postgres,redis,turso", help="a list of worlds")
    parser.add_argument("--sessions", default="1000,10000,50000", help="active sessions, a list")
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--per-process", type=int, default=0, help="worker loops per process (0: sized to load)"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per row")
    parser.add_argument(
        "--driver-pool",
        type=int,
        default=DRIVER_POOL,
        help="postgres: the driver's pool size (0: the World's default, 10)",
    )
    parser.add_argument("--model-latency", type=float, default=0.5, help="seconds per call")
    parser.add_argument("--memory", type=int, default=0, help="instead: N turns, RSS over them")
    parser.add_argument("--memory-sessions", type=int, default=0, help="--memory: N sessions")
    parser.add_argument("--tracemalloc", action="store_true", help="--memory: top growth too")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small and short")
    parser.add_argument("--json", action="store_true", help="print JSON after the table")
    parser.add_argument("--out", help="a JSON file rewritten with every row as it finishes")
    server_url_options(parser)
    parser.add_argument("--worker-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--probe-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_child:
        world, url, namespace, out = args.worker_child
        anyio.run(worker_child, world, url, namespace, args.per_process, args.model_latency, out)
        return 0
    if args.probe_child:
        anyio.run(probe_child, *args.probe_child)
        return 0
    if args.quick:
        args.sessions, args.duration, args.per_process = "600", 3.0, 20
        args.model_latency = min(args.model_latency, 0.2)
        if args.memory:
            args.memory = min(args.memory, 200)
    worlds = [w.strip() for w in args.world.split(",") if w.strip()]
    folder = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    urls = _urls(args, folder)
    if "mongo" in worlds and "mongo" not in urls:
        parser.error("--world mongo needs --mongo-url or WORLD_TEST_MONGO_URL (.ci/with-servers)")
    unknown = [w for w in worlds if w not in urls]
    if unknown:
        parser.error(f"--world: no {', '.join(unknown)}; choose from {', '.join(urls)}")
    try:
        sizes = [int(n) for n in args.sessions.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--sessions is a comma-separated list of counts, got {args.sessions!r}")
    if not sizes or min(sizes) < 1 or args.processes < 1 or args.per_process < 0:
        parser.error("--sessions and --processes must be at least 1, --per-process at least 0")
    if args.duration <= 0 or args.model_latency < 0:
        parser.error("--duration must be > 0 and --model-latency >= 0 seconds")
    rows: list[dict[str, Any]] = []
    try:
        for world in worlds:
            if args.memory:
                print(f"  memory over {args.memory} turns on {world} ...", file=sys.stderr)
                rows.append(
                    anyio.run(
                        memory_run,
                        world,
                        urls[world],
                        args.memory,
                        args.memory_sessions,
                        args.tracemalloc,
                    )
                )
                _save(args.out, args, rows)
                continue
            for sessions in sizes:
                print(f"  {world}: {sessions} sessions ...", file=sys.stderr, flush=True)
                try:
                    rows.append(anyio.run(run_row, args, world, urls[world], sessions))
                except Exception as exc:  # the row failed: say so and go on with the next
                    print(f"  {world}: {sessions} sessions failed: {exc!r}", file=sys.stderr)
                    rows.append({"world": world, "sessions": sessions, "error": repr(exc)})
                _save(args.out, args, rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.memory:
        for r in rows:
            print(
                f"{r['world']:<9} {r['turns']} turns: RSS MiB {r['rss_mib']} "
                f"(growth {r['growth_mib']} MiB)"
            )
            for line in r["tracemalloc_top"]:
                print(f"    {line}")
    else:
        print(
            f"{args.processes} worker processes (loops per row above), model "
            f"{args.model_latency} s/call, {args.duration} s per row; load = 1-min load average "
            f"at the row's end on {os.cpu_count()} shared cores"
        )
        print_table(rows)
    if args.json:
        print(json.dumps({"settings": vars(args), "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
