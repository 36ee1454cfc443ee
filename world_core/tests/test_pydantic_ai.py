"""The pydantic-ai engine (``world_core.integrations.pydantic_ai``) on the journal.

A pydantic-ai agent driven by its ``FunctionModel`` (a scripted model: no API key) with three
tools: ``lookup`` (safe), ``send`` (never: one line appended to a real file per call, the
sink) and ``check`` (safe: reads the sink). The crash matrix kills its turn before and after
every step (in process, :class:`~world_core.SimulatedCrash`: the journal writes nothing more,
as if the process died) and continues it with a fresh journal: no finished model request is
sent again, the sink holds exactly one line, the reply is the clean run's. Every crash point
runs on local, PostgreSQL, Redis and Turso (about a second each: the crashes are in process,
no worker waits); on Mongo, three (its CI server, mongoeco, is slow).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from fastmcp.client.transports import StdioTransport
from journal_support import stall_once  # type: ignore[import-not-found]  # PYTHONPATH
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from pydantic_ai import Agent, AgentStreamEvent, FunctionToolset, RunContext, Tool
from pydantic_ai.capabilities import RequestInput
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    CapabilityOperationId,
    DurableOperationId,
    EventStreamHandlerId,
    ModelCancelSuspendedResponseId,
    ModelCompactMessagesId,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets._dynamic import DynamicToolset

from world_core import (
    POSSIBLY_RAN,
    Client,
    CrashPoint,
    Journal,
    SimulatedCrash,
    TurnSuspended,
    Worker,
    World,
    digest_of,
    format_report,
    open_world,
    read_history,
    replay_check,
    session_log_id,
)
from world_core.errors import ConfigurationError, InvalidArgumentError, ModelReplyError
from world_core.integrations.pydantic_ai import (
    WorldAgent,
    WorldApprovals,
    WorldDurability,
    event_token,
    fail_event,
    resolve_event,
    tool_context,
)

pytestmark = pytest.mark.anyio

TURN = "t"
MESSAGE = "Send the note to ops."
REPLY = "Sent the note to ops once."
SEND_TIMEOUT = 2.0
STEPS = [
    ("model", "mailer__model.request"),
    ("tool", "mailer__function_toolset__<agent>.call_tool:lookup"),
    ("model", "mailer__model.request"),
    ("tool", "mailer__function_toolset__<agent>.call_tool:send"),
    ("model", "mailer__model.request"),
]
ALL_POINTS = [f"{n}:{when}" for n in range(len(STEPS)) for when in ("before_run", "after_run")]
SOME_POINTS = ["2:after_run", "3:before_run", "3:after_run"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def later() -> float:
    """A clock an hour ahead: every deadline an intent recorded has passed on it."""
    return time.time() + 3600


class Sink:
    """Where ``send`` lands: one line per call, appended to a real file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self, session: str) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [row for row in rows if row["session"] == session]


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


class Scripted:
    """The scripted model: looks up, sends, and after "may or may not have happened" checks
    the sink before sending again. Records the digest of every request it gets."""

    def __init__(self) -> None:
        self.requests: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
        self.requests.append(digest_of(_strip(dumped)))
        results: list[tuple[str, str]] = []
        for message in messages:
            for part in getattr(message, "parts", []):
                if isinstance(part, UserPromptPart):
                    results = []
                elif isinstance(part, ToolReturnPart | RetryPromptPart) and part.tool_name:
                    results.append((part.tool_name, str(part.content)))
        n = len(self.requests)
        if not results:
            return ModelResponse(parts=[ToolCallPart("lookup", {"topic": "note"}, f"c{n}")])
        name, content = results[-1]
        send = ModelResponse(parts=[ToolCallPart("send", {"to": "ops"}, f"c{n}")])
        if name == "lookup" or (name == "check" and content == "no"):
            return send
        if name == "send" and POSSIBLY_RAN in content:
            return ModelResponse(parts=[ToolCallPart("check", {"to": "ops"}, f"c{n}")])
        return ModelResponse(parts=[TextPart(REPLY)])


def make_agent(
    sink: Sink,
    model: Callable[[list[ModelMessage], AgentInfo], ModelResponse] | None = None,
    *,
    instructions: str | None = None,
    send: Callable[[str], Awaitable[str]] | None = None,
) -> Agent[None, str]:
    """The agent; ``send`` replaces its send tool (same name and docstring)."""

    def lookup(topic: str) -> str:
        """Look a note up."""
        return f"the {topic} says: ship it"

    def send_now(to: str) -> str:
        """Send the note (an effect that must happen once)."""
        context = tool_context()
        assert context is not None
        row = {"session": context.session_id, "key": context.idempotency_key, "to": to}
        with sink.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        return f"sent to {to}"

    def check(to: str) -> str:
        """Has the note reached this recipient?"""
        context = tool_context()
        assert context is not None
        return "yes" if sink.lines(context.session_id) else "no"

    return Agent(
        FunctionModel(model if model is not None else Scripted(), model_name="scripted"),
        name="mailer",
        instructions=instructions,
        tools=[
            Tool(lookup, metadata={"world": {"replay": "safe"}}),
            Tool(
                send if send is not None else send_now,
                name="send",
                metadata={"world": {"replay": "never", "timeout": SEND_TIMEOUT}},
            ),
            Tool(check, metadata={"world": {"replay": "safe"}}),
        ],
        capabilities=[WorldDurability()],
    )


