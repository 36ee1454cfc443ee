"""Crash workers for the journal crash matrix, many at once: import once, fork one per point.

    python -m world_conformance.journal_fork --world NAME [--url URL] --namespace NS < jobs

``jobs`` is a JSON list of ``{"queue", "crash_at", "effects", "replay"}``. This process imports
the worker, the agent and the World's backend, opens nothing, then forks one child per job.
Each child opens the World itself (connections are never shared across a fork), runs one turn
from its queue with ``CRASH_AT=<crash_at>`` and so dies there with ``os._exit(1)``, as a killed
worker would. Printed at the end: ``{crash_at: exit status}``.

Forking a warm process instead of starting ten interpreters keeps the matrix to seconds on
every backend; each child is still a real process that really dies.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio

from world_conformance.journal_agent import make_agent
from world_core import Replay, Worker, open_world, parse_crash_at, resolve_world

__all__ = ["main"]

LEASE = 2.0
WAIT = 20.0


def _child(world: str, url: str | None, namespace: str, job: dict[str, Any]) -> int:
    os.environ["CRASH_AT"] = job["crash_at"]
    crash = parse_crash_at(job["crash_at"])
    replay: Replay = "safe" if job.get("replay") == "safe" else "never"

    async def run() -> int:
        async with open_world(world, url=url, namespace=namespace) as opened:
            agent = make_agent(Path(job["effects"]), act_replay=replay)
            worker = Worker(opened, agent, queue=job["queue"], lease=LEASE, crash=crash)
            result = await worker.run_once(wait=WAIT)
        if result is None:
            return 3  # no turn came
        return 0 if result.status == "done" else 4

    return anyio.run(run)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m world_conformance.journal_fork")
    parser.add_argument("--world", required=True)
    parser.add_argument("--url")
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args()
    jobs: list[dict[str, Any]] = json.loads(sys.stdin.read())
    resolve_world(args.world)  # import the backend now, once, before forking
    sys.stdout.flush()
    children: dict[int, str] = {}
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            status = 5
            try:
                status = _child(args.world, args.url, args.namespace, job)
            except BaseException as exc:
                print(f"crash worker {job['crash_at']}: {exc!r}", file=sys.stderr, flush=True)
            finally:
                os._exit(status)
        children[pid] = job["crash_at"]
    statuses: dict[str, int] = {}
    for pid, crash_at in children.items():
        _, status = os.waitpid(pid, 0)
        statuses[crash_at] = os.waitstatus_to_exitcode(status)
    print(json.dumps(statuses), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
