"""``world demo approval``: a tool call that waits for a person, crashed around the wait.

The agent of ``world demo`` with one change: ``send_email`` (``never``) is declared
``approval="required"``, so before each send the turn stops (suspends, holding no worker)
until someone approves or rejects it, or the approval times out.

1. Two clean turns, the baselines: in one the demo approves the send from another process
   (``world approve SESSION TURN STEP``) as soon as a worker reports the turn suspended; in
   the other nobody decides and the approval times out.
2. The approved turn crashed around the approval and around the send, each time in a fresh
   session: worker processes started with ``CRASH_AT=<step>:<when>`` until one dies there
   (``os._exit(1)``), then fresh worker processes until the turn is done; whenever one
   reports the turn suspended, the demo approves it, again from another process. Per crash
   point: approvals consumed (read from the session log), emails received (counted at the
   inbox), and whether the reply matches the clean approved turn's.
3. The turn nobody approves, crashed after its timeout passed: no email, and a reply that
   says why.

It runs on the World, namespace and inbox :func:`world_examples.demo.run_demo` sets up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from world_core import Client, World, session_log_id
from world_examples.crash_agent import APPROVAL_TIMEOUT, MESSAGE, SEND_TIMEOUT
from world_examples.demo import (
    LEASE,
    TURN,
    _Context,
    _journal,
    _note,
    _run_worker,
    _Screen,
    _world_arguments,
    _world_lines,
)
from world_examples.inbox import Inbox

__all__ = ["ApprovalRow", "introduce", "run"]

AGENT = "world_examples.crash_agent:build_approval_agent"
REVIEWER = "demo-reviewer"
"""Who approves (``world approve --by``): recorded with the approval."""
SHORT_TIMEOUT = 3.0
"""The approval timeout of the turns nobody approves (the others wait up to
:data:`~world_examples.crash_agent.APPROVAL_TIMEOUT`, far longer than the demo runs)."""
MAX_PROCESSES = 10
"""Worker processes one turn gets at most (a crash point needs up to six)."""


@dataclass(frozen=True)
class ApprovalRow:
    """One turn of the approval demo: where it was crashed, what it asked and consumed, what
    reached the inbox, and how its reply compares with the clean turn's."""

    crash_at: str
    """The crash points, ``+`` between two (two workers, one after the other); ``""``: none."""
    step: str
    """What the crash point is, in words."""
    crashed: bool
    """Every crash asked for happened."""
    approvals_asked: int
    """Approval steps in the turn (a call waiting for a decision)."""
    approvals_given: int
    """``world approve`` processes the demo ran for the turn."""
    approvals_consumed: int
    """Approvals the turn consumed: outcomes of kind ``approval`` carrying a signal."""
    approved_by: list[str]
    """Who gave each approval consumed (the signal's sender: ``world approve --by``)."""
    approvals_target: int
    """Approvals the turn should consume: 1 (a retry of a cut-off send is covered by the
    approval already given)."""
    tool_runs: int
    """send_email runs: emails the inbox received for the turn."""
    tool_runs_target: int
    reply_matches: bool
    reply: str | None
    workers: list[str] = field(default_factory=list)
    """What happened, in order: each worker process's turn status (``crash`` when it died at
    its crash point), and ``approve`` for each ``world approve`` process."""
    told_possibly_ran: bool = False
    checked_sent: str | None = None
    note: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class _Plan:
    crash_at: tuple[str, ...]  # CRASH_AT of the crash workers, in order
    step: str
    approve: bool
    approvals: int  # the targets: approvals consumed (and asked for, when approving)
    emails: int


async def _approve(ctx: _Context, queue: str, session: str, turn: str, step: int) -> str | None:
    """``world approve SESSION TURN STEP`` as a process of its own; None, or why it failed."""
    command = [sys.executable, "-m", "world_core._cli", "approve", session, turn, str(step)]
    command += ["--by", REVIEWER, "--queue", queue, *_world_arguments(ctx)]
    env = {k: v for k, v in os.environ.items() if k != "CRASH_AT"}
    with anyio.fail_after(60):
        done = await anyio.run_process(
            command, env=env, check=False, start_new_session=True, stderr=subprocess.PIPE
        )
    if done.returncode == 0:
        return None
    said = done.stderr.decode("utf-8", "replace").strip()
    return f"world approve exited with status {done.returncode}: {said}"


