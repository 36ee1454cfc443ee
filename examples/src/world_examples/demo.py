"""``world demo``: the crash matrix of the reference exercise, on any World.

1. A clean turn: one worker process runs it; its reply and its steps are the baseline.
2. For every step of that turn, before and after the call: a fresh session runs the same turn
   in a worker process started with ``CRASH_AT=<step>:<when>`` (it dies there with
   ``os._exit(1)``), then a fresh worker process continues it once the lease runs out.
   Per crash point: model calls the second process repeated for steps already finished (the
   journal held their outcome), emails the inbox received, and whether the reply matches.
3. ``send_email`` relabelled ``safe``, crashed after it ran: the duplicate email arrives.

Each run uses its own namespace (and, for the local World, its own temporary folder), purged
at the end, so runs never collide.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio

from world_core import Client, World, open_world, resolve_world, session_log_id
from world_examples.crash_agent import MESSAGE
from world_examples.inbox import Inbox

__all__ = ["CrashRow", "run_demo"]

AGENT = "world_examples.crash_agent:build_agent"
TURN = "t1"
LEASE = 2.0


@dataclass(frozen=True)
class CrashRow:
    """One crash point's three numbers (and what the step was)."""

    crash_at: str
    step: str
    crashed: bool
    repeated_model_calls: int
    emails: int
    reply_matches: bool
    finished_model_steps: int
    replay_model_calls: int


@dataclass
class _Context:
    world: World
    world_name: str
    target: str | None  # as given; None: the workers inherit WORKFLOW_TARGET_WORLD
    url: str | None
    namespace: str
    inbox: Inbox
    folder: Path
    out: TextIO


async def _worker(ctx: _Context, queue: str, extra_env: dict[str, str]) -> tuple[int, int]:
    """Run one worker process for one turn; returns (exit status, pid)."""
    env = dict(os.environ)
    env.pop("CRASH_AT", None)
    env.update(
        {
            "WORLD_DEMO_SMTP": f"127.0.0.1:{ctx.inbox.port}",
            "WORLD_DEMO_MAILDIR": str(ctx.inbox.folder),
            "WORLD_DEMO_CALLS": str(ctx.folder / "model-calls.jsonl"),
            **extra_env,
        }
    )
    command = [sys.executable, "-m", "world_core._cli", "worker", "--agent", AGENT, "--once"]
    command += ["--wait", "60", "--lease", str(LEASE), "--queue", queue, "--json"]
    command += ["--namespace", ctx.namespace]
    if ctx.target is not None:
        command += ["--world", ctx.target]
    if ctx.url is not None:
        command += ["--url", ctx.url]
    process = await anyio.open_process(command, env=env, stdout=subprocess.PIPE, stderr=None)
    async with process:
        with anyio.fail_after(120):  # a wedged worker must not hang the demo
            await process.wait()
    assert process.returncode is not None
    return process.returncode, process.pid


async def _finished_model_digests(world: World, session: str) -> set[str]:
    events = await world.log.read(session_log_id(session))
    digests = set()
    for event in events:
        body = json.loads(event.data)
        if body.get("t") == "outcome" and body.get("kind") == "model":
            digests.add(body["digest"])
    return digests


def _calls_by(ctx: _Context, pid: int) -> list[str]:
    path = ctx.folder / "model-calls.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [row["digest"] for row in rows if row["pid"] == pid]


async def _steps(world: World, session: str) -> list[str]:
    steps: dict[int, str] = {}
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") == "outcome":
            steps[body["step"]] = f"{body['kind']}" + (
                f" {body['name']}" if body["kind"] == "tool" else ""
            )
    return [steps[n] for n in sorted(steps)]


async def _crash_point(
    ctx: _Context, index: int, crash_at: str, step: str, clean_reply: str, replay: str
) -> CrashRow:
    session = f"crash-{index}-{crash_at.replace(':', '-')}"
    queue = f"demo-{index}"
    client = Client(ctx.world, queue=queue)
    await client.submit(session, MESSAGE, turn_id=TURN)
    env = {"WORLD_DEMO_SEND_REPLAY": replay}
    status, _ = await _worker(ctx, queue, {**env, "CRASH_AT": crash_at})
    finished = await _finished_model_digests(ctx.world, session)
    calls: list[str] = []
    reply = None
    for _ in range(3):  # a crash inside send_email: the first replacement waits out its deadline
        _, pid = await _worker(ctx, queue, env)
        calls += _calls_by(ctx, pid)
        reply = await client.reply(session, TURN)
        if reply is not None:
            break
    repeated = sum(1 for digest in calls if digest in finished)
    return CrashRow(
        crash_at=crash_at,
        step=step,
        crashed=status == 1,
        repeated_model_calls=repeated,
        emails=len(ctx.inbox.messages(session)),
        reply_matches=reply == clean_reply,
        finished_model_steps=len(finished),
        replay_model_calls=len(calls),
    )


def _print_table(rows: list[CrashRow], out: TextIO) -> None:
    out.write(
        f"{'crash at':<14}{'step':<18}{'journaled':>10}{'replay':>8}{'repeated':>10}"
        f"{'emails':>8}  reply\n"
    )
    for row in rows:
        note = "" if row.crashed else "  (did not crash)"
        reply = "identical" if row.reply_matches else "DIFFERENT"
        out.write(
            f"{row.crash_at:<14}{row.step:<18}{row.finished_model_steps:>10}"
            f"{row.replay_model_calls:>8}{row.repeated_model_calls:>10}{row.emails:>8}"
            f"  {reply}{note}\n"
        )


