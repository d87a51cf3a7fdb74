"""What ``snapcut chaos --engine spark`` compares a run's committed rows with
(:func:`snapcut.chaos.spark.compare`): pandas over the run's events, a
failure-free run's update rows per (batch, user), and the checks that count
lost, duplicated and mismatched rows into a :class:`~snapcut.chaos.core.Check`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa

from snapcut.chaos.core import Check

Totals = tuple[int, int]


"""(count, total) of one user."""


Row = tuple[int, int, float]


"""(count, total, avg) as committed."""


def totals(frame: pd.DataFrame) -> dict[int, Totals]:
    """count and total dwell per user, in pandas."""
    g = frame.groupby("user")["dwell_ms"].agg(["size", "sum"])
    return {int(u): (int(c), int(t)) for u, c, t in zip(g.index, g["size"], g["sum"], strict=True)}


def reference(frames: list[pd.DataFrame]) -> dict[int, Totals]:
    """The failure-free final result: every event counted once."""
    return totals(pd.concat(frames, ignore_index=True))


def expected_updates(
    frames: list[pd.DataFrame], plan: dict[int, list[int]]
) -> dict[tuple[int, int], Totals]:
    """(batch, user) → (count, total) that a failure-free run of `plan`
    (batch → input files) commits in update mode: each batch, the users it
    touched with their running totals."""
    running: dict[int, Totals] = {}
    out: dict[tuple[int, int], Totals] = {}
    for batch in sorted(plan):
        if not plan[batch]:
            continue
        rows = pd.concat([frames[i] for i in plan[batch]], ignore_index=True)
        for user, (c, t) in totals(rows).items():
            c0, t0 = running.get(user, (0, 0))
            running[user] = (c0 + c, t0 + t)
            out[(batch, user)] = running[user]
    return out


@dataclass
class Expected:
    """What a failure-free run of a plan commits."""

    updates: dict[tuple[int, int], Totals]
    """(batch, user) → the user's row of that batch."""
    newest: dict[int, Totals]
    """user → its newest committed output row."""
    state: dict[int, Totals]
    """user → its final state."""


