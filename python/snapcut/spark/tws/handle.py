"""The state objects and the handle a transformWithState processor gets:
Spark's own ``ValueState``, ``ListState``, ``MapState`` and
``StatefulProcessorHandle`` (subclasses, so ``isinstance`` holds), each call
working on the batch's read-ahead dicts of :class:`~.state.BatchState`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.streaming.stateful_processor import (
    ListState,
    MapState,
    StatefulProcessorHandle,
    ValueState,
)

from snapcut._core import ConfigError
from snapcut.spark.tws.state import BatchState, Key, QueryInfo, VarState, expired_removed
from snapcut.spark.tws.variables import TIMERS

__all__ = ["SnapcutHandle", "SnapcutListState", "SnapcutMapState", "SnapcutValueState"]


class SnapcutValueState(ValueState):
    """Spark's ``ValueState`` over a snapcut table."""

    def __init__(self, state: BatchState, name: str) -> None:
        self._state = state
        self._stateName = name

    @property
    def _v(self) -> VarState:
        return self._state.var(self._stateName, "value")

    def _cur(self, what: str) -> tuple[Any, ...] | None:
        v = self._state.var(self._stateName, "value", what)
        hit = v.data.get(self._state.key_now(f"value state {self._stateName!r}"))
        if hit is None or not self._state.live(hit[1]):
            return None
        return tuple(hit[0])

    def exists(self) -> bool:
        return self._cur("checking value state exists") is not None

    def get(self) -> tuple[Any, ...] | None:
        return self._cur("getting value state")

    def update(self, newValue: tuple[Any, ...]) -> None:
        v = self._v
        k = self._state.key_now(f"value state {self._stateName!r}")
        vals = self._state.values_of(v, newValue, f"value state {self._stateName!r} update")
        v.data[k] = (vals, self._state.expiry(v))
        v.dirty.add(k)

    def clear(self) -> None:
        v = self._v
        k = self._state.key_now(f"value state {self._stateName!r}")
        v.data.pop(k, None)
        v.dirty.add(k)


class SnapcutListState(ListState):
    """Spark's ``ListState`` over a snapcut table (one row per element)."""

    def __init__(self, state: BatchState, name: str) -> None:
        self._state = state
        self._stateName = name

    @property
    def _v(self) -> VarState:
        return self._state.var(self._stateName, "list")

    def _items(self) -> list[tuple[tuple[Any, ...], Any]]:
        k = self._state.key_now(f"list state {self._stateName!r}")
        return [e for e in self._v.data.get(k) or [] if self._state.live(e[1])]

    def exists(self) -> bool:
        return bool(self._items())

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter([tuple(vals) for vals, _ in self._items()])

    def _set(self, items: list[tuple[tuple[Any, ...], Any]]) -> None:
        v = self._v
        k = self._state.key_now(f"list state {self._stateName!r}")
        if items:
            v.data[k] = items
        else:
            v.data.pop(k, None)
        v.dirty.add(k)

    def _new(self, values: Any, what: str) -> list[tuple[tuple[Any, ...], Any]]:
        if values is None or isinstance(values, tuple):
            raise ConfigError(
                f"list state {self._stateName!r} {what} takes a list of tuples, got {values!r}"
            )
        v = self._v
        exp = self._state.expiry(v)
        return [
            (self._state.values_of(v, x, f"list state {self._stateName!r} {what}"), exp)
            for x in values
        ]

    def put(self, newState: list[tuple[Any, ...]]) -> None:
        self._set(self._new(newState, "put"))

    def appendValue(self, newState: tuple[Any, ...]) -> None:
        v = self._v
        vals = self._state.values_of(v, newState, f"list state {self._stateName!r} appendValue")
        self._set([*self._items(), (vals, self._state.expiry(v))])

    def appendList(self, newState: list[tuple[Any, ...]]) -> None:
        self._set(self._items() + self._new(newState, "appendList"))

    def clear(self) -> None:
        self._set([])


