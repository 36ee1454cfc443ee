"""The OpenAI Agents SDK on a World (extra ``openai-agents``; import name ``agents``).

Two independent pieces:

* :class:`WorldSession`: the SDK's ``Session`` protocol (``get_items``, ``add_items``,
  ``pop_item``, ``clear_session``) on a World log, for ``Runner.run(..., session=...)``. Any
  backend, any number of processes.
* :class:`DurableAgent`: an SDK ``Agent`` run as a turn of a ``world`` session by a
  :class:`~world_core.Worker`. Its model calls and function-tool calls are journal steps
  (:meth:`Journal.step <world_core.Journal.step>`): a finished model call is read back, never
  paid for twice; every function tool carries a required replay label (``safe`` runs again
  after a crash, ``never`` is never run twice and the model is told it may have happened); a
  tool the SDK asks approval for (``needs_approval``) waits for ``world approve`` /
  :meth:`Client.approve <world_core.Client.approve>`, durably, and the decision is consumed
  once.

The few lines that make an existing agent durable::

    from agents import Agent, function_tool
    from world_core import Worker, open_world
    from world_core.integrations.openai_agents import DurableAgent

    agent = Agent(name="mailer", instructions="...", tools=[lookup, send_email])
    durable = DurableAgent(agent, replay={"lookup": "safe", "send_email": "never"})
    async with open_world() as world:
        await Worker(world, durable).run()     # Client(world).submit(session, message)

**Session log layout** (:class:`WorldSession`): one log per session
(``openai-agents/session/<session_id>``), append-only. ``item`` events hold one item each (an
item whose JSON exceeds 64 KiB is a content-addressed blob the event names); a ``pop`` event
names the ``seq`` of the item it removed; a ``clear`` event removes every item before it. A
read goes back from the log's tail in windows, so ``get_items(limit=n)`` reads about ``n``
items (plus the pops among them), whatever the log's length; ``get_items()`` reads back to
the latest ``clear``.

**Concurrent writers.** ``add_items`` appends its items as one atomic batch (several batches
past 4 MiB of events), keyed, so a retry after a transient fault never adds them twice.
``pop_item`` reads the newest item and appends its ``pop`` with ``expect_tail`` (the tail it
read): if anyone appended meanwhile, nothing is written and it reads again; so two concurrent
pops never return the same item, and a pop never removes an item older than one added before
it committed. ``clear_session`` needs no condition: it is a single append, and removes exactly
the items appended before it (an item added concurrently, after it, stays). Storage is not
reclaimed by ``clear_session`` (the log is append-only); delete the log (``world.log.delete``)
to drop a session for good.

**What a durable run replays.** The conversation a turn starts from is the session's earlier
turns (each message and reply, from the journal) and the turn's message; the SDK's run (its
guardrails, hooks and any code around the calls) is run again on replay, and must make the
same calls in the same order for the same inputs: a step that differs raises
``NonDeterminismError``. Function tools of one model response run one at a time, in the
response's order: the run configuration's ``tool_execution.max_function_tool_concurrency`` is
set to 1, so the SDK starts each call (its input guardrails and ``on_tool_start`` hooks
included) once the one before has ended. Hosted tools (web search, file search ...) run
inside the model call and are recorded with it. Not supported in a durable run (refused when the
``DurableAgent`` is built): MCP servers, handoffs, and local tools other than function tools
(computer, shell, apply-patch), whose effects the journal cannot see; and ``Runner.run_streamed``.
Tracing: the SDK exports traces to OpenAI unless disabled; a replayed model call would export a
second span, so disable it (``set_tracing_disabled(True)`` or
``OPENAI_AGENTS_DISABLE_TRACING=1``) or pass a ``run_config`` with ``tracing_disabled=True``.

**Inside a tool**, :func:`tool_context` is the call's journal context: its
``idempotency_key`` (send it to APIs that take one) and ``check()`` (call it right before an
irreversible effect). A cut-off ``never`` call answers the model ``POSSIBLY_RAN``; a tool that
raised answers ``Error: ...`` (both recorded, so a replay answers the same). A ``check()`` that
refused for a lost lease is no answer, although the SDK makes text for the model of what a tool
raises: the attempt stops and the next one runs the call again (JOURNAL.md, rule 4a).

**Failures.** A journal error inside the SDK's run (a call still in flight in another worker,
a replay that differs, a failed write) is raised as it was, not as the SDK's wrapper, so the
worker handles it as for any turn. A run the SDK refuses as misconfigured (its ``UserError``)
is a :class:`~world_core.errors.ConfigurationError`: the turn's failure is recorded at once.
A model reply the SDK cannot use (its ``ModelBehaviorError``: a call of a tool the agent does
not have, a final output its schema refuses) is a :class:`~world_core.errors.ModelReplyError`,
also recorded at once: a replay reads the same recorded replies and would fail the same way
(raised by the model itself, it is the model step's recorded outcome, never paid for again).
Other SDK errors (``MaxTurnsExceeded``, a guardrail's tripwire) are retried like any
unclassified error (cheaply: every recorded step is read back) until the worker records the
failure.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import json
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import anyio
from agents import (
    Agent,
    FunctionTool,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    RunResult,
    RunState,
    ToolExecutionConfig,
    TResponseInputItem,
    Usage,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.exceptions import ModelBehaviorError, ToolTimeoutError, UserError
from agents.handoffs import Handoff
from agents.items import TResponseOutputItem, TResponseStreamEvent
from agents.memory import SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit
from agents.models.multi_provider import MultiProvider
from agents.tool import Tool as SDKTool
from agents.tool import default_tool_timeout_error_message
from agents.tool_context import ToolContext as SDKToolContext
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from world_core.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    DuplicateKeyError,
    InvalidArgumentError,
    ModelReplyError,
    PossiblyRanError,
    ToolError,
    WorldError,
)
from world_core.journal import (
    DEFAULT_TOOL_TIMEOUT,
    POSSIBLY_RAN,
    BlobRef,
    Blobs,
    Journal,
    Replay,
    ToolContext,
    canonical_json,
)
from world_core.journal._tools import _check_timeout
from world_core.spi import NewEvent, World, validate_id

__all__ = [
    "DEFAULT_APPROVAL_TIMEOUT",
    "SESSION_LOG_PREFIX",
    "DurableAgent",
    "JournaledModel",
    "JournaledModelProvider",
    "WorldSession",
    "tool_context",
]

SESSION_LOG_PREFIX = "openai-agents/session/"
"""A :class:`WorldSession`'s log is this prefix and its session id."""

