"""``world demo workspace`` as a user runs it: real worker processes crashed at every step,
the report read back as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_core import ModelRequest
from world_core.workspace import Tree, default_shell
from world_examples.workspace_demo import MESSAGE, SCRIPTS, STEPS, policy

COMMAND = [sys.executable, "-m", "world_core._cli"]
POINTS = [f"{n}:{when}" for n in range(len(STEPS)) for when in ("before_run", "after_run")]
REPLY = 'Done (exit 0): report {"open":2,"fixed":true}; left: buy milk,pay rent.'
FILES = ["TODO.md", "report.json", "src/calc.py"]


@pytest.mark.timeout(240)
def test_world_demo_workspace_json_meets_every_target(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    result = subprocess.run(
        [*COMMAND, "demo", "workspace", "--json"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["demo"] == "workspace"
    assert report["world"] == "local"
    assert report["targets_met"] is True
    assert report["steps"] == STEPS
    assert report["clean_reply"] == REPLY
    assert report["clean_tree"]["files"] == FILES
    points: list[dict[str, Any]] = report["crash_points"]
    assert [p["crash_at"] for p in points] == POINTS
    for point in points:
        assert point["crashed"] is True, point
        assert point["tree_matches"] is True, point
        assert point["repeated_model_calls"] == 0, point
        assert point["reply_matches"] is True, point
        assert point["files"] == FILES, point
        assert point["workers"] == ["crash", "done"], point
        # Teeth: the model steps that finished before the crash (0, 2, 4, 6) were journaled,
        # so 0 repeated calls is counted against real records.
        step = int(point["crash_at"].split(":")[0])
        assert point["finished_model_steps"] == len([m for m in (0, 2, 4, 6) if m < step]), point


def test_the_scripts_do_what_the_reply_says() -> None:
    """The demo's scripts, run one after another by the shell: the clean run's files."""

    async def run_all() -> Tree:
        tree = Tree()
        for script in SCRIPTS:
            result = await default_shell().run(script, tree)
            assert result.exit_code == 0, result
            tree = result.tree
        return tree

    tree = anyio.run(run_all)
    assert sorted(tree.files) == FILES
    assert tree.files["report.json"] == b'{\n  "open": 2,\n  "fixed": true\n}\n'
    assert tree.modes == {"src/calc.py": 0o755}
    request = ModelRequest(messages=[{"role": "user", "content": MESSAGE}])
    first = policy(request).tool_calls[0]
    assert json.loads(first.arguments) == {"script": SCRIPTS[0]}
