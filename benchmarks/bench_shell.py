"""A shell step's cost against the same script in real bash (not a test).

    uv run python benchmarks/bench_shell.py [--rounds R] [--world NAME] [--url URL] [--json]
                                            [--quick]

For each script (self-contained: it makes its own input files), the median of R rounds of:

* ``bash``: ``/bin/bash -c SCRIPT`` as a subprocess in an empty temporary folder (what an
  agent running a real shell pays: a process, the commands' processes, the files on disk);
* ``engine``: the default :class:`~world_core.workspace.Shell` (bashkit) alone, on an empty
  tree: the interpreter, the copy of the tree in and out;
* ``step``: a whole ``bash`` tool step of a turn (``Journal.call(bash_tool(), ...)`` with
  ``defer_safe=False``): the committed tree read (``context.fs.snapshot()``), the script, the
  changed files stored as blobs and the new tree appended with the outcome, on the World
  (``local`` by default, in a temporary folder).

``overhead`` is ``step - bash``: what journaling the step adds over running the script with
real bash (negative: the step is cheaper than a bash process). Timings on a shared machine
are noisy: compare the columns of one run. About 20 s with the defaults; ``--quick`` runs one
round.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from world_core import Client, Journal, open_world
from world_core.workspace import SHELL_ENVIRONMENT, Tree, bash_tool, default_shell

SCRIPTS: dict[str, str] = {
    "echo": "echo hello > greeting.txt",
    "edit": (
        "printf 'def add(a, b):\\n    return a - b\\n' > lib.py\n"
        "sed -i 's/a - b/a + b/' lib.py && grep -c 'a + b' lib.py"
    ),
    "pipeline": (
        "seq 1 2000 | awk '{print $1 % 37}' > numbers.txt\n"
        "sort -n numbers.txt | uniq -c | sort -rn | head -n 3\nwc -l < numbers.txt"
    ),
    "project": (
        "mkdir -p app/src app/tests docs\n"
        "for i in $(seq 1 20); do printf 'def f%d():\\n    return %d\\n' $i $i > app/src/m$i.py; "
        "done\n"
        'echo \'{"name": "app", "version": 1}\' > app/meta.json\n'
        "jq '.version += 1' app/meta.json > t.json && mv t.json app/meta.json\n"
        "grep -rl 'return 1' app/src | sort > docs/index.txt\n"
        "find app -name '*.py' | wc -l"
    ),
}


def _bash(script: str) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-shell-") as folder:
        env = {**SHELL_ENVIRONMENT, "HOME": folder, "PWD": folder}
        started = time.perf_counter()
        subprocess.run(
            ["/bin/bash", "--norc", "--noprofile", "-c", script],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
            timeout=60,
        )
        return time.perf_counter() - started


async def _engines(rounds: int) -> dict[str, list[float]]:
    """The engine alone, in one event loop (as in a worker: the first call warms it up)."""
    shell = default_shell()
    await shell.run("true", Tree())
    times: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    for _ in range(rounds):
        for name, script in SCRIPTS.items():
            started = time.perf_counter()
            result = await shell.run(script, Tree())
            times[name].append(time.perf_counter() - started)
            assert result.exit_code == 0, result
    return times


async def _steps(world_name: str, url: str | None, rounds: int) -> dict[str, list[float]]:
    bash = bash_tool()
    times: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    async with open_world(world_name, url=url, namespace=f"bench_shell_{time.time_ns()}") as world:
        try:
            client = Client(world, queue="bench")
            for index in range(rounds):
                for name, script in SCRIPTS.items():
                    session = f"{name}-{index}"
                    await client.submit(session, "bench", turn_id="t")
                    journal = await Journal.open(world, session, "t", defer_safe=False)
                    started = time.perf_counter()
                    result = await journal.call(bash, {"script": script})
                    times[name].append(time.perf_counter() - started)
                    assert result["exit_code"] == 0, result
                    await journal.finish("done")
        finally:
            await world.purge()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--world", default="local", help="the World of the step (default local)")
    parser.add_argument("--url", default=None, help="its URL (local: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one round: a smoke run")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    folder = Path(tempfile.mkdtemp(prefix="bench-shell-world-"))
    url = args.url if args.url is not None or args.world != "local" else str(folder / "world")
    try:
        bash_times = {name: [_bash(s) for _ in range(rounds)] for name, s in SCRIPTS.items()}
        engine_times = anyio.run(_engines, rounds)
        step_times = anyio.run(_steps, args.world, url, rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows: list[dict[str, Any]] = []
    for name in SCRIPTS:
        bash_ms = statistics.median(bash_times[name]) * 1000
        engine_ms = statistics.median(engine_times[name]) * 1000
        step_ms = statistics.median(step_times[name]) * 1000
        rows.append(
            {
                "script": name,
                "bash_ms": round(bash_ms, 3),
                "engine_ms": round(engine_ms, 3),
                "step_ms": round(step_ms, 3),
                "overhead_ms": round(step_ms - bash_ms, 3),
                "step_to_bash": round(step_ms / bash_ms, 3),
            }
        )
    engine = default_shell().name
    if args.json:
        report = {"engine": engine, "world": args.world, "rounds": rounds, "rows": rows}
        print(json.dumps(report, indent=2))
        return 0
    print(f"a bash tool step vs real bash; {engine}, World {args.world}, medians of {rounds}")
    print(
        f"{'script':<10}{'bash ms':>10}{'engine ms':>11}{'step ms':>10}{'overhead':>10}"
        f"{'step/bash':>11}"
    )
    for row in rows:
        print(
            f"{row['script']:<10}{row['bash_ms']:>10.2f}{row['engine_ms']:>11.2f}"
            f"{row['step_ms']:>10.2f}{row['overhead_ms']:>10.2f}{row['step_to_bash']:>10.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