async def _approvals(world: World, session: str) -> tuple[int, list[str]]:
    """From the session log: the approval steps, and the sender of each approval consumed
    (outcomes of kind ``approval`` carrying a signal), in step order."""
    asked = 0
    senders: list[str] = []
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("kind") != "approval":
            continue
        signal = (body.get("result") or {}).get("signal")
        if body.get("t") == "intent":
            asked += 1
        elif body.get("t") == "outcome" and isinstance(signal, dict):
            senders.append(str(signal.get("sender")))
    return asked, senders


async def _turn(
    ctx: _Context, index: int, plan: _Plan, approval_timeout: float, expected: str | None
) -> ApprovalRow:
    """Run the demo turn in a session of its own, crashed as ``plan`` says, to its end."""
    started = time.monotonic()
    label = "+".join(plan.crash_at)
    session = f"approval-{index}" + (f"-{label}" if label else "-clean")
    session = session.replace(":", "-").replace("+", "-")
    queue = f"approval-{index}"
    client = Client(ctx.world, queue=queue)
    await client.submit(session, MESSAGE, turn_id=TURN)
    env = {"WORLD_DEMO_APPROVAL_TIMEOUT": f"{approval_timeout:g}"}
    crashes = list(plan.crash_at)
    workers: list[str] = []
    given = 0
    problem = ""
    reply = None
    for _ in range(MAX_PROCESSES):
        extra = {**env, "CRASH_AT": crashes[0]} if crashes else env
        ended = await _run_worker(ctx, queue, extra, agent=AGENT)
        status = str((ended.result or {}).get("status", f"exit {ended.returncode}"))
        if ended.result is None and ended.returncode == 1 and crashes:
            crashes.pop(0)
            status = "crash"
        workers.append(status)
        reply = await client.reply(session, TURN)
        if reply is not None or status in ("failed", "idle") or status.startswith("exit"):
            break
        if status == "suspended" and plan.approve:
            for pending in await client.pending_approvals(session):
                failed = await _approve(ctx, queue, session, pending.turn_id, pending.step)
                if failed is not None:
                    problem = failed
                    break
                given += 1
                workers.append("approve")
            if problem:
                break
    if reply is None and not problem:
        failure = await client.failure(session, TURN)
        problem = str(failure) if failure else f"no reply after {', '.join(workers)}"
    asked, senders = await _approvals(ctx.world, session)
    told, checked, note = _note(await _journal(ctx.world, session), "never")
    if told and checked is not None and not checked.startswith("yes"):
        note += "; the approval already given covered the retry"
    return ApprovalRow(
        crash_at=label,
        step=plan.step,
        crashed=not crashes,
        approvals_asked=asked,
        approvals_given=given,
        approvals_consumed=len(senders),
        approved_by=senders,
        approvals_target=plan.approvals,
        tool_runs=len(ctx.inbox.messages(session)),
        tool_runs_target=plan.emails,
        reply_matches=expected is not None and reply == expected,
        reply=reply,
        workers=workers,
        told_possibly_ran=told,
        checked_sent=checked,
        note=problem or note,
        seconds=round(time.monotonic() - started, 1),
    )


def _missed(row: ApprovalRow, plan: _Plan) -> list[str]:
    """The targets ``row`` missed, in words (none: all met)."""
    asks = plan.approvals if plan.approve else 1
    missed = [] if row.crashed else ["did not crash"]
    if row.approvals_asked != asks:
        missed.append(f"asked {row.approvals_asked} times, expected {asks}")
    if row.approvals_consumed != plan.approvals:
        missed.append(f"consumed {row.approvals_consumed} approvals, target {plan.approvals}")
    if row.tool_runs != plan.emails:
        missed.append(f"{row.tool_runs} emails, target {plan.emails}")
    if not row.reply_matches:
        missed.append(f"reply {row.reply!r}")
    if missed and row.note:
        missed.append(row.note)
    return missed