async def outcomes(world: World, session: str) -> list[dict[str, Any]]:
    found = []
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") == "outcome":
            found.append(body)
    return found


async def run_turn(world: World, session: str, agent: Agent[Any, Any], **options: Any) -> str:
    journal = await Journal.open(world, session, TURN, **options)
    with anyio.fail_after(30):
        return await WorldAgent(agent).run_turn(journal)


class _CrashMatrix:
    world_name: ClassVar[str] = ""
    points: ClassVar[list[str]] = ALL_POINTS

    async def test_pydantic_ai_crash_matrix(self, world: World, tmp_path: Path) -> None:
        """Killed before and after each step, continued by a fresh journal: zero finished
        model requests sent again, exactly one effect at the sink, the clean run's reply."""
        sink = Sink(tmp_path / "sink.jsonl")
        client = Client(world)
        await client.submit("clean", MESSAGE, turn_id=TURN)
        assert await run_turn(world, "clean", make_agent(sink)) == REPLY
        assert [(o["kind"], o["name"]) for o in await outcomes(world, "clean")] == STEPS
        assert len(sink.lines("clean")) == 1
        rows: dict[str, tuple[int, int, bool]] = {}
        for index, point in enumerate(self.points):
            session = f"crash-{index}"
            await client.submit(session, MESSAGE, turn_id=TURN)
            step, when = point.split(":")
            # why: the crash moment is a plain str here, one of CrashPoint's two literals
            crash = CrashPoint(int(step), when, in_process=True)  # type: ignore[arg-type]
            first = Scripted()
            with pytest.raises(SimulatedCrash):
                await run_turn(world, session, make_agent(sink, first), crash=crash)
            finished = sum(1 for o in await outcomes(world, session) if o["kind"] == "model")
            paid = set(first.requests[:finished])
            # Teeth: the model steps before the crash point (0, 2, 4) were journaled.
            assert finished == len([m for m in (0, 2, 4) if m < int(step)]), point
            second = Scripted()
            reply = await run_turn(world, session, make_agent(sink, second), clock=later)
            repeated = sum(1 for digest in second.requests if digest in paid)
            rows[point] = (repeated, len(sink.lines(session)), reply == REPLY)
        assert rows == dict.fromkeys(self.points, (0, 1, True)), (
            "crash point: (repeated model calls, effects at the sink, same reply)"
        )


class TestLocal(_CrashMatrix):
    world_name = "local"
    points = ALL_POINTS


class TestPostgres(_CrashMatrix):
    world_name = "postgres"
    points = ALL_POINTS


class TestRedis(_CrashMatrix):
    world_name = "redis"
    points = ALL_POINTS


class TestMongo(_CrashMatrix):
    world_name = "mongo"
    # mongoeco, the CI's Mongo server, is slow (9 s for every point): one of each kind of
    # point, after a model request's call and around the never send.
    points = SOME_POINTS


class TestTurso(_CrashMatrix):
    world_name = "turso"
    points = ALL_POINTS


# -- on local: labels, replay reporting, human input, toolset kinds, names --------------------


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="pai") as opened:
        yield opened


@pytest.fixture
def sink(tmp_path: Path) -> Sink:
    return Sink(tmp_path / "sink.jsonl")


