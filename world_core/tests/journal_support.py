"""An agent for worker processes started by the journal tests (imported through PYTHONPATH).

Its one tool, ``wait_here`` (safe), writes the file named by ``JOURNAL_TEST_MARKER`` and then
waits forever, so a test knows the worker is inside a turn and can signal it there.
Also :func:`stall_once`, for the adapters' tests of a call refused for a lost lease.
"""

from __future__ import annotations

import json
import os
import threading
import time

import anyio

from world_core import Agent, Journal, ModelReply, ModelRequest, ScriptedModel, ToolCall, tool


def policy(request: ModelRequest) -> ModelReply:
    if any(m["role"] == "tool" for m in request.messages):
        return ModelReply(content="finished")
    call = ToolCall(id="call_0", name="wait_here", arguments=json.dumps({"label": "x"}))
    return ModelReply(tool_calls=[call])


async def wait_here(label: str) -> str:
    """Signal that the turn is running, then wait."""
    await anyio.Path(os.environ["JOURNAL_TEST_MARKER"]).write_text(label)
    await anyio.sleep_forever()
    return label


def build() -> Agent:
    return Agent(model=ScriptedModel(policy), tools=[tool(wait_here, replay="safe")])


def blocking_policy(request: ModelRequest) -> ModelReply:
    if any(m["role"] == "tool" for m in request.messages):
        return ModelReply(content="finished")
    call = ToolCall(id="call_0", name="block", arguments=json.dumps({"label": "x"}))
    return ModelReply(tool_calls=[call])


def block(label: str) -> str:
    """Block this thread for good (a sync call that never returns)."""
    threading.Event().wait()
    return label


def build_blocking() -> Agent:
    """A sync tool that never returns, with a short timeout: the journal abandons its thread."""
    return Agent(
        model=ScriptedModel(blocking_policy), tools=[tool(block, replay="safe", timeout=0.5)]
    )


def build_replying() -> Agent:
    """An agent whose turn ends at once: the model replies without calling a tool."""
    return Agent(model=ScriptedModel(lambda request: ModelReply(content="finished")))


def build_without_key() -> Agent:
    """A factory that cannot build its agent (as one whose API key is not set)."""
    raise RuntimeError("OPENAI_API_KEY is not set")


class _Replying:
    """A TurnAgent that is not an Agent (as WorldAgent and DurableAgent are not)."""

    async def run_turn(self, journal: Journal) -> str:
        return await journal.finish("finished")


replying = _Replying()


async def build_async() -> Agent:
    """A factory written async by mistake: calling it gives a coroutine, not an agent."""
    return build_replying()


def stall_once(stalled: list[bool]) -> None:
    """The first time (``stalled`` empty): block the event loop 1.5 s, past a 1 s lease, as a
    first import or CPU-bound work would, so the tool's ``check()`` that follows refuses."""
    if not stalled:
        stalled.append(True)
        time.sleep(1.5)
