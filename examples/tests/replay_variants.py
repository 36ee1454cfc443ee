"""Changed versions of the demo's agent, for ``world replay-check --agent replay_variants:...``
in worker processes (imported through PYTHONPATH): each changes what the agent asks for in a
way a replay of the checked-in histories must notice, or must not.
"""

from __future__ import annotations

from world_core import Agent, Journal, Message, ToolRegistry
from world_examples.crash_agent import build_agent

PATCH = "look-before-sending"
"""The marker of :class:`PatchedAgent`'s new branch."""


def new_system_prompt() -> Agent:
    """The system prompt reworded: every model request differs at its first message."""
    agent = build_agent()
    agent.system = "You are a careful assistant. Never repeat anything with side effects."
    return agent


def without_check_sent() -> Agent:
    """``check_sent`` removed from the tools: every request offers one tool fewer."""
    agent = build_agent()
    agent.tools = ToolRegistry(t for t in agent.tools if t.name != "check_sent")
    return agent


class Forgetful(Agent):
    """No longer shows the model the session's earlier turns: the first turn's requests are
    the same, a later turn's are not."""

    def conversation(self, journal: Journal) -> list[Message]:
        messages = super().conversation(journal)
        return [m for m in messages if m["role"] == "system"] + messages[-1:]


def forgetful() -> Agent:
    base = build_agent()
    return Forgetful(model=base.model, tools=base.tools, system=base.system)


class PatchedAgent(Agent):
    """A code change behind ``journal.patched``: new runs take the new branch (and record its
    marker as a step), histories written before it replay the old one."""

    async def run_turn(self, journal: Journal) -> str:
        if journal.patched(PATCH):
            pass  # the new branch: here, only its marker
        return await super().run_turn(journal)


def patched() -> Agent:
    base = build_agent()
    return PatchedAgent(model=base.model, tools=base.tools, system=base.system)