def test_a_tool_without_a_replay_label_is_refused_by_name() -> None:
    def notify(text: str) -> str:
        """Notify."""
        return text

    with pytest.raises(InvalidArgumentError, match="tool 'notify' has no replay label"):
        Agent(FunctionModel(Scripted()), name="a", tools=[notify], capabilities=[WorldDurability()])
    for config, match in [
        ({"replay": "sometimes"}, "tool 'notify': replay must be 'safe'.*'sometimes'"),
        ({"replay": "never", "timeout": -1}, "tool 'notify': timeout must be"),
        ({"replay": "never", "retries": 3}, r"unknown 'world' config keys \['retries'\]"),
        ("never", "its 'world' config must be a dict"),
        (False, "tool 'notify' has no replay label"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            Agent(
                FunctionModel(Scripted()),
                name="a",
                tools=[Tool(notify, metadata={"world": config})],
                capabilities=[WorldDurability()],
            )
    with pytest.raises(InvalidArgumentError, match="tool 'notify': replay must be"):
        WorldDurability(tools={"notify": {"replay": "twice"}})
    # A label by name (for tools whose metadata the agent does not own) is enough.
    Agent(
        FunctionModel(Scripted()),
        name="a",
        tools=[notify],
        capabilities=[WorldDurability(tools={"notify": {"replay": "safe"}})],
    )


async def test_a_tool_added_after_the_agent_is_refused_at_its_call(local: World) -> None:
    def call_it(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("unlabelled", {"text": "x"}, "c1")])

    agent = Agent(FunctionModel(call_it), name="late", capabilities=[WorldDurability()])
    runs: list[str] = []

    @agent.tool_plain
    def unlabelled(text: str) -> str:
        """Added after construction, without a label."""
        runs.append(text)
        return text

    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    with pytest.raises(InvalidArgumentError, match="tool 'unlabelled' has no replay label"):
        await run_turn(local, "s", agent)
    assert runs == []


def test_world_agent_needs_the_capability() -> None:
    plain = Agent(FunctionModel(Scripted()), name="plain")
    with pytest.raises(InvalidArgumentError, match="has no WorldDurability capability"):
        WorldAgent(plain)
    with pytest.raises(InvalidArgumentError, match="history_turns"):
        WorldAgent(make_agent(Sink(Path("unused"))), history_turns=-1)


async def test_outside_a_turn_the_agent_is_a_plain_agent(sink: Sink) -> None:
    agent = make_agent(sink)
    with pytest.raises(AssertionError):  # send asks for the step's context: there is none
        await agent.run(MESSAGE)


async def test_earlier_turns_are_the_run_s_message_history(local: World, sink: Sink) -> None:
    seen: list[list[str]] = []

    def echo(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts = [
            str(part.content)
            for message in messages
            for part in getattr(message, "parts", [])
            if isinstance(part, UserPromptPart | TextPart)
        ]
        seen.append(prompts)
        return ModelResponse(parts=[TextPart(f"reply {len(seen)}")])

    agent = Agent(FunctionModel(echo), name="echo", capabilities=[WorldDurability()])
    client = Client(local)
    await client.submit("s", "first", turn_id="t1")
    await client.submit("s", "second", turn_id="t2")
    for turn in ("t1", "t2"):
        journal = await Journal.open(local, "s", turn)
        await WorldAgent(agent).run_turn(journal)
    assert seen == [["first"], ["first", "reply 1", "second"]]


async def test_replayed_steps_export_no_second_span(local: World, sink: Sink) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = InstrumentationSettings(tracer_provider=provider)
    agent = make_agent(sink)
    agent.instrument = settings
    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    crash = CrashPoint(3, "before_run", in_process=True)
    with pytest.raises(SimulatedCrash):
        await run_turn(local, "s", agent, crash=crash)
    first = [span.name for span in exporter.get_finished_spans()]
    exporter.clear()
    assert await run_turn(local, "s", agent, clock=later) == REPLY
    second = [span.name for span in exporter.get_finished_spans()]
    chats = [name for name in first if name.startswith("chat")]
    assert len(chats) == 2  # the two model requests before the crash
    # The continuation replays those two (no span) and sends two new ones (check, reply).
    assert len([name for name in second if name.startswith("chat")]) == 2 + 1
    tools = [name for name in second if "tool" in name]
    assert any("send" in name for name in tools)
    assert not any("lookup" in name for name in tools), "a replayed tool call exported a span"
    exporter.clear()
    assert await run_turn(local, "s", agent) == REPLY  # all replayed: nothing exported
    assert [s.name for s in exporter.get_finished_spans() if s.name.startswith("chat")] == []


# -- waiting for a person: requires_approval on signals raced against a timer ----------------


def approval_agent(sink: Sink, asked: list[tuple[str, list[str]]], **wait: Any) -> Agent[None, str]:
    def send(to: str) -> str:
        """Send (needs approval)."""
        context = tool_context()
        assert context is not None
        with sink.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"session": context.session_id, "to": to}) + "\n")
        return f"sent to {to}"

    def policy(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [
            part
            for message in messages
            for part in getattr(message, "parts", [])
            if isinstance(part, ToolReturnPart | RetryPromptPart)
        ]
        if not returns:
            return ModelResponse(parts=[ToolCallPart("send", {"to": "ops"}, "call-1")])
        return ModelResponse(parts=[TextPart(f"send said: {returns[-1].content}")])

    def ask(ctx: RunContext[None], requests: DeferredToolRequests, token: str) -> None:
        asked.append((token, [call.tool_call_id for call in requests.approvals]))

    return Agent(
        FunctionModel(policy, model_name="scripted"),
        name="approver",
        tools=[
            Tool(send, requires_approval=True, metadata={"world": {"replay": "never"}}),
        ],
        capabilities=[WorldDurability(), RequestInput(ask, **wait)],
    )


async def test_an_approved_call_runs_once_across_a_crash_while_waiting(
    local: World, sink: Sink
) -> None:
    asked: list[tuple[str, list[str]]] = []
    agent = approval_agent(sink, asked)
    client = Client(local)
    await client.submit("s", MESSAGE, turn_id=TURN)
    with pytest.raises(TurnSuspended) as suspended:
        await run_turn(local, "s", agent)
    wait_step = suspended.value.step
    # A crash while suspended: the next run finds the same wait, asks nobody again.
    with pytest.raises(TurnSuspended):
        await run_turn(local, "s", agent)
    assert len(asked) == 1
    token, calls = asked[0]
    assert calls == ["call-1"]
    assert sink.lines("s") == []
    decision = {"approvals": {"call-1": True}}
    await resolve_event(client, token, decision, sender="ada")
    await resolve_event(client, token, decision, sender="ada")  # a double tap counts once
    with pytest.raises(InvalidArgumentError):
        await resolve_event(client, token, {"approvals": {"call-1": False}}, sender="ada")
    # Killed after the wait found the decision, before recording it: replayed the same way.
    crash = CrashPoint(wait_step, "after_run", in_process=True)
    with pytest.raises(SimulatedCrash):
        await run_turn(local, "s", agent, crash=crash)
    assert await run_turn(local, "s", agent) == "send said: sent to ops"
    assert len(sink.lines("s")) == 1
    assert len(asked) == 1
    recorded = await outcomes(local, "s")
    consumed = [o for o in recorded if o["kind"] == "signal"]
    assert [o["result"]["signal"]["sender"] for o in consumed] == ["ada"]
    assert [(o["kind"], o["name"]) for o in recorded] == [
        ("model", "approver__model.request"),
        ("tool", "approver__external_event.deferred_tool_calls.ask"),
        ("signal", "pydantic-ai/2/deferred_tool_calls"),
        ("tool", "approver__function_toolset__<agent>.call_tool:send"),
        ("model", "approver__model.request"),
    ]


async def test_each_turn_of_a_session_gets_its_own_token_and_its_decision(
    local: World, sink: Sink
) -> None:
    """Two turns of one session each wait for an approval at the same step: each gets a token
    of its own, and resolving the second turn's token ends the second turn's wait. Before,
    both turns got the same token (session and signal name, which holds the step number every
    turn counts from 0): the second decision was taken for a repeat of the first and counted
    once (or refused, if it differed), and the second turn waited on for ten years."""
    asked: list[tuple[str, list[str]]] = []
    agent = approval_agent(sink, asked)
    client = Client(local)
    decision = {"approvals": {"call-1": True}}
    replies: list[str] = []
    for turn in ("t1", "t2"):
        await client.submit("s", MESSAGE, turn_id=turn)
        with pytest.raises(TurnSuspended):
            await WorldAgent(agent).run_turn(await Journal.open(local, "s", turn))
        await resolve_event(client, asked[-1][0], decision, sender="ada")
        try:
            with anyio.fail_after(30):
                journal = await Journal.open(local, "s", turn)
                replies.append(await WorldAgent(agent).run_turn(journal))
        except TurnSuspended as still:  # before: turn t2 waited on, for ten years
            pytest.fail(f"turn {turn} still waits after its decision: {still}")
    assert len({token for token, _ in asked}) == 2
    assert replies == ["send said: sent to ops", "send said: sent to ops"]
    assert len(sink.lines("s")) == 2


async def test_a_refused_or_unanswered_call_does_not_run(local: World, sink: Sink) -> None:
    client = Client(local)
    asked: list[tuple[str, list[str]]] = []
    agent = approval_agent(sink, asked)
    await client.submit("refused", MESSAGE, turn_id=TURN)
    with pytest.raises(TurnSuspended):
        await run_turn(local, "refused", agent)
    await resolve_event(
        client,
        asked[-1][0],
        {"approvals": {"call-1": {"kind": "tool-denied", "message": "not today"}}},
        sender="ada",
    )
    assert await run_turn(local, "refused", agent) == "send said: not today"
    await client.submit("failed", MESSAGE, turn_id=TURN)
    with pytest.raises(TurnSuspended):
        await run_turn(local, "failed", agent)
    await fail_event(client, asked[-1][0], "the reviewer is away", sender="ada")
    reply = await run_turn(local, "failed", agent)
    assert reply == "send said: No decision on this tool call arrived: the reviewer is away"
    timed = approval_agent(sink, asked, timeout=timedelta(seconds=30))
    await client.submit("late", MESSAGE, turn_id=TURN)
    with pytest.raises(TurnSuspended) as suspended:
        await run_turn(local, "late", timed)
    assert suspended.value.wake_at == pytest.approx(time.time() + 30, abs=5)
    reply = await run_turn(local, "late", timed, clock=later)
    assert reply.startswith("send said: No decision on this tool call arrived: No resolution")
    assert sink.lines("refused") == sink.lines("failed") == sink.lines("late") == []


async def test_tokens_are_checked(local: World) -> None:
    client = Client(local)
    with pytest.raises(InvalidArgumentError, match="not a world resume token"):
        await resolve_event(client, "abc", {}, sender="ada")
    with pytest.raises(InvalidArgumentError, match="damaged"):
        await resolve_event(client, "world1.%%%", {}, sender="ada")
    token = event_token("s", "pydantic-ai/1/x")
    with pytest.raises(InvalidArgumentError, match="reason must be a str"):
        # why: the wrong type is the point: its refusal is tested
        await fail_event(client, token, 3, sender="ada")  # type: ignore[arg-type]


# -- every toolset kind is journaled ------------------------------------------------------------


async def test_dynamic_toolset_calls_are_labelled_steps(local: World, sink: Sink) -> None:
    runs: list[str] = []

    def ping(target: str) -> str:
        """Ping a host (an effect)."""
        runs.append(target)
        return f"pong from {target}"

    def tools(ctx: RunContext[None]) -> FunctionToolset[None]:
        return FunctionToolset([ping])

    def policy(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("ping", {"target": "db"}, "c1")])
        return ModelResponse(parts=[TextPart("pinged")])

    agent = Agent(
        FunctionModel(policy, model_name="scripted"),
        name="pinger",
        toolsets=[DynamicToolset(tools, id="hosts")],
        capabilities=[WorldDurability(tools={"ping": {"replay": "never"}})],
    )
    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    crash = CrashPoint(2, "after_run", in_process=True)  # ping ran; its outcome is lost
    with pytest.raises(SimulatedCrash):
        await run_turn(local, "s", agent, crash=crash)
    reply = await run_turn(local, "s", agent, clock=later)
    assert runs == ["db"]  # the never call is not run again
    recorded = await outcomes(local, "s")
    assert [(o["kind"], o["name"]) for o in recorded] == [
        ("tool", "pinger__dynamic_toolset__hosts.get_tools"),
        ("model", "pinger__model.request"),
        ("tool", "pinger__dynamic_toolset__hosts.call_tool:ping"),
        ("tool", "pinger__dynamic_toolset__hosts.get_tools"),
        ("model", "pinger__model.request"),
    ]
    assert recorded[2]["result"]["interrupted"] is True  # the model was told it may have run
    assert reply == "pinged"


