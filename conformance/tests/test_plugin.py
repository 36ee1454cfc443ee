"""The plugin's own behaviour: selection, provisioning, WORLD_REQUIRE, known gaps, report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from world_conformance._provision import (
    Provisioner,
    Unavailable,
    env_var,
    required_names,
    server_key,
)

ONE = "test_log_append_read_tail"


def _class(name: str, *, body: str = "", class_name: str = "TestW") -> str:
    return (
        "import pytest\nfrom world_conformance import WorldContract\n\n"
        f"class {class_name}(WorldContract):\n    world_name = {name!r}\n{body}\n"
    )


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "-W", "error", *args)


def test_unknown_world_skips_with_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_w=_class("no_such_world"))
    result = _run(pytester, "-rs", f"test_w.py::TestW::{ONE}")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*unknown World 'no_such_world'*"])
    result.stdout.fnmatch_lines(["*world conformance: results per contract area*"])


@pytest.mark.parametrize("require", ["no_such_world", "all", "other, no_such_world"])
def test_required_world_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, require: str
) -> None:
    monkeypatch.setenv("WORLD_REQUIRE", require)
    pytester.makepyfile(test_w=_class("no_such_world"))
    result = _run(pytester, f"test_w.py::TestW::{ONE}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*WORLD_REQUIRE names 'no_such_world'*"])


def test_required_other_world_still_skips(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_REQUIRE", "postgres")
    pytester.makepyfile(test_w=_class("no_such_world"))
    _run(pytester, f"test_w.py::TestW::{ONE}").assert_outcomes(skipped=1)


def test_fixed_known_gap_fails_strictly(pytester: pytest.Pytester) -> None:
    body = f"    known_gaps = {{{ONE!r}: 'pretend it is broken'}}"
    pytester.makepyfile(test_w=_class("local", body=body))
    result = _run(pytester, f"test_w.py::TestW::{ONE}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*pretend it is broken*"])


def test_real_known_gap_xfails(pytester: pytest.Pytester) -> None:
    test = "test_queue_fifo_for_immediate_messages"
    body = (
        f"    known_gaps = {{{test!r}: 'hands out newest first'}}\n"
        "    @pytest.fixture\n"
        "    def world_url(self, tmp_path):\n"
        "        return str(tmp_path)\n"
    )
    pytester.makepyfile(test_w=_class("faulty_worlds:lifo", body=body))
    _run(pytester, f"test_w.py::TestW::{test}").assert_outcomes(xfailed=1)


def test_known_gap_naming_no_test_stops_the_run(pytester: pytest.Pytester) -> None:
    body = "    known_gaps = {'test_no_such_thing': 'typo'}"
    pytester.makepyfile(test_w=_class("local", body=body))
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*known_gaps names 'test_no_such_thing'*"])


def test_world_url_needs_world(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_w=_class("local"))
    result = _run(pytester, "--world-url", "/tmp/x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--world-url needs --world*"])


def test_world_option_deselects_other_worlds(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_w=_class("local") + "\n" + _class("world-postgres", class_name="TestOther")
    )
    result = _run(pytester, "--world", "world_local", "--collect-only", "-q")
    collected = [line for line in result.outlines if line.startswith("test_w.py::")]
    assert collected
    assert all(line.startswith("test_w.py::TestW::") for line in collected)


def test_world_url_option_is_used(pytester: pytest.Pytester, tmp_path: Path) -> None:
    folder = tmp_path / "chosen"
    pytester.makepyfile(test_w=_class("local"))
    result = _run(pytester, "--world", "local", "--world-url", str(folder), "-k", ONE)
    result.assert_outcomes(passed=1)
    assert folder.exists(), "the World was not opened at --world-url"


def test_pyargs_runs_the_selected_world(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--pyargs", "world_conformance", "--world", "local", "-k", ONE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["local*log*1*0*0*0*0*0"])


def test_pyargs_without_world_skips_and_fails(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--pyargs", "world_conformance", "-rs", "-k", ONE)
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*no World selected*--world NAME*"])
    result.stdout.fnmatch_lines(["*every contract test was skipped, nothing was checked*"])


def test_all_skipped_for_want_of_a_server_fails_naming_the_variable(
    pytester: pytest.Pytester,
) -> None:
    """``--world NAME`` with no URL for a World that needs a server: every contract skips,
    and the run exits 1 naming the variable to set, instead of passing."""
    result = _run(pytester, "--pyargs", "world_conformance", "--world", "faulty_worlds:lifo")
    outcomes = result.parseoutcomes()
    assert set(outcomes) - {"deselected"} == {"skipped"}, outcomes
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*every contract test was skipped, nothing was checked*",
            "*skipped because: no server for World 'faulty_worlds': set "
            "WORLD_TEST_FAULTY_WORLDS_URL*",
            "*for faulty_worlds:lifo: set WORLD_TEST_FAULTY_WORLDS_URL (or pass --world-url)*",
        ]
    )


def test_report_and_all_skipped_guard_under_xdist(pytester: pytest.Pytester) -> None:
    """Under pytest-xdist (``make test`` runs with it) the controller collects nothing: the
    table per area and the exit 1 of a run that checked nothing come from the workers' reports
    (one worker is enough to have a controller that collects nothing)."""
    pytester.makepyfile(test_w=_class("no_such_world"))
    result = _run(pytester, "-n", "1", "-k", ONE)
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*every contract test was skipped, nothing was checked*",
            "*world conformance: results per contract area*",
            "no_such_world*log*0*0*0*1*0*0",
        ]
    )


def test_some_skipped_some_run_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_w=_class("local") + "\n" + _class("no_such_world", class_name="TestOther")
    )
    result = _run(pytester, "-k", ONE)
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK


SERVERLESS = """
import world_local

