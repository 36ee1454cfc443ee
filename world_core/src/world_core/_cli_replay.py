"""``world export`` and ``world replay-check``: stored histories as files, and replayed against
the current agent code (see :mod:`world_core.journal._history` and
:mod:`world_core.journal._replay`).

Kept light: ``world`` imports it on every call; the journal is imported only when a command
runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from world_core._interrupt import run_command
from world_core._select import open_world
from world_core.errors import ConfigurationError

__all__ = ["register"]

WorldOptions = Callable[[argparse.ArgumentParser], None]


async def _export(args: argparse.Namespace) -> int:
    from world_core.journal._history import dump_history, read_histories

    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        sessions = dict.fromkeys(args.sessions)  # once each: a file holds a session once
        histories = [h for session in sessions for h in await read_histories(world, session)]
    text = dump_history(histories)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        await anyio.Path(args.out).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"--out {args.out!r} cannot be written: {exc}") from None
    events = sum(len(history.events) for history in histories)
    blobs = sum(len(history.blobs) for history in histories)
    print(
        f"exported {len(histories)} session(s), {events} events, {blobs} blobs to {args.out}",
        file=sys.stderr,
    )
    return 0


def _files(given: list[str]) -> list[Path]:
    files: list[Path] = []
    for name in given:
        path = Path(name)
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise ConfigurationError(f"{name}: a folder without *.json history files")
            files.extend(found)
        else:
            files.append(path)
    # Once each (a folder and a file in it, a name given twice): a session is loaded once.
    once: dict[Path, Path] = {}
    for path in files:
        once.setdefault(path.resolve(), path)
    return list(once.values())


async def _replay_check(args: argparse.Namespace) -> int:
    from world_core._cli import _load_agent_factory
    from world_core.journal._history import SessionHistory, load_history_file, read_histories
    from world_core.journal._replay import format_report, replay_check

    if args.turn_timeout <= 0:
        raise ConfigurationError(f"--turn-timeout must be > 0 seconds, got {args.turn_timeout}")
    factory = _load_agent_factory(args.agent)
    histories: list[SessionHistory] = []
    for path in _files(args.files):
        histories.extend(load_history_file(path))
    if args.session:
        async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
            for session in dict.fromkeys(args.session):
                histories.extend(await read_histories(world, session))
    if not histories:
        raise ConfigurationError(
            "replay-check: nothing to check: name exported history files (world export) or "
            "folders of them, or --session SESSION to read from the World"
        )
    report = await replay_check(histories, factory, turn_timeout=args.turn_timeout)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(format_report(report))
    return 0 if report.ok else 1


def register(sub: Any, world_options: WorldOptions) -> None:
    """Add the commands to the ``world`` subparsers; ``world_options`` adds ``--world``,
    ``--url`` and ``--namespace`` to a parser."""
    export = sub.add_parser(
        "export",
        help="write sessions' histories (their events and blobs) as one JSON file",
        description=(
            "Writes the session logs named (every event, with its key, and every blob the "
            "events name) as one self-contained JSON document, format world-history/1, for "
            "world replay-check. Histories hold what users and tools said: review one before "
            "checking it in."
        ),
    )
    export.add_argument("sessions", nargs="+", metavar="SESSION", help="a session id")
    export.add_argument("--out", help="the file to write (default: standard output)")
    world_options(export)
    export.set_defaults(run=lambda args: run_command(_export, args))

    check = sub.add_parser(
        "replay-check",
        help="replay stored histories against the agent code, model and tools switched off; "
        "exit status 1 on a divergence",
        description=(
            "Replays every turn of the histories given (files written by world export, folders "
            "of them, or sessions read from the World with --session) with the agent --agent "
            "makes, in a temporary local World, the model and every tool switched off and every "
            "write refused: the journal answers each recorded step, checking that the code asks "
            "for the same one. A finished turn must replay to the same reply; an open turn "
            "must replay its recorded steps (prefix ok). Exit status 0 when no turn diverged, "
            "1 when one did (the table names the session, turn, step and why), 2 for a usage "
            "or configuration error."
        ),
    )
    check.add_argument("files", nargs="*", metavar="FILE", help="a history file, or a folder")
    check.add_argument("--agent", required=True, help="module:attr of an Agent or its factory")
    check.add_argument(
        "--session",
        action="append",
        default=[],
        metavar="SESSION",
        help="check this session as stored in the World (--world, --url, --namespace); repeatable",
    )
    world_options(check)
    check.add_argument(
        "--turn-timeout",
        type=float,
        default=60.0,
        help="seconds the replay of one turn may take (default 60)",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(run=lambda args: run_command(_replay_check, args))
