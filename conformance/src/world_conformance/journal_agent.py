"""The agent the journal contracts run: ``lookup`` (safe) and ``act`` (never, a real side effect).

``act`` appends one line per call to a file (``O_APPEND``, one ``write``): the side effects are
counted there, outside the journal. ``lookup("note")`` reads a note; ``lookup("done")`` reports
whether ``act`` has happened for this session, which is how the scripted model checks the
state after being told a call may or may not have happened.

Worker processes build it with :func:`build_agent` from the environment:
``WORLD_JOURNAL_EFFECTS`` (the effects file) and ``WORLD_JOURNAL_ACT_REPLAY`` (``never``, or
``safe`` to show what a wrong label does). The pause, failure and shutdown contracts
(``journal_resilience``) use :func:`build_process_agent`, which also reads how ``act`` behaves
(:class:`ActScript`) and how the agent is broken from the environment; a worker process started
with ``WORLD_JOURNAL_LOG=info`` logs the worker's info lines (signals, turn results) to stderr,
where those contracts wait for them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from world_core import (
    POSSIBLY_RAN,
    Agent,
    Journal,
    ModelReply,
    ModelRequest,
    Replay,
    ScriptedModel,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    tool,
)
from world_core.errors import ConfigurationError

__all__ = [
    "MESSAGE",
    "REPLY",
    "ActScript",
    "build_agent",
    "build_process_agent",
    "careful",
    "careless",
    "effects",
    "make_agent",
]

MESSAGE = "Act on the note."
REPLY = "Done: acted on the note once."
NOTE = "the note says: ship it"
ACT_TIMEOUT = 2.0
"""act's deadline: short, since a worker that takes over a turn whose act was interrupted waits
for it before answering for the call."""
SYSTEM = "Act once. Check before repeating."
GATE_WAIT = 60.0
"""The longest act waits at its gate (a bound only: the tool's timeout normally ends it first)."""
_POLL = 0.01


@dataclass(frozen=True)
class ActScript:
    """How ``act`` behaves around its side effect, for the process contracts.

    Attributes:
        inside: a file act creates once it is running (after the effect, with
            ``effect_first``): what a test waits for before it pauses or signals the worker.
        gate: act waits until this file exists (a test creates it) before its effect, or after
            it with ``effect_first``; the tool's timeout still bounds the wait.
        effect_first: the effect happens before act waits at the gate (an effect that landed
            while its outcome was never saved).
        sync: act is a plain function, run in a worker thread.
        raises: ``"SystemExit"`` or ``"KeyboardInterrupt"``: act raises it instead of acting.
        check: act calls ``context.check()`` right before its effect (the async act only).
    """

    inside: Path | None = None
    gate: Path | None = None
    effect_first: bool = False
    sync: bool = False
    raises: str | None = None
    check: bool = False

    def arrive(self) -> None:
        """act has started: create ``inside``; raise what ``raises`` names."""
        if self.inside is not None:
            self.inside.touch()
        if self.raises == "SystemExit":
            raise SystemExit(2)  # what argparse raises on bad input
        if self.raises == "KeyboardInterrupt":
            raise KeyboardInterrupt

    async def wait_at_gate(self) -> None:
        """Wait until ``gate`` exists (polling: a file has no notification)."""
        if self.gate is None:
            return
        with anyio.fail_after(GATE_WAIT):
            while not self.gate.exists():  # noqa: ASYNC110  (a file is the only signal)
                await anyio.sleep(_POLL)

    def wait_at_gate_sync(self) -> None:
        """The same, blocking its thread (for the sync act)."""
        if self.gate is None:
            return
        give_up = time.monotonic() + GATE_WAIT
        while not self.gate.exists():
            if time.monotonic() > give_up:
                raise TimeoutError(f"act waited {GATE_WAIT:g} s for {self.gate}")
            time.sleep(_POLL)


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
    script: ActScript | None = None,
    system: str = SYSTEM,
) -> Agent:
    """The agent; ``before_act`` / ``after_act`` run around the side effect (to make it slow);
    ``act_timeout`` is act's deadline; ``script`` adds gates and faults (see
    :class:`ActScript`); ``system`` is the system prompt (another one is a code change)."""

    def lookup(topic: str, context: ToolContext) -> str:
        """Look something up: "note" for the note, "done" to see whether act happened."""
        if topic == "done":
            return "yes" if effects(effects_file, context.session_id) else "no"
        return NOTE

    act = _act_tool(
        effects_file, act_replay, act_timeout, script or ActScript(), before_act, after_act
    )
    return Agent(
        model=model if model is not None else ScriptedModel(careful),
        tools=ToolRegistry([tool(lookup, replay="safe"), act]),
        system=system,
    )