async def connect(*, url=None, namespace="default"):
    return await world_local.connect(url=url, namespace=namespace)

connect.needs_server = False
"""


def test_world_declaring_no_server_runs_without_url(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``needs_server = False`` on the factory: the one-liner runs with no URL (a temporary
    folder is handed to it), and ``WORLD_TEST_<NAME>_URL`` still wins when set."""
    pytester.makepyfile(serverless_world=SERVERLESS)
    monkeypatch.syspath_prepend(str(pytester.path))
    args = ("--pyargs", "world_conformance", "--world", "serverless_world:connect", "-k", ONE)
    _run(pytester, *args).assert_outcomes(passed=1)
    chosen = pytester.path / "chosen"
    monkeypatch.setenv("WORLD_TEST_SERVERLESS_WORLD_URL", str(chosen))
    _run(pytester, *args).assert_outcomes(passed=1)
    assert chosen.exists(), "WORLD_TEST_SERVERLESS_WORLD_URL was not used"


def test_loading_the_plugin_imports_no_driver() -> None:
    code = (
        "import sys, world_conformance.plugin\n"
        "bad = {'asyncpg', 'redis', 'pymongo', 'libsql', 'docker', 'testcontainers', "
        "'hypothesis', 'world_local', 'world_postgres', 'world_redis', 'world_mongo', "
        "'world_turso'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("postgres", "postgres"),
        ("world-postgres", "postgres"),
        ("world_postgres", "postgres"),
        ("world_postgres:connect", "postgres"),
        ("acme.worlds:connect", "acme"),
        ("Acme-DB", "acme_db"),
    ],
)
def test_server_key(name: str, key: str) -> None:
    assert server_key(name) == key


def test_env_var_and_required_names() -> None:
    assert env_var("postgres") == "WORLD_TEST_POSTGRES_URL"
    assert env_var("acme_db") == "WORLD_TEST_ACME_DB_URL"
    assert required_names(" Postgres, redis ,,") == {"postgres", "redis"}
    assert required_names("") == frozenset()


def test_provisioner_local_and_turso_get_temp_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_TEST_LOCAL_URL", raising=False)
    monkeypatch.delenv("WORLD_TEST_TURSO_URL", raising=False)
    made: list[str] = []

    def make(stem: str) -> Path:
        made.append(stem)
        folder = tmp_path / stem
        folder.mkdir()
        return folder

    provisioner = Provisioner(make)
    local = provisioner.url("local")
    assert Path(local).is_dir()
    assert provisioner.url("local") == local, "one server per backend per session"
    assert provisioner.url("turso") == f"file:{tmp_path / 'world-turso' / 'world.db'}"
    assert made == ["world-local", "world-turso"]
    monkeypatch.setenv("WORLD_TEST_TURSO_URL", "libsql://example.invalid")
    assert Provisioner(make).url("turso") == "libsql://example.invalid"


def test_provisioner_without_docker_uses_env_else_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provisioner = Provisioner(lambda stem: tmp_path)
    if provisioner._docker_unavailable() is None:
        pytest.skip("a Docker daemon answers here, so containers would be started")
    monkeypatch.delenv("WORLD_TEST_MONGO_URL", raising=False)
    with pytest.raises(Unavailable, match=r"no Docker daemon .* WORLD_TEST_MONGO_URL is not set"):
        provisioner.url("mongo")
    with pytest.raises(Unavailable):
        provisioner.url("mongo")  # the answer is kept for the session
    monkeypatch.setenv("WORLD_TEST_REDIS_URL", "redis://127.0.0.1:1/0")
    assert provisioner.url("redis") == "redis://127.0.0.1:1/0"
    monkeypatch.delenv("WORLD_TEST_ACME_URL", raising=False)
    with pytest.raises(Unavailable, match="WORLD_TEST_ACME_URL"):
        provisioner.url("acme")


def test_skip_known_gaps_when_asked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Known gaps run as strict xfails, unless --world-skip-known-gaps or
    WORLD_SKIP_KNOWN_GAPS=1 asks to skip them (a slow gap need not be waited for)."""
    body = f"    known_gaps = {{{ONE!r}: 'pretend it is slow'}}"
    pytester.makepyfile(test_w=_class("local", body=body))
    result = _run(pytester, "-rs", "--world-skip-known-gaps", f"test_w.py::TestW::{ONE}")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*known gap, not run (--world-skip-known-gaps*pretend it is slow"])
    monkeypatch.setenv("WORLD_SKIP_KNOWN_GAPS", "1")
    _run(pytester, f"test_w.py::TestW::{ONE}").assert_outcomes(skipped=1)
    monkeypatch.delenv("WORLD_SKIP_KNOWN_GAPS")
    _run(pytester, f"test_w.py::TestW::{ONE}").assert_outcomes(failed=1)  # strict XPASS


EXAMPLE = Path(__file__).parent.parent / "example_backend"


def test_outside_example_backend_runs_without_url(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The out-of-tree example (``conformance/example_backend``, run in full from wheels by
    ``.ci/outside-backend.sh``) still passes a contract from each area here, with no URL."""
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    tests = "test_log_append_read_tail or test_queue_fifo_for_immediate_messages"
    args = ("--pyargs", "world_conformance", "--world", "world_memory_example:connect")
    result = _run(pytester, *args, "-k", f"{tests} or test_process_claimers_never_share")
    result.assert_outcomes(passed=2, skipped=1)
