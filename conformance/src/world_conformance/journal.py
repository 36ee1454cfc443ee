"""JournalContract: the durable step journal's promises, on the World under test.

The evaluations of the durable-step-journal pattern, run against every backend: the crash
matrix (a real worker process killed with ``os._exit`` before and after every step, continued
by a fresh worker), replay with the model switched off, two workers on one turn, an
interrupted ``never`` tool the model must check before retrying, a wrongly labelled tool, and
a code change between crash and replay. Side effects are counted outside the journal (a file
the ``act`` tool appends to); model calls are counted at the model client.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar, Literal

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import WAIT, aclose
from world_conformance._target import WorldTarget
from world_conformance.journal_agent import (
    MESSAGE,
    REPLY,
    careful,
    careless,
    effects,
    make_agent,
)
from world_core import (
    Agent,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    SimulatedCrash,
    TurnResult,
    Worker,
    World,
    digest_of,
    session_log_id,
)
from world_core.errors import DuplicateKeyError, NonDeterminismError, WorldError

__all__ = ["JournalContract"]

AGENT = "world_conformance.journal_agent:build_agent"
TURN = "t1"
LEASE = 2.0  # short, so a replacement claims the turn soon after a crash
CRASH_POINTS = [f"{n}:{when}" for n in range(5) for when in ("before_run", "after_run")]
"""The clean turn's steps: 0 model, 1 lookup, 2 model, 3 act, 4 model."""


