"""The trace of a session: every turn, every step, every run of a worker, read from the journal.

One model, built only from the session's journal logs (never from process logs), feeds
``world trace``, ``world tail``, ``world ui`` and the OpenTelemetry exporter. Its JSON form
(``format`` ``"world-trace/1"``) is a public format; every field is documented on its model.

How the journal's events become a trace:

* A **run** is one delivery of a turn's queue message to a worker: the events a Journal wrote
  carry ``run`` (``worker``, ``message``, ``attempt``), so the events of one run are told apart
  from the next one's. A run that wrote nothing (it crashed before its first write, or found a
  ``never`` call still in flight and re-queued the turn) leaves no trace.
* A **stop** is where a run's events end without the turn's end: a crash, a lost lease, a
  shutdown (``stopped``), or a wait that suspended the turn (``suspended``). The **resume** is
  the next run's first new step: every step before it was read back from the journal
  (``replayed``), never run again.
* A step's **attempts** are the runs that touched it: the run that recorded its intent, the run
  that recorded its outcome, and each later run that read it back (``replayed``).
* Events written before the journal recorded ``run`` and ``at`` (older histories) are read as
  one run with unknown worker and times; everything else in the trace is still there.

Step identities are journal positions, stable across reads and replays: ``session``, ``turn``,
``step`` (and ``run`` for an attempt). :func:`step_id` gives them as one string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from world_core._select import redact
from world_core.errors import InvalidArgumentError, NotFoundError
from world_core.journal import idempotency_key, session_chain, session_log_id
from world_core.spi import Event, World

__all__ = [
    "TRACE_FORMAT",
    "RunTrace",
    "SessionTrace",
    "StepAttempt",
    "StepStatus",
    "StepTrace",
    "Stop",
    "TurnStatus",
    "TurnTrace",
    "Usage",
    "build_trace",
    "redact_content",
    "step_id",
    "trace_events",
    "trace_session",
]

TRACE_FORMAT = "world-trace/1"
"""The ``format`` of a :class:`SessionTrace`'s JSON; a later, incompatible version changes it."""

StepStatus = Literal["done", "failed", "possibly_ran", "interrupted", "running", "waiting"]
"""Where a step is: ``done`` (its outcome is recorded), ``failed`` (its recorded outcome is an
error), ``possibly_ran`` (a ``never`` tool was cut off; the model was told it may or may not
have happened), ``interrupted`` (an intent without an outcome in a turn that ended or moved
on), ``running`` (the turn's open step: intent recorded, still running or about to be
answered for), ``waiting`` (a wait whose outcome is not in yet)."""

AttemptStatus = Literal["done", "failed", "possibly_ran", "interrupted", "replayed", "running"]
"""What one run did with a step: recorded its outcome (``done``, ``failed``,
``possibly_ran``), recorded only its intent and stopped (``interrupted``, or ``running`` while
the turn is open), or read it back from the journal (``replayed``)."""

TurnStatus = Literal["queued", "running", "waiting", "done", "failed"]
"""A turn's state, as :meth:`world_core.Client.status` tells it."""

_SECRET_KEY = re.compile(r"key|token|secret|password|passwd|authorization|cookie", re.IGNORECASE)
_SECRET_PAIR = re.compile(
    r'("[^"]*(?:key|token|secret|password|passwd|authorization|cookie)[^"]*"\s*:\s*")'
    r'(?:[^"\\]|\\.)*("|$)',
    re.IGNORECASE,
)
_SECRET_AUTH = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^/\s:@\"']*):[^@\s/\"']*@", re.IGNORECASE)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Usage(_Model):
    """Token counts a model server reported (summed over calls for a turn)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class StepAttempt(_Model):
    """One run's part in a step."""

    run: int | None = Field(description="the index of the run (TurnTrace.runs), None if unknown")
    worker: str | None = Field(description="the worker that held the turn's lease")
    message: str | None = Field(description="the queue message id the lease was on")
    attempt: int | None = Field(description="that message's delivery count (1 first)")
    status: AttemptStatus
    started_at: float | None = Field(description="UNIX seconds, store clock; None if unknown")
    ended_at: float | None = Field(description="when its outcome was made; None without one")


