"""Tools: the required replay label, schemas from type hints, argument checks."""

# Every "type: ignore" in this file marks an argument of a deliberately wrong type or value:
# the refusal of it is what the test checks.

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import Field

from world_core import ToolContext, ToolRegistry, tool
from world_core.errors import ConfigurationError, InvalidArgumentError
from world_core.journal._crash import CrashPoint, parse_crash_at
from world_core.journal._waits import MAX_WAIT_SECONDS


def refund(order_id: str, amount: float, note: str = "", *, context: ToolContext) -> str:
    """Refund an order.

    The amount is in euros.
    """
    return f"{order_id}:{amount}:{context.idempotency_key}"


def test_replay_label_has_no_default() -> None:
    with pytest.raises(TypeError, match="replay"):
        tool(refund)  # type: ignore[call-overload]


@pytest.mark.parametrize(("label", "hint"), [("nevr", "'never'"), ("Safe", "'safe'"), ("", "")])
def test_misspelled_replay_label_is_refused(label: str, hint: str) -> None:
    with pytest.raises(InvalidArgumentError, match="replay must be 'safe'") as caught:
        tool(refund, replay=label)  # type: ignore[call-overload]
    assert hint in str(caught.value)


def test_relabel_checks_the_label() -> None:
    safe = tool(refund, replay="safe")
    assert safe.relabel("never").replay == "never"
    assert safe.replay == "safe"
    with pytest.raises(InvalidArgumentError):
        safe.relabel("sometimes")  # type: ignore[arg-type]


def test_schema_from_type_hints() -> None:
    schema = tool(refund, replay="never").schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "refund"
    assert function["description"] == "Refund an order."
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    assert parameters["required"] == ["order_id", "amount"]
    assert parameters["properties"]["order_id"]["type"] == "string"
    assert parameters["properties"]["amount"]["type"] == "number"
    assert parameters["properties"]["note"]["default"] == ""
    assert "context" not in parameters["properties"]
    assert parameters["additionalProperties"] is False


def test_annotated_descriptions_reach_the_schema() -> None:
    def lookup(topic: Annotated[str, Field(description="what to look up")]) -> str:
        """Look up."""
        return topic

    properties = tool(lookup, replay="safe").schema()["function"]["parameters"]["properties"]
    assert properties["topic"]["description"] == "what to look up"


def test_unannotated_parameter_is_refused() -> None:
    def bad(x) -> str:  # type: ignore[no-untyped-def]
        return str(x)

    with pytest.raises(InvalidArgumentError, match="annotate parameter 'x'"):
        tool(bad, replay="safe")


def test_var_arguments_are_refused() -> None:
    def bad(*items: str) -> str:
        return ",".join(items)

    with pytest.raises(InvalidArgumentError, match=r"\*args"):
        tool(bad, replay="safe")


def test_parse_validates_and_fills_defaults() -> None:
    refund_tool = tool(refund, replay="never")
    assert refund_tool.parse({"order_id": "A1", "amount": 3}) == {
        "order_id": "A1",
        "amount": 3.0,
        "note": "",
    }
    with pytest.raises(InvalidArgumentError, match="invalid arguments for refund"):
        refund_tool.parse({"order_id": "A1"})
    with pytest.raises(InvalidArgumentError):
        refund_tool.parse({"order_id": "A1", "amount": 1, "extra": True})


def test_parse_gives_what_pydantic_gives_for_arguments_of_their_exact_types() -> None:
    """Arguments of exactly the declared bare types are not validated again by pydantic: what
    parse returns is what pydantic's validation and dump give, in the model's field order;
    any others (a str or bool for an int, a missing, extra or non-str key, not a dict) go
    through pydantic, converted or refused."""

    async def pick(count: int, label: str, flag: bool = False) -> None:
        """Pick."""

    picker = tool(pick, replay="never")

    def validated(arguments: Any) -> dict[str, Any]:
        return picker.arguments.model_validate(arguments).model_dump(mode="json")

    for arguments in (
        {"label": "\ud83d lone surrogate", "flag": True, "count": 10**400},
        {"count": -1, "label": "", "flag": False},
        {"count": True, "label": "y", "flag": 1},
        {"count": "4", "label": "x"},
    ):
        parsed = picker.parse(arguments)
        assert parsed == validated(arguments)
        assert list(parsed) == ["count", "label", "flag"]
        assert [type(value) for value in parsed.values()] == [int, str, bool]
    refused: list[Any] = [
        {"count": 1},
        {"count": 1, "label": "x", "flag": 1, "more": 0},
        [1],
        {1: 2},
    ]
    for bad in refused:
        with pytest.raises(InvalidArgumentError, match="invalid arguments for pick"):
            picker.parse(bad)


