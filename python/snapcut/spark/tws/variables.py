"""The state variables of a ``StatefulProcessor`` and the tables that hold them.

Spark learns a processor's variables by running its ``init`` on the driver
with a handle that only records them (``DriverStatefulProcessorHandleImpl``);
so does snapcut (:class:`DeclaringHandle`). Each variable becomes one table of
the state root (:class:`~snapcut.spark.root.TableSpec`):

- value state: one row per grouping key, keyed by the grouping state key;
- list state: one row per element, keyed by (grouping key, position);
- map state: one row per entry, keyed by (grouping key, user key);
- timers (``$timers``): one row per timer, keyed by (grouping key, expiry).

Composite keys are ``__key`` (snapcut's row encoding of the parts) and carry a
group column (the grouping state key) so a grouping key's rows are read and
deleted together. A variable with a TTL has an ``__expires_ms`` column.
Stored column names are the fields' own, except where a field would clash
with a grouping-key column or the reserved ``__`` prefix (then
``value.<name>`` / ``key.<name>``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle

from snapcut._core import ConfigError
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.roots import schema_bytes
from snapcut.spark.state.spec import EXPIRES_COLUMN, GROUP_COLUMN, TIMER_COLUMN, TableSpec
from snapcut.spark.state_values import declared_field, stored_field

__all__ = [
    "EXPIRES_COLUMN",
    "GROUP_COLUMN",
    "SEQ_COLUMN",
    "TIMERS",
    "TIMER_COLUMN",
    "DeclaringHandle",
    "Variable",
    "table_specs",
]

SEQ_COLUMN = "__seq"
TIMERS = "$timers"
KINDS = ("value", "list", "map")


@dataclass(frozen=True)
class Variable:
    """One state variable as ``init`` declared it (arrow fields, TTL in ms)."""

    name: str
    kind: str
    value_fields: tuple[pa.Field, ...]
    user_key_fields: tuple[pa.Field, ...] = ()
    ttl_ms: int | None = None


def arrow_fields(
    schema: Any, what: str, parse: Callable[[str], Any] | None = None, state: bool = True
) -> tuple[pa.Field, ...]:
    """A state schema as Spark takes it (StructType or DDL string) in arrow
    fields; `parse` reads a DDL string (default :func:`parse_ddl`)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    if isinstance(schema, str):
        parsed = parse(schema) if parse is not None else parse_ddl(schema, what)
    else:
        parsed = schema
    if not isinstance(parsed, StructType) or not parsed.fields:
        raise ConfigError(
            f"{what}: the schema must be a non-empty StructType or a DDL string such as "
            f"'count long', got {schema!r}"
        )
    if state:
        strict = [f.name for f in parsed.fields if not f.nullable]
        if strict:
            raise ConfigError(
                f"[TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE] {what}: field(s) {strict} are "
                "not nullable; state schemas must be nullable (Spark's rule): declare them "
                "nullable"
            )
    # Timestamps as UTC instants (the zone is the column's, not the values'):
    # state values come back as Spark hands them (snapcut.spark.state_values).
    return tuple(
        declared_field(sf, af)
        for sf, af in zip(parsed.fields, to_arrow_schema(parsed, timezone="UTC"), strict=True)
    )


_SIMPLE_TYPES = {
    "string": "StringType",
    "long": "LongType",
    "bigint": "LongType",
    "int": "IntegerType",
    "integer": "IntegerType",
    "short": "ShortType",
    "smallint": "ShortType",
    "byte": "ByteType",
    "tinyint": "ByteType",
    "double": "DoubleType",
    "float": "FloatType",
    "real": "FloatType",
    "boolean": "BooleanType",
    "binary": "BinaryType",
    "date": "DateType",
    "timestamp": "TimestampType",
    "timestamp_ntz": "TimestampNTZType",
}


