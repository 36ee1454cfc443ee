"""``world demo``: the crash matrix of the reference exercise, on any World.

1. A clean turn: one worker process runs it; its reply and its steps are the baseline.
2. For every step of that turn, before and after the call: a fresh session runs the same turn
   in a worker process started with ``CRASH_AT=<step>:<when>`` (it dies there with
   ``os._exit(1)``), then a fresh worker process continues it once the lease runs out.
   Per crash point: model calls the second process repeated for steps already finished (the
   journal held their outcome), emails the inbox received, and whether the reply matches.
3. ``send_email`` relabelled ``safe``, crashed after it ran: the duplicate email arrives.

The World is the one ``world`` opens (``--world``/``WORKFLOW_TARGET_WORLD``, ``--url`` or the
backend's variable), with two differences that keep runs apart and leave nothing behind:

* The demo runs in a namespace of its own, ``demo_<random>`` (``<WORKFLOW_NAMESPACE>_demo_<random>``
  when that is set), and purges it at the end: it never touches the namespace you work in.
* The local World, given neither ``--url`` nor ``WORKFLOW_LOCAL_DIR``, gets a temporary folder.

Worker processes must open the same World, so a World that cannot be shared by several
processes (``capabilities.shared`` False) is refused before anything runs.

``world demo approval`` (:mod:`world_examples.approval_demo`) runs on the same set-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, TextIO, TypeVar

import anyio

from world_core import (
    Client,
    ConfigurationError,
    World,
    list_worlds,
    open_world,
    resolve_world,
    session_log_id,
)
from world_core.spi import validate_namespace
from world_examples._demos import DEMO_MODULES, DEMOS, MISSING
from world_examples.crash_agent import MESSAGE, SEND_TIMEOUT
from world_examples.inbox import Inbox

__all__ = ["CRASH_WHEN", "CrashRow", "crash_points", "run_crash_matrix", "run_demo"]

RowT = TypeVar("RowT")

AGENT = "world_examples.crash_agent:build_agent"
TURN = "t1"
LEASE = 2.0
WORKER_WAIT = 60.0
"""Seconds a worker process waits for its turn to reach the queue (it is there already)."""

LOCAL_DIR_VARIABLE = "WORKFLOW_LOCAL_DIR"
NAMESPACE_VARIABLE = "WORKFLOW_NAMESPACE"
_SUFFIX = "_demo_"  # + 8 hex digits


@dataclass(frozen=True)
class CrashRow:
    """One crash point's three numbers, what the step was, and what the agent did about an
    interrupted ``send_email`` (``told_possibly_ran``, ``checked_sent``, ``note``)."""

    crash_at: str
    step: str
    crashed: bool
    repeated_model_calls: int
    emails: int
    reply_matches: bool
    finished_model_steps: int
    replay_model_calls: int
    told_possibly_ran: bool = False
    """The model was told a ``never`` call "may or may not have happened"."""
    checked_sent: str | None = None
    """What ``check_sent`` answered after that (None: not called)."""
    seconds: float = 0.0
    """From submitting the turn to its reply, crash and takeover included."""
    note: str = ""


@dataclass(frozen=True)
class _Step:
    label: str  # "model", "tool send_email"
    name: str
    output: object
    interrupted: bool


@dataclass
class _Screen:
    """The demo's narrative on ``out``; on a terminal, one progress line kept below it."""

    out: TextIO
    tty: bool = False
    _progress: str = field(default="", init=False)

    def line(self, text: str = "") -> None:
        self._clear()
        self.out.write(text + "\n")
        if self._progress:
            self.out.write(self._progress)
        self.out.flush()

    def progress(self, text: str) -> None:
        if not self.tty:
            return
        self._clear()
        self._progress = text
        self.out.write(text)
        self.out.flush()

    def end_progress(self) -> None:
        self._clear()
        self._progress = ""
        self.out.flush()

    def _clear(self) -> None:
        if self._progress:
            self.out.write("\r\033[K")


