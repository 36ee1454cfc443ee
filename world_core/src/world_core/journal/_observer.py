"""Observers of a turn: a small hook the worker and the journal call as a turn makes progress.

A :class:`TurnObserver` is told when a run of a turn starts (fresh, or resumed after a crash,
a lost lease or a wait), when each step starts, finishes or is read back from the journal
(replayed), the model's text as it streams, and how the run ended. The live event stream and
the OpenTelemetry spans of :mod:`world_core.observe` are observers; so is anything an app
plugs in with ``Worker(observers=[...])``.

The rules, the same for every observer:

* Observers see; they never decide. Every callback is synchronous and must return at once
  (queue the work, do it in :meth:`TurnObserver.serve`). An exception a callback raises is
  logged and dropped: an observer can neither fail nor slow a turn. The journal stays the
  truth; what an observer shows is a best-effort live view of it.
* ``step_finished`` is called once per step a run actually ran (or answered for, like an
  interrupted ``never`` call). ``recorded`` says whether the outcome is already durable in the
  log. A deferred outcome (a ``safe`` tool, ``now``/``uuid``/``random``) is durable only once
  the next append carries it: :meth:`TurnObserver.steps_recorded` says when. A crash before
  that makes the next run run the step again, live; a step whose outcome the journal holds is
  only ever ``step_replayed``.
* Factories registered with :func:`add_default_observer` (the layers above the journal do so
  when imported) are used by every :class:`~world_core.Worker` that is not given its own list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from world_core.spi import World

__all__ = [
    "ObserverFactory",
    "RunEnd",
    "StepInfo",
    "TurnObserver",
    "TurnRun",
    "add_default_observer",
    "default_observers",
    "notify",
]

log = logging.getLogger("world.observer")


@dataclass(frozen=True)
class TurnRun:
    """One run of a turn by a worker.

    Attributes:
        session_id, turn_id: the turn.
        worker: the worker's name (``Worker(name=...)``, by default ``<host>-<pid>``).
        attempt: the delivery of the turn's queue message (1 for the first).
        message_id: the queue message this run holds.
        step: the first step this run will run rather than read back: every step before it
            has its outcome in the journal and is replayed.
        resumed: True unless this is the turn's first run from its first step: the turn was
            taken over after a crash or a lost lease, retried, or woken from a wait.
        wake: True when the run was started by a wait's wake-up (a timer, a signal).
    """

    session_id: str
    turn_id: str
    worker: str
    attempt: int
    message_id: str
    step: int
    resumed: bool
    wake: bool = False


@dataclass(frozen=True)
class StepInfo:
    """A step as observers see it.

    Attributes:
        step: its number in the turn (0, 1, 2 ...).
        kind: ``model``, ``tool``, ``now``, ``uuid``, ``random``, ``patch``, ``timer``,
            ``signal``, ``approval``, ``child``, ``spawn``.
        name: the tool's name, the wait's name, or the kind.
        replay: ``safe`` or ``never`` for tools; None otherwise.
        key: a tool call's idempotency key; None otherwise.
        call_id: the id the model gave the tool call, when the step runs one; None otherwise.
        model: the model's name for a model step when the client has one (``.model``).
        input: the step's input as JSON: a model request (``messages``, ``tools``) or a
            tool's arguments. Content: observers show it only when asked to.
    """

    step: int
    kind: str
    name: str
    replay: str | None = None
    key: str | None = None
    call_id: str | None = None
    model: str | None = None
    input: Any = None


@dataclass(frozen=True)
class RunEnd:
    """How a run of a turn ended.

    Attributes:
        status: a :class:`~world_core.TurnResult` status: ``done`` and ``failed`` end the turn;
            ``suspended`` (a wait), ``retry``, ``waiting``, ``lease_lost``, ``superseded``,
            ``shutdown`` leave it to a later run.
        reply: the turn's reply (``done``).
        error: what went wrong (``failed`` and the statuses that retry).
        failure: the recorded failure (``error_type``, ``error``, ``attempts``, ``step``).
        steps: the number of steps the turn reached in this run.
    """

    status: str
    reply: str | None = None
    error: str | None = None
    failure: Mapping[str, Any] | None = None
    steps: int = 0


class TurnObserver:
    """Receives one run's progress. Subclass and override what you need; every method here
    does nothing. Callbacks are synchronous and must not block: do slow work (writes, network)
    in :meth:`serve`. Exceptions are logged and dropped (see the module docstring)."""

    def run_started(self, run: TurnRun) -> None:
        """A worker starts running the turn (before any step, replayed ones included)."""

    def step_started(self, step: StepInfo) -> None:
        """Step ``step.step`` starts running (its intent is recorded first for ``never``)."""

    def step_replayed(self, step: StepInfo) -> None:
        """Step ``step.step`` was read back from the journal: nothing ran."""

    def step_finished(
        self, step: StepInfo, result: Mapping[str, Any], state: Mapping[str, Any], recorded: bool
    ) -> None:
        """Step ``step.step`` ran and has a result.

        Args:
            result: the step's JSON result: ``output``, or ``error`` (with ``interrupted`` for
                a call that may or may not have happened, ``timed_out``).
            state: the staged values (``context.stage``: documents, files) committed with the
                outcome, by name.
            recorded: the outcome is durable in the log now; False for a deferred outcome,
                durable once :meth:`steps_recorded` names the step.
        """

    def steps_recorded(self, steps: Sequence[int]) -> None:
        """Deferred outcomes of ``steps`` were just appended with a later write."""

    def model_text(self, step: int, delta: str, retry: int) -> None:
        """The model of step ``step`` streamed ``delta`` (a piece of its reply's text).
        ``retry`` counts the client's retries of the request: text of an earlier retry was
        abandoned (the request was sent again after the stream broke)."""

    def run_ended(self, end: RunEnd) -> None:
        """The run is over (the turn ended, or waits for a later run)."""

    async def serve(self) -> None:
        """Background work for the run (a worker runs it in a task for the run's duration, and
        cancels it after :meth:`aclose`). Returns at once by default."""

    async def aclose(self) -> None:
        """Finish pending work (the worker bounds this with a deadline, then cancels)."""


ObserverFactory = Callable[[World, TurnRun], TurnObserver | None]
"""Makes the observer of one run (or None to observe nothing of it)."""

_DEFAULTS: list[ObserverFactory] = []


def add_default_observer(factory: ObserverFactory) -> None:
    """Observe every run of every :class:`~world_core.Worker` not given its own observers.

    Idempotent per factory. :mod:`world_core.observe` registers the live event stream this
    way when it is imported (``import world_core`` imports it)."""
    if not callable(factory):
        raise TypeError(f"an observer factory must be callable, got {factory!r}")
    if factory not in _DEFAULTS:
        _DEFAULTS.append(factory)


def default_observers() -> list[ObserverFactory]:
    """The factories :func:`add_default_observer` registered, in order."""
    return list(_DEFAULTS)


def notify(observer: TurnObserver | None, method: str, *args: Any) -> None:
    """Call ``observer.<method>(*args)``; log and drop anything it raises."""
    if observer is None:
        return
    try:
        getattr(observer, method)(*args)
    except Exception:
        log.warning("observer %r failed in %s; ignored", observer, method, exc_info=True)


@dataclass
class FanOut(TurnObserver):
    """Several observers as one; each is called on its own, so one failing stops none."""

    observers: list[TurnObserver] = field(default_factory=list)

    def run_started(self, run: TurnRun) -> None:
        for observer in self.observers:
            notify(observer, "run_started", run)

    def step_started(self, step: StepInfo) -> None:
        for observer in self.observers:
            notify(observer, "step_started", step)

    def step_replayed(self, step: StepInfo) -> None:
        for observer in self.observers:
            notify(observer, "step_replayed", step)

    def step_finished(
        self, step: StepInfo, result: Mapping[str, Any], state: Mapping[str, Any], recorded: bool
    ) -> None:
        for observer in self.observers:
            notify(observer, "step_finished", step, result, state, recorded)

    def steps_recorded(self, steps: Sequence[int]) -> None:
        for observer in self.observers:
            notify(observer, "steps_recorded", steps)

    def model_text(self, step: int, delta: str, retry: int) -> None:
        for observer in self.observers:
            notify(observer, "model_text", step, delta, retry)

    def run_ended(self, end: RunEnd) -> None:
        for observer in self.observers:
            notify(observer, "run_ended", end)