class StepTrace(_Model):
    """One step of a turn (a model call, a tool call, a wait, a journaled value)."""

    id: str = Field(description="'<session>/<turn>/<step>': stable, a journal position")
    step: int
    kind: str = Field(description="model, tool, timer, signal, approval, child, now, uuid ...")
    name: str = Field(description="the tool's or wait's name; the kind for the others")
    status: StepStatus
    replay: str | None = Field(description="a tool's replay label when recorded (never)")
    idempotency_key: str | None = Field(description="a tool call's key (what it was given)")
    started_at: float | None = Field(description="UNIX seconds (store clock), if recorded")
    ended_at: float | None = Field(description="when its outcome was recorded, if recorded")
    duration: float | None = Field(description="ended_at - started_at, seconds")
    deadline: float | None = Field(description="a tool's or a wait's recorded deadline")
    attempts: list[StepAttempt] = Field(description="every run that touched the step, in order")
    replayed: bool = Field(description="a later run read the outcome back instead of running")
    usage: Usage | None = Field(description="a model call's tokens, when the server said")
    blob_bytes: int = Field(description="bytes of blobs the step's events name (large values)")
    event_bytes: int = Field(description="bytes of the step's events in the log")
    error: str | None = Field(description="a failed outcome's error (secrets redacted)")
    wait: dict[str, Any] | None = Field(
        description="a wait's details: signal name, for_turn, and its result (fired, "
        "timed_out, the signal's name, sender and id); payloads only with content"
    )
    content: dict[str, Any] | None = Field(
        description="input (a tool's arguments, a model request's preview) and output, "
        "redacted; an output stored as a blob is shown as its digest and size; only when "
        "the trace was built with content"
    )


class RunTrace(_Model):
    """One run of a turn: a worker holding its queue message under a lease."""

    index: int = Field(description="1, 2, ... in the order the runs wrote their first event")
    worker: str | None
    message: str | None
    attempt: int | None
    lease: float | None = Field(
        description="the lease's length in seconds (renewed while it runs): a run that stopped "
        "held the turn at most this long after its last renewal"
    )
    first_step: int | None = Field(description="the first step this run wrote (new work)")
    last_step: int | None = Field(description="the last step this run wrote")
    started_at: float | None = Field(description="its first event's time")
    ended_at: float | None = Field(description="its last event's time")
    replayed_steps: int = Field(description="steps it read back before its first new one")
    ended: Literal["finished", "failed", "suspended", "stopped", "running"] = Field(
        description="finished/failed: it wrote the turn's end; suspended: it left the turn in "
        "a wait; stopped: its events end there (a crash, a lost lease, a shutdown); running: "
        "the turn's latest run, not ended yet"
    )


class Stop(_Model):
    """Where a turn stopped without ending, and where it went on."""

    run: int | None = Field(
        description="the run that stopped; None for deliveries that wrote nothing (the "
        "first recorded run's message had been delivered before: a crash before any write)"
    )
    worker: str | None
    reason: Literal["stopped", "suspended"] = Field(
        description="stopped: the run's events end (crash, lost lease); suspended: a wait"
    )
    step: int | None = Field(description="the step it stopped at or after")
    at_step: Literal["after_outcome", "intent_without_outcome", "before_first_step", "wait"]
    at: float | None = Field(description="the time of its last event")
    resumed_run: int | None = Field(description="the run that continued, None if none yet")
    resumed_worker: str | None
    resumed_attempt: int | None = Field(description="that run's delivery count")
    resumed_step: int | None = Field(description="its first new step (the ones before: replayed)")
    resumed_at: float | None


