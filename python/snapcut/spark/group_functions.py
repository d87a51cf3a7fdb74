"""Levels 2 and 3 of keyed_state, planned: ``map_batches`` (a vectorised
function per micro-batch and partition) and ``applyInPandasWithState``
(Spark's per-key function with ``GroupState``), each as its processor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from snapcut.spark.arguments import spark_schema
from snapcut.spark.group_processor import PandasGroupProcessor
from snapcut.spark.group_state import DEFINED_COLUMN, TIMEOUT_COLUMN
from snapcut.spark.keyed_input import KeyedInput
from snapcut.spark.processors import BatchFunctionProcessor
from snapcut.spark.state_values import declared_field, stored_field

__all__ = ["ARROW_BATCH_CONF", "plan_apply_in_pandas_with_state", "plan_map_batches"]

ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"


def plan_map_batches(
    keyed: KeyedInput,
    fn: Callable[[Any, Any, Any], Any],
    state_schema: Any,
    output_schema: Any,
    timeout: str,
    pandas: bool,
) -> BatchFunctionProcessor:
    state_fields = keyed.state_fields(state_schema, "state_schema")
    return BatchFunctionProcessor(
        key=keyed.key,
        state_key=keyed.state_key,
        state_schema=keyed.full_state_schema(state_fields, timeout),
        output_schema=keyed.arrow(output_schema, "output_schema"),
        event_time=keyed.event_time,
        timeout=keyed.timeout(timeout),
        timezone=keyed.timezone,
        fn=fn,
        pandas=pandas,
    )


def plan_apply_in_pandas_with_state(
    keyed: KeyedInput,
    func: Callable[[tuple[Any, ...], Iterator[Any], Any], Iterator[Any]],
    output_type: Any,
    state_type: Any,
    timeout_conf: str,
) -> PandasGroupProcessor:
    # A field the Rust table cannot hold natively (decimals, nested types)
    # is kept pickled, as transformWithState's are.
    declared = spark_schema(state_type, "stateStructType").fields
    state_fields = [
        stored_field(declared_field(sf, af))
        for sf, af in zip(declared, keyed.state_fields(state_type, "stateStructType"), strict=True)
    ]
    state_schema = keyed.full_state_schema(state_fields, timeout_conf)
    if TIMEOUT_COLUMN in state_schema.names:
        # Level 3 tells a key holding only a timeout from one holding a value.
        state_schema = state_schema.insert(
            state_schema.get_field_index(TIMEOUT_COLUMN),
            pa.field(DEFINED_COLUMN, pa.bool_(), nullable=False),
        )
    return PandasGroupProcessor(
        key=keyed.key,
        state_key=keyed.state_key,
        state_schema=state_schema,
        output_schema=keyed.arrow(output_type, "outputStructType"),
        event_time=keyed.event_time,
        timeout=keyed.timeout(timeout_conf),
        timezone=keyed.timezone,
        func=func,
        value_columns=tuple(f.name for f in state_fields),
        max_records_per_batch=int(keyed.conf(ARROW_BATCH_CONF, "10000")),
    )
