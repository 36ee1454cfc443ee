"""world_core.integrations.openai_agents beyond the SDK's own tests: WorldSession's bounded
reads, pops and clears under concurrent writers on every backend, large items, bad input; and
what DurableAgent refuses when it is built."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import pytest
from agents import (
    Agent,
    AgentHooks,
    Model,
    ModelProvider,
    ModelResponse,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import ModelBehaviorError, UserError
from agents.items import TResponseOutputItem, TResponseStreamEvent
from journal_support import stall_once  # type: ignore[import-not-found]  # PYTHONPATH
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from world_conformance import ContractBase
from world_core import (
    Client,
    InvalidArgumentError,
    Journal,
    ModelReplyError,
    Replay,
    Worker,
    World,
)
from world_core.integrations.openai_agents import DurableAgent, WorldSession, tool_context
from world_core.spi import Event

set_tracing_disabled(True)


def _item(n: int) -> Any:
    return {"role": "user", "content": f"m{n}"}


def _contents(items: list[Any]) -> list[str]:
    return [str(item["content"]) for item in items]


class _SessionContract(ContractBase):
    contract_area = "openai-agents"

    async def test_limited_reads_do_not_scan_the_log(
        self, world: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        session = WorldSession(world, "long")
        for start in range(0, 400, 100):
            await session.add_items([_item(n) for n in range(start, start + 100)])
        for _ in range(5):
            await session.pop_item()  # m399 .. m395
        read: list[int] = []
        original = world.log.read

        async def counting(log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
            events = await original(log_id, after=after, limit=limit)
            read.append(len(events))
            return events

        monkeypatch.setattr(world.log, "read", counting)
        assert _contents(await session.get_items(limit=3)) == ["m392", "m393", "m394"]
        assert sum(read) <= 3 + 5 + 16, read  # the items, the pops, one window's slack
        read.clear()
        popped: Any = await session.pop_item()
        assert popped is not None
        assert popped["content"] == "m394"
        assert sum(read) <= 16, read
        read.clear()
        assert len(await session.get_items()) == 394  # all of it: the whole log, as it must

    async def test_concurrent_pops_never_return_one_item_twice(self, world: World) -> None:
        first, second = WorldSession(world, "shared"), WorldSession(world, "shared")
        await first.add_items([_item(n) for n in range(8)])
        popped: list[Any] = []

        async def pop(session: WorldSession) -> None:
            popped.append(await session.pop_item())

        async with anyio.create_task_group() as tg:
            for n in range(10):
                tg.start_soon(pop, first if n % 2 else second)
        found = [item for item in popped if item is not None]
        assert sorted(_contents(found)) == sorted(f"m{n}" for n in range(8))
        assert popped.count(None) == 2
        assert await first.get_items() == []

    async def test_pops_racing_adds_lose_nothing(self, world: World) -> None:
        session = WorldSession(world, "racing")
        await session.add_items([_item(n) for n in range(6)])
        popped: list[Any] = []

        async def pop() -> None:
            popped.append(await session.pop_item())

        async def add(n: int) -> None:
            await WorldSession(world, "racing").add_items([_item(n)])

        async with anyio.create_task_group() as tg:
            for n in range(6, 12):
                tg.start_soon(add, n)
                tg.start_soon(pop)
        left = _contents(await session.get_items())
        taken = _contents([item for item in popped if item is not None])
        assert Counter(left) + Counter(taken) == Counter(f"m{n}" for n in range(12))
        assert len(set(taken)) == len(taken)

    async def test_clear_keeps_what_comes_after(self, world: World) -> None:
        session = WorldSession(world, "cleared")
        await session.add_items([_item(1), _item(2)])
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([_item(3)])
        assert _contents(await session.get_items()) == ["m3"]
        assert _contents(await session.get_items(limit=5)) == ["m3"]

    async def test_large_items_go_to_blobs(self, world: World) -> None:
        session = WorldSession(world, "large")
        big: Any = {"role": "user", "content": "x" * 200_000}
        await session.add_items([_item(1), big, _item(2)])
        items = await session.get_items()
        assert items[1] == big
        assert _contents(items[::2]) == ["m1", "m2"]
        assert len(max((e.data for e in await world.log.read(session.log_id)), key=len)) < 1000
        await session.pop_item()
        assert await session.pop_item() == big


class TestLocalSession(_SessionContract):
    world_name = "local"


class TestPostgresSession(_SessionContract):
    world_name = "postgres"


class TestRedisSession(_SessionContract):
    world_name = "redis"


class TestMongoSession(_SessionContract):
    world_name = "mongo"


class TestTursoSession(_SessionContract):
    world_name = "turso"


# -- bad input, refused before anything is written ----------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_session_refuses_bad_input(world: World) -> None:
    with pytest.raises(InvalidArgumentError, match="world must be an open World"):
        # why: the wrong type is the point: its refusal is tested
        WorldSession("not a world", "s")  # type: ignore[arg-type]
    session = WorldSession(world, "bad")
    with pytest.raises(InvalidArgumentError, match="item 1 must be a JSON object"):
        # why: the wrong type is the point: its refusal is tested
        await session.add_items([_item(1), "text"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="item 0 is not JSON"):
        await session.add_items([cast(Any, {"role": "user", "content": float("nan")})])
    assert await world.log.tail(session.log_id) == 0  # nothing half written
    with pytest.raises(InvalidArgumentError, match="limit must be an int"):
        # why: the wrong type is the point: its refusal is tested
        await session.get_items(limit="3")  # type: ignore[arg-type]


world_name = "local"  # the module-level tests above run on the local World


@function_tool
def lookup(topic: str) -> str:
    """Look a topic up.

    Args:
        topic: what to look up.
    """
    return topic


@function_tool
def send(to: str) -> str:
    """Send something.

    Args:
        to: the recipient.
    """
    return to


def test_durable_agent_requires_a_label_per_function_tool() -> None:
    agent = Agent(name="a", tools=[lookup, send])
    with pytest.raises(InvalidArgumentError, match=r"replay=\{'send': \.\.\.\}"):
        DurableAgent(agent, replay={"lookup": "safe"})
    with pytest.raises(InvalidArgumentError, match="replay must be 'safe'"):
        # why: the wrong type is the point: its refusal is tested
        DurableAgent(agent, replay={"lookup": "safe", "send": "once"})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="no function tool named 'mail'"):
        DurableAgent(agent, replay={"lookup": "safe", "send": "never", "mail": "never"})
    for seconds in (0, float("nan"), float("inf")):  # nan and inf were taken, and refused
        with pytest.raises(InvalidArgumentError, match="timeout must be a finite number"):
            DurableAgent(  # by the journal at the first call, failing the turn
                agent, replay={"lookup": "safe", "send": "never"}, timeouts={"send": seconds}
            )
        with pytest.raises(InvalidArgumentError, match="approval_timeout must be a finite"):
            DurableAgent(
                agent, replay={"lookup": "safe", "send": "never"}, approval_timeout=seconds
            )
    with pytest.raises(InvalidArgumentError, match="handoffs"):
        DurableAgent(Agent(name="b", handoffs=[agent]), replay={})
    durable = DurableAgent(agent, replay={"lookup": "safe", "send": "never"})
    assert durable.labels == {"lookup": "safe", "send": "never"}


def test_tool_context_outside_a_durable_call_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="inside a function tool of a DurableAgent"):
        tool_context()


class _EchoModel(Model):
    """Answers with the number of user messages it was sent: enough to see the history."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        items = args[1]
        users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
        text = ResponseOutputText(type="output_text", text=f"{len(users)} user", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="m", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


class _Provider(ModelProvider):
    def __init__(self) -> None:
        self.model = _EchoModel()
        self.names: list[str | None] = []

    def get_model(self, model_name: str | None) -> Model:
        self.names.append(model_name)
        return self.model


@pytest.mark.anyio
async def test_models_from_a_provider_are_journaled_and_turns_see_earlier_ones(
    world: World,
) -> None:
    provider = _Provider()
    durable = DurableAgent(Agent(name="echo", model="echo-1"), replay={}, model_provider=provider)
    client = Client(world)
    for turn in ("t1", "t2"):
        await client.submit("chat", f"hello {turn}", turn_id=turn)
        result = await Worker(world, durable, crash=None).run_once(wait=5)
        assert result is not None
        assert result.status == "done"
    assert await client.reply("chat", "t1") == "1 user"
    assert await client.reply("chat", "t2") == "2 user"  # the earlier turn's message too
    assert provider.names == ["echo-1", "echo-1"]
    assert provider.model.calls == 2
    journal = await Journal.open(world, "chat", "t2")  # replayed from the journal: no call
    assert await durable.run_turn(journal) == "2 user"
    assert provider.model.calls == 2


@pytest.mark.anyio
async def test_journal_approval_refuses_bad_input_before_recording(world: World) -> None:
    await Client(world).submit("ask", "hi", turn_id="t1")
    journal = await Journal.open(world, "ask", "t1")
    with pytest.raises(InvalidArgumentError, match="name must be a non-empty str"):
        await journal.approval("", {}, timeout=10)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        await journal.approval("send", {}, timeout=0)
    with pytest.raises(InvalidArgumentError, match="arguments must be a JSON object"):
        await journal.approval("send", cast(Any, ["a"]), timeout=10)
    with pytest.raises(InvalidArgumentError, match="arguments are not JSON"):
        await journal.approval("send", {"x": float("nan")}, timeout=10)
    assert journal.position == 0  # no step taken
    assert len(await world.log.read("session/ask")) == 1  # the input only


def test_arguments_json_cannot_hold_stay_text() -> None:
    from world_core.integrations.openai_agents import _arguments

    assert _arguments('{"to": "ada"}') == {"to": "ada"}
    assert _arguments('{"x": NaN}') == '{"x": NaN}'  # recorded as the text the model sent
    assert _arguments("not json") == "not json"


class _NoModels(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        raise UserError(f"no model named {model_name!r}")


@pytest.mark.anyio
async def test_a_run_the_sdk_refuses_fails_the_turn_at_once(world: World) -> None:
    durable = DurableAgent(Agent(name="x", model="nope"), replay={}, model_provider=_NoModels())
    client = Client(world)
    await client.submit("refused", "hi", turn_id="t1")
    result = await Worker(world, durable, crash=None).run_once(wait=5)
    assert result is not None
    assert result.status == "failed"  # recorded at once: no retries with backoff
    failure = await client.failure("refused", "t1")
    assert failure is not None
    assert failure.error_type == "ConfigurationError"
    assert "no model named 'nope'" in failure.error
    assert failure.attempts == 1


def test_recorded_responses_dump_as_the_live_ones() -> None:
    from openai.types.responses import ResponseFunctionToolCall, ResponseReasoningItem
    from openai.types.responses.response_reasoning_item import Summary

    from world_core.integrations.openai_agents import _response_from, _response_json

    live = ModelResponse(
        output=[
            ResponseFunctionToolCall(
                type="function_call", call_id="c1", name="send", arguments="{}", status=None
            ),
            ResponseReasoningItem(
                id="r1", type="reasoning", summary=[Summary(type="summary_text", text="think")]
            ),
            ResponseOutputMessage(
                type="message",
                id="m1",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text="hi", annotations=[])],
            ),
        ],
        usage=Usage(requests=1, input_tokens=5, output_tokens=2, total_tokens=7),
        response_id="resp_1",
    )
    replayed = _response_from(json.loads(json.dumps(_response_json(live))))
    for before, after in zip(live.output, replayed.output, strict=True):
        assert type(after) is type(before)
        assert after.model_dump(exclude_unset=True) == before.model_dump(exclude_unset=True)
        assert after.model_dump() == before.model_dump()
    assert replayed.to_input_items() == live.to_input_items()  # what the next request holds
    assert (replayed.usage.total_tokens, replayed.response_id) == (7, "resp_1")


