"""The shell compatibility corpus: each script run by real ``/bin/bash`` and by the engine.

``shell_corpus/*.sh`` are small scripts that set up their own input files. Expectations are
never written by hand: :func:`run_bash` runs a script with the host's ``/bin/bash`` in an
empty temporary folder, in the same fixed environment the engines get (``LC_ALL=C``,
``TZ=UTC``, ``HOME``/``PWD`` the folder), and :func:`compare` checks an engine's stdout, exit
code and resulting files against it (stderr too for the scripts whose first line is
``# compare: stderr``: error messages differ between shells, a script's own ``>&2`` does not).
The temporary folder's path in bash's output reads as ``/workspace``, the engines' root.

``known_gaps.txt`` lists the scripts the chosen engine fails, each with the reason; the
corpus test fails on any other failure, and on a listed script that now passes.

Run ``uv run python world_core/tests/test_shell_corpus.py [-v]`` to measure every engine.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_core.workspace import (
    SHELL_ENVIRONMENT,
    WORKSPACE_ROOT,
    Shell,
    ShellLimits,
    ShellResult,
    Tree,
    TreeLike,
    default_shell,
)

CORPUS = Path(__file__).parent / "shell_corpus"
KNOWN_GAPS = CORPUS / "known_gaps.txt"
STDERR_MARK = "# compare: stderr"
LIMITS = ShellLimits(timeout=10.0)

PASS_RATE_FLOOR = 308 / 312
"""bashkit 0.20.1 passes 308 of the 312 scripts (just-bash 0.2.1: 267, 85.6 %)."""


def corpus() -> list[Path]:
    """Every script of the corpus, by name."""
    return sorted(CORPUS.glob("*.sh"))


def known_gaps() -> dict[str, str]:
    """``known_gaps.txt``: script name to the reason the engine fails it."""
    gaps: dict[str, str] = {}
    for line in KNOWN_GAPS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(":")
            gaps[name.strip()] = reason.strip()
    return gaps


@dataclass(frozen=True)
class Outcome:
    """What a script did, comparable between real bash and an engine."""

    stdout: str
    stderr: str
    exit_code: int
    tree: Tree


def read_tree(root: Path) -> Tree:
    """A host folder as a :class:`Tree` (files, every folder, modes)."""
    files: dict[str, bytes] = {}
    dirs: set[str] = set()
    modes: dict[str, int] = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_symlink():
            continue
        if path.is_dir():
            dirs.add(relative)
        elif path.is_file():
            files[relative] = path.read_bytes()
            modes[relative] = path.stat().st_mode & 0o7777
    return Tree(files=files, dirs=frozenset(dirs), modes=modes)


def run_bash(script: str) -> Outcome:
    """``script`` run by real ``/bin/bash`` in an empty temporary folder."""
    with tempfile.TemporaryDirectory(prefix="shell-corpus-") as folder:
        root = Path(folder).resolve()
        env = {**SHELL_ENVIRONMENT, "HOME": str(root), "PWD": str(root)}
        done = subprocess.run(
            ["/bin/bash", "--norc", "--noprofile", "-c", script],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,
            check=False,
        )

        def text(data: bytes) -> str:
            return data.decode("utf-8", "replace").replace(str(root), WORKSPACE_ROOT)

        return Outcome(text(done.stdout), text(done.stderr), done.returncode, read_tree(root))


def outcome_of(result: ShellResult) -> Outcome:
    return Outcome(result.stdout, result.stderr, result.exit_code, result.tree)


def compare(script: str, expected: Outcome, actual: Outcome) -> list[str]:
    """How ``actual`` differs from ``expected`` (empty: it matches)."""
    problems: list[str] = []
    if actual.stdout != expected.stdout:
        problems.append(f"stdout {actual.stdout!r} != bash {expected.stdout!r}")
    if script.startswith(STDERR_MARK) and actual.stderr != expected.stderr:
        problems.append(f"stderr {actual.stderr!r} != bash {expected.stderr!r}")
    if actual.exit_code != expected.exit_code:
        problems.append(f"exit code {actual.exit_code} != bash {expected.exit_code}")
    if dict(actual.tree.files) != dict(expected.tree.files):
        problems.append(
            f"files {sorted(actual.tree.files)} != bash {sorted(expected.tree.files)} "
            "(or contents differ)"
        )
    if actual.tree.dirs != expected.tree.dirs:
        problems.append(f"dirs {sorted(actual.tree.dirs)} != bash {sorted(expected.tree.dirs)}")
    return problems


class JustBashShell:
    """:class:`Shell` on just-bash (pure Python), measured against bashkit; not shipped."""

    def __init__(self) -> None:

        self.name = f"just-bash {importlib.metadata.version('just-bash')}"

    async def run(
        self, script: str, tree: TreeLike | Mapping[str, bytes], limits: ShellLimits | None = None
    ) -> ShellResult:
        tree = Tree.of(tree)
        import just_bash

        limits = limits or ShellLimits()
        files: dict[str, str | bytes] = {
            f"{WORKSPACE_ROOT}/{path}": content for path, content in tree.files.items()
        }
        bash = just_bash.Bash(
            files=files,
            cwd=WORKSPACE_ROOT,
            env=dict(SHELL_ENVIRONMENT),
            limits=just_bash.ExecutionLimits(
                max_command_count=limits.max_commands,
                max_loop_iterations=limits.max_loop_iterations,
            ),
        )
        fs: Any = bash.fs
        await fs.mkdir(WORKSPACE_ROOT, recursive=True)
        for path in tree.dirs:
            await fs.mkdir(f"{WORKSPACE_ROOT}/{path}", recursive=True)
        async with asyncio.timeout(limits.timeout):
            result = await bash.exec(script)
        after_files: dict[str, bytes] = {}
        after_dirs: set[str] = set()
        pending = [""]
        while pending:
            relative = pending.pop()
            folder = f"{WORKSPACE_ROOT}/{relative}".rstrip("/")
            for name in await fs.readdir(folder):
                path = f"{relative}/{name}" if relative else name
                stat = await fs.stat(f"{WORKSPACE_ROOT}/{path}")
                if stat.is_directory:
                    after_dirs.add(path)
                    pending.append(path)
                elif stat.is_file:
                    after_files[path] = await fs.read_file_bytes(f"{WORKSPACE_ROOT}/{path}")
        return ShellResult(
            stdout=result.stdout,
            stderr=result.stderr,
            exit_code=result.exit_code,
            tree=Tree(files=after_files, dirs=frozenset(after_dirs)),
        )


async def measure(shell: Shell, expected: dict[str, Outcome]) -> dict[str, list[str]]:
    """Every corpus script run by ``shell``: name to its differences from bash."""
    failures: dict[str, list[str]] = {}
    for path in corpus():
        script = path.read_text()
        try:
            result = await shell.run(script, Tree(), LIMITS)
            problems = compare(script, expected[path.stem], outcome_of(result))
        except Exception as exc:  # an engine crash counts as a failure of that script
            problems = [f"engine raised {type(exc).__name__}: {exc}"]
        if problems:
            failures[path.stem] = problems
    return failures


def bash_outcomes() -> dict[str, Outcome]:
    """Real bash's outcome of every corpus script (four at a time: each is a process)."""
    paths = corpus()
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(lambda path: run_bash(path.read_text()), paths))
    return {path.stem: outcome for path, outcome in zip(paths, outcomes, strict=True)}


