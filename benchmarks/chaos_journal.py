"""Chaos run: worker processes killed and paused at random while turns with side effects run.

    uv run python benchmarks/chaos_journal.py --world local|postgres|redis|all
        [--turns N] [--workers W] [--lease S] [--seed K] [--json]

What it checks is the journal's promise for ``never`` tools, counted outside the journal: each
finished turn's refund and email are applied exactly once.

* The agent (:func:`build_agent`, in this module, which the workers import by
  ``--agent chaos_journal:build_agent``) looks an order up (``lookup``, ``safe``), refunds it
  (``refund``, ``never``), emails the customer (``email``, ``never``), then replies. The two
  ``never`` tools POST ``{session, tool, args}`` to the sink with ``Idempotency-Key:
  context.idempotency_key``; the workers find the sink at ``WORLD_CHAOS_SINK_URL``. Told that a
  call may or may not have happened (``POSSIBLY_RAN``), or given an error, the scripted model
  retries the same tool with the same arguments without looking first: the blind retry an LLM
  makes, harmless only if it reaches the API with the interrupted call's key. The tools get
  ``--tool-timeout`` (where ``tool`` takes a timeout): a worker taking a turn over waits that
  long for an interrupted call before answering for it.

* A loopback sink (``http.server`` on 127.0.0.1, a random port) stands for the payments and
  mail APIs. ``POST /effect`` with ``Idempotency-Key`` and ``{session, tool, args}``: the first
  request with a key applies the effect and stores the response; a repeat with that key gets
  the stored response and applies nothing (Stripe's rule; the same key with another body is
  refused with 422). Each request takes a random 0 to ``--sink-delay`` seconds, the effect
  applied at a random point of it, so a worker is often inside the call when it is hit.
* ``--turns`` turns are submitted (one session each), ``--workers`` worker processes
  (``python -m world_core._cli worker``) run them with ``--lease``. At random instants
  (exponential gaps of mean ``--interval`` seconds, seeded), a random worker is either killed
  (SIGKILL; a replacement starts) or paused (SIGSTOP for 0.5x to 3x the lease, then SIGCONT):
  a pause past the lease is the case fencing exists for. Injection stops when every turn has
  a reply or at ``--deadline``; then paused workers resume and the run waits up to
  ``--settle`` seconds more for stragglers; then SIGTERM, and SIGKILL after a bound.
* Report per World, as a table (or ``--json``): turns submitted, finished, lost (no reply at
  the end); kills, pauses; sink requests and repeats dropped by the key; effects applied per
  (session, tool), with the logical effects applied more than once (must be 0) and those whose
  requests came with more than one key (a retry that did not reuse the key: harmless only if
  the first request never arrived); ``possibly ran`` outcomes in the journals; warnings the
  workers logged.

Exit status 1 if any turn was lost, any effect was applied twice, or a finished turn is
missing an effect, so it can serve as a slow test. Servers: PostgreSQL and Redis at their
local test URLs (``--postgres-url``, ``--redis-url``); ``local`` uses a temporary folder. Each
run uses a fresh namespace, purged afterwards. About a minute per World with the defaults.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx

from world_core import (
    POSSIBLY_RAN,
    Agent,
    Client,
    ModelReply,
    ModelRequest,
    Replay,
    ScriptedModel,
    Tool,
    ToolCall,
    ToolContext,
    World,
    open_world,
    session_log_id,
    tool,
)
from world_core.errors import ConfigurationError

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
WORLDS = ("local", "postgres", "redis")
AGENT = "chaos_journal:build_agent"  # this module, on the workers' PYTHONPATH
HERE = os.path.dirname(os.path.abspath(__file__))
TURN = "t1"
WORKER_GRACE = 2.0  # seconds a worker gets after SIGTERM to finish its turn (``--grace``)
STOP_BOUND = WORKER_GRACE + 8.0  # then SIGKILL
POLL = 0.5  # seconds between reply checks

# -- the agent (run by the worker processes) ----------------------------------------------------

SINK_URL_VARIABLE = "WORLD_CHAOS_SINK_URL"
PID_HEADER = "X-Chaos-Worker-Pid"  # lets the report say what hit the worker that applied it
EFFECT_TOOLS = ("refund", "email")
"""The ``never`` tools, each one logical effect per turn."""
REPLY = "Refunded the order and emailed the customer."
_PLAN = ("lookup", *EFFECT_TOOLS)
TOOL_TIMEOUT_VARIABLE = "WORLD_CHAOS_TOOL_TIMEOUT"  # seconds per refund/email call


def _tool_timeout() -> float:
    return float(os.environ.get(TOOL_TIMEOUT_VARIABLE) or 5.0)


def _tool(fn: Callable[..., Any], replay: Replay) -> Tool:
    # A worker taking a turn over waits for an interrupted never call's timeout before it
    # answers for it: keep it short (the sink answers within --sink-delay). Journals from
    # before tools had a timeout take no such argument.
    if "timeout" in inspect.signature(tool).parameters:
        return tool(fn, replay=replay, timeout=_tool_timeout())
    return tool(fn, replay=replay)


def message_for(order: str) -> str:
    """The user's message of a turn about ``order``."""
    return f"Please refund order {order} and let the customer know."


