"""Documents v2: versions and conflicts, flat reads, schema versions, deltas, watching.

The exhaustive cases on the local World; the conformance area ``documents`` runs a handful of
them on every backend.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from world_core import (
    Agent,
    Client,
    CrashPoint,
    Documents,
    Journal,
    ModelReply,
    ModelRequest,
    Replay,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    ToolContext,
    Worker,
    World,
    canonical_json,
    open_world,
    session_log_id,
    tool,
)
from world_core.errors import (
    DocumentConflictError,
    DocumentSchemaError,
    InvalidArgumentError,
    ToolError,
)
from world_core.journal._session import CONTINUED_KEY, generation_log_id
from world_core.spi import Event, NewEvent
from world_core.workspace._documents import MAX_DELTAS, diff, head_log_id, patch

pytestmark = pytest.mark.anyio
LOG = session_log_id("s")


class Todo(BaseModel):
    items: list[str] = []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="docs2") as opened:
        yield opened


async def _turn(world: World, turn: str = "t") -> Journal:
    await Client(world).submit("s", "hello", turn_id=turn)
    return await Journal.open(world, "s", turn)


def adder(runs: list[str], before_put: Callable[[], None] = lambda: None) -> Callable[..., int]:
    def add_item(item: str, context: ToolContext) -> int:
        """Add an item to the to-do list."""
        runs.append(item)
        todo = context.docs.get("todo", Todo) or Todo()
        todo.items.append(item)
        before_put()
        context.docs.put("todo", todo)
        return len(todo.items)

    return add_item


# -- no lost update ------------------------------------------------------------------------------


@pytest.mark.parametrize("replay", ["safe", "never"])
async def test_an_app_edit_after_the_turn_opened_is_seen_by_the_tool(
    world: World, replay: Replay
) -> None:
    """The issue's case: ["buy milk", "call bob"] must not become ["buy milk", "pay rent"]."""
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["buy milk"]))
    journal = await _turn(world)
    await docs.put("s", "todo", Todo(items=["buy milk", "call bob"]))  # after the turn opened
    runs: list[str] = []
    assert await journal.call(tool(adder(runs), replay=replay), {"item": "pay rent"}) == 3
    assert await docs.read("s", "todo", Todo) == (
        3,
        Todo(items=["buy milk", "call bob", "pay rent"]),
    )


