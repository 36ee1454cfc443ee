"""Timers, signals, approvals and versioning: the contracts of waits inside a turn.

Workers run in this process; a crash is a :class:`CrashPoint` with ``in_process=True`` (the
worker stops dead at the point, writing nothing more, and its lease runs out), continued by a
fresh worker. Timings are only ever lower bounds (a timer never fires early), never speeds.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar, Literal

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._process import _spawn
from world_conformance._support import WAIT, run_until_done
from world_conformance._target import WorldTarget
from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import (
    Agent,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    NewEvent,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    TurnResult,
    Worker,
    World,
    session_log_id,
    tool,
)
from world_core.errors import (
    InvalidArgumentError,
    ModelReplyError,
    NonDeterminismError,
    NotFoundError,
)
from world_core.journal import _client
from world_core.journal._waits import PendingApproval, approval_signal

__all__ = [
    "JournalChildContract",
    "JournalSignalContract",
    "JournalTimerContract",
    "JournalVersioningContract",
]

QUEUE = "q"
LEASE = 1.0


def _echo(request: ModelRequest) -> ModelReply:
    return ModelReply(content=f"model saw {len(request.messages)} messages")


class _Sleepy(Agent):
    """model, sleep(``seconds``), model, reply: the reply names both model answers."""

    def __init__(self, seconds: float) -> None:
        super().__init__(model=ScriptedModel(_echo))
        self.seconds = seconds

    async def run_turn(self, journal: Journal) -> str:
        request = ModelRequest(messages=[{"role": "user", "content": journal.user_message}])
        first = await journal.model(self.model, request)
        await journal.sleep(self.seconds)
        second = await journal.model(self.model, request)
        return await journal.finish(f"{first.content} / slept / {second.content}")


class _Waiter(Agent):
    """Waits for the signal ``go`` once per timeout given (seconds); replies with what each
    wait got."""

    def __init__(self, *timeouts: float) -> None:
        super().__init__(model=ScriptedModel(_echo))
        self.timeouts = timeouts

    async def run_turn(self, journal: Journal) -> str:
        got: list[str] = []
        for timeout in self.timeouts:
            signal = await journal.wait_for_signal("go", timeout=timeout)
            got.append("timed out" if signal is None else f"{signal.payload} from {signal.sender}")
        return await journal.finish("; ".join(got))


async def _dies(worker: Worker) -> None:
    """Run one turn with a worker whose crash point must fire (SimulatedCrash)."""
    with anyio.fail_after(WAIT):
        try:
            await worker.run_once(wait=WAIT)
        except BaseException as exc:  # a SimulatedCrash, maybe inside a task group's group
            group = exc if isinstance(exc, BaseExceptionGroup) else BaseExceptionGroup("", [exc])
            if group.subgroup(SimulatedCrash) is None:
                raise
            return
    pytest.fail(f"the worker with {worker.crash} did not reach its crash point")


def _status(result: TurnResult | None) -> str:
    return "nothing came" if result is None else result.status


def _worker(world: World, agent: Agent, crash: CrashPoint | None = None) -> Worker:
    return Worker(world, agent, queue=QUEUE, lease=LEASE, crash=crash, retry_delay=0.1)


async def _until_done(
    world: World, agent: Agent, turn: str, *, within: float = WAIT * 2
) -> list[str]:
    """Run turns until ``turn`` is done (or failed); the statuses its messages got."""
    worker = _worker(world, agent)
    statuses: list[str] = []
    with anyio.fail_after(within):
        while True:
            result = await worker.run_once(wait=WAIT)
            assert result is not None, f"no message came to finish the turn (saw {statuses})"
            if result.turn_id != turn:
                continue
            statuses.append(result.status)
            if result.status in ("done", "failed"):
                return statuses


async def _events(world: World, session: str, what: str) -> list[dict[str, Any]]:
    found = []
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") == what:
            found.append(body)
    return found


class JournalTimerContract(ContractBase):
    """Durable timers: recorded once, unloaded while waiting, fired once, on time."""

    contract_area: ClassVar[str] = "timers"

    async def test_timers_sleep_unloads_the_turn_and_fires_once_on_time(self, world: World) -> None:
        """``journal.sleep(1.5)``: the worker records the fire time, queues a wake-up and
        acks (status ``suspended``: nothing claimable before the fire time, no worker held);
        the wake-up resumes the turn, which never fires early, pays for no model call twice,
        and records the timer's outcome once."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        submitted = time.monotonic()
        agent = _Sleepy(1.5)
        first = await _worker(world, agent).run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        assert await client.status("s", turn) == "waiting"
        assert await world.queue.claim(QUEUE, "peek", lease=LEASE) == [], (
            "a message of the sleeping turn was claimable before its fire time"
        )
        statuses = await _until_done(world, agent, turn)
        assert statuses[-1] == "done", statuses
        assert time.monotonic() - submitted >= 1.5, "the timer fired before its time"
        model = agent.model
        assert isinstance(model, ScriptedModel)
        assert len(model.calls) == 2, "a model call finished before the sleep was paid again"
        timer = [o for o in await _events(world, "s", "outcome") if o["kind"] == "timer"]
        assert [t["result"] for t in timer] == [{"fired": True}], timer
        both = "model saw 1 messages"
        assert await client.reply("s", turn) == f"{both} / slept / {both}"

    @pytest.mark.parametrize("when", ["before_run", "after_run"])
    async def test_timers_crash_inside_the_wait_keeps_the_fire_time(
        self, world: World, when: Literal["before_run", "after_run"]
    ) -> None:
        """A worker dies at the timer (``before_run``: its fire time is durable, no wake-up
        queued yet; ``after_run``: at the wake-up, the time has come, no outcome written). A
        fresh worker goes on: the fire time recorded first is kept (never recomputed), the
        timer fires once, and the model call before it is not paid again."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        agent = _Sleepy(1.0)
        crashing = _worker(world, agent, CrashPoint(1, when, in_process=True))
        if when == "after_run":
            first = await _worker(world, agent).run_once(wait=WAIT)
            assert _status(first) == "suspended", first
        await _dies(crashing)
        intents = [i for i in await _events(world, "s", "intent") if i["kind"] == "timer"]
        assert len(intents) == 1
        recorded = intents[0]["deadline"]
        statuses = await _until_done(world, agent, turn)
        assert statuses[-1] == "done", statuses
        intents = [i for i in await _events(world, "s", "intent") if i["kind"] == "timer"]
        assert [i["deadline"] for i in intents] == [recorded], "the fire time was recomputed"
        timer = [o for o in await _events(world, "s", "outcome") if o["kind"] == "timer"]
        assert len(timer) == 1, f"the timer fired {len(timer)} times"
        model = agent.model
        assert isinstance(model, ScriptedModel)
        assert len(model.calls) == 2, f"{len(model.calls)} model calls for 2 steps"
        assert await client.reply("s", turn) is not None

    async def test_timers_a_passed_fire_time_fires_at_once(self, world: World) -> None:
        """A sleep whose time passed while no worker ran fires on the next claim."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        agent = _Sleepy(0.5)
        worker = _worker(world, agent)
        first = await worker.run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        await anyio.sleep(1.5)  # no worker runs meanwhile
        with anyio.fail_after(WAIT):
            resumed = await worker.run_once(wait=WAIT)
        assert _status(resumed) == "done", resumed
        assert await client.reply("s", turn) is not None

    @pytest.mark.parametrize("first", ["wake_up", "submission"])
    async def test_timers_a_wake_up_and_another_sessions_turn_both_run(
        self, world: World, first: str
    ) -> None:
        """Session ids may hold '/', turn ids not. Session ``a``'s turn ``t`` sleeps at step
        1; session ``a/t`` has a turn named ``wake-1``, like that sleep's wake-up. Both
        messages live on one queue at once (``wake_up``: the wake-up is queued first;
        ``submission``: the other turn's message is queued first and held by a worker while
        the wake-up is queued): neither is deduplicated into the other, and both turns reply.
        """
        client = Client(world, queue=QUEUE)
        agent = _Sleepy(0.5)
        worker = _worker(world, agent)
        held = []
        if first == "submission":
            await client.submit("a/t", "other", turn_id="wake-1")
            held = await world.queue.claim(QUEUE, "held", lease=WAIT * 3)
            assert len(held) == 1
        await client.submit("a", "hello", turn_id="t")
        with anyio.fail_after(WAIT):
            assert _status(await worker.run_once(wait=WAIT)) == "suspended"
        if first == "wake_up":
            await client.submit("a/t", "other", turn_id="wake-1")
        else:
            with anyio.fail_after(WAIT):
                # (by a worker of the claim's lease, from which it tells the store's time)
                holder = Worker(world, agent, queue=QUEUE, lease=WAIT * 3, crash=None)
                assert _status(await holder.process(held[0])) == "suspended"
        await run_until_done(_worker(world, agent), {("a", "t"), ("a/t", "wake-1")})
        assert await client.reply("a", "t") is not None
        assert await client.reply("a/t", "wake-1") is not None


