"""One partition's transformWithState state for one micro-batch.

The state objects a processor gets are Spark's own ``ValueState``,
``ListState`` and ``MapState`` (subclasses, so ``isinstance`` holds) and the
handle is a ``StatefulProcessorHandle``; behind them the grouping keys of the
batch are read ahead from the Rust tables in one lookup per variable
(:meth:`BatchState.load`), every call works on Python dicts, and
:meth:`BatchState.write_back` hands the changes to the tables in one upsert
and one delete per variable. TTL is Spark's: an update expires at the batch's
processing time plus the TTL; a value whose expiry is at or before the
batch's processing time reads as absent, and is removed after the batch.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import (
    ListState,
    MapState,
    StatefulProcessorHandle,
    ValueState,
)

from snapcut._core import ConfigError, StateTable, encode_keys
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.root import TableSpec
from snapcut.spark.tws.variables import (
    EXPIRES_COLUMN,
    GROUP_COLUMN,
    SEQ_COLUMN,
    TIMER_COLUMN,
    TIMERS,
    Variable,
    pickled_columns,
    stored_names,
)

try:  # PySpark's own normalization of numpy scalars in state values.
    from pyspark.sql.streaming.stateful_processor_api_client import (
        _normalize_state_value as _normalize,
    )
except ImportError:  # pragma: no cover - older PySpark

    def _normalize(v: Any) -> Any:
        return v.tolist() if hasattr(v, "tolist") and not isinstance(v, (list, tuple)) else v


__all__ = ["BatchState", "QueryInfo", "SnapcutHandle"]

Key = tuple[Any, ...]


@dataclass(frozen=True)
class QueryInfo:
    """What ``getQueryInfo`` tells (Spark's ``QueryInfo``)."""

    queryId: str
    runId: str | None
    batchId: int
    partitionId: int

    def getQueryId(self) -> str:
        return self.queryId

    def getRunId(self) -> str:
        if self.runId is None:
            raise ConfigError(
                "the query's run id does not reach snapcut's tasks here (Spark Connect, or a "
                "batch DataFrame): use getQueryId(), which survives restarts"
            )
        return self.runId

    def getBatchId(self) -> int:
        return self.batchId

    def getPartitionId(self) -> int:
        return self.partitionId


@dataclass
class _Var:
    """A variable's table and, per loaded grouping key, its current contents."""

    spec: TableSpec
    var: Variable | None
    table: StateTable
    value_columns: tuple[str, ...]
    user_key_columns: tuple[str, ...] = ()
    pickled: dict[str, Any] = field(default_factory=dict)
    """Columns stored as pickles (:data:`variables.PICKLED`) → Spark type."""
    # value: key -> (values, expires) ; list: key -> [(values, expires)] ;
    # map: key -> {user key: (values, expires)} ; timers: key -> set of ms
    data: dict[Key, Any] = field(default_factory=dict)
    dirty: set[Key] = field(default_factory=set)
    # map: keys cleared whole in this batch (their old entries go first)
    cleared: set[Key] = field(default_factory=set)
    # map / timers: sub-keys removed per key
    removed: dict[Key, set[Any]] = field(default_factory=dict)


class BatchState:
    """The state of one (micro-batch, partition) of a transformWithState step."""

    def __init__(
        self,
        tables: dict[str, StateTable],
        specs: Sequence[TableSpec],
        vertex_of: dict[str, str],
        variables: dict[str, Variable],
        key_fields: Sequence[pa.Field],
        grouping_state_key: str,
        batch_ts_ms: int,
        time_mode: str,
        query_info: QueryInfo,
    ) -> None:
        self.key_fields = list(key_fields)
        self.key = [f.name for f in key_fields]
        self.grouping_state_key = grouping_state_key
        self.batch_ts_ms = batch_ts_ms
        self.time_mode = time_mode
        self.query_info = query_info
        self.vars: dict[str, _Var] = {}
        for spec in specs:
            var = variables.get(spec.name)
            names = stored_names(var, self.key) if var is not None else None
            table = tables[vertex_of[spec.name]]
            self.vars[spec.name] = _Var(
                spec,
                var,
                table,
                names.values if names else (),
                names.user_keys if names else (),
                pickled_columns(spec.arrow_schema),
            )
        self.loaded: set[Key] = set()
        self.current: Key | None = None
        self.deleted: set[str] = set()

    # -- keys ----------------------------------------------------------------

    def _key_arrays(self, keys: Sequence[Key]) -> list[pa.Array]:
        return [pa.array([k[i] for k in keys], f.type) for i, f in enumerate(self.key_fields)]

    def state_keys(self, keys: Sequence[Key]) -> pa.Array:
        """The grouping state key of each key tuple (the column, or its encoding)."""
        arrays = self._key_arrays(keys)
        if self.grouping_state_key == KEY_COLUMN:
            return encode_keys(arrays)
        return arrays[0]

    def _composite(self, keys: Sequence[Key], parts: list[pa.Array]) -> pa.Array:
        return encode_keys(self._key_arrays(keys) + parts)

    # -- reading ahead ---------------------------------------------------------

    def load(self, keys: Sequence[Key]) -> None:
        """Reads every variable of the keys not read yet, in one lookup each."""
        todo = [k for k in dict.fromkeys(keys) if k not in self.loaded]
        if not todo:
            return
        self.loaded.update(todo)
        sk = self.state_keys(todo)
        for v in self.vars.values():
            kind = v.spec.kind
            if kind == "value":
                batch, present = v.table.lookup(sk)
                mask = present.to_pylist()
                cols = [_read(v, batch, c) for c in v.value_columns]
                exp = (
                    batch.column(EXPIRES_COLUMN).to_pylist() if v.spec.ttl_ms is not None else None
                )
                for i, k in enumerate(todo):
                    if mask[i]:
                        v.data[k] = (tuple(c[i] for c in cols), exp[i] if exp else None)
                continue
            rows, which = v.table.lookup_groups(sk)
            pos = which.to_pylist()
            exp = rows.column(EXPIRES_COLUMN).to_pylist() if v.spec.ttl_ms is not None else None
            if kind == "timers":
                for k in todo:
                    v.data[k] = set()
                for i, t in enumerate(rows.column(TIMER_COLUMN).to_pylist()):
                    v.data[todo[pos[i]]].add(t)
                continue
            cols = [_read(v, rows, c) for c in v.value_columns]
            if kind == "list":
                seqs = rows.column(SEQ_COLUMN).to_pylist()
                lists: dict[Key, list[tuple[int, tuple[Any, ...], Any]]] = {}
                for i in range(rows.num_rows):
                    lists.setdefault(todo[pos[i]], []).append(
                        (seqs[i], tuple(c[i] for c in cols), exp[i] if exp else None)
                    )
                for k, items in lists.items():
                    items.sort(key=lambda e: e[0])
                    v.data[k] = [(vals, e) for _, vals, e in items]
            else:
                ucols = [_read(v, rows, c) for c in v.user_key_columns]
                for i in range(rows.num_rows):
                    v.data.setdefault(todo[pos[i]], {})[tuple(c[i] for c in ucols)] = (
                        tuple(c[i] for c in cols),
                        exp[i] if exp else None,
                    )

    # -- TTL -------------------------------------------------------------------

    def expiry(self, v: _Var) -> int | None:
        return None if v.spec.ttl_ms is None else self.batch_ts_ms + v.spec.ttl_ms

    def live(self, expires: int | None) -> bool:
        """Spark's ``StateTTL.isExpired``: expired once the batch time reaches it."""
        return expires is None or self.batch_ts_ms < expires

    # -- access for the state objects ------------------------------------------

    def var(self, name: str, kind: str, what: str = "") -> _Var:
        if name in self.deleted:
            # As Spark's state clients fail once the column family is gone.
            from pyspark.errors import PySparkRuntimeError

            raise PySparkRuntimeError(
                f"Error {what or 'using ' + kind + ' state'}: state variable {name!r} was "
                "removed by deleteIfExists in init()"
            )
        v = self.vars.get(name)
        if v is None or v.spec.kind != kind:
            raise ConfigError(
                f"{kind} state {name!r} was not declared by init() when the query started "
                f"(declared: {', '.join(n for n in self.vars if n != TIMERS)}): declare every "
                "state variable in init()"
            )
        return v

    def key_now(self, what: str) -> Key:
        if self.current is None:
            raise ConfigError(
                f"{what} needs a grouping key: use state in handleInputRows, "
                "handleExpiredTimer or handleInitialState, not in init() or close()"
            )
        return self.current

    def values_of(self, v: _Var, value: Any, what: str) -> tuple[Any, ...]:
        # Spark takes any iterable here (its client does tuple(value)).
        if value is None or not hasattr(value, "__iter__"):
            raise ConfigError(
                f"{what} takes a tuple with one value per field of its schema "
                f"({list(v.value_columns)}), got {value!r}"
            )
        value = tuple(value)
        if len(value) != len(v.value_columns):
            raise ConfigError(
                f"{what} got {len(value)} value(s) {tuple(value)!r}; its schema has "
                f"{len(v.value_columns)} field(s) {list(v.value_columns)}: pass one value "
                "per field"
            )
        return tuple(_normalize(x) for x in value)

    def user_key_of(self, v: _Var, key: Any, what: str) -> tuple[Any, ...]:
        # Spark takes any iterable here (its client does tuple(key)).
        if key is not None and hasattr(key, "__iter__"):
            key = tuple(key)
        if not isinstance(key, tuple) or len(key) != len(v.user_key_columns):
            raise ConfigError(
                f"{what} takes a user key tuple with one value per field of the map's user "
                f"key schema ({list(v.user_key_columns)}), got {key!r}"
            )
        return tuple(_normalize(x) for x in key)

    # -- writing back ------------------------------------------------------------

    def write_back(self) -> None:
        """Hands every change of the batch to the tables, then removes what
        the TTL expired."""
        for v in self.vars.values():
            if v.dirty or v.removed or v.cleared:
                getattr(self, f"_write_{v.spec.kind}")(v)
            v.dirty.clear()
            v.removed.clear()
            v.cleared.clear()
        for v in self.vars.values():
            if v.spec.ttl_ms is not None:
                self._expire(v)

    def _frame(self, v: _Var, keys: list[Key], extra: dict[str, pa.Array]) -> pa.Table:
        schema = v.table.schema
        arrays = dict(zip(self.key, self._key_arrays(keys), strict=True))
        if KEY_COLUMN in schema.names and KEY_COLUMN not in extra:
            arrays[KEY_COLUMN] = self.state_keys(keys)
        if GROUP_COLUMN in schema.names:
            arrays[GROUP_COLUMN] = self.state_keys(keys)
        arrays.update(extra)
        return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)

    def _columns(
        self, v: _Var, rows: list[tuple[Any, ...]], names: Sequence[str]
    ) -> dict[str, pa.Array]:
        schema = v.table.schema
        out = {}
        for i, name in enumerate(names):
            values = [r[i] for r in rows]
            if name in v.pickled:
                t = v.pickled[name]
                values = [
                    None if x is None else pickle.dumps(t.toInternal(x), protocol=5) for x in values
                ]
            try:
                out[name] = pa.array(values, schema.field(name).type)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise ConfigError(
                    f"state {v.spec.name!r}: a value for field {name!r} does not fit its type "
                    f"{schema.field(name).type}: {e}"
                ) from e
        return out

    def _write_value(self, v: _Var) -> None:
        upd = [k for k in v.dirty if k in v.data]
        gone = [k for k in v.dirty if k not in v.data]
        if upd:
            extra = self._columns(v, [v.data[k][0] for k in upd], v.value_columns)
            if v.spec.ttl_ms is not None:
                extra[EXPIRES_COLUMN] = pa.array([v.data[k][1] for k in upd], pa.int64())
            v.table.update(self._frame(v, upd, extra))
        if gone:
            v.table.delete(self.state_keys(gone))

    def _write_list(self, v: _Var) -> None:
        keys = list(v.dirty)
        v.table.delete_groups(self.state_keys(keys))
        owners: list[Key] = []
        items: list[tuple[Any, ...]] = []
        seqs: list[int] = []
        exps: list[Any] = []
        for k in keys:
            for i, (vals, e) in enumerate(v.data.get(k) or []):
                owners.append(k)
                items.append(vals)
                seqs.append(i)
                exps.append(e)
        if not owners:
            return
        seq = pa.array(seqs, pa.int64())
        extra = self._columns(v, items, v.value_columns)
        extra[SEQ_COLUMN] = seq
        extra[KEY_COLUMN] = self._composite(owners, [seq])
        if v.spec.ttl_ms is not None:
            extra[EXPIRES_COLUMN] = pa.array(exps, pa.int64())
        v.table.update(self._frame(v, owners, extra))

    def _write_map(self, v: _Var) -> None:
        if v.cleared:
            v.table.delete_groups(self.state_keys(list(v.cleared)))
        owners: list[Key] = []
        ukeys: list[tuple[Any, ...]] = []
        for k, subs in v.removed.items():
            for u in subs:
                owners.append(k)
                ukeys.append(u)
        if owners:
            parts = list(self._columns(v, ukeys, v.user_key_columns).values())
            v.table.delete(self._composite(owners, parts))
        owners, ukeys, vals, exps = [], [], [], []
        for k in v.dirty:
            for u, (val, e) in (v.data.get(k) or {}).items():
                owners.append(k)
                ukeys.append(u)
                vals.append(val)
                exps.append(e)
        if not owners:
            return
        ucols = self._columns(v, ukeys, v.user_key_columns)
        extra = {**ucols, **self._columns(v, vals, v.value_columns)}
        extra[KEY_COLUMN] = self._composite(owners, list(ucols.values()))
        if v.spec.ttl_ms is not None:
            extra[EXPIRES_COLUMN] = pa.array(exps, pa.int64())
        v.table.update(self._frame(v, owners, extra))

    def _write_timers(self, v: _Var) -> None:
        owners: list[Key] = []
        times: list[int] = []
        for k, subs in v.removed.items():
            owners += [k] * len(subs)
            times += sorted(subs)
        if owners:
            v.table.delete(self._composite(owners, [pa.array(times, pa.int64())]))
        owners, times = [], []
        for k in v.dirty:
            ts = sorted(v.data.get(k) or ())
            owners += [k] * len(ts)
            times += ts
        if owners:
            t = pa.array(times, pa.int64())
            extra = {TIMER_COLUMN: t, KEY_COLUMN: self._composite(owners, [t])}
            v.table.update(self._frame(v, owners, extra))

    def _expire(self, v: _Var) -> None:
        rows = v.table.to_arrow()
        if rows.num_rows == 0:
            return
        dead = pc.fill_null(pc.less_equal(rows[EXPIRES_COLUMN], self.batch_ts_ms), False)
        keys = rows[v.spec.state_key].filter(dead)
        if len(keys):
            v.table.delete(keys)

    # -- timers --------------------------------------------------------------

    def expired_timers(self, threshold_ms: int) -> list[tuple[int, Key]]:
        """Every timer at or before `threshold_ms` (Spark's rule), by time then key."""
        v = self.vars.get(TIMERS)
        if v is None:
            return []
        rows = v.table.to_arrow()
        due: list[tuple[int, Key]] = []
        if rows.num_rows:
            hit = rows.filter(pc.less_equal(rows[TIMER_COLUMN], threshold_ms))
            times = hit[TIMER_COLUMN].to_pylist()
            cols = [hit[k].to_pylist() for k in self.key]
            due = [(t, tuple(c[i] for c in cols)) for i, t in enumerate(times)]
        # Timers registered in this batch and not written back yet.
        for k in v.dirty:
            for t in v.data.get(k) or ():
                if t <= threshold_ms:
                    due.append((t, k))
        removed = {(t, k) for k, ts in v.removed.items() for t in ts}
        return sorted({d for d in due if d not in removed}, key=lambda d: (d[0], repr(d[1])))


def _read(v: _Var, batch: Any, column: str) -> list[Any]:
    values: list[Any] = batch.column(column).to_pylist()
    if column in v.pickled:
        t = v.pickled[column]
        return [None if x is None else t.fromInternal(pickle.loads(x)) for x in values]
    return values


def _expired_removed(v: _Var, k: Key) -> set[Any]:
    return v.removed.setdefault(k, set())


class SnapcutValueState(ValueState):
    """Spark's ``ValueState`` over a snapcut table."""

    def __init__(self, state: BatchState, name: str) -> None:
        self._state = state
        self._stateName = name

    @property
    def _v(self) -> _Var:
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
    def _v(self) -> _Var:
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
    def _v(self) -> _Var:
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
            _expired_removed(self._v, k).add(u)

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

    def _timers(self, op: str) -> tuple[_Var, Key]:
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
            _expired_removed(v, k).add(t)

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