async def test_an_app_edit_between_a_safe_tools_read_and_commit_reruns_it(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    journal = await _turn(world)
    runs: list[str] = []

    def app_writes_once() -> None:
        if len(runs) == 1:
            anyio.from_thread.run(docs.put, "s", "todo", Todo(items=["a", "app"]))

    add = tool(adder(runs, app_writes_once), replay="safe")
    assert await journal.call(add, {"item": "tool"}) == 3
    assert runs == ["tool", "tool"]  # run again on the new version
    assert await docs.get("s", "todo", Todo) == Todo(items=["a", "app", "tool"])
    await journal.finish("ok")
    assert journal.tool_runs == 2


async def test_a_safe_tool_that_keeps_conflicting_fails_naming_the_document(
    world: World,
) -> None:
    docs = Documents(world)
    journal = await _turn(world)
    runs: list[str] = []

    def app_always_writes() -> None:
        anyio.from_thread.run(docs.put, "s", "todo", Todo(items=[f"app{len(runs)}"]))

    with pytest.raises(ToolError, match="document 'todo' changed after this call read"):
        await journal.call(tool(adder(runs, app_always_writes), replay="safe"), {"item": "x"})
    assert len(runs) == 3
    assert await docs.get("s", "todo", Todo) == Todo(items=["app3"])


async def test_a_never_tool_is_not_rerun_and_is_told_its_edit_was_not_saved(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    journal = await _turn(world)
    runs: list[str] = []

    def app_writes() -> None:
        anyio.from_thread.run(docs.put, "s", "todo", Todo(items=["a", "app"]))

    add = tool(adder(runs, app_writes), replay="never")
    with pytest.raises(
        ToolError, match=r"add_item ran and returned 2, but what it changed was not saved"
    ) as failed:
        await journal.call(add, {"item": "refund"})
    assert "document 'todo' changed" in str(failed.value)
    assert runs == ["refund"]
    assert await docs.get("s", "todo", Todo) == Todo(items=["a", "app"])
    # Replay: recorded, never run again; the model saw the conflict.
    again = await Journal.open(world, "s", "t")
    with pytest.raises(ToolError, match="not saved"):
        await again.call(add, {"item": "refund"})
    assert runs == ["refund"]


# A worker paused inside a tool while its turn was taken over and the next turn edited the
# document saves nothing when it wakes: DocumentsContract's
# test_documents_a_stale_tool_of_an_earlier_turn_saves_nothing, run on this World too.


async def test_app_compare_and_set_and_update(world: World) -> None:
    docs = Documents(world)
    assert await docs.read("s", "todo", Todo) == (0, None)
    assert await docs.put("s", "todo", Todo(items=["a"]), expected_version=0) == 1
    with pytest.raises(DocumentConflictError) as conflict:
        await docs.put("s", "todo", Todo(items=["lost"]), expected_version=0)
    assert (conflict.value.document, conflict.value.expected, conflict.value.actual) == (
        "todo",
        0,
        1,
    )
    assert await docs.put("s", "todo", Todo(items=["a", "b"]), expected_version=1) == 2
    assert await docs.update(
        "s", "todo", Todo, lambda t: Todo(items=[*(t or Todo()).items, "c"])
    ) == (
        3,
        Todo(items=["a", "b", "c"]),
    )
    assert await docs.put("s", "todo", Todo(items=["blind"])) == 4  # no expectation: overwrite
    assert await docs.version("s", "todo") == 4


async def test_concurrent_app_updates_lose_nothing(world: World) -> None:
    docs = Documents(world)

    async def add(item: str) -> None:
        await docs.update(
            "s", "todo", Todo, lambda t: Todo(items=[*(t or Todo()).items, item]), attempts=50
        )

    async with anyio.create_task_group() as group:
        for index in range(8):
            group.start_soon(add, f"i{index}")
    version, todo = await docs.read("s", "todo", Todo)
    assert version == 8
    assert todo is not None
    assert sorted(todo.items) == [f"i{index}" for index in range(8)]


async def test_contended_app_updates_succeed_with_the_default_attempts(world: World) -> None:
    # Eight writers adding to one document at once, ten times each: conflicted writers that
    # read again at once conflicted again together, and an update gave up after its 10 tries.
    docs = Documents(world)

    def adding(item: str) -> Callable[[Todo | None], Todo]:
        return lambda todo: Todo(items=[*(todo or Todo()).items, item])

    async def add(writer: int) -> None:
        for index in range(10):
            await docs.update("s", "todo", Todo, adding(f"w{writer}-{index}"))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for writer in range(8):
                group.start_soon(add, writer)
    version, todo = await docs.read("s", "todo", Todo)
    assert version == 80
    assert todo is not None
    assert len(set(todo.items)) == 80


async def test_writers_of_one_process_never_conflict(world: World) -> None:
    # One try each: a writer of this process waits for the others instead of racing them,
    # whether it holds this Documents or another on the same World, and whatever the
    # document of the session it writes.
    def adding(item: str) -> Callable[[Todo | None], Todo]:
        return lambda todo: Todo(items=[*(todo or Todo()).items, item])

    async def add(writer: int) -> None:
        docs = Documents(world)
        for index in range(5):
            await docs.update(
                "s", f"todo{writer % 2}", Todo, adding(f"{writer}-{index}"), attempts=1
            )

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for writer in range(8):
                group.start_soon(add, writer)
    docs = Documents(world)
    for name in ("todo0", "todo1"):
        version, todo = await docs.read("s", name, Todo)
        assert version == 20
        assert todo is not None
        assert len(set(todo.items)) == 20


async def test_documents_refuse_bad_input_before_writing(world: World) -> None:
    docs = Documents(world)
    with pytest.raises(InvalidArgumentError, match="expected_version"):
        await docs.put("s", "todo", Todo(), expected_version=-1)
    with pytest.raises(InvalidArgumentError, match="pydantic model class"):
        await docs.get("s", "todo", dict)  # type: ignore[type-var]  # refusal under test
    with pytest.raises(InvalidArgumentError, match="idle_timeout"):
        async for _ in docs.watch("s", "todo", Todo, idle_timeout=0):
            pass
    with pytest.raises(InvalidArgumentError, match="blob_threshold"):
        Documents(world, blob_threshold=-1)
    assert await world.log.tail(LOG) == 0


async def test_an_async_tool_must_await_its_reads(world: World) -> None:
    journal = await _turn(world)

    async def reads_sync(context: ToolContext) -> str:
        """Read the list the sync way."""
        return repr(context.docs.get("todo", Todo))

    with pytest.raises(ToolError, match=r"await context\.docs\.read"):
        await journal.call(tool(reads_sync, replay="safe"), {})


# -- crashes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("replay", ["safe", "never"])
@pytest.mark.parametrize("when", ["before_run", "after_run"])
async def test_a_crash_around_an_editing_step_leaves_the_document_of_a_clean_run(
    tmp_path: Path, replay: Replay, when: str
) -> None:
    async def run(world: World, crash: CrashPoint | None) -> None:
        add = tool(adder([]), replay=replay, timeout=0.2)
        journal = await Journal.open(world, "s", "t", crash=crash)
        for item in ("a", "b", "c"):
            with contextlib.suppress(ToolError):  # a never call the crash interrupted
                await journal.call(add, {"item": item})
        await journal.finish("done")

    async def docs_after(crash: CrashPoint | None, folder: str) -> tuple[int, Todo | None]:
        async with open_world("local", url=str(tmp_path / folder), namespace="d") as world:
            await Client(world).submit("s", "go", turn_id="t")
            await Documents(world).put("s", "todo", Todo(items=["start"]))
            if crash is not None:
                with pytest.raises(SimulatedCrash):
                    await run(world, crash)
                if replay == "never":  # its deadline (and the clock margin) must pass
                    await anyio.sleep(1.3)
            await run(world, None)
            return await Documents(world).read("s", "todo", Todo)

    clean = await docs_after(None, "clean")
    assert clean == (4, Todo(items=["start", "a", "b", "c"]))
    # why: the crash moment is a plain str here, one of CrashPoint's two literals
    crashed = await docs_after(CrashPoint(1, when, in_process=True), "crashed")  # type: ignore[arg-type]
    if replay == "never":
        # the interrupted never call is not run again, and its edit was never committed
        assert crashed == (3, Todo(items=["start", "a", "c"]))
    else:
        assert crashed == clean


# -- reads cost the same whatever the session's length --------------------------------------------


class CallCounter:
    def __init__(self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.events = 0
        log = world.log
        for name in ("read", "get", "tail"):
            original = getattr(log, name)

            async def counted(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
                result = await __original(*args, **kwargs)
                self.calls += 1
                self.events += (
                    len(result) if isinstance(result, list) else isinstance(result, Event)
                )
                return result

            monkeypatch.setattr(log, name, counted)


async def test_a_read_costs_the_same_at_10_and_10000_events(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same document history in a session of 10 events and one of 10,000: a read makes
    the same World calls and reads the same events."""
    docs = Documents(world)
    costs: list[tuple[int, int]] = []
    for length in (10, 10_000):
        session = f"s{length}"
        await docs.put(session, "todo", Todo(items=["x"]))
        noise = [NewEvent(data=b'{"t":"noise"}')] * (length - 2)
        await world.log.append(session_log_id(session), noise)
        await docs.put(session, "todo", Todo(items=["x", "y"]))
        assert await world.log.tail(session_log_id(session)) == length
        counter = CallCounter(world, monkeypatch)
        assert await docs.get(session, "todo", Todo) == Todo(items=["x", "y"])
        costs.append((counter.calls, counter.events))
        monkeypatch.undo()
    assert costs[0] == costs[1], costs
    assert costs[0] == (4, 2), costs  # head tail, head read (base + delta), chain, next version


# -- schema versions -------------------------------------------------------------------------------


class TodoV2(BaseModel):
    schema_version: ClassVar[int] = 2
    entries: list[dict[str, Any]] = []

    @staticmethod
    def migrate(value: Any, from_version: int) -> Any:
        assert from_version == 1
        return {"entries": [{"text": item, "done": False} for item in value["items"]]}


async def test_an_older_schema_is_migrated_and_a_newer_one_refused(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    assert await docs.get("s", "todo", TodoV2) == TodoV2(entries=[{"text": "a", "done": False}])
    await docs.update("s", "todo", TodoV2, lambda t: TodoV2(entries=[*(t or TodoV2()).entries]))
    # why: the event was written just above, so get() finds it
    stored = json.loads((await world.log.get(LOG, "doc/todo/v/2")).data)  # type: ignore[union-attr]
    assert (stored["schema"], stored["base"]) == (2, 2)  # a new schema starts a new base
    with pytest.raises(
        DocumentSchemaError, match=r"'todo'.*schema version 2.*schema_version 1"
    ) as too_new:
        await docs.get("s", "todo", Todo)
    assert (too_new.value.document, too_new.value.stored, too_new.value.current) == ("todo", 2, 1)

    class NoMigrate(BaseModel):
        schema_version: ClassVar[int] = 3

    with pytest.raises(DocumentSchemaError, match="has no migrate"):
        await docs.get("s", "todo", NoMigrate)

    class BadMigrate(BaseModel):
        schema_version: ClassVar[int] = 3

        @classmethod
        def migrate(cls, value: Any, from_version: int) -> Any:
            raise KeyError("entries")

    with pytest.raises(DocumentSchemaError, match=r"BadMigrate\.migrate.*from_version=2.*KeyError"):
        await docs.get("s", "todo", BadMigrate)
    with pytest.raises(DocumentSchemaError, match="must not overwrite it"):
        await docs.put("s", "todo", Todo(items=["old code"]))  # no downgrade, not even blind
    assert await docs.version("s", "todo") == 2


async def test_a_stored_value_that_does_not_fit_the_model_is_a_schema_error(world: World) -> None:
    """A model changed without a new schema_version, or a migrate that returns what the model
    refuses: a DocumentSchemaError naming the document, its version and the fix (it was
    pydantic's bare ValidationError, naming neither document nor session)."""
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))

    class Changed(BaseModel):  # items became a count, schema_version left at 1
        items: int

    with pytest.raises(DocumentSchemaError) as changed:
        await docs.get("s", "todo", Changed)
    assert "document 'todo' of session 's' (version 1, schema version 1)" in str(changed.value)
    assert "first at items" in str(changed.value)
    assert "raise its schema_version (now 1)" in str(changed.value)
    assert (changed.value.stored, changed.value.current) == (1, 1)

    class Forgetful(BaseModel):
        schema_version: ClassVar[int] = 2
        entries: list[str]

        @staticmethod
        def migrate(value: Any, from_version: int) -> Any:
            return {"items": value["items"]}  # forgot to rename the field

    with pytest.raises(DocumentSchemaError, match=r"Forgetful\.migrate.*returned.*fix migrate"):
        await docs.update("s", "todo", Forgetful, lambda t: t or Forgetful(entries=[]))
    assert await docs.version("s", "todo") == 1  # nothing written


# -- large values, small edits --------------------------------------------------------------------


def test_diff_and_patch_round_trip() -> None:
    cases: list[tuple[Any, Any]] = [
        ({"a": 1, "b": [1, 2, 3]}, {"a": 1, "b": [1, 2, 3, 4]}),
        ({"a": 1, "b": [1, 2, 3]}, {"b": [0, 1, 3], "c": None}),
        ([{"x": 1}, {"y": 2}], [{"x": 1}, {"y": 3}]),
        ({"a": 1}, [1]),
        ([1, True], [True, 1.0]),
        ("s", "t"),
        ({"a": {"b": {"c": []}}}, {"a": {"b": {"c": [1]}}}),
    ]
    for old, new in cases:
        ops = diff(old, new)
        assert json.dumps(patch(json.loads(json.dumps(old)), ops)) == json.dumps(new), (old, new)


async def test_small_edits_of_a_large_document_append_deltas_not_the_document(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte a write stores is counted: appended to any log, written to any stream."""
    docs = Documents(world)
    written = {"bytes": 0}
    for part, method in ((world.log, "append"), (world.stream, "write")):
        original = getattr(part, method)

        async def counting(
            target: str, items: Any, *args: Any, __original: Any = original, **kwargs: Any
        ) -> Any:
            written["bytes"] += sum(len(getattr(item, "data", item)) for item in items)
            return await __original(target, items, *args, **kwargs)

        monkeypatch.setattr(part, method, counting)
    big = Todo(items=[f"item {index:05} " + "x" * 60 for index in range(3000)])
    size = len(canonical_json(big.model_dump(mode="json")))
    assert size > 200_000
    await docs.put("s", "todo", big)
    first = await world.log.read(LOG)
    assert "blob" in json.loads(first[-1].data)  # above 64 KiB: the base is a blob
    assert size < written["bytes"] < size + 2048
    sizes: list[int] = []
    for index in range(MAX_DELTAS + 2):
        written["bytes"] = 0
        big.items[index * 7] = f"edited {index}"
        await docs.put("s", "todo", big)
        sizes.append(written["bytes"])
    # a delta: a few hundred bytes, twice (the session log and the head log), no blob
    assert max(sizes[:MAX_DELTAS]) < 1024, sizes
    assert sizes[MAX_DELTAS] > 200_000  # the 17th edit since the base writes a new base
    bases = [json.loads(e.data)["base"] for e in await world.log.read(head_log_id("s", "todo"))]
    assert bases == [1] * (MAX_DELTAS + 1) + [MAX_DELTAS + 2] * 2  # then a new base
    assert await docs.get("s", "todo", Todo) == big


async def test_a_tool_edit_of_a_large_document_is_a_delta(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["y" * 100] * 1000))
    journal = await _turn(world)
    before = await world.log.tail(LOG)
    await journal.call(tool(adder([]), replay="never"), {"item": "small"})
    claims = [e for e in await world.log.read(LOG, after=before) if e.key == "doc/todo/v/2"]
    assert len(claims) == 1
    assert len(claims[0].data) < 512
    assert json.loads(claims[0].data)["patch"]


# -- watching --------------------------------------------------------------------------------------


async def test_watch_follows_live_and_resumes_from_a_version(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    await docs.put("s", "todo", Todo(items=["a", "b"]))
    seen: list[tuple[int, Todo | None]] = []

    async def follow() -> None:
        async with aclosing(docs.watch("s", "todo", Todo, after_version=1)) as changes:
            async for version, value in changes:
                seen.append((version, value))
                if version == 4:
                    return

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(follow)
            await anyio.sleep(0.1)
            await docs.put("s", "todo", Todo(items=["a", "b", "c"]))
            journal = await _turn(world)
            await journal.call(tool(adder([]), replay="safe"), {"item": "d"})
            await journal.finish("ok")  # the safe outcome is committed at once anyway
    assert seen == [
        (2, Todo(items=["a", "b"])),
        (3, Todo(items=["a", "b", "c"])),
        (4, Todo(items=["a", "b", "c", "d"])),
    ]
    # Resume from any version; idle_timeout ends a quiet watch.
    with anyio.fail_after(10):
        resumed = [
            v async for v, _ in docs.watch("s", "todo", Todo, after_version=3, idle_timeout=0.2)
        ]
    assert resumed == [4]
    # A deadline ends a watch that is waiting, cleanly.
    waited: list[int] = []
    with anyio.move_on_after(0.3) as scope:
        async for version, _ in docs.watch("s", "todo", Todo, after_version=4):
            waited.append(version)
    assert scope.cancelled_caught
    assert waited == []


# -- the head log is derived data ------------------------------------------------------------------


async def test_a_lost_head_log_is_rebuilt_from_the_session_log_across_generations(
    world: World,
) -> None:
    """A crash between a version's commit and its copy to the head log, an exported and
    imported session, or a deleted head log: the next read copies the versions over, following
    the session's generations (continue-as-new)."""
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    await docs.put("s", "todo", Todo(items=["a", "b"]))
    continuation = generation_log_id("s", 1, "test")
    marker = NewEvent(
        key=CONTINUED_KEY, data=json.dumps({"t": "continued", "to": continuation}).encode()
    )
    await world.log.append(LOG, [marker])
    assert await docs.put("s", "todo", Todo(items=["a", "b", "c"])) == 3
    assert await world.log.get(continuation, "doc/todo/v/3") is not None
    await world.log.delete(head_log_id("s", "todo"))
    assert await docs.read("s", "todo", Todo) == (3, Todo(items=["a", "b", "c"]))
    assert await world.log.tail(head_log_id("s", "todo")) == 3
    seen = [v async for v, _ in docs.watch("s", "todo", Todo, idle_timeout=0.1)]
    assert seen == [1, 2, 3]


async def test_one_call_editing_two_documents_saves_both_or_neither(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "b", Todo(items=["b0"]))
    journal = await _turn(world)
    conflict = {"on": True}

    def edit_both(context: ToolContext) -> str:
        """Edit two lists."""
        a = context.docs.get("a", Todo) or Todo()
        b = context.docs.get("b", Todo) or Todo()
        if conflict["on"]:
            anyio.from_thread.run(docs.put, "s", "b", Todo(items=["app"]))
        context.docs.put("a", Todo(items=[*a.items, "x"]))
        context.docs.put("b", Todo(items=[*b.items, "x"]))
        return "edited"

    with pytest.raises(ToolError, match="document 'b' changed"):
        await journal.call(tool(edit_both, replay="never"), {})
    assert await docs.read("s", "a", Todo) == (0, None)  # neither saved
    assert await docs.read("s", "b", Todo) == (2, Todo(items=["app"]))
    conflict["on"] = False
    assert await journal.call(tool(edit_both, replay="never"), {}) == "edited"
    assert await docs.read("s", "a", Todo) == (1, Todo(items=["x"]))
    assert await docs.read("s", "b", Todo) == (3, Todo(items=["app", "x"]))


async def test_a_tools_reads_are_repeatable_and_see_its_own_edits(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    journal = await _turn(world)
    runs: list[int] = []

    async def look(context: ToolContext) -> list[Any]:
        """Read, let the app write, read again, edit, read again."""
        runs.append(1)
        first = await context.docs.read("todo", Todo)
        if len(runs) == 1:
            await docs.put("s", "todo", Todo(items=["app"]))
        again = context.docs.get("todo", Todo)  # in the event loop: the version already read
        version = await context.docs.version("todo")
        context.docs.put("todo", Todo(items=["mine"]))
        mine = await context.docs.read("todo", Todo)
        return [first, again, version, mine]

    seen = await journal.call(tool(look, replay="safe"), {})
    assert len(runs) == 2  # the first run's edit conflicted with the app's
    app = {"items": ["app"]}
    assert seen == [app, app, 2, {"items": ["mine"]}]
    assert await docs.read("s", "todo", Todo) == (3, Todo(items=["mine"]))


async def test_a_blind_put_from_a_tool_is_based_on_the_version_at_commit(world: World) -> None:
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    journal = await _turn(world)

    def overwrite(context: ToolContext) -> str:
        """Replace the list without reading it."""
        anyio.from_thread.run(docs.put, "s", "todo", Todo(items=["app"]))
        context.docs.put("todo", Todo(items=["tool"]))
        return "done"

    assert await journal.call(tool(overwrite, replay="never"), {}) == "done"
    assert await docs.read("s", "todo", Todo) == (3, Todo(items=["tool"]))


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False, width=16)
    | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=2), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(_json, _json)
@example(0.0, -0.0)  # == holds between them, their JSON differs (found by Hypothesis in CI)
@example({"a": [-0.0, 1]}, {"a": [0.0, 1]})
def test_patch_of_diff_gives_the_new_value_for_any_json(old: Any, new: Any) -> None:
    ops = diff(old, new)
    assert canonical_json(patch(json.loads(canonical_json(old)), ops)) == canonical_json(new)
    if canonical_json(old) == canonical_json(new):
        assert ops == []


async def test_the_model_is_told_when_a_never_tools_edit_was_not_saved(world: World) -> None:
    """End to end: a Worker runs an Agent whose never tool's edit conflicts with the app's."""
    docs = Documents(world)
    await docs.put("s", "todo", Todo(items=["a"]))
    runs: list[str] = []

    def app_writes() -> None:
        anyio.from_thread.run(docs.put, "s", "todo", Todo(items=["a", "app"]))

    def policy(request: ModelRequest) -> ModelReply:
        last = request.messages[-1]
        if last["role"] == "tool":
            return ModelReply(content=f"tool said: {last['content']}")
        call = ToolCall(id="c1", name="add_item", arguments='{"item": "b"}')
        return ModelReply(tool_calls=[call])

    agent = Agent(
        model=ScriptedModel(policy), tools=[tool(adder(runs, app_writes), replay="never")]
    )
    client = Client(world)
    turn = await client.submit("s", "add b")
    await Worker(world, agent).run_once(wait=5)
    with anyio.fail_after(10):
        reply = await client.wait("s", turn, timeout=10)
    assert reply.startswith("tool said: Error: add_item ran and returned 2, but what it changed")
    assert "document 'todo' changed after this call read version 1" in reply
    assert runs == ["b"]
    assert await docs.read("s", "todo", Todo) == (2, Todo(items=["a", "app"]))
