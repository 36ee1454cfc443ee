"""``world sessions``, ``world trace``, ``world tail``, ``world ui``: see every turn.

All four read the trace model (:mod:`world_core.observe`), built from the journal's logs.
Content (prompts, tool arguments, results, messages, replies) is hidden unless ``--content``
is given, and secrets in it are masked even then.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

import anyio

from world_core._interrupt import run_command
from world_core._select import open_world
from world_core.errors import NotFoundError
from world_core.observe import (
    SessionTrace,
    StepTrace,
    Stop,
    TurnTrace,
    list_sessions,
    trace_events,
    trace_session,
)
from world_core.observe._sessions import (
    SESSION_ORDERS,
    SESSION_STATUSES,
    SessionOrder,
    SessionSummary,
)

__all__ = ["format_trace", "register"]

WorldOptions = Callable[[argparse.ArgumentParser], None]


class _Paint:
    """ANSI colours, or none (not a terminal, or ``NO_COLOR`` set)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text


_STATUS_COLOUR = {
    "done": "32",
    "replayed": "2",
    "failed": "31",
    "possibly_ran": "33",
    "interrupted": "31",
    "running": "36",
    "waiting": "35",
    "queued": "2",
}


def _colour_wanted(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _clock(at: float | None) -> str:
    if at is None:
        return "--:--:--.---"
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def _step_line(step: StepTrace, paint: _Paint) -> str:
    label = step.kind if step.name == step.kind else f"{step.kind} {step.name}"
    status = paint(step.status, _STATUS_COLOUR.get(step.status, "0"))
    parts = [f"step {step.step:<3} {label:<24} {status}"]
    if step.duration is not None:
        parts.append(_seconds(step.duration))
    runs = sorted({a.run for a in step.attempts if a.run is not None and a.status != "replayed"})
    if runs:
        parts.append("run " + ",".join(str(r) for r in runs))
    if step.replayed:
        parts.append(paint("replayed later", "2"))
    if step.usage is not None:
        parts.append(f"{step.usage.total_tokens} tokens")
    if step.idempotency_key:
        parts.append(f"key {step.idempotency_key}")
    if step.blob_bytes:
        parts.append(f"blob {step.blob_bytes} B")
    return "  ".join(parts)


def _replayed(first: int) -> str:
    return ", replayed step 0" if first == 1 else f", replayed steps 0-{first - 1}"


def _stop_lines(stop: Stop, paint: _Paint) -> list[str]:
    if stop.run is None:
        mark = paint("✗ STOPPED", "1;31")
        first = (stop.resumed_attempt or 2) - 1
        lines = [
            f"│   {mark} before any record: {first} earlier deliver{'y' if first == 1 else 'ies'}"
            " of its message wrote nothing (a crash before the first write)"
        ]
    else:
        stopped = stop.reason == "stopped"
        mark = paint("✗ STOPPED", "1;31") if stopped else paint("⏸ SUSPENDED", "1;35")
        where = {
            "after_outcome": f"after step {stop.step}",
            "intent_without_outcome": f"at step {stop.step} (intent recorded, no outcome)",
            "before_first_step": "before its first step",
            "wait": f"in the wait at step {stop.step}",
        }[stop.at_step]
        lines = [f"│   {mark} {where} at {_clock(stop.at)} (worker {stop.worker or '?'})"]
    if stop.resumed_run is not None:
        at = f"step {stop.resumed_step}" if stop.resumed_step is not None else "its end"
        lines.append(
            "│   "
            + paint("↻ RESUMED", "1;32")
            + f" by run {stop.resumed_run} on {stop.resumed_worker or '?'}"
            + f" (delivery {stop.resumed_attempt or '?'}) at {at}, {_clock(stop.resumed_at)}"
        )
    return lines


def _turn_lines(turn: TurnTrace, paint: _Paint) -> list[str]:
    status = paint(turn.status, _STATUS_COLOUR.get(turn.status, "0"))
    head = f"turn {turn.turn}  {status}"
    if turn.duration is not None:
        head += f"  {_seconds(turn.duration)}"
    head += f"  submitted {_clock(turn.submitted_at)}"
    if turn.usage is not None:
        head += f"  {turn.usage.total_tokens} tokens"
    lines = [head]
    if turn.content is not None:
        lines.append(f"│ message: {_short(turn.content.get('message'))}")
    stops = {stop.run: stop for stop in turn.stops}
    steps = {step.step: step for step in turn.steps}
    runs = turn.runs or []
    shown: set[int] = set()
    if None in stops:
        lines.extend(_stop_lines(stops[None], paint))
    for index, run in enumerate(runs):
        who = run.worker or "unknown worker"
        attempt = f", delivery {run.attempt}" if run.attempt is not None else ""
        if run.lease is not None:
            attempt += f", lease {run.lease:g} s"
        first = run.first_step
        lines.append(
            f"├─ run {run.index}: {who}{attempt}, from {_clock(run.started_at)}"
            + (_replayed(first) if first and run.replayed_steps else "")
        )
        last = runs[index + 1].first_step if index + 1 < len(runs) else None
        for n in sorted(steps):
            if n in shown:
                continue
            owner = [a.run for a in steps[n].attempts if a.status != "replayed"]
            if run.index not in owner and not (run.index == runs[-1].index and not owner):
                continue
            if last is not None and n >= last and owner and owner[-1] != run.index:
                continue
            step = steps[n]
            if owner and owner[-1] == run.index:
                shown.add(n)
            lines.append("│   " + _step_line(step, paint))
            if step.error:
                lines.append(f"│       error: {_short(step.error)}")
            if step.wait is not None:
                lines.append(f"│       wait: {_short(step.wait)}")
            if step.content is not None:
                lines.append(f"│       input:  {_short(step.content.get('input'))}")
                lines.append(f"│       output: {_short(step.content.get('output'))}")
        stop = stops.get(run.index)
        if stop is not None:
            lines.extend(_stop_lines(stop, paint))
    # Steps no run owns (histories without run records).
    for n in sorted(steps):
        if n not in shown and not runs:
            lines.append("│   " + _step_line(steps[n], paint))
    if turn.failure is not None:
        lines.append(
            "└─ "
            + paint("failed", "31")
            + f": {turn.failure.get('error_type')}: {_short(turn.failure.get('error'))}"
        )
    elif turn.status == "done":
        reply = ""
        if turn.content is not None:
            reply = f": {_short(turn.content.get('reply'))}"
        lines.append(f"└─ reply at {_clock(turn.ended_at)}{reply}")
    else:
        lines.append(f"└─ {turn.status}")
    return lines


def format_trace(trace: SessionTrace, *, colour: bool = False) -> str:
    """The readable tree of ``trace`` (what ``world trace`` prints)."""
    paint = _Paint(colour)
    lines = [
        f"session {trace.session}  {paint(trace.status, _STATUS_COLOUR.get(trace.status, '0'))}"
        f"  {len(trace.turns)} turn(s)"
    ]
    for turn in trace.turns:
        lines.extend(_turn_lines(turn, paint))
    if not trace.content:
        lines.append(paint("(content hidden: --content shows prompts, arguments, results)", "2"))
    return "\n".join(lines)


# -- commands -----------------------------------------------------------------------------------


async def _sessions(args: argparse.Namespace) -> int:
    order: SessionOrder = args.order or ("id" if args.all else "updated")
    if args.all and (order != "id" or args.page is not None):
        print(
            "world sessions: --all lists by id (--order id), a page at a time; "
            "drop --order updated and --page",
            file=sys.stderr,
        )
        return 2
    cursor, shown, header = args.cursor, 0, not args.json
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        while True:
            page = await list_sessions(
                world,
                status=args.status,
                limit=args.limit,
                cursor=cursor,
                page=args.page,
                order=order,
            )
            if args.json and not args.all:
                print(json.dumps(page.model_dump(mode="json"), indent=2))
                return 0
            for s in page.sessions:
                if args.json:  # --all: one JSON object a line, as each page arrives
                    print(json.dumps(s.model_dump(mode="json")), flush=True)
                    continue
                if header:
                    header = False
                    print(_SESSIONS_HEADER)
                print(_session_line(s), flush=args.all)
            shown += len(page.sessions)
            cursor = page.next_cursor
            if not args.all or cursor is None:
                break
    if shown == 0 and not args.json:
        print("no sessions" + (f" with status {args.status}" if args.status else ""))
    elif cursor is not None:
        more = "" if order == "updated" else " --order id"
        print(f"more: world sessions{more} --cursor {cursor}")
    return 0


# 46: a child run's session id ("child-" and 40 hex digits) fits.
_SESSIONS_HEADER = (
    f"{'session':<46} {'status':<8} {'turns':>5}  {'updated (UTC)':<19}  {'last turn':<32}  "
    "child of"
)


def _session_line(s: SessionSummary) -> str:
    updated = (
        datetime.datetime.fromtimestamp(s.updated_at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        if s.updated_at is not None
        else "-"
    )
    line = f"{s.session:<46} {s.status:<8} {s.turns:>5}  {updated:<19}  {s.last_turn or '-':<32}"
    # A child run (Journal.start_child) is a session of its own: say whose, so it is not
    # taken for one a user started.
    return f"{line}  {s.parent}" if s.parent is not None else line.rstrip()


def _trace_file(args: argparse.Namespace) -> SessionTrace:
    """The trace of ``args.session`` from an exported history (``world export``)."""
    from world_core.journal import load_history_file, session_log_id

    histories = load_history_file(args.file)
    logs = [
        (history.log_id or session_log_id(history.session_id), list(history.events))
        for history in histories
        if history.session_id == args.session
    ]
    if not logs:
        held = ", ".join(sorted({h.session_id for h in histories})) or "none"
        raise NotFoundError(f"{args.file} holds no session {args.session!r} (it holds: {held})")
    return trace_events(args.session, logs, content=args.content, turn=args.turn)


async def _trace(args: argparse.Namespace) -> int:
    if args.file is not None:
        trace = _trace_file(args)
    else:
        async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
            trace = await trace_session(world, args.session, turn=args.turn, content=args.content)
    if args.json:
        print(json.dumps(trace.model_dump(mode="json"), indent=2, ensure_ascii=False))
    else:
        print(format_trace(trace, colour=_colour_wanted(sys.stdout)))
    return 0


async def _tail(args: argparse.Namespace) -> int:
    from world_core.journal import session_chain

    colour = _Paint(_colour_wanted(sys.stdout))
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        chain = await session_chain(world, args.session)
        logs = [(log_id, list(await world.log.read(log_id))) for log_id in chain]
        trace = trace_events(args.session, logs, content=args.content)
        turn = args.turn
        if turn is None:
            if not trace.turns:
                raise NotFoundError(
                    f"session {args.session!r} has no turn yet; give --turn to wait for one"
                )
            turn = trace.turns[-1].turn
        printed: dict[str, str] = {}

        def show() -> bool:
            """Print what changed; True once the turn has ended."""
            current = trace_events(args.session, logs, content=args.content)
            found = [t for t in current.turns if t.turn == turn]
            if not found:
                return False
            ended = found[0].status in ("done", "failed")
            for line in _turn_lines(found[0], colour):
                # A line once: the turn's head the first time, its end only at the end, a
                # step each time its status changes.
                key = "head" if line.startswith("turn ") else line
                if key in printed or (line.startswith("└─") and not ended):
                    continue
                printed[key] = line
                print(line, flush=True)
            return ended

        if show():
            return 0
        with anyio.move_on_after(args.deadline) as scope:
            while True:
                log_id, events = logs[-1]
                after = events[-1].seq if events else 0
                async for event in world.log.watch(log_id, after=after):
                    events.append(event)
                    if event.key == "session/continued":
                        chain = await session_chain(world, args.session)
                        logs.append((chain[-1], list(await world.log.read(chain[-1]))))
                        break
                    if show():
                        return 0
        if scope.cancelled_caught:
            print(
                f"world tail: turn {turn} did not end within --deadline {args.deadline:g} s",
                file=sys.stderr,
            )
            return 1
    return 0


def _positive(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be seconds > 0, got {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be seconds > 0, got {text!r}")
        return value

    return parse


def _count(name: str, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be from 1 to {high}, got {value}")
        return value

    return parse


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be an integer, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be from 0 to 65535, got {value}")
    return value


def _ui(args: argparse.Namespace) -> int:
    from world_core.observe._ui import serve

    return serve(
        world=args.world,
        url=args.url,
        namespace=args.namespace,
        host=args.host,
        port=args.port,
        content=args.content,
        poll=args.poll,
    )


def register(sub: Any, world_options: WorldOptions) -> None:
    """Add the commands to the ``world`` subparsers; ``world_options`` adds ``--world``,
    ``--url`` and ``--namespace`` to a parser."""
    sessions = sub.add_parser("sessions", help="list sessions, newest first")
    sessions.add_argument(
        "--status", choices=SESSION_STATUSES, help="only sessions with this status"
    )
    sessions.add_argument(
        "--limit", type=_count("--limit", 1000), default=20, help="sessions per page (20)"
    )
    sessions.add_argument("--page", type=_count("--page", 10**9), help="page number, from 1")
    sessions.add_argument("--cursor", help="the cursor the previous page printed")
    sessions.add_argument(
        "--order",
        choices=SESSION_ORDERS,
        help="updated: newest first (reads every session); id: by id, a page at a time",
    )
    sessions.add_argument(
        "--all",
        action="store_true",
        help="every session, by id, printed page by page as read (--json: one a line)",
    )
    sessions.add_argument("--json", action="store_true", help="print JSON")
    world_options(sessions)
    sessions.set_defaults(run=lambda args: run_command(_sessions, args))

    trace = sub.add_parser(
        "trace", help="show a session's turns step by step: runs, crashes and resumes"
    )
    trace.add_argument("session", help="the session id (see world sessions)")
    trace.add_argument("--turn", help="only this turn")
    trace.add_argument(
        "--json", action="store_true", help="print the trace as JSON (world-trace/1)"
    )
    trace.add_argument(
        "--content", action="store_true", help="show prompts, tool arguments and results"
    )
    trace.add_argument(
        "--file", help="read the session from this world export file instead of the World"
    )
    world_options(trace)
    trace.set_defaults(run=lambda args: run_command(_trace, args))

    tail = sub.add_parser("tail", help="follow a turn live until it ends")
    tail.add_argument("session", help="the session id")
    tail.add_argument("--turn", help="the turn (default: the session's latest)")
    tail.add_argument(
        "--deadline",
        type=_positive("--deadline"),
        default=600.0,
        help="stop following after this many seconds (600); exit status 1 then",
    )
    tail.add_argument(
        "--content", action="store_true", help="show prompts, tool arguments and results"
    )
    world_options(tail)
    tail.set_defaults(run=lambda args: run_command(_tail, args))

    ui = sub.add_parser("ui", help="serve the trace viewer on this machine (prints its URL)")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    ui.add_argument("--port", type=_port, default=0, help="port (0: any free one)")
    ui.add_argument(
        "--content", action="store_true", help="show prompts, tool arguments and results"
    )
    ui.add_argument(
        "--poll", type=_positive("--poll"), default=1.0, help="seconds between live refreshes"
    )
    world_options(ui)
    ui.set_defaults(run=_ui)
