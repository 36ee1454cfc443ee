"""The journal hardening, one promise per test: each fails on the journal before it (dbea8c3).

Real local World in a temporary folder; the tools count their own side effects.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, Field

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
    Tool,
    ToolCall,
    ToolContext,
    World,
    canonical_json,
    idempotency_key,
    open_world,
    session_log_id,
    tool,
)
from world_core.errors import (
    BackendUnavailableError,
    CallInFlightError,
    InvalidArgumentError,
    LeaseLostError,
    NonDeterminismError,
    PossiblyRanError,
    ToolError,
    WorldError,
)
from world_core.journal import (
    CLOCK_MARGIN,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_TURN_ID_BYTES,
    POSSIBLY_RAN,
    read_state,
    write_state,
)
from world_core.spi import MAX_ID_BYTES, MAX_PAYLOAD_BYTES

pytestmark = pytest.mark.anyio

LOG = session_log_id("s")
WAIT = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="hardening") as opened:
        yield opened


@pytest.fixture
async def turn(world: World) -> str:
    return await Client(world).submit("s", "hello", turn_id="t")


def an_hour_ahead() -> float:
    """A clock on which every deadline recorded just now has passed."""
    return time.time() + 3600


class Charges:
    """A payment API that honours idempotency keys: one charge per key, however often asked."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, str]] = []
        self.charged: dict[str, int] = {}

    def tool(self, *, timeout: float = 60.0) -> Tool:
        def charge(amount: int, context: ToolContext) -> str:
            """Charge the customer."""
            self.requests.append((amount, context.idempotency_key))
            self.charged.setdefault(context.idempotency_key, amount)
            return context.idempotency_key

        return tool(charge, replay="never", timeout=timeout)


async def crash_before(world: World, turn: str, call: Callable[[Journal], Any], step: int) -> None:
    """Run ``call`` in a journal whose worker dies right before step ``step`` runs: the intent
    (and its deadline) is durable, the call never started."""
    journal = await Journal.open(
        world, "s", turn, crash=CrashPoint(step, "before_run", in_process=True)
    )
    with pytest.raises(SimulatedCrash):
        await call(journal)


async def keys(world: World, log_id: str = LOG) -> list[str | None]:
    return [event.key for event in await world.log.read(log_id)]


# -- arguments, results, errors -----------------------------------------------------------------


async def test_tool_arguments_are_digested_as_the_model_sent_them(world: World, turn: str) -> None:
    """A default drawn fresh on every parse (a uuid) is not part of the step's identity:
    the replay of the same call is the same step, read back, not a NonDeterminismError."""
    runs: list[str] = []

    def book(room: str, request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)) -> str:
        """Book a room."""
        runs.append(request_id)
        return request_id

    booking = tool(book, replay="never")
    call = ToolCall(id="c", name="book", arguments='{"room": "b"}')
    first = await Journal.open(world, "s", turn)
    by_call = await first.call(booking, {"room": "a"})
    by_tool = await first.tool(booking, call)
    await first.finish("booked")
    assert runs == [by_call, by_tool]
    again = await Journal.open(world, "s", turn)
    assert await again.call(booking, {"room": "a"}) == by_call
    assert await again.tool(booking, call) == by_tool
    assert await again.finish("booked") == "booked"
    assert (again.tool_runs, again.replayed) == (0, 2)
    assert len(runs) == 2


