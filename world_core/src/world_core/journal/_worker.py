"""The worker: claims turns from the queue and runs them through the journal.

A message is ``{"session_id", "turn_id"}``. The worker holds it under a lease that a background
task renews every ``lease / 3`` seconds while the turn runs (sooner after its event loop was
late: see :func:`renew_interval`); if a renewal finds the lease lost (another worker claimed
the turn after it ran out), the turn is cancelled at once; so it is when renewals keep failing
and the lease would run out before the next one. A ``never`` tool call in progress is not cut
off (the journal shields it until its own deadline, and its outcome is still written). Killed
anywhere, the worker simply stops renewing; the lease runs out and any other worker claims the
turn and continues it from the journal.

The worker tracks the lease on its local clock, and a tool's ``context.check()`` refuses
once it has run out there (its event loop blocked past the lease: CPU-bound work, an import,
a pause). That refusal ends the attempt as a crash would, not the turn: the journal records
that the call was not started (unless another worker wrote to the turn meanwhile), and the
worker releases the message without acking or failing it (``lease_lost``); the next attempt
runs the call again. An agent factory is called before the claim, so building the turn's
agent (a framework's first import, schema generation) blocks no leased time.

Every turn ends in one of two durable records, and the message is acked only once one is in
the log: the reply, or a failure (``turn/<t>/failure``: error class, message, attempts, the
step it stopped at) that :meth:`Client.wait <world_core.Client.wait>` raises as
:class:`~world_core.errors.TurnFailedError`. Errors are classified where they are caught:

* deterministic (the same input fails the same way: :class:`NonDeterminismError`, invalid
  arguments, a configuration error, an unusable paid model reply, a tool error the agent did
  not handle, no input for the turn, an agent that returned without ``finish``, the turn
  outliving ``turn_timeout``): the failure is recorded at once;
* transient (:class:`BackendUnavailableError`, ``OSError``, ``TimeoutError``) and anything
  else: the message is released with exponential backoff (``retry_delay``, doubling, at most
  60 s) and the failure is recorded on the last attempt (``max_attempts``, or the queue's own
  limit if lower);
* a turn on the queue's last delivery (every earlier run died: a crash loop) is not run
  again: its failure is recorded, so it is never dead-lettered without a record;
* a ``never`` call of another worker that may still be running
  (:class:`CallInFlightError`): the turn is re-queued to resume once that call's deadline has
  passed, holding no worker meanwhile (on the queue's last delivery, where a release would
  dead-letter it, its failure is recorded instead).

On SIGTERM or SIGINT, :meth:`Worker.run` stops claiming at once (a claim waiting for work is
cancelled; a message claimed as the signal came is released), gives the running turn
``grace`` seconds to finish, then cancels it and releases its message so another worker takes
it now. Each step is logged as a warning; a second signal ends the grace at once.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import anyio
import anyio.abc

from world_core.errors import (
    BackendUnavailableError,
    CallInFlightError,
    ConfigurationError,
    DuplicateKeyError,
    InvalidArgumentError,
    LeaseLostError,
    ModelReplyError,
    NonDeterminismError,
    NotFoundError,
    ToolError,
    WorldError,
)
from world_core.journal._client import DEFAULT_QUEUE, SIGNAL_CHECK, check_signal, turn_queue_key
from world_core.journal._continue import HistoryLimits, maybe_continue
from world_core.journal._crash import CrashPoint, SimulatedCrash, crash_point_from_env
from world_core.journal._journal import Journal, canonical_json, check_turn_id, session_log_id
from world_core.journal._observer import (
    FanOut,
    ObserverFactory,
    RunEnd,
    TurnObserver,
    TurnRun,
    default_observers,
)
from world_core.journal._order import (
    HAND_ON_TRIES,
    SessionBusyError,
    hand_on,
    notify_parent,
    send_unsent,
)
from world_core.journal._waits import TurnSuspended
from world_core.spi import Lease, World, validate_duration, validate_id, validate_queue_seconds

__all__ = [
    "DETERMINISTIC_ERRORS",
    "TRANSIENT_ERRORS",
    "TurnAgent",
    "TurnResult",
    "Worker",
    "renew_interval",
]

log = logging.getLogger("world.worker")

Status = Literal[
    "done",
    "failed",
    "queued",
    "suspended",
    "stale",
    "retry",
    "waiting",
    "lease_lost",
    "superseded",
    "shutdown",
    "invalid",
    "checked",
]

DETERMINISTIC_ERRORS: tuple[type[BaseException], ...] = (
    NonDeterminismError,
    InvalidArgumentError,
    ConfigurationError,
    ModelReplyError,
    ToolError,
    NotFoundError,
)
"""Errors that fail a turn at once: running it again would fail the same way."""

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    BackendUnavailableError,
    OSError,
    TimeoutError,
)
"""Errors retried with backoff (anything unclassified is retried the same way)."""


class TurnAgent(Protocol):
    """What a :class:`Worker` runs a turn with: :class:`Agent`, or an adapter of another agent
    framework. ``run_turn`` runs (or replays) the turn through ``journal`` and ends it with
    ``journal.finish(reply)``; optional attributes ``history_turns``, ``summarize`` and
    ``carry_turns`` mean what they mean on :class:`Agent`."""

    async def run_turn(self, journal: Journal) -> str:
        """Run the turn to its reply, record it with ``journal.finish``, and return it."""
        ...


class TurnIncompleteError(WorldError):
    """The agent returned without recording a reply (``journal.finish`` was never called)."""


class TurnCrashLoopError(WorldError):
    """The turn reached the queue's last delivery without finishing: every earlier run died."""


