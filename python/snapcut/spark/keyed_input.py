"""The DataFrame a ``keyed_state`` step reads, as every level plans from it:
the key and its state key, the input's Arrow schema, the event time and
watermark delay, the session's time zone and confs; and the state-schema
rules the per-key function levels share (fields, timeout column)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError
from snapcut.spark.arguments import arrow_schema, frame_arrow_schema, parse_duration_ms
from snapcut.spark.group_state import TIMEOUT_COLUMN, GroupStateTimeout
from snapcut.spark.keys import KEY_COLUMN, check_key_types, state_key

__all__ = ["KeyedInput"]


@dataclass(frozen=True)
class KeyedInput:
    df: Any
    key: tuple[str, ...]
    state_key: str
    input_schema: pa.Schema
    name: str
    event_time: str | None
    delay_ms: int | None
    timezone: str
    has_initial_state: bool

    @classmethod
    def of(
        cls,
        df: Any,
        key: Sequence[str],
        name: str,
        event_time: str | None,
        watermark: str | int | None,
        has_initial_state: bool,
    ) -> KeyedInput:
        """Checks the key's types and the event time against `df`."""
        keys = tuple(key)
        schema = frame_arrow_schema(df)
        check_key_types(schema, keys)
        if (event_time is None) != (watermark is None):
            raise ConfigError(
                "event_time= and watermark= go together: name the event-time column and the "
                "delay, e.g. event_time='ts', watermark='10 seconds'"
            )
        if event_time is not None and event_time not in schema.names:
            raise ConfigError(
                f"event_time column {event_time!r} is not in the DataFrame "
                f"(columns: {', '.join(schema.names)})"
            )
        tz = df.sparkSession.conf.get("spark.sql.session.timeZone")
        return cls(
            df=df,
            key=keys,
            state_key=state_key(schema, keys),
            input_schema=schema,
            name=name,
            event_time=event_time,
            delay_ms=None if watermark is None else parse_duration_ms(watermark, "watermark"),
            timezone=tz or "UTC",
            has_initial_state=has_initial_state,
        )

    def conf(self, name: str, default: str) -> str:
        """A session conf, `default` where it is unset or empty."""
        return str(self.df.sparkSession.conf.get(name, default) or default)

    def arrow(self, schema: Any, what: str) -> pa.Schema:
        return arrow_schema(self.df.sparkSession, schema, what)

    def timeout(self, timeout: str) -> str:
        """A ``GroupStateTimeout`` checked (an event-time one needs a watermark)."""
        if timeout not in GroupStateTimeout.ALL:
            raise ConfigError(
                f"timeout {timeout!r} is not one of GroupStateTimeout.NoTimeout, "
                "ProcessingTimeTimeout, EventTimeTimeout"
            )
        if timeout == GroupStateTimeout.EventTimeTimeout and self.delay_ms is None:
            raise ConfigError(
                "EventTimeTimeout needs a watermark: pass event_time='ts', watermark='10 "
                "seconds' to keyed_state"
            )
        return timeout

    def state_fields(self, schema: Any, what: str) -> list[pa.Field]:
        """A user's state schema's fields, none named as a key or ``__*``."""
        fields = list(self.arrow(schema, what))
        clash = [f.name for f in fields if f.name in self.key or f.name.startswith("__")]
        if clash:
            raise ConfigError(
                f"{what} field(s) {clash} clash with the key columns {list(self.key)} or use the "
                "reserved '__' prefix: rename them"
            )
        return fields

    def full_state_schema(self, fields: list[pa.Field], timeout: str) -> pa.Schema:
        """The state table's schema: (encoded key,) key columns, the user's
        fields (nullable), and the timeout column if the step has one."""
        key_fields = [self.input_schema.field(k).with_nullable(False) for k in self.key]
        cols: list[pa.Field] = []
        if self.state_key == KEY_COLUMN:
            cols.append(pa.field(KEY_COLUMN, pa.binary(), nullable=False))
        cols += key_fields
        cols += [f.with_nullable(True) for f in fields]
        if timeout != GroupStateTimeout.NoTimeout:
            cols.append(pa.field(TIMEOUT_COLUMN, pa.int64()))
        return pa.schema(cols)