@dataclass
class _Context:
    world: World
    world_name: str
    target: str | None  # as given; None: the workers inherit WORKFLOW_TARGET_WORLD
    url: str | None
    namespace: str
    inbox: Inbox
    folder: Path
    screen: _Screen


@dataclass(frozen=True)
class _WorkerExit:
    """How a worker process ended: its exit status, pid, and the turn result it printed
    (``world worker --once --json``; None when it printed none: it crashed)."""

    returncode: int
    pid: int
    result: dict[str, Any] | None


async def _worker(ctx: _Context, queue: str, extra_env: dict[str, str]) -> tuple[int, int]:
    """Run one worker process for one turn; returns (exit status, pid)."""
    ended = await _run_worker(ctx, queue, extra_env)
    return ended.returncode, ended.pid


async def _run_worker(
    ctx: _Context, queue: str, extra_env: dict[str, str], *, agent: str = AGENT
) -> _WorkerExit:
    """Run one ``world worker --once`` process with ``agent`` for one turn."""
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
    command = [sys.executable, "-m", "world_core._cli", "worker", "--agent", agent, "--once"]
    command += ["--wait", str(WORKER_WAIT), "--lease", str(LEASE), "--queue", queue, "--json"]
    command += _world_arguments(ctx)
    # A session of its own: Ctrl-C reaches the demo alone, which stops its workers itself
    # (killed when the demo is cancelled) instead of each printing its own interruption.
    process = await anyio.open_process(
        command, env=env, stdout=subprocess.PIPE, stderr=None, start_new_session=True
    )
    output = b""
    async with process:
        with anyio.fail_after(120):  # a wedged worker must not hang the demo
            assert process.stdout is not None
            async for chunk in process.stdout:  # one JSON line (none if it crashed)
                output += chunk
            await process.wait()
    assert process.returncode is not None
    try:
        result = json.loads(output)
    except ValueError:
        result = None
    return _WorkerExit(
        process.returncode, process.pid, result if isinstance(result, dict) else None
    )


def _world_arguments(ctx: _Context) -> list[str]:
    """``--namespace``, ``--world``, ``--url``: a ``world`` process opens the demo's World."""
    arguments = ["--namespace", ctx.namespace]
    if ctx.target is not None:
        arguments += ["--world", ctx.target]
    if ctx.url is not None:
        arguments += ["--url", ctx.url]
    return arguments


async def _journal(world: World, session: str) -> list[_Step]:
    """The recorded steps of the session's turn, in step order."""
    steps: dict[int, _Step] = {}
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") != "outcome":
            continue
        result = body.get("result") or {}
        named = body["kind"] in ("tool", "approval")
        label = body["kind"] + (f" {body['name']}" if named else "")
        steps[body["step"]] = _Step(
            label=label,
            name=body["name"],
            output=result.get("output"),
            interrupted=bool(result.get("interrupted")),
        )
    return [steps[n] for n in sorted(steps)]


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


def _note(steps: list[_Step], replay: str) -> tuple[bool, str | None, str]:
    """Whether the model was told a send may have happened, what check_sent said, and what
    the agent did about it, in words."""
    told = any(s.name == "send_email" and s.interrupted for s in steps)
    checks = [str(s.output) for s in steps if s.name == "check_sent"]
    checked = checks[-1] if checks else None
    if replay == "safe":
        return told, checked, "send_email ran again, unchecked: its label allowed it"
    if not told:
        return told, checked, ""
    if checked is None:
        return told, checked, "told send_email may have happened, the model did not check"
    if checked.startswith("yes"):
        return told, checked, "check_sent found the email, so it was not sent again"
    return told, checked, "check_sent found nothing, so the model sent the email"


