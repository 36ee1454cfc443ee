"""A LangGraph agent made durable with world: copy :func:`build_graph` and change the tools.

The graph is the usual two-node agent: ``agent`` asks the model, ``tools`` runs the tool calls
of its reply, until the model answers without one. What world adds is three lines:

* ``WorldCheckpointSaver(world)`` as the checkpointer: the thread's state lives in the World
  (any backend), and ``graph.ainvoke(None, config)`` resumes it in any process after a crash;
* the model call wrapped ``durable_tool(..., replay="safe")``: a reply the graph had received
  is read back when a super-step runs again, never paid for twice;
* ``send_email`` wrapped ``durable_tool(..., replay="never")``: it runs at most once; a
  super-step that runs again after an interrupted send gets "may or may not have happened"
  (:data:`~world_core.POSSIBLY_RAN`), which the model answers by checking the inbox.

``build_graph(saver, durable=False)`` is the same graph with LangGraph's resume alone (the
model and the tools called directly), which ``world demo langgraph`` runs for comparison.

The model is scripted (:func:`world_examples.crash_agent.policy`, a function of the
conversation), the tools are the crash-matrix agent's: ``send_email`` speaks SMTP to the demo's
inbox. Environment (the demo sets it for each process): ``WORLD_DEMO_SMTP``,
``WORLD_DEMO_MAILDIR``, ``WORLD_DEMO_CALLS`` (each model call appends ``{"pid", "digest",
"event"}``: ``called`` when paid, ``returned`` when handed back to the graph) and
``CRASH_AT=<super-step>:<before_run|after_run|before_save>`` (die there, ``os._exit(1)``):

``before_run``   in the node, before the model or tool call (for ``never``: its intent is durable)
``after_run``    the call returned (the email went out, the reply arrived), nothing recorded yet
``before_save``  the node returned, before LangGraph saved the task's writes (the checkpoint)
"""

from __future__ import annotations

import json
import os
import smtplib
from collections.abc import Callable, Sequence
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from world_core import (
    POSSIBLY_RAN,
    ConfigurationError,
    ModelRequest,
    PossiblyRanError,
    ToolError,
    World,
    digest_of,
    open_world,
)
from world_core.integrations.langgraph import WorldCheckpointSaver, durable_tool
from world_examples._maildir import SESSION_HEADER, read_maildir
from world_examples.crash_agent import MESSAGE, lookup_note, policy

__all__ = [
    "CRASH_POINTS",
    "MESSAGE",
    "SEND_TIMEOUT",
    "build_graph",
    "reply_of",
    "run_thread",
]

SEND_TIMEOUT = 2.0
"""send_email's deadline: a super-step that runs again after an interrupted send waits until
then (plus a second's margin) before answering that it may or may not have happened."""

CRASH_POINTS = ("before_run", "after_run", "before_save")
"""Where in a super-step ``CRASH_AT`` can end the process (see the module docstring)."""

When = Literal["before_run", "after_run", "before_save"]


# -- crash injection (the demo's, not something a user copies) -------------------------------


def _crash_at() -> tuple[int, str] | None:
    value = os.environ.get("CRASH_AT", "").strip()
    if not value:
        return None
    step, _, when = value.partition(":")
    if not step.isdigit() or when not in CRASH_POINTS:
        raise ConfigurationError(
            f"CRASH_AT={value!r} is invalid: use <super-step>:<{'|'.join(CRASH_POINTS)}>, "
            "for example CRASH_AT=4:after_run (LangGraph counts super-steps from 1)"
        )
    return int(step), when


_save_crash = False  # set by a node whose super-step must die before its writes are saved


def _die() -> None:
    os._exit(1)  # like a kill: no finally block, no buffered write


def _maybe_crash(when: When) -> None:
    global _save_crash
    point = _crash_at()
    if point is None:
        return
    step = int(get_config()["metadata"].get("langgraph_step", -1))
    if point == (step, when):
        if when == "before_save":
            _save_crash = True
        else:
            _die()


class _CrashingSaver(WorldCheckpointSaver):
    """Dies at the first ``put_writes`` after a node asked for ``before_save``."""

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if _save_crash:
            _die()
        await super().aput_writes(config, writes, task_id, task_path)


# -- the model and the tools -------------------------------------------------------------------


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigurationError(f"set {name} (world demo langgraph sets it for its processes)")
    return value