_HEADER = f"{'crash at':<26}{'asked':>5}{'consumed':>10}{'emails':>8}  reply"


def _row(row: ApprovalRow) -> Iterator[str]:
    reply = "identical" if row.reply_matches else "DIFFERENT"
    mark = " *" if row.told_possibly_ran else ""
    extra = "" if row.crashed else "  (did not crash)"
    yield (
        f"{row.crash_at:<26}{row.approvals_asked:>5}{row.approvals_consumed:>10}"
        f"{row.tool_runs:>8}  {reply}{mark}{extra}"
    )
    yield "    " + " > ".join(row.workers)


def _plans(steps: list[str]) -> list[_Plan]:
    """The crash points, from the clean turn's steps: around its approval and its send."""
    wait = steps.index("approval send_email")
    send = steps.index("tool send_email")
    return [
        _Plan((f"{wait}:before_run",), "approval: intent durable, not yet suspended", True, 1, 1),
        _Plan((f"{wait}:after_run",), "approval: found, its outcome not written", True, 1, 1),
        _Plan((f"{send}:before_run",), "send_email: intent durable, not sent", True, 1, 1),
        _Plan((f"{send}:after_run",), "send_email: sent, its outcome not written", True, 1, 1),
        _Plan(
            (f"{wait}:before_run", f"{send}:after_run"),
            "while waiting, then after the send",
            True,
            1,
            1,
        ),
    ]


def _legend(plans: list[_Plan]) -> Iterator[str]:
    wait, send = plans[0].crash_at[0].split(":")[0], plans[2].crash_at[0].split(":")[0]
    both = f"{wait}:before_run+{send}:after_run"
    points = len(plans)
    yield f"2. The approved turn crashed at {points} points, each in a session of its own. Worker"
    yield "   processes run it with CRASH_AT until one dies there, then fresh ones (once the dead"
    yield "   one's lease ran out) until it is done; whenever one reports the turn suspended, the"
    yield "   demo approves the send from another process (world approve)."
    yield f"   {wait}:before_run  the approval's intent is durable; killed before it looks for a"
    yield "                 decision, so before the turn suspends"
    yield f"   {wait}:after_run   the approval was found; killed before its outcome is written"
    yield f"   {send}:before_run  send_email's intent is durable; killed before it sends"
    yield f"   {send}:after_run   send_email returned; killed before its outcome is written"
    yield f"   {both}  one worker dies while the turn waits, another after the send"
    yield ""
    yield "   asked     approvals the turn asked for (its approval steps)"
    yield "   consumed  approvals it consumed, read from the session log: one per ask, never one"
    yield "             twice (target 1)"
    yield "   emails    send_email runs, counted at the inbox (target 1)"
    yield "   reply     the final reply compared with the clean approved turn's (target identical)"
    yield "   below     what happened, in order: crash (a worker died at its crash point),"
    yield "             suspended (the turn waits for a decision, holding no worker), approve"
    yield "             (world approve ran), waiting (held until a cut-off send's deadline), done"
    yield ""


def _footnote(rows: list[ApprovalRow]) -> Iterator[str]:
    marked = [row for row in rows if row.told_possibly_ran]
    if not marked:
        return
    deadline = f"{SEND_TIMEOUT:g} s"
    yield "   * Cut off around the send, send_email might have sent: the turn was held until its"
    yield f"     deadline ({deadline} after the send began), then the model was told the email"
    yield '     "may or may not have happened" and looked. Where nothing had gone out it sent'
    yield "     again: the same call, so the approval already given covers it (no second ask)"
    yield "     and its idempotency key is the first call's."


def _wrapped(prefix: str, text: str, width: int = 90) -> list[str]:
    return textwrap.wrap(
        text, width=width, initial_indent=prefix, subsequent_indent=" " * len(prefix)
    )


