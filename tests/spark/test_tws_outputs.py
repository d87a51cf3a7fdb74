"""What a transformWithState processor yields becomes Arrow.

The frames of transformWithStateInPandas become one frame
(``snapcut.spark.tws.processor._concat``): column by column when every frame
has the same columns and plain numpy dtypes, else ``pd.concat``. Either way
the result must equal ``pd.concat(frames, ignore_index=True)``.

The Rows of transformWithState become a table column by column when their
fields are the output schema's in its order and the schema is flat, else
through ``Row.asDict`` by name; either way the same table, and the same
errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StringType, StructField, StructType

from snapcut._core import ConfigError
from snapcut.spark.testing import TwsTester
from snapcut.spark.tws.processor import _concat


def one_row(i: int) -> pd.DataFrame:
    return pd.DataFrame({"user": [i], "n": [i * 2.5], "ok": [i % 2 == 0], "s": [f"k{i}"]})


def frames_of(case: str) -> list[Any]:
    plain = [one_row(i) for i in range(50)]
    if case == "plain":
        return plain
    if case == "many rows":
        return [pd.DataFrame({"user": np.arange(i), "n": np.ones(i)}) for i in range(1, 20)]
    if case == "a nullable int column":
        return [*plain[:3], one_row(3).astype({"user": "Int64"}), *plain[4:]]
    if case == "nullable ints throughout":
        return [pd.DataFrame({"user": pd.array([i, None], dtype="Int64")}) for i in range(5)]
    if case == "categories throughout":
        return [pd.DataFrame({"c": pd.Categorical(["a", "b"])}) for _ in range(5)]
    if case == "a different column order":
        return [*plain[:5], one_row(5)[["n", "user", "ok", "s"]], *plain[6:]]
    if case == "a different dtype":
        return [*plain[:5], one_row(5).astype({"user": "int32"}), *plain[6:]]
    if case == "datetimes":
        return [pd.DataFrame({"t": pd.to_datetime([i], unit="s", utc=True)}) for i in range(5)]
    if case == "duplicate column names":
        return [pd.DataFrame([[i, i + 1]], columns=["a", "a"]) for i in range(5)]
    if case == "a frame with no rows":
        return [*plain[:5], one_row(0).iloc[:0], *plain[5:]]
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "plain",
        "many rows",
        "a nullable int column",
        "nullable ints throughout",
        "categories throughout",
        "a different column order",
        "a different dtype",
        "datetimes",
        "duplicate column names",
        "a frame with no rows",
    ],
)
def test_yielded_frames_concatenate_as_pd_concat_does(case: str) -> None:
    frames = frames_of(case)
    expected = pd.concat(frames, ignore_index=True)
    got = _concat(frames)
    pd.testing.assert_frame_equal(got, expected)


def test_the_frames_are_not_changed() -> None:
    frames = frames_of("plain")
    copies = [f.copy() for f in frames]
    _concat(frames)
    for f, c in zip(frames, copies, strict=True):
        pd.testing.assert_frame_equal(f, c)


class Stateless(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("v", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        return iter(())

    def close(self) -> None:
        pass


def output_table(schema: Any, out: list[Any]) -> pa.Table:
    tester = TwsTester(Stateless(), "user long", outputStructType=schema)
    return tester._processor(pandas=False)._output(out)


FLAT = "user long, name string, score double"


def test_rows_in_the_schemas_order_become_the_same_table_as_by_name() -> None:
    rows = [Row(user=i, name=f"u{i}", score=i / 2) for i in range(100)]
    rows.append(Row(user=100, name=None, score=None))
    by_name = pa.Table.from_pylist([r.asDict() for r in rows], schema=output_table(FLAT, []).schema)
    assert output_table(FLAT, rows).equals(by_name)


def test_rows_in_another_order_are_taken_by_name() -> None:
    rows = [Row(last="b", first="a"), Row(first="c", last="d")]
    got = output_table("first string, last string", rows).to_pylist()
    assert got == [{"first": "a", "last": "b"}, {"first": "c", "last": "d"}]


def test_nested_rows_are_taken_by_name() -> None:
    inner = StructType([StructField("a", StringType()), StructField("b", StringType())])
    schema = StructType([StructField("user", LongType()), StructField("inner", inner)])
    rows = [Row(user=1, inner=Row(a="x", b="y")), Row(user=3, inner=Row(b="q", a="p"))]
    assert output_table(schema, rows).to_pylist() == [
        {"user": 1, "inner": {"a": "x", "b": "y"}},
        {"user": 3, "inner": {"a": "p", "b": "q"}},
    ]


def test_rows_that_do_not_fit_the_schema_are_a_clear_error() -> None:
    rows = [Row(user=1, name="a", score=1.0), Row(user="two", name="b", score=2.0)]
    with pytest.raises(ConfigError, match="do not fit outputStructType"):
        output_table(FLAT, rows)
