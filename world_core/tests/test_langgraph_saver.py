"""WorldCheckpointSaver beyond LangGraph's conformance suite, and durable_tool, on the local
World: the sync API from threads, generations a crash left half-written, refusals, and the
journal's safe/never rules for calls inside LangGraph tasks."""

from __future__ import annotations

import base64
import json
import operator
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import anyio
import anyio.to_thread
import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, RetryPolicy, interrupt

from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import (
    POSSIBLY_RAN,
    InvalidArgumentError,
    NewEvent,
    NonDeterminismError,
    OutboxMessage,
    PossiblyRanError,
    Replay,
    SimulatedCrash,
    ToolError,
    World,
    open_world,
)
from world_core.integrations.langgraph import WorldCheckpointSaver, durable_tool
from world_core.spi import Log

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="lg") as opened:
        yield opened


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: WorldCheckpointSaver, node: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("work", node)
    builder.add_edge(START, "work")
    builder.add_edge("work", END)
    return builder.compile(checkpointer=saver)


def _thread(name: str) -> RunnableConfig:
    return {"configurable": {"thread_id": name}}


# -- the saver -------------------------------------------------------------------------------


async def test_a_sync_graph_runs_in_a_worker_thread_while_the_loop_serves_the_world(
    world: World,
) -> None:
    saver = WorldCheckpointSaver(world)
    graph = _graph(saver, lambda state: {"log": ["ran"]})

    def invoke() -> Any:
        return graph.invoke({"log": []}, _thread("sync"))

    state = await anyio.to_thread.run_sync(invoke)
    assert state["log"] == ["ran"]
    latest = await saver.aget_tuple(_thread("sync"))
    assert latest is not None
    assert latest.checkpoint["channel_values"]["log"] == ["ran"]
    listed = await anyio.to_thread.run_sync(lambda: list(saver.list(_thread("sync"))))
    assert listed[0].checkpoint["id"] == latest.checkpoint["id"]


