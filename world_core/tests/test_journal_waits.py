"""Signals from outside: signed webhooks, the approval commands as real processes, bad input.

The behaviour of waits on every backend is pinned by the conformance contracts (timers,
signals, versioning); these tests cover what sits on top, on the local World.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pydantic
import pytest

from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import (
    Agent,
    Client,
    Journal,
    ModelReply,
    ModelRequest,
    NewEvent,
    ScriptedModel,
    ToolCall,
    Worker,
    World,
    open_world,
    session_log_id,
    sign_signal,
    tool,
)
from world_core.errors import ConfigurationError, InvalidArgumentError, ToolError
from world_core.journal import _client
from world_core.journal._journal import CLOCK_MARGIN
from world_core.observe import list_sessions

pytestmark = pytest.mark.anyio

WAIT = 20.0
NAMESPACE = "waits"
KEY = "a-shared-secret-of-32-bytes-long"


class _Amount(pydantic.BaseModel):
    value: int


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def folder(tmp_path: Path) -> str:
    return str(tmp_path / "world")


@pytest.fixture
async def world(folder: str) -> AsyncIterator[World]:
    async with open_world("local", url=folder, namespace=NAMESPACE) as opened:
        yield opened


class _Waiter(Agent):
    def __init__(self) -> None:
        super().__init__(model=ScriptedModel(lambda request: ModelReply(content="-")))

    async def run_turn(self, journal: Journal) -> str:
        signal = await journal.wait_for_signal("paid", timeout=WAIT * 3)
        assert signal is not None
        return await journal.finish(f"{signal.payload} from {signal.sender}")


async def _finish(world: World, agent: Agent) -> list[str]:
    worker = Worker(world, agent, lease=2, crash=None)
    statuses: list[str] = []
    with anyio.fail_after(WAIT):
        while not statuses or statuses[-1] not in ("done", "failed"):
            result = await worker.run_once(wait=WAIT)
            assert result is not None, statuses
            statuses.append(result.status)
    return statuses


async def test_a_signed_webhook_wakes_the_turn_and_a_forged_one_is_refused(
    world: World,
) -> None:
    client = Client(world)
    turn = await client.submit("s", "wait for payment")
    assert (await _finish_once(world)) == "suspended"
    message = {"session": "s", "name": "paid", "id": "evt_1", "sender": "webhook:payments"}
    body = json.dumps({**message, "payload": {"amount": 30}}).encode()
    signature = sign_signal(body, key=KEY)
    assert signature.startswith("sha256=")
    before = len(await world.log.read(session_log_id("s")))
    forged = body.replace(b"30", b"3000")
    for bad_body, bad_signature, key in (
        (forged, signature, KEY),  # the body was changed after signing
        (body, signature, KEY[::-1]),  # signed with another key
        (body, "sha256=" + "0" * 64, KEY),
        (body, "", KEY),
    ):
        with pytest.raises(InvalidArgumentError, match="signature does not match") as caught:
            await client.signal_from_webhook("s", bad_body, bad_signature, key=key)
        assert KEY not in str(caught.value)
        assert KEY[::-1] not in str(caught.value)
    other = json.dumps({**message, "session": "bob", "payload": {"amount": 30}}).encode()
    with pytest.raises(InvalidArgumentError, match="is for session 'bob'"):
        await client.signal_from_webhook("s", other, sign_signal(other, key=KEY), key=KEY)
    assert len(await world.log.read(session_log_id("s"))) == before, "a refused signal wrote"
    assert await client.signal_from_webhook("s", body, signature, key=KEY) == "evt_1"
    assert await client.signal_from_webhook("s", body, signature, key=KEY) == "evt_1"  # retried
    assert await _finish(world, _Waiter()) == ["done"]
    assert await client.reply("s", turn) == "{'amount': 30} from webhook:payments"


async def _finish_once(world: World) -> str:
    result = await Worker(world, _Waiter(), lease=2, crash=None).run_once(wait=WAIT)
    assert result is not None
    return result.status


async def test_the_signal_key_comes_from_the_environment_and_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WORKFLOW_SIGNAL_KEY", raising=False)
    with pytest.raises(ConfigurationError, match=r"\(WORKFLOW_SIGNAL_KEY\) is not set"):
        sign_signal(b"{}")
    monkeypatch.setenv("WORKFLOW_SIGNAL_KEY", "short")
    with pytest.raises(ConfigurationError, match="shorter than 16 bytes") as caught:
        sign_signal(b"{}")
    assert "short" not in str(caught.value).replace("shorter", "")
    monkeypatch.setenv("WORKFLOW_SIGNAL_KEY", KEY)
    assert sign_signal(b"{}") == sign_signal(b"{}", key=KEY)


async def test_bad_waits_and_signals_are_refused_before_anything_is_written(
    world: World,
) -> None:
    client = Client(world)
    turn = await client.submit("s", "hello")
    journal = await Journal.open(world, "s", turn)
    calls: tuple[Callable[[], Awaitable[object]], ...] = (
        lambda: journal.sleep(-1),
        lambda: journal.sleep(float("nan")),
        lambda: journal.sleep_until(float("inf")),
        lambda: journal.wait_for_signal("", timeout=1),
        lambda: journal.wait_for_signal("go", timeout=float("inf")),
        lambda: journal.wait_for_signal("a\nb", timeout=1),
    )
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            await call()
    assert journal.position == 0
    with pytest.raises(InvalidArgumentError, match="sender"):
        await client.signal("s", "go", sender="")
    with pytest.raises(InvalidArgumentError, match="more than 65536"):
        await client.signal("s", "go", "x" * 70_000, sender="x")
    for reserved in ({"name": "approval/3"}, {"name": "go", "signal_id": "child/x"}):
        with pytest.raises(InvalidArgumentError, match="reserved"):
            await client.signal("s", sender="x", **reserved)
    with pytest.raises(InvalidArgumentError, match="ten years"):
        await journal.sleep(20 * 366 * 86400)
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        await client.signal("s", "go", float("nan"), sender="x")
    # What JSON carries only converted is refused, naming where it is and what to do: a set
    # (whose order is not stable across processes), bytes, a model, a date, a non-str key.
    refused: list[tuple[object, str]] = [
        ({"b", "a"}, "payload holds a set"),
        (frozenset({1}), "payload holds a frozenset"),
        (b"raw", "payload holds a bytes; .*base64"),
        (bytearray(b"raw"), "payload holds a bytearray"),
        ({"items": [1, {"tags": {"x"}}]}, r"payload\['items'\]\[1\]\['tags'\] holds a set"),
        ({1: "one"}, "a dict key 1 that is not a str"),
        (datetime.date(2026, 1, 1), "payload holds a date"),
        (_Amount(value=3), "payload holds a _Amount; .*model_dump"),
        ([float("inf")], r"payload\[0\] holds inf"),
    ]
    for payload, message in refused:
        with pytest.raises(InvalidArgumentError, match=message):
            await client.signal("s", "go", payload, sender="x")
    # A container that holds itself, and one shared so widely that its paths are past
    # counting: refused, each within the deadline. The first was walked forever (a list
    # growing each step: the call never returned), so they run in a process of their own,
    # which the deadline kills.
    checked = await anyio.to_thread.run_sync(_check_payloads_in_a_process)
    assert checked.returncode == 0, checked.stderr
    looped, shared = checked.stdout.splitlines()
    assert "payload[1]['back'] holds a container that holds itself (a circular" in looped
    assert "payload holds more than 65536 values, so more than 65536 bytes of JSON" in shared
    # JSON data goes through (a tuple is a JSON array): nothing is written by this test
    # until here, so it is the one signal in the log.
    await client.signal("s", "go", {"n": (1, 2.5, None, True, "x")}, sender="x", signal_id="ok")
    sent = await world.log.get(session_log_id("s"), "signal/ok")
    assert sent is not None
    assert json.loads(sent.data)["payload"] == {"n": [1, 2.5, None, True, "x"]}

    def act() -> None:
        """Act."""

    with pytest.raises(InvalidArgumentError, match="approval must be"):
        tool(act, replay="never", approval="maybe")  # type: ignore[call-overload]  # the wrong value is the test
    with pytest.raises(InvalidArgumentError, match="approval_timeout"):
        tool(act, replay="never", approval="required", approval_timeout=0)
    assert [e.key for e in await world.log.read(session_log_id("s"))] == [
        f"turn/{turn}/input",
        "signal/ok",
    ]


_PAYLOADS = """
from world_core.errors import InvalidArgumentError
from world_core.journal._waits import check_signal_payload
looped = [1]
looped.append({"back": looped})
shared = [0]
for _ in range(64):  # 2**64 paths: refused by size after 64 Ki values
    shared = [shared, shared]
