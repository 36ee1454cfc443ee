"""Content-addressed blobs: bytes stored once under their sha-256, as closed streams.

A blob lives in a stream cut into chunks of at most ``chunk_size`` bytes. It counts as stored
only once that stream is closed; a writer that died half-way left an open stream holding a
prefix of the same bytes (same digest), which the next ``put`` completes from the byte where
it ends, whatever the chunk size of either writer. Readers check size and digest, so a damaged
blob is an error, never data.

Who owns a blob (so deleting a session deletes its blobs and only its blobs)
    A session's blobs are its own: :func:`session_blobs` stores them in streams
    ``blob/<scope>/<hex>``, ``<scope>`` the first 32 hex digits of the sha-256 of the session
    id, so the same bytes in two sessions are two blobs and deleting one session can never
    take a blob another session reads (no reference count to keep right under crashes and
    races; the price is that identical bytes are stored once per session, not once per
    namespace). Within a session a blob is still stored once. Streams cannot be listed, so
    each session keeps an index, the log ``blobindex/<scope>``: one event keyed by the hex
    digest, appended *before* the blob's stream is first written, so the index names every
    stream the session may have written (a superset: a put that died after indexing left at
    most an open prefix). :meth:`Blobs.delete_all` deletes every indexed stream, then the
    index. Blobs written before sessions owned theirs (``blob/sha256/<hex>``, and those of a
    :class:`Blobs` made without a session, such as ``Blobs(world.stream)``) are shared by
    whoever wrote the same bytes: a session's reader still finds them (one more ``info`` when
    its own stream has no such blob), and deleting a session keeps them.
"""

from __future__ import annotations

import contextlib
import hashlib

import anyio
from pydantic import BaseModel, ConfigDict

from world_core.errors import (
    ClosedError,
    ConflictError,
    DuplicateKeyError,
    InvalidArgumentError,
    NotFoundError,
)
from world_core.spi import Log, NewEvent, Stream, World, validate_id

__all__ = ["BlobRef", "Blobs", "blob_scope", "session_blobs"]

_WRITE_BYTES = 4 * 1024 * 1024  # per Stream.write call, well under MAX_PAYLOAD_BYTES
_INDEX_PAGE = 1000  # index events read per call when deleting
_RESUME_SECONDS = 30.0  # to read the chunks a put that died half-way left


def blob_scope(session_id: str) -> str:
    """The part of a session's blob stream ids (and its index log id) that names the session:
    the first 32 hex digits of the sha-256 of its id."""
    validate_id(session_id, "session_id")
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def session_blobs(world: World, session_id: str) -> Blobs:
    """The blobs of one session: stored under its scope and indexed (see the module), so
    deleting the session deletes them."""
    return Blobs(world.stream, owner=(world.log, blob_scope(session_id)))


