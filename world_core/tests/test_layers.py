"""The layering rule of world_core: each layer imports only the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "world_core"

# Lowest first. A module may import its own layer and any layer listed before it.
LAYERS = [
    ("base", ["spi.py", "errors.py", "_select.py"]),
    ("journal", ["journal"]),
    ("workspace", ["workspace"]),
    ("observe", ["observe"]),
    ("integrations", ["integrations"]),
]
LAYER_OF_MODULE = {
    "world_core.spi": "base",
    "world_core.errors": "base",
    "world_core._select": "base",
    "world_core.journal": "journal",
    "world_core.workspace": "workspace",
    "world_core.observe": "observe",
    "world_core.integrations": "integrations",
}
ORDER = [name for name, _ in LAYERS]


def _files(entries: list[str]) -> list[Path]:
    found: list[Path] = []
    for entry in entries:
        path = PACKAGE / entry
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return found


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "world_core" or name.startswith("world_core.")}


def _layer(module: str) -> str | None:
    for prefix, layer in LAYER_OF_MODULE.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


@pytest.mark.parametrize(("layer", "entries"), LAYERS, ids=ORDER)
def test_a_layer_imports_only_layers_below_it(layer: str, entries: list[str]) -> None:
    allowed = set(ORDER[: ORDER.index(layer) + 1])
    upward: list[str] = []
    for path in _files(entries):
        for module in _imported(path):
            target = _layer(module)
            if module == "world_core" or target is None or target not in allowed:
                upward.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert upward == [], "imports that break the layering:\n" + "\n".join(upward)


def test_the_rule_has_teeth(tmp_path: Path) -> None:
    """The checker sees an upward import (journal importing the workspace)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from world_core.workspace import Documents\n", encoding="utf-8")
    assert _layer(next(iter(_imported(bad)))) == "workspace"