# -- poison replies: a model reply the SDK cannot use ---------------------------------------------


class _CallsAMissingTool(Model):
    """Every reply calls ``refund``, a tool the agent does not have."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        call = ResponseFunctionToolCall(
            type="function_call", id="fc", call_id="c", name="refund", arguments='{"order": 1}'
        )
        return ModelResponse(output=[call], usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


@pytest.mark.anyio
async def test_a_reply_calling_a_missing_tool_fails_the_turn_at_once(world: World) -> None:
    """The SDK refuses the reply (ModelBehaviorError); a replay reads the same recorded reply
    and is refused the same way, so the turn fails on its first delivery, naming the tool.
    It was retried with backoff before (five deliveries, each refused alike)."""
    model = _CallsAMissingTool()
    durable = DurableAgent(Agent(name="x", model=model, tools=[send]), replay={"send": "never"})
    client = Client(world)
    await client.submit("poison", "refund order 1", turn_id="t1")
    result = await Worker(world, durable, crash=None, retry_delay=0.01).run_once(wait=5)
    assert result is not None
    assert result.status == "failed"
    failure = await client.failure("poison", "t1")
    assert failure is not None
    assert failure.error_type == "ModelReplyError"
    assert "Tool refund not found" in failure.error
    assert failure.attempts == 1
    assert model.calls == 1


class _Unusable(Model):
    """Answers with what the SDK's model cannot use: it raises ModelBehaviorError."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        raise ModelBehaviorError("the response holds an item of no known type")

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


