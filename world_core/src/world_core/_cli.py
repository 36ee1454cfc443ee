"""The ``world`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import anyio

from world_core._select import list_worlds, open_world
from world_core.errors import WorldError

__all__ = ["main"]


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``world`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except WorldError as exc:
        print(f"world: error: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