async def test_call_returns_the_value_or_raises_the_recorded_error(world: World, turn: str) -> None:
    """Journal.call: the tool's value; ToolError for a tool that raised (replayed without
    running it); PossiblyRanError, with the call's idempotency key, for an interrupted never
    call whose deadline has passed."""
    runs: list[str] = []

    def add(a: int, b: int) -> int:
        """Add."""
        runs.append("add")
        return a + b

    def refuse(reason: str) -> str:
        """Refuse."""
        runs.append("refuse")
        raise RuntimeError(f"refused: {reason}")

    charges = Charges()
    adding, refusing = tool(add, replay="safe"), tool(refuse, replay="never")
    charging = charges.tool()

    async def first_steps(journal: Journal) -> None:
        assert await journal.call(adding, {"a": 2, "b": 3}) == 5
        with pytest.raises(ToolError) as failed:
            await journal.call(refusing, {"reason": "no"})
        assert (failed.value.tool, failed.value.step) == ("refuse", 1)
        assert failed.value.error == "RuntimeError: refused: no"
        assert not isinstance(failed.value, PossiblyRanError)
        await journal.call(charging, {"amount": 5})

    await crash_before(world, turn, first_steps, step=2)
    assert runs == ["add", "refuse"]
    assert charges.requests == []
    later = await Journal.open(world, "s", turn, clock=an_hour_ahead)
    assert await later.call(adding, {"a": 2, "b": 3}) == 5
    with pytest.raises(ToolError, match="refused: no") as replayed:
        await later.call(refusing, {"reason": "no"})
    assert replayed.value.error == "RuntimeError: refused: no"
    with pytest.raises(PossiblyRanError) as interrupted:
        await later.call(charging, {"amount": 5})
    error = interrupted.value
    assert (error.tool, error.step, error.error) == ("charge", 2, POSSIBLY_RAN)
    assert error.idempotency_key == "s/t/step-2"
    assert later.replayed == 2
    assert runs == ["add", "refuse"]
    assert charges.requests == []
    # The answer is recorded: a replay raises it again, whatever the clock.
    again = await Journal.open(world, "s", turn)
    await again.call(adding, {"a": 2, "b": 3})
    with pytest.raises(ToolError):
        await again.call(refusing, {"reason": "no"})
    with pytest.raises(PossiblyRanError) as replayed_interruption:
        await again.call(charging, {"amount": 5})
    assert replayed_interruption.value.idempotency_key == "s/t/step-2"
    assert charges.requests == []


async def test_a_takeover_does_not_answer_for_a_never_call_within_its_deadline(
    world: World, turn: str
) -> None:
    """The worker that wrote the intent may be paused, not dead: until the recorded deadline
    (plus the clock margin) has passed, a takeover says when to come back and writes nothing."""
    timeout = 120.0
    charges = Charges()
    charging = charges.tool(timeout=timeout)
    before = time.time()
    await crash_before(world, turn, lambda journal: journal.call(charging, {"amount": 5}), 0)
    tail = await world.log.tail(LOG)
    journal = await Journal.open(world, "s", turn)
    with pytest.raises(CallInFlightError) as caught:
        await journal.call(charging, {"amount": 5})
    elapsed = time.time() - before
    assert caught.value.step == 0
    # The deadline was recorded after ``before``: at least timeout + margin - elapsed is left.
    assert timeout + CLOCK_MARGIN - elapsed <= caught.value.retry_after <= timeout + CLOCK_MARGIN
    assert await world.log.tail(LOG) == tail
    assert charges.requests == []


async def test_a_retry_of_an_interrupted_never_call_reuses_its_idempotency_key(
    world: World, turn: str
) -> None:
    charges = Charges()
    charging = charges.tool()
    await crash_before(world, turn, lambda journal: journal.call(charging, {"amount": 5}), 0)

    async def steps(journal: Journal) -> list[str]:
        with pytest.raises(PossiblyRanError) as interrupted:
            await journal.call(charging, {"amount": 5})
        return [
            interrupted.value.idempotency_key,
            await journal.call(charging, {"amount": 5}),  # the model retries blindly: same key
            await journal.call(charging, {"amount": 6}),  # another call: its own key
            await journal.call(charging, {"amount": 5}),  # after one that returned: a fresh key
        ]

    later = await Journal.open(world, "s", turn, clock=an_hour_ahead)
    used = await steps(later)
    assert used == ["s/t/step-0", "s/t/step-0", "s/t/step-2", "s/t/step-3"]
    assert charges.requests == [(5, "s/t/step-0"), (6, "s/t/step-2"), (5, "s/t/step-3")]
    intent = await world.log.get(LOG, "turn/t/step/1/intent")
    assert intent is not None
    assert json.loads(intent.data)["key"] == "s/t/step-0"  # recorded before the call
    again = await Journal.open(world, "s", turn)
    assert await steps(again) == used
    assert again.tool_runs == 0
    assert len(charges.requests) == 3