def _order_of(request: ModelRequest) -> str:
    user = [m for m in request.messages if m["role"] == "user"][-1]
    text = str(user["content"])
    return text.split("order ", 1)[1].split(" ", 1)[0]


def _sink_url() -> str:
    url = os.environ.get(SINK_URL_VARIABLE)
    if not url:
        raise ConfigurationError(
            f"set {SINK_URL_VARIABLE} to the chaos sink's URL (http://127.0.0.1:PORT); "
            "benchmarks/chaos_journal.py sets it for the workers it starts"
        )
    return url.rstrip("/")


async def _post(context: ToolContext, name: str, args: dict[str, Any]) -> dict[str, Any]:
    body = {"session": context.session_id, "tool": name, "args": args}
    headers = {"Idempotency-Key": context.idempotency_key, PID_HEADER: str(os.getpid())}
    async with httpx.AsyncClient(timeout=_tool_timeout()) as http:
        response = await http.post(f"{_sink_url()}/effect", json=body, headers=headers)
    response.raise_for_status()  # an error is the tool's outcome; the model retries it
    answer: dict[str, Any] = response.json()
    return answer


def lookup(order: str) -> dict[str, Any]:
    """Look up an order: its amount and the customer's address."""
    return {"order": order, "cents": 1000 + sum(order.encode()) % 9000, "to": f"{order}@example"}


async def refund(order: str, cents: int, context: ToolContext) -> dict[str, Any]:
    """Refund ``cents`` on ``order`` (a payment: must not happen twice)."""
    return await _post(context, "refund", {"order": order, "cents": cents})


async def email(to: str, subject: str, context: ToolContext) -> dict[str, Any]:
    """Email the customer (must not be sent twice)."""
    return await _post(context, "email", {"to": to, "subject": subject})


def _call(index: int, name: str, arguments: dict[str, Any]) -> ModelReply:
    return ModelReply(
        tool_calls=[
            ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments, sort_keys=True))
        ]
    )


def policy(request: ModelRequest) -> ModelReply:
    """lookup, refund, email, reply; a ``POSSIBLY_RAN`` or error result: the same call again."""
    messages = request.messages
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    turn = messages[start + 1 :]
    asked = len([m for m in turn if m["role"] == "assistant"])
    calls = {
        call["id"]: (call["function"]["name"], call["function"]["arguments"])
        for m in turn
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    }
    results = [(*calls[m["tool_call_id"]], m["content"]) for m in turn if m["role"] == "tool"]
    if results:
        name, arguments, content = results[-1]
        if content == POSSIBLY_RAN or str(content).startswith("Error:"):
            return _call(asked, name, json.loads(arguments))  # the blind retry
    done = {name for name, _, content in results if content != POSSIBLY_RAN}
    order = _order_of(request)
    for name in _PLAN:
        if name in done:
            continue
        if name == "lookup":
            return _call(asked, "lookup", {"order": order})
        found = json.loads([c for n, _, c in results if n == "lookup"][-1])
        if name == "refund":
            return _call(asked, "refund", {"order": order, "cents": found["cents"]})
        return _call(asked, "email", {"to": found["to"], "subject": f"Refund of {order}"})
    return ModelReply(content=REPLY)