async def test_call_passes_the_context_and_runs_sync_tools() -> None:
    refund_tool = tool(refund, replay="never")
    context = ToolContext("s", "t", 4)
    assert context.idempotency_key == "s/t/step-4"
    result = await refund_tool.call({"order_id": "A1", "amount": 2.5}, context)
    assert result == "A1:2.5:s/t/step-4"


async def test_a_call_gets_its_arguments_as_validation_gives_them() -> None:
    """Arguments of exactly the declared bare types skip a second validation; any others
    (a str for an int, a bool for an int, a missing or an extra argument) are validated as
    ever: converted, or refused."""
    seen: list[tuple[object, object]] = []

    async def pick(count: int, label: str = "x") -> None:
        """Pick."""
        seen.append((count, label))

    async def pick_many(count: Annotated[int, Field(ge=1)], label: str = "x") -> None:
        """Pick; count at least 1."""
        seen.append((count, label))

    context = ToolContext("s", "t", 0)
    simple, constrained = tool(pick, replay="never"), tool(pick_many, replay="never")
    await simple.call({"count": 3, "label": "y"}, context)
    await simple.call({"count": "4"}, context)  # converted, default filled
    await simple.call({"count": True, "label": "z"}, context)  # a bool is converted to 1
    assert seen == [(3, "y"), (4, "x"), (1, "z")]
    assert [type(count) for count, _ in seen] == [int, int, int]
    with pytest.raises(ValueError, match="count"):
        await simple.call({"label": "y", "other": 1}, context)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        await constrained.call({"count": 0, "label": "y"}, context)


def test_registry() -> None:
    registry = ToolRegistry()

    @registry.register(replay="safe")
    def lookup(topic: str) -> str:
        """Look up."""
        return topic

    assert registry.get("lookup") is lookup
    assert [schema["function"]["name"] for schema in registry.schemas()] == ["lookup"]
    with pytest.raises(InvalidArgumentError, match="already registered"):
        registry.add(tool(lookup.fn, replay="safe"))
    bare: Any = refund
    with pytest.raises(InvalidArgumentError, match=r"replay='safe'\|'never'"):
        registry.add(bare)
    relabelled = registry.relabel("lookup", "never").get("lookup")
    original = registry.get("lookup")
    assert relabelled is not None
    assert original is not None
    assert relabelled.replay == "never"
    assert original.replay == "safe"


def test_decorator_form() -> None:
    @tool(replay="never", name="send-mail", description="Send it.")
    async def send(to: str) -> str:
        return to

    assert send.name == "send-mail"
    assert send.description == "Send it."


def test_bad_tool_name_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="tool name"):
        tool(refund, replay="safe", name="no spaces")


@pytest.mark.parametrize("seconds", [MAX_WAIT_SECONDS + 1, 1e12, 1e300])
def test_a_timeout_past_ten_years_is_refused(seconds: float) -> None:
    """A ``never`` call's timeout is the deadline a worker taking over waits for, queued to
    resume after it: one past what the queues hold (1e300 was taken, and on PostgreSQL the
    take-over's release then failed as a store bug, out of every worker that claimed the
    turn) is refused where the tool is declared."""
    with pytest.raises(InvalidArgumentError, match="timeout must be at most ten years"):
        tool(refund, replay="never", timeout=seconds)
    with pytest.raises(InvalidArgumentError, match="approval_timeout must be at most ten years"):
        tool(refund, replay="never", approval="required", approval_timeout=seconds)
    assert tool(refund, replay="never", timeout=MAX_WAIT_SECONDS).timeout == MAX_WAIT_SECONDS


def test_crash_at_parsing() -> None:
    assert parse_crash_at("4:after_run") == CrashPoint(4, "after_run")
    assert parse_crash_at(" 0:before_run ") == CrashPoint(0, "before_run")
    assert str(CrashPoint(3, "before_run")) == "3:before_run"
    for bad in ("4", "x:after_run", "4:during", "-1:after_run", "4:after_run:1"):
        with pytest.raises(ConfigurationError, match="CRASH_AT"):
            parse_crash_at(bad)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


pytestmark = pytest.mark.anyio