def expected(
    frames: list[pd.DataFrame],
    plan: dict[int, list[int]],
    gap_ms: int | None = None,
    delay_ms: int = 0,
) -> Expected:
    """A failure-free run of `plan`. Without `gap_ms`: a user's totals run
    over all its events (:func:`expected_updates`). With it, the dwell job's
    sessions (``spark_dwell --session-gap``) under snapcut's watermark rule
    (batch N's watermark: the latest event time of batches before N less
    `delay_ms`, events at or before batch N-1's dropped as late): a user's
    timeout is its batch's last event plus the gap; in a batch (one with no
    input too: Spark's no-data batch) a user without rows whose timeout is
    before the watermark gets its totals emitted once more and its state
    removed, and its next event starts from zero."""
    if gap_ms is None:
        ref = reference(frames)
        return Expected(expected_updates(frames, plan), ref, ref)
    running: dict[int, Totals] = {}
    timeouts: dict[int, int] = {}
    out: dict[tuple[int, int], Totals] = {}
    newest: dict[int, Totals] = {}
    latest: int | None = None
    watermark = late = 0
    for batch in sorted(plan):
        late, watermark = watermark, max(watermark, -1 if latest is None else latest - delay_ms)
        files = [frames[i] for i in plan[batch]]
        rows = pd.concat(files, ignore_index=True) if files else None
        seen: set[int] = set()
        if rows is not None and len(rows):
            ms = (rows["ts"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
            rows = rows.assign(ms=ms)[ms > late]
            seen = {int(u) for u in rows["user"].unique()}
        for user in sorted(u for u, t in timeouts.items() if t < watermark and u not in seen):
            out[(batch, user)] = newest[user] = running.pop(user)
            del timeouts[user]
        if rows is None or not len(rows):
            continue
        g = rows.groupby("user").agg(
            n=("dwell_ms", "size"), t=("dwell_ms", "sum"), last=("ms", "max")
        )
        for user, c, t, last in zip(g.index, g["n"], g["t"], g["last"], strict=True):
            c0, t0 = running.get(int(user), (0, 0))
            running[int(user)] = (c0 + int(c), t0 + int(t))
            timeouts[int(user)] = int(last) + gap_ms
            out[(batch, int(user))] = newest[int(user)] = running[int(user)]
        top = int(rows["ms"].max())
        latest = top if latest is None else max(latest, top)
    return Expected(out, newest, dict(running))


def _rows(table: pa.Table | None, avg: Callable[[dict[str, Any]], float]) -> dict[int, list[Row]]:
    if table is None:
        return {}
    out: dict[int, list[Row]] = {}
    for r in table.to_pylist():
        out.setdefault(int(r["user"]), []).append((r["count"], r["total"], avg(r)))
    return out


def output_rows(table: pa.Table | None) -> dict[int, list[Row]]:
    """user → its rows of an output table (user, count, total, avg)."""
    return _rows(table, lambda r: float(r["avg"]))


def state_rows(table: pa.Table | None) -> dict[int, list[Row]]:
    """user → its state rows: the aggregate's (user, count, total, avg__sum,
    avg__count), or the processor's totals (user, count, total)."""
    if table is not None and "avg__sum" not in table.column_names:
        return _rows(table, lambda r: r["total"] / r["count"])
    return _rows(table, lambda r: r["avg__sum"] / r["avg__count"])


def same(row: Row, want: Totals) -> bool:
    count, total, avg = row
    if (count, total) != want:
        return False
    return abs(avg - want[1] / want[0]) <= 1e-9 * max(1.0, abs(avg))


def check_plan(frames: list[pd.DataFrame], plan: dict[int, list[int]], check: Check) -> None:
    """Every input file read by exactly one batch; else its events count as
    lost (no batch) or duplicated (each extra batch)."""
    reads = Counter(i for files in plan.values() for i in files)
    for i, frame in enumerate(frames):
        if reads[i] == 0:
            check.lost += len(frame)
            check.problems.append(f"input file {i} was read by no batch")
        elif reads[i] > 1:
            check.duplicated += (reads[i] - 1) * len(frame)
            check.problems.append(f"input file {i} was read by {reads[i]} batches")


def tally(
    want: Mapping[tuple[int, int], Any],
    got: Mapping[tuple[int, int], list[Any]],
    check: Check,
    who: str = "",
) -> None:
    """Counts into `check` the (batch, user) rows `want` has and `got` lacks
    (lost) and the rows `got` has beyond one per wanted key (duplicated);
    `who` prefixes the problems ("B: ")."""
    lost = sorted(want.keys() - got.keys())
    extra = {k: len(v) - (k in want) for k, v in got.items() if len(v) > (k in want)}
    check.lost += len(lost)
    check.duplicated += sum(extra.values())
    if lost:
        check.problems.append(f"{who}{len(lost)} (batch, user) rows lost, e.g. {lost[0]}")
    if extra:
        k = min(extra)
        check.problems.append(f"{who}{sum(extra.values())} rows extra, e.g. {k}: {got[k]}")


def check_updates(
    want: dict[tuple[int, int], Totals], batches: dict[int, pa.Table], check: Check
) -> set[int]:
    """The committed rows of every batch against `want`; the users with a wrong row."""
    got: dict[tuple[int, int], list[Row]] = {}
    for batch, table in batches.items():
        for user, rows in output_rows(table).items():
            got.setdefault((batch, user), []).extend(rows)
    tally(want, got, check)
    wrong = sorted(k for k, rows in got.items() if k in want and not same(rows[0], want[k]))
    if wrong:
        k = wrong[0]
        check.problems.append(
            f"{len(wrong)} committed rows differ from a failure-free run, e.g. (batch, user) "
            f"{k}: {got[k]}, expected {want[k]}"
        )
    return {u for _, u in wrong}


def check_final(
    what: str, rows: dict[int, list[Row]], ref: dict[int, Totals], check: Check
) -> set[int]:
    """One row per user equal to the reference; the users for which not."""
    bad = {
        u
        for u in ref.keys() | rows.keys()
        if u not in ref or len(rows.get(u, [])) != 1 or not same(rows[u][0], ref[u])
    }
    if bad:
        u = min(bad)
        check.problems.append(
            f"{what}: {len(bad)} users differ from pandas, e.g. user {u}: got {rows.get(u, [])}, "
            f"expected {ref.get(u)}"
        )
    return bad
