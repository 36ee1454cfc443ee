"""ObserveContract: a turn's live events on the World under test.

Workers run in this process; a crash is a :class:`~world_core.CrashPoint` with
``in_process=True``. What is checked is what a reader of ``Client.events`` relies on: the
events of every run of a turn are one stream, positions dense from 0, readable again from any
position (nothing missed, nothing twice), ending with the reply; a run that takes over after a
crash says so and reports the steps it read back as replayed, not as new work.
"""

from __future__ import annotations

import json
from typing import ClassVar

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import WAIT
from world_core import (
    Agent,
    Client,
    CrashPoint,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    TurnEvent,
    Worker,
    World,
    tool,
)

__all__ = ["ObserveContract"]

REPLY = "The launch is on Thursday at ten."


def _policy(request: ModelRequest) -> ModelReply:
    if any(m["role"] == "tool" for m in request.messages):
        return ModelReply(content=REPLY)
    call = ToolCall(id="c1", name="lookup", arguments=json.dumps({"topic": "launch"}))
    return ModelReply(tool_calls=[call])


def lookup(topic: str) -> str:
    """Read a note."""
    return f"note about {topic}"


def _agent() -> Agent:
    return Agent(model=ScriptedModel(_policy), tools=[tool(lookup, replay="safe")])


async def _events(client: Client, turn: str, after: int | None = None) -> list[TurnEvent]:
    with anyio.fail_after(WAIT):
        return [e async for e in client.events("s", turn, after=after, timeout=WAIT)]


class ObserveContract(ContractBase):
    """The live event stream of turns (``Client.events``) on the World under test."""

    contract_area: ClassVar[str] = "observe"

    async def test_observe_events_resume_from_any_position(self, world: World) -> None:
        """A turn's events: dense positions, the model's text, the reply last; a reader
        resuming after any position gets exactly the events after it."""
        client = Client(world)
        turn = await client.submit("s", "when is the launch?")
        with anyio.fail_after(WAIT):
            result = await Worker(world, _agent(), crash=None).run_once(wait=WAIT)
        assert result is not None
        assert result.status == "done", result
        events = await _events(client, turn)
        positions = [e.position for e in events]
        assert positions == list(range(len(events))), f"positions are not dense: {positions}"
        assert events[0].type == "started"
        assert events[-1].type == "reply", "the stream must end with the reply"
        assert events[-1].text == REPLY
        assert "".join(e.text or "" for e in events if e.type == "text") == REPLY
        for after in (0, len(events) // 2, len(events) - 2):
            assert await _events(client, turn, after) == events[after + 1 :], (
                f"resuming after position {after} must give exactly the events after it"
            )

    async def test_observe_a_takeover_continues_the_stream(self, world: World) -> None:
        """A run dies after step 2's model call (before its outcome is written); another
        worker takes over: one stream, a ``resumed`` event at step 1, step 0 replayed and never
        shown as new work by the second run, the reply last."""
        client = Client(world)
        turn = await client.submit("s", "when is the launch?")
        crashing = Worker(
            world,
            _agent(),
            lease=0.5,
            heartbeat=False,
            crash=CrashPoint(2, "after_run", in_process=True),
            name="first",
        )
        with anyio.fail_after(WAIT):
            try:
                await crashing.run_once(wait=WAIT)
            except BaseException as exc:  # a SimulatedCrash inside the worker's task group
                group = exc if isinstance(exc, BaseExceptionGroup) else None
                if (group or BaseExceptionGroup("", [exc])).subgroup(SimulatedCrash) is None:
                    raise
            else:
                pytest.fail("the first worker did not reach its crash point")
            result = await Worker(world, _agent(), crash=None, name="second").run_once(wait=WAIT)
        assert result is not None
        assert result.status == "done", result
        events = await _events(client, turn)
        assert [e.position for e in events] == list(range(len(events)))
        second = [e for e in events if e.worker == "second"]
        assert events[-len(second) :] == second, "the second run's events follow the first's"
        assert second[0].type == "resumed"
        assert (second[0].step, second[0].attempt) == (1, 2)
        assert [e.step for e in second if e.type == "step_replayed"] == [0]
        assert 0 not in [e.step for e in second if e.type in ("step_started", "step_finished")]
        assert events[-1].type == "reply"
        assert events[-1].text == REPLY
