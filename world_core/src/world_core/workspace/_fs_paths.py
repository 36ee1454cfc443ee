"""Workspace paths and limits: what may name a file, and how much a workspace may hold.

A path is relative to the workspace's root, ``/``-separated, UTF-8. It is normalised
lexically (there are no links in a workspace, so lexical is exact): ``.`` and empty parts are
dropped, ``a/../b`` is ``b``. Refused, with :class:`~world_core.errors.PathError` naming the
rule: a path that is not a ``str``, an absolute path, ``..`` climbing above the root, a
backslash, NUL or another control character (C0 ``\\x00``-``\\x1f``, DEL, C1
``\\x80``-``\\x9f``, and the line and paragraph separators U+2028 and U+2029, which end a
line in many readers), text that is not valid UTF-8 (a lone surrogate), a part over 255
bytes, a path over 1024 bytes or 64 levels deep. The root itself is ``""`` (given as ``""``,
``.`` or ``./``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from world_core.errors import InvalidArgumentError, PathError, WorkspaceLimitError
from world_core.spi import control_character

__all__ = [
    "MAX_DEPTH",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "WorkspaceLimits",
    "glob_regex",
    "normalize_path",
]

MAX_NAME_BYTES = 255
"""The longest part of a path (UTF-8 bytes), as on most filesystems."""

MAX_PATH_BYTES = 1024
"""The longest normalised path (UTF-8 bytes)."""

MAX_DEPTH = 64
"""The most parts a path may have."""


def normalize_path(path: object, *, what: str = "path") -> str:
    """``path`` normalised inside the workspace (``""`` is the root).

    Args:
        path: a relative, ``/``-separated path.
        what: how error messages name it (``"source"``, ``"destination"`` ...).

    Returns:
        The normalised path: no leading or trailing ``/``, no ``.``, ``..`` or empty parts.

    Raises:
        PathError: the path is refused (see the module docstring); the message says why.
    """
    if not isinstance(path, str):
        raise PathError(
            f"{what} must be a str (a path relative to the workspace root), got "
            f"{type(path).__name__}",
            path=repr(path),
        )
    if "\x00" in path:
        raise PathError(f"{what} {path!r} contains NUL; remove it", path=path)
    control = control_character(path)
    if control is not None:
        raise PathError(
            f"{what} {path!r} contains the control character U+{ord(control):04X} "
            "(control characters, such as newline, tab, U+0085 or U+2028, are refused); "
            "workspace names are printable text",
            path=path,
        )
    if "\\" in path:
        raise PathError(f"{what} {path!r} contains a backslash; separate parts with '/'", path=path)
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise PathError(f"{what} {path!r} is not valid UTF-8 text", path=path) from None
    if path.startswith("/"):
        raise PathError(
            f"{what} {path!r} is absolute; workspace paths are relative to its root (drop "
            "the leading '/')",
            path=path,
        )
    if size > 4 * MAX_PATH_BYTES:  # before splitting: refuse a huge string cheaply
        raise PathError(
            f"{what} is {size} bytes; the limit is {MAX_PATH_BYTES} (normalised)", path=path[:64]
        )
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise PathError(
                    f"{what} {path!r} climbs above the workspace root with '..'", path=path
                )
            parts.pop()
            continue
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise PathError(
                f"{what} {path!r} has a part of {len(part.encode('utf-8'))} bytes; the limit "
                f"is {MAX_NAME_BYTES}",
                path=path,
            )
        parts.append(part)
    if len(parts) > MAX_DEPTH:
        raise PathError(
            f"{what} {path!r} is {len(parts)} levels deep; the limit is {MAX_DEPTH}", path=path
        )
    normal = "/".join(parts)
    if len(normal.encode("utf-8")) > MAX_PATH_BYTES:
        raise PathError(
            f"{what} is {len(normal.encode('utf-8'))} bytes; the limit is {MAX_PATH_BYTES}",
            path=path,
        )
    return normal


def parent_of(path: str) -> str:
    """The parent of a normalised path (``""`` for a top-level entry)."""
    return path.rpartition("/")[0]


def ancestors(path: str) -> list[str]:
    """Every proper ancestor of a normalised path except the root, outermost first."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a normalised glob pattern: ``*`` and ``?`` within one part, ``[...]``
    classes (``[!...]`` negates), ``**`` as a whole part for any number of parts."""
    out: list[str] = []
    parts = pattern.split("/")
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        i = 0
        while i < len(part):
            char = part[i]
            if char == "*":
                out.append("[^/]*")
            elif char == "?":
                out.append("[^/]")
            elif char == "[":
                start = i + 1
                if part[start : start + 1] == "!":
                    start += 1
                if part[start : start + 1] == "]":
                    start += 1
                end = part.find("]", start)
                if end < 0:
                    out.append(re.escape(char))
                else:
                    body = part[i + 1 : end]
                    negate = body.startswith("!")
                    body = (body[1:] if negate else body).replace("\\", "\\\\")
                    body = body.replace("^", "\\^").replace("[", "\\[")
                    out.append(f"[{'^' if negate else ''}{body}]")
                    i = end
            else:
                out.append(re.escape(char))
            i += 1
        if not last:
            out.append("/")
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@dataclass(frozen=True)
class WorkspaceLimits:
    """How much a workspace may hold. A change that would pass one is refused with
    :class:`~world_core.errors.WorkspaceLimitError` naming it, and changes nothing.

    Attributes:
        max_file_bytes: the largest file (default 16 MiB).
        max_total_bytes: all files together (default 64 MiB).
        max_entries: files and directories together (default 4,096). The tree (one line per
            entry, about 100 bytes each) is written with every change, so keep it small.
    """

    max_file_bytes: int = 16 * 1024 * 1024
    max_total_bytes: int = 64 * 1024 * 1024
    max_entries: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_total_bytes", "max_entries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(
                    f"WorkspaceLimits.{name} must be an int >= 1, got {value!r}"
                )

    def refuse(self, name: str, needed: int, what: str) -> WorkspaceLimitError:
        """The error for ``what`` needing ``needed`` against limit ``name``."""
        allowed: int = getattr(self, name)
        return WorkspaceLimitError(
            f"{what} needs {name}={needed}, over the workspace's limit of {allowed}; nothing "
            f"was changed. Free space, or raise it: virtual(limits=WorkspaceLimits({name}=...)) "
            f"for tools, Workspace(world, limits=WorkspaceLimits({name}=...)) for apps",
            limit=name,
            allowed=allowed,
            needed=needed,
        )