def build_agent() -> Agent:
    """For ``world worker --agent chaos_journal:build_agent``: called per turn."""
    _sink_url()  # fail at the first turn, with the variable's name, not inside a tool
    return Agent(
        model=ScriptedModel(policy),
        tools=[_tool(lookup, "safe"), _tool(refund, "never"), _tool(email, "never")],
        system="Refund the order, then email the customer. Each at most once.",
    )


# -- the sink ------------------------------------------------------------------------------------


class Sink:
    """An idempotency-key honouring effect API, counting what it received and applied."""

    def __init__(self, *, max_delay: float, seed: int) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._max_delay = max_delay
        self._stored: dict[str, tuple[bytes, bytes]] = {}  # key: (request body, response)
        self.requests = 0
        self.per_key: Counter[str] = Counter()
        self.applied: Counter[tuple[str, str]] = Counter()
        self.keys: dict[tuple[str, str], set[str]] = {}
        self.first: dict[str, tuple[int, float]] = {}  # key: (worker pid, when it arrived)
        self.conflicts = 0  # a key reused with another body: refused (422)
        self.malformed = 0  # no key, or not {session, tool, args}: refused (400)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,))

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Sink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def delays(self) -> tuple[float, float]:
        """Seconds to wait before applying the effect, and after it before answering."""
        with self._lock:
            total = self._rng.uniform(0.0, self._max_delay)
            split = self._rng.random()
        return total * split, total * (1 - split)

    def effect(
        self, key: str | None, body: bytes, pid: int = 0, arrived: float = 0.0
    ) -> tuple[int, bytes]:
        """Apply (or replay) one request; returns the status and the response body."""
        with self._lock:
            self.requests += 1
            if not key:
                self.malformed += 1
                return 400, b'{"error": "Idempotency-Key header required"}'
            self.per_key[key] += 1
            stored = self._stored.get(key)
            if stored is not None:
                if stored[0] != body:
                    self.conflicts += 1
                    return 422, b'{"error": "key reused with another request"}'
                return 200, stored[1]
            try:
                request = json.loads(body)
                logical = (str(request["session"]), str(request["tool"]))
            except (ValueError, KeyError, TypeError):
                self.malformed += 1
                return 400, b'{"error": "body must be {session, tool, args}"}'
            self.applied[logical] += 1
            self.keys.setdefault(logical, set()).add(key)
            self.first[key] = (pid, arrived)
            response = json.dumps({"applied": True, "key": key}).encode()
            self._stored[key] = (body, response)
            return 200, response

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if self.path != "/effect":
                    status, answer = 404, b'{"error": "POST /effect"}'
                else:
                    before, after = sink.delays()
                    time.sleep(before)
                    key, pid = self.headers.get("Idempotency-Key"), self.headers.get(PID_HEADER)
                    status, answer = sink.effect(key, body, int(pid or 0), arrived)
                    time.sleep(after)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the worker was killed while waiting: the effect stands anyway

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


# -- worker processes ----------------------------------------------------------------------------


@dataclass
class Proc:
    number: int
    process: subprocess.Popen[bytes]
    log: Path
    paused_until: float | None = None
    killed: bool = False


