"""JournalResilienceContract: pauses, failures and shutdowns of real worker processes.

The journal's promises under the faults a deployment really sees, run against every backend:

* a worker paused (SIGSTOP) inside a ``never`` tool past its lease: the worker that takes the
  turn over does not answer for the call while its deadline has not passed, and after it the
  model's blind retry reuses the call's idempotency key;
* a worker whose event loop was blocked past its lease inside a ``never`` tool that calls
  ``context.check()``: the refusal is not the call's outcome; the attempt ends, the call is
  recorded as not started and runs once, on the next attempt; a worker that took the turn over
  meanwhile finds nothing of the stale worker's written after its own writes;
* a turn that cannot finish says so: a failure record ``Client.wait`` raises, the message
  acked (not redelivered, not dead-lettered); a transient error fails only the last attempt;
* outcomes are not lost: SIGTERM lets a ``never`` call in flight finish and keeps its outcome,
  a worker stopped while claiming claims nothing more, a tool raising ``SystemExit`` or
  ``KeyboardInterrupt`` only fails its own call, and a transient fault on the outcome's append
  is retried.

Workers are ``python -m world_core._cli worker`` processes running
:func:`~world_conformance.journal_agent.build_process_agent`; they signal where they are with
files (``act`` creates one when it runs, waits for another) and log lines
(``WORLD_JOURNAL_LOG=info``), which the tests wait for, each wait bounded. Every process a test
starts is killed (SIGKILL ends a stopped one too) when the test ends.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from anyio.abc import Process

from world_conformance._base import ContractBase
from world_conformance._support import WAIT
from world_conformance._target import WorldTarget
from world_conformance.journal_agent import (
    MESSAGE,
    REPLY,
    SYSTEM,
    ActScript,
    careful,
    careless,
    effects,
    make_agent,
)
from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import (
    POSSIBLY_RAN,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    NewEvent,
    OutboxMessage,
    ScriptedModel,
    SimulatedCrash,
    TurnResult,
    Worker,
    World,
    session_log_id,
)
from world_core.errors import BackendUnavailableError, TurnFailedError
from world_core.journal._client import turn_queue_key
from world_core.spi import Log

__all__ = ["JournalResilienceContract"]

AGENT = "world_conformance.journal_agent:build_process_agent"
TURN = "t1"
SESSION = "s"
QUEUE = "q"
LEASE = 2.0
KEY = f"{SESSION}/{TURN}/step-3"
"""act's idempotency key: the clean turn's steps are 0 model, 1 lookup, 2 model, 3 act, 4 model."""
IN_FLIGHT_TIMEOUT = 5.0
"""act's timeout while paused within it: longer than the pause (a lease and a takeover)."""
SHORT_TIMEOUT = 1.0
"""act's timeout when paused past it."""
BLOCKED_LEASE = 1.0
"""The lease of a worker whose event loop a test blocks past it."""
_POLL = 0.02


@dataclass
class _WorkerProcess:
    """A ``world worker`` process; its stdout and stderr go to files."""

    process: Process
    stdout: Path
    stderr: Path

    def output(self) -> str:
        return self.stdout.read_text(errors="replace")

    def errors(self) -> str:
        """The end of its stderr (for failure messages)."""
        return self.stderr.read_text(errors="replace")[-4000:]

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    async def until(self, ready: Callable[[], bool], what: str) -> None:
        """Wait (bounded) until ``ready()``; fail early, with its stderr, if the worker died."""
        with anyio.move_on_after(WAIT):
            while not ready():
                if self.process.returncode is not None:
                    raise AssertionError(
                        f"the worker exited ({self.process.returncode}) before {what}:\n"
                        f"{self.errors()}"
                    )
                await anyio.sleep(_POLL)
            return
        raise AssertionError(f"{what}: not seen within {WAIT} s\n{self.errors()}")

    async def logged(self, text: str) -> None:
        """Wait (bounded) until its stderr shows ``text``."""

        def shown() -> bool:
            return text in self.stderr.read_text(errors="replace")

        await self.until(shown, f"the worker logging {text!r}")

    async def exit(self) -> int:
        """The exit status (waiting for it, bounded)."""
        with anyio.fail_after(WAIT):
            return await self.process.wait()

    def result(self) -> dict[str, Any]:
        """What ``--once --json`` printed: the TurnResult."""
        lines = self.output().strip().splitlines()
        assert lines, f"the worker printed no result:\n{self.errors()}"
        found: dict[str, Any] = json.loads(lines[-1])
        return found


