"""Level 1 of keyed_state: the built-in aggregates' arguments checked and
their Rust kernel (``KeyedAggregates``) built."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError, KeyedAggregates
from snapcut.spark.keyed_input import KeyedInput
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.processors import AggregateProcessor

__all__ = ["AGG_FUNCS", "plan_aggregate"]

AGG_FUNCS = ("count", "sum", "min", "max", "mean", "first", "last")


def plan_aggregate(
    keyed: KeyedInput, output_mode: str, aggregates: dict[str, Any]
) -> AggregateProcessor:
    """``out=("sum", "col")``, ``n="count"`` (rows) or ``("count", "col")``
    (non-null values) as the processor of an aggregate step."""
    key, state_key, input_schema = keyed.key, keyed.state_key, keyed.input_schema
    output_mode = output_mode.lower() if isinstance(output_mode, str) else output_mode
    if output_mode not in ("update", "complete"):
        raise ConfigError(
            f"aggregate output_mode must be 'update' or 'complete', got {output_mode!r}"
        )
    if not aggregates:
        raise ConfigError("aggregate needs at least one output, e.g. n='count'")
    specs: list[tuple[str, str | None, str]] = []
    for out, spec in aggregates.items():
        func, col = (spec, None) if isinstance(spec, str) else tuple(spec)
        if func not in AGG_FUNCS:
            raise ConfigError(f"aggregate {out}={spec!r}: unknown function; use one of {AGG_FUNCS}")
        if col is None and func != "count":
            raise ConfigError(
                f"aggregate {out}={spec!r}: {func} needs a column, e.g. ({func!r}, 'x')"
            )
        if col is not None and col not in input_schema.names:
            raise ConfigError(
                f"aggregate {out}={spec!r}: column {col!r} is not in the DataFrame "
                f"(columns: {', '.join(input_schema.names)})"
            )
        specs.append((func, col, out))
    if state_key == KEY_COLUMN:
        # The key columns ride along as constant "first" values: readable
        # in the state files and in the output.
        specs = [("first", k, k) for k in key] + specs
        kernel_input = input_schema.append(pa.field(KEY_COLUMN, pa.binary(), nullable=False))
    else:
        kernel_input = input_schema
    kernel = KeyedAggregates(kernel_input, state_key, specs)
    output = pa.schema(
        [kernel.output_schema.field(k) for k in key]
        + [kernel.output_schema.field(out) for out in aggregates]
    )
    processor = AggregateProcessor(
        key=key,
        state_key=state_key,
        state_schema=kernel.state_schema,
        output_schema=output,
        event_time=keyed.event_time,
        specs=specs,
        output_mode=output_mode,
    )
    return processor
