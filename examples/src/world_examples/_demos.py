"""The demos ``world demo`` can run, kept apart so the command line lists them without importing
any demo.

Each demo besides the crash matrix is a module with ``introduce(screen, world, namespace, base,
where, inbox)`` and ``async run(ctx, as_json) -> int``, run on the set-up of
:func:`world_examples.demo.run_demo`. A demo whose module or framework is not installed is not
offered (:data:`MISSING` says what to install for it).
"""

from __future__ import annotations

from importlib.util import find_spec

__all__ = ["DEMOS", "DEMO_MODULES", "MISSING"]

_DEMO_NEEDS: dict[str, tuple[str, str | None, str]] = {
    "approval": ("world_examples.approval_demo", None, ""),
    "workspace": ("world_examples.workspace_demo", "bashkit", "world-core[shell]"),
    "pydantic-ai": ("world_examples.pydantic_ai_demo", "pydantic_ai", "world-core[pydantic-ai]"),
    "langgraph": ("world_examples.langgraph_demo", "langgraph", "world-core[langgraph]"),
    "openai-agents": ("world_examples.openai_agents_demo", "agents", "world-core[openai-agents]"),
}
"""Demo name: (its module, the package it needs, the extra that installs that package)."""


def _present(module: str | None) -> bool:
    if module is None:
        return True
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


DEMO_MODULES: dict[str, str] = {
    name: module
    for name, (module, needs, _) in _DEMO_NEEDS.items()
    if _present(module) and _present(needs)
}
"""The demos this installation can run, by name: their module."""

MISSING: dict[str, str] = {
    name: extra
    for name, (module, needs, extra) in _DEMO_NEEDS.items()
    if name not in DEMO_MODULES and _present(module)
}
"""Demos whose framework is not installed: what to install for each (``pip install ...``)."""

DEMOS: tuple[str, ...] = ("crashes", *DEMO_MODULES)
"""``crashes`` (the crash matrix, the default) and every demo of :data:`DEMO_MODULES`."""
