"""``world demo pydantic-ai``: a pydantic-ai agent's turn, crashed at every step.

The agent is :mod:`world_examples.pydantic_ai_agent`: plain pydantic-ai (``Agent``, three
tools, pydantic-ai's ``FunctionModel`` running a scripted policy: no API key) made durable
by the ``WorldDurability`` capability, run by ``world worker`` processes.

1. A clean turn, in one worker process: its steps (model requests and tool calls, each a
   journal step) and its reply.
2. The same turn crashed before and after every step, each in a session of its own: a
   worker process started with ``CRASH_AT=<step>:<when>`` dies there (``os._exit(1)``), then
   fresh worker processes take the turn over until it is done. Per crash point: model calls
   repeated (requests whose response the journal already held: paid twice, target 0),
   emails ``send_email`` (``never``) delivered to the real SMTP inbox (target exactly 1), and
   whether the reply matches the clean turn's.

The worker processes are ``world worker --once``, forked from a server process that imported
pydantic-ai, the agent and the World's backend once (``multiprocessing``'s forkserver): each
starts in milliseconds instead of a few seconds.

It runs on the World, namespace and inbox :func:`world_examples.demo.run_demo` sets up.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from world_core import Client, World, resolve_world, session_log_id
from world_examples.demo import (
    TURN,
    WORKER_WAIT,
    _Context,
    _Screen,
    _WorkerExit,
    _world_arguments,
    _world_lines,
    crash_header,
    crash_line,
    crash_points,
    run_crash_matrix,
)
from world_examples.inbox import Inbox
from world_examples.pydantic_ai_agent import MESSAGE, SEND_TIMEOUT

__all__ = ["PydanticAIRow", "introduce", "run"]

AGENT = "world_examples.pydantic_ai_agent:build_agent"
LEASE = 5.0
"""The worker processes' lease: a dead worker holds its turn this long. Longer than ``world
demo``'s 2 s: on a loaded machine a renewal can come late, and a worker that is no longer sure
it holds the turn refuses to send (``context.check()``). That refusal ends the attempt, not
the turn (the next worker process sends), but costs a process; the agent is built before the
claim, so building it (pydantic-ai's schemas) takes no leased time."""
PROCESS_SECONDS = 120.0
"""The longest one worker process may take (a wedged one is killed)."""
MAX_PROCESSES = 5
"""Worker processes taking a crashed turn over, at most (a cut-off send needs two: one finds
the send's deadline ahead and re-queues the turn, the next answers for it)."""


@dataclass(frozen=True)
class PydanticAIRow:
    """One crash point: where, what the step was, and the three numbers."""

    crash_at: str
    step: str
    crashed: bool
    """The first worker process died at its crash point."""
    repeated_model_calls: int
    """Model requests the workers taking over sent whose response the journal already held
    (target 0)."""
    effects: int
    """Emails that reached the inbox for this turn (target 1)."""
    reply_matches: bool
    journaled_model_calls: int
    """Model responses in the journal when the worker died."""
    replay_model_calls: int
    """Model requests sent after the crash, by the workers taking over."""
    told_possibly_ran: bool
    """The model was told send_email "may or may not have happened"."""
    checked_sent: str | None
    """What check_sent answered (None: not called)."""
    processes: list[str]
    """Each worker process's turn status, in order (``crash``: it died at CRASH_AT)."""
    seconds: float
    note: str = ""
    """Why the turn has no reply, when it has none (its recorded failure)."""


_preloaded: list[str] = []


def _processes(ctx: _Context) -> Any:
    """Where the worker processes come from: ``multiprocessing``'s forkserver, whose server
    imports pydantic-ai, the agent and the World's backend once, so each ``world worker``
    process starts in milliseconds instead of importing them again."""
    mp = multiprocessing.get_context("forkserver")
    if not _preloaded:
        _, factory = resolve_world(ctx.target)
        backend = factory.__module__.split(".")[0]
        _preloaded.extend(["__main__", "world_examples.pydantic_ai_agent", backend])
        mp.set_forkserver_preload(_preloaded)
    return mp


def _worker_process(arguments: list[str], env: dict[str, str], out: str) -> None:
    """A forked process's body: ``world worker`` with ``arguments``, its JSON line in ``out``
    (none when it dies at its CRASH_AT, with ``os._exit(1)``)."""
    from world_core._cli import main

    os.environ.pop("CRASH_AT", None)
    os.environ.update(env)
    with Path(out).open("w", encoding="utf-8") as output, contextlib.redirect_stdout(output):
        status = main(arguments)
    sys.exit(status)


async def _run_worker(ctx: _Context, queue: str, extra_env: dict[str, str]) -> _WorkerExit:
    """One ``world worker --once`` process (forked) running the pydantic-ai agent for a turn
    of ``queue``; how it ended."""
    env = {
        "WORLD_DEMO_SMTP": f"127.0.0.1:{ctx.inbox.port}",
        "WORLD_DEMO_MAILDIR": str(ctx.inbox.folder),
        "WORLD_DEMO_CALLS": str(ctx.folder / "model-calls.jsonl"),
        **extra_env,
    }
    arguments = ["worker", "--agent", AGENT, "--once", "--wait", str(WORKER_WAIT)]
    arguments += ["--lease", str(LEASE), "--queue", queue, "--json", *_world_arguments(ctx)]
    out = ctx.folder / f"worker-{queue}-{time.monotonic_ns()}.json"
    process = _processes(ctx).Process(
        target=_worker_process, args=(arguments, env, str(out)), daemon=True
    )
    process.start()
    await anyio.to_thread.run_sync(process.join, PROCESS_SECONDS)
    if process.exitcode is None:  # wedged: the demo must not hang
        process.kill()
        await anyio.to_thread.run_sync(process.join, 5.0)
    try:
        result = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        result = None
    pid = int(process.pid or 0)
    code = -9 if process.exitcode is None else int(process.exitcode)
    return _WorkerExit(code, pid, result if isinstance(result, dict) else None)


@dataclass(frozen=True)
class _Step:
    kind: str
    name: str
    result: dict[str, Any]


async def _steps(world: World, session: str) -> list[_Step]:
    """The recorded steps of the session's turn, in step order."""
    found: dict[int, _Step] = {}
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") == "outcome":
            found[int(body["step"])] = _Step(body["kind"], body["name"], body.get("result") or {})
    return [found[n] for n in sorted(found)]


def _label(step: _Step) -> str:
    if step.kind == "model":
        return "model"
    return f"tool {step.name.rpartition(':')[2] or step.name.rpartition('.')[2]}"


def _calls(ctx: _Context, pid: int) -> list[str]:
    """Digests of the model requests worker process ``pid`` sent, in order."""
    path = ctx.folder / "model-calls.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [str(row["digest"]) for row in rows if row["pid"] == pid]


def _tool_output(step: _Step) -> str:
    output = step.result.get("output")
    if isinstance(output, dict):
        return str(output.get("result"))
    return str(output)


async def _point(
    ctx: _Context, index: int, crash_at: str, step: str, clean_reply: str
) -> PydanticAIRow:
    started = time.monotonic()
    session = f"pydantic-ai-{index}-{crash_at.replace(':', '-')}"
    queue = f"pydantic-ai-{index}"
    client = Client(ctx.world, queue=queue)
    await client.submit(session, MESSAGE, turn_id=TURN)
    first = await _run_worker(ctx, queue, {"CRASH_AT": crash_at})
    crashed = first.result is None and first.returncode == 1
    processes = ["crash" if crashed else str((first.result or {}).get("status", "exit"))]
    journaled = sum(1 for s in await _steps(ctx.world, session) if s.kind == "model")
    paid = set(_calls(ctx, first.pid)[:journaled])
    replay: list[str] = []
    reply = await client.reply(session, TURN)
    for _ in range(MAX_PROCESSES):
        if reply is not None:
            break
        ended = await _run_worker(ctx, queue, {})
        status = str((ended.result or {}).get("status", f"exit {ended.returncode}"))
        processes.append(status)
        replay += _calls(ctx, ended.pid)
        reply = await client.reply(session, TURN)
        if status in ("failed", "idle") or status.startswith("exit"):
            break  # over (its failure is recorded), or nothing left to take over
    note = ""
    if reply is None:
        failure = await client.failure(session, TURN)
        note = str(failure) if failure else "no reply after " + ", ".join(processes)
    steps = await _steps(ctx.world, session)
    told = any(s.name.endswith(":send_email") and s.result.get("interrupted") for s in steps)
    checks = [_tool_output(s) for s in steps if s.name.endswith(":check_sent")]
    return PydanticAIRow(
        crash_at=crash_at,
        step=step,
        crashed=crashed,
        repeated_model_calls=sum(1 for digest in replay if digest in paid),
        effects=len(ctx.inbox.messages(session)),
        reply_matches=reply == clean_reply,
        journaled_model_calls=journaled,
        replay_model_calls=len(replay),
        told_possibly_ran=told,
        checked_sent=checks[-1] if checks else None,
        processes=processes,
        seconds=round(time.monotonic() - started, 1),
        note=note,
    )


_HEADER = crash_header("effects")


def _row(row: PydanticAIRow) -> str:
    return crash_line(
        crash_at=row.crash_at,
        step=row.step,
        journaled=row.journaled_model_calls,
        replay=row.replay_model_calls,
        repeated=row.repeated_model_calls,
        effects=row.effects,
        reply_matches=row.reply_matches,
        told_possibly_ran=row.told_possibly_ran,
        crashed=row.crashed,
        effects_label="effects",
    )


def _legend(points: int) -> Iterator[str]:
    yield f"2. The same turn crashed at {points} points, each in a session of its own; after each"
    yield "   crash fresh worker processes take it over once the dead one's lease ran out."
    yield "   n:before_run  killed just before step n's call; for send_email its intent is durable"
    yield "   n:after_run   killed just after step n's call returned, before its outcome is written"
    yield ""
    yield "   journaled  model responses in the journal when the worker died"
    yield "   replay     model requests sent after the crash, by the workers taking over"
    yield "   repeated   replay requests whose response the journal already held (target 0)"
    yield "   effects    emails send_email delivered to the inbox for this turn (target 1)"
    yield "   reply      the final reply compared with the clean turn's (target identical)"
    yield ""


def _footnote(rows: list[PydanticAIRow]) -> Iterator[str]:
    told = [row for row in rows if row.told_possibly_ran]
    if not told:
        return
    yield "   * send_email is labelled never: it is not run again. The turn was held until its"
    yield f"     deadline ({SEND_TIMEOUT:g} s after the send began), then pydantic-ai got a failed"
    yield '     tool call saying the email "may or may not have happened", and the model looked:'
    for row in told:
        found = row.checked_sent or "did not check"
        yield f"       {row.crash_at:<14}check_sent said {found!r}"


async def run(ctx: _Context, as_json: bool) -> int:
    """The demo, on ``ctx``'s World; returns the exit status."""
    say = ctx.screen
    started = time.monotonic()
    say.line("1. The clean turn, in one worker process ...")
    client = Client(ctx.world, queue="pydantic-ai-clean")
    await client.submit("pydantic-ai-clean", MESSAGE, turn_id=TURN)
    ended = await _run_worker(ctx, "pydantic-ai-clean", {})
    clean_reply = await client.reply("pydantic-ai-clean", TURN)
    if clean_reply is None:
        said = ended.result or f"exit status {ended.returncode}"
        say.line(f"the clean turn produced no reply ({said}); anything the worker said is above")
        return 1
    steps = [_label(s) for s in await _steps(ctx.world, "pydantic-ai-clean")]
    say.line("   steps  " + ", ".join(f"{n} {label}" for n, label in enumerate(steps)))
    say.line(f"   reply  {clean_reply!r}  ({time.monotonic() - started:.1f} s)")
    say.line()
    points = crash_points(steps)
    if as_json:
        say.line(f"2. crashing at {len(points)} points, fresh worker processes after each ...")
    else:
        for text in _legend(len(points)):
            say.line(text)
        say.line(_HEADER)

    def show(row: PydanticAIRow) -> None:
        if not as_json:
            say.line(_row(row))

    ordered = await run_crash_matrix(
        len(points),
        lambda index: _point(ctx, index, *points[index], clean_reply),
        show,
        progress=lambda done: say.progress(f"   {done}/{len(points)} crash points done"),
    )
    say.end_progress()
    ok = all(
        r.crashed and r.repeated_model_calls == 0 and r.effects == 1 and r.reply_matches
        for r in ordered
    )
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        report: dict[str, Any] = {
            "demo": "pydantic-ai",
            "world": ctx.world_name,
            "namespace": ctx.namespace,
            "clean_reply": clean_reply,
            "steps": steps,
            "send_timeout": SEND_TIMEOUT,
            "crash_points": [asdict(r) for r in ordered],
            "targets_met": ok,
            "seconds": seconds,
        }
        print(json.dumps(report, indent=2))
        say.line(f"done in {seconds:.0f} s: targets {'met' if ok else 'NOT met'}")
        return 0 if ok else 1
    for text in _footnote(ordered):
        say.line(text)
    say.line()
    verdict = "met" if ok else "NOT met"
    say.line(
        f"Targets {verdict}: zero repeated model calls, exactly one email and an identical reply"
    )
    say.line(f"at every crash point. ({seconds:.0f} s in all)")
    return 0 if ok else 1


def introduce(
    screen: _Screen, world: World, namespace: str, base: str | None, where: str | None, inbox: Inbox
) -> None:
    """The pydantic-ai demo's opening lines."""
    screen.line(
        f"world demo pydantic-ai: a pydantic-ai agent's turn, crashed at every step, on the "
        f"{world.name!r} World"
    )
    screen.line()
    for text in _world_lines(world, namespace, base, where):
        screen.line(text)
    screen.line("   agent   pydantic-ai Agent + WorldDurability(): each model request and tool")
    screen.line("           call is a journal step (world_examples.pydantic_ai_agent)")
    screen.line("   tools   lookup_note (safe), send_email (never: not run twice),")
    screen.line("           check_sent (safe: reads the inbox)")
    screen.line(
        f"   inbox   a real SMTP server on 127.0.0.1:{inbox.port}; emails are counted there"
    )
    lease, deadline = f"{LEASE:g} s", f"{SEND_TIMEOUT:g} s"
    screen.line(f"   time    under a minute: a dead worker holds its turn for its {lease} lease;")
    screen.line(f"           a crash at send_email also waits for its {deadline} deadline")
    screen.line()
