"""replay_check: stored histories replayed against agent code with the model and tools off.

Histories are recorded by real turns on the local World, read back with read_history, and
replayed by the library (the command is tested as real processes in test_cli_replay.py and in
examples/tests). Every verdict of the table in the module docstring has a test here.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from world_core import (
    Agent,
    Client,
    CrashPoint,
    Journal,
    ModelReply,
    ModelRequest,
    Replay,
    ScriptedModel,
    SimulatedCrash,
    ToolCall,
    ToolRegistry,
    TurnSuspended,
    World,
    format_report,
    open_world,
    read_history,
    replay_check,
    tool,
)
from world_core.errors import ConfigurationError, ModelReplyError, ToolError
from world_core.journal import ReplayReport, TurnCheck

pytestmark = pytest.mark.anyio

SESSION = "s"

# The agent: its scripted model looks a topic up (lookup, safe), sends it (send, never), and
# answers with what send said. RAN counts each tool body that runs: a replay must run none.

RAN: Counter[str] = Counter()
"""Tool bodies run in this process, by tool name."""

NOTE = "The launch is on Thursday. " * 40
"""``lookup``'s result: over 1 KiB."""


def lookup(topic: str) -> str:
    """Look a topic up."""
    RAN["lookup"] += 1
    return NOTE


def send(text: str) -> str:
    """Send a text (a side effect: never run twice)."""
    RAN["send"] += 1
    return f"sent {len(text)} characters"


def policy(request: ModelRequest) -> ModelReply:
    results = [m for m in request.messages if m["role"] == "tool"]
    if not results:
        return ModelReply(
            tool_calls=[ToolCall(id="c0", name="lookup", arguments=json.dumps({"topic": "x"}))]
        )
    if len(results) == 1:
        text = json.dumps({"text": results[0]["content"][:50]})
        return ModelReply(tool_calls=[ToolCall(id="c1", name="send", arguments=text)])
    return ModelReply(content=f"done: {results[-1]['content']}")


def build(system: str = "You help.") -> Agent:
    return Agent(
        model=ScriptedModel(policy),
        tools=[tool(lookup, replay="safe"), tool(send, replay="never")],
        system=system,
    )


def reworded() -> Agent:
    """The same agent with another system prompt."""
    return build("You help, briefly.")


