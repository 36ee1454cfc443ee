"""JournalDeleteContract: deleting a session deletes everything it owns and nothing else.

Two sessions share bytes (the same file, the same large value): one is deleted, and every log
of the namespace (``Log.list_logs``, the SPI's listing) and every stream either session wrote
(streams are not listable: each id is asked for) is compared before and after. A deletion
that died half-way is finished by calling again; a session with an unfinished turn is refused.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel

from world_conformance._base import ContractBase
from world_conformance._support import WAIT
from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import (
    Agent,
    BlobRef,
    Client,
    Documents,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    TurnNotReadyError,
    Worker,
    Workspace,
    World,
    delete_session,
    session_blobs,
    tool,
)
from world_core.errors import NotFoundError
from world_core.journal import blob_scope, session_digest, session_log_id, turn_events_stream
from world_core.journal._continue import HistoryLimits, maybe_continue

__all__ = ["JournalDeleteContract"]

SHARED = b"the same bytes in both sessions " * 4096  # 128 KiB: a blob
"""A file both sessions hold: a blob each (a session's blobs are its own)."""


class Plan(BaseModel):
    steps: list[str]


def _echo(request: ModelRequest) -> ModelReply:
    return ModelReply(content="ok " + str(request.messages[-1]["content"])[:10])


async def _logs(world: World) -> list[str]:
    found: list[str] = []
    cursor: str | None = None
    while True:
        page = await world.log.list_logs(cursor=cursor, limit=1000)
        found.extend(info.log_id for info in page.items)
        cursor = page.next_cursor
        if cursor is None:
            return found


async def _session(world: World, session: str, turns: list[str]) -> dict[str, Any]:
    """Turns (with a large message: a blob) run by a worker (live events), a large document
    (a blob and a head log), the shared file; returns the streams it wrote."""
    client = Client(world, blob_threshold=1024)
    for turn in turns:
        await client.submit(session, f"{turn}: " + "x" * 4096, turn_id=turn)
        with anyio.fail_after(WAIT):
            result = await Worker(world, Agent(model=ScriptedModel(_echo)), crash=None).run_once(
                wait=WAIT
            )
        assert result is not None
        assert result.status == "done", result
    await Documents(world).put(session, "plan", Plan(steps=[f"{session} {n}" for n in range(9000)]))
    await Workspace(world).write(session, "notes/shared.txt", SHARED)
    blobs = session_blobs(world, session)
    index = await world.log.read(f"blobindex/{blob_scope(session)}")
    digests = [str(event.key) for event in index]
    assert len(digests) >= 3, f"message, document and file blobs are indexed: {digests}"
    streams = [turn_events_stream(session, turn) for turn in turns]
    streams += [blobs.stream_id(BlobRef(digest=d, size=0)) for d in digests]
    return {"client": client, "streams": streams}


async def _written(world: World, streams: list[str]) -> list[str]:
    return [s for s in streams if (await world.stream.info(s)).next_index > 0]


class _DiesAfter(PassThroughLog):
    """A log whose deletes fail after ``allowed`` of them: a deleter that dies half-way."""

    def __init__(self, inner: Any, allowed: int) -> None:
        super().__init__(inner)
        self.allowed = allowed

    async def delete(self, log_id: str) -> None:
        if self.allowed == 0:
            raise OSError("the deleting process died here")
        self.allowed -= 1
        await super().delete(log_id)


class _Spawner(Agent):
    """A turn with the message ``spawn <n>`` starts a child run ``spawn <n-1>`` (none for 0)
    and replies without waiting for it."""

    def __init__(self) -> None:
        super().__init__(model=ScriptedModel(_echo))

    async def run_turn(self, journal: Journal) -> str:
        n = int(journal.user_message.removeprefix("spawn "))
        if n:
            await journal.start_child(f"spawn {n - 1}")
        return await journal.finish(f"spawned {n}")


class _Sleeper(Agent):
    """Sleeps ``seconds`` (a durable timer: the turn suspends), then replies."""

    def __init__(self, seconds: float) -> None:
        super().__init__(model=ScriptedModel(_echo))
        self.seconds = seconds

    async def run_turn(self, journal: Journal) -> str:
        await journal.sleep(self.seconds)
        return await journal.finish("slept")


async def _run_turns(world: World, count: int) -> None:
    for _ in range(count):
        with anyio.fail_after(WAIT):
            result = await Worker(world, _Spawner(), crash=None).run_once(wait=WAIT)
        assert result is not None
        assert result.status == "done", result


class JournalDeleteContract(ContractBase):
    """``delete_session`` on the World under test."""

    contract_area: ClassVar[str] = "journal"

    async def test_delete_session_leaves_nothing_of_it_and_all_of_the_other(
        self, world: World
    ) -> None:
        """Logs (first, continuation, document heads, blob index), live-event streams and
        blobs of the deleted session are gone, also after a deletion that died half-way;
        the other session, which holds the same bytes, is whole and readable."""
        a = await _session(world, "a", ["a1", "a2"])
        b = await _session(world, "b", ["b1"])
        continued = await maybe_continue(world, "a", limits=HistoryLimits(max_events=1))
        assert continued is not None
        assert continued.startswith("sessiongen/")
        logs_before = await _logs(world)
        mine = [
            log_id
            for log_id in logs_before
            if log_id == "session/a" or session_digest("a") in log_id
        ]
        assert {"session/a", continued} <= set(mine), mine
        assert any(log_id.startswith("dochead/") for log_id in mine), mine
        assert any(log_id.startswith("blobindex/") for log_id in mine), mine
        assert await _written(world, a["streams"]) == a["streams"]
        assert await _written(world, b["streams"]) == b["streams"]

        dying = PassThroughWorld(world, log=_DiesAfter(world.log, allowed=1))
        with pytest.raises(OSError, match="died here"):
            await delete_session(dying, "a")
        await delete_session(world, "a")  # finishes what the dead one left
        await delete_session(world, "a")  # and again: nothing left, nothing to do

        assert await _logs(world) == [log_id for log_id in logs_before if log_id not in mine]
        assert await _written(world, a["streams"]) == []
        assert await _written(world, b["streams"]) == b["streams"]
        assert await b["client"].reply("b", "b1") == "ok b1: xxxxxx"
        assert await Workspace(world).read("b", "notes/shared.txt") == SHARED
        plan = await Documents(world).get("b", "plan", Plan)
        assert plan is not None
        assert plan.steps[-1] == "b 8999"
        assert await Documents(world).get("a", "plan", Plan) is None
        assert await a["client"].reply("a", "a1") is None

    async def test_delete_session_refuses_an_unfinished_turn_unless_forced(
        self, world: World
    ) -> None:
        """A queued turn makes the deletion refuse (naming it) and delete nothing; with
        ``force`` the session goes."""
        client = Client(world)
        await client.submit("c", "hello", turn_id="c1")
        with pytest.raises(TurnNotReadyError, match="c1") as refused:
            await delete_session(world, "c")
        assert refused.value.waiting_for == "c1"
        assert "session/c" in await _logs(world)
        await delete_session(world, "c", force=True)
        assert "session/c" not in await _logs(world)

    async def test_a_client_waiting_on_a_turn_deleted_under_it_is_told(self, world: World) -> None:
        """``Client.wait`` (with no timeout) on a turn whose session is deleted with ``force``
        while its ``never`` call runs: the call ends and its worker writes the reply into a
        new log of that id. The waiter is told the turn's end within a bounded time (the
        reply, or that the turn is gone), instead of watching the deleted log forever."""
        entered, release = anyio.Event(), anyio.Event()

        async def charge() -> str:
            """Charge the card."""
            entered.set()
            await release.wait()
            return "charged"

        def policy(request: ModelRequest) -> ModelReply:
            if any(m["role"] == "tool" for m in request.messages):
                return ModelReply(content="done")
            return ModelReply(tool_calls=[ToolCall(id="c", name="charge", arguments="{}")])

        agent = Agent(model=ScriptedModel(policy), tools=[tool(charge, replay="never")])
        client = Client(world)
        turn = await client.submit("d", "charge me")
        ended: list[str] = []

        async def waits() -> None:
            try:
                ended.append(await client.wait("d", turn, timeout=None))
            except NotFoundError as exc:
                ended.append(f"gone: {exc}")

        with anyio.fail_after(WAIT * 2):
            async with anyio.create_task_group() as group:
                group.start_soon(partial(Worker(world, agent, crash=None).run_once, wait=WAIT))
                await entered.wait()
                group.start_soon(waits)
                await anyio.sleep(0.2)  # the waiter watches the log
                await delete_session(world, "d", force=True)
                release.set()
        assert len(ended) == 1
        assert ended[0] == "done" or "was deleted" in ended[0], ended
        # A queued turn deleted under its waiter leaves no end to tell: the waiter is told so.
        queued = await client.submit("e", "never runs")
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as group:

                async def deletes() -> None:
                    await anyio.sleep(0.2)  # the waiter watches the log
                    await delete_session(world, "e", force=True)

                group.start_soon(deletes)
                with pytest.raises(NotFoundError, match="was deleted while waited for"):
                    await client.wait("e", queued, timeout=None)

    async def test_a_message_for_a_turn_deleted_under_it_runs_nothing(self, world: World) -> None:
        """A turn suspended in a timer, its session deleted with ``force``: the wake-up queued
        before the deletion comes due and is dropped (``stale``); the turn does not run again
        into the session's new log (nothing is written there), and a new turn of the session
        runs as the first."""
        client = Client(world)
        await client.submit("s", "hello", turn_id="t1")
        worker = Worker(world, _Sleeper(0.3), crash=None)
        with anyio.fail_after(WAIT):
            first = await worker.run_once(wait=WAIT)
        assert first is not None
        assert first.status == "suspended", first
        await delete_session(world, "s", force=True)
        with anyio.fail_after(WAIT):
            woken = await worker.run_once(wait=WAIT)
        assert woken is not None
        assert (woken.turn_id, woken.status) == ("t1", "stale"), woken
        assert await world.log.tail(session_log_id("s")) == 0, "the deleted turn wrote again"
        assert await client.status("s", "t1") == "unknown"
        await client.submit("s", "again", turn_id="t2")
        with anyio.fail_after(WAIT):
            again = await Worker(world, Agent(model=ScriptedModel(_echo)), crash=None).run_once(
                wait=WAIT
            )
        assert again is not None
        assert (again.turn_id, again.status) == ("t2", "done"), again

    async def test_delete_session_deletes_the_child_sessions_its_turns_started(
        self, world: World
    ) -> None:
        """A turn started a child run, which started one of its own: deleting the first
        session deletes both children's sessions too, and is refused (deleting nothing) while
        the grandchild's turn is not finished. Another session stays."""
        await Client(world).submit("p", "spawn 2", turn_id="p1")
        await _run_turns(world, 2)  # p's turn, then its child's; the grandchild's is queued
        children = [log_id for log_id in await _logs(world) if log_id.startswith("session/child-")]
        assert len(children) == 2, children
        before = await _logs(world)
        with pytest.raises(TurnNotReadyError, match="child session of 'p'") as refused:
            await delete_session(world, "p")
        assert refused.value.waiting_for == "run"
        assert await _logs(world) == before
        await _run_turns(world, 1)
        await Client(world).submit("other", "spawn 0", turn_id="o1")
        await _run_turns(world, 1)
        await delete_session(world, "p")
        assert [log_id for log_id in await _logs(world) if log_id.startswith("session/")] == [
            "session/other"
        ]
