"""DocumentsContract: a session's documents never lose an edit, on every World.

A handful of fast contracts (the exhaustive cases run on the local World in
``world_core/tests/test_documents.py``): lost-update races between an app and tools and
between tools of different turns, a crash before and after a document-editing step, schema
migration and a too-new schema refused, and a watch resumed from a version.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from typing import Any, ClassVar

import anyio
import anyio.from_thread
import pytest
from pydantic import BaseModel

from world_conformance._base import ContractBase
from world_core import (
    Client,
    CrashPoint,
    Documents,
    Journal,
    SimulatedCrash,
    ToolContext,
    World,
    tool,
)
from world_core.errors import (
    DocumentConflictError,
    DocumentSchemaError,
    DuplicateKeyError,
    ToolError,
)

__all__ = ["DocumentsContract"]


class _Todo(BaseModel):
    items: list[str] = []


class _TodoV2(BaseModel):
    schema_version: ClassVar[int] = 2
    entries: list[dict[str, Any]] = []

    @staticmethod
    def migrate(value: Any, from_version: int) -> Any:
        assert from_version == 1, from_version
        return {"entries": [{"text": item, "done": False} for item in value["items"]]}


def _adder(runs: list[str], before_put: Callable[[], None] = lambda: None) -> Callable[..., int]:
    def add_item(item: str, context: ToolContext) -> int:
        """Add an item to the to-do list."""
        runs.append(item)
        todo = context.docs.get("todo", _Todo) or _Todo()
        todo.items.append(item)
        before_put()
        context.docs.put("todo", todo)
        return len(todo.items)

    return add_item


async def _open(world: World, turn: str = "t", crash: CrashPoint | None = None) -> Journal:
    await Client(world).submit("s", f"message {turn}", turn_id=turn)
    return await Journal.open(world, "s", turn, crash=crash)


class DocumentsContract(ContractBase):
    """Versioned documents: conflicts detected, never silently overwritten."""

    contract_area: ClassVar[str] = "documents"

    async def test_documents_an_app_edit_is_never_lost_to_a_tool(self, world: World) -> None:
        """An app edit made after the turn opened is what the tool reads; one made between a
        ``safe`` tool's read and its commit makes the tool run again on it; one made under a
        ``never`` tool refuses the tool's edit (it is not run again, and says so)."""
        docs = Documents(world)
        await docs.put("s", "todo", _Todo(items=["buy milk"]))
        journal = await _open(world)
        await docs.put("s", "todo", _Todo(items=["buy milk", "call bob"]))
        runs: list[str] = []
        assert await journal.call(tool(_adder(runs), replay="safe"), {"item": "pay rent"}) == 3
        assert await docs.read("s", "todo", _Todo) == (
            3,
            _Todo(items=["buy milk", "call bob", "pay rent"]),
        ), "the tool read the turn's snapshot, or overwrote the app's edit"

        def app_writes_once() -> None:
            if len(runs) == 2:
                anyio.from_thread.run(docs.put, "s", "todo", _Todo(items=["app"]))

        assert await journal.call(tool(_adder(runs, app_writes_once), replay="safe"), {"item": "s"})
        assert runs[1:] == ["s", "s"], "a safe tool whose edit conflicted was not run again"
        assert await docs.read("s", "todo", _Todo) == (5, _Todo(items=["app", "s"]))

        def app_writes() -> None:
            anyio.from_thread.run(docs.put, "s", "todo", _Todo(items=["app2"]))

        with pytest.raises(ToolError, match="not saved"):
            await journal.call(tool(_adder(runs, app_writes), replay="never"), {"item": "n"})
        assert runs[3:] == ["n"], "a never tool was run again after a conflict"
        assert await docs.read("s", "todo", _Todo) == (6, _Todo(items=["app2"]))

    async def test_documents_app_compare_and_set(self, world: World) -> None:
        """``put(expected_version=)`` saves only on that version; ``update`` retries."""
        docs = Documents(world)
        assert await docs.put("s", "todo", _Todo(items=["a"]), expected_version=0) == 1
        with pytest.raises(DocumentConflictError):
            await docs.put("s", "todo", _Todo(items=["lost"]), expected_version=0)

        async def add(item: str) -> None:
            await docs.update(
                "s",
                "todo",
                _Todo,
                lambda t: _Todo(items=[*(t or _Todo()).items, item]),
                attempts=50,
            )

        async with anyio.create_task_group() as group:
            for index in range(4):
                group.start_soon(add, f"i{index}")
        version, todo = await docs.read("s", "todo", _Todo)
        assert version == 5
        assert todo is not None
        assert sorted(todo.items) == ["a", "i0", "i1", "i2", "i3"], "an update was lost"

    async def test_documents_a_stale_tool_of_an_earlier_turn_saves_nothing(
        self, world: World
    ) -> None:
        """A worker paused inside a tool while its turn was taken over and the next turn
        edited the document saves nothing over either edit when it wakes up."""
        docs = Documents(world)
        client = Client(world)
        await client.submit("s", "first", turn_id="a")
        await client.submit("s", "second", turn_id="b")
        stale = await Journal.open(world, "s", "a")
        entered, release = anyio.Event(), anyio.Event()

        async def add_item(item: str, context: ToolContext) -> int:
            """Add an item."""
            todo = await context.docs.read("todo", _Todo) or _Todo()
            todo.items.append(item)
            if not entered.is_set():
                entered.set()
                await release.wait()
            context.docs.put("todo", todo)
            return len(todo.items)

        add = tool(add_item, replay="safe")
        refused: list[BaseException] = []

        async def paused_worker() -> None:
            try:
                await stale.call(add, {"item": "a"})
            except DuplicateKeyError as exc:
                refused.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(paused_worker)
                await entered.wait()
                takeover = await Journal.open(world, "s", "a")
                # the takeover runs step 0 again (the same arguments) and finishes the turn
                assert await takeover.call(add, {"item": "a"}) == 1
                await takeover.finish("a done")
                second = await Journal.open(world, "s", "b")
                assert await second.call(add, {"item": "b"}) == 2
                await second.finish("b done")
                release.set()
        assert len(refused) == 1, "the stale worker's commit was not refused"
        assert await docs.read("s", "todo", _Todo) == (2, _Todo(items=["a", "b"]))

    @pytest.mark.parametrize("when", ["before_run", "after_run"])
    async def test_documents_a_crash_around_an_editing_step_edits_as_a_clean_run(
        self, world: World, when: str
    ) -> None:
        """A crash before or after a ``safe`` editing step: the run that follows leaves the
        document equal to a clean run's (the step's edit is made once)."""
        docs = Documents(world)
        add = tool(_adder([]), replay="safe")

        async def run(session: str, crash: CrashPoint | None) -> None:
            journal = await Journal.open(world, session, "t", crash=crash)
            for item in ("a", "b", "c"):
                await journal.call(add, {"item": item})
            await journal.finish("done")

        results = []
        # why: the crash moment is a plain str here, one of CrashPoint's two literals
        for session, crash in (("clean", None), ("crashed", CrashPoint(1, when, in_process=True))):  # type: ignore[arg-type]
            await Client(world).submit(session, "go", turn_id="t")
            await docs.put(session, "todo", _Todo(items=["start"]))
            if crash is not None:
                with pytest.raises(SimulatedCrash):
                    await run(session, crash)
            await run(session, None)
            results.append(await docs.read(session, "todo", _Todo))
        assert results[0] == (4, _Todo(items=["start", "a", "b", "c"]))
        assert results[1] == results[0], f"crash {when} step 1"

    async def test_documents_migrate_and_a_too_new_schema_refused(self, world: World) -> None:
        """An older stored schema is migrated on read and rewritten as a new base; a stored
        schema newer than the model's is refused, naming the document and both versions."""
        docs = Documents(world)
        await docs.put("s", "todo", _Todo(items=["a"]))
        assert await docs.get("s", "todo", _TodoV2) == _TodoV2(
            entries=[{"text": "a", "done": False}]
        )
        await docs.update("s", "todo", _TodoV2, lambda t: t or _TodoV2())
        with pytest.raises(
            DocumentSchemaError, match=r"'todo'.*schema version 2.*schema_version 1"
        ):
            await docs.get("s", "todo", _Todo)

    async def test_documents_watch_follows_and_resumes(self, world: World) -> None:
        """A watch yields every version after the one given, then each new one live; a
        resumed watch starts right after the last version seen."""
        docs = Documents(world)
        await docs.put("s", "todo", _Todo(items=["a"]))
        seen: list[int] = []

        async def follow() -> None:
            async with aclosing(docs.watch("s", "todo", _Todo, after_version=0)) as changes:
                async for version, _ in changes:
                    seen.append(version)
                    if version == 3:
                        return

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(follow)
                await docs.put("s", "todo", _Todo(items=["a", "b"]))
                journal = await _open(world)
                await journal.call(tool(_adder([]), replay="safe"), {"item": "c"})
        assert seen == [1, 2, 3]
        with anyio.fail_after(30):
            resumed = [
                (version, value)
                async for version, value in docs.watch(
                    "s", "todo", _Todo, after_version=2, idle_timeout=0.5
                )
            ]
        assert resumed == [(3, _Todo(items=["a", "b", "c"]))]
