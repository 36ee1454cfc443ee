"""Dense, atomically appended sequences on a standalone mongod: the base of Log and Stream.

Two collections per kind:

* a **head** per sequence, ``{_id: owner, g: generation, n: count, last: {f, items, keys?}}``
  plus the owner's own fields (log status, stream closed flag). The head is the commit point:
  a batch is committed by ONE conditional single-document update that moves ``n`` from the
  value the writer read to ``n + len(batch)`` and stores the batch inline as ``last``. Two
  writers that read the same ``n`` cannot both match, so positions are dense and unique, and
  the batch, the new count and the owner's fields appear together or not at all.
* **segments** ``{o: owner, g, f: first, e: end (exclusive), items, keys?}``: every committed
  batch but possibly the newest, one document each. A writer copies the head's ``last`` into
  segments (insert; a duplicate on the unique ``(g, f)`` index means someone already did)
  *before* it tries to commit the next batch. So when a head says ``n``, segments hold every
  batch below ``last.f`` and readers merge ``last`` from the head.

``g`` (an ObjectId) is minted when a sequence is created: a writer that read a head before a
concurrent ``delete`` can no longer commit (its filter names the old generation), and any
segment it copies afterwards carries the old generation, which no reader asks for.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from bson import ObjectId
from pymongo import IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from world_core.errors import WorldError

__all__ = ["Doc", "Segments"]

Doc = dict[str, Any]

KNOWN_HEADS = 256
KNOWN_BATCH_BYTES = 64 * 1024
"""A writer remembers the heads it committed (at most KNOWN_HEADS, batches up to
KNOWN_BATCH_BYTES) so its next write can skip reading the head: the conditional update still
names the generation and count it expects, so a stale memory only costs a retry."""


class Segments:
    """Head plus segment collections for one kind of sequence (logs or streams)."""

    def __init__(
        self, heads: AsyncCollection[Doc], segs: AsyncCollection[Doc], *, keyed: bool
    ) -> None:
        self.heads = heads
        self.segs = segs
        self.keyed = keyed
        self._known: OrderedDict[str, Doc] = OrderedDict()

    def known_head(self, owner: str) -> Doc | None:
        """The head this process last committed for ``owner`` (possibly stale), or None."""
        head = self._known.get(owner)
        if head is not None:
            self._known.move_to_end(owner)
        return head

    def forget(self, owner: str | None = None) -> None:
        if owner is None:
            self._known.clear()
        else:
            self._known.pop(owner, None)

    def _remember(self, owner: str, head: Doc, size: int) -> None:
        if size > KNOWN_BATCH_BYTES:
            self._known.pop(owner, None)
            return
        self._known[owner] = head
        self._known.move_to_end(owner)
        while len(self._known) > KNOWN_HEADS:
            self._known.popitem(last=False)

    def segment_indexes(self) -> list[IndexModel]:
        models = [
            IndexModel([("g", 1), ("f", 1)], unique=True, name="gen_first"),
            IndexModel([("g", 1), ("e", 1)], name="gen_end"),
            IndexModel([("o", 1), ("g", 1)], name="owner_gen"),
        ]
        if self.keyed:
            # Multikey over the batch's keys: no key twice in one generation. Partial, so
            # batches without keys (no field at all) are not indexed as null.
            models.append(
                IndexModel(
                    [("g", 1), ("keys", 1)],
                    unique=True,
                    name="gen_keys",
                    partialFilterExpression={"keys": {"$exists": True}},
                )
            )
        return models

    async def load_head(self, owner: str, *, items: bool) -> Doc | None:
        projection = None if items else {"last.items": 0}
        return await self.heads.find_one({"_id": owner}, projection)

    async def flush(self, owner: str, head: Doc) -> None:
        """Copy the head's inline batch into segments; idempotent."""
        last = head.get("last")
        if not last:
            return
        doc: Doc = {
            "o": owner,
            "g": head["g"],
            "f": last["f"],
            "e": last["f"] + len(last["items"]),
            "items": last["items"],
        }
        if last.get("keys"):
            doc["keys"] = last["keys"]
        try:
            await self.segs.insert_one(doc)
        except DuplicateKeyError as exc:
            # Which unique index a duplicate reports is up to the server; the copy is done
            # whenever a segment already starts there (segments never change).
            if await self.segs.find_one({"g": head["g"], "f": last["f"]}, {"_id": 1}):
                return
            # Commits check keys against segments after this very copy, so a key clash with
            # another segment means the store was changed behind our back.
            raise WorldError(
                f"sequence {owner!r} holds a key twice; the data was modified outside "
                "world_mongo: inspect it before writing more"
            ) from exc

    async def try_commit(
        self,
        owner: str,
        head: Doc | None,
        items: list[Any],
        *,
        size: int,
        keys: list[str] | None = None,
        set_fields: Doc | None = None,
        match_fields: Doc | None = None,
        new_fields: Doc | None = None,
    ) -> int | None:
        """Commit a batch after ``head``; the new count, or None if the head moved.

        ``head`` None creates the sequence. ``size`` (payload bytes) decides whether the new
        head is remembered for the next write.
        """
        n = head["n"] if head is not None else 0
        last: Doc = {"f": n, "items": items}
        if keys:
            last["keys"] = keys
        if head is None:
            g = ObjectId()
            doc: Doc = {"_id": owner, "g": g, "n": n + len(items), "last": last}
            doc.update(new_fields or {})
            try:
                await self.heads.insert_one(doc)
            except DuplicateKeyError:
                self.forget(owner)
                return None
        else:
            g = head["g"]
            update: Doc = {"n": n + len(items), "last": last}
            update.update(set_fields or {})
            query: Doc = {"_id": owner, "g": g, "n": n}
            query.update(match_fields or {})
            result = await self.heads.update_one(query, {"$set": update})
            if not result.matched_count:
                self.forget(owner)
                return None
        self._remember(owner, {"g": g, "n": n + len(items), "last": last}, size)
        return n + len(items)

    async def read(
        self, owner: str, head: Doc, start: int, limit: int | None
    ) -> list[tuple[int, Any]]:
        """Items at positions ``start`` .. as (position, item), at most ``limit``.

        ``head`` must have been loaded with items. The result is always a dense run starting
        at ``start`` (shorter only if the sequence was deleted meanwhile).
        """
        n: int = head["n"]
        end = n if limit is None else min(n, start + limit)
        if start >= end:
            return []
        out: list[tuple[int, Any]] = []
        pos = start
        last: Doc | None = head.get("last")
        if last is None or last["f"] > start:
            upper = end if last is None else min(end, last["f"])
            cursor = self.segs.find(
                {"g": head["g"], "e": {"$gt": start}, "f": {"$lt": upper}},
                {"f": 1, "items": 1},
                sort=[("e", 1)],
            )
            try:
                async for seg in cursor:
                    if seg["f"] > pos:
                        break
                    seg_items = seg["items"][pos - seg["f"] : upper - seg["f"]]
                    out.extend(enumerate(seg_items, start=pos))
                    pos += len(seg_items)
                    if pos >= upper:
                        break
            finally:
                await cursor.close()
        if last is not None and pos < end and last["f"] <= pos:
            tail_items = last["items"][pos - last["f"] : end - last["f"]]
            out.extend(enumerate(tail_items, start=pos))
        return out

    async def delete(self, owner: str) -> bool:
        self.forget(owner)
        head = await self.heads.find_one_and_delete({"_id": owner}, {"g": 1})
        if head is None:
            return False
        await self.segs.delete_many({"o": owner, "g": head["g"]})
        return True
