"""The workspace layer: a session's documents (and, as it grows, its virtual filesystem).

Built on the journal's public API only: a tool's edits reach the log through the journal's
generic staging hook (``ToolContext.stage``), committed with the tool's outcome.
"""

from world_core.workspace._documents import DocumentEdits, Documents

__all__ = ["DocumentEdits", "Documents"]
