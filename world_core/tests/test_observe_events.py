"""The live event stream of a turn: what a worker publishes, and Client.events following it
across reconnects and across a real worker process killed mid-turn."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from observe_support import REPLY, build  # type: ignore[import-not-found]  # PYTHONPATH

import world_core.journal._live
import world_core.journal._worker
from world_conformance.wrappers import PassThroughStream, PassThroughWorld
from world_core import (
    Agent,
    Client,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    ToolContext,
    TurnEvent,
    Worker,
    World,
    open_world,
    tool,
)
from world_core.errors import BackendUnavailableError, InvalidArgumentError, NotFoundError
from world_core.journal import StepInfo, TurnObserver, TurnRun, turn_events_stream
from world_core.observe import live_events
from world_core.spi import Stream

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
WAIT = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def folder(tmp_path: Path) -> str:
    return str(tmp_path / "world")


@pytest.fixture
async def world(folder: str) -> AsyncIterator[World]:
    async with open_world("local", url=folder, namespace="events") as opened:
        yield opened


async def _all(client: Client, turn: str, after: int | None = None) -> list[TurnEvent]:
    with anyio.fail_after(WAIT):
        return [event async for event in client.events("s", turn, after=after, timeout=WAIT)]


def _no_loss_no_twice(events: list[TurnEvent]) -> None:
    assert [event.position for event in events] == list(range(len(events)))


async def test_a_turn_streams_its_steps_text_and_reply(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "when is the launch?")
    result = await Worker(world, build(), crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    events = await _all(client, turn)
    _no_loss_no_twice(events)
    types = [event.type for event in events]
    assert types[0] == "started"
    assert types[-1] == "reply"
    assert events[-1].text == REPLY
    finished = [(e.step, e.kind, e.name) for e in events if e.type == "step_finished"]
    assert finished == [(0, "model", "model"), (1, "tool", "lookup"), (2, "model", "model")]
    tool_start = next(e for e in events if e.type == "step_started" and e.kind == "tool")
    assert tool_start.arguments == {"topic": "launch"}
    assert tool_start.call_id == "call_7"
    assert tool_start.replay == "safe"
    tool_end = next(e for e in events if e.type == "step_finished" and e.kind == "tool")
    assert tool_end.output == "note about launch: Thursday 10:00"
    assert tool_end.recorded is False  # a safe outcome rides with the next append
    text = "".join(e.text or "" for e in events if e.type == "text")
    assert text == REPLY
    assert {e.worker for e in events} == {result_worker(events)}
    assert (await world.stream.info(turn_events_stream("s", turn))).closed


def result_worker(events: list[TurnEvent]) -> str | None:
    return events[0].worker


async def test_a_reader_that_reconnects_misses_nothing_and_sees_nothing_twice(
    world: World,
) -> None:
    client = Client(world)
    turn = await client.submit("s", "when is the launch?")
    seen: list[TurnEvent] = []

    async def follow_with_disconnects() -> None:
        last: int | None = None
        while True:
            with anyio.fail_after(WAIT):
                async for event in client.events("s", turn, after=last, timeout=WAIT):
                    seen.append(event)
                    last = event.position
                    if event.type == "reply":
                        return
                    if event.position % 3 == 2:
                        break  # drop the connection every third event, reconnect after it

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow_with_disconnects)
        await anyio.sleep(0.05)
        await Worker(world, build(), crash=None).run_once(wait=WAIT)
    _no_loss_no_twice(seen)
    assert seen == await _all(client, turn)
    assert await _all(client, turn, after=seen[-2].position) == [seen[-1]]


async def test_a_killed_worker_is_resumed_in_the_same_stream(
    world: World, folder: str, tmp_path: Path
) -> None:
    """A worker process dies (CRASH_AT, os._exit) after step 2's model call streamed its text
    and before its outcome was written; another worker takes the turn over. A reader following
    all along sees one stream: the first run, a resumed marker, the replayed step, new work."""
    client = Client(world)
    turn = await client.submit("s", "when is the launch?")
    seen: list[TurnEvent] = []

    async def follow() -> None:
        with anyio.fail_after(WAIT * 2):
            async for event in client.events("s", turn, timeout=WAIT * 2):
                seen.append(event)

    env = dict(os.environ, CRASH_AT="2:after_run")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "world_core._cli", "worker", "--once", "--lease", "1"]
    command += ["--agent", "observe_support:build", "--world", "local", "--url", folder]
    command += ["--namespace", "events"]
    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        done = await anyio.run_process(command, env=env, check=False)
        assert done.returncode == 1, done.stderr.decode(errors="replace")
        result = await Worker(world, build(), crash=None, name="rescuer").run_once(wait=WAIT)
        assert result is not None
        assert result.status == "done"
    _no_loss_no_twice(seen)
    assert seen == await _all(client, turn)
    first = [e for e in seen if e.worker != "rescuer"]
    second = [e for e in seen if e.worker == "rescuer"]
    assert seen[: len(first)] == first  # the first run's events, then the second's
    assert first[0].type == "started"
    # Streamed, then lost with the process (what was still queued in it was never written).
    assert REPLY.startswith("".join(e.text or "" for e in first if e.type == "text"))
    assert not any(e.type in ("reply", "run_ended") for e in first)
    assert second[0].type == "resumed"
    assert second[0].step == 1
    assert second[0].attempt == 2
    assert [(e.type, e.step) for e in second if e.type == "step_replayed"] == [("step_replayed", 0)]
    # Step 1's safe outcome rode with step 2's, which the crash lost: both run again, live.
    assert [e.step for e in second if e.type == "step_finished"] == [1, 2]
    assert not any(e.step == 0 for e in second if e.type in ("step_started", "step_finished"))
    assert second[-1].type == "reply"
    assert second[-1].text == REPLY


class Broken(TurnObserver):
    """Raises from every callback."""

    def run_started(self, run: TurnRun) -> None:
        raise RuntimeError("observer down")

    def step_started(self, step: StepInfo) -> None:
        raise RuntimeError("observer down")

    def step_finished(
        self, step: StepInfo, result: Mapping[str, Any], state: Mapping[str, Any], recorded: bool
    ) -> None:
        raise RuntimeError("observer down")

    def model_text(self, step: int, delta: str, retry: int) -> None:
        raise RuntimeError("observer down")

    async def serve(self) -> None:
        raise RuntimeError("observer down")

    async def aclose(self) -> None:
        await anyio.sleep_forever()  # a stuck observer: the worker's deadline ends it


async def test_a_failing_or_stuck_observer_neither_fails_nor_blocks_the_turn(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world_core.journal._worker, "OBSERVER_CLOSE_SECONDS", 0.5)

    def broken_factory(world: World, run: TurnRun) -> TurnObserver:
        raise RuntimeError("factory down")

    client = Client(world)
    turn = await client.submit("s", "when is the launch?")
    worker = Worker(
        world,
        build(),
        crash=None,
        observers=[broken_factory, lambda world, run: Broken(), live_events],
    )
    with anyio.fail_after(WAIT):
        result = await worker.run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    events = await _all(client, turn)
    assert events[-1].type == "reply"


async def test_without_events_a_reader_still_ends_with_the_journal(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that publishes nothing (observers=[]): the reader finds the end in the journal."""
    monkeypatch.setattr(world_core.journal._live, "CHECK_SECONDS", 0.2)
    client = Client(world)
    turn = await client.submit("s", "when is the launch?")
    await Worker(world, build(), crash=None, observers=[]).run_once(wait=WAIT)
    events = await _all(client, turn)
    assert [(e.type, e.source, e.text) for e in events] == [("reply", "journal", REPLY)]