def _baseline_missed(approved: ApprovalRow, timed_out: ApprovalRow) -> list[str]:
    """What the clean turns got wrong (none: both as expected)."""
    missed = []
    if (approved.approvals_consumed, approved.tool_runs) != (1, 1):
        missed.append(
            f"the clean approved turn consumed {approved.approvals_consumed} approvals and "
            f"sent {approved.tool_runs} emails (targets 1, 1)"
        )
    if (timed_out.approvals_consumed, timed_out.tool_runs) != (0, 0):
        missed.append(
            f"the clean turn nobody approved consumed {timed_out.approvals_consumed} "
            f"approvals and sent {timed_out.tool_runs} emails (targets 0, 0)"
        )
    return missed


def _baseline(row: ApprovalRow) -> dict[str, Any]:
    """A clean turn's record for the JSON report (what it did, not targets)."""
    keys = ["approvals_asked", "approvals_given", "approvals_consumed", "approved_by"]
    keys += ["tool_runs", "reply", "workers", "seconds"]
    return {key: getattr(row, key) for key in keys}


async def run(ctx: _Context, as_json: bool) -> int:
    """The demo, on ``ctx``'s World; returns the exit status."""
    say = ctx.screen
    started = time.monotonic()
    say.line("1. Two clean turns: one the demo approves, one nobody decides on ...")
    baselines: dict[str, ApprovalRow] = {}

    async def baseline(name: str, index: int, plan: _Plan, approval_timeout: float) -> None:
        baselines[name] = await _turn(ctx, index, plan, approval_timeout, None)

    async with anyio.create_task_group() as tg:
        tg.start_soon(baseline, "approved", 0, _Plan((), "", True, 1, 1), APPROVAL_TIMEOUT)
        tg.start_soon(baseline, "unanswered", 1, _Plan((), "", False, 0, 0), SHORT_TIMEOUT)
    approved, timed_out = baselines["approved"], baselines["unanswered"]
    if approved.reply is None or timed_out.reply is None:
        for name, base in baselines.items():
            if base.reply is None:
                say.line(f"the clean {name} turn produced no reply: {base.note}")
        return 1
    steps = [s.label for s in await _journal(ctx.world, "approval-0-clean")]
    numbered = ", ".join(f"{n} {label}" for n, label in enumerate(steps))
    for text in _wrapped("   steps     ", numbered):
        say.line(text)
    say.line(f"   approved  {' > '.join(approved.workers)}  ({approved.seconds:.1f} s)")
    for text in _wrapped("             reply ", repr(approved.reply)):
        say.line(text)
    say.line(f"   nobody    {' > '.join(timed_out.workers)}  ({timed_out.seconds:.1f} s)")
    for text in _wrapped("             reply ", repr(timed_out.reply)):
        say.line(text)
    say.line()

    plans = _plans(steps)
    wait = plans[0].crash_at[0].split(":")[0]
    late = _Plan((f"{wait}:after_run",), "approval timed out, its outcome not written", False, 0, 0)
    if as_json:
        say.line(f"2. crashing at {len(plans)} points, and once after a timeout ...")
    else:
        for text in _legend(plans):
            say.line(text)
        say.line(_HEADER)
    rows: dict[int, ApprovalRow] = {}
    late_rows: list[ApprovalRow] = []
    shown = 0
    matrix_started = time.monotonic()

    def show_progress() -> None:
        elapsed = time.monotonic() - matrix_started
        last = "done" if late_rows else "running"
        say.progress(
            f"   {len(rows)}/{len(plans)} crash points done, timeout run {last} ({elapsed:.0f} s)"
        )

    limiter = anyio.CapacityLimiter(4)

    async def one(index: int, plan: _Plan) -> None:
        nonlocal shown
        async with limiter:
            rows[index] = await _turn(ctx, 2 + index, plan, APPROVAL_TIMEOUT, approved.reply)
        while shown < len(plans) and shown in rows:  # rows in crash-point order
            if not as_json:
                for text in _row(rows[shown]):
                    say.line(text)
            shown += 1
        show_progress()

    async def nobody() -> None:
        async with limiter:
            late_rows.append(await _turn(ctx, 2 + len(plans), late, SHORT_TIMEOUT, timed_out.reply))
        show_progress()

    async def tick() -> None:
        while True:  # the clock moves on a terminal while workers wait out leases
            show_progress()
            await anyio.sleep(1)

    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as runs:
            if say.tty:
                tg.start_soon(tick)
            runs.start_soon(nobody)  # first: it waits out the approval timeout
            for index, plan in enumerate(plans):
                runs.start_soon(one, index, plan)
        tg.cancel_scope.cancel()
    say.end_progress()
    ordered = [rows[index] for index in range(len(plans))]
    late_row = late_rows[0]
    missed = [_missed(row, plan) for row, plan in zip(ordered, plans, strict=True)]
    late_missed = _missed(late_row, late)
    baseline_missed = _baseline_missed(approved, timed_out)
    ok = not any(missed) and not late_missed and not baseline_missed
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        report: dict[str, Any] = {
            "demo": "approval",
            "world": ctx.world_name,
            "namespace": ctx.namespace,
            "steps": steps,
            "clean_reply": approved.reply,
            "timeout_reply": timed_out.reply,
            "approval_timeout": SHORT_TIMEOUT,
            "clean": _baseline(approved),
            "clean_timed_out": _baseline(timed_out),
            "crash_points": [asdict(row) for row in ordered],
            "timed_out": asdict(late_row),
            "missed": [
                f"{row.crash_at}: {'; '.join(what)}"
                for row, what in zip([*ordered, late_row], [*missed, late_missed], strict=True)
                if what
            ]
            + baseline_missed,
            "targets_met": ok,
            "seconds": seconds,
        }
        print(json.dumps(report, indent=2))
        say.line(f"done in {seconds:.0f} s: targets {'met' if ok else 'NOT met'}")
        return 0 if ok else 1
    for text in _footnote(ordered):
        say.line(text)
    for row, what in zip(ordered, missed, strict=True):
        if what:
            for text in _wrapped(f"   {row.crash_at} MISSED: ", "; ".join(what)):
                say.line(text)
    say.line()
    say.line(
        f"3. The turn nobody approves ({SHORT_TIMEOUT:g} s approval timeout), crashed at "
        f"{late_row.crash_at}: the timeout"
    )
    say.line("   passed and the worker was killed before that outcome was written.")
    say.line(_HEADER)
    for text in _row(late_row):
        say.line(text)
    if late_missed:
        for text in _wrapped(f"   {late_row.crash_at} MISSED: ", "; ".join(late_missed)):
            say.line(text)
    say.line("   No approval consumed, no email (targets 0), and the reply says why:")
    for text in _wrapped("   ", repr(late_row.reply)):
        say.line(text)
    say.line()
    for text in baseline_missed:
        say.line(f"MISSED: {text}")
    verdict = "met" if ok else "NOT met"
    say.line(f"Targets {verdict}: each approval consumed once, exactly one email and an identical")
    say.line(f"reply at every crash point; with no decision, no email. ({seconds:.0f} s in all)")
    return 0 if ok else 1


def introduce(
    screen: _Screen, world: World, namespace: str, base: str | None, where: str | None, inbox: Inbox
) -> None:
    """The approval demo's opening lines."""
    screen.line(
        f"world demo approval: a send that waits for a person, crashed around the wait, on "
        f"the {world.name!r} World"
    )
    screen.line()
    for text in _world_lines(world, namespace, base, where):
        screen.line(text)
    screen.line("   tools   lookup_note (safe), check_sent (safe: reads the inbox), and send_email")
    screen.line("           (never: not run twice), which needs approval: each call waits for a")
    screen.line("           person's decision, holding no worker meanwhile")
    screen.line(
        f"   inbox   a real SMTP server on 127.0.0.1:{inbox.port}; emails are counted there"
    )
    screen.line(f"   person  the demo, from another process: world approve ... --by {REVIEWER}")
    lease, deadline = f"{LEASE:g} s", f"{SEND_TIMEOUT:g} s"
    screen.line(f"   time    under 40 s: a dead worker holds its turn for its {lease} lease, a")
    screen.line(f"           crash at send_email also waits for its {deadline} deadline")
    screen.line()
