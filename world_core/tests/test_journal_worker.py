"""Worker and client: leases, signals, failures, and a caller that goes away."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_core import (
    Agent,
    Capabilities,
    Client,
    Lease,
    ModelReply,
    ModelRequest,
    NewEvent,
    ScriptedModel,
    ToolCall,
    ToolContext,
    Worker,
    World,
    open_world,
    tool,
)
from world_core.errors import BackendUnavailableError, InvalidArgumentError, NotFoundError
from world_core.journal import _session
from world_core.journal._worker import renew_interval

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
WAIT = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def folder(tmp_path: Path) -> str:
    return str(tmp_path / "world")


@pytest.fixture
async def world(folder: str) -> AsyncIterator[World]:
    async with open_world("local", url=folder, namespace="worker") as opened:
        yield opened


def policy(request: ModelRequest) -> ModelReply:
    """journal_support's policy: call wait_here once, then answer."""
    if any(m["role"] == "tool" for m in request.messages):
        return ModelReply(content="finished")
    call = ToolCall(id="call_0", name="wait_here", arguments='{"label": "x"}')
    return ModelReply(tool_calls=[call])


QUICK_DESCRIPTION = "Signal that the turn is running, then wait."


def build_quick() -> Agent:
    """journal_support's agent with a wait_here that returns at once. Same name and
    description: the tool schemas are part of the model's input, so another docstring would
    (rightly) be a NonDeterminismError on replay."""

    async def return_now(label: str) -> str:
        return label

    quick = tool(
        return_now,
        replay="safe",
        name="wait_here",
        description=QUICK_DESCRIPTION,
    )
    return Agent(model=ScriptedModel(policy), tools=[quick])


def echo_agent() -> Agent:
    return Agent(model=ScriptedModel(lambda request: ModelReply(content="echo")))