async def test_a_turn_never_submitted_is_not_found(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world_core.journal._live, "CHECK_SECONDS", 0.2)
    with anyio.fail_after(WAIT), pytest.raises(NotFoundError, match="never submitted"):
        async for _ in Client(world).events("s", "nope", timeout=WAIT):
            pass


async def test_bad_arguments_are_refused_at_the_call(world: World) -> None:
    client = Client(world)
    with pytest.raises(InvalidArgumentError, match="after"):
        client.events("s", "t", after=-2)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        client.events("s", "t", timeout=0)
    with pytest.raises(InvalidArgumentError, match="observers"):
        # why: the wrong type is the point: its refusal is tested
        Worker(world, build(), observers=[object()])  # type: ignore[list-item]


class BrokenEventStream(PassThroughStream):
    """The World's stream, except that writes of turn events fail (``down``) or hang."""

    def __init__(self, inner: Stream, how: str) -> None:
        super().__init__(inner)
        self.how = how
        self.tried = 0

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        if stream_id.startswith("turn-events/"):
            self.tried += 1
            if self.how == "down":
                raise BackendUnavailableError("stream server down (injected)")
            await anyio.sleep_forever()
        return await super().write(stream_id, chunks, expect_next=expect_next)


@pytest.mark.parametrize("how", ["down", "hanging"])
async def test_a_failing_or_hanging_event_stream_costs_the_turn_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Publishing is best effort: writes that fail are dropped, writes that hang are cut off
    at the worker's close deadline; the turn finishes, and a reader gets its end from the
    journal."""
    monkeypatch.setattr(world_core.journal._worker, "OBSERVER_CLOSE_SECONDS", 0.5)
    monkeypatch.setattr(world_core.journal._live, "CHECK_SECONDS", 0.2)
    broken = BrokenEventStream(world.stream, how)
    client = Client(world)
    turn = await client.submit("s", "when is the launch?")
    with anyio.fail_after(WAIT):
        result = await Worker(PassThroughWorld(world, stream=broken), build(), crash=None).run_once(
            wait=WAIT
        )
    assert result is not None
    assert result.status == "done"
    assert broken.tried >= 1
    events = await _all(client, turn)
    assert [(e.type, e.source) for e in events] == [("reply", "journal")]


def _plan_policy(request: ModelRequest) -> ModelReply:
    if any(m["role"] == "tool" for m in request.messages):
        return ModelReply(content="planned", usage={"prompt_tokens": 12, "completion_tokens": 2})
    call = ToolCall(id="call_p", name="plan", arguments=json.dumps({"step": "write the note"}))
    return ModelReply(tool_calls=[call])


def plan(step: str, context: ToolContext) -> str:
    """Add a step to the plan (a value committed with the call)."""
    context.stage("doc/plan", {"steps": [step]})
    return "added"


async def test_committed_state_is_published_with_its_step(world: World) -> None:
    """What a tool stages (documents, files: ``context.stage``) is published as a ``state``
    event once the call's outcome is kept, after its ``step_finished``."""
    client = Client(world)
    turn = await client.submit("s", "plan it")
    agent = Agent(model=ScriptedModel(_plan_policy), tools=[tool(plan, replay="never")])
    result = await Worker(world, agent, crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    events = await _all(client, turn)
    kinds = [(e.type, e.step) for e in events if e.type in ("step_finished", "state")]
    assert kinds == [("step_finished", 0), ("step_finished", 1), ("state", 1), ("step_finished", 2)]
    state = next(e for e in events if e.type == "state")
    assert (state.state_name, state.value) == ("doc/plan", {"steps": ["write the note"]})
    never = next(e for e in events if e.type == "step_finished" and e.step == 1)
    assert never.recorded is True  # a never call's outcome is appended at once
    assert never.replay == "never"
    assert never.key == f"s/{turn}/step-1"


def _refusing_policy(request: ModelRequest) -> ModelReply:
    raise InvalidArgumentError("this model refuses every request (a test)")


async def test_a_failed_turn_ends_its_stream_with_the_failure(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hi")
    agent = Agent(model=ScriptedModel(_refusing_policy))
    result = await Worker(world, agent, crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "failed"
    events = await _all(client, turn)
    assert [e.type for e in events] == ["started", "step_started", "failed"]
    assert events[-1].error is not None
    assert "refuses every request" in events[-1].error
    assert (await world.stream.info(turn_events_stream("s", turn))).closed
