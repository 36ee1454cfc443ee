"""Documents: typed JSON in the session log, edited by tools atomically with their outcome."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from world_core import (
    Client,
    CrashPoint,
    Documents,
    Journal,
    Replay,
    SimulatedCrash,
    ToolContext,
    World,
    open_world,
    session_log_id,
    tool,
)
from world_core.errors import InvalidArgumentError, PossiblyRanError, ToolError

pytestmark = pytest.mark.anyio
LOG = session_log_id("s")


class Todo(BaseModel):
    items: list[str] = []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="docs") as opened:
        yield opened


@pytest.fixture
async def turn(world: World) -> str:
    return await Client(world).submit("s", "hello", turn_id="t")


def add_item(item: str, context: ToolContext) -> int:
    """Add an item to the to-do list."""
    todo = context.docs.get("todo", Todo) or Todo()
    todo.items.append(item)
    context.docs.put("todo", todo)
    return len(todo.items)


@pytest.mark.parametrize("replay", ["never", "safe"])
async def test_a_tool_edit_commits_with_its_outcome(
    world: World, turn: str, replay: Replay
) -> None:
    add = tool(add_item, replay=replay)
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["from the app"]))
    journal = await Journal.open(world, "s", turn)
    assert await journal.call(add, {"item": "a"}) == 2
    assert await journal.call(add, {"item": "b"}) == 3  # sees the first call's edit
    await journal.finish("ok")
    todo = await docs.get("s", "todo", Todo)
    assert todo == Todo(items=["from the app", "a", "b"])
    events = await world.log.read(LOG)
    keys = [event.key for event in events]
    outcome = keys.index("turn/t/step/0/outcome")
    assert keys[outcome + 1] == "doc/todo/v/2"  # version 1 is the app's
    # Replay: the tool does not run, the document is not edited again.
    again = await Journal.open(world, "s", turn)
    assert await again.call(add, {"item": "a"}) == 2
    assert await again.call(add, {"item": "b"}) == 3
    assert again.tool_runs == 0
    assert await docs.get("s", "todo", Todo) == Todo(items=["from the app", "a", "b"])


async def test_an_interrupted_or_failing_tool_edits_nothing(world: World, turn: str) -> None:
    async def edit_then_hang(item: str, context: ToolContext) -> str:
        context.docs.put("todo", Todo(items=[item]))
        await anyio.sleep_forever()
        return item

    def edit_then_fail(item: str, context: ToolContext) -> str:
        context.docs.put("todo", Todo(items=[item]))
        raise RuntimeError("failed after editing")

    def edit_then_crash(item: str, context: ToolContext) -> str:
        context.docs.put("todo", Todo(items=[item]))
        return item

    journal = await Journal.open(world, "s", turn)
    with anyio.fail_after(10), pytest.raises(PossiblyRanError):  # timed out
        await journal.call(tool(edit_then_hang, replay="never", timeout=0.2), {"item": "x"})
    with pytest.raises(ToolError, match="RuntimeError: failed after editing"):
        await journal.call(tool(edit_then_fail, replay="never"), {"item": "y"})
    crash = CrashPoint(2, "after_run", in_process=True)
    dying = await Journal.open(world, "s", turn, crash=crash)
    for step, item in ((edit_then_hang, "x"), (edit_then_fail, "y")):  # replayed
        with pytest.raises(ToolError):
            await dying.call(tool(step, replay="never", timeout=0.2), {"item": item})
    with pytest.raises(SimulatedCrash):
        await dying.call(tool(edit_then_crash, replay="never"), {"item": "z"})
    assert await Documents(world).get("s", "todo", Todo) is None
    assert not any((event.key or "").startswith("doc/") for event in await world.log.read(LOG))


async def test_documents_refuse_bad_input_before_writing(world: World) -> None:
    docs = Documents(world)
    with pytest.raises(InvalidArgumentError, match="must not contain '/'"):
        await docs.put("s", "a/b", Todo())
    with pytest.raises(InvalidArgumentError, match="pydantic model"):
        await docs.put("s", "todo", {"items": []})  # type: ignore[arg-type]  # refusal under test
    assert await world.log.tail(LOG) == 0
    assert await docs.get("s", "todo", Todo) is None
