"""Outbox: messages enqueued with a log append; across a crash, both or neither.

An append with messages, holding the log's lock:

1. writes an *intent* ``outbox/<log file name>`` (temporary file, fsync, rename): the messages
   with their ids and payloads, and where the log frame goes (the log file's uuid and offset);
2. appends the log frame, which lists the message ids: **the commit point**;
3. adds the messages to their queues (queue locks in name order; ids already there skipped);
4. removes the intent.

The append does steps 3 and 4 with the messages it holds (:func:`complete`): it wrote the
intent and the frame, so nothing is read back. An intent left by a crash is finished, under
the log's lock, by the next append to or delete of that log, and by any claim in the namespace
(which takes the log's lock only if it is free: whoever holds it finishes the intent itself).
Finishing means steps 3 and 4 when the log frame is there, step 4 alone when it is not. So a
committed append's messages are delivered at the latest by the next claim; they may become
visible a moment after the events, never before.
Locks are always taken log first, then queues, so this cannot deadlock with claims or acks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from world_core.spi import OutboxMessage
from world_local._files import FoldedFile, encode_frame, fsync_dir, read_frame, temp_file
from world_local._queue import Message, QueueFile, new_message
from world_local._space import Space

__all__ = ["FOLDER", "Pending", "begin", "complete", "finish", "pending_logs"]

FOLDER = "outbox"


def _path(space: Space, log: FoldedFile) -> str:
    # A plain string: finish() runs before every append, and a Path costs more than its open.
    return os.path.join(space.folder, FOLDER, log.path.name)


Pending = list[tuple[str, Message]]
"""The messages of an intent, each with its queue's name."""


def begin(space: Space, log: FoldedFile, messages: Sequence[OutboxMessage]) -> Pending:
    """Step 1, under the log's lock: record the intent durably; returns its messages (their
    ids go in the log frame, and :func:`complete` delivers them once it is committed)."""
    new = [new_message(m.payload, m.delay, m.dedup_key, m.max_attempts) for m in messages]
    meta = {
        "log": log.ident,
        "uuid": log.uuid,
        "offset": log.end,
        "messages": [
            {
                "queue": m.queue,
                "id": n.id,
                "visible_at": n.visible_at,
                "dedup_key": n.dedup_key,
                "max_attempts": n.max_attempts,
            }
            for m, n in zip(messages, new, strict=True)
        ],
    }
    folder = space.folder / FOLDER
    with temp_file(folder, encode_frame(meta, [m.payload for m in messages])) as tmp:
        os.rename(tmp, _path(space, log))
    fsync_dir(folder)
    return [(m.queue, n) for m, n in zip(messages, new, strict=True)]


def finish(space: Space, log: FoldedFile, fd: int | None) -> list[str]:
    """Steps 3 and 4 for the intent of ``log`` that a crash (or a failed commit) left, if
    there is one: its messages when its frame is there, none when not. Call under the log's
    lock with its state fresh. Returns the queues that received messages."""
    path = _path(space, log)
    try:
        intent_fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        intent = read_frame(intent_fd, 0)
    finally:
        os.close(intent_fd)
    assert intent is not None, "intents are renamed into place whole"
    _, meta, blobs = intent
    ids = [m["id"] for m in meta["messages"]]
    frame = read_frame(fd, meta["offset"]) if fd is not None else None
    committed = (
        meta["uuid"] == log.uuid
        and meta["offset"] < log.end
        and frame is not None
        and frame[1].get("outbox") == ids
    )
    pending: Pending = []
    if committed:
        for spec, (_, payload) in zip(meta["messages"], blobs, strict=True):
            pending.append((spec["queue"], _message(spec, payload)))
    return complete(space, log, pending)


def complete(space: Space, log: FoldedFile, pending: Pending) -> list[str]:
    """Steps 3 and 4: deliver ``pending`` (the messages of the intent of ``log`` whose frame
    is committed; none when it is not), then remove the intent. Call under the log's lock.
    The append that wrote the intent and committed the frame passes what :func:`begin`
    returned: it knows both, so nothing is read back (:func:`finish` reads them, for an
    intent a crash left). Returns the queues that received messages."""
    by_queue: dict[str, list[Message]] = {}
    for queue, message in pending:
        by_queue.setdefault(queue, []).append(message)
    for name in sorted(by_queue):
        _deliver(space.file(QueueFile, name), by_queue[name])
    os.unlink(_path(space, log))
    fsync_dir(space.folder / FOLDER)
    return sorted(by_queue)


def _deliver(queue: QueueFile, messages: list[Message]) -> None:
    def work(fd: int | None) -> None:
        assert fd is not None
        queue.add(fd, messages)

    queue.writing(work)


def _message(spec: dict[str, Any], payload: bytes) -> Message:
    return Message(
        id=spec["id"],
        payload=payload,
        order=0,
        visible_at=spec["visible_at"],
        max_attempts=spec["max_attempts"],
        dedup_key=spec["dedup_key"],
    )


def pending_logs(space: Space) -> list[str]:
    """The ids of the logs with an intent outstanding (normally none)."""
    folder = space.folder / FOLDER
    found: list[str] = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:  # nothing stored in this namespace yet
        return found
    for name in names:
        if name.startswith("."):
            continue
        try:
            fd = os.open(folder / name, os.O_RDONLY)
        except FileNotFoundError:
            continue  # finished meanwhile
        try:
            intent = read_frame(fd, 0)
        finally:
            os.close(fd)
        if intent is not None:
            found.append(intent[1]["log"])
    return found