def _act_tool(
    effects_file: Path,
    replay: Replay,
    timeout: float,
    script: ActScript,
    before_act: Callable[[], Awaitable[None]] | None,
    after_act: Callable[[], Awaitable[None]] | None,
) -> Tool:
    """``act``, async or (``script.sync``) sync: same name, docstring and arguments, so the
    same schema, so either can replay a turn the other began."""
    if script.sync:

        def act_sync(text: str, context: ToolContext) -> str:
            """Act on the text (a side effect that must not repeat)."""
            if script.effect_first:
                _record(effects_file, context)
            script.arrive()
            script.wait_at_gate_sync()
            if not script.effect_first:
                _record(effects_file, context)
            return "acted"

        return tool(act_sync, replay=replay, timeout=timeout, name="act")

    async def act(text: str, context: ToolContext) -> str:
        """Act on the text (a side effect that must not repeat)."""
        if before_act is not None:
            await before_act()
        if script.effect_first:
            _record(effects_file, context)
        script.arrive()
        await script.wait_at_gate()
        if script.check:
            context.check()  # a worker whose lease ran out meanwhile must not act now
        if not script.effect_first:
            _record(effects_file, context)
        if after_act is not None:
            await after_act()
        return "acted"

    return tool(act, replay=replay, timeout=timeout)


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


class _Unfinished(Agent):
    """Makes its first model call, then returns without ``journal.finish``: a bug the worker
    must record as the turn's failure instead of retrying."""

    async def run_turn(self, journal: Journal) -> str:
        request = ModelRequest(messages=self.conversation(journal), tools=self.tools.schemas())
        reply = await journal.model(self.model, request)
        return reply.content or "(no reply recorded)"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def build_process_agent() -> Agent:
    """For ``world worker --agent world_conformance.journal_agent:build_process_agent``: the
    agent of :func:`build_agent` with act scripted (:class:`ActScript`) from the environment.

    ``WORLD_JOURNAL_EFFECTS`` (required), ``WORLD_JOURNAL_INSIDE`` and ``WORLD_JOURNAL_GATE``
    (paths), ``WORLD_JOURNAL_EFFECT_FIRST=1``, ``WORLD_JOURNAL_ACT_SYNC=1``,
    ``WORLD_JOURNAL_ACT_RAISES`` (``SystemExit`` or ``KeyboardInterrupt``),
    ``WORLD_JOURNAL_ACT_TIMEOUT`` (seconds), ``WORLD_JOURNAL_SYSTEM`` (another system prompt:
    the code changed since the turn began), ``WORLD_JOURNAL_UNFINISHED=1`` (the agent returns
    without ``journal.finish``).
    """
    path = os.environ.get("WORLD_JOURNAL_EFFECTS")
    if not path:
        raise ConfigurationError("set WORLD_JOURNAL_EFFECTS to the side-effects file")
    raises = os.environ.get("WORLD_JOURNAL_ACT_RAISES") or None
    if raises not in (None, "SystemExit", "KeyboardInterrupt"):
        raise ConfigurationError(
            "WORLD_JOURNAL_ACT_RAISES must be SystemExit, KeyboardInterrupt or unset"
        )
    try:
        timeout = float(os.environ.get("WORLD_JOURNAL_ACT_TIMEOUT") or ACT_TIMEOUT)
    except ValueError:
        raise ConfigurationError("WORLD_JOURNAL_ACT_TIMEOUT must be a number of seconds") from None
    script = ActScript(
        inside=_env_path("WORLD_JOURNAL_INSIDE"),
        gate=_env_path("WORLD_JOURNAL_GATE"),
        effect_first=os.environ.get("WORLD_JOURNAL_EFFECT_FIRST") == "1",
        sync=os.environ.get("WORLD_JOURNAL_ACT_SYNC") == "1",
        raises=raises,
    )
    agent = make_agent(
        Path(path),
        act_timeout=timeout,
        script=script,
        system=os.environ.get("WORLD_JOURNAL_SYSTEM") or SYSTEM,
    )
    if os.environ.get("WORLD_JOURNAL_UNFINISHED") == "1":
        return _Unfinished(model=agent.model, tools=agent.tools, system=agent.system)
    return agent


def _log_from_env() -> None:
    """``WORLD_JOURNAL_LOG=info``: a worker process importing this module (``--agent``) shows
    the worker's info lines; importing it elsewhere without the variable changes nothing."""
    level = os.environ.get("WORLD_JOURNAL_LOG")
    if level:
        logging.getLogger("world").setLevel(level.upper())


_log_from_env()
