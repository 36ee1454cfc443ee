"""The worker classifies a turn's error once and leaves a record: each test fails on the worker
before the journal hardening (dbea8c3), which released every failed turn for another try and
told the client nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from world_core import (
    Agent,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    TurnResult,
    Worker,
    World,
    open_world,
    session_log_id,
    tool,
)
from world_core.errors import InvalidArgumentError, NotFoundError, TurnFailedError
from world_core.journal._client import resubmitted_turn_id, turn_message

pytestmark = pytest.mark.anyio

LOG = session_log_id("s")
WAIT = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="failures") as opened:
        yield opened


def echo(request: ModelRequest) -> ModelReply:
    return ModelReply(content=f"echo {request.messages[-1]['content']}")


async def run_once(worker: Worker) -> TurnResult:
    with anyio.fail_after(WAIT):
        result = await worker.run_once(wait=5.0)
    assert result is not None
    return result


async def failure_of(client: Client, turn: str) -> TurnFailedError:
    with anyio.fail_after(WAIT), pytest.raises(TurnFailedError) as caught:
        await client.wait("s", turn, timeout=WAIT)
    return caught.value


async def nothing_queued(world: World) -> bool:
    """No message left, delayed or dead: the turn's message was acked."""
    return (
        await world.queue.claim("turns", "probe", lease=5) == []
        and await world.queue.dead_letters("turns") == []
    )


async def test_nondeterminism_fails_the_turn_on_its_first_attempt(world: World) -> None:
    """Replaying a turn with changed code fails the same way every time: the failure is
    recorded at once and the message acked, instead of a retry loop that ends in the dead
    letters with no word to the client."""
    client = Client(world)
    turn = await client.submit("s", "hello")
    model = ScriptedModel(echo)
    # An earlier version of the agent ran step 0 and its worker died before the reply.
    journal = await Journal.open(world, "s", turn)
    earlier = Agent(model=model, system="v1")
    await journal.model(model, ModelRequest(messages=earlier.conversation(journal)))
    changed = Agent(model=model, system="v2")
    result = await run_once(Worker(world, changed, crash=None, max_attempts=5))
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("NonDeterminismError")
    assert len(model.calls) == 1  # nothing sent with the changed code
    assert await nothing_queued(world)
    error = await failure_of(client, turn)
    assert (error.error_type, error.attempts, error.step) == ("NonDeterminismError", 1, 0)
    assert error.session_id == "s"
    assert error.turn_id == turn
    assert await client.status("s", turn) == "failed"
    assert await client.reply("s", turn) is None
    assert (await client.failure("s", turn)) is not None
    assert await Worker(world, changed, crash=None).run_once() is None


async def test_an_agent_that_returns_without_finish_fails_the_turn(world: World) -> None:
    class Forgetful(Agent):
        async def run_turn(self, journal: Journal) -> str:
            request = ModelRequest(messages=[{"role": "user", "content": journal.user_message}])
            reply = await journal.model(self.model, request)
            return reply.content or ""  # no journal.finish: nothing says the turn is over

    client = Client(world)
    turn = await client.submit("s", "hello")
    result = await run_once(Worker(world, Forgetful(model=ScriptedModel(echo)), crash=None))
    assert result.status == "failed"
    assert result.reply is None
    assert await nothing_queued(world)
    error = await failure_of(client, turn)
    assert error.error_type == "TurnIncompleteError"
    assert "journal.finish" in error.error
    assert await client.status("s", turn) == "failed"
    assert await client.reply("s", turn) is None


@pytest.mark.parametrize("after", ["returns", "raises"])
async def test_a_recorded_reply_ends_the_turn_whatever_the_agent_does_after(
    world: World, after: str
) -> None:
    """The journal's reply is the turn's end. An agent that went on after ``finish`` made the
    worker report what it did instead: a return value (not even a str) as the reply, which
    the live ``reply`` event then failed to carry, or an error as a failure of a turn that
    ``Client.wait`` says replied."""

    class GoesOn(Agent):
        async def run_turn(self, journal: Journal) -> str:
            await journal.finish("recorded")
            if after == "raises":
                raise RuntimeError("after the reply")
            return "something else"

    client = Client(world)
    turn = await client.submit("s", "hello")
    result = await run_once(Worker(world, GoesOn(model=ScriptedModel(echo)), crash=None))
    assert (result.status, result.reply, result.error) == ("done", "recorded", None)
    assert await nothing_queued(world)
    assert await client.wait("s", turn, timeout=WAIT) == "recorded"
    assert await client.failure("s", turn) is None
    ends = []
    with anyio.fail_after(WAIT):
        async for event in client.events("s", turn, timeout=WAIT):
            ends.append((event.type, event.text, event.source))
    assert ends[-1] == ("reply", "recorded", "stream"), ends


