"""The OpenAI Agents SDK agent (``world_examples.openai_agents_agent``) made durable, crashed
before and after every step of its turn, on every backend.

Each crash point runs in a session of its own: a Worker with an in-process crash point
(``SimulatedCrash``: the journal writes nothing more, as if the process died there), then fresh
Workers until the turn has its reply. Per point: model calls repeated for steps the journal
already held (target 0), emails at the real SMTP inbox (target exactly 1), the reply against
the clean run's. The full matrix runs on local; every other backend runs the two points where
a crash costs most (a model call answered and not recorded, an email sent and not recorded).

Approvals: the same agent with ``send_email`` declared ``needs_approval=True`` (the SDK's own
flag). The run stops at the SDK's interruption, the turn suspends in an approval step, the test
approves (or rejects) with ``Client`` from outside, and the run goes on from the SDK's
``RunState``; crashed before and after the approval step and the send, on local and postgres:
the approval is consumed once, the email sent once.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from world_conformance import ContractBase, WorldTarget
from world_core import (
    Client,
    CrashPoint,
    SimulatedCrash,
    TurnResult,
    Worker,
    World,
    session_log_id,
)
from world_core.journal import format_report, read_history, replay_check
from world_examples.inbox import Inbox
from world_examples.openai_agents_agent import MESSAGE, PolicyModel, durable_agent

DONE = "Done: the launch note went to ada@example.com."
STEPS = ["model", "tool lookup_note", "model", "tool send_email", "model"]
LEASE = 1.0
SEND_TIMEOUT = 2.0
ALL_POINTS = [f"{n}:{when}" for n in range(len(STEPS)) for when in ("before_run", "after_run")]
FEW_POINTS = ["2:after_run", "3:after_run"]
TURN_WAIT = 120.0


@pytest.fixture(scope="module")
def inbox() -> Iterator[Inbox]:
    # A folder of its own: pytest's basetemp of this run can be rotated away by other runs.
    with tempfile.TemporaryDirectory() as folder, Inbox(Path(folder) / "inbox") as running:
        saved = {k: os.environ.get(k) for k in ("WORLD_DEMO_SMTP", "WORLD_DEMO_MAILDIR")}
        os.environ["WORLD_DEMO_SMTP"] = f"127.0.0.1:{running.port}"
        os.environ["WORLD_DEMO_MAILDIR"] = str(running.folder)
        try:
            yield running
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


async def _steps(world: World, session: str) -> list[str]:
    found: dict[int, str] = {}
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        if body.get("t") == "outcome":
            kind = body["kind"]
            found[body["step"]] = kind + (f" {body['name']}" if kind != "model" else "")
    return [found[n] for n in sorted(found)]


async def _model_outcomes(world: World, session: str) -> int:
    count = 0
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        count += body.get("t") == "outcome" and body.get("kind") == "model"
    return count


async def _run(
    world: World,
    queue: str,
    model: PolicyModel,
    crash: CrashPoint | None,
    *,
    needs_approval: bool = False,
) -> Any:
    worker = Worker(
        world,
        durable_agent(model, send_timeout=SEND_TIMEOUT, needs_approval=needs_approval),
        queue=queue,
        lease=LEASE,
        crash=crash,
        retry_delay=0.1,
    )
    try:
        return await worker.run_once(wait=SEND_TIMEOUT + 3 * LEASE)
    except BaseException as exc:  # a SimulatedCrash, maybe inside a task group's group
        group = exc if isinstance(exc, BaseExceptionGroup) else BaseExceptionGroup("", [exc])
        if group.subgroup(SimulatedCrash) is None:
            raise
        return "crash"


async def crash_point(world: World, inbox: Inbox, crash_at: str) -> dict[str, Any]:
    """One crash point, in a session of its own: the row the demo prints."""
    step, _, when = crash_at.partition(":")
    session = f"{world.name}-{crash_at.replace(':', '-')}"  # one inbox serves every backend
    queue = f"q-{session}"
    client = Client(world, queue=queue)
    await client.submit(session, MESSAGE, turn_id="t1")
    first = PolicyModel()
    crashed = await _run(
        world,
        queue,
        first,
        # why: the crash moment is a plain str here, one of CrashPoint's two literals
        CrashPoint(int(step), when, in_process=True),  # type: ignore[arg-type]
    )
    finished = first.digests[: await _model_outcomes(world, session)]
    later = PolicyModel()
    reply = None
    results: list[Any] = []
    # Workers until the turn has its reply: after a crash inside send_email it is re-queued
    # until the call's deadline has passed, and under load an attempt may lose its 1 s lease
    # and stop (lease_lost), which a fixed four attempts could run out of. The deadline bounds
    # a turn that never ends.
    with anyio.move_on_after(TURN_WAIT):
        while reply is None:
            results.append(await _run(world, queue, later, None))
            reply = await client.reply(session, "t1")
    return {
        "crash_at": crash_at,
        "session": session,
        "crashed": crashed == "crash",
        "repeated_model_calls": sum(1 for digest in later.digests if digest in finished),
        "effects": len(inbox.messages(session)),
        "reply_matches": reply == DONE,
        "results": [r.status if isinstance(r, TurnResult) else r for r in results],
    }


async def matrix(world: World, inbox: Inbox, points: list[str]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}

    async def one(point: str) -> None:
        rows[point] = await crash_point(world, inbox, point)

    async with anyio.create_task_group() as tg:
        for point in points:
            tg.start_soon(one, point)
    return [rows[point] for point in points]


class _CrashContract(ContractBase):
    """The crash matrix on one backend (``world_name``; ``points``: where to crash)."""

    contract_area = "openai-agents"
    points: ClassVar[list[str]]

    async def test_clean_run_sends_once(self, world: World, inbox: Inbox) -> None:
        session = f"{world.name}-clean"
        client = Client(world, queue="clean")
        await client.submit(session, MESSAGE, turn_id="t1")
        model = PolicyModel()
        result = await _run(world, "clean", model, None)
        assert isinstance(result, TurnResult), result
        assert (result.status, result.reply) == ("done", DONE)
        assert await _steps(world, session) == STEPS
        assert len(model.digests) == 3
        assert len(inbox.messages(session)) == 1

    async def test_crash_matrix(self, world: World, inbox: Inbox) -> None:
        rows = await matrix(world, inbox, self.points)
        for row in rows:
            assert row["crashed"], row
            assert row["repeated_model_calls"] == 0, row
            assert row["effects"] == 1, row
            assert row["reply_matches"], row
        # The histories the crashes left replay to the same reply with the model and every
        # tool switched off (world replay-check), the crashed-and-resumed steps included.
        histories = [await read_history(world, row["session"]) for row in rows]
        report = await replay_check(
            histories, lambda: durable_agent(PolicyModel(), send_timeout=SEND_TIMEOUT)
        )
        assert report.ok, format_report(report)
        assert report.counts()["consistent"] == len(rows), format_report(report)


APPROVAL_STEPS = ["model", "tool lookup_note", "model", "approval send_email", "tool send_email"]
APPROVAL_STEPS += ["model"]


async def _consumed(world: World, session: str) -> list[str]:
    """The senders of the approvals the turn consumed (outcomes of kind approval carrying a
    signal; a retry covered by an earlier approval consumes none)."""
    senders = []
    for event in await world.log.read(session_log_id(session)):
        body = json.loads(event.data)
        signal = (body.get("result") or {}).get("signal")
        outcome = body.get("t") == "outcome" and body.get("kind") == "approval"
        if outcome and isinstance(signal, dict):
            senders.append(str(signal.get("sender")))
    return senders


async def approval_turn(
    world: World, inbox: Inbox, session: str, crashes: list[str], *, approve: bool = True
) -> dict[str, Any]:
    """A turn whose send the SDK asks approval for: workers (the first ones crashing where
    ``crashes`` say) until it ends; whenever it suspends, the test decides from outside."""
    queue = f"q-{session}"
    client = Client(world, queue=queue)
    await client.submit(session, MESSAGE, turn_id="t1")
    pending = list(crashes)
    statuses: list[str] = []
    for _ in range(12):
        crash = None
        if pending:
            step, _, when = pending[0].partition(":")
            # why: the crash moment is a plain str here, one of CrashPoint's two literals
            crash = CrashPoint(int(step), when, in_process=True)  # type: ignore[arg-type]
        result = await _run(world, queue, PolicyModel(), crash, needs_approval=True)
        status = result.status if isinstance(result, TurnResult) else str(result)
        if status == "crash":
            pending.pop(0)
        statuses.append(status)
        if await client.reply(session, "t1") is not None:
            break
        if status == "suspended":
            for waiting in await client.pending_approvals(session):
                assert waiting.tool == "send_email"
                decide = client.approve if approve else client.reject
                await decide(session, "t1", waiting.step, by="tester", reason="checked")
                statuses.append("decided")
    return {
        "statuses": statuses,
        "crashed": not pending,
        "reply": await client.reply(session, "t1"),
        "consumed": await _consumed(world, session),
        "effects": len(inbox.messages(session)),
        "steps": await _steps(world, session),
    }


class _ApprovalContract(ContractBase):
    """The SDK's needs_approval interruptions as world approvals, crashed around."""

    contract_area = "openai-agents"

    async def test_approved_send_runs_once(self, world: World, inbox: Inbox) -> None:
        row = await approval_turn(world, inbox, f"{world.name}-approved", [])
        assert row["statuses"] == ["suspended", "decided", "done"], row
        assert (row["reply"], row["effects"], row["consumed"]) == (DONE, 1, ["tester"]), row
        assert row["steps"] == APPROVAL_STEPS, row

    async def test_rejected_send_does_not_run(self, world: World, inbox: Inbox) -> None:
        row = await approval_turn(world, inbox, f"{world.name}-rejected", [], approve=False)
        assert row["effects"] == 0, row
        assert row["consumed"] == ["tester"], row
        assert row["reply"].startswith("The launch note was not sent to ada@example.com:"), row
        assert "tester rejected this call of send_email" in row["reply"], row

    @pytest.mark.parametrize(
        "crashes",
        [["3:before_run"], ["3:after_run"], ["4:before_run"], ["4:after_run"]],
        ids=lambda c: "+".join(c),
    )
    async def test_crash_around_the_approval(
        self, world: World, inbox: Inbox, crashes: list[str]
    ) -> None:
        session = f"{world.name}-approval-{'-'.join(crashes).replace(':', '-')}"
        row = await approval_turn(world, inbox, session, crashes)
        assert row["crashed"], row
        assert row["consumed"] == ["tester"], row  # asked and consumed once
        assert (row["reply"], row["effects"]) == (DONE, 1), row


