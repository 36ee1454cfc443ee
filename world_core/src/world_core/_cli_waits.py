"""``world approvals``, ``world approve``, ``world reject``, ``world signal``: people and systems
answering turns that wait (see :mod:`world_core.journal._waits`)."""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
from collections.abc import Callable
from typing import Any

from world_core._interrupt import run_command
from world_core._select import open_world
from world_core.errors import InvalidArgumentError, NotFoundError

__all__ = ["register"]

WorldOptions = Callable[[argparse.ArgumentParser], None]


def _default_sender() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name for this uid (a container)
        return "cli"


def _client(world: Any, args: argparse.Namespace) -> Any:
    from world_core.journal._client import Client

    return Client(world, queue=args.queue)


async def _approvals(args: argparse.Namespace) -> int:
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        pending = await _client(world, args).pending_approvals(args.session)
    if args.json:
        print(json.dumps([vars(item) for item in pending], indent=2))
        return 0
    if not pending:
        print(f"no approval pending in session {args.session!r}")
        return 0
    for item in pending:
        until = datetime.datetime.fromtimestamp(item.deadline, datetime.UTC)
        arguments = json.dumps(item.arguments, ensure_ascii=False)
        print(
            f"turn {item.turn_id} step {item.step}: {item.tool}({arguments}) "
            f"until {until:%Y-%m-%d %H:%M:%S} UTC"
        )
        print(f"  world approve {args.session} {item.turn_id} {item.step}   (or: world reject ...)")
    return 0


async def _decide(args: argparse.Namespace) -> int:
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        client = _client(world, args)
        decide = client.approve if args.command == "approve" else client.reject
        await decide(args.session, args.turn, args.step, by=args.by, reason=args.reason)
    verb = "approved" if args.command == "approve" else "rejected"
    print(f"{verb}: turn {args.turn} step {args.step} of session {args.session} (by {args.by})")
    return 0


async def _signal(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload) if args.payload is not None else None
    except ValueError as exc:
        raise InvalidArgumentError(f"--payload is not JSON: {exc}") from None
    from world_core.journal import session_log_id

    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        if not await world.log.tail(session_log_id(args.session)):
            # A mistyped id would otherwise make a session holding only this signal.
            raise NotFoundError(
                f"session {args.session!r} has no events in namespace {world.namespace!r} of "
                f"the {world.name!r} World: nothing to signal (world sessions lists them; a "
                "session not started yet can be signalled from code with Client.signal)"
            )
        signal_id = await _client(world, args).signal(
            args.session,
            args.name,
            payload,
            sender=args.by,
            signal_id=args.id,
            turn_id=args.turn,
        )
    print(f"signal {args.name!r} sent to session {args.session} (id {signal_id})")
    return 0


def _common(parser: argparse.ArgumentParser, world_options: WorldOptions) -> None:
    world_options(parser)
    parser.add_argument("--queue", default="turns", help="the queue workers claim turns from")


def register(sub: Any, world_options: WorldOptions) -> None:
    """Add the commands to the ``world`` subparsers; ``world_options`` adds ``--world``,
    ``--url`` and ``--namespace`` to a parser."""
    listing = sub.add_parser(
        "approvals", help="list the tool calls of a session waiting for a person's decision"
    )
    listing.add_argument("session", help="the session id")
    listing.add_argument("--json", action="store_true", help="print JSON")
    _common(listing, world_options)
    listing.set_defaults(run=lambda args: run_command(_approvals, args))
    for verb, what in (("approve", "let it run"), ("reject", "refuse it; it does not run")):
        decide = sub.add_parser(verb, help=f"{verb} a tool call waiting for a decision: {what}")
        decide.add_argument("session", help="the session id")
        decide.add_argument("turn", help="the turn id (see world approvals)")
        decide.add_argument("step", type=int, help="the step of the approval (see world approvals)")
        decide.add_argument(
            "--by", default=_default_sender(), help="who decides (default: cli:<your user name>)"
        )
        decide.add_argument("--reason", help="why; the model is told")
        _common(decide, world_options)
        decide.set_defaults(run=lambda args: run_command(_decide, args))
    signal = sub.add_parser("signal", help="send a signal to a session (or one of its turns)")
    signal.add_argument("session", help="the session id")
    signal.add_argument("name", help="the signal's name, as the turn waits for it")
    signal.add_argument("--payload", help="a JSON value carried by the signal")
    signal.add_argument("--id", help="the signal id: sending one id twice counts once")
    signal.add_argument("--turn", help="address it to this turn only")
    signal.add_argument("--by", default=_default_sender(), help="who sends it")
    _common(signal, world_options)
    signal.set_defaults(run=lambda args: run_command(_signal, args))
