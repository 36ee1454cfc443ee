"""Journal.step: the general hook that runs any named call as a model or tool step."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from world_core import (
    POSSIBLY_RAN,
    Client,
    CrashPoint,
    Journal,
    SimulatedCrash,
    ToolContext,
    World,
    open_world,
    session_log_id,
)
from world_core.errors import (
    InvalidArgumentError,
    ModelReplyError,
    NonDeterminismError,
    PossiblyRanError,
    ToolError,
)

pytestmark = pytest.mark.anyio

LOG = session_log_id("s")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="step") as opened:
        yield opened


@pytest.fixture
async def turn(world: World) -> str:
    return await Client(world).submit("s", "hello", turn_id="t")


async def test_model_and_tool_steps_append_like_model_and_call(world: World, turn: str) -> None:
    """A model step appends its outcome at once; a never step its intent before the call
    (the call sees it durable) and its outcome after; a safe step rides with the next append."""
    journal = await Journal.open(world, "s", turn)
    tails = [await world.log.tail(LOG)]
    calls: list[str] = []

    async def reply(context: ToolContext | None) -> dict[str, Any]:
        assert context is None
        calls.append("model")
        return {"text": "hi"}

    assert await journal.step("model", "chat", reply, input={"m": 1}) == {"text": "hi"}
    tails.append(await world.log.tail(LOG))

    async def lookup(context: ToolContext | None) -> str:
        return "found"

    assert await journal.step("tool", "lookup", lookup, input=["a"]) == "found"
    tails.append(await world.log.tail(LOG))
    seen: list[int] = []

    async def send(context: ToolContext | None) -> str:
        assert context is not None
        seen.append(await world.log.tail(LOG))
        return context.idempotency_key

    key = await journal.step("tool", "send", send, input={"to": "x"}, replay="never")
    tails.append(await world.log.tail(LOG))
    assert key == "s/t/step-2"
    assert [b - a for a, b in itertools.pairwise(tails)] == [1, 0, 3]
    assert seen == [tails[-2] + 2]  # the safe outcome and the never intent, before the call
    assert (journal.model_calls, journal.tool_runs) == (1, 2)

    replay = await Journal.open(world, "s", turn)

    async def never(context: ToolContext | None) -> Any:
        raise AssertionError("a recorded step must not run")

    assert await replay.step("model", "chat", never, input={"m": 1}) == {"text": "hi"}
    assert await replay.step("tool", "lookup", never, input=["a"]) == "found"
    assert await replay.step("tool", "send", never, input={"to": "x"}, replay="never") == key
    assert (replay.model_calls, replay.tool_runs, replay.replayed) == (0, 0, 3)
    assert calls == ["model"]


async def test_an_input_in_its_json_form_is_the_step_s(world: World, turn: str) -> None:
    """An input pydantic turns into JSON (a set, a model, a date) is digested in that form,
    so it must be recorded in it too: recording the value itself raised a bare TypeError
    ("Object of type set is not JSON serializable") after the digest had taken it."""
    journal = await Journal.open(world, "s", turn)

    async def ask(context: ToolContext | None) -> str:
        return "asked"

    assert await journal.step("model", "chat", ask, input={"tags": {"b"}}) == "asked"
    assert await journal.step("tool", "look", ask, input={"b"}, replay="never") == "asked"
    replay = await Journal.open(world, "s", turn)

    async def never(context: ToolContext | None) -> str:
        raise AssertionError("a recorded step must not run")

    assert await replay.step("model", "chat", never, input={"tags": ["b"]}) == "asked"
    assert await replay.step("tool", "look", never, input=["b"], replay="never") == "asked"


async def test_a_different_step_at_a_position_is_refused(world: World, turn: str) -> None:
    journal = await Journal.open(world, "s", turn)

    async def value(context: ToolContext | None) -> int:
        return 1

    await journal.step("model", "chat", value, input={"m": 1})
    replay = await Journal.open(world, "s", turn)
    with pytest.raises(NonDeterminismError):
        await replay.step("model", "chat", value, input={"m": 2})
    replay = await Journal.open(world, "s", turn)
    with pytest.raises(NonDeterminismError):
        await replay.step("tool", "chat", value, input={"m": 1})


async def test_an_interrupted_never_step_does_not_run_again(world: World, turn: str) -> None:
    runs: list[int] = []

    async def send(context: ToolContext | None) -> str:
        runs.append(1)
        return "sent"

    crashed = await Journal.open(world, "s", turn, crash=CrashPoint(0, "after_run", True))
    with pytest.raises(SimulatedCrash):
        await crashed.step("tool", "send", send, replay="never", timeout=0.01)
    later = time.time() + 5  # past the call's deadline and the clock margin
    journal = await Journal.open(world, "s", turn, clock=lambda: later)
    with pytest.raises(PossiblyRanError) as caught:
        await journal.step("tool", "send", send, replay="never", timeout=0.01)
    assert caught.value.error == POSSIBLY_RAN
    assert runs == [1]


async def test_a_failing_tool_step_is_recorded_and_a_model_error_is_not(
    world: World, turn: str
) -> None:
    async def broken(context: ToolContext | None) -> str:
        raise RuntimeError("down")

    journal = await Journal.open(world, "s", turn)
    with pytest.raises(RuntimeError):
        await journal.step("model", "chat", broken)
    with pytest.raises(ToolError, match="RuntimeError: down"):
        await journal.step("tool", "act", broken, replay="safe")  # step 0 again: no hole
    replay = await Journal.open(world, "s", turn, defer_safe=False)

    async def fine(context: ToolContext | None) -> str:
        return "ok"

    assert await replay.step("model", "chat", fine) == "ok"


async def test_an_unusable_paid_reply_of_a_model_step_is_recorded(world: World, turn: str) -> None:
    """A model step whose call raises ModelReplyError (the server answered, so it was paid
    for, with what the adapter cannot use) records it: a replay raises it again and calls
    nothing. It was not recorded before, so each redelivery of the turn paid again."""
    calls: list[int] = []

    async def unusable(context: ToolContext | None) -> str:
        calls.append(1)
        raise ModelReplyError("the reply names no known tool", raw="{...}")

    journal = await Journal.open(world, "s", turn)
    with pytest.raises(ModelReplyError, match="names no known tool"):
        await journal.step("model", "chat", unusable, input={"m": 1})
    replay = await Journal.open(world, "s", turn)
    with pytest.raises(ModelReplyError, match="names no known tool") as raised:
        await replay.step("model", "chat", unusable, input={"m": 1})
    assert raised.value.raw == "{...}"
    assert calls == [1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "agent"}, "kind must be"),
        ({"name": ""}, "name must be"),
        ({"replay": "maybe"}, "replay must be"),
        ({"timeout": 0}, "timeout must be"),
        ({"input": object()}, "input is not JSON"),
    ],
)
async def test_bad_arguments_are_refused_before_anything_is_written(
    world: World, turn: str, kwargs: dict[str, Any], match: str
) -> None:
    journal = await Journal.open(world, "s", turn)
    tail = await world.log.tail(LOG)

    async def value(context: ToolContext | None) -> int:
        return 1

    arguments: dict[str, Any] = {"kind": "tool", "name": "act", "fn": value, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        await journal.step(**arguments)
    assert await world.log.tail(LOG) == tail
    assert journal.position == 0