class TestLocalApprovals(_ApprovalContract):
    world_name = "local"
    contract_area = "openai-agents"

    async def test_world_approve_from_another_process(
        self, world: World, world_target: WorldTarget, inbox: Inbox
    ) -> None:
        session, queue = "local-cli", "q-local-cli"
        client = Client(world, queue=queue)
        await client.submit(session, MESSAGE, turn_id="t1")
        first = await _run(world, queue, PolicyModel(), None, needs_approval=True)
        assert first.status == "suspended"
        (waiting,) = await client.pending_approvals(session)
        assert waiting.arguments["arguments"]["to"] == "ada@example.com"  # what approvers see
        command = [sys.executable, "-m", "world_core._cli", "approve", session, "t1"]
        command += [str(waiting.step), "--by", "ops", "--queue", queue, "--world", "local"]
        command += ["--url", str(world_target.url), "--namespace", world_target.namespace]
        done = await anyio.run_process(command, check=False)
        assert done.returncode == 0, done.stderr
        second = await _run(world, queue, PolicyModel(), None, needs_approval=True)
        assert (second.status, second.reply) == ("done", DONE)
        assert await _consumed(world, session) == ["ops"]
        assert len(inbox.messages(session)) == 1


class TestPostgresApprovals(_ApprovalContract):
    world_name = "postgres"


class TestLocalCrashes(_CrashContract):
    world_name = "local"
    points = ALL_POINTS


class TestPostgresCrashes(_CrashContract):
    world_name = "postgres"
    points = FEW_POINTS


class TestRedisCrashes(_CrashContract):
    world_name = "redis"
    points = FEW_POINTS


class TestMongoCrashes(_CrashContract):
    world_name = "mongo"
    points = FEW_POINTS


class TestTursoCrashes(_CrashContract):
    world_name = "turso"
    points = FEW_POINTS