@pytest.mark.anyio
async def test_an_unusable_reply_is_recorded_and_not_paid_for_again(world: World) -> None:
    """The model call answered (paid) and its reply could not be used: the model step records
    that, so a second run of the turn (its worker died before recording the failure) raises it
    again without calling. Nothing was recorded before: each run paid again."""
    model = _Unusable()
    durable = DurableAgent(Agent(name="x", model=model), replay={})
    await Client(world).submit("unusable", "hi", turn_id="t1")
    for _ in range(2):
        journal = await Journal.open(world, "unusable", "t1")
        with pytest.raises(ModelReplyError, match="no known type"):
            await durable.run_turn(journal)
    assert model.calls == 1


# -- parallel tool calls: their steps follow the reply's order ------------------------------------


class _Refunds(Model):
    """Calls ``refund`` for each of ``orders`` in one reply, then says what the calls
    returned."""

    def __init__(self, *orders: str) -> None:
        self.orders = orders
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        outputs = [i["output"] for i in args[1] if i.get("type") == "function_call_output"]
        if outputs:
            text = ResponseOutputText(type="output_text", text=" ".join(outputs), annotations=[])
            done = ResponseOutputMessage(
                type="message", id="m", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[done], usage=Usage(requests=1), response_id=None)
        calls: list[TResponseOutputItem] = [
            ResponseFunctionToolCall(
                type="function_call",
                id=f"fc_{order}",
                call_id=f"c_{order}",
                name="refund",
                arguments=json.dumps({"order": order}),
            )
            for order in self.orders
        ]
        return ModelResponse(output=calls, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


class _SendOnce(Model):
    """Calls ``send`` until a call's output comes back, then says that output."""

    def __init__(self) -> None:
        self.said: list[str] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items = args[1]
        self.said.extend(json.dumps(i, default=str) for i in items)
        outputs = [
            i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call", id="fc_0", call_id="call_0", name="send", arguments="{}"
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(
            type="output_text", text=str(outputs[-1]["output"]), annotations=[]
        )
        message = ResponseOutputMessage(
            type="message", id="m", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


class _SlowStart(AgentHooks[Any]):
    """An ``on_tool_start`` hook that takes longer for some calls (a log shipped over the
    network, say): how long changes from one run of the turn to the next."""

    def __init__(self) -> None:
        self.delays: dict[str, float] = {}

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        order = json.loads(getattr(context, "tool_arguments", "{}") or "{}").get("order", "")
        await anyio.sleep(self.delays.get(order, 0))


@pytest.mark.anyio
async def test_parallel_tool_calls_take_their_steps_in_the_reply_s_order(world: World) -> None:
    """Two never calls in one reply, each behind an on_tool_start hook whose latency differs
    between the run and its replay: the steps are taken in the reply's order either way, so the
    replay reads both back (no NonDeterminismError, no refund run again). They were taken in
    the order the calls got through the hooks: the replay found refund b where refund a was
    recorded and failed the turn."""
    refunds: list[str] = []

    @function_tool
    def refund(order: str) -> str:
        """Refund an order.

        Args:
            order: the order id.
        """
        refunds.append(order)
        return f"refunded {order}"

    hooks = _SlowStart()
    model = _Refunds("a", "b")
    agent = Agent(name="x", model=model, tools=[refund], hooks=hooks)
    durable = DurableAgent(agent, replay={"refund": "never"})
    client = Client(world)
    await client.submit("parallel", "refund a and b", turn_id="t1")
    hooks.delays = {"b": 0.3}  # a reaches its step first
    result = await Worker(world, durable, crash=None).run_once(wait=5)
    assert result is not None
    assert result.status == "done"
    assert await client.reply("parallel", "t1") == "refunded a refunded b"
    hooks.delays = {"a": 0.3}  # the replay: b would reach its step first
    journal = await Journal.open(world, "parallel", "t1")
    with anyio.fail_after(30):
        assert await durable.run_turn(journal) == "refunded a refunded b"
    assert refunds == ["a", "b"]
    assert model.calls == 2


# -- a function tool's own timeout ----------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("label", ["never", "safe"])
async def test_a_tool_cut_off_by_its_timeout_is_recorded_and_the_turn_goes_on(
    world: World, label: Replay
) -> None:
    """A function tool with the SDK's ``timeout=`` runs past it: the call's step applies the
    timeout and records the SDK's answer (the model is told as the SDK tells it), the turn
    finishes, and a replay reads it back. The SDK's own timer cancelled the journal's step
    before: the step stayed unfinished (a never call's intent without outcome) and the next
    model call landed on the tool's position, so the turn failed with NonDeterminismError."""
    runs: list[int] = []

    @function_tool(timeout=0.2)
    async def refund(order: str) -> str:
        """Refund an order.

        Args:
            order: the order id.
        """
        runs.append(1)
        await anyio.sleep(30)
        return "refunded"

    model = _Refunds("a")
    durable = DurableAgent(Agent(name="x", model=model, tools=[refund]), replay={"refund": label})
    client = Client(world)
    session = f"timeout-{label}"
    await client.submit(session, "refund", turn_id="t1")
    with anyio.fail_after(30):
        result = await Worker(world, durable, crash=None).run_once(wait=5)
    assert result is not None
    assert result.status == "done"
    reply = await client.reply(session, "t1")
    assert reply == "Tool 'refund' timed out after 0.2 seconds."  # what the SDK tells
    journal = await Journal.open(world, session, "t1")
    with anyio.fail_after(30):
        assert await durable.run_turn(journal) == reply
    assert runs == [1]
    assert model.calls == 2


@pytest.mark.anyio
async def test_a_send_refused_for_a_lost_lease_runs_on_the_next_attempt(world: World) -> None:
    """``send`` (never) blocks the worker's event loop past its 1 s lease on its first call
    (as a first import or CPU-bound work would), then calls ``tool_context().check()``:
    refused. The SDK turns what a function tool raises into text for the model; that text was
    recorded as send's outcome, and the model told the send had failed (the examples' crash
    matrix, under load: no email, another reply). The refusal is not send's outcome and never
    reaches the model: the attempt ends ``lease_lost`` and the next one runs send, once."""
    stalled: list[bool] = []
    sent: list[str] = []

    @function_tool
    async def send() -> str:
        """Send the note (an effect that must happen once)."""
        context = tool_context()
        assert context is not None
        stall_once(stalled)  # the loop cannot renew the lease meanwhile
        context.check()
        sent.append(context.idempotency_key)
        return "sent"

    model = _SendOnce()
    durable = DurableAgent(
        Agent(name="sender", model=model, tools=[send]), replay={"send": "never"}
    )
    worker = Worker(world, durable, lease=1.0, crash=None, observers=[])
    await Client(world).submit("s", "send it", turn_id="t")
    with anyio.fail_after(30):
        first = await worker.run_once(wait=5)
        assert first is not None
        assert first.status == "lease_lost", first
        assert sent == []
        second = await worker.run_once(wait=5)
    assert second is not None
    assert (second.status, second.reply) == ("done", "sent"), second
    assert len(sent) == 1
    assert not [text for text in model.said if "lease" in text.lower()], model.said