async def test_submit_is_idempotent_per_turn(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hi", turn_id="t")
    assert await client.submit("s", "hi", turn_id="t") == turn
    with pytest.raises(InvalidArgumentError, match="another message"):
        await client.submit("s", "bye", turn_id="t")
    leases = await world.queue.claim("turns", "w", lease=30, limit=10)
    assert len(leases) == 1  # the dedup key kept the resubmission from queueing it twice
    await world.queue.ack(leases[0])
    assert await client.submit("s", "hi", turn_id="t") == turn
    assert len(await world.queue.claim("turns", "w", lease=30, limit=10)) == 1  # no reply yet


async def test_a_caller_that_goes_away_stops_nothing(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hi")
    with anyio.move_on_after(0.2):  # the user closes the tab
        await client.wait("s", turn)
    assert await client.reply("s", turn) is None
    result = await Worker(world, echo_agent(), crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    with anyio.fail_after(WAIT):
        assert await client.wait("s", turn) == "echo"
    assert await world.queue.claim("turns", "w", lease=1) == []  # acked


async def test_wait_is_woken_by_the_reply(world: World) -> None:
    client = Client(world)
    turn = await client.submit("s", "hi")
    replies: list[str] = []

    async def waiter() -> None:
        replies.append(await client.wait("s", turn))

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await Worker(world, echo_agent(), crash=None).run_once(wait=WAIT)
    assert replies == ["echo"]


async def test_wait_with_timeout_0_looks_once(world: World) -> None:
    """``wait(timeout=0)`` raised TimeoutError for a turn that had replied: the deadline of 0
    cut the first read. It is a look: the reply or failure if there, else TimeoutError."""
    client = Client(world)
    turn = await client.submit("s", "hi")
    with anyio.fail_after(WAIT):
        await Worker(world, echo_agent(), crash=None).run_once(wait=WAIT)
    assert await client.wait("s", turn, timeout=0) == "echo"
    later = await client.submit("s", "again")
    with pytest.raises(TimeoutError):
        await client.wait("s", later, timeout=0)


async def test_wait_for_a_turn_never_submitted_ends(world: World) -> None:
    """``wait(timeout=None)`` for a turn with no input (a mistyped id) waited forever: it is
    told NotFoundError once the turn is still missing at its first recheck."""
    client = Client(world)
    await client.submit("s", "hi")
    with anyio.fail_after(WAIT), pytest.raises(NotFoundError, match="never submitted"):
        await client.wait("s", "no-such-turn", timeout=None)


async def test_world_worker_once_runs_a_turn_not_a_signal_check(world: World, folder: str) -> None:
    """The check a signal's sender queued (``Client.signal``) is not the turn ``world worker
    --once`` runs: one due ahead of a turn was taken as the run's one message, printed as
    ``checked`` with exit status 4 (the turn failed), and the turn was left queued."""
    await Client(world, signal_check=0.01).signal("other", "go", None, sender="test")
    await anyio.sleep(0.1)  # the check is due before the turn is queued: it is claimed first
    turn = await Client(world).submit("s", "hi")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.pop("CRASH_AT", None)
    command = [sys.executable, "-m", "world_core._cli", "worker", "--once", "--json"]
    command += ["--agent", "journal_support:build_replying", "--world", "local"]
    command += ["--url", folder, "--namespace", "worker", "--wait", str(WAIT)]
    done = await anyio.run_process(command, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result = json.loads(done.stdout)
    assert (result["turn_id"], result["status"]) == (turn, "done"), result
    # The check was handled on the way (acked): nothing is left queued.
    assert await world.queue.claim("turns", "after", lease=5, wait=0) == []


async def test_a_failed_turn_is_released_for_a_retry(world: World) -> None:
    def broken(request: ModelRequest) -> ModelReply:
        raise ConnectionError("model down")

    client = Client(world)
    turn = await client.submit("s", "hi")
    worker = Worker(world, Agent(model=ScriptedModel(broken)), crash=None, retry_delay=0)
    result = await worker.run_once(wait=WAIT)
    assert result is not None
    assert result.status == "retry"
    assert result.error == "ConnectionError: model down"
    assert await client.status("s", turn) == "queued"
    retry = await Worker(world, echo_agent(), crash=None).run_once(wait=WAIT)
    assert retry is not None
    assert retry.status == "done"
    assert await client.reply("s", turn) == "echo"


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"{}", b'{"session_id": "s", "turn_id": "a/b"}', b'{"session_id": ""}'],
)
async def test_a_message_that_is_no_turn_is_dropped(world: World, payload: bytes) -> None:
    await world.queue.enqueue("turns", payload)
    result = await Worker(world, echo_agent(), crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "invalid"
    assert await world.queue.claim("turns", "w", lease=1) == []
    assert await world.queue.dead_letters("turns") == []
    assert (await world.log.list_logs()).items == []


def test_worker_command_refuses_a_bad_agent(tmp_path: Path) -> None:
    for spec, message in [
        ("no_colon", "use module:attribute"),
        ("no_such_module_xyz:build", "cannot be loaded"),
        ("world_core:__version__", "cannot be loaded"),
        ("world_core:ENTRY_POINT_GROUP", "neither an Agent nor a factory"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "world_core._cli", "worker", "--agent", spec, "--once"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
        assert list(tmp_path.iterdir()) == []  # refused before opening any World


def test_worker_command_refuses_options_it_would_ignore_or_misread(tmp_path: Path) -> None:
    """--wait and --json only mean something with --once (they were ignored without it), and
    a --wait that is no duration was taken for 0 (negative) or claimed once (NaN)."""
    for extra, message in [
        (("--wait", "5"), "--wait is for --once"),
        (("--json",), "--json is for --once"),
        (("--once", "--wait", "-1"), "--wait must be a finite number of seconds >= 0"),
        (("--once", "--wait", "nan"), "--wait must be a finite number of seconds >= 0"),
    ]:
        command = [sys.executable, "-m", "world_core._cli", "worker"]
        done = subprocess.run(
            [*command, "--agent", "world_core:Agent", *extra],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert message in done.stderr
        assert list(tmp_path.iterdir()) == []  # refused before opening any World


async def test_worker_command_builds_its_agent_before_taking_a_turn(
    world: World, folder: str, tmp_path: Path
) -> None:
    """A factory that cannot build the agent stops ``world worker`` at once, with the cause,
    and the turn stays queued: it was claimed and retried (and at last failed) for what was
    the worker's fault. An agent that is a TurnAgent but not an Agent is taken as it is (it
    was refused as 'neither an Agent nor a factory')."""
    client = Client(world)
    turn = await client.submit("s", "hi")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    )
    command = [sys.executable, "-m", "world_core._cli", "worker", "--once", "--wait", "5"]
    command += ["--world", "local", "--url", folder, "--namespace", "worker"]

    def run(agent: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "--agent", agent],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    broken = await anyio.to_thread.run_sync(run, "journal_support:build_without_key")
    assert broken.returncode == 2, broken.stderr
    assert "building the agent raised RuntimeError: OPENAI_API_KEY is not set" in broken.stderr
    assert await client.status("s", turn) == "queued"
    assert await world.queue.dead_letters("turns") == []
    coroutine = await anyio.to_thread.run_sync(run, "journal_support:build_async")
    assert coroutine.returncode == 2, coroutine.stderr
    assert "is an async function: a factory is a plain function" in coroutine.stderr
    assert "never awaited" not in coroutine.stderr
    done = await anyio.to_thread.run_sync(run, "journal_support:replying")
    assert done.returncode == 0, done.stderr
    assert await client.reply("s", turn) == "finished"


async def test_an_async_agent_factory_is_refused(world: World) -> None:
    """Its coroutine is no agent: every turn would have failed for it, after retries."""

    async def build() -> Agent:
        return echo_agent()

    with pytest.raises(InvalidArgumentError, match="'build' is an async function"):
        Worker(world, build)  # type: ignore[arg-type]  # the mistake under test


async def test_run_once_refuses_a_wait_that_is_no_duration(world: World) -> None:
    worker = Worker(world, echo_agent(), crash=None)
    for wait in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="wait must be a finite number"):
            await worker.run_once(wait=wait)


async def test_lost_lease_cancels_the_turn(world: World, folder: str) -> None:
    """The worker's event loop stalls past its lease (a tool blocking it); another worker
    claims the turn meanwhile; the next renewal finds the lease lost and cancels the turn.
    The stall lasts until the other worker has claimed the turn: a fixed stall (6 s) left the
    thief 5 s to open its World and claim, and under load it might not have, the renewal
    then succeeding and the turn waiting forever."""
    stolen: list[Lease] = []
    inside = threading.Event()
    claimed = threading.Event()

    def other_worker() -> None:
        async def claim() -> None:
            inside.wait(WAIT)
            try:
                async with open_world("local", url=folder, namespace="worker") as other:
                    stolen.extend(await other.queue.claim("turns", "other", lease=30, wait=WAIT))
            finally:
                claimed.set()

        anyio.run(claim)

    async def stall(label: str) -> str:
        """Block the event loop (deliberately: no renewal can run) until the other worker has
        claimed the turn, then wait."""
        inside.set()
        claimed.wait(WAIT)  # the stall under test, past the 1 s lease
        await anyio.sleep_forever()
        return label

    agent = Agent(model=ScriptedModel(policy), tools=[tool(stall, replay="safe", name="wait_here")])
    client = Client(world)
    await client.submit("s", "hi")
    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        with anyio.fail_after(WAIT):
            result = await Worker(world, agent, lease=1, crash=None).run_once(wait=WAIT)
    finally:
        thread.join(WAIT)
    assert result is not None
    assert result.status == "lease_lost"
    assert len(stolen) == 1
    assert stolen[0].attempt == 2


def _worker_process(folder: str, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["JOURNAL_TEST_MARKER"] = str(tmp_path / "inside")
    env.pop("CRASH_AT", None)
    command = [sys.executable, "-m", "world_core._cli", "worker"]
    command += ["--agent", "journal_support:build", "--world", "local", "--url", folder]
    command += ["--namespace", "worker", *extra]
    with (tmp_path / "stderr").open("wb") as stderr:
        return subprocess.Popen(command, env=env, stderr=stderr)


def _stderr(tmp_path: Path) -> str:
    return (tmp_path / "stderr").read_text(errors="replace")


async def _stop(
    process: subprocess.Popen[bytes], tmp_path: Path, ready: Callable[[], bool]
) -> None:
    """Wait until ``ready()``, SIGTERM the worker, expect a clean exit; never leak it."""
    with _reaped(process):
        await _until(ready, "the worker getting ready")
        process.send_signal(signal.SIGTERM)
        await _until(lambda: process.poll() is not None, "the worker exiting")
        assert process.returncode == 0, _stderr(tmp_path)


@contextlib.contextmanager
def _reaped(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """Kill the worker process if it is still running when the block ends, and wait for it."""
    try:
        yield
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(WAIT)


async def _until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(int(WAIT * 20)):
        if predicate():
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {WAIT} s")


async def test_sigterm_releases_the_running_turn(world: World, folder: str, tmp_path: Path) -> None:
    """SIGTERM: the worker stops claiming, gives the turn its grace period, then releases it,
    so another worker continues at once (well before the 60 s lease would run out)."""
    client = Client(world)
    turn = await client.submit("s", "hi")
    process = _worker_process(folder, tmp_path, "--lease", "60", "--grace", "0.5")
    await _stop(process, tmp_path, ready=(tmp_path / "inside").exists)
    # Claimable within WAIT (20 s) although the lease was 60 s: it was released, not dropped.
    result = await Worker(world, build_quick(), lease=60, crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    assert await client.reply("s", turn) == "finished"


async def test_ctrl_c_says_what_it_does_and_a_second_one_releases_the_turn_now(
    world: World, folder: str, tmp_path: Path
) -> None:
    """Ctrl-C in a turn: the worker says it is finishing the turn (it sat silent through its
    grace) and how to stop now; a second Ctrl-C cancels the turn and releases its message at
    once (it raised KeyboardInterrupt past the worker, leaving the message held until its
    lease ran out: here 600 s, far past WAIT)."""
    client = Client(world)
    turn = await client.submit("s", "hi")
    process = _worker_process(folder, tmp_path, "--lease", "600", "--grace", "600")
    with _reaped(process):
        await _until((tmp_path / "inside").exists, "the worker entering the turn")
        process.send_signal(signal.SIGINT)
        await _until(lambda: "SIGINT again stops it now" in _stderr(tmp_path), "the notice")
        assert process.poll() is None  # still in its grace
        process.send_signal(signal.SIGINT)
        await _until(lambda: process.poll() is not None, "the worker exiting")
        assert process.returncode == 0, _stderr(tmp_path)
    assert "stopping now; the running turn is released" in _stderr(tmp_path)
    result = await Worker(world, build_quick(), lease=60, crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    assert await client.reply("s", turn) == "finished"


async def test_a_turn_cancelled_from_outside_is_released_at_once(world: World) -> None:
    """A worker cancelled in a turn (Ctrl-C of ``world worker --once``, an app shutting its
    task group down) hands the message back: another worker claims it now, not after the
    lease (600 s here; it was held that long)."""
    inside = anyio.Event()

    async def wait(label: str) -> str:
        inside.set()
        await anyio.sleep_forever()
        return label

    waiting = tool(wait, replay="safe", name="wait_here", description=QUICK_DESCRIPTION)
    agent = Agent(model=ScriptedModel(policy), tools=[waiting])
    client = Client(world)
    turn = await client.submit("s", "hi")
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(Worker(world, agent, lease=600, crash=None).run_once, wait=WAIT))
            await inside.wait()
            tg.cancel_scope.cancel()
    result = await Worker(world, build_quick(), lease=60, crash=None).run_once(wait=WAIT)
    assert result is not None
    assert result.status == "done"
    assert await client.reply("s", turn) == "finished"


async def test_sigterm_stops_an_idle_worker(folder: str, tmp_path: Path) -> None:
    process = _worker_process(folder, tmp_path)
    await _stop(process, tmp_path, ready=lambda: "waiting for turns" in _stderr(tmp_path))
    assert not (tmp_path / "inside").exists()
    # It says what it does: no turn to finish (not "finishing the current turn").
    assert "signal SIGTERM: no turn running; stopping" in _stderr(tmp_path)
    assert "finishing the current turn" not in _stderr(tmp_path)


async def test_run_retries_a_claim_the_store_could_not_answer(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim failing with BackendUnavailableError (a store restarting, a full connection
    pool) is retried after a second; before, it left ``run`` wrapped in an ExceptionGroup."""
    claim = world.queue.claim
    failures: list[int] = []

    async def flaky_claim(*args: Any, **kwargs: Any) -> list[Lease]:
        if not failures:
            failures.append(1)
            raise BackendUnavailableError("the store is restarting")
        return await claim(*args, **kwargs)

    monkeypatch.setattr(world.queue, "claim", flaky_claim)
    client = Client(world)
    await client.submit("s", "hi", turn_id="t1")
    stop = anyio.Event()
    worker = Worker(world, echo_agent(), crash=None)
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(worker.run, stop=stop, signals=False))
            assert await client.wait("s", "t1", timeout=WAIT) == "echo"
            stop.set()
    assert failures == [1]


async def test_a_worker_keeps_nothing_per_session_it_ran(world: World) -> None:
    """The memory of a long-running worker does not grow with the sessions it served: the
    chain of a session never continued is not remembered (each was, before: the scale run's
    worker grew by about 300 bytes a session)."""
    client = Client(world)
    worker = Worker(world, echo_agent(), crash=None)
    for n in range(20):
        await client.submit(f"s{n}", "hi", turn_id="t1")
        with anyio.fail_after(WAIT):
            result = await worker.run_once(wait=5.0)
        assert result is not None
        assert result.status == "done"
    assert _session._chains.get(world, {}) == {}


async def test_continued_chains_are_remembered_up_to_a_bound(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_session, "CHAINS_KEPT", 2)
    for n in range(3):
        marker = json.dumps({"to": f"sessiongen/x{n}/1-t"}).encode()
        await world.log.append(f"session/c{n}", [NewEvent(key=_session.CONTINUED_KEY, data=marker)])
        chain = await _session.session_chain(world, f"c{n}")
        assert chain == [f"session/c{n}", f"sessiongen/x{n}/1-t"]
    assert list(_session._chains[world]) == ["c1", "c2"]  # the oldest seen was dropped


async def test_submit_to_a_continued_session_reads_each_earlier_generation_once(
    world: World,
) -> None:
    """A submit to a session continued twice reads the chain (three keyed reads), each
    earlier generation once for the turn's input, and the current one's marker after the
    append: six reads, where it read the chain twice and the current generation's input
    twice (nine). Idempotency holds in every generation: a turn found in an earlier one, or
    refused by the current one's append, is not written again, and another message under
    its id is refused."""
    from world_conformance.wrappers import PassThroughLog, PassThroughWorld

    gets: list[tuple[str, str]] = []

    class Log(PassThroughLog):
        async def get(self, log_id: str, key: str) -> Any:
            gets.append((log_id, key))
            return await super().get(log_id, key)

    counted = PassThroughWorld(world, log=Log(world.log))
    client = Client(counted)
    await client.submit("s", "first", turn_id="old")
    chain = ["session/s", "sessiongen/x/1-a", "sessiongen/x/2-b"]
    for old, new in itertools.pairwise(chain):
        marker = json.dumps({"t": "continued", "to": new}).encode()
        await world.log.append(old, [NewEvent(key=_session.CONTINUED_KEY, data=marker)])
    await client.submit("s", "current", turn_id="now")  # the chain is remembered from here
    gets.clear()
    await client.submit("s", "next", turn_id="new")
    assert gets == [
        (chain[2], _session.CONTINUED_KEY),
        (chain[1], "turn/new/input"),
        (chain[0], "turn/new/input"),
        (chain[2], _session.CONTINUED_KEY),
    ]
    gets.clear()
    _session._chains.pop(counted, None)  # a process that has not seen the chain yet
    await client.submit("s", "next 2", turn_id="new2")
    assert len(gets) == 6, gets
    tails = [await world.log.tail(log_id) for log_id in chain]
    assert await client.submit("s", "first", turn_id="old") == "old"  # in the first generation
    assert await client.submit("s", "current", turn_id="now") == "now"  # the append refuses it
    assert [await world.log.tail(log_id) for log_id in chain] == tails, "a turn written twice"
    for turn in ("old", "now"):
        with pytest.raises(InvalidArgumentError, match="another message"):
            await client.submit("s", "changed", turn_id=turn)
    inputs = [e.key for e in await world.log.read(chain[2]) if e.key and e.key.endswith("input")]
    assert inputs == ["turn/now/input", "turn/new/input", "turn/new2/input"]


async def test_a_slow_agent_factory_holds_no_lease(world: World) -> None:
    """The factory is called before the claim: one that blocks the event loop longer than
    the lease (a framework's first import, schema generation) costs no leased time, so the
    turn's never tool, calling ``context.check()``, is not refused. (Called inside the
    turn, as before, the check refused and the attempt ended ``lease_lost``.)"""
    made: list[float] = []
    acted: list[str] = []

    async def act(context: ToolContext) -> str:
        """Act once."""
        context.check()
        acted.append(context.idempotency_key)
        return "acted"

    def act_once(request: ModelRequest) -> ModelReply:
        if any(m["role"] == "tool" for m in request.messages):
            return ModelReply(content="done")
        return ModelReply(tool_calls=[ToolCall(id="c0", name="act", arguments="{}")])

    def factory() -> Agent:
        made.append(time.monotonic())
        time.sleep(1.5)  # blocks the loop past the 1 s lease
        return Agent(model=ScriptedModel(act_once), tools=[tool(act, replay="never")])

    worker = Worker(world, factory, lease=1.0, crash=None, observers=[])
    with anyio.fail_after(WAIT):
        assert await worker.run_once(wait=0) is None
    assert len(made) == 1, "the agent is made before the claim, whether a turn comes or not"
    await Client(world).submit("s", "hi", turn_id="t")
    with anyio.fail_after(WAIT):
        result = await worker.run_once(wait=WAIT)
    assert result is not None
    assert (result.status, result.reply) == ("done", "done"), result
    assert acted == ["s/t/step-1"]


async def test_a_bad_agent_or_lease_is_refused_by_the_worker_not_by_a_turn(world: World) -> None:
    """``Worker(world, 42)`` was taken, and every turn it claimed then failed its attempts
    with a TypeError, as transient; a lease past what a queue holds was taken too (on
    PostgreSQL every claim then failed as a store bug)."""
    not_an_agent: Any = 42
    with pytest.raises(InvalidArgumentError, match=r"agent must be an Agent.*got int"):
        Worker(world, not_an_agent)
    with pytest.raises(InvalidArgumentError, match="lease must be at most"):
        Worker(world, echo_agent(), lease=1e300)


async def test_an_agent_class_is_a_factory(world: World) -> None:
    """A class has a ``run_turn`` too (unbound): it was run as the agent, and every turn
    failed with a TypeError for the missing ``self``."""

    class Echo(Agent):
        def __init__(self) -> None:
            super().__init__(model=ScriptedModel(lambda request: ModelReply(content="echo")))

    await Client(world).submit("s", "hi", turn_id="t")
    with anyio.fail_after(WAIT):
        result = await Worker(world, Echo, crash=None, observers=[]).run_once(wait=WAIT)
    assert result is not None
    assert (result.status, result.reply) == ("done", "echo"), result


async def test_a_submission_cut_before_its_message_does_not_wedge_its_session(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an outbox (MongoDB, Redis Cluster) a submission is the input, then its message:
    a client killed between the two left a turn no message ran, and every later turn of the
    session parked behind it for ever (``Client.wait`` timed out, no failure recorded). The
    worker parking a turn behind one never started sends that one its message again."""
    monkeypatch.setattr(type(world), "capabilities", property(lambda _: Capabilities()))
    assert not world.capabilities.outbox
    client = Client(world)
    enqueue = world.queue.enqueue

    async def killed(*args: Any, **kwargs: Any) -> str:
        raise KeyboardInterrupt("the client's process died between the two writes")

    monkeypatch.setattr(world.queue, "enqueue", killed)
    with pytest.raises(KeyboardInterrupt):
        await client.submit("s", "first", turn_id="t1")
    monkeypatch.setattr(world.queue, "enqueue", enqueue)
    await client.submit("s", "second", turn_id="t2")
    worker = Worker(world, echo_agent(), crash=None, observers=[])
    ran: list[tuple[str, str]] = []
    for _ in range(3):
        with anyio.fail_after(WAIT):
            result = await worker.run_once(wait=1)
        if result is not None:
            ran.append((result.turn_id, result.status))
    assert ran == [("t2", "queued"), ("t1", "done"), ("t2", "done")], ran
    with anyio.fail_after(WAIT):
        assert await client.wait("s", "t2") == "echo"


@pytest.mark.parametrize(
    ("late", "interval"),
    [(0.0, 10.0), (5.0, 10.0), (10.0, 10.0), (15.0, 7.5), (24.0, 3.0), (29.0, 3.0), (90.0, 3.0)],
)
def test_renewals_come_sooner_after_a_late_wake_up(late: float, interval: float) -> None:
    """lease / 3 while the loop is on time; after a stall, at most half of what the lease
    leaves after a stall as long, and never more often than lease / 10."""
    assert renew_interval(30.0, late) == pytest.approx(interval)


async def test_process_reckons_the_clock_from_the_lease_it_was_claimed_for(world: World) -> None:
    """A lease claimed for 600 s, run by a worker whose own lease is 5 s: the store's clock
    (which stamps the turn's records, ``at``, and judges a ``never`` call's deadline on a
    takeover) is the deadline minus 600, not minus 5, which put it ~595 s ahead."""
    client = Client(world)
    turn = await client.submit("s", "what time is it")
    leases = await world.queue.claim("turns", "tester", lease=600, wait=WAIT)
    assert len(leases) == 1
    worker = Worker(world, echo_agent(), lease=5, crash=None)
    with anyio.fail_after(WAIT):
        result = await worker.process(leases[0], claimed_for=600)
    assert result.status == "done", result
    assert await client.reply("s", turn) == "echo"
    stamps = [
        body["at"]
        for info in (await world.log.list_logs()).items
        for event in await world.log.read(info.log_id)
        if isinstance(body := json.loads(event.data), dict) and body.get("t") == "reply"
    ]
    assert len(stamps) == 1
    assert abs(stamps[0] - time.time()) < 60  # the local World's clock is this machine's


@pytest.mark.parametrize("claimed_for", [0, -1.0, True, "600", float("inf"), float("nan")])
async def test_process_refuses_a_claimed_for_no_lease_can_last(
    world: World, claimed_for: Any
) -> None:
    await Client(world).submit("s", "hi")
    leases = await world.queue.claim("turns", "tester", lease=30, wait=WAIT)
    with pytest.raises(InvalidArgumentError, match="claimed_for"):
        await Worker(world, echo_agent(), crash=None).process(leases[0], claimed_for=claimed_for)
    assert await world.log.list_logs()  # the turn was not touched: it is still submitted