async def test_mcp_tool_calls_are_labelled_steps(local: World, tmp_path: Path) -> None:
    """A real MCP server over stdio: discovery is a safe step, ``stamp`` a never step that
    is not run again after a crash that lost its outcome."""
    stamps = tmp_path / "stamps.jsonl"
    server = Path(__file__).with_name("mcp_stamp_server.py")
    transport = StdioTransport(
        command=sys.executable, args=[str(server)], env={"MCP_SINK": str(stamps)}
    )

    def policy(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("stamp", {"label": "ok"}, "c1")])
        return ModelResponse(parts=[TextPart("stamped")])

    agent = Agent(
        FunctionModel(policy, model_name="scripted"),
        name="stamper",
        # No handshake timeout (pydantic-ai's default is 5 s): each step starts the server, a
        # Python process whose imports alone take over 5 s on a loaded machine; the steps'
        # timeouts and the fail_after below still bound the turn.
        toolsets=[MCPToolset(transport, id="stamps", init_timeout=None)],
        capabilities=[WorldDurability(tools={"stamp": {"replay": "never", "timeout": 20}})],
    )
    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    with anyio.fail_after(60):
        crash = CrashPoint(2, "after_run", in_process=True)  # stamped; its outcome is lost
        with pytest.raises(SimulatedCrash):
            await run_turn(local, "s", agent, crash=crash)
        assert await run_turn(local, "s", agent, clock=later) == "stamped"
    assert stamps.read_text().splitlines() == ['{"label": "ok"}']  # once
    recorded = await outcomes(local, "s")
    assert [(o["kind"], o["name"]) for o in recorded][:3] == [
        ("tool", "stamper__mcp_server__stamps.get_tools"),
        ("model", "stamper__model.request"),
        ("tool", "stamper__mcp_server__stamps.call_tool"),
    ]
    assert recorded[2]["result"]["interrupted"] is True


