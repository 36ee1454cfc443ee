"""The journal's rules, event by event, on the local World."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_core import (
    POSSIBLY_RAN,
    Agent,
    BlobRef,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    ToolContext,
    World,
    open_world,
    session_blobs,
    session_log_id,
    tool,
    write_state,
)
from world_core.errors import (
    ConflictError,
    InvalidArgumentError,
    InvalidIdentifierError,
    NonDeterminismError,
    NotFoundError,
    PossiblyRanError,
    TurnNotReadyError,
)
from world_core.journal import _journal, blob_scope

pytestmark = pytest.mark.anyio

LOG = session_log_id("s")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="journal") as opened:
        yield opened


@pytest.fixture
async def turn(world: World) -> str:
    return await Client(world).submit("s", "hello", turn_id="t")


class Effects:
    """Side effects of the test tools, counted outside the journal."""

    def __init__(self) -> None:
        self.keys: list[str] = []


@pytest.fixture
def effects() -> Effects:
    return Effects()


def tools(effects: Effects, *, big: int = 0) -> dict[str, Any]:
    def lookup(topic: str) -> str:
        """Look up."""
        return "x" * big if big else f"note on {topic}"

    def act(text: str, context: ToolContext) -> dict[str, str]:
        """Act."""
        effects.keys.append(context.idempotency_key)
        return {"done": text, "key": context.idempotency_key}

    def fail(text: str) -> str:
        """Always fails."""
        raise RuntimeError(f"cannot {text}")

    return {
        "lookup": tool(lookup, replay="safe"),
        "act": tool(act, replay="never"),
        "fail": tool(fail, replay="never"),
    }


async def keys(world: World) -> list[str | None]:
    return [event.key for event in await world.log.read(LOG)]


@pytest.mark.parametrize("defer_safe", [True, False])
async def test_round_trips_per_step_kind(
    world: World, turn: str, effects: Effects, defer_safe: bool
) -> None:
    """Model call: its outcome, nothing before. Never tool: intent appended (committed before
    the call; pending deferred outcomes ride with it, nothing of the tool's), then the outcome.
    Safe tool and now(): nothing of their own; they ride with the next append (with
    defer_safe=False a safe tool writes its outcome at once)."""
    t = tools(effects)
    journal = await Journal.open(world, "s", turn, defer_safe=defer_safe)
    model = ScriptedModel(lambda request: ModelReply(content="hi"))
    tails = [await world.log.tail(LOG)]
    await journal.model(model, ModelRequest(messages=[{"role": "user", "content": "hello"}]))
    tails.append(await world.log.tail(LOG))
    await journal.call(t["lookup"], {"topic": "a"})
    tails.append(await world.log.tail(LOG))
    stamp = journal.now()
    tails.append(await world.log.tail(LOG))

    async def act(text: str) -> str:
        tails.append(await world.log.tail(LOG))  # inside the call: the intent is durable
        return text

    await journal.call(tool(act, replay="never"), {"text": "go"})
    tails.append(await world.log.tail(LOG))
    growth = [b - a for a, b in itertools.pairwise(tails)]
    assert growth == ([1, 0, 0, 3, 1] if defer_safe else [1, 1, 0, 2, 1])
    events = await world.log.read(LOG)
    assert [e.key for e in events][1:] == [
        "turn/t/step/0/outcome",
        "turn/t/step/1/outcome",
        "turn/t/step/2/outcome",  # now(), in the same append as ...
        "turn/t/step/3/intent",  # ... the never tool's intent
        "turn/t/step/3/outcome",
    ]
    assert json.loads(events[3].data)["result"]["output"] == stamp


async def test_a_deferred_safe_outcome_lost_to_a_crash_reruns_only_that_tool(
    world: World, turn: str, effects: Effects
) -> None:
    """Interrupted during the model call after a safe tool: neither outcome is durable (they
    share one append), so the replay runs the safe tool again and then the model, and no
    durable model outcome ever lacks the tool result it was given."""
    t = tools(effects)
    inside = anyio.Event()

    class Hanging:
        async def complete(self, request: ModelRequest) -> ModelReply:
            inside.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    request = ModelRequest(messages=[{"role": "user", "content": "hello"}])
    first = await Journal.open(world, "s", turn)
    tail = await world.log.tail(LOG)

    async def run() -> None:
        await first.call(t["lookup"], {"topic": "a"})
        await first.model(Hanging(), request)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await inside.wait()
            tg.cancel_scope.cancel()
    assert await world.log.tail(LOG) == tail
    again = await Journal.open(world, "s", turn)
    assert await again.call(t["lookup"], {"topic": "a"}) == "note on a"
    model = ScriptedModel(lambda r: ModelReply(content="ok"))
    assert (await again.model(model, request)).content == "ok"
    assert again.tool_runs == 1
    assert len(model.calls) == 1
    assert await keys(world) == ["turn/t/input", "turn/t/step/0/outcome", "turn/t/step/1/outcome"]


async def test_replay_reads_back_and_calls_nothing(
    world: World, turn: str, effects: Effects
) -> None:
    t = tools(effects)
    first = await Journal.open(world, "s", turn)
    model = ScriptedModel(lambda request: ModelReply(content="hi"))
    request = ModelRequest(messages=[{"role": "user", "content": "hello"}])
    values = [
        (await first.model(model, request)).content,
        await first.call(t["lookup"], {"topic": "a"}),
        first.now(),
        first.uuid(),
        first.random(),
        await first.call(t["act"], {"text": "go"}),
    ]
    await first.finish("bye")
    tail = await world.log.tail(LOG)
    again = await Journal.open(world, "s", turn)
    replayed = [
        (await again.model(model, request)).content,
        await again.call(t["lookup"], {"topic": "a"}),
        again.now(),
        again.uuid(),
        again.random(),
        await again.call(t["act"], {"text": "go"}),
    ]
    assert await again.finish("bye") == "bye"
    assert replayed == values
    assert len(model.calls) == 1
    assert effects.keys == ["s/t/step-5"]
    assert (again.model_calls, again.tool_runs, again.replayed) == (0, 0, 6)
    assert await world.log.tail(LOG) == tail
    assert again.recorded_reply == "bye"


def later() -> float:
    """A clock an hour ahead: every recorded deadline has passed on it."""
    return time.time() + 3600


async def interrupt_act(world: World, turn: str, args: dict[str, Any]) -> None:
    """A never tool named act whose worker dies right before the call: intent, no outcome."""

    async def act(text: str) -> str:
        raise AssertionError("the crash comes before the call")

    crash = CrashPoint(0, "before_run", in_process=True)
    journal = await Journal.open(world, "s", turn, crash=crash)
    with pytest.raises(SimulatedCrash):
        await journal.call(tool(act, replay="never"), args)


async def test_interrupted_never_tool_is_not_run_again(
    world: World, turn: str, effects: Effects
) -> None:
    t = tools(effects)
    await interrupt_act(world, turn, {"text": "go"})
    assert await keys(world) == ["turn/t/input", "turn/t/step/0/intent"]
    again = await Journal.open(world, "s", turn, clock=later)
    with pytest.raises(PossiblyRanError) as caught:
        await again.call(t["act"], {"text": "go"})
    assert caught.value.idempotency_key == "s/t/step-0"
    assert effects.keys == []
    outcome = await world.log.get(LOG, "turn/t/step/0/outcome")
    assert outcome is not None
    assert json.loads(outcome.data)["result"] == {
        "output": POSSIBLY_RAN,
        "interrupted": True,
        "key": "s/t/step-0",
    }
    # The model gets it as the tool's result.
    third = await Journal.open(world, "s", turn)
    call = ToolCall(id="c", name="act", arguments='{"text": "go"}')
    assert await third.tool(t["act"], call) == POSSIBLY_RAN


async def test_interrupted_step_relabelled_safe_runs_again(
    world: World, turn: str, effects: Effects
) -> None:
    """An intent without outcome whose tool is now labelled safe runs again (what safe means)."""
    await interrupt_act(world, turn, {"text": "go"})
    journal = await Journal.open(world, "s", turn)
    result = await journal.call(tools(effects)["act"].relabel("safe"), {"text": "go"})
    assert result == {"done": "go", "key": "s/t/step-0"}
    assert effects.keys == ["s/t/step-0"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"text": "other"}, "digest"),
        ("lookup", "name"),
        ("now", "kind"),
    ],
)
async def test_a_different_step_raises_nondeterminism(
    world: World, turn: str, effects: Effects, change: Any, field: str
) -> None:
    t = tools(effects)
    first = await Journal.open(world, "s", turn)
    await first.call(t["act"], {"text": "go"})
    tail = await world.log.tail(LOG)
    again = await Journal.open(world, "s", turn)

    async def step() -> None:
        if change == "now":
            again.now()
        elif change == "lookup":
            await again.call(t["lookup"], {"topic": "go"})
        else:
            await again.call(t["act"], change)

    with pytest.raises(NonDeterminismError) as caught:
        await step()
    error = caught.value
    assert error.position == "turn t step 0"
    assert isinstance(error.recorded, dict)
    assert isinstance(error.attempted, dict)
    assert error.recorded[field] != error.attempted[field]
    assert error.recorded["name"] == "act"
    assert "journal holds" in str(error)
    assert effects.keys == ["s/t/step-0"]
    assert await world.log.tail(LOG) == tail


async def test_going_on_past_a_recorded_reply_or_stopping_short_raises(
    world: World, turn: str, effects: Effects
) -> None:
    t = tools(effects)
    first = await Journal.open(world, "s", turn)
    await first.call(t["lookup"], {"topic": "a"})
    await first.finish("bye")
    tail = await world.log.tail(LOG)
    longer = await Journal.open(world, "s", turn)
    await longer.call(t["lookup"], {"topic": "a"})
    with pytest.raises(NonDeterminismError, match="end of turn"):
        await longer.call(t["act"], {"text": "more"})
    shorter = await Journal.open(world, "s", turn)
    with pytest.raises(NonDeterminismError, match="end of turn"):
        await shorter.finish("bye")
    other = await Journal.open(world, "s", turn)
    await other.call(t["lookup"], {"topic": "a"})
    with pytest.raises(NonDeterminismError, match="recorded the reply"):
        await other.finish("another reply")
    assert effects.keys == []
    assert await world.log.tail(LOG) == tail


async def test_tool_errors_are_outcomes_bad_arguments_take_no_step(
    world: World, turn: str, effects: Effects
) -> None:
    t = tools(effects)
    journal = await Journal.open(world, "s", turn)
    bad = ToolCall(id="c", name="act", arguments='{"txt": "go"}')
    assert (await journal.tool(t["act"], bad)).startswith("Error: invalid arguments for act")
    assert (await journal.tool(t["act"], ToolCall(id="c", name="act", arguments="[1]"))).startswith(
        "Error:"
    )
    failed = await journal.tool(t["fail"], ToolCall(id="c", name="fail", arguments='{"text":"x"}'))
    assert failed == "Error: RuntimeError: cannot x"
    with pytest.raises(InvalidArgumentError):
        await journal.call(t["act"], {"nope": 1})
    assert await keys(world) == ["turn/t/input", "turn/t/step/0/intent", "turn/t/step/0/outcome"]
    again = await Journal.open(world, "s", turn)
    replayed = await again.tool(t["fail"], ToolCall(id="c", name="fail", arguments='{"text":"x"}'))
    assert replayed == failed


async def test_large_results_go_to_blobs(world: World, turn: str, effects: Effects) -> None:
    t = tools(effects, big=200_000)
    journal = await Journal.open(world, "s", turn, blob_threshold=1024)
    value = await journal.call(t["lookup"], {"topic": "a"})
    assert value == "x" * 200_000
    await journal.finish("done")
    outcome = await world.log.get(LOG, "turn/t/step/0/outcome")
    assert outcome is not None
    assert len(outcome.data) < 1024
    blob = json.loads(outcome.data)["blob"]
    assert blob["size"] > 200_000
    assert len(blob["digest"]) == 64
    ref = BlobRef.model_validate(blob)
    info = await world.stream.info(session_blobs(world, "s").stream_id(ref))
    assert info.closed  # the session's own blob (deleted with it)
    again = await Journal.open(world, "s", turn, blob_threshold=1024)
    assert await again.call(tools(effects, big=1)["lookup"], {"topic": "a"}) == value
    assert again.tool_runs == 0
    assert await again.finish("done") == "done"


async def test_blobs_are_content_addressed_and_checked(world: World) -> None:
    from world_core import Blobs

    blobs = Blobs(world.stream, chunk_size=4)
    ref = await blobs.put(b"0123456789")
    assert ref == await blobs.put(b"0123456789")
    assert (await world.stream.info(ref.stream_id)).next_index == 3
    assert await blobs.get(ref) == b"0123456789"
    empty = await blobs.put(b"")
    assert await blobs.get(empty) == b""
    # A writer that died half-way left an open prefix: the next put completes it.
    half = BlobRef(digest=__import__("hashlib").sha256(b"abcdefgh").hexdigest(), size=8)
    await world.stream.write(half.stream_id, [b"abcd"])
    with pytest.raises(NotFoundError, match="incomplete"):
        await blobs.get(half)
    assert await blobs.put(b"abcdefgh") == half
    assert await blobs.get(half) == b"abcdefgh"
    with pytest.raises(NotFoundError, match="damaged"):
        await blobs.get(BlobRef(digest=ref.digest, size=11))


@pytest.mark.parametrize(("died", "then"), [(4, 3), (3, 5), (2, 1024), (1024, 3)])
async def test_a_put_completes_a_prefix_cut_by_another_chunk_size(
    world: World, died: int, then: int
) -> None:
    """A writer of chunk size ``died`` died after two chunks (or the whole bytes when they fit
    in fewer); a put of chunk size ``then`` completes the blob from the byte where they end.
    Continuing from the chunk count instead cut the rest at the wrong byte: the closed blob
    was damaged for good."""
    from world_core import Blobs

    data = b"the quick brown fox"
    ref = BlobRef(digest=__import__("hashlib").sha256(data).hexdigest(), size=len(data))
    left = [data[i : i + died] for i in range(0, len(data), died)][:2]
    await world.stream.write(ref.stream_id, left)
    assert await Blobs(world.stream, chunk_size=then).put(data) == ref
    assert await Blobs(world.stream).get(ref) == data
    # A stream holding other bytes under this digest is not completed: the put says so.
    other = BlobRef(digest=__import__("hashlib").sha256(b"xy" + data).hexdigest(), size=0)
    await world.stream.write(other.stream_id, [b"zz"])
    with pytest.raises(ConflictError, match="no prefix"):
        await Blobs(world.stream, chunk_size=then).put(b"xy" + data)
    assert not (await world.stream.info(other.stream_id)).closed


async def test_a_sessions_blobs_are_its_own_indexed_before_written_and_deleted_with_it(
    world: World,
) -> None:
    """A session's blob: the index append, then the stream (one more call than a shared
    blob, once); the same bytes again cost one ``info``; another session's copy is its own,
    and survives the first session's blobs being deleted; a shared blob is still read."""
    from world_conformance.wrappers import PassThroughLog, PassThroughStream, PassThroughWorld
    from world_core import Blobs

    calls: list[str] = []

    class Log(PassThroughLog):
        async def append(self, log_id: str, events: Any, **kwargs: Any) -> int:
            calls.append(f"append {log_id}")
            return await super().append(log_id, events, **kwargs)

    class Stream(PassThroughStream):
        async def info(self, stream_id: str) -> Any:
            calls.append("info")
            return await super().info(stream_id)

        async def write(self, stream_id: str, chunks: Any, **kwargs: Any) -> int:
            calls.append("write")
            return await super().write(stream_id, chunks, **kwargs)

        async def close(self, stream_id: str) -> None:
            calls.append("close")
            await super().close(stream_id)

    counted = PassThroughWorld(world, log=Log(world.log), stream=Stream(world.stream))
    mine = session_blobs(counted, "a")
    ref = await mine.put(b"shared bytes")
    assert calls == ["info", f"append blobindex/{blob_scope('a')}", "write", "close"]
    calls.clear()
    assert await mine.put(b"shared bytes") == ref
    assert calls == ["info"]
    theirs = session_blobs(world, "b")
    await theirs.put(b"shared bytes")
    assert mine.stream_id(ref) != theirs.stream_id(ref)
    old = await Blobs(world.stream).put(b"written before sessions owned blobs")
    assert await mine.get(old) == b"written before sessions owned blobs"
    assert await session_blobs(world, "a").delete_all() == 1
    with pytest.raises(NotFoundError, match="missing"):
        await mine.get(ref)
    assert await theirs.get(ref) == b"shared bytes"
    assert await Blobs(world.stream).get(old) == b"written before sessions owned blobs"
    assert await world.log.tail(f"blobindex/{blob_scope('a')}") == 0


