"""The transformWithState entry: Spark's arguments checked, the processor's
state variables declared by Spark's pre-init (``init()`` on the driver, on a
copy), and the step planned for the facade (``KeyedState._build``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapcut._core import ConfigError
from snapcut.spark.arguments import output_mode
from snapcut.spark.group_functions import ARROW_BATCH_CONF
from snapcut.spark.group_state import GroupStateTimeout
from snapcut.spark.keyed_input import KeyedInput
from snapcut.spark.state.spec import TableSpec
from snapcut.spark.tws.processor import TIME_MODES, TransformWithStateProcessor
from snapcut.spark.tws.variables import DeclaringHandle, table_specs

__all__ = ["TwsStep", "grouped_frame", "plan_transform_with_state"]

ARROW_BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"
INT_TO_DECIMAL_CONF = "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled"
_TIMEOUTS = {
    "none": GroupStateTimeout.NoTimeout,
    "processingtime": GroupStateTimeout.ProcessingTimeTimeout,
    "eventtime": GroupStateTimeout.EventTimeTimeout,
}


@dataclass(frozen=True)
class TwsStep:
    """What the facade builds the step from."""

    processor: TransformWithStateProcessor
    operator: str
    output_mode: str
    tables: tuple[TableSpec, ...]
    timeout: str
    initial: Any
    """The DataFrame of initial rows (``initialState``), or None."""


def plan_transform_with_state(
    keyed: KeyedInput,
    processor: Any,
    output_type: Any,
    mode: str,
    time_mode: str,
    initial_state: Any,
    event_time_column: str,
    *,
    pandas: bool,
) -> TwsStep:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    if not isinstance(processor, StatefulProcessor):
        raise ConfigError(
            "statefulProcessor must be an instance of a subclass of "
            f"pyspark.sql.streaming.StatefulProcessor, got {type(processor).__name__}"
        )
    out_mode = output_mode(mode, "outputMode")
    tm = time_mode.lower() if isinstance(time_mode, str) else None
    if tm not in TIME_MODES:
        raise ConfigError(
            f"timeMode must be 'None', 'ProcessingTime' or 'EventTime' (any case), "
            f"got {time_mode!r}"
        )
    if tm == "eventtime" and keyed.delay_ms is None:
        raise ConfigError(
            "timeMode='EventTime' needs a watermark: pass event_time='ts', "
            "watermark='10 seconds' to keyed_state"
        )
    if event_time_column:
        # Spark: an output column re-declared as event time, carrying the
        # operator's watermark to a downstream stateful operator.
        raise ConfigError(
            f"eventTimeColumnName={event_time_column!r}: chaining a stateful operator on "
            "this step's output event time is not supported by snapcut yet; put "
            "withWatermark(column, delay) on the output instead, or leave it out"
        )
    if initial_state is not None and keyed.has_initial_state:
        raise ConfigError(
            "pass the initial state once: initialState= here or initial_state= to "
            "keyed_state, not both"
        )
    # Spark's pre-init: init() on the driver, on a copy of the processor (as
    # Spark runs it in a worker of its own), with a handle that records the
    # state variables (names, schemas, TTLs); then close().
    from pyspark import cloudpickle

    session = keyed.df.sparkSession
    # Spark's own DDL parser on either session kind (under Connect, the server's).
    declaring = DeclaringHandle(tm, lambda ddl: session.createDataFrame([], ddl).schema)
    pre = cloudpickle.loads(cloudpickle.dumps(processor))  # type: ignore[no-untyped-call]
    pre.init(declaring)
    pre.close()
    key_fields = tuple(keyed.input_schema.field(k) for k in keyed.key)
    tables = table_specs(list(declaring.variables.values()), key_fields, keyed.state_key)
    tws = TransformWithStateProcessor(
        key=keyed.key,
        state_key=keyed.state_key,
        key_fields=key_fields,
        vertex=keyed.name,
        tables=tables,
        variables=dict(declaring.variables),
        output_schema=keyed.arrow(output_type, "outputStructType"),
        stateful_processor=processor,
        time_mode=tm,
        pandas=pandas,
        event_time=keyed.event_time,
        timezone=keyed.timezone,
        max_records_per_batch=int(keyed.conf(ARROW_BATCH_CONF, "10000")),
        max_bytes_per_batch=int(keyed.conf(ARROW_BYTES_CONF, str(2**31 - 1))),
        int_to_decimal=keyed.conf(INT_TO_DECIMAL_CONF, "false").lower() == "true",
    )
    return TwsStep(
        processor=tws,
        operator="transform_with_state_in_pandas" if pandas else "transform_with_state",
        output_mode=out_mode,
        tables=tables,
        timeout=_TIMEOUTS[tm],
        initial=grouped_frame(initial_state, keyed.key),
    )


def grouped_frame(initial: Any, key: tuple[str, ...]) -> Any:
    """The DataFrame behind ``initialState`` (Spark takes ``df.groupBy(key)``;
    a plain DataFrame works too); its key columns must be named as the key."""
    if initial is None:
        return None
    frame = getattr(initial, "_df", initial)
    if not hasattr(frame, "mapInArrow"):
        raise ConfigError(
            "initialState must be a grouped DataFrame (initial_df.groupBy(key)) or a "
            f"DataFrame; got {type(initial).__name__}"
        )
    missing = [k for k in key if k not in frame.columns]
    if missing:
        raise ConfigError(
            f"initialState lacks the key column(s) {missing} (it has {frame.columns}): group it "
            "by columns named as keyed_state's key"
        )
    return frame
