"""JournalOrderContract: the turns of one session run one at a time, in submission order.

Workers here run in this process (``Worker.run`` tasks), several at once on one queue, so a
turn that started before the previous one ended would show as overlapping intervals in the
``work`` tool's record. Failure messages name the guarantee broken.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import ClassVar

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import WAIT, run_until_done
from world_core import (
    Agent,
    Client,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    Worker,
    World,
    session_log_id,
    tool,
)
from world_core.errors import ModelReplyError, TurnFailedError, TurnNotReadyError
from world_core.journal import hand_on

__all__ = ["JournalOrderContract"]

QUEUE = "q"


def _user_messages(request: ModelRequest) -> list[str]:
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


def _chat_policy(request: ModelRequest) -> ModelReply:
    """Call ``work`` once, then answer from everything the conversation holds."""
    last = request.messages[-1]
    if last["role"] == "user":
        arguments = json.dumps({"label": str(last["content"])})
        return ModelReply(tool_calls=[ToolCall(id="w", name="work", arguments=arguments)])
    said = _user_messages(request)
    if said[-1] == "What is my name?":
        named = [m for m in said[:-1] if m.startswith("My name is ")]
        answer = named[-1].removeprefix("My name is ").rstrip(".") if named else "unknown"
        return ModelReply(content=f"Your name is {answer}.")
    return ModelReply(content=f"turn {len(said)}: {said[-1]}")


class _Record:
    """When each turn's ``work`` ran (monotonic), and gates a test can hold a turn at."""

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[float, float]]] = {}
        self.gates: dict[str, anyio.Event] = {}
        self.entered: dict[str, anyio.Event] = {}

    def agent(self) -> Agent:
        async def work(label: str) -> str:
            """Do some work for the turn (held at a gate when the test asks)."""
            start = time.monotonic()
            self.entered.setdefault(label, anyio.Event()).set()
            gate = self.gates.get(label)
            if gate is not None:
                await gate.wait()
            await anyio.sleep(0.02)
            self.spans.setdefault(label, []).append((start, time.monotonic()))
            return "worked"

        return Agent(model=ScriptedModel(_chat_policy), tools=[tool(work, replay="safe")])


@asynccontextmanager
async def _workers(
    world: World, agent: Callable[[], Agent], count: int, *, lease: float = 5.0
) -> AsyncIterator[None]:
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        for index in range(count):
            worker = Worker(
                world, agent, queue=QUEUE, lease=lease, name=f"w{index}", crash=None, grace=0
            )
            tg.start_soon(partial(worker.run, stop=stop, signals=False))
        try:
            yield
        finally:
            stop.set()


def _spans_in_order(record: _Record, labels: list[str]) -> list[str]:
    """Problems with the turns' work spans: overlaps and starts out of submission order."""
    problems: list[str] = []
    spans = []
    for label in labels:
        found = record.spans.get(label, [])
        if not found:
            problems.append(f"turn {label!r} never ran its work")
            continue
        spans.append((label, found[0][0], found[-1][1]))
    for (one, _, one_end), (two, two_start, _) in itertools.pairwise(spans):
        if two_start < one_end:
            problems.append(f"turn {two!r} started before turn {one!r}, submitted earlier, ended")
    return problems


