"""``world demo langgraph``: a LangGraph agent crashed at every super-step, with and without world.

The graph of :mod:`world_examples.langgraph_agent` (model node, tool node; ``send_email``
speaks SMTP to a real inbox on loopback), checkpointed by ``WorldCheckpointSaver`` on the
World the demo opens, run in processes of its own:

1. A clean run, the baseline: its reply, and its super-steps.
2. For every super-step, three crash points (``before_run``, ``after_run``, ``before_save``:
   see :mod:`world_examples.langgraph_agent`), each in a fresh thread: one process dies there
   (``os._exit(1)``), then fresh processes resume the thread from the checkpointer until it
   replies. Twice per point: with the model call and the tools wrapped ``durable_tool``
   (``send_email`` ``never``), and with LangGraph's own resume alone. Per point: model calls
   repeated (a reply the graph already had, paid again; target 0), emails at the inbox
   (target exactly 1), and whether the reply matches the clean run's.

LangGraph resumes a thread from its last checkpoint and re-runs the super-step that was cut
off: a model call or an email in it happens again. ``never`` adds what LangGraph lacks: the
email is sent at most once, and a cut-off send is reported as "may or may not have happened",
so the model checks the inbox instead of sending again.

Processes are forked from a server process that imported LangGraph once (``multiprocessing``'s
``forkserver``): each starts in milliseconds, holds nothing but what it reads from the World.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig

from world_core import POSSIBLY_RAN, World, resolve_world
from world_core.integrations.langgraph import WorldCheckpointSaver
from world_examples.demo import _Context, _Screen, _world_lines
from world_examples.inbox import Inbox
from world_examples.langgraph_agent import CRASH_POINTS, SEND_TIMEOUT, reply_of

__all__ = ["LangGraphRow", "Outcome", "introduce", "run"]

PROCESS_SECONDS = 60.0
"""Longest a demo process may run before it is killed and counted as failed."""
MAX_RESUMES = 3


@dataclass(frozen=True)
class Outcome:
    """What one crashed-and-resumed thread came to."""

    crashed: bool
    """The first process died at its crash point."""
    repeated_model_calls: int
    """Model calls made after the crash for a request whose reply the graph already had."""
    effects: int
    """Emails the inbox received for the thread."""
    reply_matches: bool
    told_possibly_ran: bool
    """A send was reported as "may or may not have happened" (``never``)."""
    checked_sent: str | None
    """What check_sent answered (None: not called)."""
    processes: int
    seconds: float


@dataclass(frozen=True)
class LangGraphRow:
    """One crash point: the durable graph's numbers, and LangGraph's own resume's."""

    crash_at: str
    step: str
    crashed: bool
    repeated_model_calls: int
    effects: int
    reply_matches: bool
    told_possibly_ran: bool
    checked_sent: str | None
    langgraph_alone: Outcome
    """The same crash with the model and the tools called directly."""
    notes: list[str] = field(default_factory=list)


def introduce(
    screen: _Screen, world: World, namespace: str, base: str | None, where: str | None, inbox: Inbox
) -> None:
    """The demo's opening lines."""
    screen.line(
        f"world demo langgraph: a LangGraph agent crashed at every super-step, on the "
        f"{world.name!r} World"
    )
    screen.line()
    for text in _world_lines(world, namespace, base, where):
        screen.line(text)
    screen.line("   graph   agent (model) -> tools -> agent ... ; WorldCheckpointSaver")
    screen.line("   tools   lookup_note, check_sent (safe); send_email (never, SMTP)")
    screen.line(f"   inbox   a real SMTP server on 127.0.0.1:{inbox.port}; emails counted there")
    screen.line()


_preloaded: list[str] = []


def _context(ctx: _Context) -> Any:
    """The forkserver context; its server imports the graph's modules and the World's
    backend once, before it forks the first process."""
    mp = multiprocessing.get_context("forkserver")
    if not _preloaded:
        _, factory = resolve_world(ctx.target)
        backend = factory.__module__.split(".")[0]
        # __main__ too: each process would import it again (the world command) otherwise.
        _preloaded.extend(["__main__", __name__, "world_examples.langgraph_agent", backend])
        mp.set_forkserver_preload(_preloaded)
    return mp


async def _process(ctx: _Context, thread: str, durable: bool, crash_at: str) -> int:
    """One process running (or resuming) ``thread``; its exit status."""
    env = {
        "WORLD_DEMO_SMTP": f"127.0.0.1:{ctx.inbox.port}",
        "WORLD_DEMO_MAILDIR": str(ctx.inbox.folder),
        "WORLD_DEMO_CALLS": str(_calls_file(ctx, thread)),
        "CRASH_AT": crash_at,
    }
    process = _context(ctx).Process(
        target=_child_entry,
        args=(ctx.target, ctx.url, ctx.namespace, thread, durable, env),
        daemon=True,
    )
    process.start()
    await anyio.to_thread.run_sync(process.join, PROCESS_SECONDS)
    if process.exitcode is None:
        process.kill()
        await anyio.to_thread.run_sync(process.join, 5.0)
        return -9
    return int(process.exitcode)