async def test_a_sync_method_on_the_loop_thread_says_to_use_the_async_api(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    with pytest.raises(RuntimeError, match=r"ainvoke"):
        saver.get_tuple(_thread("t"))


def test_blocking_opens_a_world_for_code_without_an_event_loop(tmp_path: Path) -> None:
    url = str(tmp_path / "world")
    with WorldCheckpointSaver.blocking("local", url=url, namespace="lg") as saver:
        graph = _graph(saver, lambda state: {"log": ["ran"]})
        assert graph.invoke({"log": []}, _thread("plain"))["log"] == ["ran"]
        assert graph.invoke({"log": []}, _thread("plain"))["log"] == ["ran", "ran"]
        assert len(list(saver.list(_thread("plain")))) == 6  # input, loop, per invoke
    with pytest.raises(RuntimeError):  # its loop and World are closed
        saver.get_tuple(_thread("plain"))


def test_a_saver_whose_event_loop_ended_refuses_sync_calls(tmp_path: Path) -> None:
    async def make() -> WorldCheckpointSaver:
        async with open_world("local", url=str(tmp_path / "w"), namespace="lg") as opened:
            return WorldCheckpointSaver(opened)

    saver = anyio.run(make)  # its loop is gone
    with pytest.raises(RuntimeError):
        saver.get_tuple(_thread("t"))


async def test_bad_configs_are_refused_naming_what_to_pass(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    with pytest.raises(InvalidArgumentError, match="thread_id"):
        await saver.aget_tuple({"configurable": {}})
    with pytest.raises(InvalidArgumentError, match="configurable"):
        await saver.aget_tuple({})
    with pytest.raises(InvalidArgumentError, match="checkpoint_id"):
        await saver.aput_writes(_thread("t"), [("ch", 1)], "task")
    with pytest.raises(InvalidArgumentError, match="strategy"):
        await saver.aprune(["t"], strategy="keep_some")
    with pytest.raises(InvalidArgumentError, match="limit"):
        _ = [t async for t in saver.alist(_thread("t"), limit=-1)]
    with pytest.raises(InvalidArgumentError, match="World"):
        # why: the wrong type is the point: its refusal is tested
        WorldCheckpointSaver("local")  # type: ignore[arg-type]


async def _put(saver: WorldCheckpointSaver, thread: str, parent: RunnableConfig | None) -> Any:
    config = generate_config(thread)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return await saver.aput(config, generate_checkpoint(), generate_metadata(), {})


async def test_a_generation_a_crash_left_half_written_is_ignored(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    first = await _put(saver, "t", None)
    second = await _put(saver, "t", first)
    # A prune that died after its first batch: a newer generation, never marked ready.
    stray = "langgraph/1:t/0:/00000007"
    await world.log.append(stray, [NewEvent(data=b'{"t":"c"}', key="c/x")], status="building")
    latest = await saver.aget_tuple(_thread("t"))
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == second["configurable"]["checkpoint_id"]
    await saver.aprune(["t"], strategy="keep_latest")
    listed = [t async for t in saver.alist(_thread("t"))]
    assert [t.config for t in listed] == [second]
    page = await world.log.list_logs(prefix="langgraph/1:t/")
    assert [i.status for i in page.items] == ["ready"]  # the stray is gone too
    await saver.adelete_thread("t")
    assert (await world.log.list_logs(prefix="langgraph/")).items == []


async def test_a_copy_a_crash_left_half_written_does_not_join_the_thread(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    leftover = "langgraph/1:t/0:/00000000"  # copy_thread died before its last batch
    await world.log.append(leftover, [NewEvent(data=b'{"t":"c"}', key="c/x")], status="building")
    stored = await _put(saver, "t", None)
    listed = [t.config async for t in saver.alist(_thread("t"))]
    assert listed == [stored]
    assert (await world.log.info(leftover)) is not None  # untouched, still not in force
    assert (await world.log.info("langgraph/1:t/0:/00000001")) is not None


async def test_writes_stored_before_their_checkpoint_belong_to_it(world: World) -> None:
    # LangGraph's default durability ("async") saves a checkpoint and the writes of the
    # tasks after it concurrently: the writes may land first.
    saver = WorldCheckpointSaver(world)
    checkpoint = generate_checkpoint()
    config = generate_config("t", checkpoint_id=checkpoint["id"])
    await saver.aput_writes(config, [("ch", "early")], "task-1")
    stored = await saver.aput(generate_config("t"), checkpoint, generate_metadata(), {})
    await saver.aput_writes(stored, [("ch", "late")], "task-2")
    found = await saver.aget_tuple(_thread("t"))
    assert found is not None
    assert found.pending_writes == [("task-1", "ch", "early"), ("task-2", "ch", "late")]


async def test_an_interrupted_graph_resumes_with_default_durability(world: World) -> None:
    saver = WorldCheckpointSaver(world)

    def ask(state: State) -> dict[str, list[str]]:
        return {"log": [f"answer={interrupt('approve?')}"]}

    graph = _graph(saver, ask)
    first = await graph.ainvoke({"log": []}, _thread("t"))
    assert [i.value for i in first["__interrupt__"]] == ["approve?"]
    waiting = await graph.aget_state(_thread("t"))
    assert waiting.next == ("work",)
    assert [i.value for task in waiting.tasks for i in task.interrupts] == ["approve?"]
    done = await graph.ainvoke(Command(resume="yes"), _thread("t"))
    assert done["log"] == ["answer=yes"]
    history = [h async for h in graph.aget_state_history(_thread("t"))]
    assert [h.metadata["source"] for h in history if h.metadata] == ["loop", "loop", "input"]


async def test_list_across_threads_with_filter_before_and_limit(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    a1 = await _put(saver, "a", None)
    a2 = await _put(saver, "a", a1)
    b1 = await _put(saver, "b", None)
    everything = [t.config async for t in saver.alist(None)]
    assert everything == [a2, a1, b1]
    assert [t.config async for t in saver.alist(None, limit=2)] == [a2, a1]
    assert [t.config async for t in saver.alist(None, limit=0)] == []
    assert [t.config async for t in saver.alist(_thread("a"), before=a2)] == [a1]
    assert [t.config async for t in saver.alist(None, filter={"source": "nothing"})] == []
    assert [t.config async for t in saver.alist(a1)] == [a1]  # one checkpoint by its id


async def test_copy_thread_into_a_thread_with_checkpoints_is_refused(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    await _put(saver, "a", None)
    await _put(saver, "b", None)
    with pytest.raises(InvalidArgumentError, match="delete_thread"):
        await saver.acopy_thread("a", "b")


async def test_a_checkpoint_id_is_written_once(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    checkpoint = generate_checkpoint()
    config = generate_config("t")
    await saver.aput(config, checkpoint, generate_metadata(), {})
    await saver.aput(config, checkpoint, generate_metadata(), {})  # a retry: the same content
    with pytest.raises(InvalidArgumentError, match="written once"):
        await saver.aput(config, checkpoint, generate_metadata(step=9), {})


# -- durable_tool --------------------------------------------------------------------------


async def _send_cut_off(saver: WorldCheckpointSaver, seconds: float) -> tuple[Any, list[str]]:
    """A graph (thread "t") whose never send to ada was cut off after its effect, before its
    outcome (its timeout: seconds): its first run raised SimulatedCrash there; the next run
    resumes. And the effects."""
    effects: list[str] = []
    crash = [True]

    async def send(to: str) -> str:
        effects.append(to)
        if crash[0]:
            raise SimulatedCrash("killed after the effect, before its outcome")
        return f"sent to {to}"

    durable_send = durable_tool(send, replay="never", saver=saver, timeout=seconds)

    async def node(state: State) -> dict[str, list[str]]:
        try:
            return {"log": [await durable_send("ada")]}
        except PossiblyRanError as exc:
            return {"log": [exc.error]}

    graph = _graph(saver, node)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke({"log": []}, _thread("t"))
    crash[0] = False
    return graph, effects


async def test_a_never_call_cut_off_is_not_run_again_and_may_have_run(world: World) -> None:
    graph, effects = await _send_cut_off(WorldCheckpointSaver(world), 0.2)
    with anyio.fail_after(30):
        state = await graph.ainvoke(None, _thread("t"))  # the super-step runs again
    assert state["log"] == [POSSIBLY_RAN]
    assert effects == ["ada"]  # at most once


async def test_a_finished_call_is_read_back_when_its_task_runs_again(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    calls: list[int] = []
    crash = [True]

    def model(question: str) -> dict[str, Any]:
        calls.append(1)
        return {"answer": question.upper()}

    durable_model = durable_tool(model, replay="safe", saver=saver)

    def node(state: State) -> dict[str, list[str]]:
        first = durable_model("a")
        if crash[0]:
            raise SimulatedCrash("killed after the reply was recorded")
        return {"log": [first["answer"], durable_model("b")["answer"]]}

    graph = _graph(saver, node)
    with pytest.raises(SimulatedCrash):
        await anyio.to_thread.run_sync(lambda: graph.invoke({"log": []}, _thread("t")))
    crash[0] = False
    state = await anyio.to_thread.run_sync(lambda: graph.invoke(None, _thread("t")))
    assert state["log"] == ["A", "B"]
    assert len(calls) == 2  # "a" once, read back; then "b"


async def test_a_failed_call_is_recorded_and_raised_again_without_running(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    runs: list[int] = []
    crash = [True]

    async def refund() -> str:
        runs.append(1)
        raise ValueError("card declined")

    durable_refund = durable_tool(refund, replay="never", saver=saver, timeout=5)

    async def node(state: State) -> dict[str, list[str]]:
        try:
            await durable_refund()
        except ToolError as exc:
            if crash[0]:
                raise SimulatedCrash("killed after the failure was recorded") from exc
            return {"log": [exc.error]}
        return {"log": ["refunded"]}

    graph = _graph(saver, node)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke({"log": []}, _thread("t"))
    crash[0] = False
    state = await graph.ainvoke(None, _thread("t"))
    assert state["log"] == ["ValueError: card declined"]
    assert runs == [1]


async def test_durable_tool_refuses_bad_arguments_and_calls_outside_a_node(world: World) -> None:
    saver = WorldCheckpointSaver(world)

    def send() -> None: ...

    with pytest.raises(InvalidArgumentError, match="replay"):
        # why: the wrong type is the point: its refusal is tested
        durable_tool(send, replay="sometimes", saver=saver)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="timeout"):
        durable_tool(send, replay="never", saver=saver, timeout=0)
    with pytest.raises(InvalidArgumentError, match="finite"):
        durable_tool(send, replay="never", saver=saver, timeout=float("inf"))
    with pytest.raises(InvalidArgumentError, match="saver"):
        # why: the wrong type is the point: its refusal is tested
        durable_tool(send, replay="never", saver=world)  # type: ignore[arg-type]
    wrapped = durable_tool(send, replay="safe", saver=saver)
    with pytest.raises(RuntimeError, match="outside a LangGraph node"):
        await anyio.to_thread.run_sync(wrapped)


async def test_delete_thread_deletes_the_durable_records_too(world: World) -> None:
    saver = WorldCheckpointSaver(world)

    async def effect() -> str:
        return "done"

    durable_effect = durable_tool(effect, replay="never", saver=saver)

    async def node(state: State) -> dict[str, list[str]]:
        return {"log": [await durable_effect()]}

    await _graph(saver, node).ainvoke({"log": []}, _thread("t"))
    assert (await world.log.list_logs(prefix="langgraph-steps/")).items != []
    await saver.adelete_thread("t")
    assert (await world.log.list_logs(prefix="langgraph")).items == []


async def test_a_retry_policy_attempt_reads_back_the_never_call_of_the_attempt_before(
    world: World,
) -> None:
    saver = WorldCheckpointSaver(world)
    effects: list[int] = []
    model_calls: list[int] = []

    async def charge() -> str:
        effects.append(1)
        return "charged"

    async def model() -> str:
        model_calls.append(1)
        if len(model_calls) == 1:
            raise ConnectionError("provider outage")  # a safe call's failure: not recorded
        return "answer"

    durable_charge = durable_tool(charge, replay="never", saver=saver)
    durable_model = durable_tool(model, replay="safe", saver=saver)

    async def node(state: State) -> dict[str, list[str]]:
        charged = await durable_charge()
        return {"log": [charged, await durable_model()]}

    builder = StateGraph(State)
    builder.add_node("work", node, retry_policy=RetryPolicy(initial_interval=0.01, jitter=False))
    builder.add_edge(START, "work")
    builder.add_edge("work", END)
    state = await builder.compile(checkpointer=saver).ainvoke({"log": []}, _thread("t"))
    assert state["log"] == ["charged", "answer"]
    assert effects == [1]  # the second attempt read the charge back
    assert len(model_calls) == 2  # the failed model call ran again


async def test_an_async_never_call_past_its_deadline_is_cut_off_and_may_have_run(
    world: World,
) -> None:
    saver = WorldCheckpointSaver(world)

    async def slow() -> str:
        await anyio.sleep(30)
        return "late"

    durable_slow = durable_tool(slow, replay="never", saver=saver, timeout=0.1)

    async def node(state: State) -> dict[str, list[str]]:
        with pytest.raises(PossiblyRanError):
            await durable_slow()
        return {"log": ["cut off"]}

    with anyio.fail_after(20):
        state = await _graph(saver, node).ainvoke({"log": []}, _thread("t"))
    assert state["log"] == ["cut off"]


async def test_a_different_call_at_a_named_place_is_refused(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    crash = [True]

    async def send(to: str) -> str:
        return f"sent to {to}"

    durable_send = durable_tool(send, replay="never", saver=saver, key=lambda to: "the-send")

    async def node(state: State) -> dict[str, list[str]]:
        sent = await durable_send("ada" if crash[0] else "bob")  # the code changed meanwhile
        if crash[0]:
            raise SimulatedCrash("killed after the send was recorded")
        return {"log": [sent]}

    graph = _graph(saver, node)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke({"log": []}, _thread("t"))
    crash[0] = False
    with pytest.raises(NonDeterminismError) as raised:
        await graph.ainvoke(None, _thread("t"))
    assert raised.value.position.endswith("/send/key/the-send")


async def test_concurrent_calls_of_a_task_find_their_records_in_any_order(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    effects: list[str] = []
    crash = [True]

    async def send(to: str) -> str:
        effects.append(to)
        await anyio.sleep(0.01 if to == "ada" else 0)
        return f"sent to {to}"

    durable_send = durable_tool(send, replay="never", saver=saver)

    async def node(state: State) -> dict[str, list[str]]:
        names = ["ada", "bob", "ada"] if crash[0] else ["bob", "ada", "ada"]  # another order
        sent: list[str] = []

        async def one(to: str) -> None:
            sent.append(await durable_send(to))

        async with anyio.create_task_group() as group:
            for to in names:
                group.start_soon(one, to)
        if crash[0]:
            raise SimulatedCrash("killed after the sends were recorded")
        return {"log": sorted(sent)}

    graph = _graph(saver, node)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke({"log": []}, _thread("t"))
    crash[0] = False
    state = await graph.ainvoke(None, _thread("t"))
    assert state["log"] == ["sent to ada", "sent to ada", "sent to bob"]
    assert sorted(effects) == ["ada", "ada", "bob"]  # each of the three calls ran once


async def test_two_resumes_of_one_thread_at_once_run_a_never_call_once(world: World) -> None:
    """Two processes resume a thread cut off before its send, at the same time: both run the
    super-step, both find no record of the send, both try to write its intent; the one whose
    intent was refused (another's was there) must not send, and answers with the other's
    outcome. It sent twice before (the refused intent write was taken as its own)."""
    saver = WorldCheckpointSaver(world)
    effects: list[str] = []
    crash = [True]
    arrived: list[int] = []
    both = anyio.Event()

    async def send(to: str) -> str:
        effects.append(to)
        return f"sent to {to}"

    durable_send = durable_tool(send, replay="never", saver=saver, timeout=5)

    async def node(state: State) -> dict[str, list[str]]:
        if crash[0]:
            raise SimulatedCrash("killed before the send")
        arrived.append(1)
        if len(arrived) == 2:
            both.set()
        await both.wait()  # both resumes are in the task, neither has looked for the send
        return {"log": [await durable_send("ada")]}

    graph = _graph(saver, node)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke({"log": []}, _thread("t"))
    crash[0] = False
    states: list[dict[str, Any]] = []

    async def resume() -> None:
        states.append(await graph.ainvoke(None, _thread("t")))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(resume)
            group.start_soon(resume)
    assert effects == ["ada"]
    assert [state["log"] for state in states] == [["sent to ada"], ["sent to ada"]]


async def test_a_tool_node_running_tool_calls_in_parallel_threads(world: World) -> None:
    saver = WorldCheckpointSaver(world)
    effects: list[str] = []

    def send(to: str) -> str:
        """Send an email."""
        effects.append(to)
        return f"sent to {to}"

    tools = ToolNode([tool(durable_tool(send, replay="never", saver=saver))])
    builder = StateGraph(MessagesState)
    builder.add_node("tools", tools)
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=saver)
    calls = [{"name": "send", "args": {"to": to}, "id": f"call-{to}"} for to in ("ada", "bob")]
    request = AIMessage(content="", tool_calls=calls)

    def invoke() -> Any:
        return graph.invoke({"messages": [request]}, _thread("t"))

    state = await anyio.to_thread.run_sync(invoke)
    assert sorted(str(m.content) for m in state["messages"][1:]) == ["sent to ada", "sent to bob"]
    assert sorted(effects) == ["ada", "bob"]


async def test_arguments_that_are_not_json_need_a_key(world: World) -> None:
    saver = WorldCheckpointSaver(world)

    class Client:  # not data: it could not be told apart from another in the next run
        pass

    async def send(client: Client, to: str) -> str:
        return f"sent to {to}"

    unkeyed = durable_tool(send, replay="never", saver=saver)
    keyed = durable_tool(send, replay="never", saver=saver, key=lambda client, to: to)

    async def node(state: State) -> dict[str, list[str]]:
        with pytest.raises(InvalidArgumentError, match="key="):
            await unkeyed(Client(), "ada")
        return {"log": [await keyed(Client(), "ada")]}

    state = await _graph(saver, node).ainvoke({"log": []}, _thread("t"))
    assert state["log"] == ["sent to ada"]


class _OutcomeLandsLast(PassThroughLog):
    """Before the first "interrupted" outcome is appended, appends ``landing`` (the other
    run's own outcome, under the same key): it lands after the waiter's last look, as a slow
    run's outcome can."""

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.landing: bytes | None = None
        self.landed = False

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        first = events[0]
        if self.landing is not None and first.key is not None and b'"interrupted"' in first.data:
            landing, self.landing, self.landed = self.landing, None, True
            await self.inner.append(log_id, [NewEvent(key=first.key, data=landing)])
        return await super().append(
            log_id, events, expect_tail=expect_tail, status=status, messages=messages
        )


async def test_an_outcome_landing_after_the_last_look_is_the_answer_not_interrupted(
    world: World,
) -> None:
    """A run that waits out another run's never call looks for its outcome, finds none by the
    deadline and records it interrupted: the other run's outcome may land between the last
    look and that write. The outcome's key decides: the waiter's write is refused, it answers
    with the call's real outcome, and the log holds that one outcome only."""
    log = _OutcomeLandsLast(world.log)
    saver = WorldCheckpointSaver(PassThroughWorld(world, log=log))
    graph, effects = await _send_cut_off(saver, 0.1)  # as if another run is still sending
    (steps_log,) = [
        info.log_id
        for info in (await world.log.list_logs(prefix="langgraph")).items
        if "steps" in info.log_id
    ]
    (intent,) = await world.log.read(steps_log)
    identity = json.loads(intent.data)["id"]
    value = saver.serde.dumps_typed("sent to ada")
    log.landing = json.dumps(
        {"value": [value[0], base64.b64encode(value[1]).decode()], "id": identity}
    ).encode()
    with anyio.fail_after(30):
        state = await graph.ainvoke(None, _thread("t"))
    assert log.landed  # the other run's outcome landed right before the write
    assert state["log"] == ["sent to ada"]
    assert effects == ["ada"]
    outcomes = [e for e in await world.log.read(steps_log) if e.key and e.key.endswith("outcome")]
    assert [json.loads(e.data).get("interrupted") for e in outcomes] == [None]


@pytest.mark.parametrize("replay", ["never", "safe"])
async def test_a_result_the_saver_cannot_store_is_recorded_as_the_call_s_failure(
    world: World, replay: Replay
) -> None:
    """A call returns what the serializer cannot store (a client object, a lock): the call
    happened, so its failure is recorded and raised as ToolError now and when the task runs
    again, without running it again. The serializer's TypeError escaped before, after the
    effect and before any outcome: a never call was answered "may have happened" once its
    deadline passed, a safe one (a paid model call) ran again on every retry."""
    saver = WorldCheckpointSaver(world)
    effects: list[str] = []

    async def send(to: str) -> Any:
        effects.append(to)
        return threading.Lock()  # what no serializer stores

    durable_send = durable_tool(send, replay=replay, saver=saver, timeout=30)
    errors: list[str] = []
    crash = [True]

    async def node(state: State) -> dict[str, list[str]]:
        try:
            await durable_send("ada")
        except ToolError as exc:
            errors.append(exc.error)
        if crash[0]:
            raise SimulatedCrash("killed after the call")
        return {"log": ["ran"]}

    graph = _graph(saver, node)
    with anyio.fail_after(10), pytest.raises(SimulatedCrash):
        await graph.ainvoke({"log": []}, _thread("t"))
    crash[0] = False
    with anyio.fail_after(10):
        await graph.ainvoke(None, _thread("t"))  # the super-step runs again
    error = "send returned a value the saver cannot store: Type is not msgpack serializable"
    assert [entry[: len(error)] for entry in errors] == [error, error]
    assert effects == ["ada"]
