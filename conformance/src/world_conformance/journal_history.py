"""JournalHistoryContract: a turn is opened from the session's latest checkpoint, at a cost that
does not grow with the session, and sees exactly what the whole log says.

Reads are counted (events returned by the log), never timed.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
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
    PastTurn,
    ScriptedModel,
    Worker,
    World,
    format_report,
    read_histories,
    read_state,
    replay_check,
    session_log_id,
    write_state,
)
from world_core.journal._continue import HistoryLimits
from world_core.journal._session import (
    CONTINUED_KEY,
    HISTORY_WINDOW,
    SessionView,
    read_session,
    session_chain,
)

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
    """Bounded reads of long sessions, and their continuation in fresh logs."""

    contract_area: ClassVar[str] = "history"

    async def test_history_a_long_session_continues_in_a_fresh_log(self, world: World) -> None:
        """With a limit of 40 events, a session of 30 turns continues in fresh logs: each
        old log ends with a marker naming the next; the model sees the agent's summary and
        the turns carried; the state and a signal nobody consumed yet are carried over; old
        turns' replies are still found; the client never notices."""
        client = Client(world, queue="q")
        worker = Worker(
            world,
            _Continuing(),
            queue="q",
            lease=5,
            crash=None,
            history_limits=HistoryLimits(max_events=40, max_bytes=1 << 30),
        )
        await write_state(world, "s", "plan", {"step": 1})
        await client.signal("s", "later", "kept", sender="test", signal_id="early")
        turns = []
        for n in range(30):
            turns.append(await client.submit("s", f"m{n}"))
            await _finish(worker, client, turns[-1])
        chain = await session_chain(world, "s")
        assert len(chain) >= 3, f"a session of 30 turns at 40 events a log stayed in {chain}"
        for old, new in itertools.pairwise(chain):
            marker = await world.log.get(old, CONTINUED_KEY)
            assert marker is not None
            assert json.loads(marker.data)["to"] == new
        assert await client.reply("s", turns[0]) == "re: m0 (1 messages)"
        last = await Journal.open(world, "s", turns[-1])
        assert str(last.summary).startswith("[m0.."), last.summary
        agent = worker._make_agent()
        assert isinstance(agent, Agent)
        model = agent.model
        assert isinstance(model, ScriptedModel)
        request = model.calls[-1]
        assert request.messages[0]["role"] == "system"
        assert "Summary of the conversation" in str(request.messages[0]["content"])
        assert await read_state(world, "s", "plan") == {"step": 1}, "state was not carried"
        waiting = await client.submit("s", "wait")
        await _finish(worker, client, waiting)
        assert await client.reply("s", waiting) == "got kept", "a pending signal was lost"
        # Export follows the chain, and every turn of every log replays against the agent.
        histories = await read_histories(world, "s")
        assert [h.log_id or session_log_id("s") for h in histories] == await session_chain(
            world, "s"
        )
        if importlib.util.find_spec("world_local") is None:
            return  # replay-check replays in a temporary local World, not installed here
        report = await replay_check(histories, _Continuing)
        assert report.ok, format_report(report)
        assert sum(len(s.turns) for s in report.sessions) == 31

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


class _Continuing(Agent):
    """Replies from the model; the message ``wait`` waits for the signal ``later`` instead."""

    def __init__(self) -> None:
        def summarize(previous: str | None, turns: list[PastTurn]) -> str:
            return f"{previous or ''}[{turns[0].message}..{turns[-1].message}]"

        super().__init__(model=ScriptedModel(_reply), summarize=summarize, carry_turns=2)

    async def run_turn(self, journal: Journal) -> str:
        if journal.user_message == "wait":
            signal = await journal.wait_for_signal("later", timeout=60)
            return await journal.finish(f"got {None if signal is None else signal.payload}")
        return await super().run_turn(journal)


async def _finish(worker: Worker, client: Client, turn: str) -> None:
    for _ in range(10):
        result = await worker.run_once(wait=5)
        if result is not None and result.turn_id == turn and result.status == "done":
            return
    raise AssertionError(f"turn {turn} did not finish: {await client.status('s', turn)}")


def _ids(past: Sequence[Any]) -> list[str]:
    return [p.turn_id for p in past]
