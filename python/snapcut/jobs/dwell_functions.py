"""The dwell-time query's per-user logic as the two user functions of
``keyed_state``, for ``spark_dwell --step map_batches`` (level 2: a function of
a partition's rows and their keys' state, in Arrow) and ``--step
apply_in_pandas_with_state`` (level 3: Spark's ``func(key, frames, state)``).
Both keep count and total per user and emit the aggregate step's ``(user,
count, total, avg)``, so chaos runs check all steps the same way.

With a session gap (``spark_dwell --session-gap``) both set an event-time
timeout: a user's totals are a session that closes once the watermark passes
its last event by the gap. The call for its timed-out key emits the totals
once more and removes the state, so its next event starts a new session
(``snapcut chaos --session-gap`` checks that with kills, which is how the
calls for timed-out keys are proven exactly-once)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from snapcut.spark import StateUpdate
from snapcut.spark.processors import event_time_ms

OUTPUT = "user long, count long, total long, avg double"
STATE = "count long, total long"


def dwell_batch(
    rows: pa.Table, state: pa.Table, info: Any, gap_ms: int | None = None
) -> StateUpdate:
    """Level 2: each user of `rows` gets its new totals. Users with no rows
    are timed-out keys (only with a session gap `gap_ms`): their totals are
    emitted and their state removed. With a gap, a user's timeout is its
    batch's last event plus the gap."""
    agg = rows.group_by("user").aggregate(
        [("dwell_ms", "count"), ("dwell_ms", "sum"), ("ts", "max")]
    )
    joined = agg.join(state.select(["user", "count", "total"]), "user")
    count = pc.add(pc.fill_null(joined["count"], 0), joined["dwell_ms_count"])
    total = pc.add(pc.fill_null(joined["total"], 0), joined["dwell_ms_sum"])
    new = pa.table({"user": joined["user"], "count": count, "total": total})
    output = with_avg(new)
    if gap_ms is None:
        return StateUpdate(output=output, state=new)
    last_ms = event_time_ms(joined["ts_max"])
    timed = new.append_column("__timeout_ms", pc.add(last_ms, gap_ms))
    closed = state.filter(state["__timed_out"]).select(["user", "count", "total"])
    return StateUpdate(
        output=pa.concat_tables([output, with_avg(closed).cast(output.schema)]),
        state=timed,
        remove=closed.select(["user"]),
    )


def with_avg(totals: pa.Table) -> pa.Table:
    """(user, count, total) with avg = total / count."""
    avg = pc.divide(pc.cast(totals["total"], pa.float64()), pc.cast(totals["count"], pa.float64()))
    return totals.append_column("avg", avg)


def dwell_group(
    key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any, gap_ms: int | None = None
) -> Any:
    """Level 3: one user's frames of the batch into its ``GroupState``; with
    a session gap `gap_ms`, a timed-out user's totals emitted and removed,
    and an updated one's timeout set to its last event plus the gap."""
    count, total = state.get if state.exists else (0, 0)
    if state.hasTimedOut:
        state.remove()
    else:
        last_ms = None
        for frame in frames:
            count += len(frame)
            total += int(frame["dwell_ms"].sum())
            if len(frame):
                ms = int(pd.Timestamp(frame["ts"].max()).value // 1_000_000)
                last_ms = ms if last_ms is None else max(last_ms, ms)
        state.update((count, total))
        if gap_ms is not None and last_ms is not None:
            state.setTimeoutTimestamp(last_ms + gap_ms)
    yield pd.DataFrame(
        {"user": [key[0]], "count": [count], "total": [total], "avg": [total / count]}
    )