class _Upper:
    """A Journal whose ``finish`` records the reply in capitals."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)

    async def finish(self, reply: str) -> str:
        return await self._journal.finish(reply.upper())


class Louder(Agent):
    """The same steps, another reply (in capitals)."""

    async def run_turn(self, journal: Journal) -> str:
        return await super().run_turn(cast(Journal, _Upper(journal)))


def louder() -> Agent:
    base = build()
    return Louder(model=base.model, tools=base.tools, system=base.system)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="replay") as opened:
        yield opened


async def _run(world: World, turn: str = "t1", agent: Agent | None = None, **options: Any) -> Any:
    """Run the turn live; its reply, or the exception that ended it."""
    journal = await Journal.open(world, SESSION, turn, **options)
    try:
        return await (agent if agent is not None else build()).run_turn(journal)
    except (Exception, SimulatedCrash, TurnSuspended) as exc:
        return exc


async def _submit(world: World, *turns: str) -> None:
    for turn in turns:
        await Client(world).submit(SESSION, f"message of {turn}", turn_id=turn)


async def _report(world: World, factory: Callable[[], Any] = build, **options: Any) -> ReplayReport:
    RAN.clear()
    report = await replay_check([await read_history(world, SESSION)], factory, **options)
    assert RAN == {}, "a tool body ran during the replay"
    return report


async def _check(world: World, factory: Callable[[], Any] = build, **options: Any) -> TurnCheck:
    report = await _report(world, factory, **options)
    return report.sessions[0].turns[0]


async def test_a_finished_turn_replays_to_its_reply_calling_nothing(world: World) -> None:
    await _submit(world, "t1", "t2")
    assert await _run(world, "t1") == "done: sent 50 characters"
    assert await _run(world, "t2") == "done: sent 50 characters"
    agents: list[Agent] = []

    def factory() -> Agent:
        agents.append(build())
        return agents[-1]

    report = await _report(world, factory)
    assert report.ok
    assert [(t.turn_id, t.status) for t in report.turns()] == [
        ("t1", "consistent"),
        ("t2", "consistent"),
    ]
    first = report.turns()[0]
    assert (first.recorded_steps, first.replayed_steps, first.history_end) == (5, 5, "reply")
    assert first.detail == "replayed 5 steps to the recorded reply"
    assert len(agents) == 2  # one agent per turn, as a Worker makes them
    assert all(cast(ScriptedModel, agent.model).calls == [] for agent in agents)
    table = format_report(report)
    assert "turn t1  consistent  replayed 5 steps to the recorded reply" in table
    assert table.endswith(
        "replay-check ok: 2 turns in 1 session: 2 consistent, 0 prefix ok, 0 diverged, 0 skipped"
    )
    assert report.as_json()["counts"] == {
        "sessions": 1,
        "consistent": 2,
        "prefix": 0,
        "diverged": 0,
        "skipped": 0,
    }


async def test_another_system_prompt_diverges_at_step_0(world: World) -> None:
    await _submit(world, "t1")
    await _run(world)
    check = await _check(world, reworded)
    assert (check.status, check.step) == ("diverged", 0)
    assert "message 0 (system) field 'content' differs; now: \"You help, briefly.\"" in check.detail
    assert not check.detail.startswith("turn 't1'")  # the table says which turn and step


async def test_another_reply_diverges_at_the_reply(world: World) -> None:
    await _submit(world, "t1")
    await _run(world)
    report = await _report(world, louder)
    check = report.turns()[0]
    assert (check.status, check.step) == ("diverged", None)
    assert "recorded the reply 'done: sent 50 characters' but this run produced 'DONE: SENT" in (
        check.detail
    )
    assert "DIVERGED    at the reply:" in format_report(report)
    assert not report.ok


async def test_an_open_turn_is_a_prefix_up_to_its_interrupted_never_call(world: World) -> None:
    await _submit(world, "t1", "t2")
    crash = CrashPoint(3, "before_run", in_process=True)
    assert isinstance(await _run(world, crash=crash), SimulatedCrash)
    report = await _report(world)
    assert report.ok
    first, second = report.turns()
    assert (first.status, first.step, first.recorded_steps, first.history_end) == (
        "prefix",
        3,
        4,
        "open",
    )
    assert first.detail.startswith("up to step 3 (4 recorded), then: tool send was interrupted")
    assert (second.status, second.detail) == (
        "skipped",
        "waits for turn t1, which has not ended in this history",
    )


async def test_a_safe_tool_past_the_history_is_not_run(world: World) -> None:
    # Killed before the second model call: lookup's outcome (deferred) was lost with the
    # process, so the history holds step 0 only, and lookup is the next step: switched off.
    await _submit(world, "t1")
    assert isinstance(
        await _run(world, crash=CrashPoint(2, "before_run", in_process=True)), SimulatedCrash
    )
    check = await _check(world)
    assert (check.status, check.step, check.recorded_steps) == ("prefix", 1, 1)
    assert check.detail == "up to step 0 (1 recorded), then: the code would call tool lookup (safe)"


async def test_a_model_call_past_the_history_is_not_made(world: World) -> None:
    await _submit(world, "t1")
    crash = CrashPoint(2, "before_run", in_process=True)
    assert isinstance(await _run(world, crash=crash, defer_safe=False), SimulatedCrash)
    check = await _check(world)
    assert (check.status, check.step) == ("prefix", 2)
    assert check.detail == "up to step 1 (2 recorded), then: the code would call the model"


class _Sleeper(Agent):
    async def run_turn(self, journal: Journal) -> str:
        await journal.sleep(3600)
        return await journal.finish("slept")


def _sleeper() -> Agent:
    return _Sleeper(model=ScriptedModel(lambda request: ModelReply(content="-")))


async def test_an_open_wait_is_where_the_prefix_ends(world: World) -> None:
    await _submit(world, "t1")
    assert isinstance(await _run(world, agent=_sleeper()), TurnSuspended)
    check = await _check(world, _sleeper)
    assert (check.status, check.step) == ("prefix", 0)
    assert "the timer wait (sleep), open in the history, would end" in check.detail


class _Garbled:
    async def complete(self, request: ModelRequest) -> ModelReply:
        raise ModelReplyError("not a chat completion", raw="<html>")


async def _fail(world: World, turn: str, error: BaseException) -> None:
    journal = await Journal.open(world, SESSION, turn)
    assert await journal.fail(error)


async def test_a_failure_the_journal_replays_is_consistent(world: World) -> None:
    await _submit(world, "t1")
    garbled = Agent(model=_Garbled(), tools=build().tools, system=build().system)
    error = await _run(world, agent=garbled)
    assert isinstance(error, ModelReplyError)
    await _fail(world, "t1", error)
    check = await _check(world)  # the model is off: the unusable reply comes from the journal
    assert (check.status, check.history_end) == ("consistent", "failure")
    assert check.detail.startswith("fails again as recorded: ModelReplyError: turn 't1' step 0")


def _broken(topic: str) -> str:
    """Always fails."""
    raise RuntimeError("the notes service is down")


class _Strict(Agent):
    def __init__(self, replay: Replay) -> None:
        super().__init__(model=ScriptedModel(lambda request: ModelReply(content="-")))
        self.broken = tool(_broken, replay=replay)

    async def run_turn(self, journal: Journal) -> str:
        note = await journal.call(self.broken, {"topic": "x"})
        return await journal.finish(str(note))


class _Lenient(_Strict):
    """Handles the tool's error now, and asks the model instead."""

    async def run_turn(self, journal: Journal) -> str:
        try:
            note = await journal.call(self.broken, {"topic": "x"})
        except ToolError:
            note = "no note"
        request = ModelRequest(messages=[{"role": "user", "content": str(note)}])
        reply = await journal.model(self.model, request)
        return await journal.finish(reply.content or "")