class _Refunds:
    """A ``never`` tool that needs approval, counting its runs. The model calls it once, and
    again, blindly, when told the call may or may not have happened."""

    def __init__(self, approval_timeout: float = 3600.0, timeout: float = 60.0) -> None:
        self.runs: list[int] = []

        async def refund(amount: int) -> str:
            """Refund the customer."""
            self.runs.append(amount)
            return f"refunded {amount}"

        self.tool = tool(
            refund,
            replay="never",
            approval="required",
            approval_timeout=approval_timeout,
            timeout=timeout,
        )

    def agent(self) -> Agent:
        def policy(request: ModelRequest) -> ModelReply:
            results = [m for m in request.messages if m["role"] == "tool"]
            again = bool(results) and "may or may not" in str(results[-1]["content"])
            if results and not again:
                return ModelReply(content=f"done: {results[-1]['content']}")
            call_id = f"c{len(results)}"
            call = ToolCall(id=call_id, name="refund", arguments=json.dumps({"amount": 30}))
            return ModelReply(tool_calls=[call])

        return Agent(model=ScriptedModel(policy), tools=[self.tool])


async def _waiting_for_approval(
    world: World, refunds: _Refunds
) -> tuple[Client, str, PendingApproval]:
    """A client, its turn (suspended at the refund's approval) and that approval, which the
    client lists as the session's only pending one."""
    client = Client(world, queue=QUEUE)
    turn = await client.submit("s", "refund me")
    first = await _worker(world, refunds.agent()).run_once(wait=WAIT)
    assert _status(first) == "suspended", first
    (pending,) = await client.pending_approvals("s")
    return client, turn, pending