def parse_ddl(ddl: str, what: str) -> Any:
    """A DDL schema string as a StructType: Spark's parser when a classic
    session runs (it lives in the JVM), else snapcut's for flat schemas of
    simple types (``"id string, n long, p decimal(10,2)"``), so a processor's
    ``init`` runs without a JVM (:mod:`snapcut.spark.testing`, Spark Connect
    clients)."""
    import re

    from pyspark import SparkContext
    from pyspark.sql import types as T

    if SparkContext._active_spark_context is not None:
        return T._parse_datatype_string(ddl)
    fields = []
    for part in re.split(r",(?![^(]*\))", ddl):
        m = re.fullmatch(r"\s*`?(\w+)`?\s*:?\s*(\w+)\s*(?:\((\d+)\s*,\s*(\d+)\))?\s*", part)
        if m is None:
            raise ConfigError(
                f"{what}: cannot read {ddl!r} without a Spark session; write it as a "
                "StructType, or flat 'name type' pairs of simple types"
            )
        name, type_name, precision, scale = m.groups()
        t = type_name.lower()
        if t == "decimal":
            dtype: Any = T.DecimalType(int(precision or 10), int(scale or 0))
        elif t in _SIMPLE_TYPES:
            dtype = getattr(T, _SIMPLE_TYPES[t])()
        else:
            raise ConfigError(
                f"{what}: type {type_name!r} in {ddl!r} needs Spark's parser; write the schema "
                "as a StructType"
            )
        fields.append(T.StructField(name, dtype, True))
    return T.StructType(fields)


class DeclaringHandle(StatefulProcessorHandle):
    """The handle ``init`` gets on the driver: records the variables (Spark's
    ``DriverStatefulProcessorHandleImpl``); timers cannot be used there."""

    def __init__(self, time_mode: str, parse: Callable[[str], Any] | None = None) -> None:
        self.time_mode = time_mode
        self.parse = parse
        self.variables: dict[str, Variable] = {}
        self.deleted: list[str] = []

    def _declare(self, var: Variable) -> None:
        check_name(var.name)
        if var.name in self.variables:
            raise ConfigError(
                f"state variable {var.name!r} is declared twice in init(): give each "
                "variable its own name"
            )
        if var.ttl_ms is not None:
            if self.time_mode != "processingtime":
                raise ConfigError(
                    f"state variable {var.name!r} has a TTL, which needs "
                    f"timeMode='ProcessingTime' (Spark's rule; this query has timeMode="
                    f"{self.time_mode!r}): drop ttlDurationMs or change the time mode"
                )
            if var.ttl_ms <= 0:
                raise ConfigError(
                    f"state variable {var.name!r}: ttlDurationMs must be positive, got {var.ttl_ms}"
                )
        self.variables[var.name] = var

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        fields = arrow_fields(schema, f"value state {stateName!r}", self.parse)
        self._declare(Variable(stateName, "value", fields, ttl_ms=ttlDurationMs))
        return None

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        fields = arrow_fields(schema, f"list state {stateName!r}", self.parse)
        self._declare(Variable(stateName, "list", fields, ttl_ms=ttlDurationMs))
        return None

    def getMapState(
        self,
        stateName: str,
        userKeySchema: Any,
        valueSchema: Any,
        ttlDurationMs: int | None = None,
    ) -> Any:
        keys = arrow_fields(userKeySchema, f"map state {stateName!r} user key", self.parse)
        values = arrow_fields(valueSchema, f"map state {stateName!r} value", self.parse)
        self._declare(Variable(stateName, "map", values, keys, ttl_ms=ttlDurationMs))
        return None

    def deleteIfExists(self, stateName: str) -> None:
        """The variable's state is purged: no table for it (a root that had one
        drops it on restart, recorded as a migration)."""
        self.deleted.append(stateName)
        self.variables.pop(stateName, None)

    def _no_timers(self) -> ConfigError:
        return ConfigError(
            "timers are registered per grouping key in handleInputRows, "
            "handleExpiredTimer or handleInitialState, not in init()"
        )

    def registerTimer(self, expiryTimestampMs: int) -> None:
        raise self._no_timers()

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        raise self._no_timers()

    def listTimers(self) -> Any:
        raise self._no_timers()


