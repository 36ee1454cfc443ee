"""``world demo workspace``: an agent that edits files with the shell, crashed at every step.

The agent has one tool, ``bash`` (:func:`world_core.workspace.bash_tool`, ``replay="safe"``):
its scripts run in a bash-compatible interpreter on the session's virtual filesystem, and the
files each script leaves are committed with its outcome. A scripted model sets up a small
project, fixes a bug and ticks a to-do list with ``sed``, ``mv``, ``>>``, then writes a report
with ``grep`` and ``jq``, and answers with it.

1. The clean turn, in one worker process: its steps, its reply and its file tree.
2. The same turn crashed before and after every step, each in a session of its own: a worker
   process started with ``CRASH_AT=<step>:<when>`` dies there (``os._exit(1)``), a fresh one
   continues once the dead one's lease ran out. Per crash point: ``tree_matches`` (the
   session's file tree has the clean run's digest: same paths, bytes, modes and folders),
   ``repeated_model_calls`` (calls the fresh worker made for model steps that had finished:
   target 0) and ``reply_matches``.

It runs on the World and namespace :func:`world_examples.demo.run_demo` sets up.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from world_core import (
    Agent,
    Client,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    World,
    digest_of,
)
from world_core.workspace import Workspace, bash_tool
from world_examples.demo import (
    LEASE,
    TURN,
    _calls_by,
    _Context,
    _finished_model_digests,
    _journal,
    _run_worker,
    _Screen,
    _world_lines,
    crash_points,
    run_crash_matrix,
)
from world_examples.inbox import Inbox

__all__ = ["MESSAGE", "SCRIPTS", "WorkspaceRow", "build_agent", "introduce", "policy", "run"]

AGENT = "world_examples.workspace_demo:build_agent"
MESSAGE = "Set up the calc project, fix its bug, tick off bob, and report what is left."
"""The user's message for the demo turn."""

SCRIPTS = (
    # 1: set up a project (here-documents, printf, mkdir -p)
    "mkdir -p notes src\n"
    "cat > notes/todo.md <<'EOF'\n- [ ] buy milk\n- [ ] call bob\nEOF\n"
    "printf 'def total(xs):\\n    return sum(xs) - 1\\n' > src/calc.py\n"
    "chmod +x src/calc.py\n"
    "ls -R",
    # 2: edit it (sed -i, >>, mv, rmdir, &&)
    "sed -i 's/ - 1$//' src/calc.py && grep -n return src/calc.py\n"
    "sed -i 's/- \\[ \\] call bob/- [x] call bob/' notes/todo.md\n"
    "echo '- [ ] pay rent' >> notes/todo.md\n"
    "mv notes/todo.md TODO.md && rmdir notes\n"
    "cat TODO.md",
    # 3: report (grep -c, command substitution, jq, a pipe)
    "open=$(grep -c '\\[ \\]' TODO.md)\n"
    'jq -n --argjson open "$open" --arg fixed "$(grep -c \'sum(xs)$\' src/calc.py)" '
    "'{open: $open, fixed: ($fixed == \"1\")}' > report.json\n"
    "jq -c . report.json; grep '\\[ \\]' TODO.md | sed 's/- \\[ \\] //' | sort | paste -sd, -",
)
"""The scripts the model runs, in order."""

STEPS = ["model", "tool bash", "model", "tool bash", "model", "tool bash", "model"]
"""The clean turn's steps."""


def policy(request: ModelRequest) -> ModelReply:
    """The scripted model: each script in turn, then a reply from the last one's output."""
    start = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
    results = [m for m in request.messages[start + 1 :] if m["role"] == "tool"]
    if len(results) < len(SCRIPTS):
        arguments = json.dumps({"script": SCRIPTS[len(results)]})
        call = ToolCall(id=f"call_{len(results)}", name="bash", arguments=arguments)
        return ModelReply(tool_calls=[call])
    output = json.loads(str(results[-1]["content"]))
    lines = str(output["stdout"]).splitlines()
    report, left = [*lines, "", ""][:2]
    return ModelReply(content=f"Done (exit {output['exit_code']}): report {report}; left: {left}.")