for payload in (looped, shared):
    try:
        check_signal_payload("go", payload)
    except InvalidArgumentError as exc:
        print(exc)
"""


def _check_payloads_in_a_process() -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", _PAYLOADS]
    return subprocess.run(command, capture_output=True, text=True, timeout=WAIT, check=False)


def _refund_agent(runs: Path, approval_timeout: float = 86400.0) -> Agent:
    async def refund(amount: int) -> str:
        """Refund the customer."""
        with runs.open("a") as file:
            file.write(f"{amount}\n")
        return f"refunded {amount}"

    def policy(request: ModelRequest) -> ModelReply:
        results = [m for m in request.messages if m["role"] == "tool"]
        if results:
            return ModelReply(content=f"done: {results[-1]['content']}")
        return ModelReply(tool_calls=[ToolCall(id="c", name="refund", arguments='{"amount": 30}')])

    return Agent(
        model=ScriptedModel(policy),
        tools=[
            tool(refund, replay="never", approval="required", approval_timeout=approval_timeout)
        ],
    )


async def _waiting_for_approval(
    world: World, runs: Path, approval_timeout: float = 86400.0
) -> tuple[Client, str]:
    """A client and its turn, suspended at the refund's approval (step 1)."""
    client = Client(world)
    turn = await client.submit("s", "refund me")
    agent = _refund_agent(runs, approval_timeout)
    first = await Worker(world, agent, lease=2, crash=None).run_once(wait=WAIT)
    assert first is not None
    assert first.status == "suspended"
    return client, turn