class _ReadsAs:
    """Stands for the ``time`` module of the client: its clock reads ``at``."""

    def __init__(self, at: float) -> None:
        self.at = at

    def time(self) -> float:
        return self.at


class JournalSignalContract(ContractBase):
    """Signals and approvals: deduplicated, authenticated by sender, delivered once."""

    contract_area: ClassVar[str] = "signals"

    async def test_signals_wake_a_waiting_turn_once_and_dedupe_by_id(self, world: World) -> None:
        """The turn waits for ``go`` (suspended, no worker held). The signal, sent twice with
        one id (a double tap), wakes it and is consumed once: the turn's second wait for
        ``go`` gets nothing and times out. The same id with another payload is refused."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        agent = _Waiter(1.0 + WAIT)
        first = await _worker(world, agent).run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        assert await client.signal("s", "go", {"n": 1}, sender="alice", signal_id="tap") == "tap"
        assert await client.signal("s", "go", {"n": 1}, sender="alice", signal_id="tap") == "tap"
        with pytest.raises(InvalidArgumentError, match="already used"):
            await client.signal("s", "go", {"n": 2}, sender="alice", signal_id="tap")
        statuses = await _until_done(world, agent, turn, within=WAIT)
        assert statuses[-1] == "done", statuses
        assert await client.reply("s", turn) == "{'n': 1} from alice"
        consumed = [o for o in await _events(world, "s", "outcome") if o["kind"] == "signal"]
        assert len(consumed) == 1
        # A later turn's wait does not get the consumed signal again.
        second = await client.submit("s", "again")
        statuses = await _until_done(world, _Waiter(0.5), second, within=WAIT)
        assert await client.reply("s", second) == "timed out", statuses

    @pytest.mark.world_process
    async def test_signals_of_a_sender_killed_before_its_wake_up_are_noticed(
        self, world: World, world_target: WorldTarget
    ) -> None:
        """A sender process killed (SIGKILL) just after its signal's append, before it queued
        the waiting turn's wake-up: the turn, waiting an hour for the signal, is resumed by
        the check its sender queued before the append (``Client(signal_check=0.5)``) instead
        of at its deadline; on the queue the turn's workers take, which its wait recorded,
        though the sender's client names another."""
        if not world.capabilities.shared:
            pytest.skip("Capabilities.shared is false: one process at a time")
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        agent = _Waiter(3600.0)
        worker = Worker(world, agent, queue=QUEUE, lease=LEASE, crash=None, retry_delay=0.1)
        with anyio.fail_after(WAIT):
            first = await worker.run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        sender = world_target.child_command(
            "signal", "s", "go", '"hi"', "--sender", "bob", "--id", "lost",
            "--queue", "elsewhere", "--check", "0.5", "--die-after-append",
        )  # fmt: skip
        async with _spawn([sender]) as (child,):
            await child.go()
            with anyio.fail_after(WAIT):
                code = await child.process.wait()
        assert code == -signal.SIGKILL, child.errors()
        assert await world.log.get(session_log_id("s"), "signal/lost") is not None
        statuses: list[str] = []
        with anyio.fail_after(WAIT * 3):
            while not statuses or statuses[-1] not in ("done", "failed"):
                statuses.append(_status(await worker.run_once(wait=WAIT)))
                assert statuses[-1] != "nothing came", f"the turn was not resumed: {statuses}"
        assert statuses == ["done"], statuses  # run_once handles the check, then the turn
        assert await client.reply("s", turn) == "hi from bob"

    async def test_a_signals_check_wakes_turns_only_for_an_unconsumed_signal(
        self, world: World
    ) -> None:
        """The check a sender queues before its signal: after a sender that finished (the
        signal consumed by the turn it woke) it wakes nobody; after a sender that died before
        its append (a check, no signal) it wakes nobody either (the worker handles it as
        ``checked``); the turn waiting goes on waiting, and a signal sent later wakes it."""
        client = Client(world, queue=QUEUE, signal_check=0.2)
        turn = await client.submit("s", "hello")
        worker = _worker(world, _Waiter(3600.0))
        with anyio.fail_after(WAIT):
            assert _status(await worker.run_once(wait=WAIT)) == "suspended"
        await client.signal("s", "go", "one", sender="bob", signal_id="first")
        with anyio.fail_after(WAIT):
            assert _status(await worker.run_once(wait=WAIT)) == "done"
        assert await client.reply("s", turn) == "one from bob"
        second = await client.submit("s", "again")
        with anyio.fail_after(WAIT):  # the first signal's check (due by now) is handled too
            assert _status(await worker.run_once(wait=WAIT)) == "suspended"
        # A sender that died after queueing its check, before its append: the check alone,
        # taken by a worker's run loop (which, unlike run_once, returns nothing per message).
        check = {"session_id": "s", "signal": "never-sent", "why": "signal-check"}
        await world.queue.enqueue(QUEUE, json.dumps(check).encode())
        claimed = await world.queue.claim(QUEUE, "tester", lease=LEASE, wait=WAIT)
        assert len(claimed) == 1
        result = await worker.process(claimed[0])
        assert (result.session_id, result.status) == ("s", "checked"), result
        with anyio.fail_after(WAIT):
            assert await worker.run_once(wait=0.5) is None  # nothing was woken
        assert await client.reply("s", second) is None
        await client.signal("s", "go", "two", sender="ann", signal_id="second")
        with anyio.fail_after(WAIT):
            assert _status(await worker.run_once(wait=WAIT)) == "done"
        assert await client.reply("s", second) == "two from ann"

    async def test_signals_a_wake_up_and_another_sessions_turn_both_run(self, world: World) -> None:
        """Session ids may hold '/', turn ids not. Session ``a``'s turn ``t`` waits for
        ``go`` at step 0, and the signal queues its wake-up; session ``a/t`` then submits a
        turn named ``signal-0``, like that wake-up: its message is not deduplicated into the
        wake-up, and both turns get their signal and reply."""
        client = Client(world, queue=QUEUE)
        agent = _Waiter(WAIT * 3)
        with anyio.fail_after(WAIT):
            await client.submit("a", "hello", turn_id="t")
            assert _status(await _worker(world, agent).run_once(wait=WAIT)) == "suspended"
            await client.signal("a", "go", "one", sender="bob")
            await client.submit("a/t", "other", turn_id="signal-0")
            await client.signal("a/t", "go", "two", sender="ann")  # kept for its wait
        await run_until_done(_worker(world, agent), {("a", "t"), ("a/t", "signal-0")})
        assert await client.reply("a", "t") == "one from bob"
        assert await client.reply("a/t", "signal-0") == "two from ann"

    async def test_signals_sent_before_the_wait_are_kept_for_it(self, world: World) -> None:
        """A signal sent before any turn waits for its name is consumed by the first wait for
        it, without suspending; one addressed to another turn is not."""
        client = Client(world, queue=QUEUE)
        await client.signal("s", "go", "for someone else", sender="bob", turn_id="other")
        await client.signal("s", "go", "early", sender="bob")
        turn = await client.submit("s", "hello")
        statuses = await _until_done(world, _Waiter(WAIT), turn, within=WAIT)
        assert statuses == ["done"], statuses
        assert await client.reply("s", turn) == "early from bob"

    async def test_signals_wait_times_out_with_one_outcome(self, world: World) -> None:
        """No signal comes: the wait returns None at its deadline, never before, and a signal
        sent after that is not consumed by it."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        started = time.monotonic()
        statuses = await _until_done(world, _Waiter(1.0), turn, within=WAIT)
        assert statuses == ["suspended", "done"], statuses
        assert time.monotonic() - started >= 1.0, "the wait timed out early"
        assert await client.reply("s", turn) == "timed out"
        await client.signal("s", "go", "late", sender="carol")
        outcomes = [o for o in await _events(world, "s", "outcome") if o["kind"] == "signal"]
        assert [o["result"] for o in outcomes] == [{"timed_out": True}]

    async def test_signals_a_wake_up_for_a_resumed_wait_is_stale(self, world: World) -> None:
        """The wait (1 s) is resumed early by its signal, and the turn goes on with a slow
        tool. The wait's timer wake-up, come at 1 s to another worker while the turn still
        runs, finds the wait resumed by another message and is dropped (``stale``) without
        running anything; the turn ends once, on the first worker."""
        working = anyio.Event()  # the first worker runs the slow tool
        dropped = anyio.Event()  # the second worker is done with the wake-up it took

        class WaitThenWork(Agent):
            def __init__(self) -> None:
                async def slow() -> str:
                    """Work for a while."""
                    working.set()
                    # The turn runs until the other wake-up was handled, however late that
                    # came: with a fixed 2.5 s here, and the second worker starting 0.3 s
                    # after the first, a loaded machine could end the turn before the second
                    # claimed (it then read the reply: "done", not "stale"), or let the second
                    # claim first.
                    await dropped.wait()
                    return "worked"

                super().__init__(model=ScriptedModel(_echo), tools=[tool(slow, replay="safe")])

            async def run_turn(self, journal: Journal) -> str:
                signal = await journal.wait_for_signal("go", timeout=1.0)
                slow = self.tools.get("slow")
                assert slow is not None
                await journal.call(slow, {})
                return await journal.finish(f"{None if signal is None else signal.payload}")

        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        first = await _worker(world, WaitThenWork()).run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        await client.signal("s", "go", "one", sender="erin")
        results: dict[str, TurnResult | None] = {}

        async def run(name: str) -> None:
            worker = Worker(world, WaitThenWork(), queue=QUEUE, lease=5, name=name, crash=None)
            results[name] = await worker.run_once(wait=WAIT)

        async def run_second() -> None:
            await working.wait()  # not before: it would take the first wake-up itself
            try:
                await run("b")
            finally:
                dropped.set()

        with anyio.fail_after(WAIT * 2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "a")  # takes the first wake-up and runs the slow tool
                tg.start_soon(run_second)  # takes the other one (the timer's at 1 s)
        a, b = results["a"], results["b"]
        assert _status(a) == "done", a
        assert _status(b) == "stale", b
        assert b is not None
        assert (b.model_calls, b.tool_runs, b.replayed) == (0, 0, 0)
        assert await client.reply("s", turn) == "one"

    async def test_signals_a_redelivered_message_resumes_its_turn_at_the_next_wait(
        self, world: World
    ) -> None:
        """A timer's wake-up resumes the turn, which records its next wait (for a signal sent
        earlier) and dies before queueing that wait's wake-up. The message comes back after its
        lease: it must resume the turn (not be dropped as a stale wake-up of the first wait),
        and the turn ends with the signal long before the second wait's timeout."""

        class SleepThenWait(Agent):
            def __init__(self) -> None:
                super().__init__(model=ScriptedModel(_echo))

            async def run_turn(self, journal: Journal) -> str:
                await journal.sleep(0.5)
                signal = await journal.wait_for_signal("go", timeout=WAIT * 10)
                return await journal.finish(f"got {None if signal is None else signal.payload}")

        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        first = await _worker(world, SleepThenWait()).run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        await client.signal("s", "go", "hello", sender="x")
        await _dies(_worker(world, SleepThenWait(), CrashPoint(1, "before_run", in_process=True)))
        statuses = await _until_done(world, SleepThenWait(), turn, within=WAIT)
        assert statuses[-1] == "done", statuses
        assert await client.reply("s", turn) == "got hello"

    async def test_signals_a_deploy_that_changes_a_timeout_keeps_open_waits(
        self, world: World
    ) -> None:
        """A turn waits (the old code's timeout recorded as its deadline); the new code waits
        with another timeout: the turn resumes under it, with the recorded deadline."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        first = await _worker(world, _Waiter(WAIT * 5)).run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        await client.signal("s", "go", "after the deploy", sender="ops")
        statuses = await _until_done(world, _Waiter(WAIT * 7), turn, within=WAIT)
        assert statuses[-1] == "done", statuses
        assert await client.reply("s", turn) == "after the deploy from ops"

    async def test_signals_wake_the_turn_on_its_own_queue(self, world: World) -> None:
        """Workers run on queue ``q``; the signal is sent through a Client of another queue:
        the wake-up goes to the waiting turn's queue, so it resumes at once."""
        turn = await Client(world, queue=QUEUE).submit("s", "hello")
        first = await _worker(world, _Waiter(WAIT * 5)).run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        await Client(world, queue="elsewhere").signal("s", "go", "hi", sender="app")
        statuses = await _until_done(world, _Waiter(WAIT * 5), turn, within=WAIT)
        assert statuses[-1] == "done", statuses

    @pytest.mark.parametrize("when", ["before_run", "after_run"])
    async def test_signals_crash_around_consuming_delivers_once(
        self, world: World, when: Literal["before_run", "after_run"]
    ) -> None:
        """The worker dies at the wait: before it looked for the signal (``before_run``) or
        after it found it and before recording that (``after_run``). A fresh worker delivers
        the signal exactly once: one outcome, the same payload."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "hello")
        await client.signal("s", "go", "payload", sender="dana", signal_id="only")
        agent = _Waiter(WAIT)
        crashing = _worker(world, agent, CrashPoint(0, when, in_process=True))
        await _dies(crashing)
        statuses = await _until_done(world, agent, turn)
        assert statuses[-1] == "done", statuses
        assert await client.reply("s", turn) == "payload from dana"
        outcomes = [o for o in await _events(world, "s", "outcome") if o["kind"] == "signal"]
        assert len(outcomes) == 1, f"the signal was delivered {len(outcomes)} times"

    async def test_signals_no_wake_up_is_lost_to_a_race(self, world: World) -> None:
        """Twelve sessions whose turns wait for ``go`` while their signals are sent by other
        tasks, spread over half a second, three workers running: every turn gets its signal
        long before its wait's timeout (a lost wake-up would leave it until then)."""
        client = Client(world, queue=QUEUE)
        sessions = [f"s{n}" for n in range(12)]
        turns = {s: await client.submit(s, "hello") for s in sessions}
        agent = _Waiter(WAIT * 10)
        stop = anyio.Event()

        async def send(session: str, after: float) -> None:
            await anyio.sleep(after)  # spread: some come before a wait, some during, some after
            await client.signal(session, "go", session, sender="racer")

        with anyio.fail_after(WAIT * 2):
            async with anyio.create_task_group() as tg:
                for n in range(3):
                    worker = Worker(
                        world, agent, queue=QUEUE, lease=5, name=f"w{n}", crash=None, grace=0
                    )
                    tg.start_soon(partial(worker.run, stop=stop, signals=False))
                for n, session in enumerate(sessions):
                    tg.start_soon(partial(send, session, n * 0.04))
                try:
                    for session in sessions:
                        reply = await client.wait(session, turns[session], timeout=WAIT)
                        assert reply == f"{session} from racer"
                except TimeoutError:
                    pytest.fail("a turn missed the signal sent while it began to wait")
                finally:
                    stop.set()

    async def test_signals_approval_runs_the_tool_once_on_approval(self, world: World) -> None:
        """A ``never`` tool with ``approval="required"``: the turn stops before it runs,
        holding no worker; the pending approval shows the tool and its arguments; approving
        twice counts once and the tool runs once; a reject after it is refused."""
        refunds = _Refunds()
        client, turn, pending = await _waiting_for_approval(world, refunds)
        assert (pending.turn_id, pending.tool, pending.arguments) == (
            turn,
            "refund",
            {"amount": 30},
        )
        assert refunds.runs == []
        step = pending.step
        await client.approve("s", turn, step, by="manager")
        await client.approve("s", turn, step, by="manager")
        with pytest.raises(InvalidArgumentError, match="already approved"):
            await client.reject("s", turn, step, by="manager")
        assert await client.pending_approvals("s") == []
        statuses = await _until_done(world, refunds.agent(), turn, within=WAIT)
        assert statuses[-1] == "done", statuses
        assert refunds.runs == [30]
        assert await client.reply("s", turn) == "done: refunded 30"
        with pytest.raises(NotFoundError):
            await client.approve("s", turn, step + 5, by="manager")

    async def test_signals_a_repeated_decision_with_another_reason_counts_once(
        self, world: World
    ) -> None:
        """A decision is approve or reject: approving again with another reason (a retried
        form whose text changed, another manager) is idempotent, and the first decision
        stands as recorded; rejecting it with the same reason is still refused."""
        refunds = _Refunds()
        client, turn, pending = await _waiting_for_approval(world, refunds)
        step = pending.step
        await client.approve("s", turn, step, by="manager", reason="within policy")
        await client.approve("s", turn, step, by="manager", reason="within policy (checked)")
        await client.approve("s", turn, step, by="director")
        with pytest.raises(InvalidArgumentError, match="sender must name"):
            await client.approve("s", turn, step, by=" ")
        with pytest.raises(InvalidArgumentError, match="already approved by 'manager'"):
            await client.reject("s", turn, step, by="manager", reason="within policy")
        decisions = [
            json.loads(event.data)
            for event in await world.log.read(session_log_id("s"))
            if (event.key or "").startswith("signal/")
        ]
        assert [(d["sender"], d["payload"]) for d in decisions] == [
            ("manager", {"approved": True, "reason": "within policy"})
        ]
        statuses = await _until_done(world, refunds.agent(), turn, within=WAIT)
        assert statuses[-1] == "done", statuses
        assert refunds.runs == [30]

    async def test_signals_an_approved_call_retried_after_a_crash_is_not_asked_again(
        self, world: World
    ) -> None:
        """Approved, the call's worker dies before it runs the tool (its intent is durable).
        The turn resumes: the model is told the call may or may not have happened and retries
        it, blindly, with the same arguments: the approval covers the retry (one approval in
        all) and the tool runs once, with the first call's idempotency key."""
        refunds = _Refunds(timeout=1.0)
        client, turn, pending = await _waiting_for_approval(world, refunds)
        await client.approve("s", turn, pending.step, by="manager")
        crash = CrashPoint(pending.step + 1, "before_run", in_process=True)
        await _dies(_worker(world, refunds.agent(), crash))
        statuses = await _until_done(world, refunds.agent(), turn)
        assert statuses[-1] == "done", statuses
        assert "suspended" not in statuses, f"the retry asked for a second approval: {statuses}"
        assert refunds.runs == [30], refunds.runs
        assert await client.pending_approvals("s") == []
        approvals = [o for o in await _events(world, "s", "outcome") if o["kind"] == "approval"]
        consumed = [o for o in approvals if "signal" in o["result"]]
        assert len(consumed) == 1, approvals
        assert [o["result"] for o in approvals if "signal" not in o["result"]] == [
            {"approved_before": pending.step}
        ]

    async def test_signals_a_late_or_forged_decision_never_runs_the_tool(
        self, world: World
    ) -> None:
        """Nobody may approve with a plain signal (the names are reserved); a decision after
        the approval's deadline is refused (the timed-out call is not listed as pending) and
        the call does not run, even though no worker noticed the timeout yet."""
        refunds = _Refunds(approval_timeout=0.5)
        client, turn, pending = await _waiting_for_approval(world, refunds)
        _, signal_id = approval_signal(turn, pending.step)
        for name, sid in ((f"approval/{pending.step}", None), ("other", signal_id)):
            with pytest.raises(InvalidArgumentError, match="reserved"):
                await client.signal(
                    "s", name, {"approved": True}, sender="mallory", signal_id=sid, turn_id=turn
                )
        await anyio.sleep(0.5 + 1.5)  # past the deadline and the clock margin; no worker ran
        assert await client.pending_approvals("s") == []
        with pytest.raises(InvalidArgumentError, match="timed out"):
            await client.approve("s", turn, pending.step, by="late-manager")
        statuses = await _until_done(world, refunds.agent(), turn, within=WAIT)
        assert statuses[-1] == "done", statuses
        assert refunds.runs == [], "a decision after the deadline ran the tool"
        assert "nobody approved" in str(await client.reply("s", turn))

    async def test_signals_a_decision_landing_as_the_approval_times_out_counts(
        self, world: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The worker wakes at the approval's deadline and finds no decision; before it
        appends the time-out, a decision lands that the client lets through (its clock reads
        the deadline: within the margin) and, finding no outcome yet, reports as counted. The
        time-out is not appended (the log moved since the worker looked): the worker looks
        again, finds the decision and runs the call. (Appended, the caller was told
        "approved" and the call never ran.)"""
        refunds = _Refunds(approval_timeout=0.2)
        client, turn, pending = await _waiting_for_approval(world, refunds)
        told: list[str] = []

        class Log(PassThroughLog):
            async def append(self, log_id: str, events: Sequence[NewEvent], **kw: Any) -> int:
                ending = f"turn/{turn}/step/{pending.step}/outcome"
                if not told and any(e.key == ending for e in events):
                    with monkeypatch.context() as patched:
                        patched.setattr(_client, "time", _ReadsAs(pending.deadline))
                        try:
                            await client.approve("s", turn, pending.step, by="manager")
                            told.append("approved")
                        except InvalidArgumentError as exc:
                            told.append(str(exc))
                return await super().append(log_id, events, **kw)

        # The wake-up queued for the deadline is handed out once the store's clock passed it,
        # and the worker's clock starts from that claim: the wait is over when it looks.
        hooked = PassThroughWorld(world, log=Log(world.log))
        woken = await _worker(hooked, refunds.agent()).run_once(wait=WAIT)
        assert told == ["approved"]
        assert _status(woken) == "done", woken
        assert refunds.runs == [30], "the client reported an approval the turn did not count"
        assert await client.reply("s", turn) == "done: refunded 30"

    async def test_signals_rejection_and_timeout_never_run_the_tool(self, world: World) -> None:
        """Rejected: the tool does not run, the model is told who rejected it and why. Not
        decided within ``approval_timeout``: the tool does not run, the model is told, and a
        decision after that is refused."""
        refunds = _Refunds(approval_timeout=1.0)
        client, rejected, pending = await _waiting_for_approval(world, refunds)
        await client.reject("s", rejected, pending.step, by="manager", reason="no receipt")
        await _until_done(world, refunds.agent(), rejected, within=WAIT)
        reply = await client.reply("s", rejected)
        assert "manager rejected this call of refund" in str(reply), reply
        assert "no receipt" in str(reply), reply
        timed = await client.submit("s", "refund me again")
        statuses = await _until_done(world, refunds.agent(), timed, within=WAIT)
        assert statuses[-1] == "done", statuses
        reply = await client.reply("s", timed)
        assert "nobody approved" in str(reply), reply
        assert refunds.runs == [], "a tool ran without approval"
        (over,) = [
            i["step"]
            for i in await _events(world, "s", "intent")
            if i["kind"] == "approval" and i["turn"] == timed
        ]
        with pytest.raises(InvalidArgumentError, match="is over"):
            await client.approve("s", timed, over, by="manager")


class _Priced(Agent):
    """model, [new code: ``patched("price-recheck")`` and a second model call], a wait for
    ``continue`` (unless ``suspend`` is False), reply."""

    def __init__(self, *, new_code: bool, suspend: bool = True) -> None:
        super().__init__(model=ScriptedModel(_echo))
        self.new_code = new_code
        self.suspend = suspend

    async def run_turn(self, journal: Journal) -> str:
        request = ModelRequest(messages=[{"role": "user", "content": journal.user_message}])
        first = await journal.model(self.model, request)
        price = "old price"
        if self.new_code and journal.patched("price-recheck"):
            rechecked = await journal.model(self.model, request)
            price = f"rechecked ({rechecked.content})"
        if self.suspend:
            await journal.wait_for_signal("continue", timeout=WAIT * 3)
        return await journal.finish(f"{first.content}; {price}")


class JournalVersioningContract(ContractBase):
    """``patched()``: old histories take the old branch, new runs the new one; removing a
    branch a history needs is refused by name."""

    contract_area: ClassVar[str] = "versioning"

    async def test_versioning_open_history_keeps_the_old_branch(self, world: World) -> None:
        """A turn the old code ran past the change (it is suspended in a later wait) resumes
        under the new code: its history holds no marker where ``patched`` is asked, so it is
        False there and the turn ends as the old code would. A turn the new code runs records
        the marker and takes the new branch."""
        client = Client(world, queue=QUEUE)
        old = await client.submit("s", "buy")
        first = await _worker(world, _Priced(new_code=False)).run_once(wait=WAIT)
        assert _status(first) == "suspended", first
        await client.signal("s", "continue", None, sender="test", turn_id=old)
        statuses = await _until_done(world, _Priced(new_code=True), old, within=WAIT)
        assert statuses[-1] == "done", statuses
        assert await client.reply("s", old) == "model saw 1 messages; old price"
        new = await client.submit("s", "buy again")
        await client.signal("s", "continue", None, sender="test", turn_id=new)
        statuses = await _until_done(world, _Priced(new_code=True), new, within=WAIT)
        assert statuses[-1] == "done", statuses
        rechecked = "model saw 1 messages; rechecked (model saw 1 messages)"
        assert await client.reply("s", new) == rechecked
        markers = [o for o in await _events(world, "s", "outcome") if o["kind"] == "patch"]
        assert [(m["turn"], m["name"]) for m in markers] == [(new, "price-recheck")]

    async def test_versioning_removing_a_branch_an_open_history_needs_is_refused(
        self, world: World
    ) -> None:
        """A turn that took the new branch and is still open cannot be resumed by code
        without the ``patched`` call: NonDeterminismError naming the marker."""
        client = Client(world, queue=QUEUE)
        turn = await client.submit("s", "buy")
        journal = await Journal.open(world, "s", turn)
        agent = _Priced(new_code=True, suspend=False)
        request = ModelRequest(messages=[{"role": "user", "content": "buy"}])
        await journal.model(agent.model, request)
        assert journal.patched("price-recheck")
        await journal.model(agent.model, request)  # the marker rides with this outcome
        replay = await Journal.open(world, "s", turn)
        with pytest.raises(NonDeterminismError, match="price-recheck"):
            await _Priced(new_code=False, suspend=False).run_turn(replay)


class _FanOut(Agent):
    """The parent starts ``children`` lookups as child runs and waits for each; a child (its
    message ``lookup <n>``) replies ``value <n*n>``, or fails for ``lookup 13``."""

    def __init__(self, children: int) -> None:
        super().__init__(model=ScriptedModel(_echo))
        self.children = children
        self.child_runs: list[str] = []

    async def run_turn(self, journal: Journal) -> str:
        message = journal.user_message
        if journal.parent is not None:
            self.child_runs.append(message)
            n = int(message.removeprefix("lookup "))
            if n == 13:
                raise ModelReplyError("an unusable reply for 13", raw="?")  # fails the child
            return await journal.finish(f"value {n * n}")
        started = [await journal.start_child(f"lookup {n}") for n in range(self.children)]
        results = [await journal.wait_child(child, timeout=WAIT * 4) for child in started]
        parts = []
        for result in results:
            if result is None:
                parts.append("timeout")
            elif result.reply is not None:
                parts.append(result.reply.removeprefix("value "))
            else:
                parts.append(f"failed ({(result.failure or {}).get('error_type')})")
        return await journal.finish(",".join(parts))


class JournalChildContract(ContractBase):
    """Child runs: a turn fans out to runs of their own and waits without holding a worker."""

    contract_area: ClassVar[str] = "history"

    async def test_history_child_runs_fan_out_and_report_back_once(self, world: World) -> None:
        """A turn starts 30 child runs (each a session of its own) and waits for each; two
        workers run everything, so the waiting parent must not hold one. Every child runs
        once, its reply (or, for one, its failure) reaches the parent in order, and each
        child's start and end is recorded once."""
        client = Client(world, queue=QUEUE)
        agent = _FanOut(30)
        turn = await client.submit("parent", "fan out")
        stop = anyio.Event()
        with anyio.fail_after(WAIT * 3):
            async with anyio.create_task_group() as tg:
                for n in range(2):
                    worker = Worker(
                        world, agent, queue=QUEUE, lease=5, name=f"w{n}", crash=None, grace=0
                    )
                    tg.start_soon(partial(worker.run, stop=stop, signals=False))
                try:
                    reply = await client.wait("parent", turn, timeout=WAIT * 3)
                finally:
                    stop.set()
        expected = [str(n * n) for n in range(30)]
        expected[13] = "failed (ModelReplyError)"
        assert reply.split(",") == expected, reply
        assert sorted(agent.child_runs) == sorted(f"lookup {n}" for n in range(30)), (
            "a child ran more than once, or not at all"
        )
        starts = [o for o in await _events(world, "parent", "outcome") if o["kind"] == "spawn"]
        assert len(starts) == 30
        ends = [o for o in await _events(world, "parent", "outcome") if o["kind"] == "child"]
        assert len(ends) == 30

    @pytest.mark.parametrize("when", ["before_run", "after_run"])
    async def test_history_a_crash_while_starting_a_child_starts_it_once(
        self, world: World, when: Literal["before_run", "after_run"]
    ) -> None:
        """The parent's worker dies as it starts its first child (before, or after the child
        was submitted and before that was recorded): the child is started once and the turn
        ends with its result."""
        client = Client(world, queue=QUEUE)
        agent = _FanOut(1)
        turn = await client.submit("parent", "fan out")
        await _dies(_worker(world, agent, CrashPoint(0, when, in_process=True)))
        statuses = await _until_done(world, agent, turn)
        assert statuses[-1] == "done", statuses
        assert await client.reply("parent", turn) == "0"
        assert agent.child_runs == ["lookup 0"], agent.child_runs
