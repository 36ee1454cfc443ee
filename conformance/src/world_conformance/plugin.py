"""The ``world_conformance`` pytest plugin (loaded through the ``pytest11`` entry point).

Options:
    ``--world NAME``: the World the shipped ``TestSelectedWorld`` runs against (``pytest
    --pyargs world_conformance --world NAME``); contract classes whose ``world_name`` names
    another World are deselected, so ``--world postgres`` runs only Postgres's contracts.
    ``--world-url URL``: the server (or folder) of that World; needs ``--world``.
    ``--world-skip-known-gaps`` (or ``WORLD_SKIP_KNOWN_GAPS=1``): skip the tests a class lists
    in ``known_gaps`` instead of running them as strict xfails (quicker while iterating on
    slow gaps, such as a wait that only ends at its bound; CI should not set it, since a fixed
    gap then goes unnoticed).

Fixtures:
    ``world_name``: the class's (or module's) ``world_name``, else ``--world``; skips (or
    fails, under ``WORLD_REQUIRE``) when that World is not installed.
    ``world_url``: the server of that World, from ``--world-url`` or the session's
    provisioner (see :class:`world_conformance._provision.Provisioner`). Override it in a test
    class to aim the contracts at another server.
    ``world_target``: a :class:`~world_conformance.WorldTarget` with a fresh namespace.
    ``world``: that namespace opened, purged and closed after the test.
    ``world_servers``: the session's provisioner.

Environment:
    ``WORLD_TEST_<NAME>_URL``: a server per backend; ``WORLD_REQUIRE``: backends
    (comma-separated, or ``all``) whose missing server fails the test instead of skipping it.
    ``WORLD_CONFORMANCE_AREAS_ONLY_ON=<world>:<area>,<area>...``: run those contract areas
    only for that World, deselecting them for the others (a second run on another Python
    version exercises the layers above the SPI, which no backend changes, on one World).

A run in which every contract test was skipped (no World selected, not installed, no server)
checked nothing: it exits with status 1 and says what to set, instead of looking green. A
World that needs no server says so on its factory (``connect.needs_server = False``) and gets
a temporary folder, so ``pytest --pyargs world_conformance --world NAME`` needs no URL.

Loading this module imports no database driver, Docker client or testcontainers.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

import pytest

from world_conformance._base import ContractBase
from world_conformance._provision import (
    Provisioner,
    Unavailable,
    env_var,
    needs_server,
    required_names,
    server_key,
)
from world_conformance._support import fresh_namespace
from world_conformance._target import WorldTarget
from world_core import World, resolve_world
from world_core.errors import ConfigurationError

__all__ = [
    "world",
    "world_name",
    "world_servers",
    "world_target",
    "world_url",
]


@dataclass
class _Tally:
    """What the end-of-run report needs: the area and World of each contract test."""

    where: dict[str, tuple[str, str]] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)


_TALLY = pytest.StashKey[_Tally]()
_WHERE = "world_conformance_where"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("world", "world conformance suite")
    group.addoption(
        "--world",
        dest="world",
        default=None,
        metavar="NAME",
        help="World to run the contracts against (entry point, distribution or module:attr); "
        "deselects contract classes of other Worlds.",
    )
    group.addoption(
        "--world-url",
        dest="world_url",
        default=None,
        metavar="URL",
        help="server URL (or folder) of the World given by --world.",
    )
    group.addoption(
        "--world-skip-known-gaps",
        dest="world_skip_known_gaps",
        action="store_true",
        default=False,
        help="skip the known_gaps of each contract class instead of running them as strict "
        "xfails (also WORLD_SKIP_KNOWN_GAPS=1).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "world_process: a conformance test that spawns child processes"
    )
    if config.getoption("world_url") and not config.getoption("world"):
        raise pytest.UsageError("--world-url needs --world NAME to say which World it is for")
    tally = _Tally()
    config.stash[_TALLY] = tally
    config.pluginmanager.register(_Reporter(tally), "world_conformance_report")


def _defining_class(cls: type, name: str) -> type | None:
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _area(cls: type, name: str) -> str:
    klass = _defining_class(cls, name)
    if klass is None:
        return "world"
    area = vars(klass).get("contract_area")
    return area if isinstance(area, str) else "world"


def _check_known_gaps(cls: type[ContractBase]) -> None:
    for key in cls.known_gaps:
        base = key.split("[", 1)[0]
        if not base.startswith("test_") or not callable(getattr(cls, base, None)):
            raise pytest.UsageError(
                f"{cls.__qualname__}.known_gaps names {key!r}, which is no test of the class; "
                "use the test's name as the run shows it"
            )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    selected_world: str | None = config.getoption("world")
    skip_gaps = _skip_known_gaps(config)
    only_on, only_areas = _areas_only_on()
    tally = config.stash[_TALLY]
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    checked: set[type] = set()
    for item in items:
        cls = getattr(item, "cls", None)
        if not (isinstance(item, pytest.Function) and cls and issubclass(cls, ContractBase)):
            keep.append(item)
            continue
        if cls not in checked:
            _check_known_gaps(cls)
            checked.add(cls)
        name = cls.world_name
        if selected_world and name and server_key(name) != server_key(selected_world):
            dropped.append(item)
            continue
        if only_areas and _area(cls, item.originalname) in only_areas and name != only_on:
            dropped.append(item)
            continue
        keep.append(item)
        for key in (item.name, item.originalname):
            if key in cls.known_gaps:
                why = cls.known_gaps[key]
                if skip_gaps:
                    item.add_marker(pytest.mark.skip(reason=f"known gap, not run ({_GAPS}): {why}"))
                else:
                    item.add_marker(pytest.mark.xfail(reason=f"known gap: {why}", strict=True))
                break
        world = name or selected_world or "(no --world)"
        tally.where[item.nodeid] = (world, _area(cls, item.originalname))
        # Under pytest-xdist the controller collects nothing: its reporter learns the World and
        # area from each report, which carries the item's user_properties.
        item.user_properties.append((_WHERE, "\t".join(tally.where[item.nodeid])))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


_GAPS = "--world-skip-known-gaps or WORLD_SKIP_KNOWN_GAPS"


def _areas_only_on() -> tuple[str | None, frozenset[str]]:
    """``WORLD_CONFORMANCE_AREAS_ONLY_ON``: the World and the areas run only for it."""
    raw = os.environ.get("WORLD_CONFORMANCE_AREAS_ONLY_ON", "").strip()
    if not raw:
        return None, frozenset()
    world, sep, areas = raw.partition(":")
    names = frozenset(a.strip() for a in areas.split(",") if a.strip())
    if not sep or not world.strip() or not names:
        raise pytest.UsageError(
            f"WORLD_CONFORMANCE_AREAS_ONLY_ON={raw!r}: use <world>:<area>[,<area>...], e.g. "
            "local:journal,order"
        )
    return world.strip(), names


def _skip_known_gaps(config: pytest.Config) -> bool:
    if config.getoption("world_skip_known_gaps"):
        return True
    return os.environ.get("WORLD_SKIP_KNOWN_GAPS", "").strip().lower() in {"1", "true", "yes"}


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


_COLUMNS = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


class _Reporter:
    """Counts contract outcomes per World and area and prints them at the end of the run."""

    def __init__(self, tally: _Tally) -> None:
        self.tally = tally
        self.all_skipped = False

    def _explain_all_skipped(self, terminalreporter: pytest.TerminalReporter) -> None:
        tally = self.tally
        worlds = sorted({tally.where[nodeid][0] for nodeid in tally.outcome})
        terminalreporter.write_sep(
            "!", "world conformance: every contract test was skipped, nothing was checked"
        )
        write = terminalreporter.write_line
        for reason in sorted(set(tally.reason.values())):
            write(f"  skipped because: {reason}")
        for world in worlds:
            if world == "(no --world)":
                write("  select a World: pass --world NAME, or set world_name on the test class")
                continue
            write(
                f"  for {world}: set {env_var(server_key(world))} (or pass --world-url), or, if "
                "it needs no server, declare needs_server = False on its factory"
            )
        write("  exit status 1: a run that checked nothing must not pass")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tally = self.tally
        if report.nodeid not in tally.where:
            for key, value in report.user_properties:
                if key == _WHERE:
                    world, _, area = str(value).partition("\t")
                    tally.where[report.nodeid] = (world, area)
        if report.nodeid not in tally.where:
            return
        if report.when == "setup":
            if report.skipped:
                tally.outcome[report.nodeid] = "skipped"
                tally.reason[report.nodeid] = _skip_reason(report)
            elif report.failed:
                tally.outcome[report.nodeid] = "error"
        elif report.when == "call":
            if hasattr(report, "wasxfail"):
                tally.outcome[report.nodeid] = "xfailed" if report.skipped else "xpassed"
            elif report.skipped:
                tally.outcome[report.nodeid] = "skipped"
                tally.reason[report.nodeid] = _skip_reason(report)
            else:
                tally.outcome[report.nodeid] = report.outcome
        elif report.failed and tally.outcome.get(report.nodeid) != "failed":
            tally.outcome[report.nodeid] = "error"

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        outcomes = self.tally.outcome.values()
        if exitstatus == pytest.ExitCode.OK and outcomes and set(outcomes) == {"skipped"}:
            self.all_skipped = True
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tally = self.tally
        if not tally.outcome:
            return
        if self.all_skipped:
            self._explain_all_skipped(terminalreporter)
        counts: dict[tuple[str, str], Counter[str]] = {}
        reasons: Counter[tuple[str, str, str]] = Counter()
        for nodeid, outcome in tally.outcome.items():
            world, area = tally.where[nodeid]
            counts.setdefault((world, area), Counter())[outcome] += 1
            if outcome == "skipped":
                reasons[(world, area, tally.reason.get(nodeid, "?"))] += 1
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", "world conformance: results per contract area")
        wide = max(len("world"), *(len(world) for world, _ in counts)) + 2
        write(f"{'world':<{wide}}{'area':<12}" + "".join(f"{c:>9}" for c in _COLUMNS))
        for (world, area), counter in sorted(counts.items()):
            write(f"{world:<{wide}}{area:<12}" + "".join(f"{counter[c]:>9}" for c in _COLUMNS))
        if reasons:
            write("skipped, with reasons:")
            for (world, area, reason), count in sorted(reasons.items()):
                write(f"  {world} {area} ({count}): {reason}")


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


def _unavailable(name: str, reason: str) -> NoReturn:
    required = required_names()
    if "all" in required or name.lower() in required or server_key(name) in required:
        pytest.fail(f"{reason} (WORLD_REQUIRE names {name!r}, so this fails)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def world_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provisioner]:
    """The session's provisioner: one server per backend, containers stopped at the end."""
    provisioner = Provisioner(lambda stem: tmp_path_factory.mktemp(stem))
    try:
        yield provisioner
    finally:
        provisioner.close()


