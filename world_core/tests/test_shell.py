"""The shell engine: confinement (no host files, processes or network) and limits."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from world_core.errors import ConfigurationError, InvalidArgumentError, ShellLimitError
from world_core.workspace import (
    LIMIT_EXIT_CODE,
    MAX_COMMANDS,
    MAX_FUNCTION_DEPTH,
    ShellLimits,
    ShellResult,
    Snapshot,
    Tree,
    default_shell,
)

pytestmark = pytest.mark.anyio

HOST_PASSWD = Path("/etc/passwd").read_text()
HOST_ROOT = [entry.name for entry in Path("/").iterdir()]
START = Tree(files={"notes/a.txt": b"alpha\n", "run.sh": b"echo hi\n"}, modes={"run.sh": 0o755})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def run(script: str, tree: Tree = START, **limits: float) -> ShellResult:
    # why: ShellLimits' fields are ints and floats by name; **limits are all typed float
    return await default_shell().run(script, tree, ShellLimits(**limits))  # type: ignore[arg-type]


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that records every connection it gets."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            got.append(b"connection")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], got
    stop.set()
    thread.join(timeout=5)
    server.close()


async def test_a_script_edits_the_tree_it_is_given() -> None:
    result = await run(
        "cat notes/a.txt; echo beta >> notes/a.txt; mkdir -p out/empty; mv run.sh out/; rm -r notes"
    )
    assert result.stdout == "alpha\n"
    assert result.exit_code == 0
    assert result.limit is None
    assert dict(result.tree.files) == {"out/run.sh": b"echo hi\n"}
    assert result.tree.dirs == {"out", "out/empty"}
    assert dict(result.tree.modes) == {"out/run.sh": 0o755}
    assert dict(START.files) == {"notes/a.txt": b"alpha\n", "run.sh": b"echo hi\n"}


async def test_the_same_script_on_the_same_tree_leaves_the_same_files() -> None:
    script = "for i in 1 2 3; do echo $i >> n.txt; done; sort -r n.txt > r.txt; cp -r notes b"
    first, second = await run(script), await run(script)
    assert first.tree == second.tree
    assert first.stdout == second.stdout


async def test_host_files_are_out_of_reach(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-42\n")
    host_lines = {  # (the engine's own /etc/passwd has the usual nobody line)
        line for line in HOST_PASSWD.splitlines() if line
    } - {"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"}
    assert any(line.startswith("root:") for line in host_lines)
    result = await run(
        f"cat /etc/passwd; cat {secret}; ls {tmp_path}; cat /proc/self/environ; cd /; ls; "
        f"cd ../../..; ls; cat ../../{str(secret).lstrip('/')}"
    )
    assert "host-secret-42" not in result.stdout + result.stderr
    assert not host_lines & set(result.stdout.splitlines())
    host_root = set(HOST_ROOT) - {
        "bin", "dev", "etc", "home", "proc", "root", "tmp", "usr", "workspace", "lib", "sbin",
    }  # fmt: skip
    assert not host_root & set(result.stdout.split())


async def test_no_write_reaches_the_host(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = await run(
        f"echo x > {marker}; echo x > ../../{str(marker).lstrip('/')}; "
        f"cd ../../../..; echo x > {str(marker).lstrip('/')}; mkdir -p {tmp_path}/d; "
        f"/bin/sh -c 'touch {marker}'; bash -c 'touch {marker}'; sh -c 'touch {marker}'; "
        f"exec touch {marker}"
    )
    assert not marker.exists()
    assert not (tmp_path / "d").exists()
    assert dict(result.tree.files) == dict(START.files)  # writes outside /workspace are gone


async def test_no_process_is_started(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for script in (
        f'python3 -c \'open("{marker}", "w")\'',
        f'/usr/bin/python3 -c \'open("{marker}", "w")\'',
        f'{sys.executable} -c \'open("{marker}", "w")\'',
        f"env touch {marker}",
        f"nohup touch {marker} &",
        f"xargs touch <<< {marker}",
        f"find / -maxdepth 0 -exec touch {marker} \\;",
    ):
        await run(script)
        assert not marker.exists(), script


async def test_no_network(listener: tuple[int, list[bytes]]) -> None:
    port, got = listener
    result = await run(
        f"curl -s http://127.0.0.1:{port}/; wget -q -O- http://127.0.0.1:{port}/; "
        f"exec 3<>/dev/tcp/127.0.0.1/{port}; nc 127.0.0.1 {port}; echo done"
    )
    await anyio.sleep(0.5)
    assert got == []
    assert "done" in result.stdout


async def test_a_script_past_its_time_is_stopped_and_changes_nothing() -> None:
    started = time.monotonic()
    result = await run(
        "echo partial > new.txt; rm run.sh; sleep 30", timeout=0.5, max_loop_iterations=10**9
    )
    assert time.monotonic() - started < 5
    assert result.limit == "time"
    assert result.exit_code == LIMIT_EXIT_CODE
    assert "ShellLimits.timeout" in result.stderr
    assert result.tree == START
    with pytest.raises(ShellLimitError, match=r"ShellLimits\.timeout") as caught:
        result.raise_for_limit()
    assert caught.value.limit == "time"


async def test_a_busy_loop_is_stopped() -> None:
    started = time.monotonic()
    result = await run("while true; do echo x > f; done", timeout=1.0)
    assert time.monotonic() - started < 5
    assert result.limit in ("time", "loop", "commands")
    assert result.tree == START


async def test_loop_iterations_are_limited() -> None:
    result = await run("for i in $(seq 1 50); do echo $i >> n.txt; done", max_loop_iterations=10)
    assert result.limit == "loop"
    assert "ShellLimits.max_loop_iterations" in result.stderr
    assert result.exit_code == LIMIT_EXIT_CODE
    assert result.tree == START
    assert (await run("for i in $(seq 1 5); do :; done", max_loop_iterations=10)).limit is None


async def test_commands_are_limited() -> None:
    result = await run("echo 1; echo 2; echo 3; echo 4; echo 5; touch t", max_commands=3)
    assert result.limit == "commands"
    assert "ShellLimits.max_commands" in result.stderr
    assert result.tree == START


async def test_output_is_limited() -> None:
    result = await run("seq 1 100000; touch t", max_output_bytes=1000)
    assert result.limit == "output"
    assert len(result.stdout.encode()) <= 1000
    assert "ShellLimits.max_output_bytes" in result.stderr
    assert result.tree == START
    endless = await run("while true; do echo aaaaaaaaaaaaaaaaaaaa; done", max_output_bytes=1000)
    assert endless.limit == "output"
    assert (await run("seq 1 100", max_output_bytes=1000)).limit is None


@pytest.mark.parametrize(
    "script",
    [
        "dd if=/dev/zero bs=1M count=3 2>/dev/null; touch t",  # one of bashkit's own
        "seq 1 200000; touch t",  # a live command of the shell's
        "head -c 3M /dev/zero >&2; touch t",
    ],
)
async def test_output_past_the_interpreters_cap_is_a_limit(script: str) -> None:
    """bashkit keeps at most 1 MiB of a script's stdout (and of its stderr) and drops the rest:
    an output of 3 MiB came back as its first 1 MiB with exit code 0 (exactly the limit, so not
    "more than" it). Now it is the ``output`` limit; and ``engine`` when ``max_output_bytes``
    is set above the interpreter's cap, which no setting raises."""
    result = await run(script)
    assert result.limit == "output", result
    assert result.exit_code == LIMIT_EXIT_CODE
    assert result.tree == START
    higher = await run(script, max_output_bytes=4 << 20)
    assert higher.limit == "engine", higher
    assert "the interpreter keeps at most 1048576" in higher.stderr
    assert higher.tree == START