def _count(digest: str, event: str) -> None:
    calls = os.environ.get("WORLD_DEMO_CALLS")
    if calls:
        line = json.dumps({"pid": os.getpid(), "digest": digest, "event": event})
        with Path(calls).open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def chat(messages: list[AnyMessage]) -> AIMessage:
    """The scripted model: the crash-matrix agent's policy over the conversation."""
    _maybe_crash("before_run")
    request = ModelRequest(messages=convert_to_openai_messages(messages))
    digest = digest_of(request.model_dump(mode="json"))
    reply = policy(request)
    _count(digest, "called")  # paid for
    _maybe_crash("after_run")
    _count(digest, "returned")  # handed back to the graph
    calls = [
        {"name": c.name, "args": json.loads(c.arguments or "{}"), "id": c.id}
        for c in reply.tool_calls
    ]
    return AIMessage(content=reply.content or "", tool_calls=calls)


def send_email(to: str, subject: str, body: str) -> str:
    """Send an email (SMTP): the side effect that must not happen twice."""
    _maybe_crash("before_run")
    host, _, port = _env("WORLD_DEMO_SMTP").rpartition(":")
    message = EmailMessage()
    message["From"] = "agent@world.example"
    message["To"] = to
    message["Subject"] = subject
    message[SESSION_HEADER] = str(get_config()["configurable"]["thread_id"])
    message.set_content(body)
    with smtplib.SMTP(host, int(port), timeout=SEND_TIMEOUT / 2) as smtp:
        smtp.send_message(message)
    _maybe_crash("after_run")
    return f"sent to {to}"


def check_sent(to: str, subject: str) -> str:
    """Has an email with this subject reached this recipient? (reads the inbox)"""
    _maybe_crash("before_run")
    thread = str(get_config()["configurable"]["thread_id"])
    delivered = [
        m
        for m in read_maildir(Path(_env("WORLD_DEMO_MAILDIR")), thread)
        if m["To"] == to and m["Subject"] == subject
    ]
    _maybe_crash("after_run")
    return f"yes: {len(delivered)} delivered" if delivered else "no: nothing delivered"


def _lookup(topic: str) -> str:
    _maybe_crash("before_run")
    note = lookup_note(topic)
    _maybe_crash("after_run")
    return note


# -- the graph ---------------------------------------------------------------------------------


def build_graph(saver: WorldCheckpointSaver, *, durable: bool = True) -> CompiledStateGraph[Any]:
    """The agent graph, checkpointed by ``saver``; ``durable=False`` calls the model and the
    tools directly (LangGraph's own resume only)."""
    model: Callable[[list[AnyMessage]], AIMessage] = chat
    tools: dict[str, Callable[..., str]] = {
        "lookup_note": _lookup,
        "send_email": send_email,
        "check_sent": check_sent,
    }
    if durable:
        model = durable_tool(chat, replay="safe", saver=saver, name="model")
        tools = {
            "lookup_note": durable_tool(_lookup, replay="safe", saver=saver, name="lookup_note"),
            "send_email": durable_tool(
                send_email, replay="never", saver=saver, timeout=SEND_TIMEOUT
            ),
            "check_sent": durable_tool(check_sent, replay="safe", saver=saver),
        }

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        reply = model(state["messages"])
        _maybe_crash("before_save")
        return {"messages": [reply]}

    def run_tools(state: MessagesState) -> dict[str, list[AnyMessage]]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        results: list[AnyMessage] = []
        for call in last.tool_calls:
            try:
                content = tools[call["name"]](**call["args"])
            except PossiblyRanError:
                content = POSSIBLY_RAN  # the model checks before trying again
            except ToolError as exc:
                content = f"Error: {exc.error}"
            results.append(ToolMessage(content=content, tool_call_id=call["id"]))
        _maybe_crash("before_save")
        return {"messages": results}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", run_tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def reply_of(messages: Sequence[AnyMessage]) -> str | None:
    """The agent's final answer: the last message, when it is the model's without tool calls."""
    if messages and isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls:
        return str(messages[-1].content)
    return None


async def run_thread(world: World, thread_id: str, *, durable: bool) -> str | None:
    """Run (or resume, when it has a checkpoint) the demo thread to its end; its reply."""
    saver = _CrashingSaver(world)
    graph = build_graph(saver, durable=durable)
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    started = await saver.aget_tuple(config) is not None
    inputs = None if started else {"messages": [HumanMessage(MESSAGE)]}
    # durability="sync": LangGraph's strongest mode, each super-step saved before the next.
    state = await graph.ainvoke(inputs, config, durability="sync")
    return reply_of(state["messages"])


def _child(
    target: str | None,
    url: str | None,
    namespace: str,
    thread_id: str,
    durable: bool,
    env: dict[str, str],
) -> None:
    """One process of the demo: run or resume the thread (``CRASH_AT`` may end it)."""
    import anyio

    os.environ.update(env)

    async def main() -> None:
        async with open_world(target, url=url, namespace=namespace) as world:
            await run_thread(world, thread_id, durable=durable)

    anyio.run(main)