def _child_entry(
    target: str | None,
    url: str | None,
    namespace: str,
    thread: str,
    durable: bool,
    env: dict[str, str],
) -> None:
    from world_examples.langgraph_agent import _child

    _child(target, url, namespace, thread, durable, env)


def _calls_file(ctx: _Context, thread: str) -> Path:
    return ctx.folder / f"calls-{thread}.jsonl"


async def _messages(world: World, thread: str) -> list[AnyMessage]:
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    found = await WorldCheckpointSaver(world).aget_tuple(config)
    if found is None:
        return []
    messages: list[AnyMessage] = found.checkpoint["channel_values"].get("messages", [])
    return messages


def _steps(messages: list[AnyMessage]) -> list[str]:
    """The clean run's super-steps, from its messages: the model's replies, the tool runs."""
    steps: list[str] = []
    for message in messages[1:]:
        if isinstance(message, AIMessage):
            steps.append("agent (model)")
        elif isinstance(message, ToolMessage):
            name = _tool_names(messages).get(str(message.tool_call_id), "?")
            steps.append(f"tools {name}")
    return steps


def _tool_names(messages: list[AnyMessage]) -> dict[str, str]:
    return {
        str(call["id"]): call["name"]
        for m in messages
        if isinstance(m, AIMessage)
        for call in m.tool_calls
    }


async def _crash_point(
    ctx: _Context, thread: str, crash_at: str, durable: bool, clean_reply: str
) -> Outcome:
    started = time.monotonic()
    first = await _process(ctx, thread, durable, crash_at)
    processes = 1
    messages: list[AnyMessage] = []
    for _ in range(MAX_RESUMES):
        messages = await _messages(ctx.world, thread)
        if reply_of(messages) is not None:
            break
        await _process(ctx, thread, durable, "")
        processes += 1
    messages = await _messages(ctx.world, thread)
    names = _tool_names(messages)
    results = [
        (names.get(str(m.tool_call_id)), str(m.content))
        for m in messages
        if isinstance(m, ToolMessage)
    ]
    checks = [content for name, content in results if name == "check_sent"]
    return Outcome(
        crashed=first == 1,
        repeated_model_calls=_repeated(_calls_file(ctx, thread)),
        effects=len(ctx.inbox.messages(thread)),
        reply_matches=reply_of(messages) == clean_reply,
        told_possibly_ran=any(c == POSSIBLY_RAN for n, c in results if n == "send_email"),
        checked_sent=checks[-1] if checks else None,
        processes=processes,
        seconds=round(time.monotonic() - started, 1),
    )


def _repeated(calls: Path) -> int:
    """Calls paid after the crash for requests whose reply the crashed process had handed to
    the graph (the first process in the file is the one that crashed)."""
    if not calls.exists():
        return 0
    rows = [json.loads(line) for line in calls.read_text().splitlines() if line]
    if not rows:
        return 0
    crashed = rows[0]["pid"]
    had = {r["digest"] for r in rows if r["pid"] == crashed and r["event"] == "returned"}
    return sum(
        1 for r in rows if r["pid"] != crashed and r["event"] == "called" and r["digest"] in had
    )


def _notes(row: Outcome) -> list[str]:
    notes: list[str] = []
    if row.told_possibly_ran:
        notes.append('send_email was cut off: told "may or may not have happened"')
        if row.checked_sent is not None:
            notes.append(f"check_sent answered {row.checked_sent!r}")
    return notes


_HEADER = f"{'crash at':<15}{'super-step':<22}{'repeated':>9}{'emails':>8}  {'reply':<12}"
_ALONE = f"{'repeated':>9}{'emails':>8}  reply"


def _line(row: LangGraphRow) -> str:
    alone = row.langgraph_alone
    mark = " *" if row.told_possibly_ran else ""
    extra = "" if row.crashed and alone.crashed else "  (did not crash)"
    reply = ("identical" if row.reply_matches else "DIFFERENT") + mark
    return (
        f"{row.crash_at:<15}{row.step:<22}{row.repeated_model_calls:>9}{row.effects:>8}  "
        f"{reply:<12}{alone.repeated_model_calls:>9}{alone.effects:>8}  "
        f"{'identical' if alone.reply_matches else 'DIFFERENT'}{extra}"
    )