async def test_memory_is_limited() -> None:
    result = await run("head -c 5000 /dev/zero > big; echo made", max_memory_bytes=4096)
    assert result.limit == "memory"
    assert "ShellLimits.max_memory_bytes" in result.stderr
    assert result.tree == START
    too_big = Tree(files={"big": b"x" * 5000})
    refused = await run("echo never", too_big, max_memory_bytes=4096)
    assert refused.limit == "memory"
    assert refused.stdout == ""
    assert (await run("head -c 100 /dev/zero > ok", max_memory_bytes=4096)).limit is None
    huge = Tree(files={"huge.bin": b"\x00" * 10_000_001})  # bashkit's own cap on one file
    refused = await run("echo never", huge)
    assert refused.limit == "memory"
    assert "'huge.bin' is 10000001 bytes" in refused.stderr


async def test_deep_recursion_is_stopped_with_a_clear_error() -> None:
    result = await run("f() { f; }; touch t; f")
    assert result.limit == "depth"
    assert result.exit_code == LIMIT_EXIT_CODE
    assert f"more than {MAX_FUNCTION_DEPTH} deep" in result.stderr
    assert result.tree == START
    ok = await run("f() { [ $1 -le 0 ] && return; f $(( $1 - 1 )); }; f 10; echo fine")
    assert ok.stdout == "fine\n"