async def test_an_unhandled_tool_error_fails_the_turn_at_the_tools_step(world: World) -> None:
    """The failure names the step whose recorded outcome is the error, as the error does."""

    def refund(order: str) -> str:
        """Refund an order."""
        raise LookupError(f"no order {order}")

    class Strict(Agent):
        async def run_turn(self, journal: Journal) -> str:
            journal.now()  # step 0
            result = await journal.call(tool(refund, replay="never"), {"order": "A1"})  # step 1
            return await journal.finish(str(result))

    client = Client(world)
    turn = await client.submit("s", "refund A1")
    result = await run_once(Worker(world, Strict(model=ScriptedModel(echo)), crash=None))
    assert result.status == "failed"
    assert await nothing_queued(world)
    error = await failure_of(client, turn)
    assert (error.error_type, error.attempts, error.step) == ("ToolError", 1, 1)
    assert "(step 1)" in error.error
    assert "LookupError: no order A1" in error.error


async def test_a_transient_model_error_is_retried_until_max_attempts_then_fails(
    world: World,
) -> None:
    def down(request: ModelRequest) -> ModelReply:
        raise ConnectionError("model down")

    client = Client(world)
    turn = await client.submit("s", "hello")
    model = ScriptedModel(down)
    worker = Worker(world, Agent(model=model), crash=None, retry_delay=0, max_attempts=3)
    statuses = [(await run_once(worker)).status for _ in range(3)]
    assert statuses == ["retry", "retry", "failed"]
    assert len(model.calls) == 3
    assert await nothing_queued(world)
    error = await failure_of(client, turn)
    assert (error.error_type, error.attempts) == ("ConnectionError", 3)
    assert error.error == "model down"
    assert await client.status("s", turn) == "failed"


async def test_a_turn_past_turn_timeout_fails(world: World) -> None:
    class Hanging:
        async def complete(self, request: ModelRequest) -> ModelReply:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    client = Client(world)
    turn = await client.submit("s", "hello")
    worker = Worker(world, Agent(model=Hanging()), crash=None, turn_timeout=0.3, max_attempts=5)
    result = await run_once(worker)
    assert result.status == "failed"
    assert await nothing_queued(world)
    error = await failure_of(client, turn)
    assert (error.error_type, error.attempts) == ("TurnTimeoutError", 1)
    assert "turn_timeout" in error.error
    assert await client.status("s", turn) == "failed"


async def test_a_turn_whose_failure_is_recorded_is_acked_at_once(world: World) -> None:
    """A worker recorded the failure and died before its ack: the next worker acks, runs
    nothing and records nothing more."""
    client = Client(world)
    turn = await client.submit("s", "hello")
    journal = await Journal.open(world, "s", turn)
    assert await journal.fail(RuntimeError("boom"), attempts=2)
    tail = await world.log.tail(LOG)
    model = ScriptedModel(echo)
    result = await run_once(Worker(world, Agent(model=model), crash=None))
    assert result.status == "failed"
    assert result.error == "RuntimeError: boom"
    assert model.calls == []
    assert await world.log.tail(LOG) == tail
    assert await nothing_queued(world)
    error = await failure_of(client, turn)
    assert (error.error_type, error.error, error.attempts) == ("RuntimeError", "boom", 2)