FEATURES = (
    *("|", ">", ">>", "2>&1", "<", "<<", "&&", "||", ";", "${", "*", "()", "$(", "$(("),
    *("if ", "for ", "while ", "case "),
)
COMMANDS = (
    *("cat", "ls", "mkdir", "rm", "mv", "cp", "touch", "find", "grep", "sed", "awk", "sort"),
    *("uniq", "wc", "head", "tail", "cut", "tr", "diff", "xargs", "echo", "printf", "tee", "jq"),
)


@pytest.fixture(scope="module")
def expected() -> dict[str, Outcome]:
    return bash_outcomes()


def test_the_corpus_covers_the_features() -> None:
    scripts = [path.read_text() for path in corpus()]
    assert len(scripts) >= 150
    for feature in (*FEATURES, *COMMANDS):
        assert sum(feature in script for script in scripts) >= 2, feature


def test_every_known_gap_names_a_script_and_a_reason() -> None:
    gaps = known_gaps()
    for name, reason in gaps.items():
        assert (CORPUS / f"{name}.sh").exists(), name
        assert reason, name


def test_the_comparison_sees_every_kind_of_difference() -> None:
    bash = run_bash("echo hi > f; mkdir d; echo out; echo err >&2; exit 3")
    assert bash.stdout == "out\n"
    assert bash.exit_code == 3
    assert dict(bash.tree.files) == {"f": b"hi\n"}
    assert bash.tree.dirs == {"d"}
    same = Outcome(bash.stdout, "other", bash.exit_code, bash.tree)
    assert compare("", bash, same) == []
    assert compare(STDERR_MARK, bash, same) != []
    for changed in (
        Outcome("out", bash.stderr, 3, bash.tree),
        Outcome(bash.stdout, bash.stderr, 0, bash.tree),
        Outcome(bash.stdout, bash.stderr, 3, Tree(files={"f": b"hi"}, dirs=frozenset({"d"}))),
        Outcome(bash.stdout, bash.stderr, 3, Tree(files={"f": b"hi\n"})),
    ):
        assert compare("", bash, changed) != [], changed


