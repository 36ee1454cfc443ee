"""Replay checks: stored histories replayed against the current agent code, with the model and
every tool switched off, so a change that would break the replay of real turns fails in CI
instead of in production (``world replay-check``).

How a session is checked (:func:`replay_check`):

1. Its history (a :class:`~world_core.journal._history.SessionHistory`: exported with
   ``world export``, or read from a World) is imported into a fresh local World in a
   temporary folder: the events in order with their keys, and the blobs they name.
2. Each turn, in submission order, is opened with :meth:`Journal.open
   <world_core.Journal.open>` (on a clock far in the future, so no recorded deadline is still
   running) and the agent's ``run_turn`` runs on it. The journal answers every recorded step
   from the history, checking at each position that the code asks for the same step (kind,
   name, digest of the request or arguments) and, at the end of a finished turn, that it
   produces the same reply.
3. Nothing real runs. The model the agent passes to ``journal.model`` is replaced by one that
   stops the replay, every tool passed to ``journal.tool``/``journal.call`` by one (same name,
   schema and label) that stops it, and the World refuses every write (an intent, an outcome,
   the reply) by stopping it too. The journal only calls a model or a tool, and only writes,
   for a step its history does not hold, so reaching one of them means the recorded history
   ends there. The agent object itself is used as the factory returns it (any object with
   ``run_turn(journal)``); a model client or tool it calls outside the journal is not switched
   off (and is not crash-safe either).

What each turn is, by how its history ends:

=====================  ===========================================================================
history ends with      the turn is
=====================  ===========================================================================
a reply (finished)     ``consistent`` when the code replays every recorded step and finishes with
                       the same reply; ``diverged`` otherwise: a step that differs
                       (:class:`~world_core.errors.NonDeterminismError`, reported with the step
                       and its message: which message or field of a model request changed, which
                       tool is no longer offered, which ``patched()`` marker the code no longer
                       asks for), more steps or fewer, another reply, an error the history did
                       not have, or ``run_turn`` returning without ``journal.finish``.
a failure              ``consistent`` when the code fails again with the recorded error's class
                       (a :class:`~world_core.errors.ToolError` or
                       :class:`~world_core.errors.ModelReplyError` is replayed from the journal,
                       an error of the agent's own code is raised again), or when it replays
                       every recorded step and then needs what the history does not hold: the
                       failure came from there (a call that raised, a timeout, a crash loop),
                       which a replay does not reproduce (so is a ``safe`` tool's error whose
                       deferred outcome the failure did not keep: the replay stops at that very
                       step). ``diverged``: a step that differs, an error of another class, or
                       the code going on past the step of a recorded ToolError, PossiblyRanError
                       or ModelReplyError (the journal raises them again on replay, so not
                       raising means the code changed).
nothing (open)         ``prefix`` (``prefix ok``) when every recorded step replays and the code
                       then needs what the history does not hold (the next model or tool call,
                       the outcome of an interrupted ``never`` call, the end of a wait: a
                       :class:`~world_core.TurnSuspended`), or raises an error there: that is
                       where the recorded prefix ends, and a worker resuming the turn carries on
                       from there. ``diverged``: a step that differs, an error before the
                       recorded steps end, a reply before they end.
an earlier turn open   ``skipped``: it cannot run before that turn ends
                       (:class:`~world_core.errors.TurnNotReadyError`), so it has nothing to
                       replay yet.
=====================  ===========================================================================

A replay that does not end within ``turn_timeout`` seconds (the code awaits something other
than the journal) is ``diverged``. :attr:`ReplayReport.ok` is False when any turn diverged;
``world replay-check`` then exits with status 1, naming the session, turn and step.

In CI, check the histories of real sessions (``world export`` from a staging or production
World, scrubbed of what must not be checked in) against every change of the agent code::

    world replay-check --agent my_app.agent:build tests/histories/

Keep a ``patched()`` branch for as long as a history in that folder (or an open session in
production) holds its marker: removing it makes those histories diverge at the marker's step.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, cast

import anyio

from world_core._select import open_world
from world_core.errors import ConfigurationError, NonDeterminismError, ToolError
from world_core.journal._history import SessionHistory, write_history
from world_core.journal._journal import Journal, scan_session
from world_core.journal._model import ModelClient, ModelReply, ModelRequest, ToolCall
from world_core.journal._tools import Tool
from world_core.journal._waits import WAIT_KINDS, TurnSuspended
from world_core.spi import (
    Capabilities,
    Chunk,
    Event,
    Log,
    LogInfo,
    NewEvent,
    OutboxMessage,
    Page,
    Stream,
    StreamInfo,
    World,
)

__all__ = [
    "DEFAULT_TURN_TIMEOUT",
    "HistoryEnds",
    "ReplayReport",
    "SessionCheck",
    "TurnCheck",
    "format_report",
    "replay_check",
]

DEFAULT_TURN_TIMEOUT = 60.0
"""Seconds the replay of one turn may take before it counts as diverged."""

_FAR_FUTURE = 1e11
"""The replay's clock (UNIX time, year 5138): every recorded deadline has passed."""

