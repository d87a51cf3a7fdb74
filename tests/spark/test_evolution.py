"""snapcut.spark.state.evolution without Spark: which schema changes a restart
migrates, which it refuses, and how older files are read as the new schema."""

from __future__ import annotations

import pyarrow as pa
import pytest

from snapcut._core import ConfigError
from snapcut.spark.group_state import DEFINED_COLUMN, TIMEOUT_COLUMN
from snapcut.spark.state.evolution import conform_file, plan_table

KEY = {"k"}


def schema(*fields: pa.Field) -> pa.Schema:
    return pa.schema([pa.field("k", pa.string(), nullable=False), *fields])


def test_added_removed_and_widened_fields_are_a_migration() -> None:
    old = schema(pa.field("n", pa.int32()), pa.field("gone", pa.string()))
    new = schema(pa.field("n", pa.int64()), pa.field("extra", pa.float64()))
    m = plan_table("t", old, new, KEY, "root")
    assert m.describe() == {
        "table": "t",
        "added": ["extra"],
        "removed": ["gone"],
        "widened": [{"field": "n", "from": "int32", "to": "int64"}],
    }
    assert not plan_table("t", old, old, KEY, "root")


@pytest.mark.parametrize(
    ("new", "match"),
    [
        (schema(pa.field("n", pa.int16())), "not a widening"),
        (schema(pa.field("m", pa.int32())), "looks renamed to 'm'"),
        (schema(pa.field("n", pa.int32(), nullable=False)), "changed from int32 to int32 not null"),
        (
            pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("n", pa.int32())]),
            "key column 'k' changed",
        ),
    ],
)
def test_unsafe_changes_are_refused_with_the_field(new: pa.Schema, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_table("t", schema(pa.field("n", pa.int32())), new, KEY, "root")


def test_older_files_are_read_as_the_new_schema() -> None:
    old = pa.table({"k": ["a", "b"], "n": pa.array([1, 2], pa.int32()), "__deleted": [False, True]})
    new = schema(
        pa.field("n", pa.int64()),
        pa.field("note", pa.string()),
        pa.field("count", pa.int64(), nullable=False),
    )
    got = conform_file(old, new)
    assert got.column_names == ["k", "n", "note", "count", "__deleted"]
    assert got.to_pylist() == [
        {"k": "a", "n": 1, "note": None, "count": 0, "__deleted": False},
        {"k": "b", "n": 2, "note": None, "count": 0, "__deleted": True},
    ]
    same = pa.table({"k": ["a"], "n": pa.array([1], pa.int64())})
    assert conform_file(same, schema(pa.field("n", pa.int64()))) is same


LEVEL3_TIMEOUT = (
    pa.field(DEFINED_COLUMN, pa.bool_(), nullable=False),
    pa.field(TIMEOUT_COLUMN, pa.int64()),
)


def test_a_level3_state_gaining_a_timeout_keeps_every_stored_value() -> None:
    old = schema(pa.field("n", pa.int64()))
    new = schema(pa.field("n", pa.int64()), *LEVEL3_TIMEOUT)
    assert plan_table("t", old, new, KEY, "root").added == [DEFINED_COLUMN, TIMEOUT_COLUMN]
    got = conform_file(pa.table({"k": ["a"], "n": [5]}), new)
    # Every key stored without a timeout held a value; none has a timeout yet.
    assert got.to_pylist() == [{"k": "a", "n": 5, DEFINED_COLUMN: True, TIMEOUT_COLUMN: None}]


def test_a_level3_state_losing_its_timeout_is_refused() -> None:
    with_timeout = schema(pa.field("n", pa.int64()), *LEVEL3_TIMEOUT)
    with pytest.raises(ConfigError, match="keep the timeoutConf"):
        plan_table("t", with_timeout, schema(pa.field("n", pa.int64())), KEY, "root")


def test_an_added_column_without_a_value_for_stored_keys_is_refused() -> None:
    new = schema(pa.field("n", pa.int64()), pa.field("label", pa.string(), nullable=False))
    with pytest.raises(ConfigError, match=r"'label' .*make it nullable"):
        plan_table("t", schema(pa.field("n", pa.int64())), new, KEY, "root")
