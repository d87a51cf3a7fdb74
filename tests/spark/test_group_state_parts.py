"""The applyInPandasWithState drop-in (level 3) over a batch of any size, driven
without Spark: the calls run a step of keys at a time and, past what a worker
holds, over parts of whole keys (``PandasGroupProcessor.process_parts``);
either way a batch leaves the same state and yields the same rows as one step
over the whole batch, timeouts included (keys with data first, then the keys
whose timeout passed, each with one empty frame)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from test_tws_parts import batch_rows

import snapcut.spark.group_processor as group_processor
from snapcut._core import StateTable, TaskError
from snapcut.spark.group_processor import PandasGroupProcessor
from snapcut.spark.group_state import DEFINED_COLUMN, TIMEOUT_COLUMN, GroupState
from snapcut.spark.group_state import GroupStateTimeout as Timeout
from snapcut.spark.state.key_parts import hold, key_parts
from snapcut.spark.state.partition import BatchInfo

STATE = pa.schema(
    [
        ("id", pa.int64()),
        ("n", pa.int64()),
        (DEFINED_COLUMN, pa.bool_()),
        (TIMEOUT_COLUMN, pa.int64()),
    ]
)
OUTPUT = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("what", pa.string())])


class Calls:
    """Every call the function got, in order."""

    log: list[tuple[str, int]] = []  # noqa: RUF012


def count(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState) -> Any:
    """Counts a key's rows; an even count sets a timeout of 1 ms (due in the
    next batch); a count past 6 removes the key; a timed-out key reports
    and, if odd, keeps its value without a timeout."""
    if state.hasTimedOut:
        Calls.log.append(("timeout", key[0]))
        assert sum(len(f) for f in frames) == 0
        n = state.get[0] if state.exists else -1
        if n % 2:
            state.update((n,))
        else:
            state.remove()
        yield pd.DataFrame({"id": [key[0]], "n": [n], "what": ["timeout"]})
        return
    Calls.log.append(("data", key[0]))
    n = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
    if n > 6:
        state.remove()
    else:
        state.update((n,))
        if n % 2 == 0:
            state.setTimeoutDuration(1)
    yield pd.DataFrame({"id": [key[0]], "n": [n], "what": ["data"]})


def make() -> tuple[PandasGroupProcessor, StateTable]:
    proc = PandasGroupProcessor(
        key=("id",),
        state_key="id",
        state_schema=STATE,
        output_schema=OUTPUT,
        timeout=Timeout.ProcessingTimeTimeout,
        func=count,
        value_columns=("n",),
        max_records_per_batch=4,
    )
    return proc, StateTable(STATE, "id", time_column=TIMEOUT_COLUMN)


def rows_of(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=repr)


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_a_batch_in_steps_and_parts_leaves_the_state_and_rows_of_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    rng = np.random.default_rng(step)
    batches = [batch_rows(rng, 300, 900), batch_rows(rng, 400, 600), batch_rows(rng, 60, 300)]
    (whole, whole_t), (parted, parted_t) = make(), make()
    timeouts = 0
    for batch, rows in enumerate(batches):
        info = BatchInfo(batch, 0, 0, 1000 * (batch + 1), False)
        monkeypatch.setattr(group_processor, "KEYS_PER_STEP", 1 << 20)
        want = whole.process(whole_t, rows, info)
        want_figures = (whole.late_rows, whole.timed_out_keys)

        monkeypatch.setattr(group_processor, "KEYS_PER_STEP", step)
        first, rest = hold(iter(rows.to_batches(max_chunksize=100)), 2000)
        assert rest is not None
        parts = key_parts(first, rest, rows.schema, ("id",), batch, str(tmp_path), buckets=5)
        outs = list(parted.process_parts(parted_t, parts, info))
        # Each step of each part, then the timed-out keys' steps.
        assert len(outs) >= 5 + (want_figures[1] > 0)
        assert rows_of(pa.concat_tables(outs)) == rows_of(want)
        assert (parted.late_rows, parted.timed_out_keys) == want_figures
        assert rows_of(parted_t.to_arrow()) == rows_of(whole_t.to_arrow())
        timeouts += want_figures[1]
    assert timeouts > 0


def test_a_whole_batch_in_steps_makes_the_calls_of_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One part, in steps of 5 keys, over two batches (the second times keys
    out): the same rows in the same order, and the same calls in Spark's
    order (the keys with data by key, then the timed-out keys), as in one
    step."""
    rng = np.random.default_rng(3)
    batches = [batch_rows(rng, 400, 300), batch_rows(rng, 400, 100)]
    runs = []
    for step in (1 << 20, 5):
        monkeypatch.setattr(group_processor, "KEYS_PER_STEP", step)
        proc, table = make()
        Calls.log = []
        outs = [
            proc.process(table, rows, BatchInfo(b, 0, 0, 5000 * (b + 1), False))
            for b, rows in enumerate(batches)
        ]
        runs.append((outs, rows_of(table.to_arrow()), Calls.log))
    for a, b in zip(runs[0][0], runs[1][0], strict=True):
        assert a.equals(b)
    assert runs[0][1:] == runs[1][1:]
    log = runs[0][2]
    data = [k for c, k in log if c == "data"]
    assert data[: len(set(batches[0]["id"].to_pylist()))] == sorted(
        set(batches[0]["id"].to_pylist())
    )
    second = log[len(set(batches[0]["id"].to_pylist())) :]
    kinds = [c for c, _ in second]
    assert "timeout" in kinds and kinds == sorted(kinds)  # "data" before "timeout"


def test_timed_out_keys_and_a_call_with_no_part_at_all() -> None:
    """A batch with no rows still times keys out (each with one empty frame
    of the input's columns); a run given no part at all cannot know those
    columns and says so."""
    proc, table = make()
    rows = pa.table({"id": pa.array([1, 1, 2], pa.int64()), "v": [5, 6, 7]})
    proc.process(table, rows, BatchInfo(0, 0, 0, 1000, False))
    out = proc.process(table, rows.schema.empty_table(), BatchInfo(1, 0, 0, 2000, False))
    assert out.to_pylist() == [{"id": 1, "n": 2, "what": "timeout"}]
    assert proc.timed_out_keys == 1
    proc.process(table, rows, BatchInfo(2, 0, 0, 3000, False))  # 1 -> 4: a timeout again
    with pytest.raises(TaskError, match="no part at all"):
        list(proc.process_parts(table, [], BatchInfo(3, 0, 0, 4000, False)))