def test_the_engine_matches_real_bash(expected: dict[str, Outcome]) -> None:
    shell = default_shell()
    failures = anyio.run(measure, shell, expected)
    gaps = known_gaps()
    rate = 1 - len(failures) / len(expected)
    new = {name: problems for name, problems in failures.items() if name not in gaps}
    fixed = sorted(set(gaps) - set(failures))
    assert not new, f"{shell.name} now fails scripts that passed: {new}"
    assert not fixed, (
        f"{shell.name} now passes known gaps; remove them from known_gaps.txt: {fixed}"
    )
    assert rate >= PASS_RATE_FLOOR


HEAD_SCRIPTS = (
    'printf "a\\nb\\nc\\n" > f; head -n 2 f; head -2 f; head -n -1 f; head -c -2 f; head -c 3 f',
    'printf "a\\nb\\nc\\n" > f; head f f; head -q f f; head -v f; head -n 1 f - < f',
    'printf "a\\nb\\n" > f; mkdir d; head f nofile d f; echo $?',
    'printf "a\\nb\\n" > f; head -k f; head --foo f; head -n x f; head -c 2x f; head -n; echo $?',
    'printf "a\\0b\\0c" | head -z -n 2 | od -c; printf abc | head -n 1',
    'printf "x\\ny" | head -n -1; printf "x\\ny\\n" | head -n -0',
    'printf "a\\nb\\nc" | head -n -1; printf "a\\n\\n\\n" | head -n -1 | od -c; seq 5 | head -n 0',
    "seq 3000 > f; head -c 1K f | wc -c; head -c 1kB f | wc -c; head --lines=-2990 f",
    "seq 3 > f; head -qn1 f f; head -n 1 -- f; head f -n 1",
    "seq 20 | head -n -15; seq 20 | head -c -40; head -3c f; head --bytes 2 --lines 1 f; echo",
    "set -o pipefail; yes | head -n 1; echo $?; yes | head -n 200000 | wc -l",
    # size suffixes as GNU's xstrtoumax reads them: b k K m M G..Y, then B or D (1000) or iB
    "seq 3000 > f; for s in b k K m M G kB KB kiB KiB KD MD mB; do head -c 1$s f | wc -c; done"
    "; head -c k f | wc -c; head -c 1g f; head -c 1e f; head -c 1bB f; head -c 1iB f"
    "; head -c 1c f; head -c 1R f; echo $?",
    # past 2**64 - 1: refused as too large (GNU coreutils 9.1)
    "seq 3 > f; head -c 1Z f; head -n 99999999999999999999 f; head -n -99999999999999999999 f"
    "; head -c 18446744073709551616 f; head -c 99999999999999999999x f"
    "; head -c 18446744073709551615 f; echo $?",
    "seq 3 > f; head -n ' 2' f; head -c $'\\t3' f; echo; head -n -+2 f; head -n '- 2' f"
    "; head -n ' -2' f; head -n -x f; head -c -2y f; echo $?",
    # long options abbreviated, as getopt_long takes them
    "seq 3 > f; head --lin=1 f; head --by 2 f; echo; head --verb f; head --qui f f"
    "; head --s f f; head --zero f | od -c; head --v f; head --verbose=1 f; head --lin"
    "; head --foo=1 f; echo $?",
    # the obsolete first option: -N then letters (b k m multiply bytes)
    "seq 3 > f; head -1v f; head -1q f f; head -2z f | od -c; head -1b f | wc -c"
    "; head -1k f | wc -c; head -2cl f; head -1x f; head -1 -2 f; head -q1 f; echo $?",
    "seq 3 > f; head -n 1 f/; head -n 1 f/x; head -n 1 ''; mkdir d; head d/ f; echo $?",
    # here-documents, here-strings, functions, loops, $( ), after cd
    "head -n 2 <<EOT\none\ntwo\nthree\nEOT\nhead -c 4 <<< 'hello'; echo; head -n -1 <<< x"
    '\nf() { head -n "$1" "$2"; }; seq 10 > g; f 2 g; for n in 1 2; do f -$n g | tail -1; done'
    '\nx=$(head -1 g); echo "[$x]"; mkdir -p a/b; cp g a/b/h; cd a; head -n1 b/h ../g'
    "\nprintf 'a\\r\\nb\\xff\\n' | head -n 1 | od -c; printf 'x' | head -c -2; head -n 0 g",
)
"""Scripts for the shell's own ``head`` (GNU's, which bashkit's is replaced by), compared with
real bash as the corpus is; kept out of the corpus, whose pass rate measures the engines."""


