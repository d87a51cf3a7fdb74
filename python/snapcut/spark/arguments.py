"""The arguments of the Spark wing's entry points, checked and converted the
way Spark takes them: interval strings, schemas (StructType, DDL or
pyarrow), output modes, and ``groupBy``'s key forms."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["arrow_schema", "key_columns", "output_mode", "parse_duration_ms", "spark_schema"]

_UNITS_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "second": 1000,
    "seconds": 1000,
    "minute": 60_000,
    "minutes": 60_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "day": 86_400_000,
    "days": 86_400_000,
}


def parse_duration_ms(value: str | int, what: str) -> int:
    """Spark's interval strings ("10 seconds", "1 minute") or milliseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s*([a-z]+)\s*", str(value).lower())
        if m is None or m.group(2) not in _UNITS_MS:
            raise ConfigError(
                f"{what}={value!r} is not a duration: write e.g. '10 seconds', '5 minutes', "
                "'500 milliseconds', or an int of milliseconds"
            )
        ms = int(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms < 0:
        raise ConfigError(f"{what} must not be negative, got {value!r}")
    return ms


def spark_schema(schema: Any, what: str) -> Any:
    """A Spark StructType from a StructType, a DDL string or a pyarrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, pa.Schema):
        return from_arrow_schema(schema, prefer_timestamp_ntz=False)
    if isinstance(schema, str):
        parsed = _parse_datatype_string(schema)
        if isinstance(parsed, StructType):
            return parsed
    raise ConfigError(
        f"{what} must be a pyspark StructType, a DDL string ('user string, n long') or a "
        f"pyarrow.Schema; got {schema!r}"
    )


def arrow_schema(session: Any, schema: Any, what: str) -> pa.Schema:
    """`schema` (as :func:`spark_schema` takes it) as pyarrow, timestamps in
    the session's time zone, as Spark hands them to Python."""
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = session.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(spark_schema(schema, what), timezone=tz)


def frame_arrow_schema(frame: Any) -> pa.Schema:
    """A DataFrame's schema as pyarrow (the session's time zone)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = frame.sparkSession.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(frame.schema, timezone=tz)


def key_columns(df: DataFrame, key: Any) -> tuple[DataFrame, tuple[str, ...]]:
    """What ``groupBy`` takes as keys — column names and Columns, alone or in
    a list — as column names of `df` (a Column that is an expression becomes a
    column of its own, named as Spark names it)."""
    items = [key] if isinstance(key, str) or is_column(key) else list(key)
    if not items:
        raise ConfigError("key must name at least one column")
    names = []
    for item in items:
        if isinstance(item, str):
            names.append(item)
        elif is_column(item):
            name = df.select(item).columns[0]
            if name not in df.columns:
                df = df.withColumn(name, item)
            names.append(name)
        else:
            raise ConfigError(
                f"key must be column names or Columns (as groupBy takes), got {item!r}"
            )
    return df, tuple(names)


def is_column(value: Any) -> bool:
    from pyspark.sql import Column

    return isinstance(value, Column)


def output_mode(value: Any, what: str) -> str:
    """Spark's output-mode spellings for a stateful step: "update" or "append", any case."""
    mode = value.lower() if isinstance(value, str) else None
    if mode not in ("update", "append"):
        raise ConfigError(f"{what} must be 'Update' or 'Append' (any case), got {value!r}")
    return mode
