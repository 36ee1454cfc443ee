"""Poison that an outside tester found: exceptions that are not Exceptions, crash loops, values
JSON cannot carry, keys that could collide, and a thread that never returns."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from world_core import (
    Agent,
    Client,
    Documents,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    ToolContext,
    Worker,
    World,
    idempotency_key,
    open_world,
    session_log_id,
    tool,
)
from world_core.errors import InvalidArgumentError, ToolError, TurnFailedError
from world_core.journal._client import QueueKeyKind, _check_key, turn_message, turn_queue_key
from world_core.spi import MAX_ID_BYTES

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
WAIT = 20.0


class Boom(BaseException):
    """Not an Exception: a library's own BaseException subclass."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="poison") as opened:
        yield opened


def _calling(name: str) -> ScriptedModel:
    def policy(request: ModelRequest) -> ModelReply:
        if any(m["role"] == "tool" for m in request.messages):
            return ModelReply(content="finished")
        return ModelReply(tool_calls=[ToolCall(id="c", name=name, arguments="{}")])

    return ScriptedModel(policy)


async def test_a_tool_raising_any_base_exception_fails_only_itself(world: World) -> None:
    def boom() -> str:
        """Raise a BaseException subclass."""
        raise Boom("boom")

    async def cancelled_elsewhere() -> str:
        """Await a future something else cancelled."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    client = Client(world)
    for fn in (boom, cancelled_elsewhere):
        for replay in ("safe", "never"):
            session = f"{fn.__name__}-{replay}"
            turn = await client.submit(session, "go")
            agent = Agent(model=_calling(fn.__name__), tools=[tool(fn, replay=replay)])
            with anyio.fail_after(WAIT):
                result = await Worker(world, agent, crash=None).run_once(wait=WAIT)
            assert result is not None
            assert result.status == "done", (fn.__name__, replay, result)
            outcome = await world.log.get(session_log_id(session), f"turn/{turn}/step/1/outcome")
            assert outcome is not None
            error = json.loads(outcome.data)["result"]["error"]
            assert error.split(":")[0] in ("Boom", "CancelledError"), error


async def test_an_agent_raising_a_base_exception_fails_its_turn(world: World) -> None:
    class Raising(Agent):
        async def run_turn(self, journal: Journal) -> str:
            raise Boom("agent code")

    client = Client(world)
    turn = await client.submit("s", "go")
    worker = Worker(world, Raising(model=_calling("x")), crash=None, max_attempts=1)
    with anyio.fail_after(WAIT):
        result = await worker.run_once(wait=WAIT)
    assert result is not None
    assert result.status == "failed"
    with pytest.raises(TurnFailedError, match="Boom: agent code"):
        await client.wait("s", turn, timeout=WAIT)


async def test_a_crash_loop_is_recorded_on_the_last_delivery(world: World) -> None:
    """Every run died (nothing a worker could catch): the queue's last delivery records the
    failure instead of running the turn again, so it is never dead-lettered unrecorded."""
    client = Client(world, queue="loop")
    turn = await client.submit("s", "go")
    # The message the client queued, with the queue's limit of 3 deliveries, as if two runs died.
    for lease in await world.queue.claim("loop", "w", lease=60, limit=10):
        await world.queue.ack(lease)
    await world.queue.enqueue("loop", turn_message("s", turn), max_attempts=3)
    for _ in range(2):
        (lease,) = await world.queue.claim("loop", "dead", lease=60)
        await world.queue.release(lease)
    model = ScriptedModel(lambda request: ModelReply(content="never reached"))
    with anyio.fail_after(WAIT):
        result = await Worker(world, Agent(model=model), queue="loop", crash=None).run_once(
            wait=WAIT
        )
    assert result is not None
    assert result.status == "failed"
    assert model.calls == []
    with pytest.raises(TurnFailedError) as caught:
        await client.wait("s", turn, timeout=WAIT)
    assert caught.value.error_type == "TurnCrashLoopError"
    assert caught.value.attempts == 3
    assert await world.queue.dead_letters("loop") == []


async def test_a_crash_loop_names_the_step_its_runs_died_in(world: World) -> None:
    """The first run recorded step 0 and died in step 1; so did the next: the failure the
    last delivery records names step 1, not step 0 (which finished)."""

    class DiesAfterItsFirstStep(Agent):
        async def run_turn(self, journal: Journal) -> str:
            await journal.model(self.model, ModelRequest(messages=[]))
            raise SimulatedCrash("killed in step 1")

    client = Client(world, queue="loop")
    turn = await client.submit("s", "go")
    for lease in await world.queue.claim("loop", "w", lease=60, limit=10):
        await world.queue.ack(lease)
    await world.queue.enqueue("loop", turn_message("s", turn), max_attempts=3)
    model = ScriptedModel(lambda request: ModelReply(content="paid once"))
    dying = Worker(world, DiesAfterItsFirstStep(model=model), queue="loop", lease=1, crash=None)
    with anyio.fail_after(WAIT):
        try:
            await dying.run_once(wait=WAIT)
        except* SimulatedCrash:
            pass
        (lease,) = await world.queue.claim("loop", "dead", lease=60, wait=WAIT)
        await world.queue.release(lease)
        result = await Worker(world, Agent(model=model), queue="loop", crash=None).run_once(
            wait=WAIT
        )
    assert result is not None
    assert result.status == "failed"
    assert len(model.calls) == 1
    with pytest.raises(TurnFailedError) as caught:
        await client.wait("s", turn, timeout=WAIT)
    assert caught.value.error_type == "TurnCrashLoopError"
    assert caught.value.step == 1


class Score(BaseModel):
    value: float


async def test_values_json_cannot_carry_are_refused_where_they_enter(world: World) -> None:
    outcomes: list[str] = []

    def stage_nan(context: ToolContext) -> str:
        """Stage a value with NaN."""
        try:
            context.stage("x", {"v": math.nan})
        except InvalidArgumentError as exc:
            outcomes.append(str(exc))
            raise
        return "staged"

    client = Client(world)
    turn = await client.submit("s", "go")
    journal = await Journal.open(world, "s", turn)
    with pytest.raises(ToolError, match="not JSON"):
        await journal.call(tool(stage_nan, replay="never"), {})
    assert len(outcomes) == 1
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        await Documents(world).put("s", "score", Score(value=math.inf))


def test_idempotency_keys_of_different_ids_never_collide() -> None:
    """A short id pair whose full key looks like a shortened one is shortened too."""
    victim = ("tenant-a/" + "x" * 300, "t1")
    short = idempotency_key(*victim, 3)
    prefix, _, rest = short.partition("~")
    forged_turn = prefix.removeprefix("tenant-a/") + "~" + rest.removesuffix("/step-3")
    forged = idempotency_key("tenant-a", forged_turn, 3)
    assert forged != short
    assert len(forged.encode()) <= 255
    assert idempotency_key("s", "t", 3) == "s/t/step-3"


_QUEUE_KEY_KINDS: list[tuple[QueueKeyKind, int | None]] = [
    ("turn", None),
    ("kick", 1),
    ("signal", 0),
    ("wake", 1),
    ("wake", 10),
]


def test_queue_keys_of_different_messages_never_collide() -> None:
    """Session ids may hold '/', turn ids not. The queue's key of a turn's submission, kick,
    signal wake-up or timer wake-up is its own whatever ids look like the others' keys: two
    messages that shared one, the queue would keep one of them (a turn never run, a wake-up
    lost). Digest keys (ids too long) and signal checks' keys cannot be forged by ids shaped
    like them either, and every key fits."""
    long = "s" * 505  # its turn's submission key is 512 bytes, its other keys longer
    ids = [
        ("a", "t"),
        ("a/t", "kick-1"),
        ("a/t", "signal-0"),
        ("a/t", "wake-1"),
        ("a/t", "wake-10"),
        ("a/t/wake-1", "0"),
        ("kick-1/a", "t"),
        ("turn/a", "t"),
        ("turn", "a"),
        ("a", "turn"),
        (long, "t"),
        (long + "/t", "kick-1"),
        ("é" * 256, "t" * 256),
    ]
    keys: dict[str, tuple[str, str, QueueKeyKind, int | None]] = {}
    for session, turn in ids:
        for kind, n in _QUEUE_KEY_KINDS:
            key = turn_queue_key(session, turn, kind, n)
            assert len(key.encode("utf-8")) <= MAX_ID_BYTES, key
            other = keys.setdefault(key, (session, turn, kind, n))
            assert other == (session, turn, kind, n), f"{other} and {session, turn, kind, n}"
    assert len(turn_queue_key(long, "t").encode()) == MAX_ID_BYTES
    digests = [k for k in keys if k.startswith("turn-sha256/")]
    assert len(digests) == 3 * len(_QUEUE_KEY_KINDS) - 1, digests
    for made in [*digests, _check_key("a", "sig"), _check_key("a/t", "wake-1")]:
        session, _, turn = made.rpartition("/")
        for kind, n in _QUEUE_KEY_KINDS:
            assert turn_queue_key(session, turn, kind, n) != made


def _parsed(key: str) -> tuple[str, int | None, str, str]:
    """(kind, n, session, turn) read back from a key that is not a digest."""
    tag, _, rest = key.partition("/")
    session, _, turn = rest.rpartition("/")
    kind, _, number = tag.partition("-")
    assert not number or str(int(number)) == number, f"{number!r} is not written one way"
    return kind, int(number) if number else None, session, turn


_IDS = st.text(st.sampled_from("at/-0123456789kicwenslgé"), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    _IDS,
    _IDS.map(lambda text: text.replace("/", "-")),
    st.sampled_from(_QUEUE_KEY_KINDS),
    st.integers(0, 10**6),
    st.integers(0, 480),
)
def test_a_queue_key_names_one_message(
    session: str, turn: str, kind_n: tuple[QueueKeyKind, int | None], n: int, pad: int
) -> None:
    """Every key that is not a digest reads back as the (kind, number, session, turn) it was
    made of (so no two messages share one); a longer one is the digest of that key."""
    kind, fixed = kind_n
    number = None if fixed is None else n
    session = "x" * pad + session
    key = turn_queue_key(session, turn, kind, number)
    plain = f"{kind if number is None else f'{kind}-{number}'}/{session}/{turn}"
    if len(plain.encode("utf-8")) <= MAX_ID_BYTES:
        assert key == plain
        assert _parsed(key) == (kind, number, session, turn)
    else:
        assert key == "turn-sha256/" + hashlib.sha256(plain.encode("utf-8")).hexdigest()


def test_a_worker_exits_although_a_sync_tool_never_returns(tmp_path: Path) -> None:
    """The tool's thread is abandoned at its timeout; `world worker --once` still exits."""
    folder = str(tmp_path / "world")

    async def submit() -> str:
        async with open_world("local", url=folder, namespace="poison") as opened:
            return await Client(opened).submit("s", "go")

    anyio.run(submit)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.pop("CRASH_AT", None)
    command = [sys.executable, "-m", "world_core._cli", "worker", "--once", "--json"]
    command += ["--agent", "journal_support:build_blocking", "--world", "local", "--url", folder]
    command += ["--namespace", "poison", "--wait", "5"]
    done = subprocess.run(command, env=env, capture_output=True, timeout=WAIT * 2, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert json.loads(done.stdout)["status"] == "done"
    assert b"abandoned after their timeout still running" in done.stderr


async def test_client_and_agent_arguments_are_checked(world: World) -> None:
    client = Client(world)
    for bad_timeout in (True, "5", math.nan, -1):
        with pytest.raises(InvalidArgumentError, match="timeout"):
            await client.wait("s", "t", timeout=bad_timeout)  # type: ignore[arg-type]  # wrong type under test
    for bad_turn in ("", "a/b", "x" * 300):
        with pytest.raises(InvalidArgumentError, match="turn_id"):
            await client.reply("s", bad_turn)
        with pytest.raises(InvalidArgumentError, match="turn_id"):
            await client.failure("s", bad_turn)
    for bad_calls in (2.5, True, "3", 0):
        with pytest.raises(InvalidArgumentError, match="max_model_calls"):
            Agent(model=_calling("x"), max_model_calls=bad_calls)  # type: ignore[arg-type]  # wrong type under test
    for bad_model in ("x", None, 5):
        with pytest.raises(InvalidArgumentError, match="model"):
            Agent(model=bad_model)  # type: ignore[arg-type]  # wrong type under test
