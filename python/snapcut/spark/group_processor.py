"""Level 3 of the stateful helper: ``applyInPandasWithState``'s per-key function
with Spark's ``GroupState`` (:class:`PandasGroupProcessor`), over a batch of
any size: a step of keys at a time, and under a worker's budget a batch in
parts of whole keys."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import ConfigError, StateTable, TaskError
from snapcut.spark.group_state import DEFINED_COLUMN, TIMEOUT_COLUMN, GroupState
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.processors import (
    BatchFunctionProcessor,
    _no_columns,
    _plain_array,
    conform,
)
from snapcut.spark.state.key_parts import KEYS_PER_STEP
from snapcut.spark.state.partition import BatchInfo
from snapcut.spark.state_values import StateField

__all__ = ["PandasGroupProcessor"]


@dataclass
class PandasGroupProcessor(BatchFunctionProcessor):
    """Level 3: ``func(key, Iterator[pd.DataFrame], GroupState) -> Iterator[pd.DataFrame]``,
    with the rules of Spark's ``FlatMapGroupsInPandasWithStateExec``: groups in key
    order; each group's rows in chunks of at most ``max_records_per_batch`` rows,
    cut where Spark's Arrow writer cuts the partition's sorted rows; timed-out keys
    after the keys with data, each called with one empty frame; and a key is stored
    when the call updated, removed or re-timed it (a removed key with a timeout
    stays, without a value, until the timeout fires)."""

    func: Callable[[tuple[Any, ...], Iterator[Any], GroupState], Iterator[Any]] | None = None
    value_columns: tuple[str, ...] = ()
    max_records_per_batch: int = 10_000

    def _chunks(self, frame: Any, start: int, end: int) -> list[Any]:
        """Rows [start, end) of the part's sorted rows (the partition's when
        the batch is one part), cut at Spark's Arrow batch boundaries (every
        `max_records_per_batch` rows; none if <= 0)."""
        size = self.max_records_per_batch
        cuts = [start]
        if size > 0:
            cuts += range((start // size + 1) * size, end, size)
        cuts.append(end)
        return [frame.iloc[a:b].reset_index(drop=True) for a, b in itertools.pairwise(cuts)]

    def process(self, table: StateTable, rows: pa.Table, info: BatchInfo) -> pa.Table:
        outs = list(self.process_parts(table, [rows], info))
        if not outs:
            return self.output_schema.empty_table()
        return outs[0] if len(outs) == 1 else pa.concat_tables(outs)

    def process_parts(
        self, table: StateTable, parts: Iterable[pa.Table], info: BatchInfo
    ) -> Iterator[pa.Table]:
        """The batch's calls over `parts` (each holding whole keys; one part:
        the whole batch): each part's keys in key order, then the keys whose
        timeout passed, each with one empty frame, as Spark times them out
        after the keys with data (their state as the batch left it: a key
        that had data holds no timeout its call did not set, and a timeout
        set is after the threshold). At most :data:`KEYS_PER_STEP` keys
        have their state read, their calls made and their changes written
        back at a time; yields each step's output (none if it had none).
        ``late_rows`` and ``timed_out_keys`` are the batch's once the parts
        are exhausted."""
        late = 0
        empty: Any = None
        for part in parts:
            rows = self._prepare(part, info)
            late += self.late_rows
            user_cols = [c for c in rows.column_names if c != KEY_COLUMN]
            if empty is None:
                # What a timed-out key's call gets: one empty frame of the input's columns.
                empty = self.to_pandas(rows.select(user_cols).schema.empty_table())
            if rows.num_rows == 0:
                continue
            # Spark's order: groups sorted by the grouping columns, nulls first.
            order = pc.sort_indices(rows, options=_nulls_first(self.key))
            rows = rows.take(order)
            del order
            bounds = _run_bounds(rows[self.state_key])
            frame = self.to_pandas(rows.select(user_cols))
            starts = pa.array([b[0] for b in bounds], pa.int64())
            keys = _plain_array(rows[self.state_key].take(starts))
            data_keys = rows.select(list(self.key)).take(starts)
            del rows, starts
            for first in range(0, len(keys), KEYS_PER_STEP):
                stop = first + KEYS_PER_STEP
                calls = [
                    (k, tuple(d[c] for c in self.key), start, end)
                    for k, d, (start, end) in zip(
                        keys[first:stop].to_pylist(),
                        data_keys.slice(first, KEYS_PER_STEP).to_pylist(),
                        bounds[first:stop],
                        strict=True,
                    )
                ]
                out = self._calls(table, keys[first:stop], calls, frame, info)
                if out is not None:
                    yield out
        expired = self._expired(table, info)
        if len(expired):
            if empty is None:
                raise TaskError(
                    "a level-3 batch came with no part at all: its input's columns are unknown"
                )
            for first in range(0, len(expired), KEYS_PER_STEP):
                step = expired[first : first + KEYS_PER_STEP]
                timed_out = [(k, None, 0, 0) for k in step.to_pylist()]
                out = self._calls(table, step, timed_out, empty, info)
                if out is not None:
                    yield out
        self.late_rows = late
        self.timed_out_keys = len(expired)

    def _calls(
        self,
        table: StateTable,
        skeys: pa.Array,
        calls: Sequence[tuple[Any, tuple[Any, ...] | None, int, int]],
        frame: Any,
        info: BatchInfo,
    ) -> pa.Table | None:
        """One step's calls: `calls` are (state key, grouping key or None for
        a timed-out key, rows [start, end) of `frame`); their state is read
        at once, and their changes written back before the output returns."""
        assert self.func is not None
        key_type = self.state_schema.field(self.state_key).type
        current, present = table.lookup(skeys)
        fields = self._state_fields()
        # The stored values as Spark's GroupState gets them; the rest as they are.
        values = [fields[c].from_arrow(current.column(c)) for c in self.value_columns]
        others = [c for c in current.schema.names if c not in fields]
        current_rows = current.select(others).to_pylist()
        presence = present.to_pylist()
        has_timeout = TIMEOUT_COLUMN in self.state_schema.names
        frames: list[Any] = []
        new_rows: list[dict[str, Any]] = []
        removed: list[Any] = []
        for i, (skey, data_key, start, end) in enumerate(calls):
            row = current_rows[i]
            stored = bool(presence[i])
            defined = stored and (not has_timeout or bool(row[DEFINED_COLUMN]))
            value = tuple(col[i] for col in values) if defined else None
            old_timeout = row.get(TIMEOUT_COLUMN) if stored else None
            timed_out = data_key is None
            gs = GroupState.for_call(
                value,
                info.processing_time_ms,
                info.watermark_ms,
                self.timeout,
                timed_out,
                info.watermark_present,
            )
            if data_key is None:
                key_tuple = tuple(row[k] for k in self.key)
                chunks: Iterator[Any] = iter([frame.copy()])
            else:
                key_tuple = data_key
                chunks = iter(self._chunks(frame, start, end))
            result = self.func(key_tuple, chunks, gs)
            if result is not None:
                frames.extend(f for f in result if not _no_columns(f))
            timeout = gs.timeout_after_call
            if gs.was_removed and timeout == GroupState.NO_TIMESTAMP:
                if stored:
                    removed.append(skey)
                continue
            old = GroupState.NO_TIMESTAMP if old_timeout is None else int(old_timeout)
            if not (gs.was_updated or gs.was_removed or timeout != old):
                continue
            new_value = gs.value_after_call
            if new_value is not None and len(new_value) != len(self.value_columns):
                raise ConfigError(
                    f"state.update got {len(new_value)} value(s) for key {key_tuple}, "
                    f"stateStructType has {len(self.value_columns)} "
                    f"({list(self.value_columns)}): pass one value per state field"
                )
            new = dict.fromkeys(self.value_columns)
            if new_value is not None:
                new.update(zip(self.value_columns, new_value, strict=True))
            new.update(zip(self.key, key_tuple, strict=True))
            new[self.state_key] = skey
            if has_timeout:
                new[DEFINED_COLUMN] = new_value is not None
                new[TIMEOUT_COLUMN] = None if timeout == GroupState.NO_TIMESTAMP else timeout
            new_rows.append(new)
        if new_rows:
            table.update(self._state_table(new_rows, fields))
        if removed:
            table.delete(pa.array(removed, key_type))
        if not frames:
            return None
        import pandas as pd

        return conform(
            pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0],
            self.output_schema,
            "the function's output",
            "yield pandas DataFrames with outputStructType's columns",
        )

    def _state_fields(self) -> dict[str, StateField]:
        return {c: StateField.of(self.state_schema.field(c)) for c in self.value_columns}

    def _state_table(self, rows: list[dict[str, Any]], fields: dict[str, StateField]) -> pa.Table:
        """The new state rows, values kept as Spark keeps what ``update`` got."""
        try:
            arrays = [
                fields[f.name].to_arrow([r[f.name] for r in rows])
                if f.name in fields
                else pa.array([r[f.name] for r in rows], f.type)
                for f in self.state_schema
            ]
        except (ConfigError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ConfigError(
                f"state.update values do not fit stateStructType {self.state_schema}: {e}"
            ) from e
        return pa.Table.from_arrays(arrays, schema=self.state_schema)


def _nulls_first(columns: Sequence[str]) -> pc.SortOptions:
    """Ascending by `columns`, nulls first: per sort key where pyarrow takes
    it (a sort-wide ``null_placement`` is deprecated since pyarrow 25), else
    for the whole sort (pyarrow before per-key placement)."""
    try:
        return pc.SortOptions(sort_keys=[(c, "ascending", "at_start") for c in columns])
    except (TypeError, ValueError):
        return pc.SortOptions(
            sort_keys=[(c, "ascending") for c in columns], null_placement="at_start"
        )


def _run_bounds(sorted_keys: pa.ChunkedArray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal keys in a sorted column."""
    ends = pc.run_end_encode(sorted_keys.combine_chunks()).run_ends.to_pylist()
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends, strict=True))
