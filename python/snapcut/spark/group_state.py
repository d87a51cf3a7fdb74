"""``GroupState`` with Spark's semantics, for the ``applyInPandasWithState`` drop-in.

The same methods and rules as ``pyspark.sql.streaming.state.GroupState``:
``get``/``getOption`` give a tuple, ``update`` takes one, the timeout is
reset on every call (set it again each time, or there is none), a duration
needs ``ProcessingTimeTimeout`` and a timestamp ``EventTimeTimeout`` and may
not be older than the watermark.
"""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["GroupState", "GroupStateTimeout"]


class GroupStateTimeout:
    """The timeouts of a stateful step (the names Spark uses)."""

    NoTimeout: str = "NoTimeout"
    ProcessingTimeTimeout: str = "ProcessingTimeTimeout"
    EventTimeTimeout: str = "EventTimeTimeout"

    ALL: tuple[str, ...] = (NoTimeout, ProcessingTimeTimeout, EventTimeTimeout)


class GroupState:
    """Per-key state handed to the user function, one per call."""

    NO_TIMESTAMP: int = -1

    def __init__(
        self,
        value: tuple[Any, ...] | None,
        batch_processing_time_ms: int,
        watermark_ms: int,
        timeout_conf: str,
        has_timed_out: bool,
        watermark_present: bool,
        old_timeout_ms: int = -1,
    ) -> None:
        self._value = value
        self._defined = value is not None
        self._updated = False
        self._removed = False
        self._processing_time_ms = batch_processing_time_ms
        self._watermark_ms = watermark_ms
        self._timeout_conf = timeout_conf
        self._has_timed_out = has_timed_out
        self._watermark_present = watermark_present
        self._old_timeout_ms = old_timeout_ms
        self._timeout_ms = GroupState.NO_TIMESTAMP

    @property
    def exists(self) -> bool:
        return self._defined

    @property
    def get(self) -> tuple[Any, ...]:
        if not self._defined or self._value is None:
            raise ValueError("State is either not defined or has already been removed")
        return tuple(self._value)

    @property
    def getOption(self) -> tuple[Any, ...] | None:
        return tuple(self._value) if self._defined and self._value is not None else None

    @property
    def hasTimedOut(self) -> bool:
        return self._has_timed_out

    @property
    def oldTimeoutTimestamp(self) -> int:
        return self._old_timeout_ms

    def update(self, newValue: tuple[Any, ...]) -> None:
        if newValue is None:
            raise TypeError("newValue cannot be None: use remove() to remove the state")
        self._value = tuple(_plain(v) for v in newValue)
        self._defined = True
        self._updated = True
        self._removed = False

    def remove(self) -> None:
        self._defined = False
        self._updated = False
        self._removed = True

    def setTimeoutDuration(self, durationMs: int) -> None:
        if isinstance(durationMs, str):
            raise TypeError(f"durationMs must be an int (milliseconds), got {durationMs!r}")
        if self._timeout_conf != GroupStateTimeout.ProcessingTimeTimeout:
            raise RuntimeError(
                "Cannot set timeout duration without enabling processing time timeout "
                "(timeoutConf=GroupStateTimeout.ProcessingTimeTimeout)"
            )
        if durationMs <= 0:
            raise ValueError(f"timeout duration must be positive, got {durationMs}")
        self._timeout_ms = int(durationMs) + self._processing_time_ms

    def setTimeoutTimestamp(self, timestampMs: int | datetime.datetime) -> None:
        if self._timeout_conf != GroupStateTimeout.EventTimeTimeout:
            raise RuntimeError(
                "Cannot set timeout timestamp without enabling event time timeout "
                "(timeoutConf=GroupStateTimeout.EventTimeTimeout)"
            )
        if isinstance(timestampMs, datetime.datetime):
            ts = timestampMs
            if ts.tzinfo is None:
                ts = ts.astimezone()
            timestampMs = int(ts.timestamp() * 1000)
        if timestampMs <= 0:
            raise ValueError(f"timeout timestamp must be positive, got {timestampMs}")
        if self._watermark_present and timestampMs < self._watermark_ms:
            raise ValueError(
                f"Timeout timestamp ({timestampMs}) cannot be earlier than the current "
                f"watermark ({self._watermark_ms})"
            )
        self._timeout_ms = int(timestampMs)

    def getCurrentWatermarkMs(self) -> int:
        if not self._watermark_present:
            raise RuntimeError(
                "Cannot get event time watermark timestamp without setting a watermark: pass "
                "event_time= and watermark= to keyed_state"
            )
        return self._watermark_ms

    def getCurrentProcessingTimeMs(self) -> int:
        return self._processing_time_ms

    def __str__(self) -> str:
        return f"GroupState({self._value})" if self._defined else "GroupState(<undefined>)"

    __repr__ = __str__


def _plain(v: Any) -> Any:
    """numpy / pandas scalars as Python values (what Arrow builders take)."""
    if hasattr(v, "to_pydatetime"):
        return v.to_pydatetime()
    if hasattr(v, "to_pytimedelta"):
        return v.to_pytimedelta()
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            return v.item()
        except (TypeError, ValueError):
            return v
    return v