async def _crash_point(
    ctx: _Context, index: int, crash_at: str, step: str, clean_reply: str, replay: str
) -> CrashRow:
    started = time.monotonic()
    session = f"crash-{index}-{crash_at.replace(':', '-')}"
    queue = f"demo-{index}"
    client = Client(ctx.world, queue=queue)
    await client.submit(session, MESSAGE, turn_id=TURN)
    env = {"WORLD_DEMO_SEND_REPLAY": replay}
    status, _ = await _worker(ctx, queue, {**env, "CRASH_AT": crash_at})
    finished = await _finished_model_digests(ctx.world, session)
    calls: list[str] = []
    reply = None
    for _ in range(3):  # a crash inside send_email: the turn waits for its deadline, re-queued
        _, pid = await _worker(ctx, queue, env)
        calls += _calls_by(ctx, pid)
        reply = await client.reply(session, TURN)
        if reply is not None:
            break
    repeated = sum(1 for digest in calls if digest in finished)
    told, checked, note = _note(await _journal(ctx.world, session), replay)
    return CrashRow(
        crash_at=crash_at,
        step=step,
        crashed=status == 1,
        repeated_model_calls=repeated,
        emails=len(ctx.inbox.messages(session)),
        reply_matches=reply == clean_reply,
        finished_model_steps=len(finished),
        replay_model_calls=len(calls),
        told_possibly_ran=told,
        checked_sent=checked,
        seconds=round(time.monotonic() - started, 1),
        note=note,
    )


def crash_header(effects: str = "emails") -> str:
    """The header of a crash-matrix table (this demo's and the framework demos')."""
    return (
        f"{'crash at':<14}{'step':<18}{'journaled':>10}{'replay':>8}{'repeated':>10}"
        f"{effects:>{len(effects) + 2}}  reply"
    )


def crash_line(
    *,
    crash_at: str,
    step: str,
    journaled: int,
    replay: int,
    repeated: int,
    effects: int,
    reply_matches: bool,
    told_possibly_ran: bool,
    crashed: bool,
    effects_label: str = "emails",
) -> str:
    """One crash point's line under :func:`crash_header` with the same ``effects_label``."""
    reply = "identical" if reply_matches else "DIFFERENT"
    mark = " *" if told_possibly_ran else ""
    extra = "" if crashed else "  (did not crash)"
    return (
        f"{crash_at:<14}{step:<18}{journaled:>10}{replay:>8}{repeated:>10}"
        f"{effects:>{len(effects_label) + 2}}  {reply}{mark}{extra}"
    )


CRASH_WHEN = ("before_run", "after_run")
"""Where a worker is killed around a step's call: just before it, or just after it returned
(before its outcome is written)."""


def crash_points(steps: Sequence[str]) -> list[tuple[str, str]]:
    """Every crash point of a clean turn with ``steps`` (their labels): ``(n:when, label)``,
    before and after each step's call, in order."""
    return [(f"{n}:{when}", step) for n, step in enumerate(steps) for when in CRASH_WHEN]


async def run_crash_matrix(
    count: int,
    run_one: Callable[[int], Awaitable[RowT]],
    show: Callable[[RowT], None],
    *,
    progress: Callable[[int], None] | None = None,
    alongside: Callable[[], Awaitable[None]] | None = None,
    tick: bool = False,
    at_once: int = 4,
) -> list[RowT]:
    """Run the crash points ``run_one(0)`` ... ``run_one(count - 1)`` (each in a session and
    queue of its own, so they run side by side), at most ``at_once`` at a time, and
    ``alongside`` with them under the same limit; returns their rows in order.

    ``show`` gets each row in order as soon as the ones before it are done; ``progress`` the
    number of rows done after each run (``alongside`` included) and, with ``tick``, every
    second meanwhile (the clock moves on a terminal while workers wait out leases).
    """
    rows: dict[int, RowT] = {}
    shown = 0
    limiter = anyio.CapacityLimiter(at_once)

    def report() -> None:
        if progress is not None:
            progress(len(rows))

    async def one(index: int) -> None:
        nonlocal shown
        async with limiter:
            rows[index] = await run_one(index)
        while shown < count and shown in rows:
            show(rows[shown])
            shown += 1
        report()

    async def beside(run: Callable[[], Awaitable[None]]) -> None:
        async with limiter:
            await run()
        report()

    async def ticking() -> None:
        while True:
            report()
            await anyio.sleep(1)

    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as runs:
            if tick:
                tg.start_soon(ticking)
            for index in range(count):
                runs.start_soon(one, index)
            if alongside is not None:
                runs.start_soon(beside, alongside)
        tg.cancel_scope.cancel()
    return [rows[index] for index in range(count)]