def check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a state variable needs a non-empty string name, got {name!r}")
    if name.startswith("$"):
        raise ConfigError(
            f"state variable name {name!r} starts with '$', which Spark reserves for its "
            "internal state: rename it"
        )


@dataclass(frozen=True)
class Columns:
    """Stored column names of a variable's fields (see the module's naming rule)."""

    user_keys: tuple[str, ...]
    values: tuple[str, ...]


def stored_names(var: Variable, key: Sequence[str]) -> Columns:
    taken = set(key)
    user_keys = []
    for f in var.user_key_fields:
        name = f.name if f.name not in taken and not f.name.startswith("__") else f"key.{f.name}"
        user_keys.append(name)
    taken |= set(user_keys)
    values = []
    for f in var.value_fields:
        name = f.name if f.name not in taken and not f.name.startswith("__") else f"value.{f.name}"
        values.append(name)
    return Columns(tuple(user_keys), tuple(values))


def group_column(grouping_state_key: str) -> str:
    """The group column of a composite-keyed table: the grouping key column
    itself when it keys state natively, else ``__group`` (its encoding)."""
    return GROUP_COLUMN if grouping_state_key == KEY_COLUMN else grouping_state_key


def table_specs(
    variables: Sequence[Variable],
    key_fields: Sequence[pa.Field],
    grouping_state_key: str,
) -> tuple[TableSpec, ...]:
    """The root's tables for these variables (and the timers)."""
    key = [f.name for f in key_fields]
    keys = [f.with_nullable(False) for f in key_fields]
    binary_key = pa.field(KEY_COLUMN, pa.binary(), nullable=False)
    group = group_column(grouping_state_key)
    group_fields = (
        [pa.field(GROUP_COLUMN, pa.binary(), nullable=False)] if group == GROUP_COLUMN else []
    )
    specs = []
    for var in variables:
        names = stored_names(var, key)
        values = [
            stored_field(f.with_name(n))
            for f, n in zip(var.value_fields, names.values, strict=True)
        ]
        ttl = [pa.field(EXPIRES_COLUMN, pa.int64())] if var.ttl_ms is not None else []
        if var.kind == "value":
            head = [binary_key] if grouping_state_key == KEY_COLUMN else []
            schema = pa.schema(head + keys + values + ttl)
            specs.append(
                TableSpec(
                    var.name,
                    "value",
                    grouping_state_key,
                    schema_bytes(schema),
                    None,
                    var.ttl_ms,
                    _names(head + keys),
                )
            )
        elif var.kind == "list":
            seq = [pa.field(SEQ_COLUMN, pa.int64(), nullable=False)]
            schema = pa.schema([binary_key, *group_fields, *keys, *seq, *values, *ttl])
            specs.append(
                TableSpec(
                    var.name,
                    "list",
                    KEY_COLUMN,
                    schema_bytes(schema),
                    group,
                    var.ttl_ms,
                    _names([binary_key, *group_fields, *keys, *seq]),
                )
            )
        else:
            ukeys = [
                stored_field(f.with_name(n).with_nullable(False))
                for f, n in zip(var.user_key_fields, names.user_keys, strict=True)
            ]
            schema = pa.schema([binary_key, *group_fields, *keys, *ukeys, *values, *ttl])
            specs.append(
                TableSpec(
                    var.name,
                    "map",
                    KEY_COLUMN,
                    schema_bytes(schema),
                    group,
                    var.ttl_ms,
                    _names([binary_key, *group_fields, *keys, *ukeys]),
                )
            )
    # The timers table is there in every time mode (empty in None): a
    # processor with no state variables still has a table, and a restart in
    # another time mode keeps its root's tables.
    timer = [pa.field(TIMER_COLUMN, pa.int64(), nullable=False)]
    schema = pa.schema([binary_key, *group_fields, *keys, *timer])
    specs.append(
        TableSpec(
            TIMERS, "timers", KEY_COLUMN, schema_bytes(schema), group, None, tuple(schema.names)
        )
    )
    return tuple(specs)


def _names(fields: Sequence[pa.Field]) -> tuple[str, ...]:
    return tuple(f.name for f in fields)
