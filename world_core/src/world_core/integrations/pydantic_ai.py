"""pydantic-ai agents, crash-safe on any World: the ``world`` durable-execution engine.

Built on pydantic-ai's extension point for durable engines (``pydantic_ai.durable_exec``): a
durability capability, :class:`WorldDurability`, whose operation backend runs each durable
unit of a run as one step of the turn's :class:`~world_core.Journal`:

* a model request (plain, streamed, message compaction) is a ``model`` step: its response is
  appended before the run goes on, so a finished request is never paid for twice;
* a tool call (function, MCP and dynamic toolsets alike) is a ``tool`` step with the replay
  label of the tool's config, ``metadata={"world": {"replay": "safe" | "never"}}`` (or the
  capability's ``tools=`` mapping by name). The label is required: a tool without one is
  refused, naming it. A ``never`` call's intent is committed before it runs and it is never
  run twice; an interrupted one reaches the model as a failed call that may or may not have
  happened (:data:`~world_core.POSSIBLY_RAN`);
* tool discovery, event-stream handlers and capability operations are ``safe`` tool steps;
  argument validation is deterministic and runs inline.

Steps read back from the journal are reported to pydantic-ai as replayed
(``record_durable_unit(executed=False)``), so its instrumentation exports no second span for
them. Waiting for an outside answer (``RequestInput``, and so ``requires_approval`` tools) is
a ``world`` signal raced against a timer (:class:`WorldEventWaiter`): the turn holds no worker
while it waits, a crash while waiting resumes the wait, and an answer is consumed once. Or
:class:`WorldApprovals` decides ``requires_approval`` calls with ``world approve`` / ``reject``.

Use::

    agent = Agent(model, name="support", tools=[...], capabilities=[WorldDurability()])
    worker = Worker(world, WorldAgent(agent))

Imports pydantic-ai (extra ``pydantic-ai``); nothing else in ``world_core`` imports this module.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast

from pydantic import JsonValue
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.agent.abstract import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability, CapabilityOrdering
from pydantic_ai.capabilities.abstract import WrapRunHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    ExternalEventError,
    ExternalEventWaiter,
    JournalCallableOperationBackend,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
    conversation_id_from_run_id,
    external_event_scope,
    record_durable_unit,
    replay_scope,
)
from pydantic_ai.exceptions import ToolFailed, UnexpectedModelBehavior, UserError
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart
from pydantic_ai.models import Model
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolDenied,
)
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool
from pydantic_core import to_jsonable_python

from world_core.errors import (
    ConfigurationError,
    InvalidArgumentError,
    ModelReplyError,
    PossiblyRanError,
)
from world_core.journal import (
    DEFAULT_TOOL_TIMEOUT,
    Client,
    Journal,
    Replay,
    ToolContext,
    canonical_json,
)

__all__ = [
    "CONFIG_KEY",
    "ENGINE_NAME",
    "UnusableModelReply",
    "WorldAgent",
    "WorldApprovals",
    "WorldDurability",
    "WorldEventWaiter",
    "event_token",
    "fail_event",
    "resolve_event",
    "tool_context",
]

ENGINE_NAME = "world"
"""The engine's name in pydantic-ai's messages."""

CONFIG_KEY = "world"
"""The tool metadata key of a tool's step config: ``{"replay": "safe" | "never",
"timeout": seconds}`` (``timeout`` optional, default 60 s)."""

DEFAULT_APPROVAL_TIMEOUT = 24 * 3600.0
"""Seconds a call waits for a person's decision under :class:`WorldApprovals` by default."""

_TOKEN_PREFIX = "world1."
_MAX_WAIT = 10 * 366 * 86400.0  # the journal's longest wait


@dataclass(frozen=True)
class _Unit:
    """How one durable unit runs: a model step, or a tool step with its label and timeout."""

    kind: Literal["model", "tool"]
    replay: Replay = "safe"
    timeout: float = DEFAULT_TOOL_TIMEOUT


_MODEL = _Unit("model")
_SAFE = _Unit("tool")


@dataclass
class _Run:
    """The turn a pydantic-ai run inside :meth:`WorldAgent.run_turn` belongs to."""

    journal: Journal
    runs: int = 0