async def run(ctx: _Context, as_json: bool) -> int:
    """Run the demo on ``ctx``'s World; 0 when every target is met."""
    say = ctx.screen
    started = time.monotonic()
    say.line("1. The clean run, in one process ...")
    status = await _process(ctx, "clean", True, "")
    clean = await _messages(ctx.world, "clean")
    clean_reply = reply_of(clean)
    if clean_reply is None:
        say.line(f"the clean run produced no reply (its process exited with status {status})")
        return 1
    steps = _steps(clean)
    say.line("   super-steps  " + ", ".join(f"{n} {s}" for n, s in enumerate(steps, start=1)))
    say.line(f"   reply        {clean_reply!r}  ({time.monotonic() - started:.1f} s)")
    say.line()
    points = [
        (f"{n}:{when}", step) for n, step in enumerate(steps, start=1) for when in CRASH_POINTS
    ]
    say.line(f"2. {len(points)} crash points, each run twice: with world's durable_tool, and")
    say.line("   with LangGraph's resume alone. A process dies there; fresh ones resume.")
    if not as_json:
        say.line("   n:before_run   in super-step n's node, before its call")
        say.line("   n:after_run    the call returned (reply received, email sent), not recorded")
        say.line("   n:before_save  the node returned, before LangGraph saved its writes")
        say.line("   repeated  model calls paid again for a reply the graph had (target 0)")
        say.line("   emails    emails the inbox received for the thread (target 1)")
        say.line()
        say.line(f"{'':<37}{'with world (durable_tool)':<31}LangGraph alone")
        say.line(_HEADER + _ALONE)
    rows: dict[str, LangGraphRow] = {}
    limiter = anyio.CapacityLimiter(4)
    shown = 0

    async def one(index: int, crash_at: str, step: str) -> None:
        nonlocal shown
        tag = crash_at.replace(":", "-")
        async with limiter:
            durable = await _crash_point(ctx, f"durable-{tag}", crash_at, True, clean_reply)
        async with limiter:
            alone = await _crash_point(ctx, f"alone-{tag}", crash_at, False, clean_reply)
        rows[crash_at] = LangGraphRow(
            crash_at=crash_at,
            step=step,
            crashed=durable.crashed,
            repeated_model_calls=durable.repeated_model_calls,
            effects=durable.effects,
            reply_matches=durable.reply_matches,
            told_possibly_ran=durable.told_possibly_ran,
            checked_sent=durable.checked_sent,
            langgraph_alone=alone,
            notes=_notes(durable),
        )
        while shown < len(points) and points[shown][0] in rows:
            if not as_json:
                say.line(_line(rows[points[shown][0]]))
            shown += 1

    async with anyio.create_task_group() as tg:
        for index, (crash_at, step) in enumerate(points):
            tg.start_soon(one, index, crash_at, step)
    ordered = [rows[crash_at] for crash_at, _ in points]
    ok = all(
        r.crashed and r.repeated_model_calls == 0 and r.effects == 1 and r.reply_matches
        for r in ordered
    )
    gap = [r for r in ordered if r.langgraph_alone.effects > 1]
    paid = [r for r in ordered if r.langgraph_alone.repeated_model_calls > 0]
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        report: dict[str, Any] = {
            "demo": "langgraph",
            "world": ctx.world_name,
            "namespace": ctx.namespace,
            "clean_reply": clean_reply,
            "steps": steps,
            "send_timeout": SEND_TIMEOUT,
            "crash_points": [asdict(r) for r in ordered],
            "targets_met": ok,
            "langgraph_alone_duplicates": [r.crash_at for r in gap],
            "langgraph_alone_repeated_model_calls": [r.crash_at for r in paid],
            "seconds": seconds,
        }
        print(json.dumps(report, indent=2))
        say.line(f"done in {seconds:.0f} s: targets {'met' if ok else 'NOT met'}")
        return 0 if ok and gap else 1
    told = [r for r in ordered if r.told_possibly_ran]
    if told:
        say.line(
            f"   * send_email cut off; after its {SEND_TIMEOUT:g} s deadline the model was told"
        )
        say.line('     it "may or may not have happened" and checked the inbox first:')
        for r in told:
            say.line(f"       {r.crash_at:<15}check_sent answered {r.checked_sent!r}")
    say.line()
    say.line(
        f"Targets {'met' if ok else 'NOT met'} with world: no model call paid twice, exactly "
        "one email and an identical reply at every crash point."
    )
    if gap:
        where = ", ".join(r.crash_at for r in gap)
        say.line(f"LangGraph alone re-ran the cut-off super-step: a second email at {where}.")
    if paid:
        where = ", ".join(r.crash_at for r in paid)
        say.line(f"LangGraph alone paid for a model reply it had already received at {where}.")
    say.line(f"({seconds:.0f} s in all)")
    return 0 if ok and gap else 1
