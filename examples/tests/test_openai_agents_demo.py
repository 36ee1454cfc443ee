"""``world demo openai-agents`` as a user runs it: real worker processes (each killed at its
crash point with ``os._exit``), a real SMTP inbox, the report read back as JSON.

Every worker process imports the OpenAI Agents SDK (about 3 s of CPU), so this runs two crash
points (``WORLD_DEMO_CRASH_POINTS``): a model call answered and not recorded, an email sent and
not recorded. The whole matrix (every step, before and after) runs in-process, on every
backend, in ``test_openai_agents_crashes.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMAND = [sys.executable, "-m", "world_core._cli"]
STEPS = ["model", "tool lookup_note", "model", "tool send_email", "model"]
DONE = "Done: the launch note went to ada@example.com."


def _demo(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    environment.update(env)
    return subprocess.run(
        [*COMMAND, "demo", "openai-agents", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


@pytest.mark.timeout(300)
def test_world_demo_openai_agents_json_meets_every_target(tmp_path: Path) -> None:
    points = "2:after_run,3:after_run"
    result = _demo("--json", cwd=tmp_path, WORLD_DEMO_CRASH_POINTS=points)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["demo"], report["world"]) == ("openai-agents", "local")
    assert report["steps"] == STEPS
    assert report["clean_reply"] == DONE
    assert report["targets_met"] is True
    rows = report["crash_points"]
    assert [row["crash_at"] for row in rows] == points.split(",")
    for row in rows:
        assert row["crashed"] is True, row
        assert row["repeated_model_calls"] == 0, row
        assert row["effects"] == 1, row
        assert row["reply_matches"] is True, row
    # The model call answered before 2:after_run was lost with the process: paid once more,
    # but no call whose reply the journal held was repeated.
    assert rows[0]["finished_model_steps"] == 1
    assert rows[1]["told_possibly_ran"] is True  # the send may have happened: checked first
    wrong = report["relabelled"]
    assert (wrong["send_email_replay"], wrong["effects"]) == ("safe", 2)
    assert list(tmp_path.iterdir()) == []  # nothing left in the working folder


def test_a_bad_crash_point_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = _demo(cwd=tmp_path, WORLD_DEMO_CRASH_POINTS="2:after_run,later")
    assert result.returncode != 0
    said = result.stderr + result.stdout
    assert "WORLD_DEMO_CRASH_POINTS" in said
    assert "'later' is not a crash point" in said
    assert "The clean turn" not in said  # refused before the clean turn ran
