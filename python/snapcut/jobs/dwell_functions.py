"""The dwell-time query's per-user logic as the two user functions of
``keyed_state``, for ``spark_dwell --step map_batches`` (level 2: a function of
a partition's rows and their keys' state, in Arrow) and ``--step
apply_in_pandas_with_state`` (level 3: Spark's ``func(key, frames, state)``).
Both keep count and total per user and emit the aggregate step's ``(user,
count, total, avg)``, so chaos runs check all steps the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from snapcut.spark import StateUpdate

OUTPUT = "user long, count long, total long, avg double"
STATE = "count long, total long"


def dwell_batch(rows: pa.Table, state: pa.Table, info: Any) -> StateUpdate:
    """Level 2: each user of `rows` gets its new totals; users with no rows
    (a call for timed-out keys alone; this job sets no timeout) change nothing."""
    agg = rows.group_by("user").aggregate([("dwell_ms", "count"), ("dwell_ms", "sum")])
    joined = agg.join(state.select(["user", "count", "total"]), "user")
    count = pc.add(pc.fill_null(joined["count"], 0), joined["dwell_ms_count"])
    total = pc.add(pc.fill_null(joined["total"], 0), joined["dwell_ms_sum"])
    new = pa.table({"user": joined["user"], "count": count, "total": total})
    avg = pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64()))
    return StateUpdate(output=new.append_column("avg", avg), state=new)


def dwell_group(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Any:
    """Level 3: one user's frames of the batch into its ``GroupState``."""
    count, total = state.get if state.exists else (0, 0)
    for frame in frames:
        count += len(frame)
        total += int(frame["dwell_ms"].sum())
    state.update((count, total))
    yield pd.DataFrame(
        {"user": [key[0]], "count": [count], "total": [total], "avg": [total / count]}
    )