_REPLAYED_ERRORS = ("ToolError", "PossiblyRanError", "ModelReplyError")
"""Failures the journal raises again from its records: a replay that does not is a change."""

Status = Literal["consistent", "prefix", "diverged", "skipped"]
HistoryEnd = Literal["reply", "failure", "open"]

_LABELS: dict[str, str] = {
    "consistent": "consistent",
    "prefix": "prefix ok",
    "diverged": "DIVERGED",
    "skipped": "skipped",
}


class HistoryEnds(BaseException):
    """The replay reached what its history does not hold: a model call or a tool call that is
    not recorded, or a journal write. A BaseException, like :class:`TurnSuspended`, so that no
    ``except Exception`` in agent code swallows it."""

    def __init__(self, what: str, step: int | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.step = step


@dataclass(frozen=True)
class TurnCheck:
    """How one turn replayed.

    ``status``: ``consistent``, ``prefix`` (an open turn whose recorded steps all replay),
    ``diverged`` or ``skipped`` (see the module docstring). ``step``: where it diverged, or
    where the recorded history ends (the step the code would take next); None when that is
    the reply. ``recorded_steps``: steps the history holds; ``replayed_steps``: steps the
    journal read back. ``history_end``: ``reply``, ``failure`` or ``open``.
    """

    turn_id: str
    status: Status
    detail: str
    step: int | None = None
    recorded_steps: int = 0
    replayed_steps: int = 0
    history_end: HistoryEnd = "open"


@dataclass(frozen=True)
class SessionCheck:
    """The turns of one session, in submission order, and where its history came from."""

    session_id: str
    source: str
    turns: tuple[TurnCheck, ...]


@dataclass(frozen=True)
class ReplayReport:
    """What :func:`replay_check` found, per session and turn."""

    sessions: tuple[SessionCheck, ...]

    @property
    def ok(self) -> bool:
        """True when no turn diverged."""
        return not any(turn.status == "diverged" for turn in self.turns())

    def turns(self) -> list[TurnCheck]:
        return [turn for session in self.sessions for turn in session.turns]

    def counts(self) -> dict[str, int]:
        """Turns per status, and sessions."""
        counts = {status: 0 for status in _LABELS}
        for turn in self.turns():
            counts[turn.status] += 1
        return {"sessions": len(self.sessions), **counts}

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "sessions": [
                {
                    "session_id": session.session_id,
                    "source": session.source,
                    "turns": [dataclasses.asdict(turn) for turn in session.turns],
                }
                for session in self.sessions
            ],
        }


# -- the switched-off model, tools and World ----------------------------------------------


class _ModelOff:
    """The model during a replay: any call means the history ends here."""

    async def complete(self, request: ModelRequest) -> ModelReply:
        raise HistoryEnds("the code would call the model")


_MODEL_OFF: ModelClient = _ModelOff()