class JournalOrderContract(ContractBase):
    """Turn order in a session, on the World under test."""

    contract_area: ClassVar[str] = "order"

    async def test_order_turns_run_one_at_a_time_in_submission_order(self, world: World) -> None:
        """Six turns submitted back to back to one session, three workers: no two overlap,
        they run in submission order, and each turn's model sees every earlier turn's message
        and reply ("My name is Ada." then "What is my name?" answers "Ada")."""
        client = Client(world, queue=QUEUE)
        record = _Record()
        messages = ["My name is Ada.", "What is my name?", "three", "four", "five", "six"]
        turns = [await client.submit("s", text) for text in messages]
        async with _workers(world, record.agent, 3):
            with anyio.fail_after(WAIT * 2):
                replies = [await client.wait("s", turn, timeout=WAIT) for turn in turns]
        assert replies[1] == "Your name is Ada.", (
            f"the second turn did not see the first: it replied {replies[1]!r}"
        )
        assert replies[2:] == [f"turn {n}: {text}" for n, text in enumerate(messages, 1)][2:]
        problems = _spans_in_order(record, messages)
        assert not problems, "turns of one session overlapped or ran out of order: " + "; ".join(
            problems
        )
        journal = await Journal.open(world, "s", turns[-1])
        assert [(p.turn_id, p.reply) for p in journal.past_turns] == list(
            zip(turns[:-1], replies[:-1], strict=True)
        ), "the last turn's history is not every earlier turn with its reply"

    async def test_order_other_sessions_do_not_wait_and_no_worker_idles(self, world: World) -> None:
        """Two workers. Session A's first turn is held inside its tool; A's second turn must
        not take the other worker (it is handed on), so session B's turn finishes meanwhile.
        Released, A's first turn ends and its second runs, seeing the first."""
        client = Client(world, queue=QUEUE)
        record = _Record()
        record.gates["My name is Ada."] = anyio.Event()
        first = await client.submit("a", "My name is Ada.")
        second = await client.submit("a", "What is my name?")
        other = await client.submit("b", "hello")
        async with _workers(world, record.agent, 2):
            with anyio.fail_after(WAIT):
                await record.entered.setdefault("My name is Ada.", anyio.Event()).wait()
            try:
                reply = await client.wait("b", other, timeout=WAIT)
            except TimeoutError:
                pytest.fail(
                    "session b's turn did not finish while session a's first turn was held: "
                    "a's second turn held the other worker, or sessions wait for each other"
                )
            assert reply == "turn 1: hello"
            assert await client.status("a", second) == "queued", (
                "a's second turn ran while the first had not ended"
            )
            record.gates["My name is Ada."].set()
            with anyio.fail_after(WAIT * 2):
                assert await client.wait("a", first, timeout=WAIT) == "turn 1: My name is Ada."
                assert await client.wait("a", second, timeout=WAIT) == "Your name is Ada.", (
                    "a's second turn did not see the first"
                )
        assert not _spans_in_order(record, ["My name is Ada.", "What is my name?"])

    async def test_order_turns_behind_a_failed_turn_run_and_see_its_failure(
        self, world: World
    ) -> None:
        """The first turn fails (an unusable paid model reply: recorded at once). The turn
        queued behind it runs, and its model sees the failed turn's message with a note of
        the failure; the client of the failed turn gets TurnFailedError."""

        def policy(request: ModelRequest) -> ModelReply:
            if _user_messages(request)[-1] == "break":
                raise ModelReplyError("the reply was not JSON", raw="<html>")
            return ModelReply(content=" | ".join(str(m["content"]) for m in request.messages))

        client = Client(world, queue=QUEUE)
        broken = await client.submit("s", "break")
        after = await client.submit("s", "next")
        async with _workers(world, lambda: Agent(model=ScriptedModel(policy)), 2):
            with anyio.fail_after(WAIT * 2):
                with pytest.raises(TurnFailedError) as failed:
                    await client.wait("s", broken, timeout=WAIT)
                reply = await client.wait("s", after, timeout=WAIT)
        assert failed.value.error_type == "ModelReplyError"
        assert reply.startswith("break | (This turn did not finish: ModelReplyError"), (
            f"the turn after a failed one did not see the failure: {reply!r}"
        )
        assert reply.endswith(" | next")

    async def test_order_a_parked_message_is_not_run_and_the_turn_runs_once(
        self, world: World
    ) -> None:
        """A worker parks turn 2 (turn 1 running) and dies before acking: its message comes
        back after the lease and is acked without running; turn 1's end hands on to turn 2,
        which runs exactly once; handing on again sends nothing more."""
        client = Client(world, queue=QUEUE)
        record = _Record()
        one = await client.submit("s", "one")
        two = await client.submit("s", "two")
        leases = await world.queue.claim(QUEUE, "dead", lease=1.0, limit=2)
        assert [json.loads(lease.payload)["turn_id"] for lease in leases] == [one, two]
        journal = await Journal.open(world, "s", two)
        assert journal.waiting_for == one
        with pytest.raises(TurnNotReadyError):
            journal.now()  # a turn with an unfinished earlier one takes no step
        assert await journal.park(leases[1].message_id)  # ... and the worker died here
        worker = Worker(world, record.agent(), queue=QUEUE, lease=1.0, crash=None)
        result = await worker.process(leases[0])
        assert result.status == "done", result
        assert await hand_on(world, "s", QUEUE, after=one) is None, "a second hand-on sent again"
        statuses: list[str] = []
        with anyio.fail_after(WAIT):
            while (found := await worker.run_once(wait=3.0)) is not None:
                statuses.append(found.status)
        assert sorted(statuses) == ["done", "queued"], (
            f"turn 2's parked message and its hand-on gave {statuses}, not one run and one ack"
        )
        assert await client.reply("s", two) == "turn 2: two"
        assert len(record.spans["two"]) == 1, "turn 2 ran more than once"

    async def test_order_a_park_after_the_earlier_turn_ended_is_refused(self, world: World) -> None:
        """A park is written only if the log is as the worker read it: when the earlier turn
        ended in between, the park is refused and a fresh read finds the turn free to run. A
        resubmission of a parked turn queues nothing more."""
        client = Client(world, queue=QUEUE)
        one = await client.submit("s", "one")
        two = await client.submit("s", "two")
        stale = await Journal.open(world, "s", two)
        assert stale.waiting_for == one
        first = await Journal.open(world, "s", one)
        await first.finish("done")
        assert not await stale.park("m1"), "a park slipped in after the turn it waits for ended"
        fresh = await Journal.open(world, "s", two)
        assert fresh.waiting_for is None
        three = await client.submit("s", "three")
        parking = await Journal.open(world, "s", three)
        assert parking.waiting_for == two
        assert await parking.park("m3")
        assert await client.submit("s", "three", turn_id=three) == three
        events = await world.log.read(session_log_id("s"))
        assert [e.key for e in events if e.key and "/park/" in e.key] == [f"turn/{three}/park/1"]

    @pytest.mark.parametrize("first", ["kick", "submission"])
    async def test_order_a_kick_and_another_sessions_turn_both_run(
        self, world: World, first: str
    ) -> None:
        """Session ids may hold '/', turn ids not. Session ``a``'s turn ``u`` is parked behind
        ``t`` and sent on by a kick when ``t`` ends; session ``a/u`` has a turn named
        ``kick-1``, like that kick. Both messages live on one queue at once (``kick``: the
        kick is queued first; ``submission``: the other turn's message is queued first and
        held by a worker while the kick is sent): neither is deduplicated into the other,
        and every turn replies."""
        client = Client(world, queue=QUEUE)
        record = _Record()
        # (the lease of the claims below, from which the worker tells the store's time)
        worker = Worker(world, record.agent(), queue=QUEUE, lease=WAIT * 3, crash=None)
        held = []
        if first == "submission":
            await client.submit("a/u", "other", turn_id="kick-1")
            held = await world.queue.claim(QUEUE, "held", lease=WAIT * 3)
            assert len(held) == 1
        t = await client.submit("a", "one", turn_id="t")
        u = await client.submit("a", "two", turn_id="u")
        leases = await world.queue.claim(QUEUE, "tester", lease=WAIT * 3, limit=2)
        assert [json.loads(lease.payload)["turn_id"] for lease in leases] == [t, u]
        with anyio.fail_after(WAIT):
            parked = await worker.process(leases[1])
            assert parked.status == "queued", parked  # handed on: t has not ended
            ended = await worker.process(leases[0])
            assert ended.status == "done", ended  # ... and its end kicked u
        if first == "kick":
            await client.submit("a/u", "other", turn_id="kick-1")
        else:
            with anyio.fail_after(WAIT):
                assert (await worker.process(held[0])).status == "done"
        waiting = {("a", u), ("a/u", "kick-1")} - ({("a/u", "kick-1")} if held else set())
        await run_until_done(worker, waiting, within=WAIT * 2)
        assert await client.reply("a", u) == "turn 2: two"
        assert await client.reply("a/u", "kick-1") == "turn 1: other"