class TurnTrace(_Model):
    """One turn of a session."""

    id: str = Field(description="'<session>/<turn>'")
    turn: str
    log_id: str = Field(description="the session log (generation) holding the turn")
    status: TurnStatus
    submitted_at: float | None
    ended_at: float | None = Field(description="when its reply or failure was recorded")
    duration: float | None = Field(description="ended_at - submitted_at, seconds")
    steps: list[StepTrace]
    runs: list[RunTrace]
    stops: list[Stop] = Field(description="each place it stopped and where it continued")
    usage: Usage | None = Field(description="summed over its model calls that reported usage")
    failure: dict[str, Any] | None = Field(
        description="error_type, error (redacted), attempts, step of a failed turn"
    )
    content: dict[str, Any] | None = Field(
        description="message and reply, redacted; only when built with content"
    )


class SessionTrace(_Model):
    """A session: its turns in submission order."""

    format: Literal["world-trace/1"] = "world-trace/1"
    session: str
    logs: list[str] = Field(description="its logs, oldest first (continue-as-new)")
    status: TurnStatus | Literal["empty"]
    updated_at: float | None = Field(description="its latest event's time")
    turns: list[TurnTrace]
    content: bool = Field(description="whether content (prompts, arguments, results) is shown")


def step_id(session: str, turn: str, step: int) -> str:
    """The stable identity of a step: ``<session>/<turn>/<step>``."""
    return f"{session}/{turn}/{step}"


