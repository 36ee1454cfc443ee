"""Run every benchmark once with ``--quick``: a smoke run that keeps the scripts alive (not a test
of speed).

    .ci/with-servers uv run --group bench python benchmarks/smoke.py [--only NAME,...] [--json]

Each ``benchmarks/bench_*.py`` and ``chaos_journal.py`` runs in a process of its own with
``--quick`` (and ``--json`` where it has it), under a deadline (``--deadline``, 300 s each).
A script passes when it exits 0 and its standard output ends with one JSON object or list that
is not empty: the shape every benchmark promises. Timings are printed, never judged: the
machines are shared and noisy. Exits 1 when any script fails, with its last lines of output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def scripts() -> list[Path]:
    """Every benchmark script: ``bench_*.py`` and the chaos run."""
    found = sorted(HERE.glob("bench_*.py"))
    chaos = HERE / "chaos_journal.py"
    return [*found, chaos] if chaos.exists() else found


def last_json(text: str) -> Any:
    """The JSON value the output ends with (one line, or indented over many), or None."""
    lines = text.rstrip().splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].lstrip().startswith(("{", "[")) and not lines[start].startswith(" "):
            try:
                return json.loads("\n".join(lines[start:]))
            except json.JSONDecodeError:
                continue
    return None


def _help(script: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    return done.stdout


def run_one(script: Path, deadline: float) -> dict[str, Any]:
    """Run ``script --quick [--json]``; the row of the summary."""
    usage = _help(script)
    argv = [sys.executable, str(script)]
    for flag in ("--quick", "--json"):
        if flag in usage:
            argv.append(flag)
    started = time.monotonic()
    row: dict[str, Any] = {"script": script.name, "argv": argv[2:]}
    if "--quick" not in usage:
        return {**row, "ok": False, "seconds": 0.0, "why": "has no --quick option"}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=deadline, env=os.environ.copy()
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-2000:]
        text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {
            **row,
            "ok": False,
            "seconds": deadline,
            "why": f"over {deadline:.0f} s",
            "tail": text,
        }
    seconds = round(time.monotonic() - started, 1)
    value = last_json(done.stdout)
    if done.returncode != 0:
        why = f"exit status {done.returncode}"
    elif not value:
        why = "its output does not end with a JSON object or list that is not empty"
    else:
        why = ""
    out = {**row, "ok": not why, "seconds": seconds, "why": why}
    if why:
        out["tail"] = (done.stdout[-1500:] + "\n" + done.stderr[-1500:]).strip()
    else:
        out["json_keys"] = sorted(value)[:8] if isinstance(value, dict) else [f"[{len(value)}]"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="a comma-separated list of script names (bench_steps, ...)")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per script")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    chosen = scripts()
    if args.only:
        wanted = {name.strip().removesuffix(".py") for name in args.only.split(",") if name.strip()}
        unknown = wanted - {path.stem for path in chosen}
        if unknown:
            parser.error(
                f"--only: no benchmark {', '.join(sorted(unknown))}; "
                f"choose from {', '.join(path.stem for path in chosen)}"
            )
        chosen = [path for path in chosen if path.stem in wanted]
    rows = []
    for script in chosen:
        print(f"  {script.name} --quick ...", file=sys.stderr, flush=True)
        rows.append(run_one(script, args.deadline))
        row = rows[-1]
        print(
            f"  {row['script']:<24} {'ok' if row['ok'] else 'FAILED':<7} {row['seconds']:>6} s"
            f"  {row['why'] or ', '.join(row.get('json_keys', []))}",
            file=sys.stderr,
            flush=True,
        )
    failed = [row for row in rows if not row["ok"]]
    for row in failed:
        print(f"\n--- {row['script']}: {row['why']}\n{row.get('tail', '')}", file=sys.stderr)
    summary = {"rows": rows, "failed": [row["script"] for row in failed]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"\nbenchmark smoke runs: {len(rows) - len(failed)} of {len(rows)} ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