@dataclass
class Fleet:
    """The worker processes of one run, and what was done to them."""

    command: list[str]
    env: dict[str, str]
    folder: Path
    procs: list[Proc] = field(default_factory=list)
    started = 0
    kills = 0
    pauses = 0
    unexpected: list[str] = field(default_factory=list)  # "worker N exited S: last line"
    hits: list[tuple[float, int, str]] = field(default_factory=list)  # (when, pid, kill|pause)
    stop_needed_kill = 0

    def start(self) -> Proc:
        self.started += 1
        log = self.folder / f"worker-{self.started}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        proc = Proc(self.started, process, log)
        self.procs.append(proc)
        return proc

    def alive(self) -> list[Proc]:
        return [p for p in self.procs if p.process.poll() is None]

    def kill(self, proc: Proc) -> None:
        self.hits.append((time.monotonic(), proc.process.pid, "kill"))
        proc.killed = True
        proc.process.send_signal(signal.SIGKILL)
        proc.process.wait(timeout=10)
        self.kills += 1
        self.start()

    def pause(self, proc: Proc, until: float) -> None:
        self.hits.append((time.monotonic(), proc.process.pid, "pause"))
        proc.process.send_signal(signal.SIGSTOP)
        proc.paused_until = until
        self.pauses += 1

    def resume_due(self, now: float) -> None:
        for proc in self.procs:
            if proc.paused_until is not None and now >= proc.paused_until:
                if proc.process.poll() is None:
                    proc.process.send_signal(signal.SIGCONT)
                proc.paused_until = None

    def replace_dead(self) -> None:
        """A worker that exited without being killed is a finding: note it, start another."""
        for proc in list(self.procs):
            if proc.killed or proc.process.poll() is None:
                continue
            proc.killed = True  # noted once
            tail = proc.log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            self.unexpected.append(
                f"worker {proc.number} exited {proc.process.returncode}: {tail[0][:300]}"
            )
            self.start()

    def stop(self) -> None:
        """SIGCONT and SIGTERM every live worker; SIGKILL what is left after the bound."""
        live = self.alive()
        for proc in live:
            proc.process.send_signal(signal.SIGCONT)
            proc.paused_until = None
            proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_BOUND
        for proc in live:
            try:
                proc.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop_needed_kill += 1
                proc.process.kill()
                proc.process.wait(timeout=10)
            else:
                code = proc.process.returncode
                ready = "waiting for turns" in proc.log.read_text(errors="replace")
                # Still starting (no signal handler yet): SIGTERM's default action is right.
                if code != 0 and not (code == -signal.SIGTERM and not ready):
                    tail = proc.log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                    self.unexpected.append(
                        f"worker {proc.number} exited {proc.process.returncode} on SIGTERM: "
                        f"{tail[0][:300]}"
                    )


_LOG_PATTERNS = {
    "superseded": re.compile(r"^world\.worker: turn \S+: .*; stopping$"),
    "turn_failed": re.compile(r"^world\.worker: turn \S+ failed: "),
    "cannot_replay": re.compile(r"^world\.worker: turn \S+ cannot replay: "),
    "lease_given_up": re.compile(r"^world\.worker: giving up "),
    "renew_failed": re.compile(r"^world\.worker: renewing \S+ failed: "),
    "traceback": re.compile(r"^Traceback "),
}


def _worker_log_counts(fleet: Fleet) -> tuple[dict[str, int], list[str]]:
    counts = dict.fromkeys(_LOG_PATTERNS, 0)
    samples: list[str] = []
    for proc in fleet.procs:
        for line in proc.log.read_text(errors="replace").splitlines():
            for name, pattern in _LOG_PATTERNS.items():
                if pattern.search(line):
                    counts[name] += 1
                    if name in ("turn_failed", "cannot_replay", "traceback") and len(samples) < 5:
                        samples.append(f"worker {proc.number}: {line[:300]}")
    return counts, samples


# -- one run -------------------------------------------------------------------------------------


@dataclass
class Settings:
    turns: int
    workers: int
    lease: float
    seed: int
    interval: float
    kill_share: float
    deadline: float
    settle: float
    sink_delay: float
    tool_timeout: float


async def _pending(client: Client, sessions: list[str], replies: dict[str, str]) -> list[str]:
    left: list[str] = []
    for session in sessions:
        if session in replies:
            continue
        reply = await client.reply(session, TURN)
        if reply is None:
            left.append(session)
        else:
            replies[session] = reply
    return left


