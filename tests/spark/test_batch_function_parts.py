"""Level 2 (``map_batches``) over a batch larger than a worker holds, driven
without Spark: the function is called once per part of whole keys and then
once with no rows for the keys whose timeout passed; a batch so applied
leaves the same state and yields the same rows as the one call of a batch
taken whole, for a function whose rows and state are per key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from snapcut._core import StateTable, TaskError
from snapcut.spark.processors import (
    PRESENT_COLUMN,
    TIMED_OUT_COLUMN,
    BatchFunctionProcessor,
    StateUpdate,
)
from snapcut.spark.state.key_parts import hold, key_parts
from snapcut.spark.state.partition import BatchInfo
from snapcut.spark.state.spec import TIMEOUT_COLUMN

STATE = pa.schema([("id", pa.int64()), ("n", pa.int64()), (TIMEOUT_COLUMN, pa.int64())])
OUTPUT = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("timed_out", pa.bool_())])


class Calls:
    rows: list[int] = []  # noqa: RUF012
    """Rows each call got."""


def per_key(rows: pa.Table, state: pa.Table, info: Any) -> StateUpdate:
    """Counts a key's rows; a key whose count is even gets a timeout due in
    the next batch; a timed-out key with an odd count is removed, one with an
    even count is left as it is (its timeout cleared by the step)."""
    Calls.rows.append(rows.num_rows)
    timed_out = state.filter(state[TIMED_OUT_COLUMN])
    live = state.filter(pc.invert(state[TIMED_OUT_COLUMN]))
    counts = rows.group_by("id").aggregate([("id", "count")]).rename_columns(["id", "c"])
    joined = live.select(["id", "n", PRESENT_COLUMN]).join(counts, "id").sort_by("id")
    n = pc.add(pc.fill_null(joined["n"], 0), pc.fill_null(joined["c"], 0))
    even = pc.equal(pc.bit_wise_and(n, 1), 0)
    timeout = pc.if_else(even, pa.scalar(info.processing_time_ms + 1), pa.scalar(None, pa.int64()))
    new = pa.table({"id": joined["id"], "n": n, TIMEOUT_COLUMN: timeout})
    gone = timed_out.filter(pc.equal(pc.bit_wise_and(timed_out["n"], 1), 1))
    out = pa.concat_tables(
        [
            pa.table({"id": joined["id"], "n": n, "timed_out": pa.nulls(len(n), pa.bool_())}),
            pa.table(
                {
                    "id": timed_out["id"],
                    "n": timed_out["n"],
                    "timed_out": pa.array([True] * timed_out.num_rows, pa.bool_()),
                }
            ),
        ]
    )
    return StateUpdate(output=out, state=new, remove=gone["id"])


def make() -> tuple[BatchFunctionProcessor, StateTable]:
    proc = BatchFunctionProcessor(
        key=("id",),
        state_key="id",
        state_schema=STATE,
        output_schema=OUTPUT,
        timeout="ProcessingTimeTimeout",
        fn=per_key,
    )
    return proc, StateTable(STATE, "id", time_column=TIMEOUT_COLUMN)


def rows_of(t: pa.Table | StateTable) -> list[dict[str, Any]]:
    table = t.to_arrow() if isinstance(t, StateTable) else t
    return sorted(table.to_pylist(), key=repr)


def test_a_batch_in_parts_leaves_the_state_and_rows_of_one_call(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    (whole, whole_t), (parted, parted_t) = make(), make()
    timed_out = 0
    for batch, (keys, n) in enumerate([(300, 900), (400, 600), (60, 300), (400, 50)]):
        rows = pa.table({"id": pa.array(rng.integers(0, keys, n), pa.int64())})
        info = BatchInfo(batch, 0, 0, 1000 * (batch + 1), False)
        Calls.rows = []
        want = whole.process(whole_t, rows, info)
        assert len(Calls.rows) == 1
        Calls.rows = []
        first, rest = hold(iter(rows.to_batches(max_chunksize=20)), 200)
        assert rest is not None
        parts = key_parts(first, rest, rows.schema, ("id",), batch, str(tmp_path), buckets=5)
        outs = list(parted.process_parts(parted_t, parts, info))
        calls = 5 + (whole.timed_out_keys > 0)
        assert len(outs) == len(Calls.rows) == calls and sum(Calls.rows) == n
        assert rows_of(pa.concat_tables(outs)) == rows_of(want)
        assert (parted.late_rows, parted.timed_out_keys) == (0, whole.timed_out_keys)
        assert rows_of(parted_t) == rows_of(whole_t)
        timed_out += whole.timed_out_keys
    assert timed_out > 0


def test_parts_without_any_part_say_so() -> None:
    proc, table = make()
    rows = pa.table({"id": pa.array([1, 1], pa.int64())})
    proc.process(table, rows, BatchInfo(0, 0, 0, 1000, False))  # n = 2: a timeout at 1001
    with pytest.raises(TaskError, match="no part at all"):
        list(proc.process_parts(table, [], BatchInfo(1, 0, 0, 5000, False)))
