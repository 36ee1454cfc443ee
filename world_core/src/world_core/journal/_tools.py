"""Tools: functions the model may call, each with a required replay label.

``replay="safe"``: running it again after a crash is harmless (a lookup); an interrupted call
is simply run again. ``replay="never"``: it must not run twice (a refund, an email); its
intent is committed before it runs, and after an interrupted call the model is told it may or
may not have happened. There is no default: a tool without a label, or with a misspelled one,
is refused when it is defined.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import inspect
import json
import math
import re
import time
import typing
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import anyio.to_thread
import pydantic
from pydantic_core import to_jsonable_python

from world_core.errors import InvalidArgumentError, LeaseLostError
from world_core.journal._blobs import Blobs
from world_core.journal._waits import MAX_WAIT_SECONDS
from world_core.spi import World, validate_id

__all__ = [
    "DEFAULT_APPROVAL_TIMEOUT",
    "Approval",
    "DEFAULT_TOOL_TIMEOUT",
    "MAX_CONFLICT_RUNS",
    "MAX_IDEMPOTENCY_KEY_BYTES",
    "Replay",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "abandoned_calls",
    "check_state_name",
    "idempotency_key",
    "tool",
]

Replay = Literal["safe", "never"]
_REPLAYS: tuple[str, ...] = get_args(Replay)


DEFAULT_TOOL_TIMEOUT = 60.0
"""Seconds a tool call may take unless its tool says otherwise (``tool(..., timeout=...)``)."""

DEFAULT_APPROVAL_TIMEOUT = 24 * 3600.0
"""Seconds a call of an ``approval="required"`` tool waits for a decision by default."""

Approval = Literal["none", "required"]
"""Whether a tool's calls wait for a person's decision before they run."""

MAX_IDEMPOTENCY_KEY_BYTES = 255
"""Idempotency keys never exceed this many UTF-8 bytes (Stripe's limit, the strictest known)."""

MAX_CONFLICT_RUNS = 3
"""How many times a ``safe`` call whose claims conflict is run in all (see
:meth:`ToolContext.claim`) before it fails with the conflict."""

_JOURNAL_KEYS = ("turn/", "session/", "signal/")

MAX_STATE_NAME_BYTES = 200
"""The longest name :meth:`ToolContext.stage` accepts (UTF-8 bytes)."""

_KEY_PREFIX_BYTES = 96
_SHORT_KEY = re.compile(r"~[0-9a-f]{32}/step-[0-9]+$")


def idempotency_key(session_id: str, turn_id: str, step: int) -> str:
    """``<session>/<turn>/step-<n>``, or, when that would exceed 255 UTF-8 bytes (or would look
    like a shortened key itself), the start of the session id, ``~``, 32 hex digits of the
    sha-256 of ``<session>/<turn>`` and ``/step-<n>``: the same ids always give the same key,
    and distinct ids distinct keys (up to a digest collision: a full key never has the
    shortened form, and a turn id has no ``/``, so a full key names one session and turn)."""
    full = f"{session_id}/{turn_id}/step-{step}"
    shortened = "~" in full and _SHORT_KEY.search(full)  # (no "~": nothing to search)
    if len(full.encode("utf-8")) <= MAX_IDEMPOTENCY_KEY_BYTES and not shortened:
        return full  # (a full key that looks shortened is shortened too: no two ids share one)
    digest = hashlib.sha256(f"{session_id}/{turn_id}".encode()).hexdigest()[:32]
    start = session_id.encode("utf-8")[:_KEY_PREFIX_BYTES].decode("utf-8", "ignore")
    return f"{start}~{digest}/step-{step}"


class _ThreadCall:
    """A sync tool's body as run in a worker thread, telling whether it has finished."""

    def __init__(self, body: Callable[[], Any]) -> None:
        self._body = body
        self.started = False
        self.done = False

    def __call__(self) -> Any:
        self.started = True
        try:
            return self._body()
        finally:
            self.done = True
            _ABANDONED.discard(self)


_ABANDONED: set[_ThreadCall] = set()

_BUILT: weakref.WeakSet[type[pydantic.BaseModel]] = weakref.WeakSet()
"""The argument models :func:`tool` built (extra arguments forbidden, no validators)."""


def abandoned_calls() -> int:
    """Sync tool calls abandoned at their timeout whose threads are still running them (a
    process exiting now would wait for them forever: see ``world worker``)."""
    return sum(1 for call in list(_ABANDONED) if not call.done)


def check_state_name(name: object) -> str:
    """A staged-state name: a non-empty str without NUL, at most 200 UTF-8 bytes.

    Raises:
        InvalidArgumentError: anything else.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise InvalidArgumentError(f"state name must be a non-empty str without NUL, got {name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"state name {name!r} is not valid UTF-8") from None
    if size > MAX_STATE_NAME_BYTES:
        raise InvalidArgumentError(
            f"state name is {size} UTF-8 bytes; the limit is {MAX_STATE_NAME_BYTES}"
        )
    return name


_EXTENSIONS: dict[str, Callable[[ToolContext], object]] = {}


class ToolContext:
    """Given to a tool that declares a parameter of this type (any name; not in the schema).

    Attributes:
        session_id, turn_id, step: which call this is.
        idempotency_key: ``<session>/<turn>/step-<n>`` (at most 255 bytes, see
            :func:`idempotency_key`): the same on every retry and replay of this call, and
            reused when the model retries an interrupted or failed ``never`` call with the
            same arguments in the same turn, so an API that honours idempotency keys sees one
            request. Send it with every request that has an effect.
        deadline: UNIX time (on the store's clock, as the worker estimates it) by which this
            call must have finished: its start plus the tool's ``timeout``. After it, the call
            is cancelled (an async tool) or abandoned and reported (a sync one), and another
            worker may answer for it.

    Checks for a tool about to start an irreversible effect: :meth:`time_left`,
    :attr:`lease_held` and :meth:`check`.

    State: :meth:`state` reads a named value of the session as of this call, :meth:`stage`
    stages a new value that is committed in the same atomic append as this call's outcome, and
    only if the call returns (an interrupted or failing call changes nothing). Higher layers
    add their views with :meth:`extend` (``context.docs``, the documents, builds on the
    claims and commit hooks below).

    Commit hooks: :meth:`before_commit` and :meth:`after_commit` let such a layer do its I/O
    once per call (the virtual filesystem stores a call's new file contents as blobs before
    the outcome that names them), and :attr:`blobs` is the journal's content-addressed store.

    Claims: :meth:`claim` stages an event under a key of the layer's own, committed with the
    outcome only if the key is still free (a compare-and-set: the documents' versions), and
    :attr:`world` lets the layer read the session's current data while the call runs.
    """

    def __init__(
        self,
        session_id: str,
        turn_id: str,
        step: int,
        *,
        idempotency_key: str | None = None,
        deadline: float = math.inf,
        clock: Callable[[], float] = time.time,
        lease_held: Callable[[], bool] | None = None,
        state: Mapping[str, Any] | None = None,
        blobs: Blobs | None = None,
        world: World | None = None,
    ) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.step = step
        self.idempotency_key = (
            idempotency_key
            if idempotency_key is not None
            else _default_key(session_id, turn_id, step)
        )
        self.deadline = deadline
        self._clock = clock
        self._lease_held = lease_held
        self._state: Mapping[str, Any] = state if state is not None else {}
        self.staged: dict[str, Any] = {}
        self._extensions: dict[str, object] = {}
        self._blobs = blobs
        self._world = world
        self.claims: dict[str, tuple[dict[str, Any], str]] = {}
        self.refusal: LeaseLostError | None = None
        """What :meth:`check` raised when it refused because the lease was not held."""
        self.before_commit_hooks: list[Callable[[], Awaitable[None]]] = []
        self.after_commit_hooks: list[Callable[[], None]] = []

    @property
    def blobs(self) -> Blobs:
        """The journal's content-addressed blob store (the World's stream).

        Raises:
            InvalidArgumentError: this context was built without one (by hand, outside a
                journal).
        """
        if self._blobs is None:
            raise InvalidArgumentError(
                "this ToolContext has no blob store: build it with ToolContext(..., blobs=...) "
                "or let the journal build it"
            )
        return self._blobs

    @property
    def world(self) -> World:
        """The World the journal writes to: for layers that read the session's current data
        while the call runs (the documents read a document's latest version).

        Raises:
            InvalidArgumentError: this context was built without one (by hand, outside a
                journal).
        """
        if self._world is None:
            raise InvalidArgumentError(
                "this ToolContext has no World: build it with ToolContext(..., world=...) or "
                "let the journal build it"
            )
        return self._world

    def claim(self, key: str, body: Mapping[str, Any], *, conflict: str) -> None:
        """Stage the event ``body`` under the log key ``key``, committed in the same atomic
        append as this call's outcome, and only if no event of the session log holds ``key``
        yet: a compare-and-set on the key (the documents claim ``doc/<name>/v/<version>``, so
        two edits of the same version cannot both commit).

        A call whose claims are refused because another writer took one of the keys is a
        conflict, and nothing it staged is written: a ``safe`` call runs again with a fresh
        context (up to :data:`MAX_CONFLICT_RUNS` runs), then fails with the ``conflict``
        message; a ``never`` call is not run again: its outcome is recorded as an error that
        says it ran but its edits were not saved, with ``conflict``, and the model is told.
        A call with claims is appended at once (never deferred with a ``safe`` outcome), so
        a conflict is known before the next step. May be called from a :meth:`before_commit`
        hook. Claiming the same key again replaces the earlier body.

        Raises:
            InvalidArgumentError: ``key`` is not a valid event key or starts with one of the
                journal's own prefixes (``turn/``, ``session/``, ``signal/``), or ``body`` is
                not a JSON object.
        """
        validate_id(key, "claim key")
        if key.startswith(_JOURNAL_KEYS):
            raise InvalidArgumentError(
                f"claim key {key[:80]!r} starts with one of the journal's own prefixes "
                f"{_JOURNAL_KEYS}; use a prefix of your layer's (the documents use 'doc/')"
            )
        try:
            jsonable = to_jsonable_python(body)
            json.dumps(jsonable, allow_nan=False)
        except Exception as exc:
            raise InvalidArgumentError(f"claim {key!r}: body is not JSON: {exc}") from None
        if not isinstance(jsonable, dict):
            raise InvalidArgumentError(f"claim {key!r}: body must be a JSON object")
        self.claims[key] = (jsonable, str(conflict))

    def before_commit(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` once the call has returned, before its outcome and staged values are
        appended, and only if they will be (not for a call that failed, timed out or was
        interrupted). It may still :meth:`stage` values. It is retried on transient faults
        (:class:`~world_core.errors.BackendUnavailableError`), so it must be idempotent; any
        other error it raises stops the step as a failed append would (nothing is recorded,
        and the turn is run again)."""
        self.before_commit_hooks.append(hook)

    def after_commit(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` after the call's outcome and staged values were kept (appended, or
        queued with the next append for a ``safe`` call), and only then."""
        self.after_commit_hooks.append(hook)

    def time_left(self) -> float:
        """Seconds until :attr:`deadline` (negative once it passed)."""
        return self.deadline - self._clock()

    @property
    def lease_held(self) -> bool:
        """True while the worker still holds this turn's lease (always True outside a worker).
        False means another worker may take the turn over: do not start an effect now."""
        return True if self._lease_held is None else self._lease_held()

    def check(self, needs: float = 0.0) -> None:
        """Refuse to go on unless the lease is held and ``needs`` seconds are left.

        Call it right before an irreversible effect (a payment, an email), and let what it
        raises propagate (or chain it: ``raise MyError(...) from exc``):

        * the lease is not held (the worker was paused or its event loop blocked past the
          lease; another worker may be taking the turn over): the refusal is not the call's
          outcome. The effect did not start, so the call stays to be run: the journal records
          that it was not started (only if nobody else wrote to the turn meanwhile), the
          worker stops the turn without acking or failing it, and the attempt that takes the
          turn next runs the call again, with the same idempotency key. The model never sees
          the refusal.
        * fewer than ``needs`` seconds are left before the call's own :attr:`deadline`: the
          refusal is the call's outcome, an error the model sees (it says the effect was not
          started). The call spent the time its tool was given; running it again unasked
          could repeat that forever, so the model decides whether to call again.

        Raises:
            LeaseLostError: the lease is no longer held (also kept in :attr:`refusal`).
            TimeoutError: fewer than ``needs`` seconds are left before :attr:`deadline`.
        """
        if isinstance(needs, bool) or not isinstance(needs, int | float) or not needs >= 0:
            raise InvalidArgumentError(f"needs must be seconds >= 0, got {needs!r}")
        if not self.lease_held:
            self.refusal = LeaseLostError(
                f"step {self.step}: this worker no longer holds the turn's lease; the effect "
                "was not started (the turn's next attempt runs the call again)"
            )
            raise self.refusal
        left = self.time_left()
        if left < needs:
            raise TimeoutError(
                f"step {self.step}: {left:.1f} s left before the call's deadline, {needs:.1f} s "
                "needed; the effect was not started"
            )

    def refused_by(self, error: BaseException) -> LeaseLostError | None:
        """:attr:`refusal` if ``error`` is it or was raised from it (its ``__cause__`` or
        ``__context__`` chain): the call stopped because :meth:`check` found the lease lost."""
        seen: set[int] = set()
        found: BaseException | None = error
        while found is not None and self.refusal is not None and id(found) not in seen:
            if found is self.refusal:
                return self.refusal
            seen.add(id(found))
            found = found.__cause__ or found.__context__
        return None

    def state(self, name: str) -> Any:
        """The session's value named ``name`` as of this call (this call's own staged value
        first), or None if it was never set."""
        check_state_name(name)
        return self.staged[name] if name in self.staged else self._state.get(name)

    def stage(self, name: str, value: Any) -> None:
        """Stage a JSON value under ``name``; committed with this call's outcome.

        Raises:
            InvalidArgumentError: a bad name, or a value that is not JSON.
        """
        check_state_name(name)
        try:
            jsonable = to_jsonable_python(value)
            json.dumps(jsonable, allow_nan=False)  # NaN and infinity have no JSON form either
        except Exception as exc:
            raise InvalidArgumentError(f"state {name!r}: value is not JSON: {exc}") from None
        self.staged[name] = jsonable

    @staticmethod
    def extend(name: str, factory: Callable[[ToolContext], object]) -> None:
        """Add attribute ``name`` to every context, made by ``factory(context)`` on first use.

        For the layers above the journal (the documents add ``docs``): they build on
        :meth:`state` and :meth:`stage` without the journal knowing them.
        """
        _EXTENSIONS[name] = factory

    def __getattr__(self, name: str) -> Any:
        factory = _EXTENSIONS.get(name)
        if factory is None or name.startswith("_"):
            raise AttributeError(f"ToolContext has no attribute {name!r}")
        made = self._extensions.get(name)
        if made is None:
            made = self._extensions[name] = factory(self)
        return made

    def __repr__(self) -> str:
        return (
            f"ToolContext(session_id={self.session_id!r}, turn_id={self.turn_id!r}, "
            f"step={self.step}, idempotency_key={self.idempotency_key!r})"
        )


_default_key = idempotency_key


@dataclass(frozen=True)
class Tool:
    """A registered tool. Build with :func:`tool`."""

    name: str
    description: str
    replay: Replay
    fn: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    context_parameter: str | None
    timeout: float = DEFAULT_TOOL_TIMEOUT
    approval: Approval = "none"
    """``"required"``: every call waits for a person's decision before it runs."""
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT
    """Seconds a call waits for a decision; then it is refused without running."""

    def schema(self) -> dict[str, Any]:
        """The chat-completions ``tools`` entry: name, description, JSON schema of arguments."""
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }

    def relabel(self, replay: Replay) -> Tool:
        """This tool with another replay label (to show what a wrong label does)."""
        return dataclasses.replace(self, replay=_check_replay(replay, self.name))

    def parse(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validate the model's arguments; returns them normalised (defaults filled).

        Raises:
            InvalidArgumentError: they do not match the schema (the message is for the model).
        """
        same = self._as_validated(arguments)
        if same is not None:
            return same
        try:
            model = self.arguments.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise InvalidArgumentError(
                f"invalid arguments for {self.name}: {exc.errors(include_url=False)}"
            ) from None
        return model.model_dump(mode="json")

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        """Run the tool with validated arguments (sync functions run in a worker thread, which
        is abandoned, still running, if the call is cancelled: a thread cannot be stopped)."""
        kwargs = self._as_validated(arguments)
        if kwargs is None:
            model = self.arguments.model_validate(arguments)
            kwargs = {name: getattr(model, name) for name in self._parameters}
        if self.context_parameter is not None:
            kwargs[self.context_parameter] = context
        if self.is_async:
            return await self.fn(**kwargs)
        call = _ThreadCall(lambda: self.fn(**kwargs))
        try:
            return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        finally:
            if call.started and not call.done:  # cancelled: the thread runs on, abandoned
                _ABANDONED.add(call)

    # Both are asked on every call: worked out once per Tool (a relabelled copy works them
    # out again), not by inspecting the function and the model's fields each time.
    @functools.cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @functools.cached_property
    def _parameters(self) -> tuple[str, ...]:
        return tuple(self.arguments.model_fields)

    def _as_validated(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """What validating ``arguments`` gives (as :meth:`parse` returns it), without
        pydantic, when that is known to be the same values: every argument of a plain tool
        (:attr:`_plain`) is there, of exactly its type, and nothing else is. Else None:
        pydantic validates them (and defaults, conversions and errors are its own)."""
        plain = self._plain
        if plain is None or type(arguments) is not dict or len(arguments) != len(plain):
            return None
        for name, kind in plain:
            if type(arguments.get(name)) is not kind:
                return None
        return {name: arguments[name] for name, _ in plain}

    @functools.cached_property
    def _plain(self) -> tuple[tuple[str, type], ...] | None:
        """Each argument's name and type when every one is a bare ``int``, ``str`` or
        ``bool`` of a model :func:`tool` built (no alias, constraint or validator; extra
        arguments forbidden); else None. Validating arguments of exactly those names and
        types gives back the same values (the same objects, in the model's field order),
        so :meth:`parse` and :meth:`call` skip that (:meth:`_as_validated`); any other
        arguments are validated."""
        if self.arguments not in _BUILT:
            return None
        plain: list[tuple[str, type]] = []
        for name, field in self.arguments.model_fields.items():
            kind = field.annotation
            if kind not in (int, str, bool) or field.metadata or field.alias is not None:
                return None
            if field.validation_alias is not None:
                return None
            plain.append((name, cast(type, kind)))
        return tuple(plain)


def _check_replay(replay: object, name: str) -> Replay:
    if replay in _REPLAYS:
        return cast(Replay, replay)
    close = difflib.get_close_matches(str(replay), _REPLAYS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise InvalidArgumentError(
        f"tool {name!r}: replay must be 'safe' (may run again after a crash) or 'never' (must "
        f"not run twice; the model is told it may have happened), got {replay!r}.{hint}"
    )


def _description(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _check_timeout(timeout: object, name: str, what: str = "timeout") -> float:
    """``timeout`` as seconds: finite, > 0 and at most ten years, the longest deadline the
    journal records (a worker taking over a cut-off call is queued to resume after it, and
    every backend's queue holds a delay that long)."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidArgumentError(
            f"tool {name!r}: {what} must be a finite number of seconds > 0, got {timeout!r}"
        )
    if timeout > MAX_WAIT_SECONDS:
        raise InvalidArgumentError(
            f"tool {name!r}: {what} must be at most ten years ({MAX_WAIT_SECONDS} s), "
            f"got {timeout!r}"
        )
    return float(timeout)


def _check_approval(approval: object, approval_timeout: object, name: str) -> Approval:
    if approval not in ("none", "required"):
        raise InvalidArgumentError(
            f"tool {name!r}: approval must be 'none' or 'required' (every call waits for a "
            f"person's decision), got {approval!r}"
        )
    _check_timeout(approval_timeout, name, "approval_timeout")
    return approval


def _build(
    fn: Callable[..., Any],
    replay: object,
    name: str | None,
    description: str | None,
    timeout: object = DEFAULT_TOOL_TIMEOUT,
    approval: object = "none",
    approval_timeout: object = DEFAULT_APPROVAL_TIMEOUT,
) -> Tool:
    tool_name = name or getattr(fn, "__name__", "")
    if not tool_name or not tool_name.replace("_", "a").replace("-", "a").isalnum():
        raise InvalidArgumentError(
            f"tool name {tool_name!r} must be letters, digits, '_' or '-' (chat-completions rule)"
        )
    label = _check_replay(replay, tool_name)
    seconds = _check_timeout(timeout, tool_name)
    needs = _check_approval(approval, approval_timeout, tool_name)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise InvalidArgumentError(
            f"tool {tool_name!r}: cannot resolve a type hint: {exc}"
        ) from exc
    fields: dict[str, Any] = {}
    context_parameter: str | None = None
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise InvalidArgumentError(
                f"tool {tool_name!r}: *args/**kwargs cannot be described to a model; "
                "name each argument"
            )
        if parameter.name not in hints:
            raise InvalidArgumentError(
                f"tool {tool_name!r}: annotate parameter {parameter.name!r} so its JSON schema "
                "can be derived"
            )
        hint = hints[parameter.name]
        if hint is ToolContext:
            context_parameter = parameter.name
            continue
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hint, default)
    arguments = pydantic.create_model(
        f"{tool_name}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    _BUILT.add(arguments)
    return Tool(
        name=tool_name,
        description=description if description is not None else _description(fn),
        replay=label,
        fn=fn,
        arguments=cast(type[pydantic.BaseModel], arguments),
        context_parameter=context_parameter,
        timeout=seconds,
        approval=needs,
        approval_timeout=float(cast(float, approval_timeout)),
    )


@typing.overload
def tool(
    fn: Callable[..., Any],
    *,
    replay: Replay,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    approval: Approval = "none",
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
) -> Tool: ...


@typing.overload
def tool(
    fn: None = None,
    *,
    replay: Replay,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    approval: Approval = "none",
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    replay: Replay,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    approval: Approval = "none",
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Define a tool from a typed function (sync or async), as ``tool(f, replay=...)`` or
    ``@tool(replay=...)``.

    The JSON schema comes from the parameters' type hints (pydantic types and ``Annotated``
    with ``Field(description=...)`` work); the description from the docstring's first
    paragraph. A parameter annotated :class:`ToolContext` receives the call's context.

    ``timeout`` (seconds, default :data:`DEFAULT_TOOL_TIMEOUT`) bounds every call: past it an
    async tool is cancelled and a sync one abandoned in its thread (and logged); the call's
    outcome is then a timeout (for a ``never`` tool: it may or may not have happened). The
    deadline is recorded with a ``never`` call's intent, and a worker taking the turn over
    waits for it before answering for the call, so set it above the longest the call can
    really take.

    ``approval="required"``: every call waits for a person's decision before it runs
    (:meth:`Client.approve <world_core.Client.approve>`, ``world approve``); the turn holds no
    worker meanwhile. A rejection, or no decision within ``approval_timeout`` seconds (default
    :data:`DEFAULT_APPROVAL_TIMEOUT`), refuses the call without running it, and the model is
    told so.

    Raises:
        InvalidArgumentError: ``replay`` is not ``"safe"`` or ``"never"``, ``timeout`` or
            ``approval_timeout`` is not a number > 0 and at most ten years, ``approval`` is
            not ``"none"`` or ``"required"``, a parameter has no type hint, or the name is not
            a valid tool name.
    """
    if fn is None:
        return lambda f: _build(f, replay, name, description, timeout, approval, approval_timeout)
    return _build(fn, replay, name, description, timeout, approval, approval_timeout)


class ToolRegistry:
    """The tools an agent offers, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.add(item)

    def add(self, item: Tool) -> Tool:
        """Register a tool built with :func:`tool`.

        Raises:
            InvalidArgumentError: not a Tool (a bare function has no replay label), or a second
                tool with the same name.
        """
        if not isinstance(item, Tool):
            raise InvalidArgumentError(
                f"register tools built with tool(fn, replay='safe'|'never'), got {item!r}"
            )
        if item.name in self._tools:
            raise InvalidArgumentError(f"a tool named {item.name!r} is already registered")
        self._tools[item.name] = item
        return item

    def register(
        self,
        *,
        replay: Replay,
        name: str | None = None,
        description: str | None = None,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
    ) -> Callable[[Callable[..., Any]], Tool]:
        """Decorator: define a tool (see :func:`tool`) and add it here."""

        def decorate(fn: Callable[..., Any]) -> Tool:
            return self.add(_build(fn, replay, name, description, timeout))

        return decorate

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def relabel(self, name: str, replay: Replay) -> ToolRegistry:
        """A copy where tool ``name`` carries another replay label."""
        return ToolRegistry(
            item.relabel(replay) if item.name == name else item for item in self._tools.values()
        )

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's chat-completions entry, in registration order."""
        return [item.schema() for item in self._tools.values()]

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)