async def test_idempotency_keys_fit_in_255_bytes(world: World) -> None:
    session = "a" + "€" * 166  # 499 bytes: the kept start of it ends inside a character
    other = "a" + "€" * 165 + "x"  # differs only past the kept start
    turn_id = "t" * MAX_TURN_ID_BYTES
    key = idempotency_key(session, turn_id, 1234567)
    assert len(key.encode("utf-8")) <= MAX_IDEMPOTENCY_KEY_BYTES
    assert key == idempotency_key(session, turn_id, 1234567)
    others = {idempotency_key(other, turn_id, 1234567), idempotency_key(session, "u", 1234567)}
    assert len({key, *others}) == 3
    assert idempotency_key(session, turn_id, 1) != idempotency_key(session, turn_id, 2)
    # And the key a tool is given, with a 500-byte session id.
    long_session = "é" * 250
    await Client(world).submit(long_session, "hello", turn_id="t")
    charges = Charges()
    journal = await Journal.open(world, long_session, "t")
    given = await journal.call(charges.tool(), {"amount": 1})
    assert given == idempotency_key(long_session, "t", 0)
    assert len(given.encode("utf-8")) <= MAX_IDEMPOTENCY_KEY_BYTES


async def test_tool_context_tells_the_deadline_time_left_and_lease(world: World, turn: str) -> None:
    """A tool about to start an irreversible effect can check that it still may."""
    now = 1_000_000.0
    held = [True]
    seen: list[tuple[float, float, bool]] = []
    effects: list[float] = []

    def pay(needs: float, context: ToolContext) -> str:
        """Pay."""
        seen.append((context.deadline, context.time_left(), context.lease_held))
        context.check(needs=needs)
        effects.append(needs)
        return "paid"

    paying = tool(pay, replay="never", timeout=30.0)
    journal = await Journal.open(world, "s", turn, clock=lambda: now, lease_held=lambda: held[0])
    assert await journal.call(paying, {"needs": 10.0}) == "paid"
    with pytest.raises(ToolError, match=r"^pay \(step 1\) failed: TimeoutError: ") as late:
        await journal.call(paying, {"needs": 31.0})
    assert "31.0 s needed" in late.value.error
    held[0] = False
    # A refusal for the lease is not the call's outcome: the Journal stops, the call is
    # recorded as not started, and the next attempt runs it (the same key, a new intent).
    with pytest.raises(LeaseLostError, match="step 2: this worker no longer holds") as lost:
        await journal.call(paying, {"needs": 1.0})
    assert journal.lease_refusal is lost.value
    with pytest.raises(WorldError, match="open a new one"):
        await journal.call(paying, {"needs": 1.0})
    assert seen == [(now + 30.0, 30.0, True), (now + 30.0, 30.0, True), (now + 30.0, 30.0, False)]
    assert effects == [10.0]
    log_id = LOG
    assert await world.log.get(log_id, f"turn/{turn}/step/2/outcome") is None
    unstarted = await world.log.get(log_id, f"turn/{turn}/step/2/unstarted")
    assert unstarted is not None
    held[0] = True
    again = await Journal.open(world, "s", turn, clock=lambda: now, lease_held=lambda: held[0])
    assert await again.call(paying, {"needs": 10.0}) == "paid"  # step 0, read back
    with pytest.raises(ToolError, match="TimeoutError"):  # step 1, read back
        await again.call(paying, {"needs": 31.0})
    assert await again.call(paying, {"needs": 1.0}) == "paid"
    assert (again.tool_runs, effects) == (1, [10.0, 1.0])
    rerun = await world.log.get(log_id, f"turn/{turn}/step/2/intent/1")
    assert rerun is not None
    assert json.loads(rerun.data)["key"] == f"s/{turn}/step-2"
    # Outside a journal: no lease to lose, a check against the deadline only.
    context = ToolContext("s", "t", 0, deadline=now + 5.0, clock=lambda: now)
    assert context.lease_held
    context.check(needs=5.0)
    with pytest.raises(TimeoutError):
        context.check(needs=5.5)
    with pytest.raises(LeaseLostError):
        ToolContext("s", "t", 0, lease_held=lambda: False).check()


# -- timeouts and what a tool may raise ----------------------------------------------------------


