"""The workspace layer: a session's documents (and, as it grows, its virtual filesystem).

Built on the journal's public API only: a tool's edits reach the log through the journal's
generic staging hook (``ToolContext.stage``), committed with the tool's outcome.
"""

from world_core.workspace._documents import DocumentEdits, Documents
from world_core.workspace._shell import (
    LIMIT_EXIT_CODE,
    SHELL_ENVIRONMENT,
    WORKSPACE_ROOT,
    Limit,
    Shell,
    ShellLimits,
    ShellResult,
    Tree,
    default_shell,
)

__all__ = [
    "LIMIT_EXIT_CODE",
    "SHELL_ENVIRONMENT",
    "WORKSPACE_ROOT",
    "DocumentEdits",
    "Documents",
    "Limit",
    "Shell",
    "ShellLimits",
    "ShellResult",
    "Tree",
    "default_shell",
]