class BlobRef(BaseModel):
    """What a journal keeps instead of the bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str
    size: int

    @property
    def stream_id(self) -> str:
        """The stream of the blob stored without an owner (``Blobs(world.stream)``)."""
        return f"blob/sha256/{self.digest}"


class Blobs:
    """Blob store over a World's stream.

    Args:
        stream: the World's stream.
        chunk_size: bytes per chunk of a blob's stream.
        owner: the World's log and a session's :func:`blob_scope` (use :func:`session_blobs`):
            blobs are the session's own and indexed; None for blobs shared namespace-wide.
    """

    def __init__(
        self, stream: Stream, *, chunk_size: int = 1024 * 1024, owner: tuple[Log, str] | None = None
    ) -> None:
        if chunk_size < 1 or chunk_size > _WRITE_BYTES:
            raise InvalidArgumentError(f"chunk_size must be 1 to {_WRITE_BYTES} bytes")
        self._stream = stream
        self._chunk_size = chunk_size
        self._owner = owner

    def stream_id(self, ref: BlobRef) -> str:
        """The stream this store keeps ``ref``'s bytes in."""
        if self._owner is None:
            return ref.stream_id
        return f"blob/{self._owner[1]}/{ref.digest}"

    async def put(self, data: bytes) -> BlobRef:
        """Store ``data`` (idempotent: storing the same bytes again writes nothing)."""
        ref = BlobRef(digest=hashlib.sha256(data).hexdigest(), size=len(data))
        stream_id = self.stream_id(ref)
        indexed = self._owner is None
        for _ in range(5):  # another writer of the same bytes may be racing us
            info = await self._stream.info(stream_id)
            if info.closed:
                return ref
            if not indexed:
                await self._index(ref)
                indexed = True
            start = info.next_index
            # The rest of the bytes, cut from where the chunks there end: a writer that died
            # half-way may have cut them otherwise (another chunk_size).
            done = await self._written(stream_id, start, data) if start else 0
            cut = self._chunk_size
            rest = [data[i : i + cut] for i in range(done, len(data), cut)]
            try:
                sent = 0  # of rest
                while sent < len(rest):
                    batch: list[bytes] = []
                    size = 0
                    while sent + len(batch) < len(rest) and (
                        not batch or size + len(rest[sent + len(batch)]) <= _WRITE_BYTES
                    ):
                        size += len(rest[sent + len(batch)])
                        batch.append(rest[sent + len(batch)])
                    start = await self._stream.write(stream_id, batch, expect_next=start)
                    sent += len(batch)
            except (ConflictError, ClosedError):
                continue
            await self._stream.close(stream_id)
            return ref
        raise ConflictError(
            f"blob {ref.digest} kept changing under concurrent writers; retry the put",
            expected=0,
            actual=-1,
        )

    async def _written(self, stream_id: str, count: int, data: bytes) -> int:
        """How many bytes of ``data`` the first ``count`` chunks of the open stream hold (a
        prefix, written by a put that died half-way).

        Raises:
            ConflictError: they are not a prefix of ``data``, or they were not all there
                within :data:`_RESUME_SECONDS` (the stream deleted meanwhile): retry the put.
        """
        held = 0
        with anyio.move_on_after(_RESUME_SECONDS):
            async for chunk in self._stream.read(stream_id):
                if data[held : held + len(chunk.data)] != chunk.data:
                    break
                held += len(chunk.data)
                if chunk.index == count - 1:
                    return held
        raise ConflictError(
            f"blob stream {stream_id} holds no prefix of the blob's bytes in its first {count} "
            "chunks (it changed meanwhile); retry the put",
            expected=count,
            actual=-1,
        )

    async def _index(self, ref: BlobRef) -> None:
        """Name the blob in the owner's index before its stream is first written."""
        assert self._owner is not None
        log, scope = self._owner
        # A duplicate: indexed by an earlier put that died before closing the stream.
        with contextlib.suppress(DuplicateKeyError):
            await log.append(f"blobindex/{scope}", [NewEvent(key=ref.digest, data=b"")])

    async def get(self, ref: BlobRef) -> bytes:
        """The blob's bytes (a session's reader also finds a blob stored without an owner).

        Raises:
            NotFoundError: no complete blob with that digest (never stored, or not closed).
        """
        stream_id = self.stream_id(ref)
        info = await self._stream.info(stream_id)
        if not info.closed and stream_id != ref.stream_id:
            stream_id = ref.stream_id
            info = await self._stream.info(stream_id)
        if not info.closed:
            raise NotFoundError(f"blob {ref.digest} is missing or incomplete; store it again")
        parts = [chunk.data async for chunk in self._stream.read(stream_id)]
        data = b"".join(parts)
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
            raise NotFoundError(
                f"blob {ref.digest} is damaged ({len(data)} bytes, expected {ref.size}); "
                "restore it from a backup"
            )
        return data

    async def delete_all(self) -> int:
        """Delete every blob of the owner (each indexed stream), then its index; returns the
        streams deleted. Safe to run again after a crash half-way (deletes are no-ops on what
        is gone, and the index goes last). Blobs stored without an owner are kept.

        Raises:
            InvalidArgumentError: this store has no owner (its blobs are shared).
        """
        if self._owner is None:
            raise InvalidArgumentError(
                "these blobs have no owner and may be shared: delete a session's blobs "
                "through session_blobs(world, session_id)"
            )
        log, scope = self._owner
        index = f"blobindex/{scope}"
        deleted, after = 0, 0
        while True:
            events = await log.read(index, after=after, limit=_INDEX_PAGE)
            if not events:
                break
            for event in events:
                await self._stream.delete(f"blob/{scope}/{event.key}")
                deleted += 1
            after = events[-1].seq
        await log.delete(index)
        return deleted