async def test_history_is_every_turn_submitted_before(world: World) -> None:
    """A turn sees every turn submitted before it, also those that replied after it was
    submitted; it takes no step while one of them has not ended."""
    client = Client(world)
    model = ScriptedModel(lambda request: ModelReply(content=f"seen {len(request.messages)}"))
    agent = Agent(model=model, system="sys")
    await client.submit("s", "one", turn_id="a")
    await client.submit("s", "two", turn_id="b")  # submitted before "a" replied
    early = await Journal.open(world, "s", "b")
    assert early.waiting_for == "a"
    with pytest.raises(TurnNotReadyError) as caught:
        await agent.run_turn(early)
    assert caught.value.waiting_for == "a"
    assert model.calls == []
    assert await agent.run_turn(await Journal.open(world, "s", "a")) == "seen 2"
    assert await agent.run_turn(await Journal.open(world, "s", "b")) == "seen 4"
    await client.submit("s", "three", turn_id="c")
    journal = await Journal.open(world, "s", "c")
    assert journal.history == [("one", "seen 2"), ("two", "seen 4")]
    assert await agent.run_turn(journal) == "seen 6"


async def test_bad_ids_are_refused_before_any_io(world: World) -> None:
    with pytest.raises(InvalidIdentifierError):
        await Journal.open(world, "", "t")
    with pytest.raises(InvalidArgumentError, match="must not contain '/'"):
        await Journal.open(world, "s", "a/b")
    with pytest.raises(InvalidArgumentError):
        await Client(world).submit("s", "hi", turn_id="a/b")
    with pytest.raises(InvalidIdentifierError):
        await Client(world).submit("s\x00", "hi")
    assert (await world.log.list_logs()).items == []
    journal = await Journal.open(world, "s", "never-submitted")
    with pytest.raises(NotFoundError, match="submit it"):
        _ = journal.user_message


