"""Choosing a World: ``WORKFLOW_TARGET_WORLD`` resolved through the ``workflow.worlds`` group.

A refused value is named with where it came from: the variable (``WORKFLOW_TARGET_WORLD``,
``WORKFLOW_NAMESPACE``) or the argument, written ``target=``, ``url=``, ``namespace=``. The
``world`` command prints its options (``--world``, ``--url``, ``--namespace``) in their place.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import cast

from world_core.errors import ConfigurationError, InvalidIdentifierError
from world_core.spi import World, WorldFactory, validate_namespace

__all__ = [
    "ENTRY_POINT_GROUP",
    "WorldEntry",
    "connect_world",
    "list_worlds",
    "open_world",
    "redact",
    "resolve_world",
]

ENTRY_POINT_GROUP = "workflow.worlds"
DEFAULT_WORLD = "local"
TARGET_VARIABLE = "WORKFLOW_TARGET_WORLD"
NAMESPACE_VARIABLE = "WORKFLOW_NAMESPACE"

# First-party backends, so that a known but missing one can be named with its package.
_KNOWN = {
    "local": "world-local",
    "postgres": "world-postgres",
    "mongo": "world-mongo",
    "redis": "world-redis",
    "turso": "world-turso",
}


@dataclass(frozen=True)
class WorldEntry:
    """An installed World: its entry-point name, what it points at, and its distribution."""

    name: str
    value: str
    distribution: str
    version: str


def list_worlds() -> list[WorldEntry]:
    """The installed Worlds (entry points of ``workflow.worlds``), by name. Imports nothing."""
    entries: dict[str, WorldEntry] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        entries.setdefault(
            ep.name,
            WorldEntry(
                name=ep.name,
                value=ep.value,
                distribution=dist.metadata["Name"] if dist is not None else "?",
                version=dist.version if dist is not None else "?",
            ),
        )
    return sorted(entries.values(), key=lambda entry: entry.name)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def load_attr(spec: str, setting: str) -> object:
    """Import ``module:attr`` (``attr`` may be dotted) given by ``setting`` (a variable, an
    argument such as ``target=``, or an option such as ``--agent``).

    Raises:
        ConfigurationError: the module cannot be imported or has no such attribute; the message
            names ``setting`` and ``spec``.
    """
    module_name, _, attr = spec.partition(":")
    shown = redact(spec)  # a URL passed here by mistake must not show its password
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"{shown!r} (from {setting}) cannot be loaded: cannot import {module_name!r}: {exc}. "
            "Install the package that provides it."
        ) from exc
    except Exception as exc:  # the module's own code failed (SyntaxError included)
        raise ConfigurationError(
            f"{shown!r} (from {setting}) cannot be loaded: importing {module_name!r} raised "
            f"{_raised(exc)}. Fix the module (run python -c 'import {module_name}' to see the "
            "whole traceback)"
        ) from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ConfigurationError(
                f"{shown!r} (from {setting}) cannot be loaded: {module_name!r} has no attribute "
                f"{shown.partition(':')[2]!r}"
            ) from exc
    return target


def _raised(exc: BaseException) -> str:
    """``exc`` for a message: its class and text, and where it was raised (file:line)."""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" at {exc.filename}:{exc.lineno}"
    elif exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" at {frame.filename}:{frame.lineno}"
    return f"{type(exc).__name__}: {exc}{where}"


def _refuse_misspelled(variable: str, fallback: str) -> None:
    """Refuse to fall back to ``fallback`` while ``variable`` is unset but a variable spelled
    almost like it is set (``WORLD_TARGET_WORLD=postgres``): the user meant to choose, and
    the fallback would quietly write to another store than the one they named.

    Raises:
        ConfigurationError: such a variable is set; the message names both.
    """
    candidates = [name for name in os.environ if name.upper() != variable and "_" in name]
    close = difflib.get_close_matches(variable, candidates, n=1, cutoff=0.8)
    if not close and variable.upper() in {name.upper() for name in os.environ}:
        close = [name for name in os.environ if name.upper() == variable.upper()]
    if close:
        raise ConfigurationError(
            f"{variable} is unset, but {close[0]} is set: did you mean {variable}? Rename it "
            f"(or unset {close[0]}); refusing to fall back to {fallback} meanwhile"
        )


def _installed_names() -> str:
    return ", ".join(entry.name for entry in list_worlds()) or "none"


def _target(target: str | None) -> tuple[str, str]:
    """The World asked for and where the request came from (for messages)."""
    if target is None:
        raw = os.environ.get(TARGET_VARIABLE)
        if raw is None:
            _refuse_misspelled(TARGET_VARIABLE, f"the default World, {DEFAULT_WORLD!r}")
            return DEFAULT_WORLD, f"the default: {TARGET_VARIABLE} is unset"
        spec, source = raw.strip(), TARGET_VARIABLE
        if not spec:
            # An empty variable is a mistake (`X=$UNSET_VAR`), not a choice of the default.
            raise ConfigurationError(
                f"{TARGET_VARIABLE} is set but empty: set it to one of the installed Worlds "
                f"({_installed_names()}), or unset it for the default, {DEFAULT_WORLD!r}"
            )
        return spec, source
    spec = target.strip()
    if not spec:
        raise ConfigurationError(
            f"target= is empty: name one of the installed Worlds ({_installed_names()}), or "
            f"leave target= out to use {TARGET_VARIABLE}, else {DEFAULT_WORLD!r}"
        )
    return spec, "target="


def resolve_world(target: str | None = None) -> tuple[str, WorldFactory]:
    """Find the factory for ``target`` (default: ``WORKFLOW_TARGET_WORLD``, else ``local``).

    ``target`` is an entry-point name (``postgres``), a distribution or package name
    (``world-postgres``, ``world_postgres``) or ``module:attr``. Only the chosen entry point is
    imported.

    Returns:
        The World's short name and its factory.

    Raises:
        ConfigurationError: unknown name (the message lists the installed Worlds and the
            closest match), a known World whose package is not installed or fails to import,
            or an empty name (``WORKFLOW_TARGET_WORLD`` set but empty; unset means ``local``).
    """
    spec, source = _target(target)
    if ":" in spec:
        factory = load_attr(spec, source)
        if not callable(factory):
            raise ConfigurationError(
                f"{redact(spec)!r} (from {source}) is a {type(factory).__name__}, not a World "
                "factory: name an async function taking url= and namespace= that returns a World"
            )
        return spec, cast(WorldFactory, factory)
    wanted = _normalize(spec)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist_name = _normalize(ep.dist.metadata["Name"]) if ep.dist is not None else ""
        package = _normalize(ep.value.split(":")[0].split(".")[0])
        if wanted in (_normalize(ep.name), dist_name, package):
            try:
                factory = ep.load()
            except ImportError as exc:
                raise ConfigurationError(
                    f"World {ep.name!r} is installed but cannot be imported: {exc}. "
                    f"Reinstall it: pip install --force-reinstall {dist_name or ep.name}"
                ) from exc
            except Exception as exc:  # the backend's own import-time code failed
                raise ConfigurationError(
                    f"World {ep.name!r} (from {source}) cannot be loaded: importing "
                    f"{ep.value!r} raised {_raised(exc)}"
                ) from exc
            return ep.name, cast(WorldFactory, factory)
    installed = [entry.name for entry in list_worlds()]
    for short, dist in _KNOWN.items():
        if wanted in (short, _normalize(dist)) and short not in installed:
            raise ConfigurationError(
                f"World {short!r} (from {source}) is not installed: pip install {dist} "
                f"(installed: {', '.join(installed) or 'none'})"
            )
    close = difflib.get_close_matches(spec, installed + list(_KNOWN), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigurationError(
        f"unknown World {spec!r} (from {source}).{hint} "
        f"Installed: {', '.join(installed) or 'none'}; "
        "or give a distribution name or module:attr."
    )


def _namespace(namespace: str | None) -> str:
    """``namespace``, else ``WORKFLOW_NAMESPACE`` (unset or empty: ``default``), validated.

    Raises:
        InvalidIdentifierError: the value does not match the namespace pattern; the message
            names where it came from (``namespace=`` or ``WORKFLOW_NAMESPACE``).
    """
    if namespace is not None:
        value, source = namespace, "namespace="
    else:
        value, source = os.environ.get(NAMESPACE_VARIABLE, ""), NAMESPACE_VARIABLE
        if not value:
            if NAMESPACE_VARIABLE not in os.environ:
                _refuse_misspelled(NAMESPACE_VARIABLE, "the namespace 'default'")
            return "default"
    try:
        return validate_namespace(value)
    except InvalidIdentifierError as exc:
        raise InvalidIdentifierError(
            f"namespace {value!r} (from {source}) is invalid: use 1 to 48 lower-case letters, "
            "digits and '_', starting with a letter or digit"
        ) from exc


async def connect_world(
    target: str | None = None, *, url: str | None = None, namespace: str | None = None
) -> World:
    """Open a World without a context manager; the caller must ``await world.aclose()``."""
    name, factory = resolve_world(target)
    namespace = _namespace(namespace)
    try:
        inspect.signature(factory).bind(url=url, namespace=namespace)
    except TypeError as exc:
        raise ConfigurationError(
            f"World factory {redact(name)!r} cannot be called with url= and namespace= "
            f"({exc}): name an async function taking them that returns a World"
        ) from exc
    except ValueError:  # no signature to inspect (a builtin): let the call say
        pass
    opening: object = factory(url=url, namespace=namespace)
    if not inspect.isawaitable(opening):
        raise ConfigurationError(
            f"World factory {redact(name)!r} returned a {type(opening).__name__}, not an "
            "awaitable: name an async function that returns a World"
        )
    world: object = await opening
    if not isinstance(world, World):
        raise ConfigurationError(
            f"World factory {redact(name)!r} returned a {type(world).__name__}, not a World"
        )
    return world


@asynccontextmanager
async def open_world(
    target: str | None = None, *, url: str | None = None, namespace: str | None = None
) -> AsyncIterator[World]:
    """Open the selected World for the duration of an ``async with`` block.

    Args:
        target: see :func:`resolve_world`; None reads ``WORKFLOW_TARGET_WORLD``.
        url: the backend's URL (or folder, for local files); None reads its own variable.
        namespace: isolates apps or tenants on one server; None reads ``WORKFLOW_NAMESPACE``,
            else ``default``.

    Raises:
        ConfigurationError: see :func:`resolve_world`, or a backend setting missing.
        InvalidIdentifierError: the namespace is invalid (the message names its source).
    """
    world = await connect_world(target, url=url, namespace=namespace)
    try:
        yield world
    finally:
        await world.aclose()


_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:password|passwd|pwd|token|authtoken|auth_token|secret|key)=)[^&]*"
)
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^@/]*@")


def redact(url: str) -> str:
    """``url`` with any password in the user-info part and any secret query value masked."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1:***@", url))