# -- names: persisted compatibility data ----------------------------------------------------


NAMES = {
    "compat__model.request",
    "compat__model.request.registered",
    "compat__model.request_stream",
    "compat__model.request_stream.registered",
    "compat__model.cancel_suspended_response",
    "compat__model.cancel_suspended_response.registered",
    "compat__model.compact_messages",
    "compat__model.compact_messages.registered",
    "compat__event_stream_handler",
    "compat__function_toolset__functions.call_tool:function_tool",
    "compat__function_toolset__functions.validate_args",
    "compat__mcp_server__mcp.get_tools",
    "compat__mcp_server__mcp.get_instructions",
    "compat__mcp_server__mcp.call_tool",
    "compat__dynamic_toolset__dynamic.get_tools",
    "compat__dynamic_toolset__dynamic.call_tool:dynamic_tool",
    "compat__dynamic_toolset__dynamic.validate_args",
    "compat__capability__compat.operation",
}
"""Every step name the engine gives an agent named ``compat`` (pydantic-ai's journal naming
convention). They are in open turns' journals: a change makes their replays diverge. Never
edit this set to follow a rename; migrate open turns instead."""


def _operation_ids() -> list[DurableOperationId]:
    return [
        ModelRequestId(None, streaming=False, model_name="test"),
        ModelRequestId("registered", streaming=False, model_name="test"),
        ModelRequestId(None, streaming=True, model_name="test"),
        ModelRequestId("registered", streaming=True, model_name="test"),
        ModelCancelSuspendedResponseId(None, model_name="test"),
        ModelCancelSuspendedResponseId("registered", model_name="test"),
        ModelCompactMessagesId(None, model_name="test"),
        ModelCompactMessagesId("registered", model_name="test"),
        EventStreamHandlerId(),
        ToolsetCallToolId("function", toolset_id="functions"),
        ToolsetValidateToolArgumentsId("function", toolset_id="functions"),
        ToolsetGetToolsId("mcp", toolset_id="mcp"),
        ToolsetGetInstructionsId("mcp"),
        ToolsetCallToolId("mcp", toolset_id="mcp"),
        ToolsetGetToolsId("dynamic", toolset_id="dynamic"),
        ToolsetCallToolId("dynamic", toolset_id="dynamic"),
        ToolsetValidateToolArgumentsId("dynamic", toolset_id="dynamic"),
        CapabilityOperationId("compat", operation="operation"),
    ]