class _LoggedModel(ScriptedModel):
    """The scripted model, appending each call's request digest to a file the demo reads."""

    def __init__(self, calls_file: Path | None) -> None:
        super().__init__(policy)
        self._calls_file = calls_file

    async def complete(self, request: ModelRequest) -> ModelReply:
        if self._calls_file is not None:
            line = json.dumps(
                {"pid": os.getpid(), "digest": digest_of(request.model_dump(mode="json"))}
            )
            with self._calls_file.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        return await super().complete(request)


def build_agent() -> Agent:
    """The agent for ``world worker --agent world_examples.workspace_demo:build_agent``
    (``WORLD_DEMO_CALLS``: the file each model call's digest is appended to)."""
    calls = os.environ.get("WORLD_DEMO_CALLS")
    return Agent(model=_LoggedModel(Path(calls) if calls else None), tools=[bash_tool()])


@dataclass(frozen=True)
class WorkspaceRow:
    """One crash point: where, whether the worker died there, and how the turn ended."""

    crash_at: str
    step: str
    crashed: bool
    tree_matches: bool
    """The session's file tree has the clean run's digest (paths, bytes, modes, folders)."""
    repeated_model_calls: int
    """Model calls the fresh workers made for model steps that had finished (target 0)."""
    reply_matches: bool
    files: list[str]
    finished_model_steps: int
    replay_model_calls: int
    workers: list[str]
    seconds: float = 0.0
    note: str = ""


async def _tree(world: World, session: str) -> tuple[str, list[str]]:
    workspace = Workspace(world)
    tree = await workspace.tree(session)
    return tree.digest(), sorted(tree.files)


async def _crash_point(
    ctx: _Context, index: int, crash_at: str, step: str, clean: tuple[str, str]
) -> WorkspaceRow:
    started = time.monotonic()
    session = f"workspace-{index}-{crash_at.replace(':', '-')}"
    queue = f"workspace-{index}"
    client = Client(ctx.world, queue=queue)
    await client.submit(session, MESSAGE, turn_id=TURN)
    dying = await _run_worker(ctx, queue, {"CRASH_AT": crash_at}, agent=AGENT)
    crashed = dying.returncode == 1 and dying.result is None
    finished = await _finished_model_digests(ctx.world, session)
    workers = ["crash" if crashed else f"exit {dying.returncode}"]
    calls: list[str] = []
    reply = None
    for _ in range(3):  # a fresh worker, once the dead one's lease ran out
        ended = await _run_worker(ctx, queue, {}, agent=AGENT)
        workers.append(str((ended.result or {}).get("status", f"exit {ended.returncode}")))
        calls += _calls_by(ctx, ended.pid)
        reply = await client.reply(session, TURN)
        if reply is not None:
            break
    digest, files = await _tree(ctx.world, session)
    note = "" if reply is not None else f"no reply after {' > '.join(workers)}"
    return WorkspaceRow(
        crash_at=crash_at,
        step=step,
        crashed=crashed,
        tree_matches=digest == clean[0],
        repeated_model_calls=sum(1 for d in calls if d in finished),
        reply_matches=reply == clean[1],
        files=files,
        finished_model_steps=len(finished),
        replay_model_calls=len(calls),
        workers=workers,
        seconds=round(time.monotonic() - started, 1),
        note=note,
    )


_HEADER = f"{'crash at':<14}{'step':<11}{'tree':>10}{'repeated model calls':>22}  reply"


def _row(row: WorkspaceRow) -> str:
    tree = "matches" if row.tree_matches else "DIFFERS"
    reply = "identical" if row.reply_matches else "DIFFERENT"
    extra = "" if row.crashed else "  (did not crash)"
    return (
        f"{row.crash_at:<14}{row.step:<11}{tree:>10}{row.repeated_model_calls:>22}  {reply}"
        f"{extra}{f'  {row.note}' if row.note else ''}"
    )


