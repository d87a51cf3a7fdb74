"""State values as Spark round-trips them, and the Arrow columns that keep them.

Spark keeps a Python state value in its JVM: the worker sends
``type.toInternal(value)``, the JVM holds it in Catalyst's form (a decimal
at its type's scale, a float in 32 bits, binary as bytes) and hands it back,
read with ``type.fromInternal``. So whatever a processor stored, it gets
back what PySpark's converters make of it: a ``TimestampType`` value as a
naive datetime in the Python process's local time zone (so a naive value,
such as a pandas timestamp in the session time zone, comes back as written;
an aware one comes back as its instant in local time), a
``TimestampNTZType`` value naive as written, dates, ``Decimal`` at the
type's scale, ``bytes``, lists, dicts and structs as Rows.

:class:`StateField` does the same with the state table's column in place of
the JVM: a value goes in as its Catalyst form (natively typed, or pickled
for a type the Rust tables cannot hold, :data:`PICKLED`) and comes out
through ``fromInternal``. transformWithState's value, list and map state,
``GroupState.get`` (level 3), initial state and ``TwsTester`` all read and
write state values through it, so they agree with Spark and with each other.
"""

from __future__ import annotations

import decimal
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_type

from snapcut._core import ConfigError, storable_type

__all__ = [
    "PICKLED",
    "SPARK_TYPE",
    "StateField",
    "catalyst",
    "declared_field",
    "stored_field",
]

PICKLED = b"snapcut.pickled"
"""Field metadata of a state column holding pickled values: the field's Spark
type, as JSON. Nested types (arrays, structs, maps) and decimals have no
column kind in the Rust state table, so such a field is stored as binary
pickles of its values in Catalyst's form (:func:`catalyst`)."""

SPARK_TYPE = b"snapcut.spark_type"
"""Field metadata of a declared field the Rust state table cannot hold
natively (:func:`snapcut._core.storable_type`): its Spark type, as JSON."""


def declared_field(spark_field: Any, arrow_field: pa.Field) -> pa.Field:
    """A state schema's field (Spark's and its Arrow twin) as declared:
    nullable, and marked with its Spark type when the table cannot hold it
    natively (:func:`stored_field` then pickles it)."""
    f = arrow_field.with_nullable(True)
    if not storable_type(f.type):
        f = f.with_metadata({SPARK_TYPE: spark_field.dataType.json().encode()})
    return f


def stored_field(f: pa.Field) -> pa.Field:
    """`f` as the state table keeps it: itself, or (marked by
    :func:`declared_field`) binary pickles of its values."""
    if not f.metadata or SPARK_TYPE not in f.metadata:
        return f
    return pa.field(f.name, pa.binary(), f.nullable, metadata={PICKLED: f.metadata[SPARK_TYPE]})


def _spark_type(f: pa.Field) -> Any:
    for key in (PICKLED, SPARK_TYPE):
        if f.metadata and key in f.metadata:
            return T._parse_datatype_json_string(f.metadata[key].decode())
    # An Arrow timestamp with a zone is Spark's TimestampType, one without
    # TimestampNTZType (how snapcut's state schemas come from Spark's).
    return from_arrow_type(f.type, prefer_timestamp_ntz=True)


def catalyst(t: Any, v: Any) -> Any:
    """What Spark's JVM keeps of the internal value `v` of Spark type `t`
    (``EvaluatePython.makeFromJava``), back in Python: decimals at the
    type's scale (half up; too many digits is an error, as in Spark), floats
    in 32 bits, binary as bytes; nested types element by element."""
    if v is None:
        return None
    if isinstance(t, T.DecimalType):
        d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(v)
        q = d.quantize(decimal.Decimal(1).scaleb(-t.scale), rounding=decimal.ROUND_HALF_UP)
        if q.is_finite() and len(q.as_tuple().digits) > t.precision:
            raise ConfigError(
                f"the state value {v!r} does not fit {t.simpleString()} (Spark's "
                "DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION): round it or widen the type"
            )
        return q
    if isinstance(t, T.FloatType):
        return struct.unpack("f", struct.pack("f", v))[0]
    if isinstance(t, T.BinaryType):
        return bytes(v)
    if isinstance(t, T.ArrayType):
        return [catalyst(t.elementType, x) for x in v]
    if isinstance(t, T.MapType):
        return {catalyst(t.keyType, k): catalyst(t.valueType, x) for k, x in v.items()}
    if isinstance(t, T.StructType):
        return tuple(catalyst(f.dataType, x) for f, x in zip(t.fields, v, strict=True))
    return v


_UNCHANGED = (
    T.BooleanType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DoubleType,
    T.StringType,
)
"""Spark types whose values a round trip leaves as they are."""


@dataclass(frozen=True)
class StateField:
    """One stored state column and its Spark type."""

    field: pa.Field
    type: Any

    @classmethod
    def of(cls, f: pa.Field) -> StateField:
        return cls(f, _spark_type(f))

    @property
    def pickled(self) -> bool:
        return bool(self.field.metadata and PICKLED in self.field.metadata)

    def internal(self, v: Any) -> Any:
        """`v` as Spark's JVM keeps it (Catalyst's form, as Python)."""
        if v is None:
            return None
        try:
            return catalyst(self.type, self.type.toInternal(v))
        except (TypeError, ValueError, AttributeError, OverflowError) as e:
            raise ConfigError(
                f"state field {self.field.name!r}: {v!r} is not a value of "
                f"{self.type.simpleString()}: {e}"
            ) from e

    def python(self, internal: Any) -> Any:
        """A kept value as Spark hands it to Python (``fromInternal``)."""
        if internal is None or not self.type.needConversion():
            return internal
        return self.type.fromInternal(internal)

    @property
    def unchanged(self) -> bool:
        """Whether a round trip leaves every value of this type as it is."""
        return isinstance(self.type, _UNCHANGED)

    def round_trip(self, v: Any) -> Any:
        """What a processor gets back after storing `v`."""
        if self.unchanged:
            return v
        return self.python(self.internal(v))

    def to_arrow(self, values: list[Any]) -> pa.Array:
        """The column of `values` (Python values, as a processor gives them)."""
        kept = [self.internal(v) for v in values]
        t = self.field.type
        try:
            if self.pickled:
                return pa.array(
                    [None if x is None else pickle.dumps(x, protocol=5) for x in kept], t
                )
            if pa.types.is_timestamp(t):  # internal: microseconds since the epoch
                return pc.cast(pa.array(kept, pa.timestamp("us", t.tz)), t)
            return pa.array(kept, t)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ConfigError(
                f"state field {self.field.name!r}: a value does not fit its type {t}: {e}"
            ) from e

    def from_arrow(self, column: pa.Array | pa.ChunkedArray) -> list[Any]:
        """The column's values as Spark hands them to Python."""
        if self.pickled:
            return [None if x is None else self.python(pickle.loads(x)) for x in column.to_pylist()]
        t = column.type
        if pa.types.is_timestamp(t):
            raw = pc.cast(pc.cast(column, pa.timestamp("us", t.tz)), pa.int64()).to_pylist()
        elif pa.types.is_date32(t):
            raw = pc.cast(column, pa.int32()).to_pylist()
        else:
            # Decimals, binary and the rest are already what Catalyst hands back.
            return list(column.to_pylist())
        return [self.python(x) for x in raw]