async def test_resubmit_makes_a_new_turn_with_the_same_message(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hello")
    await (await Journal.open(world, "s", turn)).fail("the tool was down")
    again = await client.resubmit("s", turn)
    assert again != turn
    assert await client.status("s", again) == "queued"
    assert (await Journal.open(world, "s", again)).user_message == "hello"
    worker = Worker(world, Agent(model=ScriptedModel(echo)), crash=None)
    old, new = await run_once(worker), await run_once(worker)
    assert (old.turn_id, old.status) == (turn, "failed")  # its message, still queued: acked
    assert (new.turn_id, new.status) == (again, "done")
    with anyio.fail_after(WAIT):
        assert await client.wait("s", again, timeout=WAIT) == "echo hello"
    assert await client.status("s", turn) == "failed"
    with pytest.raises(NotFoundError):
        await client.resubmit("s", "never-submitted")


async def test_a_retried_resubmit_queues_one_turn_and_runs_it_once(world: World) -> None:
    """A caller that retries ``resubmit`` (a timeout, a network error, a double click) gets
    the same new turn: its id is derived from the resubmitted turn's, and the submission is
    idempotent, so the turn is queued once and its model paid once. Each call made a new
    turn with a random id before, and the turn ran twice. Resubmitting the new turn names a
    newer one; ``new_turn_id`` names it explicitly."""
    client = Client(world)
    turn = await client.submit("s", "hello")
    await (await Journal.open(world, "s", turn)).fail("the tool was down")
    first = await client.resubmit("s", turn)
    assert await client.resubmit("s", turn) == first != turn
    assert first == resubmitted_turn_id(turn)
    model = ScriptedModel(echo)
    worker = Worker(world, Agent(model=model), crash=None)
    old, new = await run_once(worker), await run_once(worker)
    assert (old.turn_id, old.status) == (turn, "failed")
    assert (new.turn_id, new.status) == (first, "done")
    assert len(model.calls) == 1
    assert await nothing_queued(world)
    assert await client.resubmit("s", turn) == first  # after it ran: still it, not run again
    assert await nothing_queued(world)
    newer = await client.resubmit("s", first)
    assert newer not in (turn, first)
    assert await client.resubmit("s", turn, new_turn_id="mine") == "mine"
    assert await client.resubmit("s", turn, new_turn_id="mine") == "mine"
    with pytest.raises(InvalidArgumentError, match="new_turn_id"):
        await client.resubmit("s", turn, new_turn_id=turn)
    results = [await run_once(worker), await run_once(worker)]
    assert [(r.turn_id, r.status) for r in results] == [(newer, "done"), ("mine", "done")]
    assert len(model.calls) == 3
    assert await nothing_queued(world)


async def test_a_call_in_flight_on_the_last_delivery_leaves_a_record(world: World) -> None:
    """On its last delivery a turn that must wait for another worker's never call cannot be
    released (that would dead-letter it, leaving the client nothing to read): its failure is
    recorded instead."""

    def policy(request: ModelRequest) -> ModelReply:
        if any(m["role"] == "tool" for m in request.messages):
            return ModelReply(content="paid")
        return ModelReply(tool_calls=[ToolCall(id="c", name="pay", arguments='{"amount": 5}')])

    paid: list[int] = []

    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return "ok"

    agent = Agent(model=ScriptedModel(policy), tools=[tool(pay, replay="never", timeout=600.0)])
    client = Client(world, queue="intake")  # the turn's input; its message goes elsewhere
    turn = await client.submit("s", "pay me", turn_id="t")
    await world.queue.enqueue("turns", turn_message("s", turn), max_attempts=1)
    # A worker died right before the call; its deadline is ten minutes away.
    crashed = await Journal.open(world, "s", turn, crash=CrashPoint(1, "before_run", True))
    with pytest.raises(SimulatedCrash):
        await agent.run_turn(crashed)
    result = await run_once(Worker(world, agent, crash=None))
    assert result.status == "failed"
    assert paid == []
    assert await nothing_queued(world)
    error = await failure_of(client, turn)
    assert (error.error_type, error.attempts, error.step) == ("CallInFlightError", 1, 1)


async def test_a_waiting_turn_is_released_until_the_deadline_when_attempts_remain(
    world: World,
) -> None:
    """The same call in flight with deliveries left: released to come back after the deadline,
    no failure, no call."""

    def pay(amount: int) -> str:
        """Pay."""
        raise AssertionError("the call may still be running elsewhere")

    def policy(request: ModelRequest) -> ModelReply:
        return ModelReply(tool_calls=[ToolCall(id="c", name="pay", arguments='{"amount": 5}')])

    agent = Agent(model=ScriptedModel(policy), tools=[tool(pay, replay="never", timeout=600.0)])
    client = Client(world)
    turn = await client.submit("s", "pay me")
    crashed = await Journal.open(world, "s", turn, crash=CrashPoint(1, "before_run", True))
    with pytest.raises(SimulatedCrash):
        await agent.run_turn(crashed)
    result = await run_once(Worker(world, agent, crash=None))
    assert result.status == "waiting"
    assert await client.status("s", turn) == "running"
    assert await world.queue.claim("turns", "probe", lease=5) == []  # delayed, not dead
    assert await world.queue.dead_letters("turns") == []


async def test_a_turn_replied_before_its_ack_is_done_even_after_a_code_change(
    world: World,
) -> None:
    """The worker died between the reply and the ack, and the next one runs changed code: the
    turn is done (its reply is recorded), so it is acked as done, not reported as a failed
    replay."""
    client = Client(world)
    turn = await client.submit("s", "hello")
    model = ScriptedModel(echo)
    await Agent(model=model, system="v1").run_turn(await Journal.open(world, "s", turn))
    tail = await world.log.tail(LOG)
    result = await run_once(Worker(world, Agent(model=model, system="v2"), crash=None))
    assert (result.status, result.reply, result.error) == ("done", "echo hello", None)
    assert len(model.calls) == 1
    assert await world.log.tail(LOG) == tail
    assert await nothing_queued(world)
    assert await client.status("s", turn) == "done"