async def _outcomes(world: World, session: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") == "outcome":
            found.append(body)
    return found


async def _crashed_worker(
    target: WorldTarget, queue: str, journal_effects: Path, crash_at: str, replay: str = "never"
) -> None:
    """Run one worker process with CRASH_AT; assert it died there (status 1)."""
    command = [sys.executable, "-m", "world_core._cli", "worker", "--agent", AGENT, "--once"]
    command += ["--wait", str(WAIT), "--lease", str(LEASE), "--queue", queue]
    command += ["--world", target.name, "--namespace", target.namespace]
    if target.url is not None:
        command += ["--url", target.url]
    env = {
        **os.environ,
        "CRASH_AT": crash_at,
        "WORLD_JOURNAL_EFFECTS": str(journal_effects),
        "WORLD_JOURNAL_ACT_REPLAY": replay,
    }
    with anyio.fail_after(WAIT * 3):
        done = await anyio.run_process(command, env=env, check=False)
    assert done.returncode == 1, (
        f"the worker with CRASH_AT={crash_at} exited {done.returncode} instead of crashing:\n"
        f"{done.stdout.decode(errors='replace')}\n{done.stderr.decode(errors='replace')[-3000:]}"
    )


async def _crashed_workers(target: WorldTarget, jobs: list[dict[str, str]]) -> dict[str, int]:
    """Run one crash worker per job at once (forked from one warm process); exit statuses."""
    command = [sys.executable, "-m", "world_conformance.journal_fork", "--world", target.name]
    command += ["--namespace", target.namespace]
    if target.url is not None:
        command += ["--url", target.url]
    env = {k: v for k, v in os.environ.items() if k != "CRASH_AT"}
    with anyio.fail_after(WAIT * 3):
        done = await anyio.run_process(
            command, input=json.dumps(jobs).encode(), env=env, check=False
        )
    output = done.stdout.decode(errors="replace").strip().splitlines()
    errors = done.stderr.decode(errors="replace")[-3000:]
    assert done.returncode == 0, errors
    assert output, errors
    statuses: dict[str, int] = json.loads(output[-1])
    return statuses


async def _replacement(world: World, queue: str, agent: Agent) -> TurnResult:
    """A fresh worker runs the turn to its end; a turn re-queued because a never call of the
    dead worker might still be running (``waiting``) is claimed again once its deadline passed."""
    worker = Worker(world, agent, queue=queue, lease=LEASE, crash=None)
    with anyio.fail_after(WAIT * 2):
        while True:
            result = await worker.run_once(wait=WAIT)
            assert result is not None, (
                "the replacement worker got no turn: the lease never ran out?"
            )
            if result.status != "waiting":
                return result


def later() -> float:
    """A clock an hour ahead: every deadline recorded with an intent has passed on it."""
    return time.time() + 3600


async def _interrupt(world: World, journal_effects: Path, session: str, *, happened: bool) -> None:
    """Run the turn until ``act``, then die there as a crash would (in process): before the
    call, or after its side effect. The intent is durable, no outcome is."""
    when: Literal["before_run", "after_run"] = "after_run" if happened else "before_run"
    journal = await Journal.open(world, session, TURN, crash=CrashPoint(3, when, in_process=True))
    with anyio.fail_after(WAIT), pytest.raises(SimulatedCrash):
        await make_agent(journal_effects).run_turn(journal)


class JournalContract(ContractBase):
    """The journal's rules, end to end, on the World under test."""

    contract_area: ClassVar[str] = "journal"

    @pytest.fixture
    def journal_effects(self, tmp_path: Path) -> Path:
        return tmp_path / "effects.log"

    # -- the crash matrix ------------------------------------------------------------------------

    @pytest.mark.world_process
    async def test_journal_crash_matrix(
        self, world: World, world_target: WorldTarget, journal_effects: Path
    ) -> None:
        """Killed before and after every step (a real process each, dying with os._exit at
        CRASH_AT), then continued by a fresh worker: zero model calls repeated for finished
        steps, exactly one side effect, the clean run's reply."""
        clean = Client(world, queue="clean")
        await clean.submit("clean", MESSAGE, turn_id=TURN)
        result = await _replacement(world, "clean", make_agent(journal_effects))
        assert result.reply == REPLY
        steps = [(o["kind"], o["name"]) for o in await _outcomes(world, "clean")]
        assert steps == [
            ("model", "model"),
            ("tool", "lookup"),
            ("model", "model"),
            ("tool", "act"),
            ("model", "model"),
        ]
        jobs = []
        for index, crash_at in enumerate(CRASH_POINTS):
            queue = f"crash-{index}"  # its session has the same name
            await Client(world, queue=queue).submit(queue, MESSAGE, turn_id=TURN)
            jobs.append({"queue": queue, "crash_at": crash_at, "effects": str(journal_effects)})
        statuses = await _crashed_workers(world_target, jobs)
        assert statuses == dict.fromkeys(CRASH_POINTS, 1), "exit status 1: died at CRASH_AT"
        rows: dict[str, tuple[int, int, bool]] = {}

        async def point(index: int, crash_at: str) -> None:
            session = queue = f"crash-{index}"
            outcomes = await _outcomes(world, session)
            finished = {o["digest"] for o in outcomes if o["kind"] == "model"}
            model = ScriptedModel(careful)
            done = await _replacement(world, queue, make_agent(journal_effects, model=model))
            repeated = sum(digest_of(r.model_dump(mode="json")) in finished for r in model.calls)
            rows[crash_at] = (repeated, len(effects(journal_effects, session)), done.reply == REPLY)
            # Teeth: the model steps before the crash (0, 2, 4 are model steps) were journaled,
            # so "repeated" counts against real records, not an empty journal.
            assert len(finished) == len([m for m in (0, 2, 4) if m < int(crash_at[0])]), crash_at

        async with anyio.create_task_group() as tg:
            for index, crash_at in enumerate(CRASH_POINTS):
                tg.start_soon(point, index, crash_at)
        expected = {crash_at: (0, 1, True) for crash_at in CRASH_POINTS}
        assert rows == expected, "crash point: (repeated model calls, side effects, same reply)"

    async def test_journal_replay_with_model_off(self, world: World, journal_effects: Path) -> None:
        """A finished turn replays to the same reply with zero model calls and no writes."""
        client = Client(world, queue="q")
        await client.submit("s", MESSAGE, turn_id=TURN)
        first = await Journal.open(world, "s", TURN)
        reply = await make_agent(journal_effects).run_turn(first)
        tail = await world.log.tail(session_log_id("s"))

        def off(request: ModelRequest) -> ModelReply:
            raise AssertionError("the model was called during replay")

        model = ScriptedModel(off)
        again = await Journal.open(world, "s", TURN)
        assert await make_agent(journal_effects, model=model).run_turn(again) == reply == REPLY
        assert model.calls == []
        assert again.model_calls == 0
        assert again.tool_runs == 0
        assert again.replayed == 5
        assert await world.log.tail(session_log_id("s")) == tail
        assert len(effects(journal_effects, "s")) == 1

    # -- two workers -----------------------------------------------------------------------------

    async def test_journal_two_workers_one_turn(self, world: World, journal_effects: Path) -> None:
        """Lease 2 s, a never tool busy for 4 s after its effect (deadline 6 s), the first
        worker not renewing: the second worker claims the turn when the lease runs out, finds
        the call's deadline ahead and re-queues the turn instead of answering for it; the
        first worker's outcome lands; the turn then finishes with act run once and its real
        result, never the "may or may not have happened" one."""
        client = Client(world, queue="q")
        await client.submit("s", MESSAGE, turn_id=TURN)

        async def slow() -> None:
            await anyio.sleep(4)

        def agent(after_act: Callable[[], Awaitable[None]] | None = None) -> Agent:
            return make_agent(journal_effects, after_act=after_act, act_timeout=6)

        first = Worker(
            world, agent(slow), queue="q", lease=2, heartbeat=False, name="first", crash=None
        )
        second = Worker(world, agent(), queue="q", lease=2, name="second", crash=None)
        results: dict[str, TurnResult | None] = {}

        async def run_first() -> None:
            results["first"] = await first.run_once(wait=0)

        log_id = session_log_id("s")
        with anyio.fail_after(WAIT * 2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_first)
                watch = world.log.watch(log_id)
                async for event in watch:  # the first worker is inside act: its intent is in
                    if event.key == f"turn/{TURN}/step/3/intent":
                        break
                await aclose(watch)
                results["second"] = await second.run_once(wait=WAIT)
            results["third"] = await second.run_once(wait=WAIT)
        first_result, second_result, third = results["first"], results["second"], results["third"]
        assert second_result is not None
        assert second_result.status == "waiting", second_result
        assert second_result.tool_runs == 0
        assert first_result is not None
        assert first_result.status == "lease_lost", first_result  # its ack came too late
        assert third is not None
        assert third.status == "done", third
        assert third.reply == REPLY
        assert (third.model_calls, third.tool_runs) == (0, 0)  # all read back
        act_outcomes = [o for o in await _outcomes(world, "s") if o["step"] == 3]
        assert len(act_outcomes) == 1
        assert act_outcomes[0]["result"] == {"output": "acted"}
        assert len(effects(journal_effects, "s")) == 1
        assert await client.reply("s", TURN) == REPLY

    async def test_journal_two_workers_one_step_key(
        self, world: World, journal_effects: Path
    ) -> None:
        """Two workers that both found a never step empty: the second one's intent is refused
        by the key, it stops without running the tool, and its Journal refuses further steps."""
        await Client(world, queue="q").submit("s", MESSAGE, turn_id=TURN)
        act = make_agent(journal_effects).tools.get("act")
        assert act is not None
        one = await Journal.open(world, "s", TURN)
        two = await Journal.open(world, "s", TURN)
        assert await one.call(act, {"text": "x"}) == "acted"
        with pytest.raises(DuplicateKeyError) as caught:
            await two.call(act, {"text": "x"})
        assert caught.value.key == f"turn/{TURN}/step/0/intent"
        assert len(effects(journal_effects, "s")) == 1
        assert two.tool_runs == 0
        with pytest.raises(WorldError, match="open a new one"):
            two.now()

    # -- the "may or may not have happened" note --------------------------------------------------

    async def test_journal_interrupted_never_tool_checks_state(
        self, world: World, journal_effects: Path
    ) -> None:
        """An interrupted never tool is not run again; the model is told it may have happened.
        20 interrupted turns (half after the side effect, half before): a model that checks
        (calls lookup) before retrying passes all 20; one that retries blindly passes none."""

        async def pass_rate(policy_name: str, runs: int) -> float:
            passed = 0
            for i in range(runs):
                session = f"{policy_name}-{i}"
                await Client(world, queue="q").submit(session, MESSAGE, turn_id=TURN)
                await _interrupt(world, journal_effects, session, happened=i % 2 == 0)
                policy = careful if policy_name == "careful" else careless
                journal = await Journal.open(world, session, TURN, clock=later)
                reply = await make_agent(journal_effects, model=ScriptedModel(policy)).run_turn(
                    journal
                )
                tools = [o["name"] for o in await _outcomes(world, session) if o["kind"] == "tool"]
                assert tools[:2] == ["lookup", "act"]
                checked_first = tools[2:3] == ["lookup"]
                once = len(effects(journal_effects, session)) == 1
                passed += checked_first and once and reply == REPLY
            return passed / runs

        assert await pass_rate("careful", 20) == 1.0
        # The measure has teeth: a model that retries blindly fails it (4 runs say enough).
        assert await pass_rate("careless", 4) == 0.0

    # -- wrong label, code change ----------------------------------------------------------------

    @pytest.mark.world_process
    async def test_journal_wrong_label_duplicates(
        self, world: World, world_target: WorldTarget, journal_effects: Path
    ) -> None:
        """``act`` wrongly labelled safe, crashed after it ran: the replacement runs it again
        and the side effect happens twice (same idempotency key: only an API honouring it
        could drop the second). This is why the label is required."""
        await Client(world, queue="q").submit("s", MESSAGE, turn_id=TURN)
        await _crashed_worker(world_target, "q", journal_effects, "3:after_run", replay="safe")
        done = await _replacement(world, "q", make_agent(journal_effects, act_replay="safe"))
        assert done.reply == REPLY
        keys = effects(journal_effects, "s")
        assert len(keys) == 2
        assert keys[0] == keys[1] == f"s/{TURN}/step-3"

    @pytest.mark.world_process
    async def test_journal_code_change_raises_nondeterminism(
        self, world: World, world_target: WorldTarget, journal_effects: Path
    ) -> None:
        """Crashed before act ran, replayed by changed code (another system prompt): the first
        step already differs, NonDeterminismError shows both sides, nothing is written."""
        await Client(world, queue="q").submit("s", MESSAGE, turn_id=TURN)
        await _crashed_worker(world_target, "q", journal_effects, "3:before_run")
        log_id = session_log_id("s")
        tail = await world.log.tail(log_id)
        changed = make_agent(journal_effects)
        changed.system = "Act once. Check before repeating. (edited after the crash)"
        journal = await Journal.open(world, "s", TURN)
        with pytest.raises(NonDeterminismError) as caught:
            await changed.run_turn(journal)
        error = caught.value
        assert error.position == f"turn {TURN} step 0"
        assert isinstance(error.recorded, dict)
        assert isinstance(error.attempted, dict)
        assert error.recorded["digest"] != error.attempted["digest"]
        assert await world.log.tail(log_id) == tail
        assert effects(journal_effects, "s") == []