@pytest.mark.parametrize("replay", ["safe", "never"])
async def test_an_async_tool_is_cancelled_at_its_timeout(
    world: World, turn: str, replay: Replay
) -> None:
    started: list[str] = []

    async def hang(label: str) -> str:
        """Never return."""
        started.append(label)
        await anyio.sleep_forever()
        return label

    hanging = tool(hang, replay=replay, timeout=0.2)
    journal = await Journal.open(world, "s", turn, defer_safe=False)
    with anyio.fail_after(WAIT), pytest.raises(ToolError) as caught:
        await journal.call(hanging, {"label": "x"})
    outcome = await world.log.get(LOG, "turn/t/step/0/outcome")
    assert outcome is not None
    result = json.loads(outcome.data)["result"]
    if replay == "safe":
        assert not isinstance(caught.value, PossiblyRanError)
        assert "did not finish within its timeout of 0.2 s" in caught.value.error
    else:
        assert isinstance(caught.value, PossiblyRanError)
        assert caught.value.idempotency_key == "s/t/step-0"
        assert result["interrupted"] is True
        assert result["timed_out"] is True
    assert result["timed_out"] is True
    assert started == ["x"]
    again = await Journal.open(world, "s", turn)
    with pytest.raises(type(caught.value)):
        await again.call(hanging, {"label": "x"})
    assert again.tool_runs == 0


async def test_a_cancelled_turn_stops_at_its_next_step_though_nothing_awaits(
    world: World, turn: str
) -> None:
    """Each step is a cancellation point: a turn cancelled (its lease lost, SIGTERM's grace
    over) while its tools never await, and whose safe outcomes wait for a later append, stops
    before the next step runs anything."""
    ran: list[int] = []
    with anyio.CancelScope() as scope:

        async def cancel_then_count(i: int) -> int:
            """Count; the first call cancels the turn. Never awaits."""
            if not ran:
                scope.cancel()
            ran.append(i)
            return i

        counting = tool(cancel_then_count, replay="safe")
        journal = await Journal.open(world, "s", turn)
        await journal.call(counting, {"i": 0})
        await journal.call(counting, {"i": 1})
    assert scope.cancelled_caught
    assert ran == [0]


async def test_a_sync_tool_outliving_its_timeout_is_abandoned_and_logged(
    world: World, turn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="world.journal")
    stuck = threading.Event()
    finished: list[str] = []

    def block(label: str) -> str:
        """Block its thread."""
        stuck.wait(WAIT)
        finished.append(label)
        return label

    def echo(label: str) -> str:
        """Echo."""
        return label

    blocking = tool(block, replay="safe", timeout=0.2)
    try:
        journal = await Journal.open(world, "s", turn)
        with anyio.fail_after(WAIT):
            with pytest.raises(ToolError, match="did not finish within its timeout"):
                await journal.call(blocking, {"label": "x"})
            # The turn goes on while the abandoned thread is still blocked.
            assert await journal.call(tool(echo, replay="safe"), {"label": "y"}) == "y"
            assert await journal.finish("done") == "done"
        assert finished == []
    finally:
        stuck.set()
    [record] = [r for r in caplog.records if r.name == "world.journal"]
    assert record.levelno == logging.WARNING
    assert "block" in record.getMessage()
    assert "abandoned" in record.getMessage()


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), True, "5", None])
def test_invalid_timeouts_are_refused_at_definition(timeout: Any) -> None:
    def lookup(topic: str) -> str:
        """Look up."""
        return topic

    with pytest.raises(InvalidArgumentError, match="timeout"):
        tool(lookup, replay="safe", timeout=timeout)


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_tool_raising_system_exit_or_keyboard_interrupt_fails_only_itself(
    world: World, turn: str, raised: type[BaseException], kind: str
) -> None:
    runs: list[str] = []

    def quit_sync(code: int) -> str:
        """Quit."""
        runs.append("quit")
        raise raised(code)

    async def quit_async(code: int) -> str:
        """Quit."""
        runs.append("quit")
        raise raised(code)

    quitting = tool(quit_sync if kind == "sync" else quit_async, replay="never", name="quit")
    journal = await Journal.open(world, "s", turn)
    with pytest.raises(ToolError) as caught:
        await journal.call(quitting, {"code": 3})
    assert caught.value.error.startswith(raised.__name__)
    assert await journal.finish("still here") == "still here"
    again = await Journal.open(world, "s", turn)
    with pytest.raises(ToolError) as replayed:
        await again.call(quitting, {"code": 3})
    assert replayed.value.error == caught.value.error
    assert runs == ["quit"]


# -- what JSON and the store can carry -----------------------------------------------------------