async def test_a_recorded_tool_error_the_code_now_handles_diverges(world: World) -> None:
    # A never tool's error is its recorded outcome: a replay raises it again.
    await _submit(world, "t1")
    error = await _run(world, agent=_Strict("never"))
    assert isinstance(error, ToolError)
    await _fail(world, "t1", error)
    same = await _check(world, lambda: _Strict("never"))
    assert (same.status, same.step) == ("consistent", None)
    assert same.detail.startswith("fails again as recorded at step 0: ToolError")
    changed = await _check(world, lambda: _Lenient("never"))
    assert (changed.status, changed.step) == ("diverged", 1)
    assert changed.detail.startswith("the recorded failure (ToolError: ")
    assert changed.detail.endswith("is not raised again: the code would call the model")


async def test_a_safe_tool_error_kept_only_as_the_failure_is_consistent(world: World) -> None:
    # A safe tool's outcome is deferred, and the failure record does not carry it: the
    # history holds the failure at step 0 and nothing of the call. The replay stops there.
    await _submit(world, "t1")
    journal = await Journal.open(world, SESSION, "t1")
    with pytest.raises(ToolError) as caught:
        await _Strict("safe").run_turn(journal)
    assert await journal.fail(caught.value)
    check = await _check(world, lambda: _Strict("safe"))
    assert (check.status, check.recorded_steps) == ("consistent", 0)
    assert check.detail.endswith(
        "then: the code would call tool _broken (safe), which a replay does not do"
    )
    changed = await _check(world, lambda: _Lenient("safe"))
    assert changed.status == "consistent"  # the same stop: nothing tells them apart


async def test_a_failure_beyond_the_recorded_steps_is_consistent(world: World) -> None:
    # Steps 0 and 1 recorded, then the model call of step 2 failed (its API was down until
    # the worker's last attempt): nothing of it is in the journal, only the failure.
    await _submit(world, "t1")
    crash = CrashPoint(2, "before_run", in_process=True)
    assert isinstance(await _run(world, crash=crash, defer_safe=False), SimulatedCrash)
    await _fail(world, "t1", ConnectionError("the model API is down"))
    check = await _check(world)
    assert (check.status, check.history_end) == ("consistent", "failure")
    assert check.detail == (
        "replayed 2 steps to where the recorded failure (ConnectionError: the model API is "
        "down) happened, then: the code would call the model, which a replay does not do"
    )
    # The code failing otherwise on the same history is a divergence.
    other = await _check(world, _bug)
    assert other.status == "diverged"


class _Bug(Agent):
    """Makes the first model call, then raises."""

    async def run_turn(self, journal: Journal) -> str:
        request = ModelRequest(messages=self.conversation(journal), tools=self.tools.schemas())
        await journal.model(self.model, request)
        raise ValueError("a bug")


def _bug() -> Agent:
    base = build()
    return _Bug(model=base.model, tools=base.tools, system=base.system)


async def test_an_error_before_the_recorded_steps_end_diverges(world: World) -> None:
    await _submit(world, "t1", "t2")
    assert await _run(world, "t1") is not None
    crash = CrashPoint(3, "before_run", in_process=True)
    assert isinstance(await _run(world, "t2", crash=crash), SimulatedCrash)
    finished, open_turn = (await _report(world, _bug)).turns()
    assert (finished.status, finished.step) == ("diverged", 1)
    assert finished.detail == (
        "the code raises ValueError: a bug; the history finished with a reply"
    )
    assert (open_turn.status, open_turn.step) == ("diverged", 1)
    assert open_turn.detail == (
        "the code raises ValueError: a bug at step 1, but the history goes on to step 3"
    )


class _Hanging(Agent):
    async def run_turn(self, journal: Journal) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_replay_that_does_not_end_diverges(world: World) -> None:
    await _submit(world, "t1")
    await _run(world)
    check = await _check(
        world, lambda: _Hanging(model=ScriptedModel(lambda r: ModelReply())), turn_timeout=0.2
    )
    assert check.status == "diverged"
    assert check.detail.startswith("the replay did not end within 0.2 s")


async def test_the_agent_factory_must_make_an_agent(world: World) -> None:
    await _submit(world, "t1")
    await _run(world)
    history = [await read_history(world, SESSION)]

    def broken() -> Agent:
        raise KeyError("OPENAI_API_KEY")

    with pytest.raises(ConfigurationError, match="the agent factory 'broken' raised KeyError"):
        await replay_check(history, broken)
    with pytest.raises(ConfigurationError, match="returned object, which has no run_turn"):
        await replay_check(history, object)


async def test_a_subclass_and_a_journal_wrapper_are_replayed_too(world: World) -> None:
    # The switch is in the journal, not the agent: any agent code going through it is covered.
    await _submit(world, "t1")
    await _run(world, agent=louder())
    check = await _check(world, louder)
    assert check.status == "consistent"
    assert isinstance(louder(), Louder)
    assert isinstance(build().tools, ToolRegistry)
