"""The agent the journal contracts run: ``lookup`` (safe) and ``act`` (never, a real side effect).

``act`` appends one line per call to a file (``O_APPEND``, one ``write``): the side effects are
counted there, outside the journal. ``lookup("note")`` reads a note; ``lookup("done")`` reports
whether ``act`` has happened for this session, which is how the scripted model checks the
state after being told a call may or may not have happened.

Worker processes build it with :func:`build_agent` from the environment:
``WORLD_JOURNAL_EFFECTS`` (the effects file) and ``WORLD_JOURNAL_ACT_REPLAY`` (``never``, or
``safe`` to show what a wrong label does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from world_core import (
    POSSIBLY_RAN,
    Agent,
    ModelReply,
    ModelRequest,
    Replay,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolRegistry,
    tool,
)
from world_core.errors import ConfigurationError

__all__ = ["MESSAGE", "REPLY", "build_agent", "careful", "careless", "effects", "make_agent"]

MESSAGE = "Act on the note."
REPLY = "Done: acted on the note once."
NOTE = "the note says: ship it"
ACT_TIMEOUT = 2.0
"""act's deadline: short, since a worker that takes over a turn whose act was interrupted waits
for it before answering for the call."""


def effects(path: Path, session_id: str) -> list[str]:
    """The idempotency keys of the ``act`` calls that happened for ``session_id``."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[1] for line in lines if line.split("\t")[0] == session_id]


def _record(path: Path, context: ToolContext) -> None:
    line = f"{context.session_id}\t{context.idempotency_key}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def make_agent(
    effects_file: Path,
    *,
    act_replay: Replay = "never",
    model: ScriptedModel | None = None,
    before_act: Callable[[], Awaitable[None]] | None = None,
    after_act: Callable[[], Awaitable[None]] | None = None,
    act_timeout: float = ACT_TIMEOUT,
) -> Agent:
    """The agent; ``before_act`` / ``after_act`` run around the side effect (to make it slow);
    ``act_timeout`` is act's deadline."""

    def lookup(topic: str, context: ToolContext) -> str:
        """Look something up: "note" for the note, "done" to see whether act happened."""
        if topic == "done":
            return "yes" if effects(effects_file, context.session_id) else "no"
        return NOTE

    async def act(text: str, context: ToolContext) -> str:
        """Act on the text (a side effect that must not repeat)."""
        if before_act is not None:
            await before_act()
        _record(effects_file, context)
        if after_act is not None:
            await after_act()
        return "acted"

    return Agent(
        model=model if model is not None else ScriptedModel(careful),
        tools=ToolRegistry(
            [tool(lookup, replay="safe"), tool(act, replay=act_replay, timeout=act_timeout)]
        ),
        system="Act once. Check before repeating.",
    )


def _call(index: int, name: str, **arguments: str) -> ModelReply:
    return ModelReply(
        tool_calls=[ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))]
    )


def _state(request: ModelRequest) -> tuple[int, list[tuple[str, str, str]]]:
    messages = request.messages
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    turn = messages[start + 1 :]
    asked = len([m for m in turn if m["role"] == "assistant"])
    calls = {
        call["id"]: (call["function"]["name"], call["function"]["arguments"])
        for m in turn
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    }
    results = [(*calls[m["tool_call_id"]], m["content"]) for m in turn if m["role"] == "tool"]
    return asked, results


def careful(request: ModelRequest) -> ModelReply:
    """Looks up the note, acts; told the act may have happened, looks before acting again."""
    asked, results = _state(request)
    if not results:
        return _call(asked, "lookup", topic="note")
    name, arguments, content = results[-1]
    if name == "lookup" and json.loads(arguments)["topic"] == "note":
        return _call(asked, "act", text=content)
    if name == "act" and content == POSSIBLY_RAN:
        return _call(asked, "lookup", topic="done")
    if name == "lookup" and content == "no":
        return _call(asked, "act", text=NOTE)
    return ModelReply(content=REPLY)


def careless(request: ModelRequest) -> ModelReply:
    """Like :func:`careful`, but retries an interrupted act without looking: the failure the
    "may or may not have happened" result exists to prevent."""
    asked, results = _state(request)
    if results and results[-1][0] == "act" and results[-1][2] == POSSIBLY_RAN:
        return _call(asked, "act", text=NOTE)
    return careful(request)


def build_agent() -> Agent:
    """For ``world worker --agent world_conformance.journal_agent:build_agent``."""
    path = os.environ.get("WORLD_JOURNAL_EFFECTS")
    if not path:
        raise ConfigurationError("set WORLD_JOURNAL_EFFECTS to the side-effects file")
    replay = os.environ.get("WORLD_JOURNAL_ACT_REPLAY", "never")
    if replay not in ("safe", "never"):
        raise ConfigurationError("WORLD_JOURNAL_ACT_REPLAY must be 'safe' or 'never'")
    return make_agent(Path(path), act_replay="safe" if replay == "safe" else "never")