class TurnTimeoutError(WorldError):
    """The turn ran longer than the worker's ``turn_timeout``."""


@dataclass(frozen=True)
class TurnResult:
    """What happened to one claimed turn.

    ``status``: ``done`` (reply saved, message acked), ``failed`` (a failure record saved,
    message acked: the turn is over, the client is told), ``retry`` (a transient error; the
    message was released for a later attempt), ``waiting`` (a ``never`` call of another worker
    may still be running; re-queued until its deadline), ``lease_lost`` (another worker took
    the turn, or a tool's ``context.check()`` found the lease run out on this worker's clock;
    this one stopped, releasing the message if it still could), ``superseded`` (another
    worker's write for a step came first: the key refused ours; this one stopped without
    running a ``never`` tool), ``queued`` (an earlier turn of the session has not ended: the
    turn was handed on to run after it, and its message acked), ``suspended`` (the turn
    waits for a timer, a signal or an approval: a wake-up is queued for its deadline and the
    message acked; nothing is held meanwhile),
    ``stale`` (a wake-up for a wait that another message already resumed, or a message for a
    turn whose input is not in its log, deleted since; acked), ``shutdown``
    (stopped by a signal; released), ``invalid`` (the message was not a turn; acked and
    dropped), ``checked`` (not a turn: the check a signal's sender queued before sending it,
    see :meth:`Client.signal <world_core.Client.signal>`; the wake-ups of the turns waiting
    for the signal were queued again, if it is there and still unconsumed; acked).
    """

    session_id: str
    turn_id: str
    status: Status
    reply: str | None = None
    model_calls: int = 0
    tool_runs: int = 0
    replayed: int = 0
    error: str | None = None


def _is_check(payload: bytes) -> bool:
    """The message is a signal's check (see :meth:`Client.signal`), not a turn."""
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("why") == SIGNAL_CHECK


class _LeaseClock:
    """The store's clock as this worker sees it: the claim's deadline minus the lease is the
    store's time when it handed the message out; the local monotonic clock measures from when
    the claim's answer arrived, so it runs behind the store by at most the answer's way back
    (the journal's CLOCK_MARGIN covers that). Not from when the claim was sent: a claim that
    waited for work would then put the clock ahead by that wait, and a takeover would answer
    for a ``never`` call still within its deadline."""

    def __init__(self, lease: Lease, duration: float, received: float) -> None:
        self._base = lease.deadline - duration
        self._received = received

    def __call__(self) -> float:
        return self._base + (time.monotonic() - self._received)