async def _journal_facts(world: World, sessions: list[str]) -> dict[str, Any]:
    """From the session logs: interrupted never steps, and where each lost turn stopped."""
    possibly_ran = 0
    last_events: dict[str, str] = {}
    for session in sessions:
        events = await world.log.read(session_log_id(session))
        for event in events:
            body = json.loads(event.data)
            if body.get("t") == "outcome" and (body.get("result") or {}).get("interrupted"):
                possibly_ran += 1
        last_events[session] = (events[-1].key or "?") if events else "(empty log)"
    return {"possibly_ran": possibly_ran, "last_events": last_events}


async def run_world(name: str, url: str, settings: Settings, folder: Path) -> dict[str, Any]:
    started = time.monotonic()
    namespace = f"chaos_{secrets.token_hex(4)}"
    rng = random.Random(settings.seed)
    sessions = [f"chaos-{i:04d}" for i in range(settings.turns)]
    replies: dict[str, str] = {}
    with Sink(max_delay=settings.sink_delay, seed=settings.seed) as sink:
        async with open_world(name, url=url, namespace=namespace) as world:
            try:
                client = Client(world)
                for i, session in enumerate(sessions):
                    await client.submit(session, message_for(f"A{i:04d}"), turn_id=TURN)
                command = [sys.executable, "-m", "world_core._cli", "worker", "--agent", AGENT]
                command += ["--world", name, "--url", url, "--namespace", namespace]
                command += ["--lease", str(settings.lease), "--grace", str(WORKER_GRACE)]
                path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
                env = {k: v for k, v in os.environ.items() if k != "CRASH_AT"}
                env.update({SINK_URL_VARIABLE: sink.url, "PYTHONPATH": path})
                env[TOOL_TIMEOUT_VARIABLE] = str(settings.tool_timeout)
                fleet = Fleet(command, env, folder)
                try:
                    for _ in range(settings.workers):
                        fleet.start()
                    chaos_started = anyio.current_time()
                    deadline = chaos_started + settings.deadline
                    next_hit = chaos_started + rng.expovariate(1 / settings.interval)
                    next_poll = chaos_started
                    left = list(sessions)
                    while left and anyio.current_time() < deadline:
                        now = anyio.current_time()
                        fleet.resume_due(now)
                        fleet.replace_dead()
                        if now >= next_poll:
                            left = await _pending(client, left, replies)
                            next_poll = anyio.current_time() + POLL
                        live = fleet.alive()
                        if left and live and now >= next_hit:
                            running = [p for p in live if p.paused_until is None]
                            if rng.random() < settings.kill_share or not running:
                                fleet.kill(rng.choice(live))
                            else:
                                hold = rng.uniform(0.5, 3.0) * settings.lease
                                fleet.pause(rng.choice(running), now + hold)
                            next_hit = now + rng.expovariate(1 / settings.interval)
                        await anyio.sleep(0.05)
                    chaos_seconds = anyio.current_time() - chaos_started
                    fleet.resume_due(float("inf"))
                    settle_until = anyio.current_time() + settings.settle
                    while left and anyio.current_time() < settle_until:
                        fleet.replace_dead()
                        await anyio.sleep(POLL)
                        left = await _pending(client, left, replies)
                finally:
                    fleet.stop()
                left = await _pending(client, left, replies)
                facts = await _journal_facts(world, sessions)
            finally:
                await world.purge()
    counts, samples = _worker_log_counts(fleet)
    finished = [s for s in sessions if s in replies]
    histogram: Counter[str] = Counter()
    missing = 0
    for session in finished:
        for tool_name in EFFECT_TOOLS:
            applied = sink.applied[(session, tool_name)]
            histogram[str(applied) if applied < 3 else "3+"] += 1
            missing += applied == 0
    twice = sum(1 for count in sink.applied.values() if count > 1)
    doubles: list[str] = []
    causes: Counter[str] = Counter()
    for logical, count in sorted(sink.applied.items()):
        if count < 2:
            continue
        keys = sorted(sink.keys[logical], key=lambda k: sink.first[k][1])
        pid, arrived = sink.first[keys[0]]  # a hit after its request arrived interrupted it
        later = [kind for when, hit, kind in fleet.hits if hit == pid and when >= arrived]
        cause = later[0] if later else "none"
        causes[cause] += 1
        doubles.append(f"{logical[0]} {logical[1]} x{count}: keys {keys}; first applier's {cause}")
    new_keys = sum(1 for keys in sink.keys.values() if len(keys) > 1)
    lost = [s for s in sessions if s not in replies]
    return {
        "world": name,
        "namespace": namespace,
        "turns_submitted": len(sessions),
        "turns_finished": len(finished),
        "turns_lost": len(lost),
        "wrong_replies": sum(1 for s in finished if replies[s] != REPLY),
        "kills": fleet.kills,
        "pauses": fleet.pauses,
        "workers_started": fleet.started,
        "unexpected_exits": len(fleet.unexpected),
        "stop_needed_sigkill": fleet.stop_needed_kill,
        "sink_requests": sink.requests,
        "repeats_dropped": sum(n - 1 for n in sink.per_key.values()),
        "key_conflicts": sink.conflicts,
        "malformed_requests": sink.malformed,
        "effects_applied": sum(sink.applied.values()),
        "effects_per_logical": dict(sorted(histogram.items())),
        "effects_applied_twice": twice,
        "effects_missing": missing,
        "effects_with_several_keys": new_keys,
        "twice_after": {cause: causes[cause] for cause in ("kill", "pause", "none")},
        "possibly_ran_outcomes": facts["possibly_ran"],
        "worker_log": counts,
        "chaos_s": round(chaos_seconds, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "lost_turns": {s: facts["last_events"].get(s, "?") for s in lost[:10]},
        "unexpected": fleet.unexpected[:10],
        "doubles": doubles[:10],
        "log_samples": samples,
    }


# -- report --------------------------------------------------------------------------------------

_TABLE: list[tuple[str, str | tuple[str, str]]] = [
    ("turns submitted", "turns_submitted"),
    ("turns finished", "turns_finished"),
    ("turns lost", "turns_lost"),
    ("wrong replies", "wrong_replies"),
    ("kills (SIGKILL)", "kills"),
    ("pauses (SIGSTOP)", "pauses"),
    ("workers started", "workers_started"),
    ("unexpected exits", "unexpected_exits"),
    ("SIGKILL at stop", "stop_needed_sigkill"),
    ("sink requests", "sink_requests"),
    ("repeats dropped by key", "repeats_dropped"),
    ("key conflicts (422)", "key_conflicts"),
    ("effects applied", "effects_applied"),
    ("per (session, tool)", "effects_per_logical"),
    ("applied > 1  (must be 0)", "effects_applied_twice"),
    ("  first applier then", "twice_after"),
    ("missing on finished", "effects_missing"),
    ("several keys", "effects_with_several_keys"),
    ("possibly-ran outcomes", "possibly_ran_outcomes"),
    ("worker: superseded", ("worker_log", "superseded")),
    ("worker: turn failed", ("worker_log", "turn_failed")),
    ("worker: cannot replay", ("worker_log", "cannot_replay")),
    ("worker: lease given up", ("worker_log", "lease_given_up")),
    ("worker: renew failed", ("worker_log", "renew_failed")),
    ("worker: tracebacks", ("worker_log", "traceback")),
    ("chaos phase, s", "chaos_s"),
    ("wall, s", "wall_s"),
]


def _cell(row: dict[str, Any], key: str | tuple[str, str]) -> str:
    value = row[key[0]][key[1]] if isinstance(key, tuple) else row[key]
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in value.items()) or "-"
    return str(value)


