"""The demos ``world demo`` can run, kept apart so the command line lists them without importing
any demo.

Each demo besides the crash matrix is a module with ``introduce(screen, world, namespace, base,
where, inbox)`` and ``async run(ctx, as_json) -> int``, run on the set-up of
:func:`world_examples.demo.run_demo`. A demo whose module (or whose framework) is not installed
is not offered.
"""

from __future__ import annotations

from importlib.util import find_spec

__all__ = ["DEMOS", "DEMO_MODULES"]

DEMO_MODULES: dict[str, str] = {
    "approval": "world_examples.approval_demo",
    "workspace": "world_examples.workspace_demo",
    "pydantic-ai": "world_examples.pydantic_ai_demo",
    "langgraph": "world_examples.langgraph_demo",
    "openai-agents": "world_examples.openai_agents_demo",
}

DEMOS: tuple[str, ...] = (
    "crashes",
    *(name for name, module in DEMO_MODULES.items() if find_spec(module) is not None),
)
"""``crashes`` (the crash matrix, the default) and every demo of :data:`DEMO_MODULES` present."""