@pytest.mark.parametrize(
    ("script", "cap"),
    [
        ("seq 1 100000000 | tail -1; touch t", "seq: output limit (16777216 bytes) exceeded"),
        ("seq 0.5 1 300000 | tail -1; touch t", "seq: line limit (100000) exceeded"),
        ("x=$(yes | head -c 200000000); echo ${#x}; touch t", "yes: output limit (4194304 bytes)"),
        ("printf '%20000s' a | wc -c; touch t", "format width 20000 exceeds limit 10000"),
        # the message reaches stderr even from a command substitution
        ("x=$(seq 0.5 1 300000 | tail -1); echo $x; touch t", "seq: line limit (100000) exceeded"),
    ],
)
async def test_an_interpreter_cap_that_cuts_output_short_stops_the_script(
    script: str, cap: str
) -> None:
    """bashkit caps some commands on its own (no setting raises these caps) and, past a cap,
    prints a line on stderr but goes on with the output cut short: ``seq 1 100000000 | tail
    -1`` printed 100000 with exit code 0. Now the run says its output is incomplete, as a
    limit does: exit code 124, limit ``engine``, the engine's line in stderr, no file
    changed."""
    result = await run(script)
    assert result.limit == "engine", result
    assert result.exit_code == LIMIT_EXIT_CODE
    assert cap in result.stderr
    assert "incomplete" in result.stderr
    assert result.tree == START
    with pytest.raises(ShellLimitError) as caught:
        result.raise_for_limit()
    assert caught.value.limit == "engine"


@pytest.mark.parametrize(
    "script",
    [
        "seq 0.5 1 300000 2>/dev/null | tail -1; touch t",
        "exec 2>/dev/null; seq 0.5 1 300000 | tail -1; touch t",
        "x=$(seq 0.5 1 300000 2>/tmp/err | tail -1); echo $x; touch t",
        "seq 1 100000000 2>/dev/null | tail -1; touch t",
        "yes 2>/dev/null | wc -l; touch t",
        "{ x=$(yes | head -c 20000000); } 2>/dev/null; echo ${#x}; touch t",
    ],
)
async def test_a_cap_is_seen_when_the_script_discards_its_stderr(script: str) -> None:
    """The cut was seen only in the line bashkit writes on the script's stderr: with
    ``2>/dev/null`` (or ``2>file``, ``exec 2>...``) the script discarded it and ``seq 1 300000
    2>/dev/null | tail -1`` printed 100000 with exit code 0. Now ``yes`` and ``seq`` report a
    cut to the shell itself, out of the script's reach."""
    result = await run(script)
    assert result.limit == "engine", result
    assert result.exit_code == LIMIT_EXIT_CODE
    assert "incomplete" in result.stderr
    assert result.tree == START


@pytest.mark.parametrize(
    ("script", "stdout"),
    [
        ("yes | head -n 8500 | wc -l", "8500\n"),
        ("yes | head -n 10000 | wc -l", "10000\n"),
        ("yes | head -n 30000 | wc -l", "30000\n"),
        ("yes abc | head -c 3000000 | wc -c", "3000000\n"),
        ("set -o pipefail; yes | head -n 1; echo $?", "y\n141\n"),  # as bash: SIGPIPE
        ("seq 1 1000000 | head -n 2", "1\n2\n"),
        ("seq 1 1000000 | head -n 100000 | tail -1", "100000\n"),
        ("seq 1 300000 | tail -1", "300000\n"),  # integers: counted past bashkit's 100,000
        # a reader done at the cap itself, or in the last write before it, is no cut either
        ("yes | head -c 4194304 | wc -c", "4194304\n"),
        ("yes | head -c 4194303 | wc -c", "4194303\n"),
        ("seq 1 10000000 | head -n 2236415 | tail -1", "2236415\n"),
        ("seq 1 10000000 | head -n 2236416 | tail -1", "2236416\n"),
        ("head -c 16M /dev/zero | wc -c", "16777216\n"),
    ],
)
async def test_a_reader_that_stops_early_is_no_cut(script: str, stdout: str) -> None:
    """``yes | head -n 9000`` printed the right 9000 lines but was stopped as a cut: bashkit's
    ``yes`` wrote all its 10,000 lines, and its cap line, although ``head`` needed fewer. Now
    ``yes`` streams until its reader is done, as the real one does (and past 10,000 lines);
    ``seq`` past its cap of 100,000 lines is a cut only when its reader takes all of them."""
    result = await run(script)
    assert result.limit is None, result
    assert (result.stdout, result.exit_code) == (stdout, 0)


