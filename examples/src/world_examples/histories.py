"""Record the histories ``world replay-check`` checks in this repository's CI.

``python -m world_examples.histories examples/histories`` runs the demo's agent
(:func:`world_examples.crash_agent.build_agent`, its scripted model, and ``send_email`` to a
real SMTP inbox on loopback) on a temporary local World and exports three sessions, one file
each (``world-history/1``, see :mod:`world_core.journal._history`):

``clean.json``               session ``clean``: the demo's clean turn (``t1``), then a second
                             turn (``t2``) that sees the first in its conversation. Finished.
``crashed-after-send.json``  session ``crash-3-after_run``: the demo's turn, killed just after
                             ``send_email`` ran (before its outcome was written), then continued
                             by a fresh Journal once the send's deadline had passed: the model
                             is told the email may or may not have gone out, calls
                             ``check_sent``, and does not send it again. Finished. Journaled
                             with a blob threshold of 100 bytes, so its larger values are blobs.
``open-turn.json``           session ``crash-3-before_run``: the demo's turn killed just before
                             the send (its intent recorded, no outcome), not continued, and a
                             second turn submitted behind it. Open: a prefix.

The crashes are in-process (:class:`~world_core.CrashPoint` ``in_process=True``): the journal
is left exactly as a killed worker leaves it. The continuation's clock is set past the send's
deadline instead of waiting for it, as a worker taking over later would see it.

Regenerate the files after a change that is meant to change what the agent does (then review
the diff: it is what production histories recorded before the change would no longer match).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from world_core import (
    DEFAULT_BLOB_THRESHOLD,
    Client,
    CrashPoint,
    Journal,
    SimulatedCrash,
    World,
    dump_history,
    open_world,
    read_history,
)
from world_core.journal import CLOCK_MARGIN
from world_examples.crash_agent import MESSAGE, SEND_TIMEOUT, build_agent
from world_examples.inbox import Inbox

__all__ = ["AGENT", "SECOND_MESSAGE", "record_histories"]

AGENT = "world_examples.crash_agent:build_agent"
"""The agent the histories were recorded with (``world replay-check --agent``)."""

SECOND_MESSAGE = "Please email the launch note to grace@example.com."
"""The second turn's message."""

_SMALL_BLOBS = 100


@contextmanager
def _demo_environment(inbox: Inbox) -> Iterator[None]:
    """The variables the demo sets for its workers (the tools read them), for this process."""
    wanted = {
        "WORLD_DEMO_SMTP": f"127.0.0.1:{inbox.port}",
        "WORLD_DEMO_MAILDIR": str(inbox.folder),
        "WORLD_DEMO_SEND_REPLAY": "never",
    }
    saved = {name: os.environ.get(name) for name in [*wanted, "WORLD_DEMO_CALLS"]}
    os.environ.update(wanted)
    os.environ.pop("WORLD_DEMO_CALLS", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _run(
    world: World,
    session: str,
    turn: str,
    *,
    crash: CrashPoint | None = None,
    clock: Callable[[], float] | None = None,
    blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
) -> str | None:
    """Run the turn on a fresh Journal; its reply, or None when the crash point ended it."""
    journal = await Journal.open(
        world, session, turn, crash=crash, clock=clock, blob_threshold=blob_threshold
    )
    try:
        return await build_agent().run_turn(journal)
    except SimulatedCrash:
        return None


async def _clean(world: World) -> None:
    client = Client(world)
    for turn, message in (("t1", MESSAGE), ("t2", SECOND_MESSAGE)):
        await client.submit("clean", message, turn_id=turn)
        assert await _run(world, "clean", turn) is not None


async def _crashed_after_send(world: World) -> None:
    session = "crash-3-after_run"
    await Client(world).submit(session, MESSAGE, turn_id="t1")
    crash = CrashPoint(3, "after_run", in_process=True)
    assert await _run(world, session, "t1", crash=crash, blob_threshold=_SMALL_BLOBS) is None
    later = SEND_TIMEOUT + CLOCK_MARGIN + 1.0

    def clock() -> float:
        return time.time() + later

    reply = await _run(world, session, "t1", clock=clock, blob_threshold=_SMALL_BLOBS)
    assert reply is not None


async def _open_turn(world: World) -> None:
    session = "crash-3-before_run"
    client = Client(world)
    await client.submit(session, MESSAGE, turn_id="t1")
    crash = CrashPoint(3, "before_run", in_process=True)
    assert await _run(world, session, "t1", crash=crash) is None
    await client.submit(session, SECOND_MESSAGE, turn_id="t2")


async def record_histories(folder: Path) -> list[Path]:
    """Record the three sessions (see the module docstring) into ``folder``; the files."""
    await anyio.Path(folder).mkdir(parents=True, exist_ok=True)
    recordings = {
        "clean.json": ("clean", _clean),
        "crashed-after-send.json": ("crash-3-after_run", _crashed_after_send),
        "open-turn.json": ("crash-3-before_run", _open_turn),
    }
    written: list[Path] = []
    with (
        tempfile.TemporaryDirectory(prefix="world-histories-") as scratch,
        Inbox(Path(scratch) / "inbox") as inbox,
        _demo_environment(inbox),
    ):
        async with open_world("local", url=str(Path(scratch) / "world")) as world:
            for name, (session, record) in recordings.items():
                await record(world)
                text = dump_history([await read_history(world, session)])
                await anyio.Path(folder / name).write_text(text, encoding="utf-8")
                written.append(folder / name)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m world_examples.histories FOLDER", file=sys.stderr)
        return 2
    for path in anyio.run(record_histories, Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
