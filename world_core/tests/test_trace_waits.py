"""The trace of a turn that waits: a timer and a signal inline, each suspension and its resume."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from world_core import Client, Journal, SimulatedCrash, Worker, open_world
from world_core.observe import build_trace, trace_session


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Worker's code is the same on both; one run keeps CI short


class _Waiter:
    """Sleeps a moment, then waits for the signal ``go`` and answers with its payload."""

    async def run_turn(self, journal: Journal) -> str:
        await journal.sleep(0.2)
        signal = await journal.wait_for_signal("go", timeout=60)
        payload = signal.payload if signal is not None else None
        return await journal.finish(f"went with {payload!r}")


@pytest.mark.anyio
async def test_waits_show_inline_with_each_suspension_and_resume(tmp_path: Path) -> None:
    async with open_world("local", url=str(tmp_path), namespace="waits") as world:
        client = Client(world, queue="waits")
        await client.submit("w", "wait please", turn_id="t1")
        worker = Worker(world, _Waiter(), queue="waits", lease=5.0, name="w1", crash=None)
        with anyio.fail_after(60):
            while await client.status("w", "t1") != "waiting" or not (
                await world.log.get("session/w", "turn/t1/step/1/intent")
            ):
                await worker.run_once(wait=5)
        waiting = await trace_session(world, "w")
        (turn,) = waiting.turns
        assert waiting.status == turn.status == "waiting"
        timer, signal = turn.steps
        assert (timer.kind, timer.status) == ("timer", "done")
        assert timer.wait == {"signal": None, "for_turn": None, "result": {"fired": True}}
        assert (signal.kind, signal.name, signal.status) == ("signal", "go", "waiting")
        assert signal.deadline is not None
        assert signal.wait is not None
        assert signal.wait["signal"] == "go"
        # Suspended in the timer (step 0), resumed there by its wake-up; suspended in the
        # signal's wait (step 1), not resumed yet.
        assert [s.reason for s in turn.stops] == ["suspended", "suspended"]
        assert [s.step for s in turn.stops] == [0, 1]
        assert [s.resumed_step for s in turn.stops] == [0, None]
        assert turn.stops[1].resumed_run is None
        assert turn.runs[-1].ended == "suspended"

        await client.signal("w", "go", {"token": "s3cr3t", "n": 1}, sender="test")
        with anyio.fail_after(60):
            while await client.reply("w", "t1") is None:
                await worker.run_once(wait=5)
        done = await trace_session(world, "w")
        (turn,) = done.turns
        assert turn.status == "done"
        assert [s.status for s in turn.steps] == ["done", "done"]
        assert [s.reason for s in turn.stops] == ["suspended", "suspended"]
        assert [s.at_step for s in turn.stops] == ["wait", "wait"]
        assert [s.resumed_step for s in turn.stops] == [0, 1]  # each wait's outcome: the waker's
        assert len(turn.runs) == 3
        assert [r.worker for r in turn.runs] == ["w1", "w1", "w1"]
        assert len({r.message for r in turn.runs}) == 3  # each wake-up is a message of its own
        result = turn.steps[1].wait
        assert result is not None
        assert result["result"]["signal"]["sender"] == "test"
        assert "payload" not in result["result"]["signal"]  # content: hidden by default
        shown = await trace_session(world, "w", content=True)
        payload = shown.turns[0].steps[1].wait
        assert payload is not None
        assert payload["result"]["signal"]["payload"] == {"token": "***", "n": 1}
        # The same trace from the events alone (an exported history, say).
        events = await world.log.read("session/w")
        assert build_trace("w", events).turns[0].stops == turn.stops


@pytest.mark.anyio
async def test_a_failed_turn_shows_its_failure_with_secrets_masked(tmp_path: Path) -> None:
    from world_core._cli_observe import format_trace

    async with open_world("local", url=str(tmp_path), namespace="fail") as world:
        await Client(world).submit("f", "go", turn_id="t1")
        journal = await Journal.open(world, "f", "t1")
        await journal.fail(RuntimeError("db postgresql://app:hunter2@db:5432/x is down"))
        trace = await trace_session(world, "f")
    (turn,) = trace.turns
    assert trace.status == turn.status == "failed"
    assert turn.failure is not None
    assert turn.failure["error_type"] == "RuntimeError"
    assert turn.failure["error"] == "db postgresql://app:***@db:5432/x is down"
    text = format_trace(trace)
    assert "failed: RuntimeError: db postgresql://app:***@db" in text
    assert "hunter2" not in text + trace.model_dump_json()


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from world_core._cli_observe import _colour_wanted

    leader, follower = os.openpty()
    with open(follower, "w") as terminal, open(os.devnull, "w") as plain:
        monkeypatch.delenv("NO_COLOR", raising=False)
        assert _colour_wanted(terminal) is True
        assert _colour_wanted(plain) is False
        monkeypatch.setenv("NO_COLOR", "1")
        assert _colour_wanted(terminal) is False
    os.close(leader)


class _DiesAfterItsWakeUp:
    """Sleeps a moment; the run its wake-up starts dies right after the timer's outcome, once."""

    def __init__(self) -> None:
        self.died = False

    async def run_turn(self, journal: Journal) -> str:
        await journal.sleep(0.2)
        if not self.died:
            self.died = True
            raise SimulatedCrash("the worker dies after recording the timer's outcome")
        return await journal.finish("woke")


@pytest.mark.anyio
async def test_a_run_that_dies_after_resuming_a_wait_is_a_stop_not_a_suspension(
    tmp_path: Path,
) -> None:
    from world_core._cli_observe import format_trace

    async with open_world("local", url=str(tmp_path), namespace="waits") as world:
        client = Client(world, queue="waits")
        await client.submit("w", "wait please", turn_id="t1")
        agent = _DiesAfterItsWakeUp()
        worker = Worker(world, agent, queue="waits", lease=1.0, name="w1", crash=None)
        with anyio.fail_after(60):
            while not agent.died:
                try:
                    await worker.run_once(wait=5)
                except* SimulatedCrash:
                    pass  # the run dies: its message is delivered again after its lease
            while await client.reply("w", "t1") is None:
                await worker.run_once(wait=5)
        trace = await trace_session(world, "w")
    (turn,) = trace.turns
    # Run 1 suspended the turn in the timer; run 2 (the wake-up) recorded the timer's outcome
    # and died; run 3 (the wake-up's redelivery) finished it.
    assert [r.ended for r in turn.runs] == ["suspended", "stopped", "finished"]
    assert [(s.reason, s.step, s.at_step) for s in turn.stops] == [
        ("suspended", 0, "wait"),
        ("stopped", 0, "after_outcome"),
    ]
    text = format_trace(trace)
    assert text.count("SUSPENDED") == 1, text
