"""The ``world`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import metadata
from typing import Any

import anyio

from world_core._select import list_worlds, load_attr, open_world
from world_core.errors import ConfigurationError, WorldError

__all__ = ["COMMANDS_ENTRY_POINT_GROUP", "add_world_options", "main"]

COMMANDS_ENTRY_POINT_GROUP = "world.commands"
"""Entry points adding ``world`` subcommands: each names a function taking the argparse
subparsers object, which adds its parser and sets ``run`` (a function of the parsed args
returning the exit status). Keep its module light: it is imported for every ``world`` call."""


def add_world_options(parser: argparse.ArgumentParser) -> None:
    """The ``--world``, ``--url`` and ``--namespace`` options every World command takes."""
    parser.add_argument(
        "--world", help="World to open (default: WORKFLOW_TARGET_WORLD, else local)"
    )
    parser.add_argument("--url", help="the backend's URL or folder (default: its own variable)")
    parser.add_argument("--namespace", help="namespace (default: WORKFLOW_NAMESPACE, else default)")


def _cmd_worlds(args: argparse.Namespace) -> int:
    entries = list_worlds()
    if args.json:
        print(json.dumps([entry.__dict__ for entry in entries], indent=2))
        return 0
    if not entries:
        print("no World installed: pip install world-local")
        return 1
    width = max(len(entry.name) for entry in entries)
    for entry in entries:
        print(f"{entry.name:<{width}}  {entry.distribution} {entry.version}  ({entry.value})")
    return 0


async def _info(args: argparse.Namespace) -> int:
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        settings = dict(world.settings())
        capabilities: dict[str, object] = world.capabilities.model_dump()
        report = {
            "world": world.name,
            "namespace": world.namespace,
            "settings": settings,
            "capabilities": capabilities,
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"world      {report['world']}")
    print(f"namespace  {report['namespace']}")
    for key, value in settings.items():
        print(f"setting    {key} = {value}")
    for name, flag in capabilities.items():
        print(f"capability {name} = {flag}")
    return 0


def _load_agent_factory(spec: str) -> Callable[[], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"--agent {spec!r}: use module:attribute, e.g. my_app.agent:build")
    target: Any = load_attr(spec, "--agent")
    from world_core.journal._agent import Agent

    if isinstance(target, Agent):
        agent: Agent = target
        return lambda: agent
    if not callable(target):
        raise ConfigurationError(f"--agent {spec!r} is neither an Agent nor a factory of one")
    factory: Callable[[], Any] = target
    return factory


async def _worker(args: argparse.Namespace) -> int:
    from world_core.journal._worker import Worker

    factory = _load_agent_factory(args.agent)
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        worker = Worker(
            world,
            factory,
            queue=args.queue,
            lease=args.lease,
            grace=args.grace,
            max_attempts=args.max_attempts,
            turn_timeout=args.turn_timeout,
        )
        if not args.once:

            def ready() -> None:
                print(
                    f"world worker {worker.name}: waiting for turns on queue {worker.queue!r} "
                    "(SIGTERM or Ctrl-C stops it after the current turn)",
                    file=sys.stderr,
                    flush=True,
                )

            await worker.run(on_ready=ready)
            return 0
        result = await worker.run_once(wait=args.wait)
    if result is None:
        print(json.dumps({"status": "idle"}) if args.json else "no turn came")
        return 3
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(f"turn {result.session_id}/{result.turn_id}: {result.status}")
    return 0 if result.status == "done" else 4


def _add_plugin_commands(sub: Any) -> None:
    for ep in metadata.entry_points(group=COMMANDS_ENTRY_POINT_GROUP):
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken plugin must not take `world worlds` down with it
            print(f"world: warning: command plugin {ep.name!r} not loaded: {exc}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="world", description="Crash-safe agents on a World.")
    sub = parser.add_subparsers(dest="command", required=True)
    worlds = sub.add_parser("worlds", help="list the installed Worlds")
    worlds.add_argument("--json", action="store_true", help="print JSON")
    worlds.set_defaults(run=_cmd_worlds)
    info = sub.add_parser("info", help="show the selected World, its settings and capabilities")
    info.add_argument("--world", help="World to open (default: WORKFLOW_TARGET_WORLD, else local)")
    info.add_argument("--url", help="the backend's URL or folder (default: its own variable)")
    info.add_argument("--namespace", help="namespace (default: WORKFLOW_NAMESPACE, else default)")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(run=lambda args: anyio.run(_info, args))
    worker = sub.add_parser(
        "worker",
        help="run turns from the queue with an agent (CRASH_AT=<step>:<before_run|after_run> "
        "kills it at that point)",
    )
    worker.add_argument("--agent", required=True, help="module:attr of an Agent or its factory")
    add_world_options(worker)
    worker.add_argument("--queue", default="turns", help="queue to claim turns from")
    worker.add_argument("--lease", type=float, default=30.0, help="lease seconds")
    worker.add_argument("--grace", type=float, default=30.0, help="seconds to finish on SIGTERM")
    worker.add_argument(
        "--max-attempts",
        type=int,
        default=5,
        help="deliveries a turn gets for transient errors before its failure is recorded",
    )
    worker.add_argument(
        "--turn-timeout",
        type=float,
        default=3600.0,
        help="seconds one attempt of a turn may run before its failure is recorded",
    )
    worker.add_argument("--once", action="store_true", help="run one turn, then exit")
    worker.add_argument("--wait", type=float, default=30.0, help="with --once: seconds to wait")
    worker.add_argument("--json", action="store_true", help="with --once: print the result")
    worker.set_defaults(run=lambda args: anyio.run(_worker, args))
    _add_plugin_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``world`` command; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except WorldError as exc:
        print(f"world: error: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
