"""The agent loop: model, tool calls, model ... until the model answers without tools.

Every model call and tool call goes through the turn's :class:`~world_core.Journal`, which is
the whole of crash safety; the loop itself is plain deterministic code, re-run on replay.
"""

from __future__ import annotations

from collections.abc import Iterable

from world_core.errors import InvalidArgumentError
from world_core.journal._continue import Summarize
from world_core.journal._journal import Journal
from world_core.journal._model import Message, ModelClient, ModelRequest
from world_core.journal._tools import Tool, ToolRegistry

__all__ = ["Agent"]


class Agent:
    """A tool-calling agent.

    Args:
        model: the model client.
        tools: a registry, or tools built with :func:`~world_core.tool`.
        system: the system prompt, sent first. Keep anything that changes between runs
            (dates, ids) out of it, or take it from the journal (``journal.now()``).
        max_model_calls: a turn that has not answered after this many model calls ends with
            a reply saying so (deterministically, so replay ends the same way).
        history_turns: how many of the session's earlier turns the model sees (the latest
            ones); None: all. As many as the session's checkpoints keep (up to 100, and 16 KiB
            of messages), a turn is opened from the latest checkpoint at the same cost at turn
            10 or 10,000; more are read from the whole log. Changing it changes what replays
            of open turns send.
        summarize: ``summarize(previous_summary, turns) -> str | None`` (may be async):
            when the session's log is continued in a fresh one (it grew past the worker's
            history limits), the summary of the turns left behind; the model sees it first.
        carry_turns: turns carried into a continued session's fresh log (besides the
            summary, the state and pending signals).
    """

    def __init__(
        self,
        *,
        model: ModelClient,
        tools: ToolRegistry | Iterable[Tool] = (),
        system: str | None = None,
        max_model_calls: int = 32,
        history_turns: int | None = None,
        summarize: Summarize | None = None,
        carry_turns: int = 20,
    ) -> None:
        if (
            isinstance(max_model_calls, bool)
            or not isinstance(max_model_calls, int)
            or max_model_calls < 1
        ):
            raise InvalidArgumentError(
                f"max_model_calls must be an int >= 1, got {max_model_calls!r}"
            )
        if not callable(getattr(model, "complete", None)):
            raise InvalidArgumentError(
                f"model must be a model client with an async complete(request) method "
                f"(ScriptedModel, OpenAIChatModel), got {type(model).__name__}"
            )
        if history_turns is not None and (
            isinstance(history_turns, bool)
            or not isinstance(history_turns, int)
            or history_turns < 0
        ):
            raise InvalidArgumentError(
                f"history_turns must be None or an int >= 0, got {history_turns!r}"
            )
        self.history_turns = history_turns
        if summarize is not None and not callable(summarize):
            raise InvalidArgumentError(f"summarize must be callable, got {summarize!r}")
        if isinstance(carry_turns, bool) or not isinstance(carry_turns, int) or carry_turns < 0:
            raise InvalidArgumentError(f"carry_turns must be an int >= 0, got {carry_turns!r}")
        self.summarize = summarize
        self.carry_turns = carry_turns
        self.model = model
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.system = system
        self.max_model_calls = max_model_calls

    def conversation(self, journal: Journal) -> list[Message]:
        """The messages the turn starts from: system, earlier turns (the last
        ``history_turns``), the user's message."""
        messages: list[Message] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        if journal.summary:
            summary = f"Summary of the conversation before the turns below: {journal.summary}"
            messages.append({"role": "system", "content": summary})
        history = journal.history
        if self.history_turns is not None:
            history = history[max(0, len(history) - self.history_turns) :]
            if not self.history_turns:
                history = []
        for message, reply in history:
            messages.append({"role": "user", "content": message})
            messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": journal.user_message})
        return messages

    async def run_turn(self, journal: Journal) -> str:
        """Run (or replay) the turn to its reply, record it, and return it."""
        messages = self.conversation(journal)
        schemas = self.tools.schemas()
        for _ in range(self.max_model_calls):
            reply = await journal.model(self.model, ModelRequest(messages=messages, tools=schemas))
            messages.append(reply.as_message())
            if not reply.tool_calls:
                return await journal.finish(reply.content or "")
            for call in reply.tool_calls:
                tool = self.tools.get(call.name)
                if tool is None:
                    content = f"Error: there is no tool named {call.name!r}"
                else:
                    content = await journal.tool(tool, call)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        return await journal.finish(
            f"(stopped: no answer after {self.max_model_calls} model calls)"
        )
