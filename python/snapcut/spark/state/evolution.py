"""State schema evolution when a query restarts on its root.

The rules (Spark 4's for transformWithState state, with the Avro encoding),
for every state table of the root — a transformWithState variable, level 3's
``stateStructType`` or level 1's aggregates:

- a value field added: existing keys read it as null (a level-1 count or
  sum, which cannot be null, as 0; level 3's timeout columns, when a
  timeoutConf is added, as "holds a value, no timeout set");
- a value field removed: dropped from what is read;
- a value field's type widened (int8 → int16 → int32 → int64, float32 →
  float64, an integer → float64, decimal to a wider decimal, string/binary to
  their large forms): read values are cast;
- a variable added: a new, empty table; a variable removed: no longer
  written (older checkpoints keep it);
- refused before any batch runs, with the variable, the field and the fix: a
  renamed field (one field gone and another of the same type in its place),
  a narrowed or changed type, a changed key (the grouping key, a map's user
  key), a variable whose kind changed, a timeoutConf removed (keys holding
  only a pending timeout could not be carried over) and an added column that
  can be neither null nor 0.

Stored files keep the schema they were written with; readers conform each
file to the root's current schema (:func:`conform_file`). The root's
description records every migration with the first batch it applies to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import ConfigError
from snapcut.spark.group_state import DEFINED_COLUMN

__all__ = ["Migration", "conform_file", "plan_table", "widens"]

DELETED = "__deleted"

_INT_ORDER = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every `old` value is exactly a `new` value (a widening)."""
    if old == new:
        return True
    if old in _INT_ORDER and new in _INT_ORDER:
        return _INT_ORDER.index(old) <= _INT_ORDER.index(new)
    if old in _INT_ORDER[:3] and new == pa.float64():
        return True
    if old == pa.float32() and new == pa.float64():
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(
            new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
        )
    return (old, new) in ((pa.string(), pa.large_string()), (pa.binary(), pa.large_binary()))


@dataclass
class Migration:
    """What changed in one table."""

    table: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    widened: list[dict[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.widened)

    def describe(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "added": self.added,
            "removed": self.removed,
            "widened": self.widened,
        }


def plan_table(
    table: str, old: pa.Schema, new: pa.Schema, key_columns: set[str], root: str
) -> Migration:
    """The migration of one table from `old` to `new`, or ConfigError."""
    fix_new_root = "start the query on a new root and checkpointLocation"
    for name in sorted(key_columns):
        in_old, in_new = name in old.names, name in new.names
        if in_old != in_new or (in_old and old.field(name).type != new.field(name).type):
            before = old.field(name).type if in_old else "absent"
            after = new.field(name).type if in_new else "absent"
            raise ConfigError(
                f"state root {root}: {table!r} key column {name!r} changed ({before} -> "
                f"{after}); a state key cannot change: keep the key, or {fix_new_root}"
            )
    m = Migration(table)
    old_values = [f for f in old if f.name not in key_columns]
    new_values = [f for f in new if f.name not in key_columns]
    old_names = {f.name for f in old_values}
    new_names = {f.name for f in new_values}
    m.added = [f.name for f in new_values if f.name not in old_names]
    m.removed = [f.name for f in old_values if f.name not in new_names]
    if DEFINED_COLUMN in m.removed:
        raise ConfigError(
            f"state root {root}: {table!r} had a timeoutConf and this query asks NoTimeout: "
            "keys that hold only a pending timeout (their state removed) cannot be carried "
            f"over; keep the timeoutConf, or {fix_new_root}"
        )
    for f in new_values:
        if f.name in m.added and not f.nullable:
            try:
                _fill(f)  # refused here, before any batch runs
            except ConfigError as e:
                raise ConfigError(f"state root {root}: {table!r}: {e}") from None
    for i, f in enumerate(old_values):
        if f.name in m.removed and i < len(new_values):
            g = new_values[i]
            if g.name in m.added and g.type == f.type:
                raise ConfigError(
                    f"state root {root}: {table!r} field {f.name!r} looks renamed to "
                    f"{g.name!r} (same place, same type {f.type}); renaming a state field is "
                    "not supported: keep the name, or remove the field in one restart and add "
                    f"the new one in the next (its values start null), or {fix_new_root}"
                )
    for f in old_values:
        if f.name in new_names:
            g = new.field(f.name)
            if f.nullable != g.nullable:
                raise ConfigError(
                    f"state root {root}: {table!r} field {f.name!r} changed from "
                    f"{_nullability(f)} to {_nullability(g)}: it holds other values now (for "
                    "level 1, another aggregate under the same name); keep it, give the new "
                    f"one another name, or {fix_new_root}"
                )
            if f.type != g.type:
                if not widens(f.type, g.type):
                    raise ConfigError(
                        f"state root {root}: {table!r} field {f.name!r} changed type "
                        f"{f.type} -> {g.type}, which is not a widening (stored values may not "
                        f"fit): keep {f.type} or a wider type, or {fix_new_root}"
                    )
                m.widened.append({"field": f.name, "from": str(f.type), "to": str(g.type)})
    return m


def _nullability(f: pa.Field) -> str:
    return f"{f.type}" if f.nullable else f"{f.type} not null"


def _fill(f: pa.Field) -> Any:
    """What stored rows read for an added column that cannot be null."""
    if f.name == DEFINED_COLUMN:
        return True  # level 3 gained a timeout: every stored key holds a value
    if pa.types.is_integer(f.type) or pa.types.is_floating(f.type):
        return 0  # a level-1 count or sum that has seen nothing
    raise ConfigError(
        f"state column {f.name!r} ({f.type}, not nullable) was added and has no value for "
        "the stored keys: make it nullable, or start the query on a new root"
    )


def conform_file(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A stored state file as the table's current `schema` (the same object
    when it already is): added columns null, or :func:`_fill` where the
    column cannot be null; removed ones dropped, widened ones cast; a diff
    keeps ``__deleted``."""
    have = {f.name: f.type for f in table.schema if f.name != DELETED}
    if have == {f.name: f.type for f in schema}:
        return table
    fields = list(schema)
    if DELETED in table.column_names:
        fields.append(pa.field(DELETED, pa.bool_()))
    columns = []
    for f in fields:
        if f.name in table.column_names:
            col = table[f.name]
            columns.append(col if col.type == f.type else pc.cast(col, f.type))
        elif f.nullable:
            columns.append(pa.nulls(table.num_rows, f.type))
        else:
            columns.append(pa.repeat(pa.scalar(_fill(f), f.type), table.num_rows))
    # Tombstones of a diff hold nulls in value columns: every column nullable here.
    out_schema = pa.schema([f.with_nullable(True) for f in fields], metadata=table.schema.metadata)
    return pa.Table.from_arrays(columns, schema=out_schema)
