"""Content-addressed blobs: bytes stored once under their sha-256, as closed streams.

A blob lives in stream ``blob/sha256/<hex>``, cut into chunks of at most ``chunk_size``
bytes. It counts as stored only once that stream is closed; a writer that died half-way left
an open stream holding a prefix of the same bytes (same digest, same cut), which the next
``put`` completes. Readers check size and digest, so a damaged blob is an error, never data.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict

from world_core.errors import ClosedError, ConflictError, InvalidArgumentError, NotFoundError
from world_core.spi import Stream

__all__ = ["BlobRef", "Blobs"]

_WRITE_BYTES = 4 * 1024 * 1024  # per Stream.write call, well under MAX_PAYLOAD_BYTES


class BlobRef(BaseModel):
    """What a journal keeps instead of the bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str
    size: int

    @property
    def stream_id(self) -> str:
        return f"blob/sha256/{self.digest}"


class Blobs:
    """Blob store over a World's stream."""

    def __init__(self, stream: Stream, *, chunk_size: int = 1024 * 1024) -> None:
        if chunk_size < 1 or chunk_size > _WRITE_BYTES:
            raise InvalidArgumentError(f"chunk_size must be 1 to {_WRITE_BYTES} bytes")
        self._stream = stream
        self._chunk_size = chunk_size

    async def put(self, data: bytes) -> BlobRef:
        """Store ``data`` (idempotent: storing the same bytes again writes nothing)."""
        ref = BlobRef(digest=hashlib.sha256(data).hexdigest(), size=len(data))
        chunks = [data[i : i + self._chunk_size] for i in range(0, len(data), self._chunk_size)]
        for _ in range(5):  # another writer of the same bytes may be racing us
            info = await self._stream.info(ref.stream_id)
            if info.closed:
                return ref
            start = info.next_index
            try:
                while start < len(chunks):
                    batch: list[bytes] = []
                    size = 0
                    while start + len(batch) < len(chunks) and (
                        not batch or size + len(chunks[start + len(batch)]) <= _WRITE_BYTES
                    ):
                        size += len(chunks[start + len(batch)])
                        batch.append(chunks[start + len(batch)])
                    start = await self._stream.write(ref.stream_id, batch, expect_next=start)
            except (ConflictError, ClosedError):
                continue
            await self._stream.close(ref.stream_id)
            return ref
        raise ConflictError(
            f"blob {ref.digest} kept changing under concurrent writers; retry the put",
            expected=0,
            actual=-1,
        )

    async def get(self, ref: BlobRef) -> bytes:
        """The blob's bytes.

        Raises:
            NotFoundError: no complete blob with that digest (never stored, or not closed).
        """
        info = await self._stream.info(ref.stream_id)
        if not info.closed:
            raise NotFoundError(f"blob {ref.digest} is missing or incomplete; store it again")
        parts = [chunk.data async for chunk in self._stream.read(ref.stream_id)]
        data = b"".join(parts)
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
            raise NotFoundError(
                f"blob {ref.digest} is damaged ({len(data)} bytes, expected {ref.size}); "
                "restore it from a backup"
            )
        return data
