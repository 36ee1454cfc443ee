"""``world`` subcommands this package adds (entry-point group ``world.commands``).

Kept light: ``world`` imports it on every call; the demo itself is imported only when run.
"""

from __future__ import annotations

import argparse
from typing import Any

from world_examples._demos import DEMOS, MISSING

__all__ = ["register"]


def _run_demo(args: argparse.Namespace) -> int:
    from world_core._interrupt import run_command
    from world_examples.demo import run_demo

    status: int = run_command(
        lambda: run_demo(world=args.world, url=args.url, as_json=args.json, which=args.which)
    )
    return status


def register(sub: Any) -> None:
    """Add ``world demo [crashes|approval]``."""
    demo = sub.add_parser(
        "demo",
        help="crash an agent turn at every step and show that nothing is paid or sent twice",
        description=(
            "Runs a turn that looks up a note and emails it (to a real SMTP inbox on loopback; "
            "the model is scripted: no API key, no cost), then the same turn crashed before and "
            "after every step, continued each time by a fresh worker process, and prints per "
            "crash point: model calls repeated for finished steps, emails received, and whether "
            "the reply matches the clean run. Finally send_email is relabelled 'safe' to show "
            "the duplicate it then sends. Takes about half a minute. 'world demo approval' runs "
            "the same turn with send_email waiting for a person's approval, crashes it around "
            "the wait and the send, approves from another process (world approve), and shows "
            "each approval consumed once, one email, and a turn nobody approves sending none. "
            "'world demo workspace' crashes an agent that edits files with the bash tool (a "
            "shell on the session's virtual filesystem) at every step and shows the clean run's "
            "file tree, no repeated model call and the same reply at each crash point. "
            "The run has a namespace of its own (demo_<random>, or "
            "<WORKFLOW_NAMESPACE>_demo_<random>), purged at the end."
        ),
    )
    demo.add_argument(
        "which",
        nargs="?",
        choices=(*DEMOS, *MISSING),
        default="crashes",
        help="crashes: the crash matrix (the default); approval: a send that waits for a "
        "person's approval, crashed around the wait; workspace: an agent editing files with "
        "the bash tool, crashed at every step (tree_matches, repeated_model_calls, "
        "reply_matches per crash point)",
    )
    demo.add_argument(
        "--world", help="World to run on (default: WORKFLOW_TARGET_WORLD, else local)"
    )
    demo.add_argument(
        "--url",
        help="the backend's URL or folder (default: its own variable; for local, "
        "WORKFLOW_LOCAL_DIR, else a temporary folder)",
    )
    demo.add_argument("--json", action="store_true", help="print the results as JSON")
    demo.set_defaults(run=_run_demo)