DEFAULT_APPROVAL_TIMEOUT = 24 * 3600.0
"""Seconds a call the SDK asks approval for waits for a decision unless told otherwise."""

_ITEM_BLOB_BYTES = 64 * 1024  # a larger item is stored as a blob the event names
_BATCH_BYTES = 4 * 1024 * 1024  # add_items appends at most this much per batch (8 MiB max)
_WRITE_SECONDS = 30.0  # how long a write is retried (transient faults, pop conflicts)
_FIRST_WINDOW = 16
_TIMEOUT_MARGIN = 1.0  # a step's deadline past its tool's own timeout, so that answers first
_MAX_WINDOW = 1000

_OUTPUT_ITEM: TypeAdapter[TResponseOutputItem] = TypeAdapter(TResponseOutputItem)


# -- the Session on a World log ----------------------------------------------------------------


class WorldSession:
    """The OpenAI Agents SDK's ``Session`` on a World log (see the module docstring).

    Pass it to ``Runner.run(agent, input, session=WorldSession(world, "chat-42"))``. It keeps
    no state of its own besides its settings: open as many as you like, in any process, on
    the same session id.

    Args:
        world: an open World (the caller closes it).
        session_id: the conversation's id (any valid identifier).
        session_settings: the SDK's ``SessionSettings`` (or its dict form); its ``limit`` is
            what ``get_items()`` returns when called without one.

    Raises:
        InvalidIdentifierError: ``session_id`` is not a valid identifier.
        InvalidArgumentError: ``world`` is not a World.
        TypeError: ``session_settings`` names a field the SDK's settings do not have (the
            SDK's own error, as its sessions raise it).
    """

    def __init__(
        self,
        world: World,
        session_id: str,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(world, World):
            raise InvalidArgumentError(f"world must be an open World, got {world!r:.80}")
        validate_id(session_id, "session_id")
        self.log_id = validate_id(SESSION_LOG_PREFIX + session_id, "session_id")
        self.session_id = session_id
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._world = world
        self._blobs = Blobs(world.stream)

    def __repr__(self) -> str:
        return f"WorldSession({self.session_id!r}, world={self._world.name!r})"

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first: the latest ``limit`` of them (``None``: the
        ``session_settings`` limit, else all; ``0``: none; a negative limit: all, as the SDK's
        SQLite session does). Reads about ``limit`` items back from the log's tail."""
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and (isinstance(wanted, bool) or not isinstance(wanted, int)):
            raise InvalidArgumentError(f"limit must be an int or None, got {wanted!r}")
        if wanted == 0:
            return []
        tail = await self._world.log.tail(self.log_id)
        found = await self._newest(tail, None if wanted is None or wanted < 0 else wanted)
        return [await self._load(body) for _, body in reversed(found)]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` after every item already there (one atomic append up to 4 MiB).

        Raises:
            InvalidArgumentError: an item is not a JSON object (nothing is written).
        """
        if not items:
            return
        events: list[NewEvent] = []
        for index, item in enumerate(items):
            try:
                jsonable = to_jsonable_python(item)
                encoded = canonical_json(jsonable)
            except (ValueError, TypeError) as exc:
                raise InvalidArgumentError(f"item {index} is not JSON: {exc}") from None
            if not isinstance(jsonable, dict):
                raise InvalidArgumentError(
                    f"item {index} must be a JSON object (a response input item), "
                    f"got {type(item).__name__}"
                )
            if len(encoded) > _ITEM_BLOB_BYTES:
                ref = await self._blobs.put(encoded)
                body: dict[str, Any] = {"t": "item", "blob": ref.model_dump()}
            else:
                body = {"t": "item", "item": jsonable}
            events.append(NewEvent(data=canonical_json(body)))
        batch_id = uuid.uuid4().hex
        batches: list[list[NewEvent]] = [[]]
        size = 0
        for event in events:
            if batches[-1] and size + len(event.data) > _BATCH_BYTES:
                batches.append([])
                size = 0
            batches[-1].append(event)
            size += len(event.data)
        with anyio.CancelScope(shield=True):  # a batch half-sent must be known to land or not
            for number, batch in enumerate(batches):
                key = f"add/{batch_id}/{number}"
                keyed = [NewEvent(data=batch[0].data, key=key), *batch[1:]]
                await self._append_once(keyed)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (None when the session has none).

        Conditional on the log's tail (see the module docstring): never returns an item that
        another pop returned.

        Raises:
            ConflictError: the log kept changing under it for 30 s (a flood of writers).
        """
        key = f"pop/{uuid.uuid4().hex}"
        with anyio.CancelScope(shield=True):
            give_up = anyio.current_time() + _WRITE_SECONDS
            delay = 0.01
            while True:
                tail = await self._world.log.tail(self.log_id)
                newest = await self._newest(tail, 1)
                if not newest:
                    return None
                seq, body = newest[0]
                event = NewEvent(key=key, data=canonical_json({"t": "pop", "seq": seq}))
                try:
                    await self._world.log.append(self.log_id, [event], expect_tail=tail)
                    return await self._load(body)
                except ConflictError:
                    pass  # someone appended since we read: read again
                except BackendUnavailableError:
                    if await self._world.log.get(self.log_id, key) is not None:
                        return await self._load(body)  # it landed before the fault
                if anyio.current_time() + delay > give_up:
                    raise ConflictError(
                        f"pop_item on session {self.session_id!r}: the log kept changing for "
                        f"{_WRITE_SECONDS:g} s; try again",
                        expected=tail,
                        actual=-1,
                    )
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.5)
        raise AssertionError("unreachable: nothing cancels this scope, so it swallows nothing")

    async def clear_session(self) -> None:
        """Remove every item appended before this call's append (one append)."""
        key = f"clear/{uuid.uuid4().hex}"
        with anyio.CancelScope(shield=True):
            await self._append_once([NewEvent(key=key, data=canonical_json({"t": "clear"}))])

    # -- machinery

    async def _append_once(self, events: list[NewEvent]) -> None:
        """Append a keyed batch, retrying transient faults; a retry that finds its first key
        stored with the same data knows the earlier try landed (the batch is atomic)."""
        give_up = anyio.current_time() + _WRITE_SECONDS
        delay = 0.1
        tried = False
        while True:
            try:
                await self._world.log.append(self.log_id, events)
                return
            except DuplicateKeyError as exc:
                if tried and exc.key == events[0].key and exc.existing.data == events[0].data:
                    return
                raise
            except BackendUnavailableError:
                tried = True
                if anyio.current_time() + delay > give_up:
                    raise
                await anyio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _newest(self, tail: int, limit: int | None) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``limit`` live items (all when None) at or before ``tail``, newest first, read
        back from ``tail`` in growing windows until enough, a ``clear``, or the start."""
        found: list[tuple[int, dict[str, Any]]] = []
        popped: set[int] = set()
        upto = tail
        window = _FIRST_WINDOW if limit is None else min(_MAX_WINDOW, max(limit + 2, 4))
        while upto > 0:
            after = max(0, upto - window)
            events = await self._world.log.read(self.log_id, after=after, limit=upto - after)
            for event in reversed(events):
                try:
                    body = json.loads(event.data)
                except ValueError:
                    continue  # not ours: skipped, as the SDK's sessions skip corrupt rows
                if not isinstance(body, dict):
                    continue
                kind = body.get("t")
                if kind == "clear":
                    return found
                if kind == "pop" and isinstance(body.get("seq"), int):
                    popped.add(body["seq"])
                elif kind == "item" and event.seq not in popped:
                    found.append((event.seq, body))
                    if limit is not None and len(found) >= limit:
                        return found
            upto = after
            window = min(window * 2, _MAX_WINDOW)
        return found

    async def _load(self, body: dict[str, Any]) -> TResponseInputItem:
        if "blob" in body:
            data = await self._blobs.get(BlobRef.model_validate(body["blob"]))
            return cast(TResponseInputItem, json.loads(data))
        return cast(TResponseInputItem, body["item"])


# -- durable runs ------------------------------------------------------------------------------

_CONTEXT: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "world_openai_agents_tool_context", default=None
)


def tool_context() -> ToolContext:
    """The journal's context of the function-tool call running now in a durable run: its
    session and turn, its ``idempotency_key`` (send it to APIs that take one), ``check()``
    (call it right before an irreversible effect) and ``deadline``.

    Raises:
        InvalidArgumentError: no durable call is running (outside a :class:`DurableAgent`
            run, or outside a function tool).
    """
    context = _CONTEXT.get()
    if context is None:
        raise InvalidArgumentError(
            "tool_context() is available inside a function tool of a DurableAgent run only"
        )
    return context


def _response_json(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {
        "output": [_output_json(item) for item in response.output],
        "usage": {
            "requests": usage.requests,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        },
        "response_id": response.response_id,
        "request_id": response.request_id,
    }


def _output_json(item: object) -> Any:
    """An output item as JSON with exactly the fields that were set: rebuilt from it, the item
    dumps as the live one did (the SDK builds the next request from such dumps, and a field
    filled only by its default on one side would change the request a replay compares)."""
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json", exclude_unset=True)
    return to_jsonable_python(item)


def _response_from(recorded: dict[str, Any]) -> ModelResponse:
    usage = recorded.get("usage") or {}
    return ModelResponse(
        output=[_OUTPUT_ITEM.validate_python(item) for item in recorded.get("output", [])],
        usage=Usage(
            requests=int(usage.get("requests", 1)),
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            total_tokens=int(usage.get("total_tokens", 0)),
        ),
        response_id=recorded.get("response_id"),
        request_id=recorded.get("request_id"),
    )


def _tool_identity(tool: SDKTool) -> dict[str, Any]:
    schema = getattr(tool, "params_json_schema", None)
    return {"name": getattr(tool, "name", type(tool).__name__), "parameters": schema}


class _Escape:
    """The first journal error of a run (a call still in flight elsewhere, a replay that
    differs, a failed write). The SDK wraps what a tool raises in its own error and may retry
    a model call that raised, so the wrappers keep the error here, refuse every later call of
    the run with it, and :meth:`DurableAgent.run_turn` raises it as it was."""

    def __init__(self) -> None:
        self.error: WorldError | None = None

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def keep(self, error: WorldError) -> WorldError:
        if self.error is None:
            self.error = error
        return self.error


class JournaledModel(Model):
    """An SDK ``Model`` whose every ``get_response`` is a model step of ``journal``: the
    request (instructions, input items, settings, tools, output schema) is digested and the
    response recorded once; a replay returns the recorded response without calling ``model``.

    Args:
        model: the model that answers (``OpenAIResponsesModel``, a test model ...).
        journal: the turn's journal.
        name: the step's name (the model's name, for traces).
    """

    def __init__(
        self,
        model: Model,
        journal: Journal,
        *,
        name: str = "openai-agents",
        escape: _Escape | None = None,
    ) -> None:
        if not isinstance(model, Model):
            raise InvalidArgumentError(f"model must be an agents Model, got {model!r:.80}")
        self.model = model
        self.journal = journal
        self.name = name
        self._escape = escape if escape is not None else _Escape()

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[SDKTool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        """The model's response to this request: read from the journal when the step is
        recorded, else from ``model`` (then recorded at once).

        Raises:
            NonDeterminismError: the journal holds another step at this position.
        """
        request = {
            "instructions": system_instructions,
            "input": to_jsonable_python(input, exclude_none=True),
            "settings": model_settings.to_json_dict(),
            "tools": [_tool_identity(tool) for tool in tools],
            "output_schema": None
            if output_schema is None or output_schema.is_plain_text()
            else output_schema.json_schema(),
            "handoffs": [handoff.tool_name for handoff in handoffs],
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": to_jsonable_python(prompt),
        }

        async def call(_: ToolContext | None) -> dict[str, Any]:
            try:
                response = await self.model.get_response(
                    system_instructions,
                    input,
                    model_settings,
                    tools,
                    output_schema,
                    handoffs,
                    tracing,
                    previous_response_id=previous_response_id,
                    conversation_id=conversation_id,
                    prompt=prompt,
                )
            except ModelBehaviorError as exc:
                # The server answered (paid for) with what the SDK cannot use: recorded as the
                # step's outcome, so no retry pays for the same request again.
                raise ModelReplyError(f"the model's reply could not be used: {exc}") from exc
            return _response_json(response)

        self._escape.check()
        try:
            recorded = await self.journal.step("model", self.name, call, input=request)
        except WorldError as exc:
            raise self._escape.keep(exc) from None
        return _response_from(recorded)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[SDKTool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """Refused: a durable run records whole responses (``Runner.run``).

        Raises:
            InvalidArgumentError: always.
        """
        raise InvalidArgumentError(
            "a durable run calls the model with Runner.run, not Runner.run_streamed: a "
            "journaled model call is recorded whole"
        )


class JournaledModelProvider(ModelProvider):
    """A ``ModelProvider`` whose models are :class:`JournaledModel` of ``journal``."""

    def __init__(
        self, provider: ModelProvider, journal: Journal, *, escape: _Escape | None = None
    ) -> None:
        self.provider = provider
        self.journal = journal
        self._escape = escape if escape is not None else _Escape()

    def get_model(self, model_name: str | None) -> Model:
        """``provider``'s model of that name, its calls journaled (steps named after it)."""
        return JournaledModel(
            self.provider.get_model(model_name),
            self.journal,
            name=model_name or "openai-agents",
            escape=self._escape,
        )


def _check_label(name: str, label: object) -> Replay:
    if label not in ("safe", "never"):
        raise InvalidArgumentError(
            f"tool {name!r}: replay must be 'safe' (may run again after a crash) or 'never' "
            f"(must not run twice; the model is told it may have happened), got {label!r}"
        )
    return "safe" if label == "safe" else "never"


class DurableAgent:
    """An SDK ``Agent`` made durable: what a :class:`~world_core.Worker` runs a turn with.

    Each turn runs ``Runner.run`` on a copy of ``agent`` whose model and function tools go
    through the turn's journal (see the module docstring). When the run stops for approvals
    (``needs_approval``), each one becomes an approval step of the turn: the turn suspends,
    holding no worker, until ``world approve SESSION TURN STEP`` (or ``Client.approve`` /
    ``Client.reject``) decides or ``approval_timeout`` passes; then the run goes on from the
    SDK's ``RunState`` with the decision (a rejection or a timeout tells the model why).

    Args:
        agent: the SDK agent.
        replay: a label per function tool, by tool name: ``"safe"`` or ``"never"``. Required
            for every function tool of ``agent``, as for ``world``'s own tools.
        timeouts: seconds a call of each tool may take (default: the tool's own
            ``timeout_seconds`` plus a second, so that its timeout answers first, as the SDK
            would, recorded with the call; else 60): a ``never`` call's deadline, which a
            worker taking over waits for before answering for it.
        model_provider: where model names are looked up when ``agent.model`` is not a
            ``Model`` (default: the SDK's ``MultiProvider``, OpenAI).
        run_config: the SDK's run configuration (its ``model_provider`` is replaced, and its
            ``tool_execution.max_function_tool_concurrency`` set to 1).
        max_turns: the SDK's ``max_turns`` for each run.
        approval_timeout: seconds a call waits for an approval.
        history_turns: how many earlier turns of the session the model sees (None: all).

    Raises:
        InvalidArgumentError: a function tool without a label (or a label that is neither
            ``safe`` nor ``never``), a label for no tool, or what a durable run cannot make
            durable: MCP servers, handoffs, local tools other than function tools.
    """

    def __init__(
        self,
        agent: Agent[Any],
        *,
        replay: Mapping[str, Replay],
        timeouts: Mapping[str, float] | None = None,
        model_provider: ModelProvider | None = None,
        run_config: RunConfig | None = None,
        max_turns: int = 10,
        approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
        history_turns: int | None = None,
    ) -> None:
        if not isinstance(agent, Agent):
            raise InvalidArgumentError(f"agent must be an agents.Agent, got {agent!r:.80}")
        if agent.mcp_servers:
            raise InvalidArgumentError(
                f"agent {agent.name!r} uses MCP servers, whose calls a durable run cannot "
                "journal yet; wrap what you need in function tools"
            )
        if agent.handoffs:
            raise InvalidArgumentError(
                f"agent {agent.name!r} has handoffs, which a durable run does not support yet"
            )
        names: list[str] = []
        for item in agent.tools:
            if isinstance(item, FunctionTool):
                names.append(item.name)
            elif not _hosted(item):
                raise InvalidArgumentError(
                    f"agent {agent.name!r}: tool {getattr(item, 'name', item)!r} "
                    f"({type(item).__name__}) runs locally with effects the journal cannot "
                    "see; use function tools in a durable run"
                )
        labels = dict(replay)
        missing = [name for name in names if name not in labels]
        if missing:
            raise InvalidArgumentError(
                f"agent {agent.name!r}: give every function tool a replay label, "
                f"replay={{{', '.join(f'{n!r}: ...' for n in missing)}}} ('safe' may run "
                "again after a crash; 'never' must not run twice)"
            )
        unknown = sorted(set(labels) - set(names))
        if unknown:
            raise InvalidArgumentError(
                f"agent {agent.name!r} has no function tool named {', '.join(map(repr, unknown))}"
                f" (its tools: {', '.join(map(repr, names)) or 'none'})"
            )
        self.labels = {name: _check_label(name, label) for name, label in labels.items()}
        self.timeouts: dict[str, float] = {}
        for name, seconds in (timeouts or {}).items():
            if name not in names:
                raise InvalidArgumentError(f"timeouts names {name!r}, which is no function tool")
            # The journal's own check of a tool's timeout, here rather than at the first call.
            self.timeouts[name] = _check_timeout(seconds, name)
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidArgumentError(f"max_turns must be an int >= 1, got {max_turns!r}")
        if (
            isinstance(approval_timeout, bool)
            or not isinstance(approval_timeout, int | float)
            or not math.isfinite(approval_timeout)
            or not approval_timeout > 0
        ):
            raise InvalidArgumentError(
                f"approval_timeout must be a finite number of seconds > 0, got {approval_timeout!r}"
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
        self.model_provider = model_provider if model_provider is not None else MultiProvider()
        self.run_config = run_config if run_config is not None else RunConfig()
        self.max_turns = max_turns
        self.approval_timeout = float(approval_timeout)
        self.history_turns = history_turns

    def conversation(self, journal: Journal) -> list[TResponseInputItem]:
        """The input a turn's run starts from: the earlier turns' messages and answers (the
        last ``history_turns``), then the turn's message."""
        history = journal.history
        if self.history_turns is not None:
            history = history[max(0, len(history) - self.history_turns) :]
            history = history if self.history_turns else []
        items: list[TResponseInputItem] = []
        for message, answer in history:
            items.append({"role": "user", "content": message})
            items.append({"role": "assistant", "content": answer})
        items.append({"role": "user", "content": journal.user_message})
        return items

    def durable(
        self, journal: Journal, escape: _Escape | None = None
    ) -> tuple[Agent[Any], RunConfig]:
        """The agent and run configuration of one run through ``journal``."""
        escape = escape if escape is not None else _Escape()
        lock = anyio.Lock()  # one tool step at a time, in the order the SDK starts them
        tools: list[SDKTool] = [
            self._journaled_tool(item, journal, lock, escape)
            if isinstance(item, FunctionTool)
            else item
            for item in self.agent.tools
        ]
        provider = JournaledModelProvider(self.model_provider, journal, escape=escape)
        model = self.agent.model
        if isinstance(model, Model):
            model = JournaledModel(model, journal, name=type(model).__name__, escape=escape)
        agent = self.agent.clone(model=model, tools=tools)
        # One function tool call at a time, in the reply's order: the SDK starts each only once
        # the one before has ended, so the calls' steps are taken in that order in every run.
        # Started together, they took their steps in the order they got through the awaits
        # before the tool (input guardrails, on_tool_start hooks), which a replay need not
        # repeat: it found another call at a recorded step (NonDeterminismError).
        execution = self.run_config.tool_execution or ToolExecutionConfig()
        config = dataclasses.replace(
            self.run_config,
            model_provider=provider,
            tool_execution=dataclasses.replace(execution, max_function_tool_concurrency=1),
        )
        return agent, config

    async def run_turn(self, journal: Journal) -> str:
        """Run (or replay) the turn to its reply, record it, and return it.

        Raises:
            TurnSuspended: the run waits for an approval (the worker resumes it later).
            ConfigurationError: the SDK refused the run as misconfigured (its ``UserError``):
                the worker records the turn's failure at once.
            ModelReplyError: the SDK could not use a model reply (its ``ModelBehaviorError``):
                the worker records the turn's failure at once.
        """
        escape = _Escape()
        agent, config = self.durable(journal, escape)
        result = await self._run(escape, agent, self.conversation(journal), config)
        while result.interruptions:
            state = result.to_state()
            for item in result.interruptions:
                # The same name and input as the call's own step: an approval given covers
                # the model's retry of the call after it was cut off (see Journal.approval).
                name = item.name or "tool"
                arguments = {"arguments": _arguments(item.arguments)}
                refused = await journal.approval(name, arguments, timeout=self.approval_timeout)
                if refused is None:
                    state.approve(item)
                else:
                    state.reject(item, rejection_message=refused)
            result = await self._run(escape, agent, state, config)
        output = result.final_output
        reply = (
            output
            if isinstance(output, str)
            else canonical_json(to_jsonable_python(output)).decode("utf-8")
        )
        return await journal.finish(reply)

    async def _run(
        self,
        escape: _Escape,
        agent: Agent[Any],
        start: list[TResponseInputItem] | RunState[Any],
        config: RunConfig,
    ) -> RunResult:
        try:
            return await Runner.run(agent, start, run_config=config, max_turns=self.max_turns)
        except Exception as exc:
            escape.check()  # the journal's own error, as it was raised (not the SDK's wrapper)
            if isinstance(exc, UserError):  # the SDK misused: running it again fails the same
                raise ConfigurationError(f"the OpenAI Agents SDK refused the run: {exc}") from exc
            if isinstance(exc, ModelBehaviorError):  # from recorded replies: a replay fails alike
                raise ModelReplyError(f"the model's reply could not be used: {exc}") from exc
            raise

    def _journaled_tool(
        self, item: FunctionTool, journal: Journal, lock: anyio.Lock, escape: _Escape
    ) -> FunctionTool:
        label = self.labels[item.name]
        own = item.timeout_seconds  # the SDK's timeout of the call, applied inside its step
        timeout = self.timeouts.get(item.name) or (
            own + _TIMEOUT_MARGIN if own is not None else DEFAULT_TOOL_TIMEOUT
        )
        invoke = item.on_invoke_tool

        async def on_invoke_tool(context: SDKToolContext[Any], arguments: str) -> Any:
            async def body(step: ToolContext | None) -> Any:
                token = _CONTEXT.set(step)
                try:
                    output = await _invoke_within(item, invoke, own, context, arguments)
                finally:
                    _CONTEXT.reset(token)
                if step is not None and step.refusal is not None:
                    # check() found the lease lost, and the SDK made the refusal text for the
                    # model: it is no outcome (the turn's next attempt runs the call again).
                    raise step.refusal
                return output

            async with lock:
                escape.check()
                try:
                    return await journal.step(
                        "tool",
                        item.name,
                        body,
                        input={"arguments": _arguments(arguments)},
                        replay=label,
                        timeout=timeout,
                    )
                except PossiblyRanError:
                    return POSSIBLY_RAN
                except ToolError as exc:
                    return f"Error: {exc.error}"
                except WorldError as exc:
                    raise escape.keep(exc) from None

        # The SDK's own timer would cancel the journal's step half-way (the step unfinished,
        # the model told the call timed out, the next model call landing on the tool's
        # position: NonDeterminismError); the step applies the timeout itself.
        return dataclasses.replace(item, on_invoke_tool=on_invoke_tool, timeout_seconds=None)


async def _invoke_within(
    item: FunctionTool,
    invoke: Callable[[SDKToolContext[Any], str], Awaitable[Any]],
    seconds: float | None,
    context: SDKToolContext[Any],
    arguments: str,
) -> Any:
    """The tool's own call, cut off after its ``timeout_seconds`` (None: no cut) with what
    the SDK answers then (:func:`_timed_out`)."""
    if seconds is None:
        return await invoke(context, arguments)
    with anyio.move_on_after(seconds):
        return await invoke(context, arguments)
    return await _timed_out(item, seconds, context)


async def _timed_out(item: FunctionTool, seconds: float, context: SDKToolContext[Any]) -> Any:
    """What the SDK answers for a function tool call past its ``timeout_seconds``, recorded as
    the call's outcome: its ``timeout_error_function``'s result or its default message; with
    ``timeout_behavior="raise_exception"``, its ``ToolTimeoutError`` (recorded as the call's
    error, which the model is told)."""
    error = ToolTimeoutError(tool_name=item.name, timeout_seconds=seconds)
    if item.timeout_behavior == "raise_exception":
        raise error
    if item.timeout_error_function is None:
        return default_tool_timeout_error_message(tool_name=item.name, timeout_seconds=seconds)
    result = item.timeout_error_function(context, error)
    return await result if inspect.isawaitable(result) else result


def _arguments(text: str | None) -> Any:
    """A call's arguments as JSON when they parse (what approvers see), else the raw text
    (also when they hold NaN or Infinity, which Python reads and JSON cannot hold)."""
    if text is None:
        return {}
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:
        return text


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _hosted(item: object) -> bool:
    """Tools the model provider runs itself (inside the model call): recorded with it."""
    from agents import (
        CodeInterpreterTool,
        FileSearchTool,
        HostedMCPTool,
        ImageGenerationTool,
        WebSearchTool,
    )

    hosted = FileSearchTool | WebSearchTool | CodeInterpreterTool | ImageGenerationTool
    return isinstance(item, hosted | HostedMCPTool)
