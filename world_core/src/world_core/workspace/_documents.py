"""Documents: typed JSON (pydantic models) that belong to a session, kept in its log.

A to-do list, a plan, a form the agent fills in: state of the session that is not the
conversation. A document named ``todo`` is the session state ``doc/todo`` of the journal's
generic staging hook: a tool's edits (``context.docs.put``) are staged with
``ToolContext.stage`` and committed in the same atomic append as the tool's outcome, and only
if the tool returns (an interrupted or failing tool edits nothing), so the documents never
disagree with the journal. Apps read and edit them with :class:`Documents`, without a database
of their own. Values above the blob threshold are stored as blobs.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from world_core.errors import InvalidArgumentError
from world_core.journal import ToolContext, read_state, write_state
from world_core.spi import World, validate_id

__all__ = ["DocumentEdits", "Documents", "check_document_name"]

M = TypeVar("M", bound=BaseModel)


def check_document_name(name: str) -> str:
    """A document name: a valid identifier without ``/``, at most 128 bytes."""
    validate_id(name, "document name")
    if "/" in name or len(name.encode("utf-8")) > 128:
        raise InvalidArgumentError(
            f"document name {name!r} must not contain '/' and must be at most 128 bytes"
        )
    return name


def _state_name(name: str) -> str:
    return f"doc/{check_document_name(name)}"


def _dump(value: BaseModel) -> Any:
    if not isinstance(value, BaseModel):
        raise InvalidArgumentError(
            f"a document is a pydantic model instance, got {type(value).__name__}"
        )
    return value.model_dump(mode="json")


class DocumentEdits:
    """A tool's view of the session's documents (``context.docs``): reads see the session's
    documents as of this step plus this call's own edits; edits are staged and committed with
    the tool's outcome."""

    def __init__(self, context: ToolContext) -> None:
        self._context = context

    def get(self, name: str, model: type[M]) -> M | None:
        """The document as ``model``, or None if it was never written."""
        value = self._context.state(_state_name(name))
        return None if value is None else model.model_validate(value)

    def put(self, name: str, value: BaseModel) -> None:
        """Stage a new value; committed with this tool call's outcome."""
        self._context.stage(_state_name(name), _dump(value))


ToolContext.extend("docs", DocumentEdits)


class Documents:
    """Read and edit a session's documents from outside a turn (an app, a chat route)."""

    def __init__(self, world: World) -> None:
        self._world = world

    async def get(self, session_id: str, name: str, model: type[M]) -> M | None:
        """The document's last value as ``model`` (one read of the session log), or None."""
        value = await read_state(self._world, session_id, _state_name(name))
        return None if value is None else model.model_validate(value)

    async def put(self, session_id: str, name: str, value: BaseModel) -> None:
        """Write a new value (one append; a blob first when large); tools running later see it."""
        await write_state(self._world, session_id, _state_name(name), _dump(value))