def _label(operation_id: DurableOperationId) -> str | None:
    if isinstance(operation_id, ToolsetCallToolId | ToolsetValidateToolArgumentsId):
        return {"function": "function_tool", "mcp": "mcp_tool", "dynamic": "dynamic_tool"}[
            operation_id.toolset_kind
        ]
    return None


def test_the_step_name_of_every_operation_is_pinned() -> None:
    """The name matrix: every kind of operation, named by the engine's backend."""
    agent = Agent(TestModel(), name="compat", capabilities=[WorldDurability()])
    durability = WorldDurability.from_agent(agent)
    assert durability is not None
    namer = durability.get_durable_operation_backend()._namer
    names = {
        namer.invocation_name(operation_id, label=_label(operation_id)).operation_name
        for operation_id in _operation_ids()
    }
    assert names == NAMES


def test_every_toolset_kind_is_wrapped_when_the_agent_is_built(tmp_path: Path) -> None:
    async def function_tool() -> str:
        """Declared only."""
        return "function"

    functions = FunctionToolset([function_tool], id="functions")
    dynamic = DynamicToolset(lambda _: FunctionToolset([function_tool]), id="dynamic")
    mcp = MCPToolset(StdioTransport(command=sys.executable, args=["-c", "pass"]), id="mcp")
    agent = Agent(
        TestModel(),
        name="compat",
        toolsets=[functions, dynamic, mcp],
        capabilities=[WorldDurability(tools={"function_tool": {"replay": "safe"}})],
    )
    durability = WorldDurability.from_agent(agent)
    assert durability is not None
    kinds = {type(ts).__name__ for ts in durability._toolsets_by_id.values()}
    assert kinds == {"DurableFunctionToolset", "DurableDynamicToolset", "DurableMCPToolset"}


async def test_the_step_sequence_of_a_run_is_pinned(local: World) -> None:
    """The names a run journals, in order (the assembly sequence): function and dynamic
    toolsets, an event-stream handler."""
    handled: list[str] = []

    async def function_tool() -> str:
        """A function tool."""
        return "function"

    async def dynamic_tool() -> str:
        """A dynamic tool."""
        return "dynamic"

    async def handler(ctx: RunContext[None], stream: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in stream:
            handled.append(type(event).__name__)

    agent = Agent(
        TestModel(),
        name="compat",
        toolsets=[
            FunctionToolset([function_tool], id="functions"),
            DynamicToolset(lambda _: FunctionToolset([dynamic_tool]), id="dynamic"),
        ],
        capabilities=[
            WorldDurability(
                tools={"function_tool": {"replay": "safe"}, "dynamic_tool": {"replay": "never"}},
                event_stream_handler=handler,
            )
        ],
    )
    await Client(local).submit("s", "Call every tool", turn_id=TURN)
    reply = await run_turn(local, "s", agent)
    assert reply == '{"function_tool":"function","dynamic_tool":"dynamic"}'
    names = [o["name"] for o in await outcomes(local, "s")]
    assert names == [
        "compat__dynamic_toolset__dynamic.get_tools",
        "compat__model.request_stream",
        "compat__event_stream_handler",
        "compat__event_stream_handler",
        "compat__function_toolset__functions.call_tool:function_tool",
        "compat__event_stream_handler",  # sequential tools: each result before the next call
        "compat__dynamic_toolset__dynamic.call_tool:dynamic_tool",
        "compat__event_stream_handler",
        "compat__dynamic_toolset__dynamic.get_tools",
        "compat__model.request_stream",
    ]
    assert set(names) <= NAMES
    assert handled  # the handler saw the events, each delivery a step


def test_the_engine_spec_is_deliberate() -> None:
    spec = WorldDurability.engine_spec
    assert (spec.engine_name, spec.durable_unit_noun, spec.durable_container_noun) == (
        "world",
        "step",
        "turn",
    )
    assert spec.codec is JSON_CODEC
    assert spec.tool_config_key == "world"
    assert spec.sequential_tools_in_durable_context is True  # steps are numbered in call order
    assert spec.tool_call_result_upgrade_lenient is False
    assert spec.unsupported_runtime_toolset_kinds == {"function", "mcp", "dynamic"}


async def test_recorded_tool_results_keep_their_wire_shape(local: World, sink: Sink) -> None:
    """A tool step's outcome is pydantic-ai's recorded result in JSON: pinned, since replays
    of open turns read it back."""
    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    await run_turn(local, "s", make_agent(sink))
    recorded = await outcomes(local, "s")
    assert recorded[1]["result"] == {
        "output": {"result": "the note says: ship it", "kind": "tool_return"}
    }
    assert recorded[0]["result"]["output"]["parts"][0]["part_kind"] == "tool-call"


def test_the_integrations_package_imports_no_framework() -> None:
    code = (
        "import sys, world_core, world_core.integrations\n"
        "loaded = {'pydantic_ai', 'langgraph', 'agents'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


class Answer(BaseModel):
    city: str
    days: int


async def test_structured_output_is_the_reply_in_json(local: World) -> None:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tool = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(tool, {"city": "Lyon", "days": 3}, "c1")])

    agent = Agent(
        FunctionModel(answer), name="planner", output_type=Answer, capabilities=[WorldDurability()]
    )
    await Client(local).submit("s", "plan", turn_id=TURN)
    assert await run_turn(local, "s", agent) == '{"city":"Lyon","days":3}'