class Worker:
    """Runs turns from ``queue`` with ``agent``.

    Args:
        world: the World holding sessions and the queue.
        agent: an :class:`Agent` (or any object with ``async run_turn(journal) -> str`` that
            ends the turn with ``journal.finish``, such as an agent framework's adapter), or a
            zero-argument callable returning one per turn (a class counts as one). The callable
            is called before the turn is claimed (its work holds no lease), its result kept
            until a turn comes. Anything else is refused here, not when a turn comes.
        lease: seconds a claim lasts without renewal; another worker may take the turn after
            (at most :data:`~world_core.spi.MAX_QUEUE_SECONDS`, as for any queue lease).
        heartbeat: renew the lease every ``lease / 3`` seconds while a turn runs (sooner after
            a late wake-up: :func:`renew_interval`). Turn it off only to study what an
            expired lease does (the two-workers test).
        crash: a :class:`CrashPoint`, None, or ``"env"`` to read ``CRASH_AT``.
        grace: seconds a running turn gets after SIGTERM before it is cancelled and released.
        retry_delay: first delay before a turn that failed transiently is offered again
            (doubles per attempt, at most 60 s).
        max_attempts: deliveries a turn gets for transient or unclassified errors before its
            failure is recorded (the queue's own ``max_attempts`` if that is lower).
        turn_timeout: seconds one attempt of a turn may run; past it the turn is cancelled and
            its failure recorded (a ``never`` call in flight still ends first, within its
            own timeout).
        history_limits: when a session's log is continued in a fresh one (see
            :mod:`world_core.journal._continue`); default :meth:`HistoryLimits.from_env`.
        observers: factories of the observers of each run (see
            :mod:`world_core.journal._observer`); None: the defaults registered by the layers
            above (the live event stream of :mod:`world_core.observe`); ``[]``: none.
    """

    def __init__(
        self,
        world: World,
        agent: TurnAgent | Callable[[], TurnAgent],
        *,
        queue: str = DEFAULT_QUEUE,
        lease: float = 30.0,
        heartbeat: bool = True,
        name: str | None = None,
        crash: CrashPoint | Literal["env"] | None = "env",
        grace: float = 30.0,
        retry_delay: float = 1.0,
        max_attempts: int = 5,
        turn_timeout: float = 3600.0,
        history_limits: HistoryLimits | None = None,
        observers: Sequence[ObserverFactory] | None = None,
    ) -> None:
        if not callable(agent) and not callable(getattr(agent, "run_turn", None)):
            raise InvalidArgumentError(
                "agent must be an Agent (or any object with async run_turn(journal)) or a "
                f"zero-argument callable returning one, got {type(agent).__name__}"
            )
        if inspect.iscoroutinefunction(agent):
            # Its coroutine has no run_turn: every turn would fail (after retries) for it.
            raise InvalidArgumentError(
                f"agent {getattr(agent, '__name__', agent)!r} is an async function: a factory "
                "is a plain function returning the agent"
            )
        if validate_queue_seconds(lease, "lease") <= 0:
            raise InvalidArgumentError("lease must be > 0 seconds")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if validate_duration(turn_timeout, "turn_timeout") <= 0:
            raise InvalidArgumentError("turn_timeout must be > 0 seconds")
        self.world = world
        self._agent = agent
        self.queue = validate_id(queue, "queue")
        self.lease = float(lease)
        self.heartbeat = heartbeat
        self.name = validate_id(name or f"{socket.gethostname()}-{os.getpid()}", "worker name")
        self.crash = crash_point_from_env() if crash == "env" else crash
        self.grace = validate_duration(grace, "grace")
        self._stop_now: anyio.Event | None = None  # set by a second SIGTERM/SIGINT in run()
        self._in_turn = False  # run() is in a turn (for what a signal's notice says)
        self.retry_delay = validate_duration(retry_delay, "retry_delay")
        self.max_attempts = max_attempts
        self.history_limits = (
            history_limits if history_limits is not None else HistoryLimits.from_env()
        )
        self.turn_timeout = float(turn_timeout)
        if observers is not None and not all(callable(factory) for factory in observers):
            raise InvalidArgumentError(
                f"observers must be a list of observer factories (callables), got {observers!r}"
            )
        self.observers = list(observers) if observers is not None else None

    def _prepare(self) -> _Prepared:
        """The next turn's agent, made now, before its claim: a factory's work (pydantic-ai
        builds its schemas on first use, a framework imports lazily) then blocks no leased
        time. What the factory raises is kept and raised in the turn, classified there."""
        agent = self._agent
        if not isinstance(agent, type) and callable(getattr(agent, "run_turn", None)):
            return _Prepared(cast(TurnAgent, agent))  # a class is a factory: its run_turn unbound
        try:
            return _Prepared(cast(Callable[[], TurnAgent], self._agent)())
        except Exception as exc:
            return _Prepared(None, exc)

    def _make_agent(self) -> TurnAgent:
        return self._prepare().agent()

    async def run_once(self, *, wait: float = 0.0) -> TurnResult | None:
        """Claim one turn (waiting up to ``wait`` seconds) and run it; None if none came.

        A signal's check (see :meth:`Client.signal <world_core.Client.signal>`) claimed
        meanwhile is handled (or released for a later try, after a fault) and the wait goes
        on: it is not a turn.

        Raises:
            InvalidArgumentError: ``wait`` is not a finite number of seconds >= 0 (NaN made
                it claim once without waiting; a negative one was taken for 0).
        """
        wait = validate_duration(wait, "wait")
        prepared = self._prepare()
        deadline = time.monotonic() + wait
        while True:
            left = max(0.0, deadline - time.monotonic())
            leases = await self.world.queue.claim(
                self.queue, self.name, lease=self.lease, wait=left
            )
            if not leases:
                return None
            result = await self._run(leases[0], None, time.monotonic(), prepared)
            if not _is_check(leases[0].payload):  # a check, handled or released: not a turn
                return result

    async def run(
        self,
        *,
        stop: anyio.Event | None = None,
        signals: bool = True,
        on_ready: Callable[[], object] | None = None,
    ) -> None:
        """Run turns until ``stop`` is set (or SIGTERM/SIGINT when ``signals``).

        ``on_ready`` is called once the signal handlers are in place, before the first claim.
        """
        stop = stop if stop is not None else anyio.Event()
        prepared: _Prepared | None = None  # kept over claims that found no turn
        async with anyio.create_task_group() as tg:
            if signals:
                self._stop_now = anyio.Event()
                await tg.start(_stop_on_signals, self, stop, self._stop_now)
            if on_ready is not None:
                on_ready()
            while not stop.is_set():
                if prepared is None:
                    prepared = self._prepare()
                received = 0.0
                leases: list[Lease] = []
                unavailable: BackendUnavailableError | None = None
                async with anyio.create_task_group() as claiming:

                    async def cancel_on_stop(scope: anyio.CancelScope) -> None:
                        await stop.wait()
                        scope.cancel()

                    claiming.start_soon(cancel_on_stop, claiming.cancel_scope)
                    # Caught in here: leaving the task group, it would come out wrapped in an
                    # ExceptionGroup and end the loop instead of being retried.
                    try:
                        leases = await self.world.queue.claim(
                            self.queue, self.name, lease=self.lease, wait=1.0
                        )
                    except BackendUnavailableError as exc:
                        unavailable = exc
                    received = time.monotonic()
                    claiming.cancel_scope.cancel()
                if unavailable is not None:
                    log.warning(
                        "claiming from %r failed: %s; retrying in 1 s", self.queue, unavailable
                    )
                    with anyio.move_on_after(1.0):
                        await stop.wait()
                    continue
                for lease in leases:
                    if stop.is_set():  # claimed as the signal came: hand it back now
                        await self._settle(lease, ack=False)
                        continue
                    if prepared is None:
                        prepared = self._prepare()
                    self._in_turn = True
                    try:
                        result = await self._run(lease, stop, received, prepared)
                    finally:
                        self._in_turn = False
                    prepared = None
                    log.info("turn %s/%s: %s", result.session_id, result.turn_id, result.status)
            tg.cancel_scope.cancel()

    async def process(
        self,
        lease: Lease,
        *,
        stop: anyio.Event | None = None,
        claimed_at: float | None = None,
        claimed_for: float | None = None,
    ) -> TurnResult:
        """Run the turn ``lease`` holds, renewing it meanwhile; ack, release or drop it.

        ``claimed_at``: ``time.monotonic()`` taken when the claim's answer arrived (now, if
        not given), from which the store's clock is estimated.

        ``claimed_for``: the seconds the lease was claimed for (the claim's ``lease=``), if
        not this worker's :attr:`lease`. A lease does not carry it, and the store's clock is
        its deadline minus it: a lease claimed for longer than assumed puts the turn's clock
        ahead by the difference (a takeover would answer for a ``never`` call still within its
        deadline), and the lease is held only until then, not for the worker's duration.

        Raises:
            InvalidArgumentError: ``claimed_for`` is not a number of seconds a lease can last.
        """
        duration = self.lease
        if claimed_for is not None:
            duration = validate_queue_seconds(claimed_for, "claimed_for")
            if duration <= 0:
                raise InvalidArgumentError("claimed_for must be > 0 seconds, as a claim's lease")
        return await self._run(lease, stop, claimed_at, None, duration)

    async def _run(
        self,
        lease: Lease,
        stop: anyio.Event | None,
        claimed_at: float | None,
        prepared: _Prepared | None,
        claimed_for: float | None = None,
    ) -> TurnResult:
        stopped: BaseException | None = None
        async with anyio.create_task_group() as observing:
            watch = _Observing(self, observing)
            try:
                result = await self._process(
                    lease, stop, claimed_at, watch, prepared, claimed_for or self.lease
                )
            except BaseException as exc:  # a cancellation, a simulated crash: raised as it came
                stopped = exc
                if isinstance(exc, anyio.get_cancelled_exc_class() | KeyboardInterrupt):
                    # Cancelled from outside (Ctrl-C of `world worker --once`, an app's
                    # shutdown): hand the turn back now rather than hold it for its lease.
                    # (A lease already settled or lost refuses this: nothing happens.)
                    with anyio.move_on_after(OBSERVER_CLOSE_SECONDS, shield=True):
                        await self._settle(lease, ack=False)
            else:
                await watch.end(result)
            observing.cancel_scope.cancel()
        if stopped is not None:
            raise stopped
        return result

    async def _process(
        self,
        lease: Lease,
        stop: anyio.Event | None,
        claimed_at: float | None,
        watch: _Observing,
        prepared: _Prepared | None,
        claimed_for: float,
    ) -> TurnResult:
        try:
            body = json.loads(lease.payload)
            session_id = str(body["session_id"])
            session_log_id(session_id)
            if body.get("why") == SIGNAL_CHECK:  # not a turn: a signal's check
                signal_id = body["signal"]
                if not isinstance(signal_id, str):
                    raise TypeError("a signal check's signal id is a str")
                return await self._check_signal(lease, session_id, signal_id)
            turn_id = str(body["turn_id"])
            check_turn_id(turn_id)
        except (ValueError, KeyError, TypeError):  # InvalidArgumentError is a ValueError
            log.error("dropping message %s: not a turn: %r", lease.message_id, lease.payload[:100])
            await self._settle(lease, ack=True)
            return TurnResult("?", "?", "invalid", error="not a turn message")

        started = time.monotonic()  # just after the claim (the margin below covers it)
        clock = _LeaseClock(
            lease, claimed_for, claimed_at if claimed_at is not None else time.monotonic()
        )
        current = lease
        lost = False
        shutdown = False
        timed_out = False
        held_until = started + claimed_for  # local clock, no later than the store's
        journal: Journal | None = None
        reply: str | None = None
        error: BaseException | None = None
        parked = False
        stale = False
        gone = False  # the turn's input is not in its log (see below)
        agent: TurnAgent | None = None
        suspended: TurnSuspended | None = None

        def lease_held() -> bool:  # called from tools' threads too: no event loop calls
            return not lost and time.monotonic() < held_until

        async with anyio.create_task_group() as tg:

            async def renew() -> None:
                nonlocal current, lost, held_until
                due = started + claimed_for / 3
                late = 0.0
                while True:
                    await anyio.sleep(max(0.0, due - time.monotonic()))
                    asked = time.monotonic()
                    late = max(asked - due, late / 2)  # one stall's weight halves per renewal
                    due = asked + renew_interval(self.lease, late)
                    try:
                        current = await self.world.queue.renew(current, self.lease)
                        held_until = asked + self.lease
                    except LeaseLostError:
                        lost = True
                        tg.cancel_scope.cancel()
                        return
                    except Exception as exc:  # transient: the next renewal may still make it
                        log.warning("renewing %s failed: %s", lease.message_id, exc)
                        if due >= held_until:
                            # The lease runs out before the next try: another worker may
                            # take the turn then, and both would pay for its model calls.
                            log.warning("giving up %s: its lease runs out", lease.message_id)
                            lost = True
                            tg.cancel_scope.cancel()
                            return

            async def on_stop(event: anyio.Event) -> None:
                nonlocal shutdown
                await event.wait()
                hurry = self._stop_now
                with anyio.move_on_after(self.grace):
                    if hurry is None:
                        await anyio.sleep_forever()
                    else:
                        await hurry.wait()  # a second signal: no more grace
                shutdown = True
                tg.cancel_scope.cancel()

            if self.heartbeat:
                tg.start_soon(renew)
            if stop is not None:
                tg.start_soon(on_stop, stop)
            with anyio.move_on_after(self.turn_timeout) as turn_scope:
                try:
                    agent = (prepared if prepared is not None else self._prepare()).agent()
                    for _ in range(HAND_ON_TRIES):
                        journal = await Journal.open(
                            self.world,
                            session_id,
                            turn_id,
                            crash=self.crash,
                            observer=watch.fanout,
                            clock=clock,
                            lease_held=lease_held,
                            owner=lease.message_id,
                            queue=self.queue,
                            history=getattr(agent, "history_turns", None),
                            run={
                                "worker": self.name,
                                "message": lease.message_id,
                                "attempt": lease.attempt,
                                "lease": self.lease,
                            },
                        )
                        if lease.message_id in journal.parked_messages:
                            parked = True  # handed on before (its worker died before the ack)
                            break
                        if journal.finished or journal.waiting_for is None:
                            break
                        # An earlier turn of the session has not ended: hand this one on
                        # (see _order) rather than hold the message or a worker meanwhile.
                        if await journal.park(lease.message_id):
                            parked = True
                            break
                    else:
                        raise SessionBusyError(
                            f"the log of session {session_id!r} changed under each of "
                            f"{HAND_ON_TRIES} attempts to hand turn {turn_id!r} on"
                        )
                    if not journal.submitted:
                        # Its input is gone (a forced delete_session after this message was
                        # queued: a wake-up, a retry): running it would write a turn nobody
                        # submitted into the session's new log.
                        gone = stale = True
                    # A recorded reply is the turn's end: read it, do not replay the code
                    # (changed code would report a finished turn as a failed replay).
                    reply = journal.recorded_reply
                    resumed_by = journal.resumed_by
                    if not journal.finished and resumed_by not in (None, lease.message_id):
                        stale = True  # another message resumed the turn's latest wait
                    # A wake-up for an earlier wait of a turn now suspended in a later one runs
                    # it anyway: it may be the very message that recorded that later wait and
                    # died before queueing its wake-up; the replay suspends it again properly.
                    if not parked and not stale and not journal.finished:
                        watch.start(lease, body, journal)
                        if lease.attempt >= lease.max_attempts > 1:
                            # The queue's last delivery: if this run died too (a crash loop:
                            # an out-of-memory kill, a segfault) the turn would be
                            # dead-lettered with no record for the client. Record why instead
                            # of running it again.
                            raise TurnCrashLoopError(
                                f"the turn was delivered {lease.attempt} times without "
                                "finishing (its workers died or lost their leases each time); "
                                "see the workers' logs, fix the cause, then resubmit it"
                            )
                        reply = await agent.run_turn(journal)
                        if journal.recorded_reply is None:
                            raise TurnIncompleteError(
                                f"the agent's run_turn returned {reply!r:.80} without recording "
                                "a reply: end every turn with journal.finish(reply)"
                            )
                except TurnSuspended as exc:
                    suspended = exc  # the turn waits: not an outcome
                except BaseException as exc:
                    # Agent code may raise anything; only a cancellation (of this turn, or of
                    # the worker), Ctrl-C and a simulated crash are not the turn's outcome.
                    if isinstance(
                        exc, anyio.get_cancelled_exc_class() | KeyboardInterrupt | SimulatedCrash
                    ):
                        raise
                    error = exc
            if turn_scope.cancelled_caught and not lost and not shutdown:
                timed_out = True
                error = TurnTimeoutError(
                    f"the turn ran longer than turn_timeout={self.turn_timeout:g} s; raise it "
                    "or make the turn shorter"
                )
            if journal is not None and journal.recorded_reply is not None:
                # The reply is recorded: the turn is done with it, whatever the agent code did
                # after finish (returned something else, raised, ran past turn_timeout). The
                # journal is what clients read; the result and the live end must say the same.
                if error is not None:
                    log.warning(
                        "turn %s/%s: the agent went on after its reply was recorded and "
                        "raised %s; the turn is done with that reply",
                        session_id,
                        turn_id,
                        _describe(error),
                    )
                error, timed_out, reply = None, False, journal.recorded_reply
            tg.cancel_scope.cancel()

        counts: dict[str, Any] = {
            "model_calls": journal.model_calls if journal else 0,
            "tool_runs": journal.tool_runs if journal else 0,
            "replayed": journal.replayed if journal else 0,
        }
        if lost:
            return TurnResult(session_id, turn_id, "lease_lost", **counts)
        refusal = journal.lease_refusal if journal is not None else None
        if refusal is not None:
            # A tool's check() found the lease run out on this worker's clock (its event loop
            # was blocked past it): the call did not start and the journal says so, unless
            # another worker wrote first. Stop as a crash would; the next attempt runs it.
            log.warning("turn %s/%s: %s; stopping", session_id, turn_id, refusal)
            await self._settle(current, ack=False)
            return TurnResult(session_id, turn_id, "lease_lost", error=_describe(refusal), **counts)
        if parked and journal is not None:
            return await self._parked(current, session_id, turn_id, journal)
        if gone:
            log.info(
                "turn %s/%s: no input (deleted, or never submitted); dropped", session_id, turn_id
            )
            await self._settle(current, ack=True)
            return TurnResult(
                session_id, turn_id, "stale", error="the turn has no input: deleted", **counts
            )
        if stale:
            log.info("turn %s/%s: a stale wake-up; dropped", session_id, turn_id)
            await self._settle(current, ack=True)
            return TurnResult(session_id, turn_id, "stale", **counts)
        if suspended is not None and error is None:
            await self._suspend(current, body, suspended, clock)
            return TurnResult(session_id, turn_id, "suspended", **counts)
        if shutdown:
            await self._settle(current, ack=False)
            return TurnResult(session_id, turn_id, "shutdown", **counts)
        if error is None and journal is not None and journal.failure is not None:
            # Failed before (recorded by an earlier attempt): nothing more to do.
            if not await self._hand_on(current, session_id, turn_id, agent, journal):
                return TurnResult(session_id, turn_id, "retry", error="handing on", **counts)
            await self._settle(current, ack=True)
            failure = journal.failure
            text = f"{failure.get('error_type')}: {failure.get('error')}"
            return TurnResult(session_id, turn_id, "failed", error=text, **counts)
        if isinstance(error, CallInFlightError) and lease.attempt < lease.max_attempts:
            # (On the queue's last delivery a release would dead-letter the turn, unrecorded:
            # it falls through to recording its failure.)
            log.info("turn %s/%s: %s", session_id, turn_id, error)
            await self._settle(current, ack=False, delay=error.retry_after)
            return TurnResult(session_id, turn_id, "waiting", error=_describe(error), **counts)
        if isinstance(error, DuplicateKeyError):
            # Another worker wrote this step first: it owns the turn now. Give it time.
            log.warning("turn %s/%s: %s; stopping", session_id, turn_id, error)
            await self._settle(current, ack=False, delay=self.lease)
            return TurnResult(session_id, turn_id, "superseded", error=_describe(error), **counts)
        if error is not None:
            last = lease.attempt >= min(self.max_attempts, lease.max_attempts)
            final = timed_out or isinstance(error, DETERMINISTIC_ERRORS) or last
            if isinstance(error, TurnIncompleteError | TurnCrashLoopError):
                final = True
            if final:
                # A crash loop is recorded before the code runs: it stopped at the first step
                # its earlier runs left without an outcome, not at step 0.
                stopped = (
                    journal.recorded_steps
                    if journal is not None and isinstance(error, TurnCrashLoopError)
                    else None
                )
                recorded = await self._record_failure(
                    session_id, turn_id, journal, error, lease.attempt, stopped
                )
                if recorded and await self._hand_on(current, session_id, turn_id, agent, journal):
                    log.error("turn %s/%s failed: %s", session_id, turn_id, _describe(error))
                    await self._settle(current, ack=True)
                    return TurnResult(
                        session_id, turn_id, "failed", error=_describe(error), **counts
                    )
            log.warning("turn %s/%s: %r; retrying later", session_id, turn_id, error)
            delay = min(60.0, self.retry_delay * 2 ** max(0, lease.attempt - 1))
            await self._settle(current, ack=False, delay=delay)
            return TurnResult(session_id, turn_id, "retry", error=_describe(error), **counts)
        if not await self._hand_on(current, session_id, turn_id, agent, journal):
            return TurnResult(session_id, turn_id, "retry", error="handing on", **counts)
        acked = await self._settle(current, ack=True)
        status: Status = "done" if acked else "lease_lost"
        return TurnResult(session_id, turn_id, status, reply=reply, **counts)

    async def _parked(
        self, lease: Lease, session_id: str, turn_id: str, journal: Journal
    ) -> TurnResult:
        """The turn waits for ``journal.waiting_for``: its message is done with, once that turn
        surely has a message of its own (see :func:`send_unsent`)."""
        ahead = journal.waiting_for
        log.info(
            "turn %s/%s waits for turn %s of its session; handed on", session_id, turn_id, ahead
        )
        if ahead is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await send_unsent(self.world, session_id, self.queue, ahead)
                except Exception as exc:  # the message comes back parked, and tries again
                    log.warning(
                        "turn %s/%s: sending turn %s on failed: %s", session_id, turn_id, ahead, exc
                    )
                    await self._settle(lease, ack=False, delay=self.retry_delay)
                    return TurnResult(session_id, turn_id, "retry", error=_describe(exc))
        await self._settle(lease, ack=True)
        return TurnResult(session_id, turn_id, "queued")

    async def _suspend(
        self,
        lease: Lease,
        body: dict[str, Any],
        suspended: TurnSuspended,
        clock: Callable[[], float],
    ) -> None:
        """Queue the wake-up for the wait's deadline, then let the message go. Crash between
        the two: the message comes back, the turn suspends again, the wake-up is deduplicated.
        The wake-up itself, come back before the deadline (clock error), is released to it."""
        delay = max(0.0, suspended.wake_at - clock())
        session_id, turn_id = str(body["session_id"]), str(body["turn_id"])
        if body.get("wake") == suspended.step and body.get("why") == "timer":
            await self._settle(lease, ack=False, delay=delay)
            return
        wake = {
            "session_id": session_id,
            "turn_id": turn_id,
            "wake": suspended.step,
            "why": "timer",
        }
        with anyio.CancelScope(shield=True):
            try:
                await self.world.queue.enqueue(
                    self.queue,
                    canonical_json(wake),
                    delay=delay,
                    dedup_key=turn_queue_key(session_id, turn_id, "wake", suspended.step),
                )
            except Exception as exc:  # never take the worker down: the message comes back
                log.warning("turn %s/%s: queueing its wake-up failed: %s", session_id, turn_id, exc)
                await self._settle(lease, ack=False, delay=min(delay, self.retry_delay))
                return
        log.info(
            "turn %s/%s waits (step %d) for %.1f s: %s",
            session_id,
            turn_id,
            suspended.step,
            delay,
            suspended,
        )
        await self._settle(lease, ack=True)

    async def _check_signal(self, lease: Lease, session_id: str, signal_id: str) -> TurnResult:
        """The check :meth:`Client.signal` queued before sending ``signal_id`` (see there):
        the wake-ups of the turns waiting for it queued again if it is still unconsumed; the
        message acked, or released for another try after a fault."""
        try:
            woken = await check_signal(self.world, self.queue, session_id, signal_id)
        except Exception as exc:  # never take the worker down: the message comes back
            log.warning("session %s: checking signal %s failed: %s", session_id, signal_id, exc)
            await self._settle(lease, ack=False, delay=self.retry_delay)
            return TurnResult(session_id, "?", "retry", error=_describe(exc))
        if woken:
            log.info("session %s: signal %s woke %s again", session_id, signal_id, woken)
        await self._settle(lease, ack=True)
        return TurnResult(session_id, woken[0] if woken else "?", "checked")

    async def _hand_on(
        self,
        lease: Lease,
        session_id: str,
        turn_id: str,
        agent: TurnAgent | None,
        journal: Journal | None,
    ) -> bool:
        """The turn has ended: see that the session's next turn runs (see _order), for a child
        run tell its parent, and continue the session in a fresh log if it grew past the
        limits (see _continue). False if that could not be done now: the message was
        released to try again later."""
        with anyio.CancelScope(shield=True):
            try:
                handed = await hand_on(self.world, session_id, self.queue, after=turn_id)
                await notify_parent(self.world, session_id, turn_id)
                if handed is None and (journal is None or journal.near_limit(self.history_limits)):
                    await maybe_continue(
                        self.world,
                        session_id,
                        limits=self.history_limits,
                        summarize=getattr(agent, "summarize", None),
                        carry_turns=getattr(agent, "carry_turns", 20),
                    )
            except Exception as exc:
                log.warning(
                    "turn %s/%s ended, but handing on to the next turn failed: %s; retrying",
                    session_id,
                    turn_id,
                    exc,
                )
                await self._settle(lease, ack=False, delay=self.retry_delay)
                return False
        return True

    async def _record_failure(
        self,
        session_id: str,
        turn_id: str,
        journal: Journal | None,
        error: BaseException,
        attempts: int,
        step: int | None = None,
    ) -> bool:
        """Write the turn's failure record; False if the World would not take it now (then
        the message is released and the next attempt tries again)."""
        with anyio.CancelScope(shield=True):
            try:
                if journal is None:
                    journal = await Journal.open(self.world, session_id, turn_id)
                await journal.fail(error, attempts=attempts, step=step)
            except (BackendUnavailableError, DuplicateKeyError) as exc:
                log.warning(
                    "turn %s/%s: recording its failure failed: %s", session_id, turn_id, exc
                )
                return False
        return True

    async def _settle(self, lease: Lease, *, ack: bool, delay: float = 0.0) -> bool:
        """Ack or release, shielded from cancellation; False if the lease was lost.

        A transient failure is logged, not raised: the lease then runs out and the turn is
        delivered again, and its replay reads everything back from the journal."""
        with anyio.CancelScope(shield=True):
            try:
                if ack:
                    await self.world.queue.ack(lease)
                else:
                    await self.world.queue.release(lease, delay=delay)
            except LeaseLostError:
                return False
            except BackendUnavailableError as exc:
                log.warning("settling message %s failed: %s", lease.message_id, exc)
        return True


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def renew_interval(lease: float, late: float) -> float:
    """Seconds from one lease renewal to the next: ``lease / 3``, shorter after the event
    loop woke ``late`` seconds after a renewal was due (it was blocked).

    A stall as long as the last one, starting just as the next renewal is due, sends it at
    ``interval + late`` after this one, and the lease must outlast that: so the interval is at
    most ``(lease - late) / 2`` (half, for the round trip and a somewhat longer stall), and at
    least ``lease / 10`` (a loop blocked most of the lease cannot be helped by renewing more
    often than that). The lateness halves at each renewal, so one stall does not keep the
    renewals frequent. A stall longer than the lease loses it whatever the schedule: then
    ``context.check()`` refuses and the attempt ends (see the module docstring)."""
    return max(lease / 10, min(lease / 3, (lease - late) / 2))