@pytest.mark.parametrize("character", ["\n", "\t", "\x7f", "\x85", "\u2028"])
async def test_a_new_turn_id_with_a_control_character_is_refused(
    world: World, character: str
) -> None:
    """A newline (or another control character) in a turn id breaks the lines of a trace and
    the keys' readability: submit and resubmit refuse it, naming ``turn_id`` and the
    character, before writing anything. It was accepted before. A turn id is only read by
    the other calls, so one stored before the rule stays readable (no error)."""
    client = Client(world)
    bad = f"a{character}b"
    with pytest.raises(InvalidArgumentError, match=f"turn_id .* U\\+{ord(character):04X}"):
        await client.submit("s", "hi", turn_id=bad)
    assert (await world.log.list_logs()).items == []
    assert await client.status("s", bad) == "unknown"
    turn = await client.submit("s", "hi")
    await (await Journal.open(world, "s", turn)).fail("down")
    with pytest.raises(InvalidArgumentError, match=r"turn_id .* control character"):
        await client.resubmit("s", turn, new_turn_id=bad)
    assert await client.status("s", bad) == "unknown"


@pytest.mark.parametrize("reopen", [False, True], ids=["same-journal", "reopened"])
async def test_a_blind_retry_of_an_interrupted_never_call_reuses_its_key(
    world: World, turn: str, effects: Effects, reopen: bool
) -> None:
    """The worker that records POSSIBLY_RAN and then runs the model's blind retry (same tool,
    same arguments) hands the retry the interrupted call's key, whether the retry runs in the
    same Journal or in a later one; other arguments get their step's own key."""
    t = tools(effects)
    await interrupt_act(world, turn, {"text": "go"})
    journal = await Journal.open(world, "s", turn, clock=later)
    with pytest.raises(PossiblyRanError):
        await journal.call(t["act"], {"text": "go"})
    if reopen:
        journal = await Journal.open(world, "s", turn, clock=later)
        with pytest.raises(PossiblyRanError):
            await journal.call(t["act"], {"text": "go"})  # replayed
    await journal.call(t["act"], {"text": "go"})
    await journal.call(t["act"], {"text": "other"})
    await journal.call(t["act"], {"text": "go"})  # after a success: a new request
    assert effects.keys == ["s/t/step-0", "s/t/step-2", "s/t/step-3"]