async def test_a_run_pydantic_ai_refuses_fails_as_a_configuration_error(
    local: World, sink: Sink
) -> None:
    agent = make_agent(sink)
    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    unregistered = FunctionModel(Scripted())  # a Model instance a step could not rebuild
    refused = pytest.raises(ConfigurationError, match="pydantic-ai refused the run: The model")
    with agent.override(model=unregistered), refused:
        await run_turn(local, "s", agent)
    assert sink.lines("s") == []


async def test_a_worker_suspends_the_turn_and_the_answer_wakes_it(local: World, sink: Sink) -> None:
    """On a Worker: the wait frees the worker (status suspended); resolving the token queues
    the turn's wake-up, and the next claim finishes it with the call approved."""
    asked: list[tuple[str, list[str]]] = []
    worker = Worker(local, WorldAgent(approval_agent(sink, asked)), crash=None)
    client = Client(local)
    await client.submit("s", MESSAGE, turn_id=TURN)
    with anyio.fail_after(30):
        first = await worker.run_once(wait=5)
        assert first is not None
        assert first.status == "suspended"
        assert await worker.run_once(wait=0) is None  # nothing queued while it waits
        await resolve_event(client, asked[0][0], {"approvals": {"call-1": True}}, sender="ada")
        second = await worker.run_once(wait=5)
    assert second is not None
    assert (second.status, second.reply) == ("done", "send said: sent to ops")
    assert len(sink.lines("s")) == 1
    assert len(asked) == 1


def world_approval_agent(sink: Sink, **options: Any) -> Agent[None, str]:
    """The approval agent's tool and model, decided with world approvals (WorldApprovals)."""
    agent = approval_agent(sink, [])
    return Agent(
        agent.model,
        name="approver",
        tools=list(agent._function_toolset.tools.values()),
        capabilities=[WorldDurability(), WorldApprovals(**options)],
    )


async def test_world_approvals_decide_requires_approval_calls(local: World, sink: Sink) -> None:
    """``world approve``'s API: the call is listed with its arguments, approved once (a crash
    while waiting resumes the same wait), and runs once; a rejection says who and why."""
    client = Client(local)
    worker = Worker(local, WorldAgent(world_approval_agent(sink)), crash=None)
    await client.submit("s", MESSAGE, turn_id=TURN)
    with anyio.fail_after(30):
        first = await worker.run_once(wait=5)
        assert first is not None
        assert first.status == "suspended"
        [pending] = await client.pending_approvals("s")
        assert (pending.tool, pending.arguments) == ("send", {"to": "ops"})
        with pytest.raises(TurnSuspended):  # a crash while waiting: the same wait again
            await run_turn(local, "s", world_approval_agent(sink))
        assert len(await client.pending_approvals("s")) == 1
        await client.approve("s", pending.turn_id, pending.step, by="ada")
        await client.approve("s", pending.turn_id, pending.step, by="ada")  # counts once
        done = await worker.run_once(wait=5)
    assert done is not None
    assert (done.status, done.reply) == ("done", "send said: sent to ops")
    assert len(sink.lines("s")) == 1
    kinds = [o["kind"] for o in await outcomes(local, "s")]
    assert kinds == ["model", "approval", "tool", "model"]

    await client.submit("r", MESSAGE, turn_id=TURN)
    with pytest.raises(TurnSuspended):
        await run_turn(local, "r", world_approval_agent(sink))
    [pending] = await client.pending_approvals("r")
    await client.reject("r", pending.turn_id, pending.step, by="bob", reason="not today")
    reply = await run_turn(local, "r", world_approval_agent(sink))
    assert reply == "send said: bob rejected this call of send, so it did not run: not today"
    await client.submit("late", MESSAGE, turn_id=TURN)
    with pytest.raises(TurnSuspended):
        await run_turn(local, "late", world_approval_agent(sink, timeout=30))
    reply = await run_turn(local, "late", world_approval_agent(sink, timeout=30), clock=later)
    assert reply == "send said: nobody approved this call of send within 30 s, so it did not run"
    assert sink.lines("r") == sink.lines("late") == []
    with pytest.raises(InvalidArgumentError, match="timeout must be"):
        WorldApprovals(timeout=0)


