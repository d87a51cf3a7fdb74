"""Keys of a stateful step: one native key column, or several encoded as one.

A single Int64/Int32/Utf8/Binary key column keys the state table directly.
Anything else (several columns, dates, timestamps, decimals, small ints)
gets a ``__key`` column: snapcut's row encoding of the key columns (the same
bytes in every process), while the key columns stay in the state as plain,
readable columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import ConfigError, encode_keys

KEY_COLUMN = "__key"
NATIVE = (pa.int64(), pa.int32(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary())

__all__ = ["KEY_COLUMN", "check_key_types", "state_key", "with_state_key"]


def check_key_types(schema: pa.Schema, key: Sequence[str]) -> None:
    """Bad key columns are a driver-side error, before any batch runs."""
    for k in key:
        if k not in schema.names:
            raise ConfigError(
                f"key column {k!r} is not in the DataFrame (columns: {', '.join(schema.names)})"
            )
        t = schema.field(k).type
        nested = pa.types.is_nested(t) or pa.types.is_dictionary(t)
        if nested or pa.types.is_floating(t) or pa.types.is_null(t):
            raise ConfigError(
                f"key column {k!r} has type {t}, which cannot key state: use integer, string, "
                "binary, boolean, date, timestamp or decimal columns (cast floats to decimal or "
                "string, and take fields out of structs/arrays first)"
            )


def state_key(schema: pa.Schema, key: Sequence[str]) -> str:
    """The column that keys the state table."""
    if len(key) == 1 and schema.field(key[0]).type in NATIVE:
        return key[0]
    return KEY_COLUMN


def with_state_key(rows: pa.Table, key: Sequence[str], batch_id: int) -> pa.Table:
    """`rows` with its state key column, after refusing null keys."""
    for k in key:
        nulls = rows[k].null_count
        if nulls:
            raise ConfigError(
                f"key column {k!r} holds {nulls} null(s) in batch {batch_id}: state keys must "
                f"be non-null; drop them (df.where(col({k!r}).isNotNull())) or fill them "
                "(df.fillna(...)) before the stateful step"
            )
    if state_key(rows.schema, key) != KEY_COLUMN:
        return rows
    encoded = encode_keys([rows[k].combine_chunks() for k in key])
    return rows.append_column(KEY_COLUMN, encoded)


def distinct(keys: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Distinct keys, sorted (a deterministic order for calls and output)."""
    unique = pc.unique(keys)
    return unique.take(pc.sort_indices(unique))