async def test_blob_thresholds_are_checked_before_anything_is_written(world: World) -> None:
    for bad in (-1, 8 * 1024 * 1024, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="blob_threshold"):
            Client(world, blob_threshold=bad)  # type: ignore[arg-type]  # refusal under test
        with pytest.raises(InvalidArgumentError, match="blob_threshold"):
            await Journal.open(world, "s", "t", blob_threshold=bad)  # type: ignore[arg-type]  # under test
        with pytest.raises(InvalidArgumentError, match="threshold"):
            await write_state(world, "s", "doc/x", {"a": 1}, threshold=bad)  # type: ignore[arg-type]  # under test
    assert await world.log.tail(LOG) == 0


async def test_history_turns_keeps_the_latest_turns_and_all_of_fewer(world: World) -> None:
    """``Agent(history_turns=N)``: the model sees the last N earlier turns, or all of them
    when there are fewer (15 earlier turns with N=20 are 15, not 5)."""
    client = Client(world)
    model = ScriptedModel(lambda request: ModelReply(content=f"seen {len(request.messages)}"))
    for n in range(15):
        turn = await client.submit("s", f"m{n}", turn_id=f"t{n}")
        await Agent(model=model).run_turn(await Journal.open(world, "s", turn))
    last = await client.submit("s", "last", turn_id="last")
    for window, seen in ((20, 15), (15, 15), (4, 4), (0, 0)):
        agent = Agent(model=model, history_turns=window)
        messages = agent.conversation(await Journal.open(world, "s", last, history=window))
        users = [m["content"] for m in messages if m["role"] == "user"]
        assert users == [f"m{n}" for n in range(15 - seen, 15)] + ["last"], (window, users)


async def echo(i: int) -> int:
    """Return i."""
    return i


async def test_a_never_step_reads_as_many_step_records_late_in_a_turn_as_early(
    world: World, turn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding the latest earlier call with the same arguments (whose idempotency key a retry
    reuses) looks the call up, not through every step of the turn: steps 40 to 59 read as many
    recorded steps' identities as steps 20 to 39 (counted, never timed)."""
    reads = 0
    identity = vars(_journal._Step)["identity"].fget

    def counted(self: _journal._Step) -> dict[str, object]:
        nonlocal reads
        reads += 1
        result: dict[str, object] = identity(self)
        return result

    monkeypatch.setattr(_journal._Step, "identity", property(counted))
    journal = await Journal.open(world, "s", turn)
    step = tool(echo, replay="never")
    counts = []
    for start in (0, 20, 40):
        reads = 0
        for i in range(start, start + 20):
            assert await journal.call(step, {"i": i}) == i
        counts.append(reads)
    assert counts[1] == counts[2], counts
