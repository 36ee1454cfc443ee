"""LogContract: the executable form of ``world_core.spi.Log``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import refusal_at_call, take, within
from world_conformance._target import WorldTarget
from world_core import (
    ConflictError,
    DuplicateKeyError,
    Event,
    InvalidArgumentError,
    InvalidIdentifierError,
    LogInfo,
    NewEvent,
    World,
)
from world_core.spi import MAX_ID_BYTES, MAX_LIST_LIMIT, MAX_STATUS_BYTES

__all__ = ["LogContract"]


def _events(*data: bytes) -> list[NewEvent]:
    return [NewEvent(data=item) for item in data]


async def _all_logs(
    world: World, *, prefix: str = "", status: str | None = None, limit: int = 100
) -> list[LogInfo]:
    """Every page of a listing, checking each page's size on the way."""
    found: list[LogInfo] = []
    cursor: str | None = None
    for _ in range(1000):
        page = await world.log.list_logs(prefix=prefix, status=status, cursor=cursor, limit=limit)
        assert len(page.items) <= limit, f"a page of limit={limit} held {len(page.items)}"
        found.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return found
    raise AssertionError("list_logs kept returning a next_cursor for 1000 pages")


class LogContract(ContractBase):
    """``Log``: dense positions, atomic batches, compare-and-set, keys, status, listing, watch."""

    contract_area = "log"

    async def test_log_append_read_tail(self, world: World) -> None:
        log = world.log
        assert await log.tail("l") == 0
        assert await log.read("l") == []
        assert await log.info("l") is None
        assert await log.append("l", _events(b"a")) == 1
        assert await log.append("l", _events(b"b", b"c", b"d")) == 4
        assert [e.seq for e in await log.read("l")] == [1, 2, 3, 4]
        assert [e.data for e in await log.read("l")] == [b"a", b"b", b"c", b"d"]
        assert await log.read("l", after=2) == [Event(seq=3, data=b"c"), Event(seq=4, data=b"d")]
        assert await log.read("l", after=1, limit=2) == [
            Event(seq=2, data=b"b"),
            Event(seq=3, data=b"c"),
        ]
        assert await log.read("l", after=4) == []
        assert await log.read("l", after=99) == []
        assert await log.tail("l") == 4
        assert await log.info("l") == LogInfo(log_id="l", tail=4, status=None)

    async def test_log_long_backlog(self, world: World) -> None:
        """More events than any internal page of a driver: read, read windows and watch all
        return the whole backlog in order."""
        total = 1200
        for start in range(0, total, 200):
            await world.log.append("long", _events(*(b"%d" % i for i in range(start, start + 200))))
        events = await world.log.read("long")
        assert [e.seq for e in events] == list(range(1, total + 1))
        assert [e.data for e in events] == [b"%d" % i for i in range(total)]
        window = await world.log.read("long", after=500, limit=600)
        assert [e.seq for e in window] == list(range(501, 1101))
        assert await take(world.log.watch("long", after=100), total - 100) == events[100:]

    async def test_log_read_limit_refused(self, world: World) -> None:
        await world.log.append("l", _events(b"a"))
        for bad in (0, -1):
            with pytest.raises(InvalidArgumentError):
                await world.log.read("l", limit=bad)

    async def test_log_read_after_refused(self, world: World) -> None:
        """``after`` is an int >= 0 (not a bool) for ``read`` and ``watch`` alike; a refused
        watch fails at once instead of waiting."""
        await world.log.append("l", _events(b"a"))
        bad_afters: tuple[Any, ...] = (-1, True, "0", 1.0, None)
        for bad in bad_afters:
            with pytest.raises(InvalidArgumentError):
                await world.log.read("l", after=bad)
            with anyio.fail_after(5), pytest.raises(InvalidArgumentError):
                await anext(world.log.watch("l", after=bad))
        assert [e.seq for e in await world.log.read("l", after=0)] == [1]

    async def test_log_watch_refuses_when_called(self, world: World) -> None:
        """``watch`` checks its arguments when called, before it returns the iterator: a bad
        log id or ``after`` raises at the line that made the call, not at the first step."""
        await world.log.append("l", _events(b"a"))
        bad_afters: tuple[Any, ...] = (-1, True, "0", 1.0, None)
        cases: list[tuple[str, Any, Any, type[Exception]]] = [
            (f"watch({bad_id!r:.24})", bad_id, 0, InvalidIdentifierError)
            for bad_id in ("", "a\x00", "x" * (MAX_ID_BYTES + 1))
        ]
        cases += [(f"watch('l', after={a!r})", "l", a, InvalidArgumentError) for a in bad_afters]
        failures: list[str] = []
        for what, log_id, after, error in cases:

            def call(log_id: Any = log_id, after: Any = after) -> AsyncIterator[Event]:
                return world.log.watch(log_id, after=after)

            failure = await refusal_at_call(call, error, what)
            if failure is not None:
                failures.append(failure)
        assert not failures, "Log.watch checks its arguments when called:\n" + "\n".join(failures)
        assert [e.seq for e in await world.log.read("l")] == [1]

    async def test_log_empty_batch_refused(self, world: World) -> None:
        with pytest.raises(InvalidArgumentError):
            await world.log.append("l", [])
        assert await world.log.info("l") is None

    async def test_log_concurrent_appenders_dense(
        self, world: World, world_target: WorldTarget
    ) -> None:
        """Many tasks on two connections append batches of 1 to 3 at once: the log holds every
        batch once, positions 1..n with no hole, each batch on consecutive positions, each
        task's batches in the order it appended them."""
        tasks, rounds = 12, 6
        tails: dict[tuple[int, int], int] = {}

        async def appender(target: World, task: int) -> None:
            for round_ in range(rounds):
                size = 1 + (task + round_) % 3
                events = _events(*(f"{task}:{round_}:{i}".encode() for i in range(size)))
                tails[(task, round_)] = await target.log.append("dense", events)

        async with world_target.open() as second:
            with within("many tasks appending on two connections"):
                async with anyio.create_task_group() as group:
                    for task in range(tasks):
                        group.start_soon(appender, world if task % 2 else second, task)
        total = sum(1 + (t + r) % 3 for t in range(tasks) for r in range(rounds))
        events = await world.log.read("dense")
        assert [e.seq for e in events] == list(range(1, total + 1))
        assert await world.log.tail("dense") == total
        by_data = {e.data: e.seq for e in events}
        assert len(by_data) == total
        for (task, round_), tail in tails.items():
            size = 1 + (task + round_) % 3
            seqs = [by_data[f"{task}:{round_}:{i}".encode()] for i in range(size)]
            assert seqs == list(range(tail - size + 1, tail + 1)), "a batch was split"
        for task in range(tasks):
            order = [tails[(task, r)] for r in range(rounds)]
            assert order == sorted(order)

    async def test_log_compare_and_set(self, world: World) -> None:
        log = world.log
        assert await log.append("l", _events(b"a"), expect_tail=0) == 1
        with pytest.raises(ConflictError) as caught:
            await log.append("l", _events(b"x"), expect_tail=0)
        assert (caught.value.expected, caught.value.actual) == (0, 1)
        with pytest.raises(ConflictError) as caught:
            await log.append("l", _events(b"x"), expect_tail=5)
        assert (caught.value.expected, caught.value.actual) == (5, 1)
        with pytest.raises(ConflictError) as caught:
            await log.append("missing", _events(b"x"), expect_tail=3)
        assert caught.value.actual == 0
        assert await log.info("missing") is None
        assert await log.append("l", _events(b"b", b"c"), expect_tail=1) == 3
        assert [e.data for e in await log.read("l")] == [b"a", b"b", b"c"]

    async def test_log_compare_and_set_race_has_one_winner(self, world: World) -> None:
        winners: list[int] = []
        conflicts: list[int] = []

        async def contender(index: int) -> None:
            try:
                await world.log.append("race", _events(str(index).encode()), expect_tail=0)
                winners.append(index)
            except ConflictError as exc:
                conflicts.append(exc.actual)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for index in range(10):
                    group.start_soon(contender, index)
        assert len(winners) == 1
        assert conflicts == [1] * 9
        assert [e.data for e in await world.log.read("race")] == [str(winners[0]).encode()]

    async def test_log_duplicate_key_rejects_whole_batch(self, world: World) -> None:
        log = world.log
        await log.append("l", [NewEvent(data=b"first", key="k")])
        batch = [NewEvent(data=b"new", key="fresh"), NewEvent(data=b"again", key="k")]
        with pytest.raises(DuplicateKeyError) as caught:
            await log.append("l", batch)
        assert caught.value.key == "k"
        assert caught.value.existing == Event(seq=1, data=b"first", key="k")
        assert await log.tail("l") == 1
        assert await log.get("l", "fresh") is None
        assert await log.get("l", "k") == Event(seq=1, data=b"first", key="k")
        assert await log.append("l", [NewEvent(data=b"new", key="fresh")]) == 2

    async def test_log_key_race_has_one_winner(self, world: World) -> None:
        """Concurrent appends of one key: one is stored, every other sees it as existing."""
        outcomes: list[Event | int] = []

        async def contender(index: int) -> None:
            event = NewEvent(data=str(index).encode(), key="once")
            try:
                outcomes.append(await world.log.append("race", [NewEvent(data=b"x"), event]))
            except DuplicateKeyError as exc:
                outcomes.append(exc.existing)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for index in range(10):
                    group.start_soon(contender, index)
        stored = await world.log.get("race", "once")
        assert stored is not None
        assert outcomes.count(2) == 1, f"tails returned: {outcomes}"
        assert [o for o in outcomes if o != 2] == [stored] * 9
        assert await world.log.tail("race") == 2

    async def test_log_conflict_checked_before_duplicate_key(self, world: World) -> None:
        await world.log.append("l", [NewEvent(data=b"a", key="k")])
        with pytest.raises(ConflictError):
            await world.log.append("l", [NewEvent(data=b"b", key="k")], expect_tail=0)

    async def test_log_key_twice_in_one_batch_refused(self, world: World) -> None:
        batch = [NewEvent(data=b"a", key="k"), NewEvent(data=b"b", key="k")]
        with pytest.raises(InvalidArgumentError):
            await world.log.append("l", batch)
        assert await world.log.info("l") is None

    async def test_log_keys_are_per_log(self, world: World) -> None:
        await world.log.append("a", [NewEvent(data=b"1", key="k")])
        await world.log.append("b", [NewEvent(data=b"2", key="k")])
        assert await world.log.get("a", "k") == Event(seq=1, data=b"1", key="k")
        assert await world.log.get("b", "k") == Event(seq=1, data=b"2", key="k")
        assert await world.log.get("a", "other") is None
        assert await world.log.get("missing", "k") is None
        assert [e.key for e in await world.log.read("a")] == ["k"]

    async def test_log_status_set_atomically(self, world: World) -> None:
        log = world.log
        await log.append("l", _events(b"a"), status="running")
        assert await log.info("l") == LogInfo(log_id="l", tail=1, status="running")
        await log.append("l", _events(b"b"))
        info = await log.info("l")
        assert info is not None
        assert info.status == "running", "an append without status keeps the status"
        with pytest.raises(ConflictError):
            await log.append("l", _events(b"c"), expect_tail=0, status="done")
        info = await log.info("l")
        assert info is not None
        assert (info.tail, info.status) == (2, "running"), "a refused append set the status"
        await log.append("l", [NewEvent(data=b"d", key="k")])
        with pytest.raises(DuplicateKeyError):
            await log.append("l", [NewEvent(data=b"e", key="k")], status="done")
        info = await log.info("l")
        assert info is not None
        assert info.status == "running"
        await log.append("l", _events(b"f"), status="done")
        assert await log.info("l") == LogInfo(log_id="l", tail=4, status="done")

    async def test_log_list_prefix_status_paging(self, world: World) -> None:
        log = world.log
        ids = ["run/b", "run/a", "run/c/1", "run/B", "other", "run/é", "run/😀", "run/\uffff"]
        for index, log_id in enumerate(ids):
            await log.append(log_id, _events(b"x"), status="odd" if index % 2 else "even")
        ordered = sorted(ids)  # Python compares str by code point
        everything = await _all_logs(world)
        assert [i.log_id for i in everything] == ordered
        assert all(i.tail == 1 for i in everything)
        for limit in (1, 2, 3):
            paged = await _all_logs(world, prefix="run/", limit=limit)
            assert [i.log_id for i in paged] == [i for i in ordered if i.startswith("run/")]
        odd = await _all_logs(world, status="odd", limit=2)
        assert [i.log_id for i in odd] == sorted(ids[1::2])
        assert all(i.status == "odd" for i in odd)
        even_run = await _all_logs(world, prefix="run/", status="even", limit=1)
        assert [i.log_id for i in even_run] == sorted(i for i in ids[::2] if i.startswith("run/"))
        assert await _all_logs(world, prefix="nothing") == []
        assert await _all_logs(world, status="none-such") == []

    async def test_log_list_default_page(self, world: World) -> None:
        for index in range(130):
            await world.log.append(f"log-{index:03d}", _events(b"x"))
        first = await world.log.list_logs()
        assert 0 < len(first.items) <= 100
        assert first.next_cursor is not None, "130 logs do not fit a page of 100"
        listed = [i.log_id for i in await _all_logs(world, limit=MAX_LIST_LIMIT)]
        assert listed == [f"log-{index:03d}" for index in range(130)]

    async def test_log_list_prefix_is_literal(self, world: World) -> None:
        """Prefix characters that mean something to LIKE, regexes, globs or key patterns match
        only themselves."""
        ids = ["a%b", "axb", "a_b", "a.b", "a*b", "a[b", "a?b", "a\\b", "a^b", "a$b", "a{b"]
        for log_id in ids:
            await world.log.append(log_id, _events(b"x"))
        for log_id in ids:
            prefix = log_id[:2]
            found = [i.log_id for i in await _all_logs(world, prefix=prefix)]
            assert found == [log_id], f"prefix {prefix!r} matched {found}"
        assert [i.log_id for i in await _all_logs(world, prefix="a")] == sorted(ids)

    async def test_log_list_limit_refused(self, world: World) -> None:
        for bad in (0, -1, MAX_LIST_LIMIT + 1):
            with pytest.raises(InvalidArgumentError):
                await world.log.list_logs(limit=bad)

    async def test_log_list_arguments_refused(self, world: World) -> None:
        """A prefix is any str ("" for all) following the identifier rules but for emptiness;
        a status filter follows the status rules of ``append``; a cursor is None or a str;
        the limit is an int from 1 to MAX_LIST_LIMIT."""
        await world.log.append("l", _events(b"a"))
        not_str: Any = 1
        bad_ids = ("a\x00", "x" * (MAX_ID_BYTES + 1), "\ud800")
        for prefix in bad_ids:
            with pytest.raises(InvalidIdentifierError):
                await world.log.list_logs(prefix=prefix)
        for status in ("", "s\x00", "s" * (MAX_STATUS_BYTES + 1)):
            with pytest.raises(InvalidIdentifierError):
                await world.log.list_logs(status=status)
        with pytest.raises(InvalidArgumentError):
            await world.log.list_logs(prefix=not_str)
        with pytest.raises(InvalidArgumentError):
            await world.log.list_logs(cursor=not_str)
        for limit in (None, True, 1.0):
            bad_limit: Any = limit
            with pytest.raises(InvalidArgumentError):
                await world.log.list_logs(limit=bad_limit)
        longest = "é" * (MAX_ID_BYTES // 2)
        assert (await world.log.list_logs(prefix=longest)).items == []
        assert [i.log_id for i in (await world.log.list_logs(prefix="")).items] == ["l"]

    async def test_log_list_cursor_not_issued_refused(self, world: World) -> None:
        """A cursor is a ``next_cursor`` the listing returned, unchanged: anything else (made
        up, a log id or its hex, garbled, cut short, lengthened) raises InvalidArgumentError
        rather than starting or continuing a listing somewhere; the real cursor still works."""
        for index in range(3):
            await world.log.append(f"log-{index}", _events(b"x"))
        cursor = (await world.log.list_logs(limit=1)).next_cursor
        assert cursor is not None
        forged = {"", " ", "0", "null", "log-0", "log-1", b"log-0".hex(), "\x00"}
        forged |= {cursor[:-1], cursor[1:], cursor + cursor[-1], "A" + cursor, cursor + "\n"}
        forged |= {cursor[::-1], cursor.swapcase(), cursor.upper(), cursor.lower()}
        forged.discard(cursor)
        accepted: list[str] = []
        for bad in sorted(forged):
            try:
                await world.log.list_logs(cursor=bad, limit=1)
            except InvalidArgumentError:
                continue
            accepted.append(bad)
        assert accepted == [], f"cursors never issued were accepted: {accepted}"
        rest = await world.log.list_logs(cursor=cursor, limit=1)
        assert [i.log_id for i in rest.items] == ["log-1"]

    async def test_log_list_cursor_bound_to_its_listing(self, world: World) -> None:
        """A cursor continues the listing it came from: the same ``prefix`` and ``status``, any
        ``limit``. With another prefix or status it raises InvalidArgumentError, rather than
        being read as a position in that other listing. It marks a position, not a log: it
        stays valid when the log it stopped at is deleted."""
        for index in range(4):
            await world.log.append(f"run/{index}", _events(b"x"), status="s")
        await world.log.append("other", _events(b"x"), status="s")
        cursor = (await world.log.list_logs(prefix="run/", status="s", limit=1)).next_cursor
        unfiltered = (await world.log.list_logs(limit=1)).next_cursor
        assert cursor is not None
        assert unfiltered is not None
        for prefix, status in (("", "s"), ("run", "s"), ("run/0", "s"), ("run/", None)):
            with pytest.raises(InvalidArgumentError):
                await world.log.list_logs(prefix=prefix, status=status, cursor=cursor)
        with pytest.raises(InvalidArgumentError):
            await world.log.list_logs(prefix="run/", status="t", cursor=cursor)
        for prefix, status in (("run/", None), ("", "s"), ("o", None)):
            with pytest.raises(InvalidArgumentError):
                await world.log.list_logs(prefix=prefix, status=status, cursor=unfiltered)
        await world.log.delete("run/0")
        rest = await world.log.list_logs(prefix="run/", status="s", cursor=cursor, limit=2)
        assert [i.log_id for i in rest.items] == ["run/1", "run/2"]
        assert rest.next_cursor is not None
        last = await world.log.list_logs(prefix="run/", status="s", cursor=rest.next_cursor)
        assert [i.log_id for i in last.items] == ["run/3"]
        assert last.next_cursor is None

    async def test_log_delete_then_append_restarts(self, world: World) -> None:
        log = world.log
        await log.append("l", [NewEvent(data=b"a", key="k")], status="s")
        await log.append("l", _events(b"b"))
        await log.append("keep", _events(b"z"))
        await log.delete("l")
        assert await log.info("l") is None
        assert await log.tail("l") == 0
        assert await log.read("l") == []
        assert await log.get("l", "k") is None
        assert [i.log_id for i in await _all_logs(world)] == ["keep"]
        assert await log.append("l", [NewEvent(data=b"c", key="k")]) == 1
        assert await log.info("l") == LogInfo(log_id="l", tail=1, status=None)
        await log.delete("never-existed")
        assert await log.tail("keep") == 1

    async def test_log_watch_before_log_exists(self, world: World) -> None:
        """A watcher started before the first append sees every event once, in order, woken
        by appends made from other tasks."""
        seen: list[Event] = []

        async def watcher() -> None:
            what = "watch before the log existed sees all 7 events, woken by appends of other tasks"
            seen.extend(await take(world.log.watch("w"), 7, what=what))

        async def appender(tag: str) -> None:
            for round_ in range(3):
                await world.log.append("w", _events(f"{tag}{round_}".encode()))
                await anyio.sleep(0.01)

        with within("a watcher and two appenders (watch before the log exists)"):
            async with anyio.create_task_group() as group:
                group.start_soon(watcher)
                await anyio.sleep(0.1)
                group.start_soon(appender, "a")
                group.start_soon(appender, "b")
                await anyio.sleep(0.2)
                await world.log.append("w", _events(b"last"))
        assert seen == await world.log.read("w")
        assert [e.seq for e in seen] == list(range(1, 8))

    async def test_log_watch_during_concurrent_appends(
        self, world: World, world_target: WorldTarget
    ) -> None:
        """Watchers following the log while many tasks append on two connections see exactly
        what ``read`` returns at the end: no event skipped because a later position committed
        first, none twice."""
        tasks, rounds = 8, 5
        total = tasks * rounds * 2
        watched: list[list[Event]] = [[], []]

        async def watcher(index: int, target: World) -> None:
            what = f"watch on connection {index} sees every event of concurrent appends, in order"
            watched[index] = await take(target.log.watch("busy"), total, bound=60, what=what)

        async def appender(target: World, task: int) -> None:
            for round_ in range(rounds):
                pair = _events(f"{task}:{round_}:a".encode(), f"{task}:{round_}:b".encode())
                await target.log.append("busy", pair)

        async with world_target.open() as second:
            with within("two watchers following concurrent appenders", 90):
                async with anyio.create_task_group() as group:
                    group.start_soon(watcher, 0, world)
                    group.start_soon(watcher, 1, second)
                    await anyio.sleep(0.1)
                    for task in range(tasks):
                        group.start_soon(appender, world if task % 2 else second, task)
        stored = await world.log.read("busy")
        assert len(stored) == total
        for seen in watched:
            assert [e.seq for e in seen] == list(range(1, total + 1))
            assert seen == stored

    async def test_log_watch_after_and_wakeup(self, world: World) -> None:
        await world.log.append("w", _events(b"1", b"2", b"3"))
        watch = world.log.watch("w", after=2)
        first = await take(watch, 1, what="watch(after=2) yields the existing event 3 at once")
        assert first == [Event(seq=3, data=b"3")]
        watch = world.log.watch("w", after=3)
        got: list[Event] = []

        async def follow() -> None:
            what = "watch(after=3) waiting at the tail is woken by later appends"
            got.extend(await take(watch, 2, what=what))

        with within("a watcher at the tail and two appends"):
            async with anyio.create_task_group() as group:
                group.start_soon(follow)
                await anyio.sleep(0.1)
                await world.log.append("w", [NewEvent(data=b"4", key="k4")])
                await world.log.append("w", _events(b"5"))
        assert got == [Event(seq=4, data=b"4", key="k4"), Event(seq=5, data=b"5")]
        ahead: list[Event] = []

        async def follow_ahead() -> None:
            what = "watch(after=7) beyond the tail waits, then yields event 8 once it exists"
            ahead.extend(await take(world.log.watch("w", after=7), 1, what=what))

        with within("a watcher beyond the tail and one append"):
            async with anyio.create_task_group() as group:
                group.start_soon(follow_ahead)
                await anyio.sleep(0.1)
                await world.log.append("w", _events(b"6", b"7", b"8"))
        assert ahead == [Event(seq=8, data=b"8")], "watch(after=) beyond the tail"