def test_a_failed_encoding_leaves_nothing_behind() -> None:
    """canonical_json reuses its encoders; one whose encode failed half-way still marks the
    containers it was in (its cycle check), so reusing it would call a later, valid value
    holding them circular. It is dropped instead."""
    shared: dict[str, Any] = {"n": 1, "z": object()}
    for _ in range(3):
        with pytest.raises(TypeError, match="not JSON serializable"):
            canonical_json({"a": shared})
    del shared["z"]
    assert canonical_json({"a": shared, "b": [shared]}) == b'{"a":{"n":1},"b":[{"n":1}]}'
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        canonical_json(looped)
    looped.clear()
    assert canonical_json([looped, looped]) == b"[[],[]]"


async def test_lone_surrogates_are_recorded_once_and_replayed(world: World) -> None:
    """Text that UTF-8 cannot carry (a model may send "\\ud83d" alone) is journaled losslessly:
    before, the outcome's encoding failed after the model was paid, and every retry paid
    again."""
    text = "a\ud83db"
    assert json.loads(canonical_json({"k": text})) == {"k": text}
    assert json.loads(canonical_json(text)) == text
    seen: list[str] = []

    def lookup(topic: str) -> str:
        """Look up."""
        seen.append(topic)
        return f"note on {topic}"

    def policy(request: ModelRequest) -> ModelReply:
        if any(m["role"] == "tool" for m in request.messages):
            return ModelReply(content=f"done {text}")
        call = ToolCall(id="c\ud83d", name="lookup", arguments='{"topic": "x\ud83dy"}')
        return ModelReply(content=text, tool_calls=[call])

    client = Client(world)
    turn = await client.submit("s", f"hello {text}")
    model = ScriptedModel(policy)
    agent = Agent(model=model, tools=[tool(lookup, replay="safe")])
    journal = await Journal.open(world, "s", turn)
    assert journal.user_message == f"hello {text}"
    assert await agent.run_turn(journal) == f"done {text}"
    assert len(model.calls) == 2
    assert seen == ["x\ud83dy"]
    assert await client.reply("s", turn) == f"done {text}"
    assert await client.submit("s", f"hello {text}", turn_id=turn) == turn  # same message
    replay_model = ScriptedModel(policy)
    replay = Agent(model=replay_model, tools=[tool(lookup, replay="safe")])
    assert await replay.run_turn(await Journal.open(world, "s", turn)) == f"done {text}"
    assert replay_model.calls == []
    assert seen == ["x\ud83dy"]


