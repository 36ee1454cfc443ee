"""An agent for the live-event tests' worker processes (imported through PYTHONPATH).

Step 0 asks the model, which calls ``lookup`` (safe, step 1); step 2 asks the model again,
which answers with a few words of text (streamed word by word).
"""

from __future__ import annotations

import json

from world_core import Agent, ModelReply, ModelRequest, ScriptedModel, ToolCall, tool

REPLY = "The launch is on Thursday at ten, and the press kit is in the shared folder."


def policy(request: ModelRequest) -> ModelReply:
    if any(m["role"] == "tool" for m in request.messages):
        return ModelReply(content=REPLY)
    call = ToolCall(id="call_7", name="lookup", arguments=json.dumps({"topic": "launch"}))
    return ModelReply(tool_calls=[call])


def lookup(topic: str) -> str:
    """Read a note."""
    return f"note about {topic}: Thursday 10:00"


def build() -> Agent:
    return Agent(
        model=ScriptedModel(policy, stream_delay=0.01), tools=[tool(lookup, replay="safe")]
    )