_HEADER = crash_header()


def _row(row: CrashRow) -> str:
    return crash_line(
        crash_at=row.crash_at,
        step=row.step,
        journaled=row.finished_model_steps,
        replay=row.replay_model_calls,
        repeated=row.repeated_model_calls,
        effects=row.emails,
        reply_matches=row.reply_matches,
        told_possibly_ran=row.told_possibly_ran,
        crashed=row.crashed,
    )


def _legend(points: int) -> Iterator[str]:
    yield f"2. The same turn crashed at {points} points; after each crash a fresh worker process"
    yield "   takes the turn over from the queue once the dead worker's lease has run out."
    yield "   n:before_run  killed just before step n's call (steps count from 0); for"
    yield "                 send_email its intent (the record that it may run) is already durable"
    yield "   n:after_run   killed just after step n's call returned, before its outcome is written"
    yield ""
    yield "   step       what step n is in the clean turn"
    yield "   journaled  model calls whose reply was in the journal when the worker died"
    yield "   replay     model calls made after the crash, by the worker processes taking over"
    yield "   repeated   replay calls whose reply the journal already held: paid twice (target 0)"
    yield "   emails     emails that reached the inbox for this turn (target 1)"
    yield "   reply      the final reply compared with the clean turn's (target identical)"
    yield ""


def _footnote(rows: list[CrashRow]) -> Iterator[str]:
    told = [row for row in rows if row.told_possibly_ran]
    if not told:
        return
    deadline = f"{SEND_TIMEOUT:g} s"
    yield "   * send_email is labelled never, so it is not simply run again. The turn was held"
    yield f"     until its deadline ({deadline} after the send began) in case it was still running;"
    yield '     then the model was told the email "may or may not have happened" and looked first:'
    for row in told:
        yield f"       {row.crash_at:<14}{row.note}"


