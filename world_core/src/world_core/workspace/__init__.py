"""The workspace layer: a session's documents and its virtual filesystem.

Built on the journal's public API only: a tool's edits reach the log through the journal's
generic staging hook (``ToolContext.stage``) and commit hooks, committed with the tool's
outcome.
"""

from world_core.workspace._documents import DocumentEdits, Documents
from world_core.workspace._fs import (
    TREE_DOCUMENT,
    BlockingFiles,
    FileEntry,
    Files,
    FileStat,
    FileTree,
    Snapshot,
    TreeDocument,
    TreeLike,
    VirtualWorkspace,
    Workspace,
    virtual,
)
from world_core.workspace._fs_paths import WorkspaceLimits, normalize_path
from world_core.workspace._shell import (
    LIMIT_EXIT_CODE,
    MAX_COMMANDS,
    MAX_FUNCTION_DEPTH,
    SHELL_ENVIRONMENT,
    WORKSPACE_ROOT,
    Limit,
    Shell,
    ShellLimits,
    ShellResult,
    Tree,
    default_shell,
)
from world_core.workspace._shell_tool import SHELL_TOOL_DESCRIPTION, bash_tool

__all__ = [
    "LIMIT_EXIT_CODE",
    "MAX_COMMANDS",
    "MAX_FUNCTION_DEPTH",
    "SHELL_ENVIRONMENT",
    "SHELL_TOOL_DESCRIPTION",
    "TREE_DOCUMENT",
    "WORKSPACE_ROOT",
    "BlockingFiles",
    "DocumentEdits",
    "Documents",
    "FileEntry",
    "FileStat",
    "FileTree",
    "Files",
    "Limit",
    "Shell",
    "ShellLimits",
    "ShellResult",
    "Snapshot",
    "Tree",
    "TreeDocument",
    "TreeLike",
    "VirtualWorkspace",
    "Workspace",
    "WorkspaceLimits",
    "bash_tool",
    "default_shell",
    "normalize_path",
    "virtual",
]
