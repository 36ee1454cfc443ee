"""``world demo langgraph`` as a user runs it: a LangGraph agent crashed (``os._exit``) at
every super-step in processes of its own and resumed from the World in fresh ones, with
world's ``durable_tool`` and with LangGraph's resume alone; the report read back as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

COMMAND = [sys.executable, "-m", "world_core._cli", "demo", "langgraph"]
STEPS = [
    "agent (model)",
    "tools lookup_note",
    "agent (model)",
    "tools send_email",
    "agent (model)",
]
DONE = "Done: the launch note went to ada@example.com."


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


@pytest.mark.timeout(240)
def test_world_demo_langgraph_json_meets_every_target(tmp_path: Path) -> None:
    result = _demo("--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["demo"] == "langgraph"
    assert report["world"] == "local"
    assert report["targets_met"] is True
    assert report["steps"] == STEPS
    assert report["clean_reply"] == DONE
    points: list[dict[str, Any]] = report["crash_points"]
    expected = [f"{n}:{w}" for n in range(1, 6) for w in ("before_run", "after_run", "before_save")]
    assert [p["crash_at"] for p in points] == expected
    for point in points:
        # With world: every process really died, nothing paid twice, one email, same reply.
        assert point["crashed"] is True, point
        assert point["repeated_model_calls"] == 0, point
        assert point["effects"] == 1, point
        assert point["reply_matches"] is True, point
        assert point["langgraph_alone"]["crashed"] is True, point
    by_point = {p["crash_at"]: p for p in points}
    # A send cut off before or after it ran: never sent again blindly; the model was told it
    # may have happened and checked the inbox, which answered truthfully.
    assert by_point["4:before_run"]["told_possibly_ran"] is True
    assert by_point["4:before_run"]["checked_sent"] == "no: nothing delivered"
    assert by_point["4:after_run"]["told_possibly_ran"] is True
    assert by_point["4:after_run"]["checked_sent"] == "yes: 1 delivered"
    # LangGraph's own resume re-runs the cut-off super-step: the email goes out twice when the
    # crash falls after the send and before the checkpoint, and a reply the graph had already
    # received is paid for again when the crash falls before the model node's writes are saved.
    alone = {p["crash_at"]: p["langgraph_alone"] for p in points}
    assert alone["4:after_run"]["effects"] == 2
    assert alone["4:before_save"]["effects"] == 2
    assert report["langgraph_alone_duplicates"] == ["4:after_run", "4:before_save"]
    for step in (1, 3, 5):
        assert alone[f"{step}:before_save"]["repeated_model_calls"] == 1
    assert report["langgraph_alone_repeated_model_calls"] == [
        "1:before_save",
        "3:before_save",
        "5:before_save",
    ]
    assert "done in" in result.stderr