async def _run(ctx: _Context, as_json: bool) -> int:
    say = ctx.screen
    started = time.monotonic()
    say.line("1. The clean turn, in one worker process ...")
    client = Client(ctx.world, queue="demo-clean")
    await client.submit("clean", MESSAGE, turn_id=TURN)
    status, _ = await _worker(ctx, "demo-clean", {"WORLD_DEMO_SEND_REPLAY": "never"})
    clean_reply = await client.reply("clean", TURN)
    if clean_reply is None:
        if status == 3:
            why = (
                f"the worker process found no turn on the queue within {WORKER_WAIT:g} s: it "
                f"did not open the same World as this process ({ctx.world_name!r}, namespace "
                f"{ctx.namespace})"
            )
        elif status == 4:
            why = "the worker recorded the turn as failed"
        else:
            why = f"the worker process exited with status {status}; anything it said is above"
        say.line(f"the clean turn produced no reply: {why}")
        return 1
    journal = await _journal(ctx.world, "clean")
    steps = [s.label for s in journal]
    say.line("   steps  " + ", ".join(f"{n} {label}" for n, label in enumerate(steps)))
    say.line(f"   reply  {clean_reply!r}  ({time.monotonic() - started:.1f} s)")
    say.line()
    points = crash_points(steps)
    if as_json:
        say.line(f"2. crashing at {len(points)} points, a fresh worker process after each ...")
    else:
        for text in _legend(len(points)):
            say.line(text)
        say.line(_HEADER)
    matrix_started = time.monotonic()
    relabelled: list[CrashRow] = []

    def show_progress(done: int) -> None:
        elapsed = time.monotonic() - matrix_started
        last = "done" if relabelled else "running"
        say.progress(
            f"   {done}/{len(points)} crash points done, relabelled run {last} ({elapsed:.0f} s)"
        )

    def show(row: CrashRow) -> None:
        if not as_json:
            say.line(_row(row))

    send_step = next(n for n, step in enumerate(steps) if step == "tool send_email")
    wrong_at = f"{send_step}:after_run"

    async def wrong_label() -> None:
        # Independent of the matrix (its own session and queue), so it runs alongside.
        relabelled.append(
            await _crash_point(ctx, len(points), wrong_at, steps[send_step], clean_reply, "safe")
        )

    ordered = await run_crash_matrix(
        len(points),
        lambda index: _crash_point(ctx, index, *points[index], clean_reply, "never"),
        show,
        progress=show_progress,
        alongside=wrong_label,
        tick=say.tty,
    )
    say.end_progress()
    wrong = relabelled[0]
    ok = all(
        r.crashed and r.repeated_model_calls == 0 and r.emails == 1 and r.reply_matches
        for r in ordered
    )
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        report: dict[str, Any] = {
            "world": ctx.world_name,
            "namespace": ctx.namespace,
            "clean_reply": clean_reply,
            "steps": steps,
            "crash_points": [asdict(r) for r in ordered],
            "relabelled": {"send_email_replay": "safe", **asdict(wrong)},
            "targets_met": ok,
            "seconds": seconds,
        }
        print(json.dumps(report, indent=2))
        say.line(f"done in {seconds:.0f} s: targets {'met' if ok else 'NOT met'}")
        return 0 if ok and wrong.emails > 1 else 1
    for text in _footnote(ordered):
        say.line(text)
    say.line()
    say.line(f"3. The same crash at {wrong_at} with send_email relabelled safe (the wrong label):")
    say.line(_HEADER)
    say.line(_row(wrong))
    say.line("   safe means: if interrupted, run it again. The worker taking over did, without")
    say.line("   looking, so the email that had already gone out went out a second time.")
    say.line()
    verdict = "met" if ok else "NOT met"
    say.line(
        f"Targets {verdict}: zero repeated model calls, exactly one email and an identical reply"
    )
    say.line(f"at every crash point. ({seconds:.0f} s in all)")
    if wrong.emails > 1:
        say.line(
            f"With the wrong label the recipient got {wrong.emails} emails: the duplicate "
            "the 'never' label prevents."
        )
    return 0 if ok and wrong.emails > 1 else 1


def _demo_namespace() -> tuple[str, str | None]:
    """A fresh namespace for this run, and the ``WORKFLOW_NAMESPACE`` it is named after."""
    suffix = _SUFFIX + secrets.token_hex(4)
    base = os.environ.get(NAMESPACE_VARIABLE) or None
    if base is None:
        return suffix.lstrip("_"), None
    validate_namespace(base)  # a bad value fails here, naming WORKFLOW_NAMESPACE
    return base[: 48 - len(suffix)] + suffix, base