@pytest.mark.parametrize(
    ("script", "stdout"),
    [
        ("seq 10000 | head -n 1; echo ${PIPESTATUS[@]}", "1\n0 0\n"),
        ("set -o pipefail; seq 10000 | head -n 2 >/dev/null; echo $?", "0\n"),
        ("seq 10000 | head -n 9000 | head -n 1; echo ${PIPESTATUS[@]}", "1\n0 0 0\n"),
        ("seq 100000 | head -n 1; echo ${PIPESTATUS[@]}", "1\n141 0\n"),  # past the pipe
        ("yes | head -n 1; echo ${PIPESTATUS[@]}", "y\n141 0\n"),
    ],
)
async def test_a_writer_whose_output_fits_in_a_pipe_ends_well(script: str, stdout: str) -> None:
    """A pipe holds 64 KiB: a real writer of less puts it all there and ends with status 0,
    however early its reader stops (``seq 10000 | head -n 1``: 48,894 bytes). Ours are
    handed on write by write, and ``seq`` and ``head`` ended with ``SIGPIPE`` (141) when the
    reader was gone before their second write; under ``set -o pipefail`` the pipeline then
    failed. Now a write past a gone reader ends the writer only beyond 64 KiB written."""
    result = await run(script)
    assert result.limit is None, result
    assert (result.stdout, result.exit_code) == (stdout, 0)


@pytest.mark.parametrize(
    ("script", "stdout"),
    [
        ("head -c 2000000 /dev/zero | wc -c", "2000000\n"),
        ("head -c 3M /dev/zero | tr -d '\\0' | wc -c", "0\n"),
        ("head -c 20000 /dev/urandom | wc -c", "20000\n"),
        ("cd /dev && head -c 10000 random | wc -c", "10000\n"),
        # each read is fresh, as from the real device
        (
            "a=$(head -c 8 /dev/urandom | od -An -tx1); b=$(head -c 8 /dev/urandom | od -An -tx1)"
            '; [ "$a" != "$b" ] && echo fresh',
            "fresh\n",
        ),
    ],
)
async def test_head_reads_the_devices_as_endless(script: str, stdout: str) -> None:
    """bashkit's ``/dev/zero`` ends after 1 MiB and ``/dev/urandom`` after 8 KiB, with no
    message: ``head -c 2000000 /dev/zero | wc -c`` printed 1048576 with exit code 0. ``head``
    now reads them as endless."""
    result = await run(script)
    assert result.limit is None, result
    assert (result.stdout, result.exit_code) == (stdout, 0)


@pytest.mark.parametrize(
    "script",
    [
        "head -c 20000000 /dev/zero 2>/dev/null | wc -c; touch t",
        "head -n 1 /dev/zero | wc -c; touch t",  # no newline in it: the real one never ends
    ],
)
async def test_head_past_its_device_cap_is_a_cut(script: str) -> None:
    result = await run(script)
    assert result.limit == "engine", result
    assert result.exit_code == LIMIT_EXIT_CODE
    assert "head: read limit (16777216 bytes) of /dev/zero exceeded" in result.stderr
    assert result.tree == START


async def test_the_engine_budget_for_a_pipeline_names_no_setting() -> None:
    """Past bashkit's budget for the bytes between commands (32,000,000, no knob), the run was
    stopped as the ``commands`` limit and told to raise ``max_commands``, which does not help.
    Now it is the ``engine`` cap, which says no setting raises it."""
    result = await run("for i in $(seq 40); do cat /dev/zero; done | wc -c; touch t")
    assert result.limit == "engine", result
    assert result.exit_code == LIMIT_EXIT_CODE
    assert "intermediate bytes" in result.stderr
    assert "max_commands" not in result.stderr
    assert result.tree == START