async def _run(ctx: _Context, as_json: bool) -> int:
    say = ctx.out
    say.write(f"world demo on {ctx.world_name!r}, namespace {ctx.namespace}\n")
    say.write("clean turn ...\n")
    say.flush()
    client = Client(ctx.world, queue="demo-clean")
    await client.submit("clean", MESSAGE, turn_id=TURN)
    await _worker(ctx, "demo-clean", {"WORLD_DEMO_SEND_REPLAY": "never"})
    clean_reply = await client.reply("clean", TURN)
    if clean_reply is None:
        say.write("the clean turn produced no reply; see the worker's errors above\n")
        return 1
    steps = await _steps(ctx.world, "clean")
    say.write(f"  reply: {clean_reply!r}; steps: {', '.join(steps)}\n")
    points = [
        (f"{n}:{when}", step)
        for n, step in enumerate(steps)
        for when in ("before_run", "after_run")
    ]
    say.write(f"crashing at {len(points)} points, a fresh worker process after each ...\n")
    say.flush()
    rows: dict[str, CrashRow] = {}
    limiter = anyio.CapacityLimiter(4)

    async def one(index: int, crash_at: str, step: str) -> None:
        async with limiter:
            row = await _crash_point(ctx, index, crash_at, step, clean_reply, "never")
        rows[crash_at] = row
        say.write(
            f"  {crash_at:<12} repeated model calls {row.repeated_model_calls}, "
            f"emails {row.emails}, reply {'identical' if row.reply_matches else 'DIFFERENT'}\n"
        )
        say.flush()

    send_step = next(n for n, step in enumerate(steps) if step == "tool send_email")
    wrong_at = f"{send_step}:after_run"
    relabelled: list[CrashRow] = []

    async def wrong_label() -> None:
        # Independent of the matrix (its own session and queue), so it runs alongside.
        async with limiter:
            relabelled.append(
                await _crash_point(
                    ctx, len(points), wrong_at, steps[send_step], clean_reply, "safe"
                )
            )
        say.write(f"  send_email relabelled safe, {wrong_at}: emails {relabelled[0].emails}\n")
        say.flush()

    say.write(f"and, with send_email relabelled safe, at {wrong_at} ...\n")
    say.flush()
    async with anyio.create_task_group() as tg:
        for index, (crash_at, step) in enumerate(points):
            tg.start_soon(one, index, crash_at, step)
        tg.start_soon(wrong_label)
    ordered = [rows[crash_at] for crash_at, _ in points]
    wrong = relabelled[0]
    ok = all(
        r.crashed and r.repeated_model_calls == 0 and r.emails == 1 and r.reply_matches
        for r in ordered
    )
    if as_json:
        report: dict[str, Any] = {
            "world": ctx.world_name,
            "clean_reply": clean_reply,
            "steps": steps,
            "crash_points": [asdict(r) for r in ordered],
            "relabelled": {"send_email_replay": "safe", **asdict(wrong)},
            "targets_met": ok,
        }
        print(json.dumps(report, indent=2))
    else:
        print()
        print("journaled: model calls whose outcome was in the journal when the worker died")
        print("replay:    model calls the fresh worker made")
        print("repeated:  replay calls the journal already held (target 0)")
        _print_table(ordered, sys.stdout)
        print()
        print("send_email relabelled safe (wrong):")
        _print_table([wrong], sys.stdout)
        print()
        verdict = "met" if ok else "NOT met"
        print(
            f"targets {verdict}: zero repeated model calls, exactly one email, identical reply "
            "at every crash point."
        )
        if wrong.emails > 1:
            print(
                f"with the wrong label the recipient got {wrong.emails} emails: the duplicate "
                "the 'never' label prevents."
            )
    return 0 if ok and wrong.emails > 1 else 1


async def run_demo(
    *, world: str | None = None, url: str | None = None, as_json: bool = False
) -> int:
    """Run the demo; returns the exit status (0 when every target is met)."""
    namespace = f"demo_{secrets.token_hex(4)}"
    folder = Path(tempfile.mkdtemp(prefix="world-demo-"))
    name, _ = resolve_world(world)
    if name == "local" and url is None:
        # A fresh folder per run: nothing of a previous run is seen or left behind.
        url = str(folder / "world")
    try:
        async with open_world(world, url=url, namespace=namespace) as opened:
            return await _with_world(opened, world, url, namespace, folder, as_json)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _with_world(
    world: World, target: str | None, url: str | None, namespace: str, folder: Path, as_json: bool
) -> int:
    try:
        with Inbox(folder / "inbox") as inbox:
            ctx = _Context(
                world=world,
                world_name=world.name,
                target=target,
                url=url,
                namespace=namespace,
                inbox=inbox,
                folder=folder,
                out=sys.stderr if as_json else sys.stdout,
            )
            return await _run(ctx, as_json)
    finally:
        with anyio.CancelScope(shield=True):
            await world.purge()
