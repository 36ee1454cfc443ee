"""Choosing a World: entry points, distribution and package names, module:attr, errors."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from world_core import (
    ConfigurationError,
    InvalidIdentifierError,
    list_worlds,
    open_world,
    redact,
    resolve_world,
)
from world_core._select import ENTRY_POINT_GROUP

pytestmark = pytest.mark.anyio


def _entries(path: Path) -> list[Path]:
    return list(path.iterdir())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_local_is_installed_and_listed_without_importing_it() -> None:
    entries = {entry.name: entry for entry in list_worlds()}
    assert "local" in entries
    assert entries["local"].distribution == "world-local"
    assert entries["local"].value == "world_local:connect"


@pytest.mark.parametrize("spec", ["local", "world-local", "world_local", "World_Local", " local "])
def test_names_resolve_to_the_local_world(spec: str) -> None:
    name, factory = resolve_world(spec)
    assert name == "local"
    assert callable(factory)


def test_module_attr_resolves() -> None:
    name, factory = resolve_world("world_local:connect")
    assert name == "world_local:connect"
    assert callable(factory)


def test_default_is_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_TARGET_WORLD", raising=False)
    assert resolve_world()[0] == "local"


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_variable_is_refused_not_taken_for_the_default(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("WORKFLOW_TARGET_WORLD", value)
    with pytest.raises(ConfigurationError) as info:
        resolve_world()
    message = str(info.value)
    assert "WORKFLOW_TARGET_WORLD is set but empty" in message
    assert all(entry.name in message for entry in list_worlds())  # what to set it to
    assert "unset it" in message


def test_empty_argument_is_refused_naming_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKFLOW_TARGET_WORLD", "local")
    with pytest.raises(ConfigurationError, match=r"^target= is empty") as info:
        resolve_world(" ")
    assert "local" in str(info.value)


def test_environment_variable_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKFLOW_TARGET_WORLD", "world-local")
    assert resolve_world()[0] == "local"


def test_unknown_name_lists_installed_and_suggests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKFLOW_TARGET_WORLD", "locl")
    with pytest.raises(ConfigurationError) as info:
        resolve_world()
    message = str(info.value)
    assert "(from WORKFLOW_TARGET_WORLD)" in message
    assert "Did you mean 'local'?" in message
    assert "Installed: " in message
    assert "local" in message.split("Installed: ")[1]


def test_unknown_name_given_as_argument_names_the_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORKFLOW_TARGET_WORLD", "local")
    with pytest.raises(ConfigurationError) as info:
        resolve_world("locl")
    assert "(from target=)" in str(info.value)
    assert "WORKFLOW_TARGET_WORLD" not in str(info.value)


def test_unknown_module_names_the_module_and_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"no_such_module_xyz.*\(from target=\)"):
        resolve_world("no_such_module_xyz:factory")
    monkeypatch.setenv("WORKFLOW_TARGET_WORLD", "no_such_module_xyz:factory")
    with pytest.raises(ConfigurationError, match=r"\(from WORKFLOW_TARGET_WORLD\)"):
        resolve_world()


def test_missing_attribute_names_it() -> None:
    with pytest.raises(ConfigurationError, match="no_such_factory"):
        resolve_world("world_local:no_such_factory")


async def test_bad_namespace_is_refused_before_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORKFLOW_NAMESPACE", raising=False)
    with pytest.raises(InvalidIdentifierError) as info:
        async with open_world("local", url=str(tmp_path), namespace="Bad-Name"):
            pass
    # The argument was the source: the message names it, not the variable nobody set.
    assert "namespace 'Bad-Name' (from namespace=) is invalid" in str(info.value)
    assert "WORKFLOW_NAMESPACE" not in str(info.value)
    assert _entries(tmp_path) == []


@pytest.mark.parametrize("value", ["", "Bad-Name"])
async def test_bad_namespace_argument_wins_over_a_good_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("WORKFLOW_NAMESPACE", "tenant_a")
    with pytest.raises(InvalidIdentifierError, match=r"\(from namespace=\)"):
        async with open_world("local", url=str(tmp_path), namespace=value):
            pass
    assert _entries(tmp_path) == []


async def test_bad_namespace_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKFLOW_NAMESPACE", "Bad-Name")
    with pytest.raises(InvalidIdentifierError, match=r"'Bad-Name' \(from WORKFLOW_NAMESPACE\)"):
        async with open_world("local", url=str(tmp_path)):
            pass
    assert _entries(tmp_path) == []


async def test_namespace_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKFLOW_NAMESPACE", "tenant_a")
    async with open_world("local", url=str(tmp_path)) as world:
        assert world.namespace == "tenant_a"
        assert world.name == "local"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://user:s3cret@db:5432/app", "postgresql://user:***@db:5432/app"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("libsql://db.turso.io?authToken=abc.def&x=1", "libsql://db.turso.io?authToken=***&x=1"),
        ("mongodb://u:p%40ss@h/?password=x", "mongodb://u:***@h/?password=***"),
        ("file:/tmp/world.db", "file:/tmp/world.db"),
    ],
)
def test_redact_hides_credentials(url: str, expected: str) -> None:
    assert redact(url) == expected


def test_a_url_given_as_the_world_never_shows_its_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        resolve_world("postgresql://postgres:sekret@127.0.0.1:1/postgres")
    assert "sekret" not in str(caught.value)
    assert "***" in str(caught.value)


def _refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, code: str, target: str = ""
) -> str:
    """The message of the ConfigurationError that resolving ``target`` (default
    ``<module>:connect``) raises, ``module`` being ``code`` on the path."""
    (tmp_path / f"{module}.py").write_text(code + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError) as info:
        resolve_world(target or f"{module}:connect")
    return str(info.value)


def test_a_module_that_raises_on_import_is_named_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module whose own code fails (not an ImportError) is a configuration error naming the
    module, the exception and where it was raised, not a raw traceback."""
    (tmp_path / "broken_syntax_mod.py").write_text("def f(:\n")
    message = _refusal(
        tmp_path, monkeypatch, "raising_factory_mod", 'raise RuntimeError("API_KEY is missing")'
    )
    assert "importing 'raising_factory_mod' raised RuntimeError: API_KEY is missing" in message
    assert "raising_factory_mod.py:1" in message
    assert "(from target=)" in message
    with pytest.raises(ConfigurationError, match=r"raised SyntaxError.*broken_syntax_mod\.py:1"):
        resolve_world("broken_syntax_mod:connect")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("os:path", "is a module, not a World factory"),
        ("json:dumps", "cannot be called with url= and namespace="),
        ("os:getcwd", "cannot be called with url= and namespace="),
        ("builtins:dict", "returned a dict, not an awaitable"),
    ],
)
async def test_a_target_that_is_no_world_factory_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        async with open_world(spec):
            pass