_INSTALLED: dict[str, str | None] = {}
_NEEDS_SERVER: dict[str, bool] = {}


@pytest.fixture
def world_name(request: pytest.FixtureRequest) -> str:
    """The World under test: the class's ``world_name``, the module's, else ``--world``."""
    name = getattr(request.cls, "world_name", None) or getattr(request.module, "world_name", None)
    name = name or request.config.getoption("world")
    if not isinstance(name, str) or not name:
        pytest.skip("no World selected: set world_name on the test class or pass --world NAME")
    if name not in _INSTALLED:
        try:
            _, factory = resolve_world(name)
            _INSTALLED[name] = None
            _NEEDS_SERVER[name] = needs_server(factory)
        except ConfigurationError as exc:
            _INSTALLED[name] = str(exc)
    problem = _INSTALLED[name]
    if problem is not None:
        _unavailable(name, problem)
    return name


@pytest.fixture
def world_url(request: pytest.FixtureRequest, world_name: str, world_servers: Provisioner) -> str:
    """The server (or folder) of the World under test; override in a class for another one."""
    given = request.config.getoption("world_url")
    if isinstance(given, str) and given:
        return given
    try:
        return world_servers.url(
            server_key(world_name), needs_server=_NEEDS_SERVER.get(world_name, True)
        )
    except Unavailable as exc:
        _unavailable(world_name, str(exc))


@pytest.fixture
def world_target(world_name: str, world_url: str) -> WorldTarget:
    """The World under test with a namespace no other test uses."""
    return WorldTarget(name=world_name, url=world_url, namespace=fresh_namespace())


@pytest.fixture
async def world(world_target: WorldTarget) -> AsyncIterator[World]:
    """The test's own namespace of the World under test; purged and closed afterwards."""
    async with world_target.scratch() as opened:
        yield opened
