"""Review findings: interleavings the journal's rules must survive, on the local World."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_core import (
    Agent,
    Client,
    Journal,
    Lease,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    TurnResult,
    Worker,
    World,
    open_world,
    tool,
)
from world_core.errors import BackendUnavailableError, ToolError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="review") as opened:
        yield opened


@pytest.fixture
async def turn(world: World) -> str:
    return await Client(world).submit("s", "hello", turn_id="t")


class FlakyModel:
    """Fails its first ``failures`` calls (a 429, a timeout), then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("429 Too Many Requests")
        return ModelReply(content=f"answer to {len(request.messages)} messages")


async def retrying_turn(journal: Journal, model: Any, *, finish: bool = True) -> str:
    """Agent code with the usual retry around the model call; ``finish=False`` stops (as a
    crash would) right after the model call is recorded."""
    request = ModelRequest(messages=[{"role": "user", "content": journal.user_message}])
    for _ in range(3):
        try:
            reply = await journal.model(model, request)
            break
        except RuntimeError:
            continue
    else:
        raise AssertionError("the model never answered")
    return await journal.finish(reply.content or "") if finish else reply.content or ""


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "crashed-before-reply"])
async def test_a_failed_model_call_retried_by_the_code_keeps_its_step(
    world: World, turn: str, finished: bool
) -> None:
    """A call that raised recorded nothing: the retry is the same step, so a replay reads
    the answer back instead of paying for it again and then diverging."""
    first = await Journal.open(world, "s", turn)
    reply = await retrying_turn(first, FlakyModel(failures=1), finish=finished)
    off = FlakyModel(failures=1_000_000)  # the model client switched off
    replay = await Journal.open(world, "s", turn)
    assert await retrying_turn(replay, off) == reply
    assert off.calls == 0


@pytest.mark.parametrize(
    "value",
    [{"score": math.nan}, {"ratio": math.inf}],
    ids=["nan", "inf"],
)
async def test_a_never_tool_returning_unencodable_json_records_an_error_outcome(
    world: World, turn: str, value: Any
) -> None:
    """The tool ran: its outcome must be recorded (as an error), not lost to an exception
    after the side effect, which a replay would report as 'may or may not have happened'."""
    runs: list[str] = []

    def pay(amount: int) -> Any:
        """Pay."""
        runs.append("paid")
        return value

    pay_tool = tool(pay, replay="never")
    first = await Journal.open(world, "s", turn)
    with pytest.raises(ToolError, match="not JSON") as caught:
        await first.call(pay_tool, {"amount": 5})
    replay = await Journal.open(world, "s", turn)
    with pytest.raises(ToolError) as again:
        await replay.call(pay_tool, {"amount": 5})
    assert again.value.error == caught.value.error
    assert runs == ["paid"]


async def test_a_worker_that_cannot_renew_stops_before_its_lease_runs_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A's renewals fail (the queue is unreachable, the model is not). Its lease runs
    out and worker B takes the turn. A must stop on its own by then: going on, it pays for
    model calls that B pays for too, a doubled bill for the same step."""
    url = str(tmp_path / "world")
    async with (
        open_world("local", url=url, namespace="review") as world_a,
        open_world("local", url=url, namespace="review") as world_b,
    ):

        async def cannot_renew(lease: Lease, duration: float) -> Lease:
            raise BackendUnavailableError("queue unreachable")

        monkeypatch.setattr(world_a.queue, "renew", cannot_renew)

        def policy(request: ModelRequest) -> ModelReply:
            if any(m["role"] == "tool" for m in request.messages):
                return ModelReply(content="done")
            return ModelReply(tool_calls=[ToolCall(id="c", name="slow", arguments="{}")])

        working = anyio.Event()

        async def slow() -> str:
            """Take a while."""
            working.set()
            await anyio.sleep(2.0)
            return "slow result"

        model = ScriptedModel(policy)
        agent = Agent(model=model, tools=[tool(slow, replay="safe")])
        await Client(world_a).submit("s", "hi", turn_id="t")
        a = Worker(world_a, agent, lease=1.0, crash=None, name="a")
        b = Worker(world_b, agent, lease=10.0, crash=None, name="b")
        results: dict[str, TurnResult | None] = {}

        async def run_a() -> None:
            results["a"] = await a.run_once(wait=5.0)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_a)
                # A holds the turn (it runs step 1); B claims it once A's lease has run out.
                # (B began after a fixed 1.3 s: had A not claimed by then, under load, B took
                # the turn first and A found none.)
                await working.wait()
                results["b"] = await b.run_once(wait=30.0)
        result_a, result_b = results["a"], results["b"]
        assert result_a is not None
        assert result_b is not None
        assert result_a.status == "lease_lost"
        assert result_b.status == "done"
        # One model call per step: step 0 by A, step 2 by B (step 0 read back).
        assert len(model.calls) == 2