def _remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` if it holds nothing but empty folders (what a purge leaves)."""
    if not folder.is_dir() or any(path.is_file() for path in folder.rglob("*")):
        return
    shutil.rmtree(folder, ignore_errors=True)


async def run_demo(
    *,
    world: str | None = None,
    url: str | None = None,
    as_json: bool = False,
    which: str = "crashes",
) -> int:
    """Run the demo ``which`` (one of :data:`DEMOS`); returns the exit status (0 when every
    target is met). Both run on the same World, in a namespace of their own.

    Raises:
        ConfigurationError: the World cannot be opened as configured (the message names the
            option or variable), or it cannot be shared by several processes.
        InvalidIdentifierError: ``WORKFLOW_NAMESPACE`` is not a valid namespace.
    """
    if which in MISSING:
        raise ConfigurationError(
            f"world demo {which} needs a framework that is not installed: "
            f"pip install '{MISSING[which]}'"
        )
    if which not in DEMOS:
        raise ConfigurationError(f"no demo {which!r}: choose one of {', '.join(DEMOS)}")
    name, _ = resolve_world(world)
    namespace, base = _demo_namespace()
    folder = Path(tempfile.mkdtemp(prefix="world-demo-"))
    where = None
    if name == "local" and url is None and not os.environ.get(LOCAL_DIR_VARIABLE):
        # A fresh folder per run: nothing of a previous run is seen or left behind.
        url = str(folder / "world")
        where = "in a temporary folder, removed at the end"
    leftover: Path | None = None
    try:
        async with open_world(world, url=url, namespace=namespace) as opened:
            settings = opened.settings()
            if "path" in settings:  # the local World's folder for this run's namespace
                leftover = Path(settings["path"])
            if LOCAL_DIR_VARIABLE in settings and where is None:
                where = f"in folder {settings[LOCAL_DIR_VARIABLE]}"
            urls = [v for k, v in settings.items() if k == "url" or k.endswith("_URL")]
            if urls and where is None:
                where = f"at {urls[0]}"  # settings() are redacted: no credentials shown
            if not opened.capabilities.shared:
                # Checked before anything runs: a worker process would open a World of its
                # own, never see the turn, and the demo would wait for nothing.
                installed = ", ".join(entry.name for entry in list_worlds()) or "none"
                raise ConfigurationError(
                    "world demo runs each worker in a process of its own, and the "
                    f"{opened.name!r} World cannot be shared by several processes "
                    "(its capabilities.shared is False): choose another with --world or "
                    f"WORKFLOW_TARGET_WORLD (installed: {installed})"
                )
            out = sys.stderr if as_json else sys.stdout
            screen = _Screen(out, tty=out.isatty())
            with Inbox(folder / "inbox") as inbox:
                if which != "crashes":
                    module = import_module(DEMO_MODULES[which])
                    introduce, run = module.introduce, module.run
                else:
                    introduce, run = _introduce, _run
                introduce(screen, opened, namespace, base, where, inbox)
                ctx = _Context(
                    world=opened,
                    world_name=opened.name,
                    target=world,
                    url=url,
                    namespace=namespace,
                    inbox=inbox,
                    folder=folder,
                    screen=screen,
                )
                try:
                    status: int = await run(ctx, as_json)
                    return status
                finally:
                    with anyio.CancelScope(shield=True):
                        await opened.purge()
                    with contextlib.suppress(OSError):  # the terminal may be gone already
                        screen.end_progress()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if leftover is not None and leftover.name == namespace:
            _remove_if_empty(leftover)


def _introduce(
    screen: _Screen, world: World, namespace: str, base: str | None, where: str | None, inbox: Inbox
) -> None:
    screen.line(f"world demo: one agent turn, crashed at every step, on the {world.name!r} World")
    screen.line()
    for text in _world_lines(world, namespace, base, where):
        screen.line(text)
    screen.line("   tools   lookup_note (safe), send_email (never: not run twice),")
    screen.line("           check_sent (safe: reads the inbox)")
    screen.line(
        f"   inbox   a real SMTP server on 127.0.0.1:{inbox.port}; emails are counted there"
    )
    lease, deadline = f"{LEASE:g} s", f"{SEND_TIMEOUT:g} s"
    screen.line(f"   time    under half a minute: a dead worker holds its turn for its {lease}")
    screen.line(f"           lease; a crash at send_email also waits for its {deadline} deadline")
    screen.line()


def _world_lines(world: World, namespace: str, base: str | None, where: str | None) -> list[str]:
    """The introduction's lines on the World, the namespace and the model."""
    origin = f" (after {NAMESPACE_VARIABLE})" if base else ""
    return [
        f"   World   {world.name}{f', {where}' if where else ''}",
        f"           namespace {namespace}{origin}: this run's own, purged at the end",
        "   model   scripted and deterministic: no API key, no network, no cost",
    ]
