"""``world demo openai-agents``: an OpenAI Agents SDK agent, crashed at every step.

The agent of :mod:`world_examples.openai_agents_agent`: plain SDK code (``Agent``,
``@function_tool``) with a scripted SDK ``Model``, made durable by
:class:`~world_core.integrations.openai_agents.DurableAgent` (a replay label per tool).

1. A clean turn in one worker process (``world worker --agent
   world_examples.openai_agents_agent:build_agent``): its steps and reply are the baseline.
2. For every step of it, before and after the call: a fresh session runs the same turn in a
   worker process started with ``CRASH_AT=<step>:<when>`` (it dies there with ``os._exit(1)``),
   then fresh worker processes continue it once the lease runs out. Per crash point: model
   calls the later processes repeated for steps the journal already held (target 0), emails
   the inbox received (target exactly 1), and whether the reply matches the clean one.
3. ``send_email`` relabelled ``safe``, crashed after it ran: the duplicate email arrives.

``--json`` prints one report: ``crash_points`` holds one object per crash point with
``crash_at``, ``repeated_model_calls``, ``effects`` (emails at the inbox) and
``reply_matches`` (and what else the table shows).

``WORLD_DEMO_CRASH_POINTS=2:after_run,3:after_run`` runs only those crash points (each worker
process imports the SDK, about 3 s of CPU: the whole matrix takes a minute or two on a small
machine).

It runs on the World, namespace and inbox :func:`world_examples.demo.run_demo` sets up.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from world_core import Client, ConfigurationError, World, parse_crash_at, session_log_id
from world_examples.crash_agent import MESSAGE, SEND_TIMEOUT
from world_examples.demo import (
    LEASE,
    TURN,
    _Context,
    _journal,
    _run_worker,
    _Screen,
    _world_lines,
    crash_header,
    crash_line,
    crash_points,
    run_crash_matrix,
)
from world_examples.inbox import Inbox

__all__ = ["AGENT", "POINTS_VARIABLE", "OpenAIAgentsRow", "introduce", "run"]

AGENT = "world_examples.openai_agents_agent:build_agent"
POINTS_VARIABLE = "WORLD_DEMO_CRASH_POINTS"
MAX_PROCESSES = 4
"""Worker processes that continue a crashed turn at most (a crash in the send needs two)."""


@dataclass(frozen=True)
class OpenAIAgentsRow:
    """One crash point: where, what the step was, and the three targets."""

    crash_at: str
    step: str
    crashed: bool
    repeated_model_calls: int
    """Model calls made after the crash for steps whose reply the journal held (target 0)."""
    effects: int
    """Emails of the turn at the SMTP inbox (target 1)."""
    reply_matches: bool
    finished_model_steps: int
    """Model calls whose reply was in the journal when the worker died."""
    replay_model_calls: int
    """Model calls the processes taking over made."""
    told_possibly_ran: bool = False
    seconds: float = 0.0


def _calls(ctx: _Context) -> list[dict[str, Any]]:
    path = ctx.folder / "model-calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


async def _model_outcomes(world: World, session: str) -> int:
    count = 0
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        count += body.get("t") == "outcome" and body.get("kind") == "model"
    return count


async def _crash_point(
    ctx: _Context, index: int, crash_at: str, step: str, clean: str, replay: str
) -> OpenAIAgentsRow:
    started = time.monotonic()
    session = f"oa-{index}-{crash_at.replace(':', '-')}"
    queue = f"oa-{index}"
    client = Client(ctx.world, queue=queue)
    await client.submit(session, MESSAGE, turn_id=TURN)
    env = {"WORLD_DEMO_SEND_REPLAY": replay}
    crashed = await _run_worker(ctx, queue, {**env, "CRASH_AT": crash_at}, agent=AGENT)
    held = await _model_outcomes(ctx.world, session)
    # The dead worker's calls, in order; the first `held` of them are in the journal.
    finished = [c["digest"] for c in _calls(ctx) if c["pid"] == crashed.pid][:held]
    later: list[str] = []
    reply = None
    for _ in range(MAX_PROCESSES):  # a crash in the send: re-queued until its deadline
        ended = await _run_worker(ctx, queue, env, agent=AGENT)
        later += [c["digest"] for c in _calls(ctx) if c["pid"] == ended.pid]
        reply = await client.reply(session, TURN)
        if reply is not None:
            break
    steps = await _journal(ctx.world, session)
    return OpenAIAgentsRow(
        crash_at=crash_at,
        step=step,
        crashed=crashed.returncode == 1 and crashed.result is None,
        repeated_model_calls=sum(1 for digest in later if digest in finished),
        effects=len(ctx.inbox.messages(session)),
        reply_matches=reply == clean,
        finished_model_steps=held,
        replay_model_calls=len(later),
        told_possibly_ran=any(s.name == "send_email" and s.interrupted for s in steps),
        seconds=round(time.monotonic() - started, 1),
    )


_HEADER = crash_header()


def _row(row: OpenAIAgentsRow) -> str:
    return crash_line(
        crash_at=row.crash_at,
        step=row.step,
        journaled=row.finished_model_steps,
        replay=row.replay_model_calls,
        repeated=row.repeated_model_calls,
        effects=row.effects,
        reply_matches=row.reply_matches,
        told_possibly_ran=row.told_possibly_ran,
        crashed=row.crashed,
    )


def _met(row: OpenAIAgentsRow) -> bool:
    return row.crashed and row.repeated_model_calls == 0 and row.effects == 1 and row.reply_matches


def _wanted() -> list[str]:
    """The crash points ``WORLD_DEMO_CRASH_POINTS`` names (none: all).

    Raises:
        ConfigurationError: one is not ``<step>:before_run`` or ``<step>:after_run``.
    """
    wanted = [p.strip() for p in os.environ.get(POINTS_VARIABLE, "").split(",") if p.strip()]
    for point in wanted:
        try:
            parse_crash_at(point)
        except ConfigurationError:
            raise ConfigurationError(
                f"{POINTS_VARIABLE}={','.join(wanted)}: {point!r} is not a crash point; use "
                "<step>:before_run or <step>:after_run, comma-separated (2:after_run,3:after_run)"
            ) from None
    return wanted


def _chosen(points: list[tuple[str, str]], wanted: list[str]) -> list[tuple[str, str]]:
    """The crash points of ``points`` that ``wanted`` names (all when it is empty).

    Raises:
        ConfigurationError: it names a point the clean turn does not have.
    """
    if not wanted:
        return points
    known = [crash_at for crash_at, _ in points]
    unknown = [p for p in wanted if p not in known]
    if unknown:
        raise ConfigurationError(
            f"{POINTS_VARIABLE}={','.join(wanted)}: the clean turn has no crash point "
            f"{', '.join(unknown)}; choose from {','.join(known)}"
        )
    return [point for point in points if point[0] in wanted]


async def run(ctx: _Context, as_json: bool) -> int:
    """The demo, on ``ctx``'s World; returns the exit status (0: every target met)."""
    say = ctx.screen
    started = time.monotonic()
    wanted = _wanted()  # refused before anything runs
    say.line("1. The clean turn, in one worker process ...")
    client = Client(ctx.world, queue="oa-clean")
    await client.submit("oa-clean", MESSAGE, turn_id=TURN)
    ended = await _run_worker(ctx, "oa-clean", {"WORLD_DEMO_SEND_REPLAY": "never"}, agent=AGENT)
    clean = await client.reply("oa-clean", TURN)
    if clean is None:
        say.line(
            f"the clean turn produced no reply (worker exit status {ended.returncode}, "
            f"result {ended.result}); anything the worker said is above"
        )
        return 1
    steps = [s.label for s in await _journal(ctx.world, "oa-clean")]
    say.line("   steps  " + ", ".join(f"{n} {label}" for n, label in enumerate(steps)))
    say.line(f"   reply  {clean!r}  ({time.monotonic() - started:.1f} s)")
    say.line()
    points = _chosen(crash_points(steps), wanted)
    send = next(n for n, step in enumerate(steps) if step == "tool send_email")
    say.line(f"2. The same turn crashed at {len(points)} points, a fresh worker process after")
    say.line("   each (n:before_run: just before step n's call; n:after_run: just after it")
    say.line("   returned, before its outcome is written). Targets: repeated 0, emails 1.")
    if not as_json:
        say.line(_HEADER)
    wrong: list[OpenAIAgentsRow] = []

    def show(row: OpenAIAgentsRow) -> None:
        if not as_json:
            say.line(_row(row))

    async def relabelled() -> None:
        point = f"{send}:after_run"
        wrong.append(await _crash_point(ctx, len(points), point, steps[send], clean, "safe"))

    ordered = await run_crash_matrix(
        len(points),
        lambda index: _crash_point(ctx, index, *points[index], clean, "never"),
        show,
        alongside=relabelled,
    )
    ok = all(_met(row) for row in ordered)
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        report: dict[str, Any] = {
            "demo": "openai-agents",
            "world": ctx.world_name,
            "namespace": ctx.namespace,
            "clean_reply": clean,
            "steps": steps,
            "crash_points": [asdict(row) for row in ordered],
            "relabelled": {"send_email_replay": "safe", **asdict(wrong[0])},
            "targets_met": ok,
            "seconds": seconds,
        }
        print(json.dumps(report, indent=2))
        say.line(f"done in {seconds:.0f} s: targets {'met' if ok else 'NOT met'}")
        return 0 if ok else 1
    if any(row.told_possibly_ran for row in ordered):
        say.line("   * send_email is labelled never: the turn was held until its deadline")
        say.line(f"     ({SEND_TIMEOUT:g} s after the send began), then the model was told it")
        say.line('     "may or may not have happened" and checked the inbox before sending.')
    say.line()
    say.line(f"3. The same crash at {send}:after_run with send_email relabelled safe (wrong):")
    say.line(_HEADER)
    say.line(_row(wrong[0]))
    say.line(f"   the worker taking over sent it again: {wrong[0].effects} emails.")
    say.line()
    verdict = "met" if ok else "NOT met"
    say.line(f"Targets {verdict}: zero repeated model calls, exactly one email and an identical")
    say.line(f"reply at every crash point. ({seconds:.0f} s in all)")
    return 0 if ok else 1


def introduce(
    screen: _Screen, world: World, namespace: str, base: str | None, where: str | None, inbox: Inbox
) -> None:
    """The demo's opening lines."""
    screen.line(
        f"world demo openai-agents: an OpenAI Agents SDK agent, crashed at every step, on the "
        f"{world.name!r} World"
    )
    screen.line()
    for text in _world_lines(world, namespace, base, where):
        screen.line(text)
    screen.line("   agent   agents.Agent with @function_tool tools: lookup_note (safe), send_email")
    screen.line("           (never: not run twice), check_sent (safe: reads the inbox); made")
    screen.line("           durable by DurableAgent(agent, replay={...}); SDK tracing off")
    screen.line(
        f"   inbox   a real SMTP server on 127.0.0.1:{inbox.port}; emails are counted there"
    )
    lease, deadline = f"{LEASE:g} s", f"{SEND_TIMEOUT:g} s"
    screen.line(f"   time    under a minute: a dead worker holds its turn for its {lease} lease;")
    screen.line(f"           a crash at send_email also waits for its {deadline} deadline")
    screen.line()