@dataclass(frozen=True)
class _Prepared:
    """A turn's agent made before its claim, or what its factory raised."""

    made: TurnAgent | None
    error: Exception | None = None

    def agent(self) -> TurnAgent:
        if self.error is not None:
            raise self.error
        assert self.made is not None
        return self.made


OBSERVER_CLOSE_SECONDS = 5.0
"""How long a run's observers get to finish their work (publish what is queued) after it."""


class _Observing:
    """The observers of one run: made when the run starts its agent code, served in the
    worker's task group, told how the run ended, closed within OBSERVER_CLOSE_SECONDS. A
    factory or observer that fails is logged and left out: it cannot fail or block a turn."""

    def __init__(self, worker: Worker, group: anyio.abc.TaskGroup) -> None:
        self._worker = worker
        self._group = group
        self.fanout = FanOut()

    def start(self, lease: Lease, body: dict[str, Any], journal: Journal) -> None:
        worker = self._worker
        factories = worker.observers if worker.observers is not None else default_observers()
        step = journal.recorded_steps
        wake = "wake" in body
        run = TurnRun(
            session_id=journal.session_id,
            turn_id=journal.turn_id,
            worker=worker.name,
            attempt=lease.attempt,
            message_id=lease.message_id,
            step=step,
            resumed=step > 0 or lease.attempt > 1 or wake,
            wake=wake,
        )
        for factory in factories:
            try:
                observer = factory(worker.world, run)
            except Exception:
                log.warning("observer factory %r failed; not observing", factory, exc_info=True)
                continue
            if observer is not None:
                self.fanout.observers.append(observer)
                self._group.start_soon(self._serve, observer)
        self.fanout.run_started(run)

    async def _serve(self, observer: TurnObserver) -> None:
        try:
            await observer.serve()
        except Exception:
            log.warning("observer %r failed; ignored", observer, exc_info=True)

    async def end(self, result: TurnResult) -> None:
        if not self.fanout.observers:
            return
        self.fanout.run_ended(RunEnd(result.status, reply=result.reply, error=result.error))
        with anyio.move_on_after(OBSERVER_CLOSE_SECONDS, shield=True):
            for observer in self.fanout.observers:
                try:
                    await observer.aclose()
                except Exception:
                    log.warning("closing observer %r failed; ignored", observer, exc_info=True)


async def _stop_on_signals(
    worker: Worker,
    stop: anyio.Event,
    now: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """The first SIGTERM/SIGINT sets ``stop`` (a running turn gets the worker's ``grace``),
    the next one ``now`` (it is released at once). Listens until cancelled: a second Ctrl-C
    meets this receiver, not Python's default handler, which would raise KeyboardInterrupt
    wherever the loop was and leave the turn's message held until its lease ran out."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        task_status.started()
        async for signum in received:
            name = signal.Signals(signum).name
            if not stop.is_set():
                stop.set()
                if not worker._in_turn:
                    log.warning("signal %s: no turn running; stopping", name)
                    continue
                log.warning(
                    "signal %s: finishing the current turn (up to %g s, the grace), then "
                    "stopping; %s again stops it now: its message is released for another worker",
                    name,
                    worker.grace,
                    name,
                )
            elif not now.is_set():
                log.warning("signal %s again: stopping now; the running turn is released", name)
                now.set()