@asynccontextmanager
async def _worker(
    target: WorldTarget,
    folder: Path,
    env: Mapping[str, str],
    *,
    once: bool = True,
    grace: float | None = None,
) -> AsyncIterator[_WorkerProcess]:
    """Start ``world worker`` on the test's namespace (``--once --json`` unless ``once`` is
    false: then it runs until SIGTERM); killed on the way out, whatever happened."""
    command = [sys.executable, "-m", "world_core._cli", "worker", "--agent", AGENT]
    command += ["--queue", QUEUE, "--lease", str(LEASE), "--world", target.name]
    command += ["--namespace", target.namespace]
    if target.url is not None:
        command += ["--url", target.url]
    if once:
        command += ["--once", "--json", "--wait", str(WAIT)]
    if grace is not None:
        command += ["--grace", str(grace)]
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("WORLD_JOURNAL_", "CRASH_AT"))
    }
    environment.update(env)
    environment["WORLD_JOURNAL_EFFECTS"] = str(folder / "effects.log")
    stdout, stderr = folder / "worker.out", folder / "worker.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = await anyio.open_process(command, stdout=out, stderr=err, env=environment)
    try:
        yield _WorkerProcess(process, stdout, stderr)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            with anyio.move_on_after(WAIT):
                await process.wait()
            await process.aclose()


async def _body(world: World, key: str) -> dict[str, Any] | None:
    """The journal event with ``key`` in the session log, decoded, or None."""
    event = await world.log.get(session_log_id(SESSION), key)
    if event is None:
        return None
    body: dict[str, Any] = json.loads(event.data)
    return body


async def _act_result(world: World, step: int = 3) -> object:
    body = await _body(world, f"turn/{TURN}/step/{step}/outcome")
    assert body is not None, f"no outcome recorded for step {step}"
    return body["result"]


async def _until_done(worker: Worker) -> tuple[list[str], TurnResult]:
    """Run the turn with ``worker`` until it is not re-queued to wait for a call in flight;
    the statuses on the way and the last result."""
    statuses: list[str] = []
    with anyio.fail_after(WAIT * 2):
        while True:
            result = await worker.run_once(wait=WAIT)
            assert result is not None, "no turn came: was its message lost?"
            statuses.append(result.status)
            if result.status != "waiting":
                return statuses, result


def _dedup_key(session: str, turn: str) -> str:
    return turn_queue_key(session, turn)  # Client.submit's deduplication key


async def _live_message(world: World) -> str:
    """The id of the turn's live message: an enqueue with its deduplication key adds nothing
    and returns it."""
    return await world.queue.enqueue(QUEUE, b"probe", dedup_key=_dedup_key(SESSION, TURN))


async def _assert_acked(world: World, message_id: str) -> None:
    """The turn's message is gone for good: no live message holds its key (so it is neither
    ready, delayed for a retry, nor leased) and it is not among the dead letters."""
    probe = await world.queue.enqueue(
        QUEUE, b"probe", dedup_key=_dedup_key(SESSION, TURN), delay=3600
    )
    assert probe != message_id, "the turn's message is still live: it will be delivered again"
    assert await world.queue.dead_letters(QUEUE) == [], "the turn's message was dead-lettered"


async def _published_start(client: Client, *, step: int) -> None:
    """Wait (bounded) until the turn's live events show ``step`` started."""
    with anyio.fail_after(WAIT):
        async for event in client.events(SESSION, TURN, timeout=WAIT):
            if event.type == "step_started" and event.step == step:
                return
    raise AssertionError(f"the turn's events ended before step {step} started")


class _OutcomeAppendFails(PassThroughLog):
    """The World's log, except that the first append carrying ``key`` raises
    BackendUnavailableError once: before reaching the store (``landed=False``) or after the
    store took it (``landed=True``: the reply was lost on the way back)."""

    def __init__(self, inner: Log, key: str, *, landed: bool) -> None:
        super().__init__(inner)
        self.key = key
        self.landed = landed
        self.failures = 0

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        if self.failures == 0 and any(event.key == self.key for event in events):
            self.failures += 1
            if self.landed:
                await self.inner.append(
                    log_id, events, expect_tail=expect_tail, status=status, messages=messages
                )
            raise BackendUnavailableError(f"injected: the append of {self.key} failed once")
        return await self.inner.append(
            log_id, events, expect_tail=expect_tail, status=status, messages=messages
        )