def _body(data: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(data)
    return body


async def test_values_above_the_blob_threshold_are_stored_as_blobs(world: World) -> None:
    """Inputs, replies and document values above the threshold go to blobs (before, only tool
    results did): the event names the blob, every reader gets the value back."""
    message, reply = "m" * 5000, "r" * 5000
    client = Client(world, blob_threshold=1024)
    first = await client.submit("s", message, turn_id="a")
    journal = await Journal.open(world, "s", first, blob_threshold=1024)
    assert journal.user_message == message

    class Notes(BaseModel):
        text: str

    def write_notes(text: str, context: ToolContext) -> int:
        """Write the notes."""
        context.docs.put("notes", Notes(text=text * 2000))
        return len(text)

    await journal.call(tool(write_notes, replay="never"), {"text": "n"})
    assert await journal.finish(reply) == reply
    events = {event.key: event for event in await world.log.read(LOG)}
    for key in ("turn/a/input", "turn/a/reply"):
        body = _body(events[key].data)
        assert set(body["blob"]) == {"digest", "size"}, key
        assert len(events[key].data) < 1024, key
    assert await client.reply("s", first) == reply
    with anyio.fail_after(WAIT):
        assert await client.wait("s", first, timeout=WAIT) == reply
    assert await Documents(world).get("s", "notes", Notes) == Notes(text="n" * 2000)
    # A later turn sees the earlier one, both sides read from their blobs.
    second = await client.submit("s", "next", turn_id="b")
    assert (await Journal.open(world, "s", second)).history == [(message, reply)]
    # Values written from outside a turn: write_state's threshold, and the documents' default.
    await write_state(world, "s", "big", {"v": "x" * 5000}, threshold=1024)
    await Documents(world).put("s", "large", Notes(text="y" * 100_000))
    outside = [event for event in await world.log.read(LOG) if event.key is None]
    assert [set(_body(event.data)) for event in outside] == [{"t", "name", "blob"}]
    large = _body(events["doc/notes/v/1"].data)
    assert "value" in large  # 2000 bytes: inline (the documents keep 64 KiB inline)
    # why: the event was written just above, so get() finds it
    assert set(_body((await world.log.get(LOG, "doc/large/v/1")).data)["blob"]) == {  # type: ignore[union-attr]
        "digest",
        "size",
    }
    assert await read_state(world, "s", "big") == {"v": "x" * 5000}
    assert await Documents(world).get("s", "large", Notes) == Notes(text="y" * 100_000)


async def test_a_12_mib_reply_is_accepted(world: World) -> None:
    """More than one World call can carry (8 MiB): stored as a blob, read back whole."""
    size = 12 * 1024 * 1024
    assert size > MAX_PAYLOAD_BYTES
    big = "r" * size
    client = Client(world)
    turn = await client.submit("s", "m" * size, turn_id="t")
    journal = await Journal.open(world, "s", turn)
    assert journal.user_message == "m" * size
    assert await journal.finish(big) == big
    assert await client.reply("s", turn) == big
    assert (await Journal.open(world, "s", turn)).recorded_reply == big


# -- identifiers and keys ------------------------------------------------------------------------


async def test_a_turn_id_over_256_bytes_is_refused_before_any_write(world: World) -> None:
    too_long = "€" * 85 + "tt"  # 257 bytes
    with pytest.raises(InvalidArgumentError, match="256"):
        await Client(world).submit("s", "hello", turn_id=too_long)
    with pytest.raises(InvalidArgumentError, match="256"):
        await Journal.open(world, "s", too_long)
    assert (await world.log.list_logs()).items == []
    assert await world.queue.claim("turns", "w", lease=5) == []


async def test_the_longest_ids_fit_every_key_of_a_never_call_that_edits_a_document(
    world: World,
) -> None:
    """A 256-byte turn id and a 128-byte document name: the tool runs and every key it needs
    afterwards fits, so no error comes after the side effect."""

    class Doc(BaseModel):
        value: int

    turn_id = "€" * 85 + "t"  # 256 bytes
    name = "d" * 128
    assert len(turn_id.encode()) == MAX_TURN_ID_BYTES
    runs: list[str] = []

    def edit(value: int, context: ToolContext) -> str:
        """Edit the document."""
        runs.append(context.idempotency_key)
        context.docs.put(name, Doc(value=value))
        return "edited"

    client = Client(world)
    await client.submit("s", "hello", turn_id=turn_id)
    journal = await Journal.open(world, "s", turn_id)
    assert await journal.call(tool(edit, replay="never"), {"value": 7}) == "edited"
    assert await journal.finish("done") == "done"
    assert len(runs) == 1
    assert len(runs[0].encode()) <= MAX_IDEMPOTENCY_KEY_BYTES
    written = [key for key in await keys(world) if key is not None]
    assert f"doc/{name}/v/1" in written
    assert max(len(key.encode()) for key in written) <= MAX_ID_BYTES
    assert await Documents(world).get("s", name, Doc) == Doc(value=7)
    assert await client.reply("s", turn_id) == "done"


async def test_submit_works_when_session_and_turn_exceed_a_dedup_key(world: World) -> None:
    session, turn_id = "s" * 400, "t" * 200  # "<session>/<turn>" is 601 bytes
    client = Client(world)
    assert await client.submit(session, "hello", turn_id=turn_id) == turn_id
    assert await client.submit(session, "hello", turn_id=turn_id) == turn_id
    leases = await world.queue.claim("turns", "w", lease=5, limit=10)
    assert len(leases) == 1  # still deduplicated
    assert json.loads(leases[0].payload) == {"session_id": session, "turn_id": turn_id}
    assert (await Journal.open(world, session, turn_id)).user_message == "hello"


# -- what a mismatch says ------------------------------------------------------------------------


async def test_a_changed_system_prompt_names_the_message_and_field(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hello")
    model = ScriptedModel(lambda request: ModelReply(content="hi"))
    await Agent(model=model, system="Be brief.").run_turn(await Journal.open(world, "s", turn))
    changed = Agent(model=model, system="Be very brief.")
    with pytest.raises(NonDeterminismError) as caught:
        await changed.run_turn(await Journal.open(world, "s", turn))
    text = str(caught.value)
    assert "message 0 (system) field 'content' differs" in text
    assert '"Be very brief."' in text
    assert len(text.splitlines()) <= 6
    recorded = caught.value.recorded
    assert isinstance(recorded, dict)
    assert text.count(recorded["preview"]) <= 1  # not two identical previews
    assert len(model.calls) == 1


# -- writes after a side effect ------------------------------------------------------------------


async def test_a_never_outcome_survives_cancellation_during_its_blob_write(
    world: World, turn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is lost (the turn's scope cancelled) while the result of a never call that
    already ran is being stored as a blob: the outcome is still recorded, so the takeover reads
    the result instead of telling the model the call may not have happened."""
    writing = anyio.Event()
    write = world.stream.write

    async def slow_write(*args: Any, **kwargs: Any) -> int:
        writing.set()
        await anyio.sleep(0.2)  # a store across a network
        return await write(*args, **kwargs)

    monkeypatch.setattr(world.stream, "write", slow_write)
    runs: list[str] = []

    def export(rows: int) -> str:
        """Export rows (once: it sends them to a partner)."""
        runs.append("sent")
        return "row\n" * rows

    exporting = tool(export, replay="never")
    journal = await Journal.open(world, "s", turn, blob_threshold=1024)
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(journal.call, exporting, {"rows": 1000})
            await writing.wait()
            tg.cancel_scope.cancel()
    assert runs == ["sent"]
    outcome = await world.log.get(LOG, "turn/t/step/0/outcome")
    assert outcome is not None
    assert "blob" in _body(outcome.data)
    later = await Journal.open(world, "s", turn, clock=an_hour_ahead)
    assert await later.call(exporting, {"rows": 1000}) == "row\n" * 1000
    assert runs == ["sent"]


async def test_a_never_outcome_blob_write_is_retried_on_a_transient_fault(
    world: World, turn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = world.stream.write
    faults = [BackendUnavailableError("store restarting")]

    async def flaky_write(*args: Any, **kwargs: Any) -> int:
        if faults:
            raise faults.pop()
        return await write(*args, **kwargs)

    monkeypatch.setattr(world.stream, "write", flaky_write)
    runs: list[str] = []

    def export(rows: int) -> str:
        """Export rows."""
        runs.append("sent")
        return "row\n" * rows

    journal = await Journal.open(world, "s", turn, blob_threshold=1024)
    with anyio.fail_after(WAIT):
        assert await journal.call(tool(export, replay="never"), {"rows": 1000}) == "row\n" * 1000
    assert faults == []
    assert runs == ["sent"]
    assert await world.log.get(LOG, "turn/t/step/0/outcome") is not None


# -- found while writing these tests -------------------------------------------------------------


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_tool_arguments_json_cannot_carry_are_an_error_for_the_model(
    world: World, turn: str, number: str
) -> None:
    """Python's parser reads NaN, Infinity and 1e999 (as inf) in a model's arguments, but no
    step can record them: the model is told, as for any arguments that are not JSON, and no
    step is taken (before: a ValueError on every delivery, until the turn failed)."""
    runs: list[float] = []

    def scale(x: float) -> float:
        """Scale."""
        runs.append(x)
        return x * 2

    scaling = tool(scale, replay="safe")
    journal = await Journal.open(world, "s", turn)
    call = ToolCall(id="c", name="scale", arguments=f'{{"x": {number}}}')
    text = await journal.tool(scaling, call)
    assert text.startswith("Error: ")
    assert "finite" in text
    assert runs == []
    assert journal.position == 0
    finite = ToolCall(id="d", name="scale", arguments='{"x": 2}')
    assert await journal.tool(scaling, finite) == "4.0"


async def test_a_never_call_staging_more_than_one_append_can_carry_keeps_its_outcome(
    world: World, turn: str
) -> None:
    """150 staged values of 60 KB: each is below the blob threshold, together they are more
    than one append may carry (8 MiB). The outcome of the call that ran must still be recorded
    (before: PayloadTooLargeError after the side effect, then 'may or may not have happened')."""
    runs: list[int] = []
    value = {"v": "x" * 60_000}

    def load(count: int, context: ToolContext) -> int:
        """Load records (once: they are sent on)."""
        runs.append(count)
        for index in range(count):
            context.stage(f"record/{index}", value)
        return count

    loading = tool(load, replay="never")
    journal = await Journal.open(world, "s", turn)
    assert await journal.call(loading, {"count": 150}) == 150
    assert await journal.finish("loaded") == "loaded"
    assert await read_state(world, "s", "record/149") == value
    later = await Journal.open(world, "s", turn, clock=an_hour_ahead)
    assert await later.call(loading, {"count": 150}) == 150
    assert runs == [150]