async def test_replay_check_replays_a_pydantic_ai_turn_and_sees_a_change(
    local: World, sink: Sink
) -> None:
    """``world replay-check`` on a pydantic-ai agent: the recorded turn replays to its reply
    with model and tools off; the agent with new instructions asks its model something else
    at step 0, and diverges there."""
    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    await run_turn(local, "s", make_agent(sink))
    history = await read_history(local, "s")
    same = await replay_check([history], lambda: WorldAgent(make_agent(sink)))
    assert same.ok, format_report(same)
    assert [t.status for t in same.turns()] == ["consistent"]

    changed = await replay_check(
        [history], lambda: WorldAgent(make_agent(sink, instructions="Be brief."))
    )
    assert not changed.ok
    [turn] = changed.turns()
    assert (turn.status, turn.step) == ("diverged", 0)
    assert len(sink.lines("s")) == 1  # nothing ran during the checks


async def test_a_send_refused_for_a_lost_lease_runs_on_the_next_attempt(
    local: World, sink: Sink
) -> None:
    """``send`` (async, never) blocks the worker's event loop past its 1 s lease on its first
    call (as a first import or CPU-bound work would), then calls ``tool_context().check()``:
    refused. That refusal is not send's outcome and never reaches the model: the attempt ends
    ``lease_lost`` and the next one runs send again, once, and the turn finishes (in CI the
    pydantic-ai demo's turn failed here once, under load)."""
    blocked: list[bool] = []
    model = Scripted()
    said: list[str] = []

    async def send(to: str) -> str:
        """Send the note (an effect that must happen once)."""
        context = tool_context()
        assert context is not None
        stall_once(blocked)  # the loop cannot renew the lease meanwhile
        context.check()
        row = {"session": context.session_id, "key": context.idempotency_key, "to": to}
        with sink.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        return f"sent to {to}"

    def remember(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        said.extend(str(part) for m in messages for part in getattr(m, "parts", []))
        return model(messages, info)

    agent = make_agent(sink, remember, send=send)
    worker = Worker(local, WorldAgent(agent), lease=1.0, crash=None, observers=[])
    await Client(local).submit("s", MESSAGE, turn_id=TURN)
    with anyio.fail_after(30):
        first = await worker.run_once(wait=5)
        assert first is not None
        assert first.status == "lease_lost", first
        assert sink.lines("s") == []
        second = await worker.run_once(wait=5)
    assert second is not None
    assert (second.status, second.reply) == ("done", REPLY)
    assert len(sink.lines("s")) == 1, sink.lines("s")
    assert not [text for text in said if "lease" in text.lower()], said


# -- poison replies: model replies pydantic-ai cannot use -----------------------------------------


async def test_replies_calling_a_missing_tool_fail_the_turn_at_once(
    local: World, sink: Sink
) -> None:
    """Every reply calls a tool the agent does not have, past pydantic-ai's retries
    (UnexpectedModelBehavior): a replay reads the same recorded replies and ends the same way,
    so the turn fails on its first delivery and no request is paid for again. It was retried
    with backoff before (five deliveries, each ending alike)."""
    calls: list[int] = []

    def poison(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        return ModelResponse(parts=[ToolCallPart("refund", '{"order": ', tool_call_id="c1")])

    agent = make_agent(sink, poison)
    client = Client(local)
    await client.submit("poison", MESSAGE, turn_id=TURN)
    result = await Worker(local, WorldAgent(agent), crash=None, retry_delay=0.01).run_once(wait=5)
    assert result is not None
    assert result.status == "failed"
    failure = await client.failure("poison", TURN)
    assert failure is not None
    assert failure.error_type == "ModelReplyError"
    assert "'refund' exceeded max retries" in failure.error
    assert failure.attempts == 1
    assert len(calls) == 2  # the reply and its one retry, each paid once
    assert sink.lines("poison") == []


async def test_a_reply_the_model_cannot_use_is_recorded_and_not_paid_for_again(
    local: World, sink: Sink
) -> None:
    """The model request answered (paid) with what pydantic-ai cannot use (the model raises
    UnexpectedModelBehavior): the model step records it, so a second run of the turn (its
    worker died before recording the failure) raises it again without a request. Nothing was
    recorded before: each run paid again."""
    calls: list[int] = []

    def unusable(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        raise UnexpectedModelBehavior("Received empty model response", body="{}")

    agent = make_agent(sink, unusable)
    await Client(local).submit("unusable", MESSAGE, turn_id=TURN)
    for _ in range(2):
        with pytest.raises(ModelReplyError, match="empty model response") as raised:
            await run_turn(local, "unusable", agent)
        assert raised.value.raw == "{}"
        assert isinstance(raised.value, UnexpectedModelBehavior)  # what pydantic-ai expects
    assert calls == [1]
