"""Documents: typed JSON (pydantic models) that belong to a session, kept in its log.

A to-do list, a plan, a form the agent fills in: state of the session that is not the
conversation. Each edit is one ``doc`` event in the session log; a document's value is its last
edit in log order. Tools edit through ``context.docs``; those edits are committed in the same
atomic append as the tool's outcome, and only if the tool returns (an interrupted or failing
tool edits nothing), so the documents never disagree with the journal. Apps read and edit them
with :class:`Documents`, without a database of their own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from world_core.errors import InvalidArgumentError
from world_core.spi import NewEvent, World, validate_id

__all__ = ["DocumentEdits", "Documents", "check_document_name", "document_event"]

M = TypeVar("M", bound=BaseModel)


def check_document_name(name: str) -> str:
    """A document name: a valid identifier without ``/``, at most 128 bytes."""
    validate_id(name, "document name")
    if "/" in name or len(name.encode("utf-8")) > 128:
        raise InvalidArgumentError(
            f"document name {name!r} must not contain '/' and must be at most 128 bytes"
        )
    return name


def document_event(name: str, value: Any, *, key: str | None = None, **extra: Any) -> NewEvent:
    data = {"t": "doc", "name": name, "value": value, **extra}
    encoded = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return NewEvent(key=key, data=encoded.encode("utf-8"))


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

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self._state: Mapping[str, Any] = state if state is not None else {}
        self.staged: dict[str, Any] = {}

    def get(self, name: str, model: type[M]) -> M | None:
        """The document as ``model``, or None if it was never written."""
        check_document_name(name)
        value = self.staged.get(name, self._state.get(name))
        return None if value is None else model.model_validate(value)

    def put(self, name: str, value: BaseModel) -> None:
        """Stage a new value; committed with this tool call's outcome."""
        self.staged[check_document_name(name)] = _dump(value)


class Documents:
    """Read and edit a session's documents from outside a turn (an app, a chat route)."""

    def __init__(self, world: World) -> None:
        self._world = world

    async def get(self, session_id: str, name: str, model: type[M]) -> M | None:
        """The document's last value as ``model`` (one read of the session log), or None."""
        from world_core.journal._journal import session_log_id

        check_document_name(name)
        value: Any = None
        for event in await self._world.log.read(session_log_id(session_id)):
            try:
                body = json.loads(event.data)
            except ValueError:
                continue
            if isinstance(body, dict) and body.get("t") == "doc" and body.get("name") == name:
                value = body["value"]
        return None if value is None else model.model_validate(value)

    async def put(self, session_id: str, name: str, value: BaseModel) -> None:
        """Write a new value (one append); tools running later see it."""
        from world_core.journal._journal import session_log_id

        event = document_event(check_document_name(name), _dump(value))
        await self._world.log.append(session_log_id(session_id), [event])
