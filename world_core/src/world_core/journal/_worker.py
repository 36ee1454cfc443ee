"""The worker: claims turns from the queue and runs them through the journal.

A message is ``{"session_id", "turn_id"}``. The worker holds it under a lease that a background
task renews every ``lease / 3`` seconds while the turn runs; if a renewal finds the lease lost
(another worker claimed the turn after it ran out), the turn is cancelled at once; so it is
when renewals keep failing and the lease would run out before the next one. The message
is acked only after the reply is in the log. Killed anywhere, the worker simply stops renewing;
the lease runs out and any other worker claims the turn and continues it from the journal.

On SIGTERM or SIGINT, :meth:`Worker.run` stops claiming, gives the running turn ``grace``
seconds to finish, then cancels it and releases its message so another worker takes it now.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.abc

from world_core.errors import (
    BackendUnavailableError,
    DuplicateKeyError,
    InvalidArgumentError,
    LeaseLostError,
    NonDeterminismError,
)
from world_core.journal._agent import Agent
from world_core.journal._client import DEFAULT_QUEUE
from world_core.journal._crash import CrashPoint, crash_point_from_env
from world_core.journal._journal import Journal, check_turn_id, session_log_id
from world_core.spi import Lease, World, validate_duration, validate_id

__all__ = ["TurnResult", "Worker"]

log = logging.getLogger("world.worker")

Status = Literal["done", "lease_lost", "superseded", "failed", "shutdown", "invalid"]


@dataclass(frozen=True)
class TurnResult:
    """What happened to one claimed turn.

    ``status``: ``done`` (reply saved, message acked), ``lease_lost`` (another worker took the
    turn; this one stopped), ``superseded`` (another worker's write for a step came first: the
    key refused ours; this one stopped without running a ``never`` tool), ``failed`` (an error;
    the message was released for a later retry), ``shutdown`` (stopped by a signal; released),
    ``invalid`` (the message was not a turn; acked and dropped).
    """

    session_id: str
    turn_id: str
    status: Status
    reply: str | None = None
    model_calls: int = 0
    tool_runs: int = 0
    replayed: int = 0
    error: str | None = None


class Worker:
    """Runs turns from ``queue`` with ``agent``.

    Args:
        world: the World holding sessions and the queue.
        agent: an :class:`Agent`, or a zero-argument callable returning one per turn.
        lease: seconds a claim lasts without renewal; another worker may take the turn after.
        heartbeat: renew the lease every ``lease / 3`` seconds while a turn runs. Turn it off
            only to study what an expired lease does (the two-workers test).
        crash: a :class:`CrashPoint`, None, or ``"env"`` to read ``CRASH_AT``.
        grace: seconds a running turn gets after SIGTERM before it is cancelled and released.
        retry_delay: first delay before a failed turn is offered again (doubles per attempt,
            at most 60 s).
    """

    def __init__(
        self,
        world: World,
        agent: Agent | Callable[[], Agent],
        *,
        queue: str = DEFAULT_QUEUE,
        lease: float = 30.0,
        heartbeat: bool = True,
        name: str | None = None,
        crash: CrashPoint | Literal["env"] | None = "env",
        grace: float = 30.0,
        retry_delay: float = 1.0,
    ) -> None:
        if validate_duration(lease, "lease") <= 0:
            raise InvalidArgumentError("lease must be > 0 seconds")
        self.world = world
        self._agent = agent
        self.queue = validate_id(queue, "queue")
        self.lease = float(lease)
        self.heartbeat = heartbeat
        self.name = validate_id(name or f"{socket.gethostname()}-{os.getpid()}", "worker name")
        self.crash = crash_point_from_env() if crash == "env" else crash
        self.grace = validate_duration(grace, "grace")
        self.retry_delay = validate_duration(retry_delay, "retry_delay")

    def _make_agent(self) -> Agent:
        return self._agent if isinstance(self._agent, Agent) else self._agent()

    async def run_once(self, *, wait: float = 0.0) -> TurnResult | None:
        """Claim one turn (waiting up to ``wait`` seconds) and run it; None if none came."""
        leases = await self.world.queue.claim(self.queue, self.name, lease=self.lease, wait=wait)
        if not leases:
            return None
        return await self.process(leases[0])

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
        async with anyio.create_task_group() as tg:
            if signals:
                await tg.start(_stop_on_signals, stop)
            if on_ready is not None:
                on_ready()
            while not stop.is_set():
                try:
                    leases = await self.world.queue.claim(
                        self.queue, self.name, lease=self.lease, wait=1.0
                    )
                except BackendUnavailableError as exc:
                    log.warning("claiming from %r failed: %s; retrying in 1 s", self.queue, exc)
                    await anyio.sleep(1.0)
                    continue
                for lease in leases:
                    result = await self.process(lease, stop=stop)
                    log.info("turn %s/%s: %s", result.session_id, result.turn_id, result.status)
            tg.cancel_scope.cancel()

    async def process(self, lease: Lease, *, stop: anyio.Event | None = None) -> TurnResult:
        """Run the turn ``lease`` holds, renewing it meanwhile; ack, release or drop it."""
        try:
            body = json.loads(lease.payload)
            session_id, turn_id = str(body["session_id"]), str(body["turn_id"])
            session_log_id(session_id)
            check_turn_id(turn_id)
        except (ValueError, KeyError, TypeError):  # InvalidArgumentError is a ValueError
            log.error("dropping message %s: not a turn: %r", lease.message_id, lease.payload[:100])
            await self._settle(lease, ack=True)
            return TurnResult("?", "?", "invalid", error="not a turn message")

        started = anyio.current_time()  # just after the claim (the margin below covers it)
        current = lease
        lost = False
        shutdown = False
        journal: Journal | None = None
        reply: str | None = None
        error: BaseException | None = None

        async with anyio.create_task_group() as tg:

            async def renew() -> None:
                nonlocal current, lost
                held_until = started + self.lease  # local clock, no later than the store's
                while True:
                    await anyio.sleep(self.lease / 3)
                    asked = anyio.current_time()
                    try:
                        current = await self.world.queue.renew(current, self.lease)
                        held_until = asked + self.lease
                    except LeaseLostError:
                        lost = True
                        tg.cancel_scope.cancel()
                        return
                    except Exception as exc:  # transient: the next renewal may still make it
                        log.warning("renewing %s failed: %s", lease.message_id, exc)
                        if anyio.current_time() + self.lease / 3 >= held_until:
                            # The lease runs out before the next try: another worker may
                            # take the turn then, and both would pay for its model calls.
                            log.warning("giving up %s: its lease runs out", lease.message_id)
                            lost = True
                            tg.cancel_scope.cancel()
                            return

            async def on_stop(event: anyio.Event) -> None:
                nonlocal shutdown
                await event.wait()
                await anyio.sleep(self.grace)
                shutdown = True
                tg.cancel_scope.cancel()

            if self.heartbeat:
                tg.start_soon(renew)
            if stop is not None:
                tg.start_soon(on_stop, stop)
            try:
                journal = await Journal.open(self.world, session_id, turn_id, crash=self.crash)
                reply = await self._make_agent().run_turn(journal)
            except Exception as exc:
                error = exc
            tg.cancel_scope.cancel()

        counts: dict[str, Any] = {
            "model_calls": journal.model_calls if journal else 0,
            "tool_runs": journal.tool_runs if journal else 0,
            "replayed": journal.replayed if journal else 0,
        }
        if lost:
            return TurnResult(session_id, turn_id, "lease_lost", **counts)
        if shutdown:
            await self._settle(current, ack=False)
            return TurnResult(session_id, turn_id, "shutdown", **counts)
        if isinstance(error, DuplicateKeyError):
            # Another worker wrote this step first: it owns the turn now. Give it time.
            log.warning("turn %s/%s: %s; stopping", session_id, turn_id, error)
            await self._settle(current, ack=False, delay=self.lease)
            return TurnResult(session_id, turn_id, "superseded", error=_describe(error), **counts)
        if error is not None:
            if isinstance(error, NonDeterminismError):
                log.error("turn %s/%s cannot replay: %s", session_id, turn_id, error)
            else:
                log.warning("turn %s/%s failed: %r", session_id, turn_id, error)
            delay = min(60.0, self.retry_delay * 2 ** max(0, lease.attempt - 1))
            await self._settle(current, ack=False, delay=delay)
            return TurnResult(session_id, turn_id, "failed", error=_describe(error), **counts)
        acked = await self._settle(current, ack=True)
        status: Status = "done" if acked else "lease_lost"
        return TurnResult(session_id, turn_id, status, reply=reply, **counts)

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


async def _stop_on_signals(
    stop: anyio.Event, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        task_status.started()
        async for signum in received:
            log.info("signal %s: finishing the current turn, then stopping", signum)
            stop.set()
            return
