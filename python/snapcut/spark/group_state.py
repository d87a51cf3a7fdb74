"""``GroupState`` for the ``applyInPandasWithState`` drop-in: PySpark's own class.

The object a level-3 function receives is an instance of
``pyspark.sql.streaming.state.GroupState`` (functions written for Spark check
``isinstance(state, GroupState)``), built the way Spark's JVM builds it for
each call: the stored value, the batch's processing time and watermark, and
no timeout (a timeout holds only if the function sets it again). Every method
is PySpark's, so behaviour and errors are Spark's by construction.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.state import GroupState as _SparkGroupState
from pyspark.sql.streaming.state import GroupStateTimeout as _SparkGroupStateTimeout

from snapcut.spark.state.spec import TIMEOUT_COLUMN

__all__ = ["DEFINED_COLUMN", "TIMEOUT_COLUMN", "GroupState", "GroupStateTimeout"]

DEFINED_COLUMN = "__defined"
"""Level 3 with a timeout: whether the key holds a value (Spark keeps a removed
key whose function set a timeout, without a value, until the timeout fires)."""


class GroupStateTimeout(_SparkGroupStateTimeout):
    """The timeouts of a stateful step (PySpark's names)."""

    ALL: tuple[str, ...] = (
        _SparkGroupStateTimeout.NoTimeout,
        _SparkGroupStateTimeout.ProcessingTimeTimeout,
        _SparkGroupStateTimeout.EventTimeTimeout,
    )


class GroupState(_SparkGroupState):
    """PySpark's ``GroupState`` with snapcut's constructor; no method overridden."""

    @classmethod
    def for_call(
        cls,
        value: tuple[Any, ...] | None,
        batch_processing_time_ms: int,
        watermark_ms: int,
        timeout_conf: str,
        has_timed_out: bool,
        watermark_present: bool,
    ) -> GroupState:
        """The state of one call, as Spark's JVM creates it
        (``GroupStateImpl.createForStreaming``): the timeout starts unset."""
        from pyspark.sql.types import Row, StructType

        return cls(
            optionalValue=Row() if value is None else Row(*value),
            batchProcessingTimeMs=batch_processing_time_ms,
            eventTimeWatermarkMs=watermark_ms if watermark_present else cls.NO_TIMESTAMP,
            timeoutConf=timeout_conf,
            hasTimedOut=has_timed_out,
            watermarkPresent=watermark_present,
            defined=value is not None,
            updated=False,
            removed=False,
            timeoutTimestamp=cls.NO_TIMESTAMP,
            keyAsUnsafe=b"",
            valueSchema=StructType([]),
        )

    # What the call left behind, read by the processor after the function returns.

    @property
    def value_after_call(self) -> tuple[Any, ...] | None:
        return tuple(self._value) if self._defined and self._value is not None else None

    @property
    def was_updated(self) -> bool:
        return bool(self._updated)

    @property
    def was_removed(self) -> bool:
        return bool(self._removed)

    @property
    def timeout_after_call(self) -> int:
        """The timeout the function set (``NO_TIMESTAMP`` if none)."""
        return int(self._timeout_timestamp)
