"""The target rows of ``bench_targets.py`` made from the scripts' results (no measuring)."""

from __future__ import annotations

from typing import Any

import _targets as t
import pytest
from bench_steps import _ratios


def _floor(never: float, floor: float) -> dict[str, Any]:
    return {"never_us": never, "floor_pair_us": floor, "never_over_floor": round(never / floor, 3)}


def _step(store: str, system: str, step: str, ms: float) -> dict[str, Any]:
    return {"store": store, "system": system, "step": step, "per_step_ms": {100: ms}}


def test_steps_rows_carry_both_sides_of_each_ratio_bench_steps_judged() -> None:
    floors = {"postgres": _floor(1100.0, 1000.0), "mongoeco": _floor(9000.0, 1000.0)}
    rows = [
        _step("postgres", "world", "safe", 0.1),
        _step("postgres", "world", "never", 1.2),
        _step("postgres", "dbos", "step", 4.0),
        _step("postgres", "absurd", "step", 1.0),
        _step("turso", "world", "safe", 0.2),
        _step("sqlite", "dbos", "step", 2.0),
    ]
    result = {"load": [2.5, 1.0, 0.5], "ratios": _ratios(rows, floors)}
    got = {
        (r.target.split(" ")[0], r.backend, r.reference.split(" ")[-1]): r
        for r in t.steps_rows(result)
    }
    never_pg = got[("`never`", "postgres", "floor")]
    assert (never_pg.measured, never_pg.ratio, never_pg.met) == ("1100 us", 1.1, True)
    assert got[("`never`", t.MONGOECO, "floor")].met is False  # 9x its floor
    safe_dbos = got[("`safe`", "postgres", "DBOS")]
    assert (safe_dbos.measured, safe_dbos.reference, safe_dbos.ratio) == (
        "0.100 ms",
        "4.000 ms DBOS",
        0.025,
    )
    assert (safe_dbos.bound, safe_dbos.met) == ("<= 0.05x", True)
    assert got[("`safe`", "turso", "SQLite")].reference == "2.000 ms DBOS on SQLite"
    never_absurd = got[("`never`", "postgres", "Absurd")]
    assert (never_absurd.bound, never_absurd.met) == ("< 1x (ahead)", False)  # 1.2x
    assert {r.load for r in got.values()} == {2.5}


def test_postgres_append_row_is_met_at_the_bound_and_not_above() -> None:
    append = {"append_p50_ms": 0.23, "floor_p50_ms": 0.2, "ratio_p50": 1.15}
    assert t.postgres_append_row(append, 1.15, 0.3).met
    assert not t.postgres_append_row({**append, "ratio_p50": 1.151}, 1.15, 0.3).met


def test_queue_row_judges_a_ratio_or_a_rate() -> None:
    against_peer = t.queue_row(
        "q", "postgres", 300.0, "PgQueuer", 200.0, at_least_ratio=1.5, load=1
    )
    assert (against_peer.ratio, against_peer.met) == (1.5, True)
    rate = t.queue_row("q", "redis", 9_999.0, "saq", 1_000.0, at_least_rate=10_000.0, load=1)
    assert (rate.ratio, rate.met) == (9.999, False)  # far ahead of saq, short of the rate
    with pytest.raises(ValueError, match="at_least_ratio or at_least_rate"):
        t.queue_row("q", "redis", 1.0, "saq", 1.0, load=1)


def test_memory_rows_flat_and_leaking() -> None:
    result = {
        "rows": [
            {
                "world": "local",
                "turns": 10_000,
                "rss_mib": [49.2, 50.4, 51.4],
                "loadavg": [1, 1, 1],
            },
            {
                "world": "postgres",
                "turns": 10_000,
                "rss_mib": [49.1, 60.0, 66.1],
                "loadavg": [2, 1, 1],
            },
        ]
    }
    flat, leak = t.memory_rows(result)
    assert flat.target == "worker RSS flat: at 1,000 vs 10,000 turns"
    assert (flat.met, flat.ratio) == (True, 1.045)
    assert (leak.met, leak.load) == (False, 2.0)


def _scale(world: str, sessions: int, limit: str) -> dict[str, Any]:
    return {
        "world": world,
        "sessions": sessions,
        "offered_steps_per_s": sessions / 60,
        "sustained_steps_per_s": sessions / 60 * (1.0 if limit == "kept up" else 0.5),
        "limit": limit,
        "loadavg_end": [3.0, 2.0, 1.0],
    }


def test_scale_rows_and_the_limit_each_backend_hits_first() -> None:
    result = {
        "rows": [
            _scale("redis", 50_000, "CPU saturated"),
            _scale("redis", 1_000, "kept up"),
            _scale("redis", 10_000, "kept up"),
            _scale("postgres", 1_000, "kept up"),
            _scale("postgres", 10_000, "submit path"),
            _scale("postgres", 50_000, "store"),
            _scale("local", 1_000, "kept up"),
            {"world": "mongo", "sessions": 1_000, "error": "RuntimeError('gone')"},
        ]
    }
    rows = t.scale_rows(result)
    assert [r.met for r in rows] == [False, True, True, True, False, False, True, False]
    assert (rows[0].ratio, rows[-1].backend, rows[-1].ratio) == (0.5, t.MONGOECO, None)
    assert t.first_limits(result) == {
        "redis": "at 50,000 sessions: CPU saturated",
        "postgres": "at 10,000 sessions: submit path",
        "local": "kept up at every size",
        t.MONGOECO: "at 1,000 sessions: failed (RuntimeError('gone'))",
    }


def test_table_has_a_line_a_row_with_every_column() -> None:
    rows = t.memory_rows(
        {"rows": [{"world": "turso", "turns": 200, "rss_mib": [75.9, 76.9], "loadavg": [6.93]}]}
    )
    lines = t.table(rows).splitlines()
    assert lines[0] == (
        "| target | backend | measured | floor/peer | ratio | target | met | load |"
    )
    assert lines[2] == (
        "| worker RSS flat: at 20 vs 200 turns | turso | 76.9 MiB | 75.9 MiB | 1.01x"
        " | <= 1.1x | yes | 6.93 |"
    )