class _ReplayJournal(Journal):
    """A Journal whose model and tools are switched off (the agent's are never called)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reached: str | None = None
        self.finished_in_replay = False

    def _off(self, tool: Tool) -> Tool:
        """``tool`` with the same name, schema and labels, whose call stops the replay. The
        journal records what a tool raises as its outcome, so the stop is raised again by
        :meth:`_stop_if_reached` once the step returns."""

        async def off(**_: Any) -> NoReturn:
            what = f"the code would call tool {tool.name} ({tool.replay})"
            if self._reached is None:
                self._reached = what
            raise HistoryEnds(what)

        return dataclasses.replace(tool, fn=off)

    def _stop_if_reached(self) -> None:
        if self._reached is not None:
            raise HistoryEnds(self._reached, self.position - 1)

    async def model(self, client: ModelClient, request: ModelRequest) -> ModelReply:
        return await super().model(_MODEL_OFF, request)

    async def tool(self, tool: Tool, call: ToolCall) -> str:
        text = await super().tool(self._off(tool), call)
        self._stop_if_reached()
        return text

    async def call(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        try:
            return await super().call(self._off(tool), arguments)
        except ToolError:
            self._stop_if_reached()
            raise

    async def finish(self, reply: str) -> str:
        text = await super().finish(reply)
        self.finished_in_replay = True
        return text


def _body(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _write_stop(events: Sequence[NewEvent]) -> HistoryEnds:
    """The stop for a journal write of ``events``, saying what the write was."""
    for event in reversed(events):
        if "/state/" in (event.key or ""):
            continue
        body = _body(event.data)
        step = body.get("step") if type(body.get("step")) is int else None
        what, kind, name = body.get("t"), body.get("kind"), body.get("name")
        result = body.get("result")
        if what == "reply":
            return HistoryEnds("the code would record the turn's reply")
        if what == "intent" and kind in WAIT_KINDS:
            return HistoryEnds(f"the code would start a {kind} wait ({name})", step)
        if what == "intent":
            return HistoryEnds(f"the code would call tool {name} (never)", step)
        if what == "outcome" and isinstance(result, dict) and result.get("interrupted"):
            return HistoryEnds(
                f"tool {name} was interrupted (its intent is recorded, its outcome is not): a "
                "resumed turn tells the model it may or may not have happened",
                step,
            )
        if what == "outcome" and kind in WAIT_KINDS:
            return HistoryEnds(f"the {kind} wait ({name}), open in the history, would end", step)
        return HistoryEnds(f"the journal would write {event.key or 'an event'}", step)
    return HistoryEnds("the journal would write")


class _ReadOnlyLog(Log):
    def __init__(self, inner: Log) -> None:
        self._inner = inner

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        raise _write_stop(events)

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        return await self._inner.read(log_id, after=after, limit=limit)

    async def get(self, log_id: str, key: str) -> Event | None:
        return await self._inner.get(log_id, key)

    async def tail(self, log_id: str) -> int:
        return await self._inner.tail(log_id)

    async def info(self, log_id: str) -> LogInfo | None:
        return await self._inner.info(log_id)

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        return self._inner.watch(log_id, after=after)

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        return await self._inner.list_logs(prefix=prefix, status=status, cursor=cursor, limit=limit)

    async def delete(self, log_id: str) -> None:
        raise HistoryEnds(f"the code would delete log {log_id}")


class _ReadOnlyStream(Stream):
    def __init__(self, inner: Stream) -> None:
        self._inner = inner

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        raise HistoryEnds("the journal would store a blob")

    async def close(self, stream_id: str) -> None:
        raise HistoryEnds("the journal would store a blob")

    async def info(self, stream_id: str) -> StreamInfo:
        return await self._inner.info(stream_id)

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        return self._inner.read(stream_id, start=start)

    async def delete(self, stream_id: str) -> None:
        raise HistoryEnds(f"the code would delete stream {stream_id}")


class _ReadOnlyWorld(World):
    """``inner``, read-only: every write stops the replay (:class:`HistoryEnds`)."""

    def __init__(self, inner: World) -> None:
        self._inner = inner
        self.name = inner.name
        self.namespace = inner.namespace
        self.log = _ReadOnlyLog(inner.log)
        self.queue = inner.queue  # the journal does not use it
        self.stream = _ReadOnlyStream(inner.stream)

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    def settings(self) -> Mapping[str, str]:
        return self._inner.settings()

    async def purge(self) -> None:
        raise HistoryEnds("the code would purge the World")

    async def aclose(self) -> None:
        """The inner World is closed by whoever opened it."""


# -- checking -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Facts:
    """What the history says about one turn."""

    steps: int
    end: HistoryEnd
    failure: dict[str, Any] | None


def _facts(events: Sequence[Event], turn_id: str) -> _Facts:
    steps: set[int] = set()
    end: HistoryEnd = "open"
    failure: dict[str, Any] | None = None
    for event in events:
        body = _body(event.data)
        if str(body.get("turn")) != turn_id:
            continue
        what = body.get("t")
        if what in ("intent", "outcome") and type(body.get("step")) is int:
            steps.add(body["step"])
        elif what == "reply":
            end = "reply"
        elif what == "failure" and end != "reply":
            end, failure = "failure", body
    return _Facts(steps=len(steps), end=end, failure=failure)


_POSITION = re.compile(r"step (\d+)")
_PREFIX = re.compile(r"^turn '.*?' step \d+: ")


def _diverged_step(exc: NonDeterminismError) -> int | None:
    found = _POSITION.search(str(exc.position))
    return int(found.group(1)) if found else None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def _up_to(steps: int) -> str:
    return f"up to step {steps - 1} ({steps} recorded)" if steps else "nothing recorded yet"


def _judge(
    journal: _ReplayJournal,
    facts: _Facts,
    stop: HistoryEnds | None,
    error: BaseException | None,
    timed_out: float | None,
) -> tuple[Status, int | None, str]:
    """The verdict on one replayed turn: status, step, detail (see the module docstring)."""
    steps = facts.steps
    if timed_out is not None:
        return (
            "diverged",
            journal.position,
            f"the replay did not end within {timed_out:g} s (the code waits for something "
            "other than the journal)",
        )
    if isinstance(error, NonDeterminismError):
        step = _diverged_step(error)
        return "diverged", step, _PREFIX.sub("", str(error))
    if isinstance(error, TurnSuspended):
        stop = HistoryEnds(f"the code would wait ({error})", error.step)
        error = None
    if stop is not None and stop.step is None:
        stop = HistoryEnds(stop.what, journal.position)
    if facts.end == "reply":
        if stop is not None:
            return "diverged", stop.step, f"{stop.what}, past the end of the recorded turn"
        if error is not None:
            step = getattr(error, "step", None)
            return (
                "diverged",
                step if type(step) is int else journal.position,
                f"the code raises {_describe(error)}; the history finished with a reply",
            )
        if not journal.finished_in_replay:
            return (
                "diverged",
                journal.position,
                "run_turn returned without journal.finish; the history finished with a reply "
                f"after {steps} steps",
            )
        return "consistent", None, f"replayed {steps} steps to the recorded reply"
    if facts.end == "failure":
        failure = facts.failure or {}
        error_type = str(failure.get("error_type"))
        recorded = f"{error_type}: {str(failure.get('error'))[:200]}"
        if error is not None and type(error).__name__ == error_type:
            step = getattr(error, "step", None)
            at = f" at step {step}" if type(step) is int else ""
            return "consistent", None, f"fails again as recorded{at}: {_describe(error)[:300]}"
        if stop is not None:
            failed_at = failure.get("step")
            if error_type in _REPLAYED_ERRORS and (
                type(failed_at) is not int or stop.step is None or stop.step > failed_at
            ):
                return (
                    "diverged",
                    stop.step,
                    f"the recorded failure ({recorded}) is not raised again: {stop.what}",
                )
            return (
                "consistent",
                None,
                f"replayed {steps} steps to where the recorded failure ({recorded}) happened, "
                f"then: {stop.what}, which a replay does not do",
            )
        if error is not None:
            step = getattr(error, "step", None)
            return (
                "diverged",
                step if type(step) is int else journal.position,
                f"the code raises {_describe(error)}; the history failed with {recorded}",
            )
        return (
            "diverged",
            journal.position,
            f"run_turn returned without journal.finish; the history failed with {recorded}",
        )
    # An open turn: its history is a prefix of the run.
    if stop is not None:
        return "prefix", stop.step, f"{_up_to(steps)}, then: {stop.what}"
    if error is not None:
        if journal.position >= steps:
            return (
                "prefix",
                journal.position,
                f"{_up_to(steps)}, then: the code raises {_describe(error)} (the turn would "
                "fail there when resumed)",
            )
        return (
            "diverged",
            journal.position,
            f"the code raises {_describe(error)} at step {journal.position}, but the history "
            f"goes on to step {steps - 1}",
        )
    return (
        "diverged",
        journal.position,
        "run_turn returned without journal.finish (a worker would fail the turn)",
    )


async def _check_turn(
    world: World,
    session_id: str,
    turn_id: str,
    facts: _Facts,
    make_agent: Callable[[], Any],
    turn_timeout: float,
) -> TurnCheck:
    opened = await _ReplayJournal.open(world, session_id, turn_id, clock=lambda: _FAR_FUTURE)
    journal = cast(_ReplayJournal, opened)
    common: dict[str, Any] = {"recorded_steps": facts.steps, "history_end": facts.end}
    if journal.waiting_for is not None:
        return TurnCheck(
            turn_id,
            "skipped",
            f"waits for turn {journal.waiting_for}, which has not ended in this history",
            **common,
        )
    agent = make_agent()
    stop: HistoryEnds | None = None
    error: BaseException | None = None
    with anyio.move_on_after(turn_timeout) as scope:
        try:
            await agent.run_turn(journal)
        except HistoryEnds as exc:
            stop = exc
        except BaseException as exc:
            # Agent code may raise anything; a cancellation and Ctrl-C are not its outcome.
            if isinstance(exc, anyio.get_cancelled_exc_class() | KeyboardInterrupt):
                raise
            error = exc
    timed_out = turn_timeout if scope.cancelled_caught else None
    status, step, detail = _judge(journal, facts, stop, error, timed_out)
    return TurnCheck(turn_id, status, detail, step=step, replayed_steps=journal.replayed, **common)


def _agent_maker(agent_factory: Callable[[], Any]) -> Callable[[], Any]:
    def make() -> Any:
        try:
            agent = agent_factory()
        except Exception as exc:
            raise ConfigurationError(
                f"the agent factory {getattr(agent_factory, '__name__', agent_factory)!r} "
                f"raised {_describe(exc)}"
            ) from exc
        if not callable(getattr(agent, "run_turn", None)):
            raise ConfigurationError(
                f"the agent factory returned {type(agent).__name__}, which has no "
                "run_turn(journal) method: return an Agent"
            )
        return agent

    return make


async def replay_check(
    histories: Iterable[SessionHistory],
    agent_factory: Callable[[], Any],
    *,
    turn_timeout: float = DEFAULT_TURN_TIMEOUT,
) -> ReplayReport:
    """Replay every turn of ``histories`` with the agents ``agent_factory`` makes (one per
    turn), the model and tools switched off, each session in a temporary local World.

    Returns the report; it raises nothing for a divergence (see :attr:`ReplayReport.ok`).

    Raises:
        ConfigurationError: the local World is not installed, or ``agent_factory`` raised or
            returned something without ``run_turn``.
    """
    make_agent = _agent_maker(agent_factory)
    sessions: list[SessionCheck] = []
    # The logs of one session (its generations, when it was continued in fresh logs) are
    # loaded into one namespace, so its chain of continuation markers holds.
    groups: dict[tuple[str, str], list[SessionHistory]] = {}
    for history in histories:
        groups.setdefault((history.source, history.session_id), []).append(history)
    with tempfile.TemporaryDirectory(prefix="world-replay-") as folder:
        for index, group in enumerate(groups.values()):
            async with open_world("local", url=folder, namespace=f"replay_{index}") as local:
                for history in group:
                    await write_history(local, history)
                world = _ReadOnlyWorld(local)
                for history in group:
                    session = scan_session(list(history.events))
                    turns: list[TurnCheck] = []
                    for turn_id in session.in_order():
                        facts = _facts(history.events, turn_id)
                        turns.append(
                            await _check_turn(
                                world, history.session_id, turn_id, facts, make_agent, turn_timeout
                            )
                        )
                    sessions.append(SessionCheck(history.session_id, history.source, tuple(turns)))
    return ReplayReport(tuple(sessions))


def format_report(report: ReplayReport) -> str:
    """The report as a table: one block per session, one row per turn, a summary line."""
    lines: list[str] = []
    for session in report.sessions:
        lines.append(f"{session.source}: session {session.session_id}")
        if not session.turns:
            lines.append("  (no turns)")
        width = max((len(turn.turn_id) for turn in session.turns), default=0)
        for turn in session.turns:
            first, *rest = turn.detail.splitlines() or [""]
            if turn.status == "diverged":
                first = f"at {'the reply' if turn.step is None else f'step {turn.step}'}: {first}"
            head = f"  turn {turn.turn_id:<{width}}  {_LABELS[turn.status]:<10}  "
            lines.append(head + first)
            lines.extend(" " * len(head) + line.strip() for line in rest)
    counts = report.counts()
    turns = sum(counts[status] for status in _LABELS)
    summary = ", ".join(
        f"{counts[status]} {'prefix ok' if status == 'prefix' else status}" for status in _LABELS
    )
    verdict = "ok" if report.ok else "DIVERGED"
    lines.append("")
    sessions = counts["sessions"]
    lines.append(
        f"replay-check {verdict}: {turns} turn{'' if turns == 1 else 's'} in {sessions} "
        f"session{'' if sessions == 1 else 's'}: {summary}"
    )
    return "\n".join(lines)