@pytest.mark.parametrize(
    ("variable", "meant"),
    [("WORLD_TARGET_WORLD", "WORKFLOW_TARGET_WORLD"), ("WORLD_NAMESPACE", "WORKFLOW_NAMESPACE")],
)
async def test_a_misspelled_variable_is_refused_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    """``WORLD_TARGET_WORLD=postgres`` with the real variable unset would quietly open the
    local World (another store than the one named): refused, naming both variables."""
    monkeypatch.delenv("WORKFLOW_TARGET_WORLD", raising=False)
    monkeypatch.delenv("WORKFLOW_NAMESPACE", raising=False)
    monkeypatch.setenv(variable, "postgres")
    with pytest.raises(ConfigurationError) as info:
        async with open_world(url=str(tmp_path / "w")):
            pass
    assert f"{meant} is unset, but {variable} is set: did you mean {meant}?" in str(info.value)
    assert _entries(tmp_path) == []


def test_an_installed_world_that_raises_on_import_is_named_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend whose import fails with something other than an ImportError (its own code,
    a bad setting read at import): a ConfigurationError naming the World and the cause."""
    broken = metadata.EntryPoint(
        name="broken", value="broken_backend_mod:connect", group=ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(metadata, "entry_points", lambda group: [broken])
    message = _refusal(
        tmp_path,
        monkeypatch,
        "broken_backend_mod",
        'raise ValueError("bad default region")',
        "broken",
    )
    assert "World 'broken' (from target=) cannot be loaded" in message
    assert "raised ValueError: bad default region at " in message
    assert "broken_backend_mod.py:1" in message