_current: ContextVar[_Run | None] = ContextVar("world_pydantic_ai_run", default=None)
_context: ContextVar[ToolContext | None] = ContextVar("world_pydantic_ai_tool", default=None)


def tool_context() -> ToolContext | None:
    """The :class:`~world_core.ToolContext` of the tool step running now (its idempotency
    key, ``check()``, the lease), or None outside one. Call it from a pydantic-ai tool
    function to pass ``tool_context().idempotency_key`` to the API it calls."""
    return _context.get()


@contextmanager
def _turn_scope(journal: Journal) -> Iterator[_Run]:
    run = _Run(journal)
    token = _current.set(run)
    try:
        yield run
    finally:
        _current.reset(token)


def _strip(value: Any) -> Any:
    """A JSON value without the timestamps pydantic-ai stamps on each new message: a
    replay's request has new ones, and they are not what the request asks."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _identity(cache_key: tuple[object, ...]) -> object:
    """What identifies a unit's call for replay: its inputs in JSON, without run contexts and
    live toolset objects (not inputs, and not JSON)."""
    parts: list[object] = []
    for item in cache_key:
        if isinstance(item, RunContext | ToolsetTool):
            continue
        parts.append(_strip(to_jsonable_python(item, fallback=lambda o: type(o).__name__)))
    return parts


class _Backend(JournalCallableOperationBackend[_Unit]):
    """Runs each durable unit as one step of the current turn's journal."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: _Unit,
    ) -> object:
        run = _current.get()
        if run is None:
            raise InvalidArgumentError(
                f"pydantic-ai ran the durable unit {name!r} outside a world turn; run the agent "
                "through WorldAgent (a Worker's agent), which opens the turn's journal"
            )
        if isinstance(operation_id, ToolsetValidateToolArgumentsId):
            return await body()  # deterministic given the arguments: no step of its own
        journal = run.journal
        before = journal.replayed

        async def call(context: ToolContext | None) -> object:
            token = _context.set(context)
            try:
                return await body()
            except UnexpectedModelBehavior as exc:
                if config.kind != "model":
                    raise
                # The server answered (paid for) with what pydantic-ai cannot use: recorded as
                # the step's outcome, so no retry pays for the same request again.
                raise ModelReplyError(
                    f"pydantic-ai could not use the model's reply: {exc.message}",
                    raw=exc.body or "",
                ) from exc
            finally:
                _context.reset(token)

        try:
            if config.kind == "model":
                try:
                    result = await journal.step("model", name, call, input=_identity(cache_key))
                except ModelReplyError as exc:  # live or replayed, pydantic-ai sees its own kind
                    raise UnusableModelReply(str(exc), raw=exc.raw) from exc
            else:
                result = await journal.step(
                    "tool",
                    name,
                    call,
                    input=_identity(cache_key),
                    replay=config.replay,
                    timeout=config.timeout,
                )
        except PossiblyRanError as exc:
            record_durable_unit(executed=True)
            raise ToolFailed(exc.error) from None
        record_durable_unit(executed=journal.replayed == before)
        return result


class UnusableModelReply(ModelReplyError, UnexpectedModelBehavior):
    """A model request's reply pydantic-ai could not use (its ``UnexpectedModelBehavior``),
    recorded as the request's outcome: a replay raises it again without a request. It is both
    a :class:`~world_core.errors.ModelReplyError` (a worker fails the turn at once) and an
    ``UnexpectedModelBehavior`` (what pydantic-ai and a capability's
    ``on_model_request_error`` expect; a subclass such as ``ContentFilterError`` is not kept).
    """

    def __init__(self, message: str, *, raw: str = "") -> None:
        ModelReplyError.__init__(self, message, raw=raw)
        self.message = message
        self.body = raw or None

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.message,), {"raw": self.raw, "body": self.body}