SEQ_YES_SCRIPTS = (
    "seq 1 0 3; echo $?; seq 3 0 1; seq 1 -0 3; seq 1 0.0 3; seq 1 -00 2; echo $?",
    "seq -0 2; seq -00 1; seq -0 -1 -2; seq -0; seq 0 2; echo $?",
    "seq; echo $?; seq 1 2 3 4; echo $?; seq -s; echo $?",
    "yes a -- b | head -1; yes -- -- | head -1; yes - | head -1; yes --x; yes -x; yes a -x"
    "; yes --he | head -1; yes --help a | head -1; echo $?",
)
"""Scripts for the shell's own ``seq`` and ``yes``, compared with real bash as ``head``'s."""


@pytest.mark.parametrize("script", HEAD_SCRIPTS + SEQ_YES_SCRIPTS)
def test_head_seq_and_yes_match_real_bash(script: str) -> None:
    expected = run_bash(script)
    actual = outcome_of(anyio.run(default_shell().run, script, Tree(), LIMITS))
    assert compare(STDERR_MARK + "\n" + script, expected, actual) == []


async def _main() -> None:
    started = time.perf_counter()
    expected = bash_outcomes()
    print(f"real bash: {len(expected)} scripts in {time.perf_counter() - started:.1f} s")
    shells: list[Shell] = [default_shell(), JustBashShell()]
    for shell in shells:
        started = time.perf_counter()
        failures = await measure(shell, expected)
        passed = len(expected) - len(failures)
        print(
            f"{shell.name}: {passed}/{len(expected)} ({100 * passed / len(expected):.1f}%) "
            f"in {time.perf_counter() - started:.1f} s"
        )
        if "-v" in sys.argv:
            for name, problems in sorted(failures.items()):
                print(f"  {name}: {'; '.join(problems)[:300]}")


if __name__ == "__main__":
    asyncio.run(_main())
