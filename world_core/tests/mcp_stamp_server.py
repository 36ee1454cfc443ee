"""A real MCP server (the MCP SDK's, over stdio) for the pydantic-ai engine's MCP test.

Its one tool, ``stamp``, is an effect: one JSON line per call appended to the file named by
``MCP_SINK``.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("stamps")


@server.tool()
def stamp(label: str) -> str:
    """Stamp a label (an effect: one line in the sink file per call)."""
    with open(os.environ["MCP_SINK"], "a", encoding="utf-8") as sink:
        sink.write(json.dumps({"label": label}) + "\n")
    return f"stamped {label}"


if __name__ == "__main__":
    server.run()