def _unit_of(config: object, tool_name: str) -> _Unit:
    """A tool's step config from its ``world`` metadata (or the ``tools=`` entry)."""
    where = f"tool {tool_name!r}"
    if config is None or config is False:
        raise InvalidArgumentError(
            f"{where} has no replay label: give it metadata={{'{CONFIG_KEY}': {{'replay': "
            "'safe'}}} (running it again after a crash is harmless) or {'replay': 'never'} "
            "(it must not run twice), or name it in WorldDurability(tools=...)"
        )
    if not isinstance(config, Mapping):
        raise InvalidArgumentError(
            f"{where}: its {CONFIG_KEY!r} config must be a dict like {{'replay': 'never'}}, "
            f"got {type(config).__name__}"
        )
    unknown = sorted(set(config) - {"replay", "timeout"})
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown {CONFIG_KEY!r} config keys {unknown}; only 'replay' and 'timeout'"
        )
    replay = config.get("replay")
    if replay not in ("safe", "never"):
        raise InvalidArgumentError(
            f"{where}: replay must be 'safe' (may run again after a crash) or 'never' (must not "
            f"run twice; the model is told it may have happened), got {replay!r}"
        )
    timeout = config.get("timeout", DEFAULT_TOOL_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidArgumentError(
            f"{where}: timeout must be a finite number of seconds > 0, got {timeout!r}"
        )
    return _Unit("tool", cast(Replay, replay), float(timeout))


@dataclass(init=False, kw_only=True)
class WorldDurability(BaseDurabilityCapability[AgentDepsT]):
    """The capability that makes a pydantic-ai agent durable on a ``world`` World.

    Attach it when the agent is built (``Agent(..., name=..., capabilities=[WorldDurability()])``)
    and run the agent's turns with :class:`WorldAgent` on a :class:`~world_core.Worker`. Outside
    a turn the agent runs as a plain pydantic-ai agent.

    Every tool needs a replay label in its config: ``Tool(fn, metadata={"world": {"replay":
    "never", "timeout": 30}})`` (``@agent.tool(metadata=...)``, ``SetToolMetadata`` for MCP or
    dynamic toolsets), or an entry in ``tools=``. Every leaf toolset needs an ``id`` (the
    agent's own function tools have one), as pydantic-ai requires of durable engines.

    Args:
        tools: step configs by tool name, for tools whose metadata has none (MCP, dynamic).
        models: extra models by id, for run-time model switching (see pydantic-ai).
        event_stream_handler: receives the run's events; each call is a ``safe`` step.
        name: the name of the agent's steps; defaults to the agent's ``name``.

    Raises:
        InvalidArgumentError: a ``tools=`` entry is not a valid config, or (when bound to an
            agent) one of its function tools has no replay label.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name=ENGINE_NAME,
        durable_unit_noun="step",
        durable_container_noun="turn",
        codec=JSON_CODEC,  # the journal stores JSON
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        tool_call_result_upgrade_lenient=False,
        journal_discovery=True,
        # Steps are numbered in call order: parallel calls would race for the numbers.
        sequential_tools_in_durable_context=True,
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        tool_config_key=CONFIG_KEY,
    )

    def __init__(
        self,
        *,
        tools: Mapping[str, Mapping[str, Any]] | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        if tools is not None and not isinstance(tools, Mapping):
            raise InvalidArgumentError(
                f"tools must map tool names to configs like {{'replay': 'never'}}, got {tools!r}"
            )
        self._tool_units = {name: _unit_of(config, name) for name, config in (tools or {}).items()}

    @property
    def in_durable_context(self) -> bool:
        return _current.get() is not None

    def get_default_run_id(self) -> str | None:
        run = _current.get()
        if run is None:
            return None
        run.runs += 1
        return f"{run.journal.session_id}/{run.journal.turn_id}/run-{run.runs}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        run = _current.get()
        if run is None:
            return None
        return datetime.fromtimestamp(run.journal.now(), UTC)  # journaled: replay reads it

    def get_durable_operation_backend(self) -> _Backend:
        def tool_unit(operation_id: DurableOperationId, tool: object, tool_name: str) -> _Unit:
            if not isinstance(operation_id, ToolsetCallToolId):
                return _SAFE  # discovery, validation: no effects of the tool's own
            return self._unit_for(cast(ToolsetTool[Any] | None, tool), tool_name)

        return _Backend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(
                model=_MODEL, event=_SAFE, capability=_SAFE, tool=_SAFE, resolve_tool=tool_unit
            ),
        )

    def _unit_for(self, tool: ToolsetTool[Any] | None, tool_name: str) -> _Unit:
        metadata = tool.tool_def.metadata if tool is not None else None
        if metadata is not None and CONFIG_KEY in metadata:
            return _unit_of(metadata[CONFIG_KEY], tool_name)
        if tool_name in self._tool_units:
            return self._tool_units[tool_name]
        return _unit_of(None, tool_name)

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        # Refuse a function tool without a label now, not at its first call in production.
        for toolset in agent.toolsets:
            _check_labels(toolset, self._tool_units)
        super()._bind_to_agent(agent)

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        run = _current.get()
        if run is None:
            return await super().wrap_run(ctx, handler=handler)
        waiter = WorldEventWaiter(run.journal, agent_name=self.name)
        with replay_scope(), external_event_scope(waiter):
            return await super().wrap_run(ctx, handler=handler)


def _check_labels(toolset: AbstractToolset[Any], named: Mapping[str, _Unit]) -> None:
    def visit(leaf: AbstractToolset[Any]) -> None:
        if not isinstance(leaf, FunctionToolset):
            return
        for tool_name, item in leaf.tools.items():
            metadata = item.metadata or {}
            if CONFIG_KEY in metadata:
                _unit_of(metadata[CONFIG_KEY], tool_name)
            elif tool_name not in named:
                _unit_of(None, tool_name)

    toolset.apply(visit)


def _history(journal: Journal) -> list[ModelMessage]:
    messages: list[ModelMessage] = []
    for message, answer in journal.history:
        messages.append(ModelRequest.user_text_prompt(message))
        messages.append(ModelResponse(parts=[TextPart(answer)]))
    return messages


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        found: list[BaseException] = []
        for inner in error.exceptions:
            found.extend(_leaves(inner))
        return found
    return [error]


class WorldAgent:
    """Runs a pydantic-ai agent's turns on a :class:`~world_core.Worker`:
    ``Worker(world, WorldAgent(agent))``. Each turn's message is the run's prompt, the
    session's earlier turns its message history, and the run's output (``str()`` of it, or
    its JSON for structured output) the turn's reply.

    Args:
        agent: a pydantic-ai agent built with a :class:`WorldDurability` capability.
        deps: the dependencies passed to each run.
        history_turns: how many earlier turns the run sees (None: all).

    Raises:
        InvalidArgumentError: the agent has no :class:`WorldDurability` capability.
    """

    def __init__(
        self,
        agent: AbstractAgent[Any, Any],
        *,
        deps: Any = None,
        history_turns: int | None = None,
    ) -> None:
        if not isinstance(agent, AbstractAgent):
            raise InvalidArgumentError(f"agent must be a pydantic-ai Agent, got {agent!r:.80}")
        if WorldDurability.from_agent(agent) is None:
            raise InvalidArgumentError(
                f"agent {agent.name!r} has no WorldDurability capability: build it with "
                "Agent(..., capabilities=[WorldDurability()]) so its model requests and tool "
                "calls become journal steps"
            )
        if history_turns is not None and (
            isinstance(history_turns, bool)
            or not isinstance(history_turns, int)
            or history_turns < 0
        ):
            raise InvalidArgumentError(
                f"history_turns must be None or an int >= 0, got {history_turns!r}"
            )
        self.agent = agent
        self.deps = deps
        self.history_turns = history_turns

    async def run_turn(self, journal: Journal) -> str:
        """Run (or replay) the turn's pydantic-ai run, record its reply, and return it.

        Raises:
            ConfigurationError: pydantic-ai refused the agent or the run (its ``UserError``):
                running it again would fail the same way, so the turn fails at once.
            ModelReplyError: pydantic-ai could not use the model's replies (its
                ``UnexpectedModelBehavior``): a model request's is recorded as its outcome;
                either way the turn fails at once, paying for no request again.
        """
        with _turn_scope(journal):
            try:
                result = await self.agent.run(
                    journal.user_message, message_history=_history(journal), deps=self.deps
                )
            except BaseExceptionGroup as group:
                # A task group inside pydantic-ai wraps what must reach the worker bare (a
                # suspended wait, a crash, a recorded tool error).
                leaves = _leaves(group)
                if len(leaves) == 1:
                    raise _classified(leaves[0]) from None
                raise
            except (UserError, UnexpectedModelBehavior) as exc:
                raise _classified(exc) from exc
        output = result.output
        if isinstance(output, str):
            return await journal.finish(output)
        return await journal.finish(canonical_json(to_jsonable_python(output)).decode("utf-8"))


def _classified(error: BaseException) -> BaseException:
    """pydantic-ai's ``UserError`` (a misconfigured agent or run) as the configuration error
    it is, and its ``UnexpectedModelBehavior`` (replies it could not use: a tool the model
    named that does not exist, arguments that never validated, past their retries) as the
    unusable model reply it is: a replay reads the same recorded replies and fails the same
    way, so a worker fails the turn at once instead of retrying it."""
    failed: BaseException
    if isinstance(error, ModelReplyError):
        return error
    if isinstance(error, UserError):
        failed = ConfigurationError(f"pydantic-ai refused the run: {error}")
    elif isinstance(error, UnexpectedModelBehavior):
        failed = ModelReplyError(
            f"pydantic-ai could not use the model's replies: {error.message}",
            raw=error.body or "",
        )
    else:
        return error
    failed.__cause__ = error
    return failed


@dataclass(init=False)
class WorldApprovals(AbstractCapability[AgentDepsT]):
    """Decide a turn's ``requires_approval`` tool calls with ``world`` approvals: each call
    waits, as a step of its own, for :meth:`Client.approve <world_core.Client.approve>` /
    ``reject`` (``world approve SESSION TURN STEP``), listed meanwhile by
    :meth:`Client.pending_approvals <world_core.Client.pending_approvals>` (``world
    approvals``) with the tool's name and arguments, exactly like a ``world`` tool declared
    ``approval="required"``. The turn holds no worker while it waits; a crash resumes the wait;
    a decision counts once. A rejection, or no decision within ``timeout`` seconds, denies the
    call (the model is told who refused it and why, or that nobody decided in time).

    Add it next to :class:`WorldDurability`: ``capabilities=[WorldDurability(),
    WorldApprovals()]``. Outside a turn it decides nothing (pydantic-ai then defers the calls
    as usual).

    Args:
        timeout: seconds each call waits for a decision (default one day).

    Raises:
        InvalidArgumentError: ``timeout`` is not a number of seconds > 0.
    """

    timeout: float

    def __init__(self, *, timeout: float = DEFAULT_APPROVAL_TIMEOUT) -> None:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= _MAX_WAIT
        ):
            raise InvalidArgumentError(
                f"timeout must be a number of seconds > 0 (at most ten years), got {timeout!r}"
            )
        self.timeout = float(timeout)

    def get_ordering(self) -> CapabilityOrdering:
        return CapabilityOrdering(position="innermost")

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        run = _current.get()
        if run is None or not requests.approvals:
            return None
        decisions: dict[str, bool | ToolDenied] = {}
        for call in requests.approvals:  # one at a time: each wait is a step
            refused = await run.journal.approval(
                call.tool_name, call.args_as_dict(), timeout=self.timeout
            )
            decisions[call.tool_call_id] = True if refused is None else ToolDenied(refused)
        return requests.build_results(approvals=decisions)


# -- waiting for outside input ------------------------------------------------------------------


def event_token(session_id: str, signal: str, turn_id: str | None = None) -> str:
    """The resume token of a wait: which session, which signal, which turn (the signal's
    name holds the wait's step, which every turn of the session numbers from 0: the turn
    tells two turns' waits at the same step apart). :func:`resolve_event` and
    :func:`fail_event` read it back."""
    fields = {"s": session_id, "n": signal, **({"t": turn_id} if turn_id is not None else {})}
    body = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    return _TOKEN_PREFIX + base64.urlsafe_b64encode(body).decode("ascii")


def _parse_token(token: str) -> tuple[str, str, str | None]:
    if not isinstance(token, str) or not token.startswith(_TOKEN_PREFIX):
        raise InvalidArgumentError(
            f"token {token!r:.60} is not a world resume token (it starts with {_TOKEN_PREFIX!r}: "
            "pass the token the run handed to ask)"
        )
    try:
        body = json.loads(base64.urlsafe_b64decode(token[len(_TOKEN_PREFIX) :].encode("ascii")))
        turn = body.get("t")  # absent from the tokens of waits begun before turns were named
        return str(body["s"]), str(body["n"]), None if turn is None else str(turn)
    except (ValueError, KeyError, TypeError):
        raise InvalidArgumentError(f"token {token!r:.60} is damaged; pass it unchanged") from None


def _signal_id(token: str) -> str:
    return "pydantic-ai-" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:40]


async def resolve_event(client: Client, token: str, payload: object, *, sender: str) -> str:
    """End the wait that handed out ``token`` with ``payload`` (JSON; for ``RequestInput``,
    the JSON form of ``DeferredToolResults``, such as ``{"approvals": {"<call id>": true}}``).
    Resolving a token twice with the same payload counts once; with another, it is refused.
    Returns the signal's id.

    Raises:
        InvalidArgumentError: not a world token, a payload that is not JSON (or above 64 KiB),
            or the token was resolved otherwise already.
    """
    session_id, name, turn_id = _parse_token(token)
    return await client.signal(
        session_id,
        name,
        {"payload": to_jsonable_python(payload)},
        sender=sender,
        signal_id=_signal_id(token),
        turn_id=turn_id,
    )


async def fail_event(client: Client, token: str, reason: str, *, sender: str) -> str:
    """End the wait that handed out ``token`` without a payload: the run gets
    ``ExternalEventError(reason)`` (``RequestInput`` denies the pending calls with it).
    See :func:`resolve_event`."""
    if not isinstance(reason, str):
        raise InvalidArgumentError(f"reason must be a str, got {type(reason).__name__}")
    session_id, name, turn_id = _parse_token(token)
    return await client.signal(
        session_id,
        name,
        {"failure": reason},
        sender=sender,
        signal_id=_signal_id(token),
        turn_id=turn_id,
    )


class WorldEventWaiter(ExternalEventWaiter):
    """pydantic-ai's external-event waiter on ``world`` signals: installed for every run
    inside a turn, so ``wait_for_external_event`` (``RequestInput``, and with it
    ``requires_approval`` tools) waits durably.

    The wait is two steps of the turn: ``ask`` with the token (a ``safe`` step: recorded, so
    a replay does not ask again), then, unless ``ask`` answered, a wait for the signal the
    token names, raced against the timeout (:meth:`Journal.wait_for_signal
    <world_core.Journal.wait_for_signal>`). The turn leaves the worker while it waits; a
    crash meanwhile resumes the same wait; the answer is consumed once. Resolve the token
    with :func:`resolve_event` or :func:`fail_event`.
    """

    def __init__(self, journal: Journal, *, agent_name: str = "agent") -> None:
        self._journal = journal
        self._agent_name = agent_name

    async def wait(
        self,
        name: str,
        *,
        ask: Callable[[str], Awaitable[JsonValue]],
        timeout: timedelta | None,  # noqa: ASYNC109 - pydantic-ai's signature
    ) -> JsonValue:
        journal = self._journal
        signal = f"pydantic-ai/{journal.position + 1}/{name}"
        token = event_token(journal.session_id, signal, journal.turn_id)

        async def asking(context: ToolContext | None) -> JsonValue:
            return await ask(token)

        answer = await journal.step(
            "tool",
            f"{self._agent_name}__external_event.{name}.ask",
            asking,
            input={"signal": signal},
        )
        if answer is not None:
            return cast(JsonValue, answer)
        seconds = _MAX_WAIT if timeout is None else min(timeout.total_seconds(), _MAX_WAIT)
        found = await journal.wait_for_signal(signal, timeout=seconds)
        if found is None:
            raise ExternalEventError(f"No resolution arrived within {timeout}.")
        sent = found.payload if isinstance(found.payload, dict) else {}
        if "failure" in sent:
            raise ExternalEventError(str(sent["failure"]))
        return cast(JsonValue, sent.get("payload"))
