"""JournalHistoryContract: a turn is opened from the session's latest checkpoint, at a cost that
does not grow with the session, and sees exactly what the whole log says.

Reads are counted (events returned by the log), never timed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from world_conformance._base import ContractBase
from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import (
    Agent,
    Client,
    Event,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    World,
    session_log_id,
    write_state,
)
from world_core.journal._session import HISTORY_WINDOW, SessionView, read_session

__all__ = ["JournalHistoryContract"]


class _CountingLog(PassThroughLog):
    """Counts the events every read returns."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.events_read = 0

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        found = await super().read(log_id, after=after, limit=limit)
        self.events_read += len(found)
        return found


def _reply(request: ModelRequest) -> ModelReply:
    said = [str(m["content"]) for m in request.messages if m["role"] == "user"]
    return ModelReply(content=f"re: {said[-1]} ({len(request.messages)} messages)")


async def _turns(world: World, client: Client, count: int, *, start: int = 0) -> None:
    agent = Agent(model=ScriptedModel(_reply), history_turns=3)
    for n in range(start, start + count):
        turn = await client.submit("s", f"message {n}", turn_id=f"t{n}")
        await agent.run_turn(await Journal.open(world, "s", turn, history=3))


def _summary(view: SessionView) -> dict[str, Any]:
    unfinished = [t for t in view.in_order() if not view.finished(t)]
    return {
        "next": view.earliest_unfinished(),
        "unfinished": unfinished,
        "parks": {t: view.parks.get(t, []) for t in unfinished},
        "kicks": {t: view.kicks.get(t, 0) for t in unfinished},
        "state": view.state,
        "signals": [s.get("id") for s in view.signals],
        "waits": sorted(view.open_waits),
    }


async def _agree(world: World, what: str) -> None:
    log_id = session_log_id("s")
    checkpointed, _ = await read_session(world, log_id)
    whole, _ = await read_session(world, log_id, full=True)
    assert _summary(checkpointed) == _summary(whole), (
        f"{what}: the session read from its checkpoint differs from the whole log"
    )


class JournalHistoryContract(ContractBase):
    """Bounded reads of long sessions."""

    contract_area: ClassVar[str] = "history"

    async def test_history_opening_a_turn_costs_the_same_at_any_session_length(
        self, world: World
    ) -> None:
        """Opening a new turn with a bounded history reads as many events after 80 turns as
        after 160 (the checkpoint's neighbourhood, not the log), and far fewer than the log
        holds; its history is the last turns, as the whole log says."""
        counting = _CountingLog(world.log)
        counted = PassThroughWorld(world, log=counting)
        client = Client(world)
        reads: list[int] = []
        for total in (80, 160):
            await _turns(world, client, total - (80 if reads else 0), start=80 if reads else 0)
            turn = await client.submit("s", "next", turn_id=f"next{total}")
            counting.events_read = 0
            journal = await Journal.open(counted, "s", turn, history=3)
            reads.append(counting.events_read)
            assert journal.waiting_for is None
            assert [p.turn_id for p in journal.past_turns] == [
                f"t{n}" for n in range(total - 3, total)
            ]
            assert journal.history[-1][0] == f"message {total - 1}"
            await journal.finish("done")  # so the next round's turns come after it
        tail = await world.log.tail(session_log_id("s"))
        assert reads[1] == reads[0], f"events read to open a turn grew with the session: {reads}"
        assert reads[1] * 2 < tail, f"opening a turn read {reads[1]} of {tail} events"

    async def test_history_the_checkpoint_view_agrees_with_the_whole_log(
        self, world: World
    ) -> None:
        """After each kind of write a session gets (turns ending, turns queued and parked,
        state written from outside, signals sent and consumed, a wait left open), the view
        read from the latest checkpoint says what the whole log says."""
        client = Client(world)
        await _turns(world, client, 70)
        await _agree(world, "after 70 turns")
        await write_state(world, "s", "plan", {"step": 1})
        await client.signal("s", "go", "kept", sender="a", signal_id="kept")
        first = await client.submit("s", "waits", turn_id="w1")
        second = await client.submit("s", "queued", turn_id="w2")
        parking = await Journal.open(world, "s", second)
        assert await parking.park("message-of-w2")
        await _agree(world, "with a turn parked and a signal pending")
        waiting = await Journal.open(world, "s", first)
        assert (await waiting.wait_for_signal("go", timeout=60)) is not None  # consumes "kept"
        await _agree(world, "after the signal was consumed")
        await client.signal("s", "other", None, sender="b", signal_id="pending")
        await waiting.finish("waited")
        await _agree(world, "after the waiting turn ended")
        resumed = await Journal.open(world, "s", second)
        assert resumed.waiting_for is None
        assert resumed.history[-1] == ("waits", "waited")
        await write_state(world, "s", "plan", {"step": 2})
        await resumed.finish("ok")
        await _agree(world, "after state written from outside and another end")

    async def test_history_more_than_a_checkpoint_keeps_is_read_from_the_whole_log(
        self, world: World
    ) -> None:
        """A turn asking for all its history (more turns than a checkpoint keeps) gets every
        earlier turn, in order."""
        client = Client(world)
        total = HISTORY_WINDOW + 10
        await _turns(world, client, total)
        turn = await client.submit("s", "all of it", turn_id="last")
        journal = await Journal.open(world, "s", turn)
        assert [p.turn_id for p in journal.past_turns] == [f"t{n}" for n in range(total)]
        bounded = await Journal.open(world, "s", turn, history=HISTORY_WINDOW)
        assert _ids(bounded.past_turns) == [f"t{n}" for n in range(10, total)]


def _ids(past: Sequence[Any]) -> list[str]:
    return [p.turn_id for p in past]