async def test_recursion_too_deep_in_a_background_job_stops_the_script() -> None:
    """A function nested past the interpreter's depth in ``f &`` ended that job only: the
    script exited 0 with no limit. Now it is the ``depth`` limit, as in the foreground."""
    result = await run("f() { f; }; f & wait; touch t; echo done")
    assert result.limit == "depth", result
    assert result.exit_code == LIMIT_EXIT_CODE
    assert f"more than {MAX_FUNCTION_DEPTH} deep" in result.stderr
    assert result.tree == START


async def test_output_under_the_interpreter_caps_is_not_a_limit() -> None:
    result = await run(
        "seq 1 100000 | tail -1; yes | head -n 5000 | wc -l; printf '%10000s' a | wc -c; "
        "echo 'seq: line limit (5) exceeded; output truncated'"  # on stdout: the script's own
    )
    assert result.limit is None, result
    assert result.stdout == (
        "100000\n5000\n10000\nseq: line limit (5) exceeded; output truncated\n"
    )


async def test_a_symbolic_link_is_named_as_not_kept() -> None:
    """A workspace holds no links: a link a script makes under /workspace is left out of the
    tree. Before, silently; now the result names it (``not_saved``) and stderr says why."""
    result = await run("ln -s notes/a.txt link; mkdir d; ln -s ../run.sh d/run; echo ok")
    assert result.exit_code == 0
    assert result.limit is None
    assert result.stdout == "ok\n"
    assert result.not_saved == ("d/run", "link")
    assert "not saved in the workspace" in result.stderr
    assert "'d/run' (a symbolic link), 'link' (a symbolic link)" in result.stderr
    assert result.tree == Tree(files=START.files, dirs=frozenset({"d"}), modes=START.modes)
    plain = await run("ln -s /workspace/run.sh /tmp/elsewhere; echo ok")  # outside: no note
    assert plain.not_saved == ()
    assert plain.stderr == ""


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("timeout", 0),
        ("timeout", float("inf")),
        ("timeout", True),
        ("max_output_bytes", 0),
        ("max_loop_iterations", -1),
        ("max_commands", 1.5),
        ("max_commands", MAX_COMMANDS + 1),
        ("max_memory_bytes", "1"),
    ],
)
def test_bad_limits_are_refused(setting: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=f"ShellLimits.{setting}"):
        # why: the wrong type is the point: its refusal is tested
        ShellLimits(**{setting: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "files",
    [{"/abs": b""}, {"../up": b""}, {"a/../b": b""}, {"a//b": b""}, {"n\x00ul": b""}, {"t": "s"}],
)
def test_bad_trees_are_refused(files: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        # why: the wrong type is the point: its refusal is tested
        Tree(files=files)  # type: ignore[arg-type]


async def test_a_snapshot_or_a_mapping_is_a_tree_too() -> None:
    snapshot = Snapshot(files={"a/b.txt": b"x\n"}, dirs=frozenset({"a", "e"}), modes={})
    from_snapshot = await default_shell().run("cat a/b.txt; ls", snapshot)
    assert from_snapshot.stdout == "x\na\ne\n"
    assert Tree.of(snapshot) == Tree(files={"a/b.txt": b"x\n"}, dirs=frozenset({"e"}))
    from_mapping = await default_shell().run("cat f", {"f": b"y"})
    assert from_mapping.stdout == "y"
    with pytest.raises(InvalidArgumentError, match="Snapshot"):
        # why: the wrong type is the point: its refusal is tested
        Tree.of(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ShellLimits"):
        # why: the wrong type is the point: its refusal is tested
        await default_shell().run("true", START, {"timeout": 1})  # type: ignore[arg-type]


def test_a_path_cannot_be_a_file_and_a_directory() -> None:
    with pytest.raises(InvalidArgumentError, match="both a file and a directory"):
        Tree(files={"a": b"", "a/b": b""})


async def test_bad_scripts_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="NUL"):
        await run("echo \x00")
    with pytest.raises(InvalidArgumentError, match="str"):
        # why: the wrong type is the point: its refusal is tested
        await default_shell().run(b"echo", START)  # type: ignore[arg-type]


def test_without_bashkit_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bashkit", None)
    monkeypatch.delitem(sys.modules, "world_core.workspace._shell_bashkit")
    with pytest.raises(ConfigurationError, match=r"pip install 'world-core\[shell\]'"):
        default_shell()