def _world_cli(folder: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "world_core._cli", *args]
    command += ["--world", "local", "--url", folder, "--namespace", NAMESPACE]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)


async def test_world_approvals_approve_and_reject_as_commands(
    world: World, folder: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    client, turn = await _waiting_for_approval(world, runs)
    listed = await anyio.to_thread.run_sync(_world_cli, folder, "approvals", "s")
    assert listed.returncode == 0, listed.stderr
    assert f"turn {turn} step 1: refund" in listed.stdout
    assert '{"amount": 30}' in listed.stdout
    as_json = await anyio.to_thread.run_sync(_world_cli, folder, "approvals", "s", "--json")
    (pending,) = json.loads(as_json.stdout)
    assert (pending["turn_id"], pending["step"], pending["arguments"]) == (turn, 1, {"amount": 30})
    approve = ("approve", "s", turn, "1", "--by", "alice")
    done = await anyio.to_thread.run_sync(_world_cli, folder, *approve)
    assert done.returncode == 0, done.stderr
    assert "approved" in done.stdout
    again = await anyio.to_thread.run_sync(_world_cli, folder, *approve)
    assert again.returncode == 0, again.stderr  # a double tap counts once
    refused = await anyio.to_thread.run_sync(_world_cli, folder, "reject", "s", turn, "1")
    assert refused.returncode == 2
    assert "already approved by 'alice'" in refused.stderr
    missing = await anyio.to_thread.run_sync(_world_cli, folder, "approve", "s", turn, "7")
    assert missing.returncode == 2
    assert "no approval waits at step 7" in missing.stderr
    assert await _finish(world, _refund_agent(runs)) == ["done"]
    assert runs.read_text() == "30\n"
    assert await client.reply("s", turn) == "done: refunded 30"
    nothing = await anyio.to_thread.run_sync(_world_cli, folder, "approvals", "s")
    assert "no approval pending" in nothing.stdout


async def test_a_decision_repeated_after_the_turn_ended_counts_once(
    world: World, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    client, turn = await _waiting_for_approval(world, runs)
    await client.approve("s", turn, 1, by="alice")
    assert await _finish(world, _refund_agent(runs)) == ["done"]
    # A double tap that lands once the turn went on to its end: the same decision, counted
    # once (as while the turn waited), whoever repeats it and whatever reason they give.
    await client.approve("s", turn, 1, by="alice")
    await client.approve("s", turn, 1, by="bob", reason="looks fine")
    with pytest.raises(InvalidArgumentError, match="already approved by 'alice'"):
        await client.reject("s", turn, 1, by="carol")
    assert runs.read_text() == "30\n"
    assert await client.reply("s", turn) == "done: refunded 30"


class _Clock:
    """Stands for the ``time`` module of the client: ``time()`` gives ``readings`` in turn,
    then the last one again."""

    def __init__(self, *readings: float) -> None:
        self._readings = list(readings)

    def time(self) -> float:
        return self._readings.pop(0) if len(self._readings) > 1 else self._readings[0]


async def test_a_decision_at_the_cutoff_counts_as_the_client_said(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's clock decides whether a decision comes in time, once: a decision it lets
    through at the last instant that counts (its clock read later is past it: the decision
    took a moment to send) is recorded as sent then, and the worker runs the call; one it
    refuses a moment later is not written at all. (The decision's ``sent_at`` was a second
    reading: the caller was told "approved", and the worker voided it as sent too late.)"""
    runs = tmp_path / "runs"
    client, turn = await _waiting_for_approval(world, runs)
    log_id = session_log_id("s")
    intent = await world.log.get(log_id, f"turn/{turn}/step/1/intent")
    assert intent is not None
    cutoff = float(json.loads(intent.data)["deadline"]) + CLOCK_MARGIN
    before = len(await world.log.read(log_id))
    monkeypatch.setattr(_client, "time", _Clock(cutoff + 0.001))
    with pytest.raises(InvalidArgumentError, match="timed out"):
        await client.approve("s", turn, 1, by="late-alice")
    assert len(await world.log.read(log_id)) == before, "a refused decision was written"
    monkeypatch.setattr(_client, "time", _Clock(cutoff, cutoff + 0.5))
    await client.approve("s", turn, 1, by="alice")
    monkeypatch.undo()
    (decision,) = [
        json.loads(event.data)
        for event in await world.log.read(log_id)
        if (event.key or "").startswith("signal/")
    ]
    assert (decision["sender"], decision["sent_at"]) == ("alice", cutoff)
    resumed = await Worker(world, _refund_agent(runs), lease=2, crash=None).run_once(wait=WAIT)
    assert resumed is not None
    assert resumed.status == "done", "the approval the client reported was voided"
    assert runs.read_text() == "30\n"
    assert await client.reply("s", turn) == "done: refunded 30"


async def test_a_time_out_the_log_keeps_moving_under_is_tried_again_later(
    world: World, tmp_path: Path
) -> None:
    """The worker appends an approval's time-out only if the session log has not moved since
    it looked for a decision. A log that moves under each of its tries (here: a signal sent
    to the session before each append) fails the run, writing nothing; the turn is tried
    again later, and times the approval out then."""
    runs = tmp_path / "runs"
    _, turn = await _waiting_for_approval(world, runs, approval_timeout=0.2)
    others = Client(world, signal_check=3600.0)  # its checks stay out of these runs
    sent: list[str] = []

    class Log(PassThroughLog):
        async def append(
            self,
            log_id: str,
            events: Sequence[NewEvent],
            *,
            expect_tail: int | None = None,
            **kw: Any,
        ) -> int:
            if expect_tail is not None and any(
                e.key == f"turn/{turn}/step/1/outcome" for e in events
            ):
                sent.append(await others.signal("s", "noise", len(sent), sender="bystander"))
            return await super().append(log_id, events, expect_tail=expect_tail, **kw)

    hooked = PassThroughWorld(world, log=Log(world.log))
    agent = _refund_agent(runs, approval_timeout=0.2)
    worker = Worker(hooked, agent, lease=2, crash=None, retry_delay=0.1)
    failed = await worker.run_once(wait=WAIT)  # the wake-up, once the deadline passed
    assert failed is not None
    assert (failed.status, len(sent)) == ("retry", 5), failed
    assert "ConflictError" in str(failed.error)
    log_id = session_log_id("s")
    assert await world.log.get(log_id, f"turn/{turn}/step/1/outcome") is None
    assert await _finish(world, agent) == ["done"]
    assert not runs.exists(), "a call nobody approved ran"
    assert "nobody approved" in str(await Client(world).reply("s", turn))


async def test_world_signal_as_a_command(world: World, folder: str) -> None:
    client = Client(world)
    turn = await client.submit("s", "wait")
    assert await _finish_once(world) == "suspended"
    bad = await anyio.to_thread.run_sync(
        _world_cli, folder, "signal", "s", "paid", "--payload", "{nope"
    )
    assert bad.returncode == 2
    assert "--payload is not JSON" in bad.stderr
    sent = await anyio.to_thread.run_sync(
        _world_cli, folder, "signal", "s", "paid", "--payload", '"ok"', "--by", "ops", "--id", "x"
    )
    assert sent.returncode == 0, sent.stderr
    assert await _finish(world, _Waiter()) == ["done"]
    assert await client.reply("s", turn) == "ok from ops"
    # A mistyped session is refused: it made a session holding only the signal (exit 0).
    typo = await anyio.to_thread.run_sync(_world_cli, folder, "signal", "s-typo", "paid")
    assert typo.returncode == 2
    assert "session 's-typo' has no events" in typo.stderr
    assert await world.log.tail(session_log_id("s-typo")) == 0
    listed = (await world.log.list_logs(prefix="session/")).items
    assert [info.log_id for info in listed] == [session_log_id("s")]


async def test_a_signal_to_a_turn_that_is_over_is_refused(world: World) -> None:
    """Addressed to a turn that has its reply (or failure), a signal would wait in the log
    for a wait that never comes: refused, naming the turn, and nothing written."""
    client = Client(world)
    turn = await client.submit("s", "wait")
    assert await _finish_once(world) == "suspended"
    await client.signal("s", "paid", "ok", sender="ops", signal_id="p1", turn_id=turn)
    assert await _finish(world, _Waiter()) == ["done"]
    assert await client.reply("s", turn) == "ok from ops"
    tail = await world.log.tail(session_log_id("s"))
    # The same signal again (a webhook's retry) still counts once, without an error.
    await client.signal("s", "paid", "ok", sender="ops", signal_id="p1", turn_id=turn)
    with pytest.raises(InvalidArgumentError, match=f"turn {turn!r} of session 's' is over"):
        await client.signal("s", "paid", "late", sender="ops", turn_id=turn)
    assert await world.log.tail(session_log_id("s")) == tail
    # To the session (no turn) it is kept for the next wait of its name, as promised.
    await client.signal("s", "paid", "next", sender="ops")
    assert await world.log.tail(session_log_id("s")) == tail + 1


class _Swallower(Agent):
    """Catches everything around a wait (what agent code must not do)."""

    def __init__(self) -> None:
        super().__init__(model=ScriptedModel(lambda request: ModelReply(content="-")))

    async def run_turn(self, journal: Journal) -> str:
        with contextlib.suppress(BaseException):  # the mistake under test
            await journal.sleep(30)
        return await journal.finish("went on")


async def test_agent_code_that_swallows_the_suspension_is_told_so(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hello")
    result = await Worker(world, _Swallower(), lease=2, crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "failed"
    failure = await client.failure("s", turn)
    assert failure is not None
    assert "let TurnSuspended propagate" in failure.error


async def test_a_wait_inside_a_tool_is_refused_with_the_reason(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hello")
    journal = await Journal.open(world, "s", turn)

    async def nested() -> str:
        """A tool that (wrongly) waits through the journal."""
        await journal.sleep(1)
        return "slept"

    with pytest.raises(ToolError, match="inside the call of tool 'nested'"):
        await journal.call(tool(nested, replay="safe"), {})


async def test_resubmit_refuses_a_turn_that_has_not_finished(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "wait for payment")
    assert await _finish_once(world) == "suspended"
    with pytest.raises(InvalidArgumentError, match="is waiting, not finished"):
        await client.resubmit("s", turn)


class _TimesOut(Agent):
    """Waits a second for a signal nobody sends; replies with what the wait got."""

    def __init__(self) -> None:
        super().__init__(model=ScriptedModel(lambda request: ModelReply(content="-")))

    async def run_turn(self, journal: Journal) -> str:
        signal = await journal.wait_for_signal("go", timeout=1.0)
        return await journal.finish("timed out" if signal is None else "signalled")


async def test_a_signals_check_never_takes_a_turns_wake_up_key(world: World) -> None:
    """A signal's check is queued under a key no message of a turn has: with the key
    ``<session>/signal-check/<signal>``, the check of signal ``wake-0`` (queued first, its
    delay still running) swallowed the deadline wake-up of the turn named ``signal-check``
    waiting at step 0, ``<session>/signal-check/wake-0``: the turn waited forever."""
    client = Client(world, signal_check=WAIT * 3)  # still queued while the turn waits
    await client.signal("s", "unrelated", 1, sender="bob", signal_id="wake-0")
    turn = await client.submit("s", "hi", turn_id="signal-check")
    worker = Worker(world, _TimesOut(), lease=2, crash=None)
    with anyio.fail_after(WAIT):
        first = await worker.run_once(wait=WAIT)
    assert first is not None
    assert first.status == "suspended", first
    with anyio.fail_after(WAIT):
        woken = await worker.run_once(wait=WAIT / 2)  # the wake-up is due after 1 s
    assert woken is not None, "the turn's deadline wake-up never came"
    assert woken.status == "done", woken
    assert await client.reply("s", turn) == "timed out"


class _LooksTwice(Agent):
    """Starts a child run, waits for it, then waits for it again (a second look)."""

    def __init__(self) -> None:
        super().__init__(model=ScriptedModel(lambda request: ModelReply(content="-")))

    async def run_turn(self, journal: Journal) -> str:
        if journal.parent is not None:
            return await journal.finish(f"child read {journal.user_message!r}")
        child = await journal.start_child("the report")
        first = await journal.wait_child(child, timeout=WAIT * 3)
        again = await journal.wait_child(child, timeout=WAIT * 3)
        return await journal.finish(f"{first and first.reply} / {again and again.reply}")


async def test_waiting_again_for_a_child_that_ended_gets_its_end(world: World) -> None:
    """A child's end is signalled once and the first wait consumes it; a second wait for the
    same child gets the same end at once. Before, it waited out its whole timeout for a
    signal that would never come and returned None, as if the child had not ended."""
    client = Client(world)
    turn = await client.submit("parent", "fetch the report")
    worker = Worker(world, _LooksTwice(), lease=2, crash=None)
    statuses: list[str] = []
    with anyio.fail_after(WAIT):
        # parent suspends, child runs and signals, parent resumes and finishes: never past
        # the second wait's timeout (three times this deadline)
        while await client.status("parent", turn) != "done":
            result = await worker.run_once(wait=WAIT)
            assert result is not None, statuses
            statuses.append(result.status)
    expected = "child read 'the report'"
    assert await client.reply("parent", turn) == f"{expected} / {expected}"
    # The replay reads both ends back the same way.
    replay = await Journal.open(world, "parent", turn)
    assert await _LooksTwice().run_turn(replay) == f"{expected} / {expected}"


async def test_world_sessions_says_whose_child_run_a_session_is(world: World, folder: str) -> None:
    """A child run is a session of its own, listed with the sessions users started: it is
    marked with the turn that started it (it was a bare row, ``child-<hex>``, of no one)."""
    client = Client(world)
    turn = await client.submit("parent", "fetch the report")
    worker = Worker(world, _LooksTwice(), lease=2, crash=None)
    with anyio.fail_after(WAIT):
        while await client.status("parent", turn) != "done":
            assert await worker.run_once(wait=WAIT) is not None
    page = await list_sessions(world, order="id")
    parents = {s.session: s.parent for s in page.sessions}
    assert len(parents) == 2
    assert parents.pop("parent") is None
    [(child, parent)] = parents.items()
    assert child.startswith("child-")
    assert parent == f"parent/{turn}"
    listed = await anyio.to_thread.run_sync(_world_cli, folder, "sessions")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[-2:] == ["child", "of"]
    by_session = {row.split()[0]: row.split() for row in rows}
    assert by_session[child][-1] == f"parent/{turn}"
    assert by_session["parent"][-1] == turn  # its last turn ends the row: no parent
