"""Issue 17's target rows, made from what the benchmark scripts return (used by
``bench_targets.py``; no measuring here).

Each builder takes one script's result (its JSON, or the dicts its functions return) and the
1-minute load average when it was measured, and returns rows of one table: the target, the
backend, the measured value, its floor or peer, their ratio, the target's bound and whether it
is met. mongoeco's rows are labelled as not MongoDB's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MEMORY_GROWTH_MAX = 1.10
"""A worker's RSS "flat": the last sample (10,000 turns) at most this times the first (1,000):
resident memory moves by a few MiB with the allocator's arenas; a leak of a chain or an index a
session (fixed on 2026-12-02) showed as 1.35x."""

MONGOECO = "mongoeco (not MongoDB)"


@dataclass
class Row:
    """One line of the targets table."""

    target: str
    backend: str
    measured: str
    reference: str  # the floor or the peer, measured in the same run
    ratio: float | None  # measured / reference
    bound: str  # the target, as a reader checks it
    met: bool
    load: float  # the 1-minute load average when the row was measured

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def backend_label(name: str) -> str:
    """The backend column: mongo (always mongoeco's wire server here) says it is not MongoDB."""
    return MONGOECO if name in ("mongo", "mongoeco") else name


def _ratio(ours: float, theirs: float) -> float | None:
    return round(ours / theirs, 3) if theirs > 0 else None


def steps_rows(result: dict[str, Any]) -> list[Row]:
    """From ``bench_steps.py --json``: each ratio it judged (never / floor, each step of ours
    against DBOS and Absurd), with both sides."""
    load = float(result["load"][0])
    names = {"dbos": "DBOS", "absurd": "Absurd", "sqlite": "SQLite"}
    rows: list[Row] = []
    for item in result["ratios"]:
        unit, target = item["unit"], float(item["target"])
        if "peer" in item:
            peer = names.get(item["peer"], item["peer"])
            what = f"`{item['step']}` step overhead vs {peer} (per step, N=100)"
            if item["peer_store"] != item["store"]:  # DBOS on SQLite, for our embedded stores
                peer += f" on {names.get(item['peer_store'], item['peer_store'])}"
            reference = f"{item['theirs']:.3f} {unit} {peer}"
            bound = f"<= {target}x" if target != 1.0 else "< 1x (ahead)"
        else:
            what = "`never` step vs its two raw appends (p50)"
            reference = f"{item['theirs']:.0f} {unit} floor"
            bound = f"<= {target}x"
        ours = f"{item['ours']:.3f} {unit}" if unit == "ms" else f"{item['ours']:.0f} {unit}"
        rows.append(
            Row(
                what,
                backend_label(item["store"]),
                ours,
                reference,
                float(item["ratio"]),
                bound,
                bool(item["met"]),
                load,
            )
        )
    return rows


def postgres_append_row(append: dict[str, float], target: float, load: float) -> Row:
    """From ``bench_postgres.bench_append``: the append's p50 against the raw INSERT's."""
    ratio = append["ratio_p50"]
    return Row(
        "Postgres append vs raw INSERT (p50)",
        "postgres",
        f"{append['append_p50_ms']:.3f} ms",
        f"{append['floor_p50_ms']:.3f} ms INSERT",
        round(ratio, 3),
        f"<= {target}x",
        ratio <= target,
        load,
    )


def queue_row(
    what: str,
    backend: str,
    ours: float,
    peer_name: str,
    peer: float,
    *,
    at_least_ratio: float | None = None,
    at_least_rate: float | None = None,
    load: float,
) -> Row:
    """A queue's end-to-end msg/s against a peer's in the same run; the target is a ratio to
    the peer (``at_least_ratio``) or a rate (``at_least_rate``)."""
    ratio = _ratio(ours, peer)
    if at_least_ratio is not None:
        bound, met = f">= {at_least_ratio}x", ratio is not None and ratio >= at_least_ratio
    elif at_least_rate is not None:
        bound, met = f">= {at_least_rate:,.0f} msg/s", ours >= at_least_rate
    else:
        raise ValueError("queue_row needs at_least_ratio or at_least_rate")
    return Row(
        what,
        backend,
        f"{ours:,.0f} msg/s",
        f"{peer:,.0f} msg/s {peer_name}",
        ratio,
        bound,
        met,
        load,
    )


def memory_rows(result: dict[str, Any]) -> list[Row]:
    """From ``bench_scale.py --memory N --json``: RSS at the first tenth of N turns against RSS
    at N, per backend."""
    rows: list[Row] = []
    for run in result["rows"]:
        first, last = run["rss_mib"][0], run["rss_mib"][-1]
        turns = run["turns"]
        ratio = _ratio(last, first)
        rows.append(
            Row(
                f"worker RSS flat: at {turns // 10:,} vs {turns:,} turns",
                backend_label(run["world"]),
                f"{last} MiB",
                f"{first} MiB",
                ratio,
                f"<= {MEMORY_GROWTH_MAX}x",
                ratio is not None and ratio <= MEMORY_GROWTH_MAX,
                float(run["loadavg"][0]),
            )
        )
    return rows


def scale_rows(result: dict[str, Any]) -> list[Row]:
    """From ``bench_scale.py --json``: sustained against offered steps/s per backend and
    session count; met when the row kept up (bench_scale's own verdict)."""
    rows: list[Row] = []
    for run in result["rows"]:
        backend = backend_label(run["world"])
        what = f"scale: {run['sessions']:,} sessions, sustained steps/s"
        if "error" in run:
            rows.append(Row(what, backend, "failed", run["error"][:40], None, "", False, 0.0))
            continue
        offered = float(run["offered_steps_per_s"])
        sustained = float(run["sustained_steps_per_s"])
        rows.append(
            Row(
                what,
                backend,
                f"{sustained:,.1f}",
                f"{offered:,.1f} offered",
                _ratio(sustained, offered),
                "keeps up",
                run["limit"] == "kept up",
                float(run["loadavg_end"][0]),
            )
        )
    return rows


def first_limits(result: dict[str, Any]) -> dict[str, str]:
    """Per backend, the limit of its first row (fewest sessions) that did not keep up, or
    "kept up at every size"."""
    limits: dict[str, str] = {}
    for run in sorted(result["rows"], key=lambda r: r["sessions"]):
        backend = backend_label(run["world"])
        if backend in limits and limits[backend] != "kept up at every size":
            continue
        if "error" in run:
            limits[backend] = f"at {run['sessions']:,} sessions: failed ({run['error'][:60]})"
        elif run["limit"] != "kept up":
            limits[backend] = f"at {run['sessions']:,} sessions: {run['limit']}"
        else:
            limits[backend] = "kept up at every size"
    return limits


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (pastes into benchmarks/README.md as it is)."""
    head = ["target", "backend", "measured", "floor/peer", "ratio", "target", "met", "load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        cells = [
            row.target,
            row.backend,
            row.measured,
            row.reference,
            ratio,
            row.bound,
            "yes" if row.met else "no",
            f"{row.load:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
