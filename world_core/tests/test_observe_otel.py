"""OpenTelemetry spans of turns: one trace per turn with journal-derived ids, one span per
finished step across a crash and a takeover, none for a replayed step (SDK in-memory exporter)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from observe_support import REPLY, build  # type: ignore[import-not-found]  # PYTHONPATH
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from world_core import (
    Agent,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    Worker,
    World,
    open_world,
)
from world_core.errors import InvalidArgumentError
from world_core.observe import TurnTracing, live_events, span_id_of, trace_id_of

pytestmark = pytest.mark.anyio

WAIT = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="otel") as opened:
        yield opened


@pytest.fixture
def spans() -> tuple[TurnTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return TurnTracing(processor=SimpleSpanProcessor(exporter)), exporter


def _by_step(finished: tuple[ReadableSpan, ...]) -> dict[object, list[ReadableSpan]]:
    steps: dict[object, list[ReadableSpan]] = {}
    for span in finished:
        steps.setdefault((span.attributes or {}).get("world.step", "root"), []).append(span)
    return steps


async def test_a_turn_is_one_trace_with_gen_ai_spans(
    world: World, spans: tuple[TurnTracing, InMemorySpanExporter]
) -> None:
    tracing, exporter = spans
    turn = await Client(world).submit("s", "when is the launch?")
    worker = Worker(world, build(), crash=None, observers=[live_events, tracing])
    result = await worker.run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    finished = exporter.get_finished_spans()
    assert [span.name for span in finished] == [
        "chat unknown",
        "execute_tool lookup",
        "chat unknown",
        "invoke_agent agent",
    ]
    assert {span.context.trace_id for span in finished} == {trace_id_of("s", turn)}
    root = finished[-1]
    assert root.context.span_id == span_id_of("s", turn)
    assert root.parent is None
    for n, span in enumerate(finished[:3]):
        assert span.context.span_id == span_id_of("s", turn, n)
        assert span.parent is not None
        assert span.parent.span_id == root.context.span_id
    tool = finished[1].attributes or {}
    assert tool["gen_ai.operation.name"] == "execute_tool"
    assert tool["gen_ai.tool.name"] == "lookup"
    assert tool["gen_ai.tool.call.id"] == "call_7"
    assert "gen_ai.tool.call.arguments" not in tool  # content is opt-in
    chat = finished[0].attributes or {}
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.request.model"] == "unknown"
    assert (root.attributes or {})["gen_ai.operation.name"] == "invoke_agent"
    assert (root.attributes or {})["gen_ai.conversation.id"] == "s"


async def test_content_is_captured_only_when_asked(world: World) -> None:
    exporter = InMemorySpanExporter()
    tracing = TurnTracing(processor=SimpleSpanProcessor(exporter), capture_content=True)
    await Client(world).submit("s", "when is the launch?")
    await Worker(world, build(), crash=None, observers=[tracing]).run_once(wait=WAIT)
    tool, last_chat = exporter.get_finished_spans()[1:3]
    assert json.loads(str((tool.attributes or {})["gen_ai.tool.call.arguments"])) == {
        "topic": "launch"
    }
    assert REPLY in str((last_chat.attributes or {})["gen_ai.output.messages"])
    assert "when is the launch?" in str((last_chat.attributes or {})["gen_ai.input.messages"])


async def test_a_crash_and_takeover_continue_the_trace_one_span_per_step(
    world: World, spans: tuple[TurnTracing, InMemorySpanExporter]
) -> None:
    """The first run dies after step 2's model call, before its outcome (and step 1's deferred
    safe outcome riding with it) was written. Step 0 was durable: its span came from the first
    run, and the second run replays it without a span; steps 1 and 2 run again and get theirs."""
    tracing, exporter = spans
    turn = await Client(world).submit("s", "when is the launch?")
    crashing = Worker(
        world,
        build(),
        lease=0.5,
        heartbeat=False,
        crash=CrashPoint(2, "after_run", in_process=True),
        observers=[tracing],
        name="first",
    )
    with pytest.raises(BaseExceptionGroup) as crashed:  # the worker's task group holds it
        await crashing.run_once(wait=WAIT)
    assert crashed.value.subgroup(SimulatedCrash) is not None
    assert [s.name for s in exporter.get_finished_spans()] == ["chat unknown"]
    rescuer = Worker(world, build(), crash=None, observers=[tracing], name="second")
    with anyio.fail_after(WAIT):
        result = await rescuer.run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    assert result.replayed == 1
    finished = exporter.get_finished_spans()
    assert {s.context.trace_id for s in finished} == {trace_id_of("s", turn)}
    steps = _by_step(finished)
    assert sorted(steps, key=str) == [0, 1, 2, "root"]
    assert all(len(found) == 1 for found in steps.values())  # exactly one span per step
    workers = {step: (found[0].attributes or {})["world.worker"] for step, found in steps.items()}
    assert workers == {0: "first", 1: "second", 2: "second", "root": "second"}
    assert len({s.context.span_id for s in finished}) == 4


async def test_a_replayed_step_emits_no_span(
    world: World, spans: tuple[TurnTracing, InMemorySpanExporter]
) -> None:
    tracing, exporter = spans
    turn = await Client(world).submit("s", "when is the launch?")
    await Worker(world, build(), crash=None, observers=[tracing]).run_once(wait=WAIT)
    before = len(exporter.get_finished_spans())
    # Replay the finished turn's agent code through a traced journal: every step reads back.
    from world_core.journal import TurnRun

    run = TurnRun("s", turn, "replayer", 2, "m", step=3, resumed=True)
    observer = tracing(world, run)
    journal = await Journal.open(world, "s", turn, observer=observer)
    assert await build().run_turn(journal) == REPLY
    assert journal.replayed == 3
    assert len(exporter.get_finished_spans()) == before


def test_tracing_settings_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="exactly one of exporter"):
        TurnTracing()
    with pytest.raises(InvalidArgumentError, match="agent_name"):
        TurnTracing(processor=SimpleSpanProcessor(InMemorySpanExporter()), agent_name="")


def test_nothing_imports_opentelemetry_until_tracing_is_made() -> None:
    code = (
        "import sys, world_core, world_core.observe; "
        "print(any(m.split('.')[0] == 'opentelemetry' for m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


async def test_token_usage_and_the_model_name_follow_the_conventions(world: World) -> None:
    """A model client with a name (``.model``) and replies reporting usage: ``chat {model}``
    spans with ``gen_ai.request.model`` and the input and output token counts."""

    class NamedModel(ScriptedModel):
        model = "gpt-test"

    def policy(request: ModelRequest) -> ModelReply:
        return ModelReply(content="hi", usage={"prompt_tokens": 21, "completion_tokens": 4})

    exporter = InMemorySpanExporter()
    tracing = TurnTracing(processor=SimpleSpanProcessor(exporter), agent_name="helper")
    await Client(world).submit("s", "hello")
    agent = Agent(model=NamedModel(policy))
    result = await Worker(world, agent, crash=None, observers=[tracing]).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    chat, root = exporter.get_finished_spans()
    assert chat.name == "chat gpt-test"
    attributes = chat.attributes or {}
    assert attributes["gen_ai.request.model"] == "gpt-test"
    assert attributes["gen_ai.usage.input_tokens"] == 21
    assert attributes["gen_ai.usage.output_tokens"] == 4
    assert root.name == "invoke_agent helper"
    assert (root.attributes or {})["gen_ai.agent.name"] == "helper"
