"""snapcut.spark.state_values without Spark: each type family through
StateField as Spark's JVM round trip gives it back (the Spark comparison
itself is test_spark_state_value_types.py). The process's time zone is
set to one other than UTC so a conversion in the wrong zone shows."""

from __future__ import annotations

import datetime
import decimal
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from snapcut import ConfigError
from snapcut.spark.state_values import StateField, declared_field, stored_field


@pytest.fixture(autouse=True)
def local_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "America/Los_Angeles")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def field(name: str, t: T.DataType) -> StateField:
    """A state column of Spark type `t`, stored as snapcut stores it."""
    arrow = pa.field(name, to_arrow_type(t, timezone="UTC"))
    return StateField.of(stored_field(declared_field(T.StructField(name, t), arrow)))


def through(f: StateField, values: list[object]) -> list[object]:
    return f.from_arrow(f.to_arrow(values))


def test_timestamps_come_back_naive_in_local_time() -> None:
    naive = datetime.datetime(2024, 1, 1, 4, 0)
    aware = datetime.datetime(2024, 1, 1, 12, 0, tzinfo=datetime.UTC)
    ts = field("ts", T.TimestampType())
    assert not ts.pickled
    # A naive value as written; an aware one as its instant in local time (PST).
    assert through(ts, [naive, aware, None]) == [naive, naive, None]
    ntz = field("ntz", T.TimestampNTZType())
    assert through(ntz, [naive, None]) == [naive, None]
    assert ts.round_trip(aware) == naive


def test_decimals_floats_binary_and_dates() -> None:
    dec = field("dec", T.DecimalType(10, 2))
    assert dec.pickled
    got = through(dec, [decimal.Decimal("1.5"), decimal.Decimal("2.345"), None])
    assert [str(d) for d in got if d is not None] == ["1.50", "2.35"]
    with pytest.raises(ConfigError, match="does not fit decimal"):
        dec.to_arrow([decimal.Decimal("123456789.5")])
    assert field("f", T.FloatType()).round_trip(1.1) == 1.100000023841858
    assert through(field("b", T.BinaryType()), [bytearray(b"\x00a")]) == [b"\x00a"]
    assert through(field("d", T.DateType()), [datetime.date(2024, 3, 10)]) == [
        datetime.date(2024, 3, 10)
    ]


def test_nested_types_convert_element_by_element() -> None:
    naive = datetime.datetime(2024, 1, 1, 4, 0)
    inner = T.StructType(
        [T.StructField("a", T.IntegerType()), T.StructField("p", T.DecimalType(4, 1))]
    )
    arr = field("arr", T.ArrayType(T.TimestampType()))
    m = field("m", T.MapType(T.StringType(), T.FloatType()))
    st = field("st", inner)
    assert arr.pickled and m.pickled and st.pickled
    assert through(arr, [[naive, None]]) == [[naive, None]]
    assert through(m, [{"k": 1.1}]) == [{"k": 1.100000023841858}]
    (row,) = through(st, [Row(a=1, p=decimal.Decimal("2"))])
    assert isinstance(row, Row)
    assert row == Row(a=1, p=decimal.Decimal("2.0"))
    assert str(row.p) == "2.0"


def test_a_value_of_the_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'ts'.*not a value of timestamp"):
        field("ts", T.TimestampType()).to_arrow(["yesterday"])
