"""The ``world`` command line.

Exit statuses (``world --help`` shows them too):

====  ===========================================================================================
0     done
1     the command ran and reports a failure (``world demo``: a target not met;
      ``world replay-check``: a turn diverged; ``world delete``: a turn not finished)
2     usage or configuration error; also ``world`` alone, which prints its help on stdout
3     ``world worker --once``: no turn came
4     ``world worker --once``: the turn failed
130   interrupted (Ctrl-C): one line, ``interrupted``, on stderr
141   output closed early (``world demo | head``): the command stops, printing nothing more
====  ===========================================================================================

Error messages name what to fix as the command knows it: world_core and the backends name an
argument as ``url=`` (``target=``, ``namespace=``), printed here as the option (``--url``).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from importlib import metadata
from typing import Any, NoReturn, TextIO

from world_core._cli_observe import register as register_observe_commands
from world_core._cli_replay import register as register_replay_commands
from world_core._cli_waits import register as register_wait_commands
from world_core._interrupt import run_command
from world_core._select import list_worlds, load_attr, open_world
from world_core.errors import (
    ConfigurationError,
    InvalidArgumentError,
    TurnNotReadyError,
    WorldError,
)
from world_core.journal._delete import delete_session
from world_core.journal._session import session_log_id
from world_core.spi import validate_duration, validate_id

__all__ = ["COMMANDS_ENTRY_POINT_GROUP", "add_world_options", "for_the_command_line", "main", "run"]

COMMANDS_ENTRY_POINT_GROUP = "world.commands"
"""Entry points adding ``world`` subcommands: each names a function taking the argparse
subparsers object, which adds its parser and sets ``run`` (a function of the parsed args
returning the exit status). Keep its module light: it is imported for every ``world`` call."""


EXIT_STATUSES = """\
exit status:
  0    done
  1    the command ran and reports a failure (world demo: a target not met;
       world replay-check: a turn diverged; world delete: a turn not finished)
  2    usage or configuration error; also `world` alone (this help, on stdout)
  3    world worker --once: no turn came
  4    world worker --once: the turn failed
  130  interrupted (Ctrl-C)
  141  output closed early (world demo | head)"""

# The Python argument names messages use (`url=`), as this command's options.
_OPTIONS = {"target": "--world", "url": "--url", "namespace": "--namespace"}
_ARGUMENT = re.compile(r"(?<![\w.-])(target|url|namespace)=(?![\w'\"(\[{<])")


def for_the_command_line(message: str) -> str:
    """``message`` with each bare argument name (``url=``) replaced by its option (``--url``).

    A name with a value (``url='redis://...'``) is left alone.
    """
    return _ARGUMENT.sub(lambda found: _OPTIONS[found.group(1)], message)


def add_world_options(parser: argparse.ArgumentParser) -> None:
    """The ``--world``, ``--url`` and ``--namespace`` options every World command takes."""
    parser.add_argument(
        "--world", help="World to open (default: WORKFLOW_TARGET_WORLD, else local)"
    )
    parser.add_argument("--url", help="the backend's URL or folder (default: its own variable)")
    parser.add_argument("--namespace", help="namespace (default: WORKFLOW_NAMESPACE, else default)")


def _version() -> str:
    try:
        core = metadata.version("world-core")
    except metadata.PackageNotFoundError:
        core = "unknown (world-core is not installed as a distribution)"
    lines = [f"world-core {core}"]
    entries = list_worlds()  # metadata only: no backend is imported
    if not entries:
        lines.append("Worlds installed: none (pip install world-local)")
    else:
        lines.append("Worlds installed:")
        width = max(len(entry.name) for entry in entries)
        lines += [
            f"  {entry.name:<{width}}  {entry.distribution} {entry.version}" for entry in entries
        ]
    return "\n".join(lines)


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
    # Read-only: opening a World creates no storage (spi.World), so a mistyped --namespace or
    # --url leaves no trace.
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


async def _delete(args: argparse.Namespace) -> int:
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        existed = await world.log.info(session_log_id(validate_id(args.session, "SESSION")))
        try:
            # Even for a session that is gone: what a deletion cut short left is removed too.
            await delete_session(world, args.session, force=args.force)
        except TurnNotReadyError as exc:
            print(
                f"world delete: {exc} (here: wait for it with world tail, or add --force)",
                file=sys.stderr,
            )
            return 1
    if existed is None:
        print(
            f"world delete: no session {args.session!r} in namespace {world.namespace!r}: "
            "nothing to delete (world sessions lists them)",
            file=sys.stderr,
        )
        return 1
    print(f"deleted session {args.session} (namespace {world.namespace})")
    return 0


def _load_agent_factory(spec: str) -> Callable[[], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"--agent {spec!r}: use module:attribute, e.g. my_app.agent:build")
    target: Any = load_attr(spec, "--agent")
    from world_core.journal._agent import Agent

    if isinstance(target, Agent) or (
        not isinstance(target, type) and callable(getattr(target, "run_turn", None))
    ):
        agent: Any = target  # an Agent, or any TurnAgent (WorldAgent, DurableAgent, ...)
        return lambda: agent
    if not callable(target):
        raise ConfigurationError(f"--agent {spec!r} is neither an Agent nor a factory of one")
    factory: Callable[[], Any] = target
    return factory


def _first_agent(spec: str, factory: Callable[[], Any]) -> Callable[[], Any]:
    """Build the agent once before taking any turn, so that a factory that cannot build it (a
    missing API key, a typo) stops ``world worker`` at once, rather than failing (or retrying)
    every turn it claims; the turns then get that agent first, then the factory's.

    Raises:
        ConfigurationError: the factory raised, or built something without ``run_turn``.
    """
    try:
        built = factory()
    except Exception as exc:
        raise ConfigurationError(
            f"--agent {spec!r}: building the agent raised {type(exc).__name__}: {exc}; fix it "
            "(no turn was taken)"
        ) from exc
    if inspect.iscoroutine(built):
        built.close()  # never awaited: say so here rather than in a RuntimeWarning
        raise ConfigurationError(
            f"--agent {spec!r} is an async function: a factory is a plain function that "
            "returns the agent; no turn was taken"
        )
    if isinstance(built, type) or not callable(getattr(built, "run_turn", None)):
        raise ConfigurationError(
            f"--agent {spec!r} returned a {type(built).__name__!r} object, not an agent (one "
            "with async run_turn(journal), such as an Agent); no turn was taken"
        )
    first = [built]
    return lambda: first.pop() if first else factory()


async def _worker(args: argparse.Namespace) -> int:
    from world_core.journal._worker import Worker

    if not args.once and (args.wait is not None or args.json):
        given = "--wait" if args.wait is not None else "--json"
        raise InvalidArgumentError(
            f"world worker: {given} is for --once (one turn, then exit); without --once the "
            "worker runs until stopped: add --once or drop it"
        )
    wait = 30.0 if args.wait is None else validate_duration(args.wait, "--wait")
    factory = _first_agent(args.agent, _load_agent_factory(args.agent))
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
                    "(SIGTERM or Ctrl-C stops it after the current turn; twice: now)",
                    file=sys.stderr,
                    flush=True,
                )

            await worker.run(on_ready=ready)
            return 0
        result = await worker.run_once(wait=wait)
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
    parser = argparse.ArgumentParser(
        prog="world",
        description="Crash-safe agents on a World.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="print the version of world-core and of each installed World, then exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    worlds = sub.add_parser("worlds", help="list the installed Worlds")
    worlds.add_argument("--json", action="store_true", help="print JSON")
    worlds.set_defaults(run=_cmd_worlds)
    info = sub.add_parser(
        "info",
        help="show the selected World, its settings and capabilities (creates nothing: a "
        "namespace's storage is made by its first write)",
    )
    add_world_options(info)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(run=lambda args: run_command(_info, args))
    worker = sub.add_parser(
        "worker",
        help="run turns from the queue with an agent (CRASH_AT=<step>:<before_run|after_run> "
        "kills it at that point)",
    )
    worker.add_argument(
        "--agent",
        required=True,
        help="module:attr of an agent (an Agent, or any object with async run_turn) or its "
        "factory, which is called once before the first claim (an error stops the worker)",
    )
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
    worker.add_argument("--wait", type=float, help="with --once: seconds to wait for a turn (30)")
    worker.add_argument("--json", action="store_true", help="with --once: print the result")
    worker.set_defaults(run=lambda args: run_command(_worker, args))
    delete = sub.add_parser(
        "delete",
        help="delete a session and all it owns: its logs, turns' live events, document heads, "
        "blobs and the child sessions its turns started (safe to run again after a crash; "
        "refused while a turn is not finished; dead letters are kept)",
    )
    delete.add_argument("session", help="the session id (see world sessions)")
    delete.add_argument("--force", action="store_true", help="delete even with a turn not finished")
    add_world_options(delete)
    delete.set_defaults(run=lambda args: run_command(_delete, args))
    register_wait_commands(sub, add_world_options)
    register_replay_commands(sub, add_world_options)
    register_observe_commands(sub, add_world_options)
    _add_plugin_commands(sub)
    if "demo" in sub.choices:
        parser.description = "Crash-safe agents on a World. Start with: world demo"
    return parser


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # stderr closed too: nothing left to tell
        print(line, file=sys.stderr, flush=True)


def _closed(stream: TextIO) -> bool:
    """Whether the reader of ``stream`` has gone (a pipe: POLLERR; a socket: POLLHUP)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    try:
        import select

        poller = select.poll()
    except (ImportError, AttributeError):  # no poll(): trust the BrokenPipeError
        return True
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _drop_output() -> None:
    # What is still buffered would fail again when the interpreter flushes it at exit.
    for stream in (sys.stdout, sys.stderr):
        if _closed(stream):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _exit_status(exc: BaseException) -> int | None:
    """The status for a command stopped by ``exc`` (plain or grouped by a task group), having
    said why in one line per error; None for what is not an expected way to stop (a bug)."""
    leaves = list(_leaves(exc))
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        _say("interrupted")
        return 130
    if any(isinstance(leaf, BrokenPipeError) for leaf in leaves) and (
        _closed(sys.stdout) or _closed(sys.stderr)
    ):
        _drop_output()  # the reader is gone, as after `| head`: stop quietly, like SIGPIPE
        return 141
    if leaves and all(isinstance(leaf, WorldError) for leaf in leaves):
        for leaf in dict.fromkeys(str(leaf) for leaf in leaves):
            _say(f"world: error: {for_the_command_line(leaf)}")
        return 2
    return None


def _run(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        print(_version())
        return 0
    if args.command is None:
        parser.print_help(sys.stdout)
        return 2
    status: int = args.run(args)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``world`` command; returns the exit status (see the module docstring)."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        status = _run(argv)
        sys.stdout.flush()  # a closed stdout is found here, not in the interpreter's last flush
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        stopped = _exit_status(exc)
        if stopped is None:
            raise
        return stopped
    return status


def run() -> NoReturn:
    """The ``world`` program: :func:`main`, then exit with its status."""
    _exit(main())


def _exit(status: int) -> NoReturn:
    """Exit with ``status``, without joining threads a tool left running past its timeout (the
    journal abandons a sync tool it cannot stop; joining it would keep the process forever)."""
    from world_core.journal._tools import abandoned_calls

    stuck = abandoned_calls()
    if not stuck:
        sys.exit(status)
    print(
        f"world: warning: {stuck} sync tool call(s) abandoned after their timeout still "
        "running; exiting without waiting for them",
        file=sys.stderr,
        flush=True,
    )
    logging.shutdown()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    run()