class _WithLog(PassThroughWorld):
    """The World under test with another log in front of its own."""

    def __init__(self, inner: World, log: Log) -> None:
        super().__init__(inner, log=log)

    async def aclose(self) -> None:
        """Nothing: the World under test is closed by its fixture."""


class JournalResilienceContract(ContractBase):
    """Pauses, failures and shutdowns of real worker processes, on the World under test."""

    contract_area: ClassVar[str] = "journal"

    # -- a paused worker never duplicates a never effect ------------------------------------------

    @pytest.mark.world_process
    async def test_journal_paused_worker_call_in_flight(
        self, world: World, world_target: WorldTarget, tmp_path: Path
    ) -> None:
        """A worker process stopped (SIGSTOP) inside act, before its effect, past its 2 s
        lease: the worker that claims the turn finds act's deadline (5 s) ahead, answers
        nothing for it and re-queues the turn (``waiting``). Resumed (SIGCONT) before that
        deadline, the first worker's call completes and its outcome lands; the turn then
        finishes with exactly one effect and act's real result."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        inside, gate = tmp_path / "inside", tmp_path / "gate"
        env = {
            "WORLD_JOURNAL_INSIDE": str(inside),
            "WORLD_JOURNAL_GATE": str(gate),
            "WORLD_JOURNAL_ACT_TIMEOUT": str(IN_FLIGHT_TIMEOUT),
        }
        agent = make_agent(tmp_path / "effects.log", act_timeout=IN_FLIGHT_TIMEOUT)
        second = Worker(world, agent, queue=QUEUE, lease=LEASE, name="second", crash=None)
        async with _worker(world_target, tmp_path, env) as first:
            await first.until(inside.exists, "the first worker running act")
            # Stopped inside act, not inside a write: on an embedded store (a database file)
            # a process stopped in a write transaction holds the file's lock while stopped.
            # The worker's live-event publisher writes act's step_started just after act
            # begins; wait for it, after which nothing but the lease heartbeat writes.
            await _published_start(client, step=3)
            first.signal(signal.SIGSTOP)
            with anyio.fail_after(WAIT * 2):
                taken = await second.run_once(wait=WAIT)
            assert taken is not None, "the turn was not claimed after the paused worker's lease"
            assert taken.status == "waiting", taken
            assert taken.tool_runs == 0
            assert await _body(world, f"turn/{TURN}/step/3/outcome") is None, (
                "the call's deadline had not passed, yet its outcome was answered for"
            )
            assert effects(tmp_path / "effects.log", SESSION) == []
            gate.touch()
            first.signal(signal.SIGCONT)
            assert await first.exit() == 4, first.errors()
            assert first.result()["status"] == "lease_lost", first.result()
        assert await _act_result(world) == {"output": "acted"}
        statuses, done = await _until_done(second)
        assert done.status == "done", (statuses, done)
        assert done.reply == REPLY
        assert done.tool_runs == 0
        assert effects(tmp_path / "effects.log", SESSION) == [KEY]
        assert await _act_result(world) == {"output": "acted"}

    async def test_journal_loop_blocked_past_the_lease_runs_the_call_again(
        self, world: World, tmp_path: Path
    ) -> None:
        """act blocks its worker's event loop past the 1 s lease (as CPU-bound work or a first
        import would; no renewal can run), then calls ``context.check()``: the refusal is not
        act's outcome. The attempt ends ``lease_lost`` with no effect and the message
        released; the log says act was not started (``step/3/unstarted``). The next attempt
        runs act again (intent generation 1, the same idempotency key): one effect, act's real
        result, the reply; no model request ever saw the refusal."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        effects_file = tmp_path / "effects.log"
        blocked: list[float] = []

        async def block_once() -> None:
            if not blocked:
                blocked.append(BLOCKED_LEASE * 1.5)
                time.sleep(blocked[0])  # noqa: ASYNC251  (the point: the loop cannot run)

        model = ScriptedModel(careful)
        agent = make_agent(
            effects_file,
            model=model,
            before_act=block_once,
            act_timeout=IN_FLIGHT_TIMEOUT * 6,
            script=ActScript(check=True),
        )
        worker = Worker(
            world, agent, queue=QUEUE, lease=BLOCKED_LEASE, name="w", crash=None, observers=[]
        )
        with anyio.fail_after(WAIT * 2):
            first = await worker.run_once(wait=WAIT)
        assert first is not None
        assert first.status == "lease_lost", first
        assert "no longer holds the turn's lease" in str(first.error)
        assert effects(effects_file, SESSION) == []
        assert await _body(world, f"turn/{TURN}/step/3/outcome") is None
        unstarted = await _body(world, f"turn/{TURN}/step/3/unstarted")
        assert unstarted is not None
        assert unstarted["gen"] == 0, unstarted
        with anyio.fail_after(WAIT * 2):
            second = await worker.run_once(wait=WAIT)
        assert second is not None
        assert second.status == "done", second
        assert second.reply == REPLY
        assert effects(effects_file, SESSION) == [KEY], "act did not run exactly once"
        assert await _act_result(world) == {"output": "acted"}
        again = await _body(world, f"turn/{TURN}/step/3/intent/1")
        assert again is not None
        assert (again["gen"], again["key"]) == (1, KEY), again
        told = [str(m.get("content")) for r in model.calls for m in r.messages]
        assert not [text for text in told if "lease" in text.lower()], told

    @pytest.mark.world_process
    async def test_journal_stale_worker_writes_nothing_after_the_takeover(
        self, world: World, world_target: WorldTarget, tmp_path: Path
    ) -> None:
        """Worker A's event loop blocks inside act (1 s deadline) while worker B, on a
        connection of its own, takes the turn over once A's 1 s lease ran out, answers for act
        after its deadline (POSSIBLY_RAN) and finishes the turn. A's act then calls
        ``context.check()``: refused, and A's fenced "not started" record finds B's writes
        after its own tail, so A writes nothing: the log's tail is what B left, A's status is
        ``lease_lost``, and the only effect is B's retry of act (with act's key)."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        effects_file = tmp_path / "effects.log"
        log_id = session_log_id(SESSION)
        seen: dict[str, Any] = {}

        async def take_over() -> None:
            async with world_target.open() as other:
                agent = make_agent(effects_file, act_timeout=SHORT_TIMEOUT)
                b = Worker(other, agent, queue=QUEUE, lease=LEASE, name="b", crash=None)
                seen["b"] = await _until_done(b)
                seen["tail"] = await other.log.tail(log_id)

        def in_thread() -> None:
            try:
                anyio.run(take_over)
            except BaseException as exc:  # re-raised in the test's task
                seen["error"] = exc

        async def block_once() -> None:
            if "b" in seen or "error" in seen:
                return
            thread = threading.Thread(target=in_thread, daemon=True)
            thread.start()
            thread.join(WAIT * 3)  # A's loop is blocked all along: no renewal, no write

        agent = make_agent(
            effects_file,
            before_act=block_once,
            act_timeout=SHORT_TIMEOUT,
            script=ActScript(check=True),
        )
        a = Worker(
            world, agent, queue=QUEUE, lease=BLOCKED_LEASE, name="a", crash=None, observers=[]
        )
        with anyio.fail_after(WAIT * 4):
            stale = await a.run_once(wait=WAIT)
        if "error" in seen:
            raise seen["error"]
        assert "b" in seen, "worker B did not finish the turn within its bound"
        statuses, done = seen["b"]
        assert done.status == "done", (statuses, done)
        assert stale is not None
        assert stale.status == "lease_lost", stale
        assert await world.log.tail(log_id) == seen["tail"], "the stale worker wrote after B"
        assert await _body(world, f"turn/{TURN}/step/3/unstarted") is None
        interrupted = await _act_result(world)
        assert interrupted == {"output": POSSIBLY_RAN, "interrupted": True, "key": KEY}
        assert effects(effects_file, SESSION) == [KEY], "B's retry of act (the same key) only"
        assert await client.reply(SESSION, TURN) == REPLY

    async def test_journal_takeover_clock_ignores_claim_wait(
        self, world: World, tmp_path: Path
    ) -> None:
        """A worker claimed the turn (lease 3 s) and stopped inside act (deadline 4 s); a
        takeover worker already waiting in claim gets the turn when that lease runs out. Its
        estimate of the store's clock starts from the claim's answer, not from when it began
        waiting (3 s earlier), so it still sees act's deadline ahead and re-queues the turn
        instead of answering "may or may not have happened" for a call that may be running."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        hold, timeout = 3.0, 4.0
        with anyio.fail_after(WAIT):
            held = await world.queue.claim(QUEUE, "stopped", lease=hold, wait=WAIT)
        assert len(held) == 1
        crash = CrashPoint(3, "before_run", in_process=True)
        journal = await Journal.open(world, SESSION, TURN, crash=crash)
        agent = make_agent(tmp_path / "effects.log", act_timeout=timeout)
        with anyio.fail_after(WAIT), pytest.raises(SimulatedCrash):
            await agent.run_turn(journal)  # act's intent is recorded; the call "is running"
        takeover = Worker(world, agent, queue=QUEUE, lease=LEASE, name="takeover", crash=None)
        with anyio.fail_after(WAIT * 2):
            taken = await takeover.run_once(wait=WAIT)
        assert taken is not None
        assert taken.status == "waiting", taken
        assert await _body(world, f"turn/{TURN}/step/3/outcome") is None

    @pytest.mark.world_process
    async def test_journal_paused_past_deadline_retry_reuses_key(
        self, world: World, world_target: WorldTarget, tmp_path: Path
    ) -> None:
        """A worker process stopped inside act after its effect, past its lease and act's 1 s
        deadline: the next worker records POSSIBLY_RAN; a model that retries blindly with the
        same arguments gets the interrupted call's idempotency key again, so the effects show
        one distinct key for two requests (an API honouring keys sees one). Resumed, the
        first worker's late outcome is refused: the log does not change."""
        effects_file = tmp_path / "effects.log"
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        inside, gate = tmp_path / "inside", tmp_path / "gate"
        env = {
            "WORLD_JOURNAL_INSIDE": str(inside),
            "WORLD_JOURNAL_GATE": str(gate),
            "WORLD_JOURNAL_EFFECT_FIRST": "1",
            "WORLD_JOURNAL_ACT_TIMEOUT": str(SHORT_TIMEOUT),
        }
        model = ScriptedModel(careless)
        agent = make_agent(effects_file, model=model, act_timeout=SHORT_TIMEOUT)
        second = Worker(world, agent, queue=QUEUE, lease=LEASE, name="second", crash=None)
        log_id = session_log_id(SESSION)
        async with _worker(world_target, tmp_path, env) as first:
            await first.until(inside.exists, "the first worker running act")
            first.signal(signal.SIGSTOP)
            statuses, done = await _until_done(second)
            assert done.status == "done", (statuses, done)
            assert done.reply == REPLY
            assert set(statuses) <= {"waiting", "done"}, statuses
            interrupted = await _act_result(world)
            assert interrupted == {"output": POSSIBLY_RAN, "interrupted": True, "key": KEY}
            retry = await _body(world, f"turn/{TURN}/step/5/intent")
            assert retry is not None, "the model's retry of act (step 5) has no intent"
            assert retry["name"] == "act"
            assert retry["key"] == KEY, "the blind retry did not reuse the interrupted key"
            tail = await world.log.tail(log_id)
            first.signal(signal.SIGCONT)
            assert await first.exit() == 4, first.errors()
            assert first.result()["status"] in ("lease_lost", "superseded"), first.result()
        assert await world.log.tail(log_id) == tail, "the resumed worker wrote to the turn"
        assert effects(effects_file, SESSION) == [KEY, KEY], "two requests, one idempotency key"
        assert await client.reply(SESSION, TURN) == REPLY

    # -- a failed turn is visible -----------------------------------------------------------------

    @pytest.mark.world_process
    @pytest.mark.parametrize("broken", ["changed_code", "unfinished"])
    async def test_journal_failed_turn_is_visible(
        self, world: World, world_target: WorldTarget, tmp_path: Path, broken: str
    ) -> None:
        """A worker process whose agent fails deterministically (``changed_code``: replaying a
        turn begun under another system prompt raises NonDeterminismError; ``unfinished``: the
        agent returns without ``journal.finish``) records the failure at once: a waiting
        ``Client.wait`` raises TurnFailedError with its class, attempts and step, the status
        is ``failed``, and the message is acked: not redelivered, not dead-lettered."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        message_id = await _live_message(world)
        env: dict[str, str] = {}
        if broken == "changed_code":
            journal = await Journal.open(
                world, SESSION, TURN, crash=CrashPoint(1, "before_run", in_process=True)
            )
            with anyio.fail_after(WAIT), pytest.raises(SimulatedCrash):
                await make_agent(tmp_path / "effects.log").run_turn(journal)
            env["WORLD_JOURNAL_SYSTEM"] = SYSTEM + " (edited since the turn began)"
            expected = ("NonDeterminismError", 0)
        else:
            env["WORLD_JOURNAL_UNFINISHED"] = "1"
            expected = ("TurnIncompleteError", 1)
        failures: list[TurnFailedError] = []

        async def wait_for_it() -> None:
            with pytest.raises(TurnFailedError) as caught:
                await client.wait(SESSION, TURN, timeout=WAIT * 2)
            failures.append(caught.value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_it)
            async with _worker(world_target, tmp_path, env) as worker:
                assert await worker.exit() == 4, worker.errors()
                assert worker.result()["status"] == "failed", worker.result()
        [failure] = failures
        assert (failure.error_type, failure.step) == expected, failure
        assert failure.attempts == 1
        assert await client.status(SESSION, TURN) == "failed"
        recorded = await client.failure(SESSION, TURN)
        assert recorded is not None
        assert (recorded.error_type, recorded.step, recorded.attempts) == (*expected, 1)
        await _assert_acked(world, message_id)
        assert effects(tmp_path / "effects.log", SESSION) == []

    async def test_journal_transient_error_fails_the_last_attempt(
        self, world: World, tmp_path: Path
    ) -> None:
        """A model that keeps raising ConnectionError (transient): the first attempt is
        released for a retry and records nothing; the last (``max_attempts=2``) records the
        failure, which ``Client.wait`` raises, and acks the message."""

        def unreachable(request: ModelRequest) -> ModelReply:
            raise ConnectionError("injected: the model endpoint is unreachable")

        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        message_id = await _live_message(world)
        model = ScriptedModel(unreachable)
        agent = make_agent(tmp_path / "effects.log", model=model)
        worker = Worker(
            world, agent, queue=QUEUE, lease=LEASE, crash=None, max_attempts=2, retry_delay=0
        )
        with anyio.fail_after(WAIT * 2):
            first = await worker.run_once(wait=WAIT)
            assert first is not None
            assert first.status == "retry", first
            assert await client.failure(SESSION, TURN) is None
            assert await client.status(SESSION, TURN) == "queued"
            second = await worker.run_once(wait=WAIT)
            assert second is not None
            assert second.status == "failed", second
            with pytest.raises(TurnFailedError) as caught:
                await client.wait(SESSION, TURN, timeout=WAIT)
        assert caught.value.error_type == "ConnectionError"
        assert caught.value.attempts == 2
        assert caught.value.step is None  # no step was recorded: the first model call failed
        assert len(model.calls) == 2
        assert await client.status(SESSION, TURN) == "failed"
        await _assert_acked(world, message_id)

    # -- outcomes are not lost --------------------------------------------------------------------

    @pytest.mark.world_process
    @pytest.mark.parametrize("grace", [10.0, 0.0], ids=["within_grace", "grace_over"])
    async def test_journal_sigterm_keeps_the_outcome(
        self, world: World, world_target: WorldTarget, tmp_path: Path, grace: float
    ) -> None:
        """SIGTERM to a worker process while act (a sync tool, in a thread) waits at its gate:
        the call is not cut off, whether the grace period outlasts it (``within_grace``: the
        turn finishes) or is over at once (``grace_over``: the turn is cancelled and handed
        back); act's real outcome is recorded, the worker exits 0, and the turn ends with one
        effect, act never run again."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        inside, gate = tmp_path / "inside", tmp_path / "gate"
        env = {
            "WORLD_JOURNAL_INSIDE": str(inside),
            "WORLD_JOURNAL_GATE": str(gate),
            "WORLD_JOURNAL_ACT_SYNC": "1",
            "WORLD_JOURNAL_ACT_TIMEOUT": str(WAIT),
            "WORLD_JOURNAL_LOG": "info",
        }
        async with _worker(world_target, tmp_path, env, once=False, grace=grace) as worker:
            await worker.until(inside.exists, "the worker running act")
            worker.signal(signal.SIGTERM)
            await worker.logged("world.worker: signal")  # handled: the grace period runs
            gate.touch()
            assert await worker.exit() == 0, worker.errors()
        assert await _act_result(world) == {"output": "acted"}
        if grace:
            assert await client.status(SESSION, TURN) == "done"
        else:
            agent = make_agent(tmp_path / "effects.log")
            replacement = Worker(world, agent, queue=QUEUE, lease=LEASE, crash=None)
            statuses, done = await _until_done(replacement)
            assert done.status == "done", (statuses, done)
            assert done.tool_runs == 0
        assert await client.reply(SESSION, TURN) == REPLY
        assert effects(tmp_path / "effects.log", SESSION) == [KEY]

    @pytest.mark.world_process
    async def test_journal_sigterm_stops_claiming(
        self, world: World, world_target: WorldTarget, tmp_path: Path
    ) -> None:
        """A worker process waiting for work gets SIGTERM; a turn submitted once it handled
        the signal is never claimed by it: after it exits, the turn is still queued and its
        first delivery goes to the next claimer."""
        client = Client(world, queue=QUEUE)
        async with _worker(
            world_target, tmp_path, {"WORLD_JOURNAL_LOG": "info"}, once=False
        ) as worker:
            await worker.logged("waiting for turns")
            worker.signal(signal.SIGTERM)
            await worker.logged("world.worker: signal")
            await client.submit(SESSION, MESSAGE, turn_id=TURN)
            assert await worker.exit() == 0, worker.errors()
        assert await client.status(SESSION, TURN) == "queued"
        with anyio.fail_after(WAIT * 2):
            leases = await world.queue.claim(QUEUE, "next", lease=LEASE, wait=WAIT)
        assert len(leases) == 1
        assert leases[0].attempt == 1, "the stopped worker claimed the turn after the signal"
        await world.queue.ack(leases[0])

    @pytest.mark.world_process
    @pytest.mark.parametrize(
        ("raises", "sync"),
        [("SystemExit", True), ("KeyboardInterrupt", False)],
        ids=["SystemExit_in_thread", "KeyboardInterrupt_in_loop"],
    )
    async def test_journal_tool_raising_exit_is_its_outcome(
        self, world: World, world_target: WorldTarget, tmp_path: Path, raises: str, sync: bool
    ) -> None:
        """act raises SystemExit (a sync tool, in its thread) or KeyboardInterrupt (an async
        tool, in the event loop): the worker process lives on, the error is act's recorded
        outcome, and the turn finishes."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        env = {"WORLD_JOURNAL_ACT_RAISES": raises, "WORLD_JOURNAL_ACT_SYNC": "1" if sync else "0"}
        async with _worker(world_target, tmp_path, env) as worker:
            assert await worker.exit() == 0, worker.errors()
            assert worker.result()["status"] == "done", worker.result()
        result = await _act_result(world)
        assert isinstance(result, dict)
        assert set(result) == {"error"}
        assert str(result["error"]).startswith(f"{raises}:"), result
        assert await client.reply(SESSION, TURN) == REPLY
        assert effects(tmp_path / "effects.log", SESSION) == []

    @pytest.mark.parametrize("landed", [False, True], ids=["lost", "landed"])
    async def test_journal_outcome_append_retried(
        self, world: World, tmp_path: Path, landed: bool
    ) -> None:
        """The append of act's outcome fails once with BackendUnavailableError, before the
        store took it (``lost``) or after (``landed``, the answer lost on the way back): the
        journal retries it, recognises its own event if it had landed, and the turn finishes
        with act's real outcome and one effect."""
        client = Client(world, queue=QUEUE)
        await client.submit(SESSION, MESSAGE, turn_id=TURN)
        flaky = _OutcomeAppendFails(world.log, f"turn/{TURN}/step/3/outcome", landed=landed)
        wrapped = _WithLog(world, flaky)
        worker = Worker(wrapped, make_agent(tmp_path / "effects.log"), queue=QUEUE, crash=None)
        with anyio.fail_after(WAIT * 2):
            done = await worker.run_once(wait=WAIT)
        assert flaky.failures == 1, "the fault was never injected"
        assert done is not None
        assert done.status == "done", done
        assert done.reply == REPLY
        assert done.tool_runs == 2  # lookup and act, each once
        assert await _act_result(world) == {"output": "acted"}
        assert effects(tmp_path / "effects.log", SESSION) == [KEY]