def _ok(row: WorkspaceRow) -> bool:
    return row.crashed and row.tree_matches and row.repeated_model_calls == 0 and row.reply_matches


async def run(ctx: _Context, as_json: bool) -> int:
    """The demo, on ``ctx``'s World; returns the exit status (0: every target met)."""
    say = ctx.screen
    started = time.monotonic()
    say.line("1. The clean turn, in one worker process ...")
    client = Client(ctx.world, queue="workspace-clean")
    await client.submit("clean", MESSAGE, turn_id=TURN)
    ended = await _run_worker(ctx, "workspace-clean", {}, agent=AGENT)
    clean_reply = await client.reply("clean", TURN)
    if clean_reply is None:
        say.line(
            f"the clean turn produced no reply (worker exit status {ended.returncode}, "
            f"result {ended.result}); anything it said is above"
        )
        return 1
    steps = [s.label for s in await _journal(ctx.world, "clean")]
    digest, files = await _tree(ctx.world, "clean")
    say.line("   steps  " + ", ".join(f"{n} {label}" for n, label in enumerate(steps)))
    say.line(f"   files  {', '.join(files)}  (tree {digest[:12]})")
    say.line(f"   reply  {clean_reply!r}  ({time.monotonic() - started:.1f} s)")
    say.line()
    points = crash_points(steps)
    say.line(f"2. Crashed at {len(points)} points, each in a session of its own; a fresh worker")
    say.line(f"   process continues once the dead one's {LEASE:g} s lease ran out.")
    if not as_json:
        say.line("   tree                  the session's files equal the clean run's (one digest)")
        say.line("   repeated model calls  calls for model steps that had finished (target 0)")
        say.line("   reply                 compared with the clean turn's (target identical)")
        say.line()
        say.line(_HEADER)

    def show(row: WorkspaceRow) -> None:
        if not as_json:
            say.line(_row(row))

    ordered = await run_crash_matrix(
        len(points),
        lambda index: _crash_point(ctx, index, *points[index], (digest, clean_reply)),
        show,
        progress=lambda done: say.progress(f"   {done}/{len(points)} crash points done"),
        at_once=8,  # worker processes at once: 2 cores are busy at 8
    )
    say.end_progress()
    ok = steps == STEPS and all(_ok(row) for row in ordered)
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        report: dict[str, Any] = {
            "demo": "workspace",
            "world": ctx.world_name,
            "namespace": ctx.namespace,
            "steps": steps,
            "clean_reply": clean_reply,
            "clean_tree": {"digest": digest, "files": files},
            "crash_points": [asdict(row) for row in ordered],
            "targets_met": ok,
            "seconds": seconds,
        }
        print(json.dumps(report, indent=2))
        say.line(f"done in {seconds:.0f} s: targets {'met' if ok else 'NOT met'}")
        return 0 if ok else 1
    say.line()
    verdict = "met" if ok else "NOT met"
    say.line(f"Targets {verdict}: the clean run's files, zero repeated model calls and an")
    say.line(f"identical reply at every crash point. ({seconds:.0f} s in all)")
    return 0 if ok else 1


def introduce(
    screen: _Screen, world: World, namespace: str, base: str | None, where: str | None, inbox: Inbox
) -> None:
    """The workspace demo's opening lines."""
    screen.line(
        f"world demo workspace: an agent editing files with the shell, crashed at every step, "
        f"on the {world.name!r} World"
    )
    screen.line()
    for text in _world_lines(world, namespace, base, where):
        screen.line(text)
    screen.line("   tool    bash (safe): a bash-compatible interpreter on the session's virtual")
    screen.line("           filesystem, no host files, processes or network; the files each")
    screen.line("           script leaves are committed with its outcome, or not at all")
    screen.line(f"   time    about 20 s: a dead worker holds its turn for its {LEASE:g} s lease,")
    screen.line("           29 worker processes start")
    screen.line()
