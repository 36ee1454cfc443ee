"""Agents for ``world worker --agent replay_support:...`` and ``world replay-check --agent
replay_support:...`` in the processes test_cli_replay.py starts (imported through PYTHONPATH).

The scripted model looks a topic up (``lookup``, safe), sends it (``send``, never), and
answers with what ``send`` said.
"""

from __future__ import annotations

import json

from world_core import Agent, ModelReply, ModelRequest, ScriptedModel, ToolCall, tool


def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"The note about {topic}: launch on Thursday."


def send(text: str) -> str:
    """Send a text (a side effect: never run twice)."""
    return f"sent {len(text)} characters"


def policy(request: ModelRequest) -> ModelReply:
    results = [m for m in request.messages if m["role"] == "tool"]
    if not results:
        return ModelReply(
            tool_calls=[ToolCall(id="c0", name="lookup", arguments=json.dumps({"topic": "x"}))]
        )
    if len(results) == 1:
        text = json.dumps({"text": results[0]["content"]})
        return ModelReply(tool_calls=[ToolCall(id="c1", name="send", arguments=text)])
    return ModelReply(content=f"done: {results[-1]['content']}")


def build(system: str = "You help.") -> Agent:
    return Agent(
        model=ScriptedModel(policy),
        tools=[tool(lookup, replay="safe"), tool(send, replay="never")],
        system=system,
    )


def reworded() -> Agent:
    """The same agent with another system prompt."""
    return build("You help, briefly.")