def print_table(rows: list[dict[str, Any]], settings: Settings) -> None:
    print(
        f"\nchaos: {settings.turns} turns, {settings.workers} workers, lease {settings.lease} s, "
        f"seed {settings.seed}, a hit every {settings.interval} s on average "
        f"({settings.kill_share:.0%} kills), sink delay 0-{settings.sink_delay} s, "
        f"tool timeout {settings.tool_timeout} s"
    )
    width = max(14, *(len(_cell(r, k)) + 2 for r in rows for _, k in _TABLE))
    print(f"{'':<26}" + "".join(f"{r['world']:>{width}}" for r in rows))
    for label, key in _TABLE:
        print(f"{label:<26}" + "".join(f"{_cell(r, key):>{width}}" for r in rows))
    for row in rows:
        for title, items in (
            (
                "lost turns (last journal event)",
                [f"{s}: {e}" for s, e in row["lost_turns"].items()],
            ),
            ("unexpected worker exits", row["unexpected"]),
            ("effects applied more than once", row["doubles"]),
            ("worker log samples", row["log_samples"]),
        ):
            if items:
                print(f"\n{row['world']}: {title}:")
                for item in items:
                    print(f"  {item}")


def failures(row: dict[str, Any]) -> list[str]:
    found = []
    if row["turns_lost"]:
        found.append(f"{row['turns_lost']} turns lost")
    if row["effects_applied_twice"]:
        found.append(f"{row['effects_applied_twice']} effects applied more than once")
    if row["effects_missing"]:
        found.append(f"{row['effects_missing']} effects missing on finished turns")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default="local", help="local, postgres, redis, a list, or all")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lease", type=float, default=2.0, help="worker lease, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--interval", type=float, default=1.0, help="mean seconds between hits")
    parser.add_argument("--kill-share", type=float, default=0.5, help="share of hits that kill")
    parser.add_argument("--deadline", type=float, default=150.0, help="seconds of injection")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after injection")
    parser.add_argument("--sink-delay", type=float, default=0.3, help="max seconds per request")
    parser.add_argument(
        "--tool-timeout", type=float, default=5.0, help="timeout of the refund and email tools"
    )
    parser.add_argument(
        "--postgres-url", default=os.environ.get("WORLD_BENCH_POSTGRES_URL", PG_URL)
    )
    parser.add_argument("--redis-url", default=os.environ.get("WORLD_BENCH_REDIS_URL", REDIS_URL))
    parser.add_argument("--logs", help="copy the workers' logs to DIR/<world>/")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="6 turns, 2 workers, 8 s of injection: a smoke run"
    )
    args = parser.parse_args()
    if args.quick:
        args.turns, args.workers, args.deadline = 6, 2, 8.0
    names = list(WORLDS) if args.world == "all" else args.world.split(",")
    unknown = [n for n in names if n not in WORLDS]
    if unknown or args.turns < 1 or args.workers < 1 or args.lease <= 0 or args.interval <= 0:
        parser.error(f"--world is one of {', '.join(WORLDS)} (or a list, or all); sizes > 0")
    settings = Settings(
        turns=args.turns,
        workers=args.workers,
        lease=args.lease,
        seed=args.seed,
        interval=args.interval,
        kill_share=args.kill_share,
        deadline=args.deadline,
        settle=args.settle,
        sink_delay=args.sink_delay,
        tool_timeout=args.tool_timeout,
    )
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for name in names:
        folder = Path(tempfile.mkdtemp(prefix=f"chaos-{name}-"))
        try:
            url = {"local": str(folder / "world"), "postgres": args.postgres_url}.get(
                name, args.redis_url
            )
            print(f"  chaos on {name} ...", file=sys.stderr, flush=True)
            rows.append(anyio.run(run_world, name, url, settings, folder))
        finally:
            if args.logs is not None:
                kept = Path(args.logs) / name
                kept.mkdir(parents=True, exist_ok=True)
                for log in folder.glob("worker-*.log"):
                    shutil.copy(log, kept / log.name)
            shutil.rmtree(folder, ignore_errors=True)
    wall = round(time.monotonic() - started, 1)
    failed = {row["world"]: failures(row) for row in rows if failures(row)}
    if args.json:
        report = {"settings": settings.__dict__, "rows": rows, "wall_s": wall, "failed": failed}
        print(json.dumps(report, indent=2))
    else:
        print_table(rows, settings)
        print(f"\nwall time: {wall} s")
        for world_name, found in failed.items():
            print(f"FAILED on {world_name}: {'; '.join(found)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