def redact_content(value: Any) -> Any:
    """``value`` with secrets masked: the value of every mapping key that looks like a secret
    (``*key*``, ``*token*``, ``*secret*``, ``*password*``, ``authorization``, ``cookie``)
    becomes ``"***"``, credentials in URLs inside strings too (:func:`world_core.redact`);
    JSON text in a string (a tool's arguments) is redacted as JSON."""
    if isinstance(value, dict):
        return {
            k: "***" if _SECRET_KEY.search(str(k)) else redact_content(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_content(item) for item in value]
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in "{[" and len(text) > 1:
            try:
                parsed = json.loads(text)
            except ValueError:
                pass
            else:
                return json.dumps(redact_content(parsed), ensure_ascii=False)
        masked = _SECRET_PAIR.sub(r"\1***\2", redact(value))  # JSON cut short (a preview)
        masked = _URL_PASSWORD.sub(r"\1:***@", masked)
        return _SECRET_AUTH.sub(r"\1 ***", masked)
    return value


# -- building ---------------------------------------------------------------------------------

_Key = tuple[str | None, int | None]  # (message, attempt)


class _Run:
    def __init__(self, key: _Key, worker: str | None, seq: int, lease: float | None) -> None:
        self.key = key
        self.worker = worker
        self.lease = lease
        self.seq = seq
        self.steps: list[int] = []
        self.times: list[float] = []
        self.events: list[dict[str, Any]] = []


def _body(event: Event) -> dict[str, Any] | None:
    try:
        body = json.loads(event.data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(0.0, end - start), 3)


def _usage(outcome: dict[str, Any] | None) -> Usage | None:
    output = ((outcome or {}).get("result") or {}).get("output")
    counts = output.get("usage") if isinstance(output, dict) else None
    if not isinstance(counts, dict):
        return None
    return Usage(
        prompt_tokens=int(counts.get("prompt_tokens") or 0),
        completion_tokens=int(counts.get("completion_tokens") or 0),
        total_tokens=int(counts.get("total_tokens") or 0),
    )


def _blob_bytes(body: dict[str, Any]) -> int:
    blob = body.get("blob")
    if isinstance(blob, dict) and isinstance(blob.get("size"), int):
        return int(blob["size"])
    return 0


class _TurnEvents:
    def __init__(self, turn: str, log_id: str) -> None:
        self.turn = turn
        self.log_id = log_id
        self.input: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        self.intents: dict[int, dict[str, Any]] = {}
        self.outcomes: dict[int, dict[str, Any]] = {}
        self.bytes: dict[int, int] = {}
        self.blobs: dict[int, int] = {}
        self.runs: dict[_Key, _Run] = {}
        self.last_at: float | None = None


def trace_events(
    session: str,
    logs: Sequence[tuple[str, Sequence[Event]]],
    *,
    content: bool = False,
    turn: str | None = None,
) -> SessionTrace:
    """The trace of ``session`` from its logs' events (``(log_id, events)``, oldest log first),
    as :func:`trace_session` reads them; for exported histories and tests.

    Args:
        content: include prompts, tool arguments, results, messages and replies (redacted).
        turn: only this turn (the session's status still covers them all).

    Raises:
        NotFoundError: ``turn`` is not a turn of the session.
    """
    turns: dict[str, _TurnEvents] = {}
    updated: float | None = None
    for log_id, events in logs:
        for event in events:
            body = _body(event)
            if body is None or body.get("t") not in _TURN_EVENTS:
                continue
            if not isinstance(body.get("turn"), str):
                continue
            what, name = body.get("t"), str(body.get("turn"))
            at = _time(body.get("at"))
            if at is not None:
                updated = at if updated is None else max(updated, at)
            if what == "input":
                entry = turns.setdefault(name, _TurnEvents(name, log_id))
                entry.log_id = log_id  # a later generation's copy wins (it runs there)
                entry.input = body
                continue
            entry = turns.get(name) or turns.setdefault(name, _TurnEvents(name, log_id))
            if what in ("reply", "failure"):
                entry.end = body
                _note_run(entry, body, event.seq, None)
                continue
            step = body.get("step")
            if not isinstance(step, int):
                continue
            if what in ("intent", "outcome"):
                (entry.intents if what == "intent" else entry.outcomes)[step] = body
                _note_run(entry, body, event.seq, step)
            entry.bytes[step] = entry.bytes.get(step, 0) + len(event.data)
            entry.blobs[step] = entry.blobs.get(step, 0) + _blob_bytes(body)
    if turn is not None and turn not in turns:
        raise NotFoundError(f"session {session!r} has no turn {turn!r}; see: world trace {session}")
    traced = [_turn_trace(session, entry, content) for entry in turns.values()]
    return SessionTrace(
        session=session,
        logs=[log_id for log_id, _ in logs],
        status=_session_status(traced),
        updated_at=updated,
        turns=[t for t in traced if turn is None or t.turn == turn],
        content=content,
    )


def _session_status(turns: list[TurnTrace]) -> TurnStatus | Literal["empty"]:
    if not turns:
        return "empty"
    open_ones: tuple[TurnStatus, ...] = ("running", "waiting", "queued")
    for status in open_ones:
        if any(t.status == status for t in turns):
            return status
    return turns[-1].status


def _note_run(entry: _TurnEvents, body: dict[str, Any], seq: int, step: int | None) -> None:
    info = body.get("run")
    info = info if isinstance(info, dict) else {}
    key = _run_key(body)
    run = entry.runs.get(key)
    if run is None:
        worker = info.get("worker")
        run = entry.runs[key] = _Run(
            key, str(worker) if worker is not None else None, seq, _time(info.get("lease"))
        )
    if step is not None:
        run.steps.append(step)
    at = _time(body.get("at"))
    if at is not None:
        run.times.append(at)
        entry.last_at = at
    run.events.append(body)


def _run_key(body: dict[str, Any] | None) -> _Key:
    """The run an event of the turn was written by: its message and delivery."""
    info = (body or {}).get("run")
    info = info if isinstance(info, dict) else {}
    message, attempt = info.get("message"), info.get("attempt")
    return (
        str(message) if message is not None else None,
        attempt if isinstance(attempt, int) else None,
    )


def _run_of(body: dict[str, Any] | None, index: dict[_Key, int]) -> int | None:
    return index.get(_run_key(body))


def _turn_trace(session: str, entry: _TurnEvents, content: bool) -> TurnTrace:
    ordered = sorted(entry.runs.values(), key=lambda r: r.seq)
    index = {run.key: n for n, run in enumerate(ordered, start=1)}
    ended = entry.end is not None
    failed = ended and (entry.end or {}).get("t") == "failure"
    all_steps = sorted(set(entry.intents) | set(entry.outcomes))
    last_step = all_steps[-1] if all_steps else None
    open_wait = (
        last_step is not None
        and last_step not in entry.outcomes
        and (entry.intents.get(last_step) or {}).get("kind") in _WAIT_KINDS
    )
    # Runs: where each began new work and where it stopped.
    runs: list[RunTrace] = []
    for n, run in enumerate(ordered, start=1):
        first = min(run.steps) if run.steps else None
        last = max(run.steps) if run.steps else None
        wrote_end = any(e.get("t") in ("reply", "failure") for e in run.events)
        if wrote_end:
            how: Any = "failed" if failed else "finished"
        elif n == len(ordered) and not ended:
            how = "suspended" if open_wait else "running"
        elif last is not None and _is_wait_intent(entry, last, run):
            how = "suspended"
        else:
            how = "stopped"
        replayed = 0
        if first is not None:
            replayed = len([s for s in all_steps if s < first])
        elif wrote_end:
            replayed = len(all_steps)
        runs.append(
            RunTrace(
                index=n,
                worker=run.worker,
                message=run.key[0],
                attempt=run.key[1],
                lease=run.lease,
                first_step=first,
                last_step=last,
                started_at=min(run.times) if run.times else None,
                ended_at=max(run.times) if run.times else None,
                replayed_steps=replayed,
                ended=how,
            )
        )
    stops: list[Stop] = []
    if runs and runs[0].attempt is not None and runs[0].attempt > 1:
        first_run = runs[0]
        stops.append(
            Stop(
                run=None,
                worker=None,
                reason="stopped",
                step=None,
                at_step="before_first_step",
                at=None,
                resumed_run=first_run.index,
                resumed_worker=first_run.worker,
                resumed_attempt=first_run.attempt,
                resumed_step=first_run.first_step,
                resumed_at=first_run.started_at,
            )
        )
    for n, traced in enumerate(runs):
        if traced.ended not in ("stopped", "suspended"):
            continue
        after = runs[n + 1] if n + 1 < len(runs) else None
        where: Any = "before_first_step"
        if traced.last_step is not None:
            if traced.ended == "suspended":
                where = "wait"
            elif (
                traced.last_step in entry.intents
                and _run_of(entry.outcomes.get(traced.last_step), index) != traced.index
            ):
                where = "intent_without_outcome"
            else:
                where = "after_outcome"
        resumed_step = None
        if after is not None:
            resumed_step = after.first_step
        stops.append(
            Stop(
                run=traced.index,
                worker=traced.worker,
                reason="stopped" if traced.ended == "stopped" else "suspended",
                step=traced.last_step,
                at_step=where,
                at=traced.ended_at,
                resumed_run=after.index if after is not None else None,
                resumed_worker=after.worker if after is not None else None,
                resumed_attempt=after.attempt if after is not None else None,
                resumed_step=resumed_step,
                resumed_at=after.started_at if after is not None else None,
            )
        )
    steps = [
        _step_trace(session, entry, n, runs, index, ended, n == last_step, content)
        for n in all_steps
    ]
    usages = [s.usage for s in steps if s.usage is not None]
    usage = (
        Usage(
            prompt_tokens=sum(u.prompt_tokens for u in usages),
            completion_tokens=sum(u.completion_tokens for u in usages),
            total_tokens=sum(u.total_tokens for u in usages),
        )
        if usages
        else None
    )
    status: TurnStatus
    if ended:
        status = "failed" if failed else "done"
    elif open_wait:
        status = "waiting"
    elif all_steps:
        status = "running"
    else:
        status = "queued"
    submitted = _time((entry.input or {}).get("at"))
    end_at = _time((entry.end or {}).get("at"))
    failure = None
    if failed and entry.end is not None:
        failure = {
            "error_type": entry.end.get("error_type"),
            "error": redact_content(str(entry.end.get("error", ""))),
            "attempts": entry.end.get("attempts"),
            "step": entry.end.get("step"),
        }
    turn_content = None
    if content:
        turn_content = {
            "message": redact_content((entry.input or {}).get("message")),
            "reply": redact_content((entry.end or {}).get("reply")) if not failed else None,
        }
    return TurnTrace(
        id=f"{session}/{entry.turn}",
        turn=entry.turn,
        log_id=entry.log_id,
        status=status,
        submitted_at=submitted,
        ended_at=end_at,
        duration=_span(submitted, end_at),
        steps=steps,
        runs=runs,
        stops=stops,
        usage=usage,
        failure=failure,
        content=turn_content,
    )


_WAIT_KINDS = ("timer", "signal", "approval", "child")
_TURN_EVENTS = ("input", "intent", "outcome", "reply", "failure")


def _is_wait_intent(entry: _TurnEvents, step: int, run: _Run) -> bool:
    """Whether ``run`` left the turn waiting at ``step``: it wrote the wait's intent and not
    its outcome. A run that only wrote the outcome (a wake-up) resumed the wait; if its events
    end there, it stopped after that step (a crash), it did not suspend."""
    intent = entry.intents.get(step)
    if intent is None or intent.get("kind") not in _WAIT_KINDS:
        return False
    if _run_key(intent) != run.key:
        return False
    outcome = entry.outcomes.get(step)
    return outcome is None or _run_key(outcome) != run.key


def _step_trace(
    session: str,
    entry: _TurnEvents,
    n: int,
    runs: list[RunTrace],
    index: dict[_Key, int],
    turn_ended: bool,
    is_last: bool,
    content: bool,
) -> StepTrace:
    intent = entry.intents.get(n)
    outcome = entry.outcomes.get(n)
    identity = outcome or intent or {}
    kind = str(identity.get("kind", "?"))
    result = (outcome or {}).get("result")
    result = result if isinstance(result, dict) else {}
    attempts: list[StepAttempt] = []

    def attempt(body: dict[str, Any] | None, status: AttemptStatus, start: Any, end: Any) -> None:
        run_index = _run_of(body, index)
        run = runs[run_index - 1] if run_index is not None else None
        attempts.append(
            StepAttempt(
                run=run_index,
                worker=run.worker if run else None,
                message=run.message if run else None,
                attempt=run.attempt if run else None,
                status=status,
                started_at=_time(start),
                ended_at=_time(end),
            )
        )

    intent_run = _run_of(intent, index) if intent is not None else None
    outcome_run = _run_of(outcome, index) if outcome is not None else None
    if outcome is not None and "error" in result:
        final: Any = "failed"
    elif outcome is not None and result.get("interrupted"):
        final = "possibly_ran"
    elif outcome is not None:
        final = "done"
    elif kind in _WAIT_KINDS and not turn_ended:
        final = "waiting"
    elif is_last and not turn_ended:
        final = "running"
    else:
        final = "interrupted"
    if intent is not None and (outcome is None or intent_run != outcome_run):
        status: AttemptStatus = "running" if final in ("running", "waiting") else "interrupted"
        attempt(intent, status, intent.get("at"), None)
    if outcome is not None:
        start = outcome.get("started")
        if intent is not None and intent_run == outcome_run:
            start = intent.get("at", start)
        attempt(outcome, final, start, outcome.get("at"))
    # Later runs that began their new work past this step read it back.
    recorded_by = outcome_run if outcome is not None else None
    replayed = False
    if outcome is not None:
        for run in runs:
            if recorded_by is not None and run.index <= recorded_by:
                continue
            new_work = run.first_step if run.first_step is not None else None
            if (new_work is not None and new_work > n) or (
                new_work is None and run.ended in ("finished", "failed")
            ):
                replayed = True
                attempts.append(
                    StepAttempt(
                        run=run.index,
                        worker=run.worker,
                        message=run.message,
                        attempt=run.attempt,
                        status="replayed",
                        started_at=None,
                        ended_at=None,
                    )
                )
    started = attempts[0].started_at if attempts else None
    if outcome is not None and outcome.get("started") is not None:
        started = _time(outcome.get("started"))
        if intent is not None:
            started = _time(intent.get("at")) or started
    ended_at = _time((outcome or {}).get("at"))
    key = None
    if kind == "tool":
        key = str(
            result.get("key")
            or (intent or {}).get("key")
            or idempotency_key(session, entry.turn, n)
        )
    wait = None
    if kind in _WAIT_KINDS:
        wait = {
            "signal": identity.get("signal") or (intent or {}).get("signal"),
            "for_turn": (intent or {}).get("for_turn"),
            "result": _wait_result(result, content) if outcome is not None else None,
        }
    error = None
    if "error" in result:
        error = redact_content(str(result["error"]))
    step_content = None
    if content:
        step_content = {
            "input": redact_content(_input_of(identity)),
            "output": redact_content(result.get("output"))
            if "blob" not in (outcome or {})
            else {"blob": (outcome or {}).get("blob")},
        }
    deadline = _time((intent or {}).get("deadline"))
    return StepTrace(
        id=step_id(session, entry.turn, n),
        step=n,
        kind=kind,
        name=str(identity.get("name", kind)),
        status=final,
        replay=(intent or {}).get("replay"),
        idempotency_key=key,
        started_at=started,
        ended_at=ended_at,
        duration=_span(started, ended_at),
        deadline=deadline,
        attempts=attempts,
        replayed=replayed,
        usage=_usage(outcome),
        blob_bytes=entry.blobs.get(n, 0),
        event_bytes=entry.bytes.get(n, 0),
        error=error,
        wait=wait,
        content=step_content,
    )


def _input_of(identity: dict[str, Any]) -> Any:
    preview = identity.get("preview")
    if isinstance(preview, str):
        try:
            return json.loads(preview)
        except ValueError:
            return preview  # cut short: the journal keeps a bounded preview
    return preview


def _wait_result(result: dict[str, Any], content: bool) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for k in ("fired", "timed_out", "approved_before"):
        if k in result:
            shown[k] = result[k]
    signal = result.get("signal")
    if isinstance(signal, dict):
        shown["signal"] = {
            k: signal.get(k) for k in ("name", "sender", "signal_id", "id") if k in signal
        }
        if content:
            shown["signal"]["payload"] = redact_content(signal.get("payload"))
    return shown


async def trace_session(
    world: World, session: str, *, turn: str | None = None, content: bool = False
) -> SessionTrace:
    """The trace of ``session``, read from its journal logs (every generation, oldest first).

    Args:
        turn: only this turn.
        content: include prompts, tool arguments, results, messages and replies (secrets
            masked by :func:`redact_content`). Off by default.

    Returns:
        The :class:`SessionTrace` (``.model_dump(mode="json")`` is the public JSON form).

    Raises:
        InvalidIdentifierError: a bad session id.
        NotFoundError: the session has no events, or no turn ``turn``.
    """
    session_log_id(session)
    if turn is not None and (not isinstance(turn, str) or not turn):
        raise InvalidArgumentError(f"turn must be a non-empty str, got {turn!r}")
    chain = await session_chain(world, session)
    logs = [(log_id, await world.log.read(log_id)) for log_id in chain]
    if not any(events for _, events in logs):
        raise NotFoundError(
            f"session {session!r} has no events in namespace {world.namespace!r} of the "
            f"{world.name!r} World; list sessions with: world sessions"
        )
    return trace_events(session, logs, content=content, turn=turn)


def build_trace(session: str, events: Sequence[Event], *, content: bool = False) -> SessionTrace:
    """The trace of a one-log session from its events (see :func:`trace_events`)."""
    return trace_events(session, [(session_log_id(session), events)], content=content)
