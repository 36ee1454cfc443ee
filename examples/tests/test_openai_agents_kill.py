"""An OpenAI Agents SDK turn whose worker process is killed (SIGKILL, from outside) in the
middle of a ``never`` tool call, two of which the model asked for in one reply, and resumed by
another process: the finished call is read back, the cut-off one is not run again (the model
is told it may have happened), and no finished model call is paid for twice.

This file is also the worker: ``python test_openai_agents_kill.py SESSION FOLDER FIRST`` runs
the turn on the local World in ``WORKFLOW_LOCAL_DIR``; ``FIRST=1`` submits it, and its second
refund blocks (after its effect) until the process is killed. Each process appends what it
does to files in ``FOLDER``: ``model_calls`` (pid and how many tool results the call saw),
``refunds`` (pid and order), ``blocked``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from world_core import POSSIBLY_RAN

SEND_TIMEOUT = 2.0


def _worker(session: str, folder: Path, first: bool) -> None:
    import anyio
    from agents import Agent, Model, ModelResponse, Usage, function_tool, set_tracing_disabled
    from agents.items import TResponseOutputItem
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from world_core import Client, Worker, open_world
    from world_core.integrations.openai_agents import DurableAgent

    set_tracing_disabled(True)

    def note(name: str, line: str) -> None:
        with (folder / name).open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    @function_tool
    async def refund(order: str) -> str:
        """Refund an order.

        Args:
            order: the order id.
        """
        note("refunds", f"{os.getpid()} {order}")
        if first and order == "b":
            note("blocked", "b")
            await anyio.sleep(3600)  # killed here, after the effect
        return f"refunded {order}"

    class TwoRefunds(Model):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            outputs = [i["output"] for i in args[1] if i.get("type") == "function_call_output"]
            note("model_calls", f"{os.getpid()} {len(outputs)}")
            output: list[TResponseOutputItem]
            if outputs:
                text = ResponseOutputText(
                    type="output_text", text=json.dumps(outputs), annotations=[]
                )
                output = [
                    ResponseOutputMessage(
                        type="message", id="m", role="assistant", status="completed", content=[text]
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        id=f"fc_{order}",
                        call_id=f"c_{order}",
                        name="refund",
                        arguments=json.dumps({"order": order}),
                    )
                    for order in ("a", "b")
                ]
            return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    durable = DurableAgent(
        Agent(name="refunds", model=TwoRefunds(), tools=[refund]),
        replay={"refund": "never"},
        timeouts={"refund": SEND_TIMEOUT},
    )

    async def main() -> None:
        async with open_world("local") as world:
            client = Client(world, queue=f"q-{session}")
            if first:
                await client.submit(session, "refund a and b", turn_id="t1")
            for _ in range(10):  # the killed lease runs out, then the cut-off call's deadline
                worker = Worker(
                    world, durable, queue=f"q-{session}", crash=None, lease=1.0, retry_delay=0.1
                )
                result = await worker.run_once(wait=SEND_TIMEOUT + 3)
                if result is not None and result.status in ("done", "failed"):
                    break
            note("reply", json.dumps(await client.reply(session, "t1")))

    anyio.run(main)


def _lines(folder: Path, name: str) -> list[list[str]]:
    path = folder / name
    return [line.split(" ") for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(240)
def test_a_worker_killed_inside_a_parallel_never_call_is_resumed_elsewhere(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    environment["WORKFLOW_LOCAL_DIR"] = str(tmp_path / "world")

    def start(first: bool) -> subprocess.Popen[bytes]:
        command = [sys.executable, __file__, "kill-1", str(folder), "1" if first else "0"]
        return subprocess.Popen(command, env=environment)

    killed = start(first=True)
    give_up = time.monotonic() + 120
    while not (folder / "blocked").exists():
        assert killed.poll() is None, "the first worker ended before its second refund"
        assert time.monotonic() < give_up, "the first worker never reached its second refund"
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    second = start(first=False)
    assert second.wait(timeout=180) == 0

    first_pid, second_pid = str(killed.pid), str(second.pid)
    assert _lines(folder, "refunds") == [[first_pid, "a"], [first_pid, "b"]]  # each once
    # The first reply was recorded before the kill: the second process reads it back and only
    # pays for the call that sees both results.
    assert _lines(folder, "model_calls") == [[first_pid, "0"], [second_pid, "2"]]
    (reply,) = (folder / "reply").read_text().splitlines()
    assert json.loads(json.loads(reply)) == ["refunded a", POSSIBLY_RAN]


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1")