class SnapcutMapState(MapState):
    """Spark's ``MapState`` over a snapcut table (one row per entry)."""

    def __init__(self, state: BatchState, name: str) -> None:
        self._state = state
        self._stateName = name

    @property
    def _v(self) -> VarState:
        return self._state.var(self._stateName, "map")

    def _map(self, write: bool = False) -> dict[tuple[Any, ...], Any]:
        v = self._v
        k = self._state.key_now(f"map state {self._stateName!r}")
        m = v.data.get(k)
        if m is None:
            m = {}
            if write:
                v.data[k] = m
        return m

    def _live(self) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        return {u: tuple(vals) for u, (vals, e) in self._map().items() if self._state.live(e)}

    def exists(self) -> bool:
        return bool(self._live())

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        u = self._state.user_key_of(self._v, key, f"map state {self._stateName!r} getValue")
        hit = self._map().get(u)
        return None if hit is None or not self._state.live(hit[1]) else tuple(hit[0])

    def containsKey(self, key: tuple[Any, ...]) -> bool:
        return self.getValue(key) is not None

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        what = f"map state {self._stateName!r} updateValue"
        v = self._v
        u = self._state.user_key_of(v, key, what)
        vals = self._state.values_of(v, value, what)
        self._map(write=True)[u] = (vals, self._state.expiry(v))
        k = self._state.key_now(what)
        v.dirty.add(k)
        v.removed.get(k, set()).discard(u)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        return iter(list(self._live().items()))

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter(list(self._live()))

    def values(self) -> Iterator[tuple[Any, ...]]:
        return iter(list(self._live().values()))

    def removeKey(self, key: tuple[Any, ...]) -> None:
        what = f"map state {self._stateName!r} removeKey"
        u = self._state.user_key_of(self._v, key, what)
        k = self._state.key_now(what)
        if self._map().pop(u, None) is not None:
            expired_removed(self._v, k).add(u)

    def clear(self) -> None:
        k = self._state.key_now(f"map state {self._stateName!r} clear")
        self._v.data.pop(k, None)
        self._v.cleared.add(k)
        self._v.removed.pop(k, None)
        self._v.dirty.discard(k)


class SnapcutHandle(StatefulProcessorHandle):
    """Spark's ``StatefulProcessorHandle`` over a :class:`BatchState`."""

    def __init__(self, state: BatchState) -> None:
        self._state = state
        self._initialized = False

    def _declaring(self, name: str) -> None:
        if self._initialized:
            raise ConfigError(
                f"state variable {name!r} requested after init(): get every state "
                "variable in init() (Spark's rule)"
            )

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        self._declaring(stateName)
        return SnapcutValueState(self._state, stateName)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        self._declaring(stateName)
        return SnapcutListState(self._state, stateName)

    def getMapState(
        self,
        stateName: str,
        userKeySchema: Any,
        valueSchema: Any,
        ttlDurationMs: int | None = None,
    ) -> Any:
        self._declaring(stateName)
        return SnapcutMapState(self._state, stateName)

    def _timers(self, op: str) -> tuple[VarState, Key]:
        if self._state.time_mode == "none":
            raise ConfigError(
                f"{op} needs timeMode='ProcessingTime' or 'EventTime'; this query has "
                "timeMode='None' (Spark refuses timers there too)"
            )
        return self._state.vars[TIMERS], self._state.key_now(op)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        v, k = self._timers("registerTimer")
        t = int(expiryTimestampMs)
        v.data.setdefault(k, set()).add(t)
        v.dirty.add(k)
        v.removed.get(k, set()).discard(t)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        v, k = self._timers("deleteTimer")
        t = int(expiryTimestampMs)
        timers = v.data.get(k)
        if timers and t in timers:
            timers.discard(t)
            expired_removed(v, k).add(t)

    def listTimers(self) -> Iterator[int]:
        v, k = self._timers("listTimers")
        return iter(sorted(v.data.get(k) or ()))

    def deleteIfExists(self, stateName: str) -> None:
        self._declaring(stateName)
        # The driver left the variable out of the root (its state is gone);
        # here its state objects fail on use, as Spark's do.
        self._state.deleted.add(stateName)

    def getQueryInfo(self) -> QueryInfo:
        return self._state.query_info
