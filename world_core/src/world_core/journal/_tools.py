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
import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

import anyio.to_thread
import pydantic

from world_core.errors import InvalidArgumentError
from world_core.workspace._documents import DocumentEdits

__all__ = ["Replay", "Tool", "ToolContext", "ToolRegistry", "tool"]

Replay = Literal["safe", "never"]
_REPLAYS: tuple[str, ...] = get_args(Replay)


@dataclass(frozen=True)
class ToolContext:
    """Given to a tool that declares a parameter of this type (any name; not in the schema).

    ``idempotency_key`` is ``<session>/<turn>/step-<n>``: the same on every retry and replay of
    this call, so an API that honours idempotency keys can drop a repeated request. ``docs``
    reads and edits the session's documents; edits commit with this call's outcome.
    """

    session_id: str
    turn_id: str
    step: int
    docs: DocumentEdits = field(default_factory=DocumentEdits)

    @property
    def idempotency_key(self) -> str:
        return f"{self.session_id}/{self.turn_id}/step-{self.step}"


@dataclass(frozen=True)
class Tool:
    """A registered tool. Build with :func:`tool`."""

    name: str
    description: str
    replay: Replay
    fn: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    context_parameter: str | None

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
        try:
            model = self.arguments.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise InvalidArgumentError(
                f"invalid arguments for {self.name}: {exc.errors(include_url=False)}"
            ) from None
        return model.model_dump(mode="json")

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        """Run the tool with validated arguments (sync functions run in a worker thread)."""
        model = self.arguments.model_validate(arguments)
        kwargs = {name: getattr(model, name) for name in type(model).model_fields}
        if self.context_parameter is not None:
            kwargs[self.context_parameter] = context
        if inspect.iscoroutinefunction(self.fn):
            return await cast(Callable[..., Awaitable[Any]], self.fn)(**kwargs)
        return await anyio.to_thread.run_sync(lambda: self.fn(**kwargs))


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


def _build(
    fn: Callable[..., Any], replay: object, name: str | None, description: str | None
) -> Tool:
    tool_name = name or getattr(fn, "__name__", "")
    if not tool_name or not tool_name.replace("_", "a").replace("-", "a").isalnum():
        raise InvalidArgumentError(
            f"tool name {tool_name!r} must be letters, digits, '_' or '-' (chat-completions rule)"
        )
    label = _check_replay(replay, tool_name)
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
    return Tool(
        name=tool_name,
        description=description if description is not None else _description(fn),
        replay=label,
        fn=fn,
        arguments=cast(type[pydantic.BaseModel], arguments),
        context_parameter=context_parameter,
    )


@typing.overload
def tool(
    fn: Callable[..., Any],
    *,
    replay: Replay,
    name: str | None = None,
    description: str | None = None,
) -> Tool: ...


@typing.overload
def tool(
    fn: None = None, *, replay: Replay, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    replay: Replay,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Define a tool from a typed function (sync or async), as ``tool(f, replay=...)`` or
    ``@tool(replay=...)``.

    The JSON schema comes from the parameters' type hints (pydantic types and ``Annotated``
    with ``Field(description=...)`` work); the description from the docstring's first
    paragraph. A parameter annotated :class:`ToolContext` receives the call's context.

    Raises:
        InvalidArgumentError: ``replay`` is not ``"safe"`` or ``"never"``, a parameter has no
            type hint, or the name is not a valid tool name.
    """
    if fn is None:
        return lambda f: _build(f, replay, name, description)
    return _build(fn, replay, name, description)


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
        self, *, replay: Replay, name: str | None = None, description: str | None = None
    ) -> Callable[[Callable[..., Any]], Tool]:
        """Decorator: define a tool (see :func:`tool`) and add it here."""

        def decorate(fn: Callable[..., Any]) -> Tool:
            return self.add(_build(fn, replay, name, description))

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
