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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError, StateTable, encode_keys
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.state.spec import TableSpec
from snapcut.spark.state_values import StateField
from snapcut.spark.tws.variables import (
    EXPIRES_COLUMN,
    GROUP_COLUMN,
    SEQ_COLUMN,
    TIMER_COLUMN,
    TIMERS,
    Variable,
    stored_names,
)

try:  # PySpark's own normalization of numpy scalars in state values.
    from pyspark.sql.streaming.stateful_processor_api_client import (
        _normalize_state_value as _normalize,
    )
except ImportError:  # pragma: no cover - older PySpark

    def _normalize(v: Any) -> Any:
        return v.tolist() if hasattr(v, "tolist") and not isinstance(v, (list, tuple)) else v


__all__ = ["BatchState", "Key", "QueryInfo", "VarState", "expired_removed"]

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
class VarState:
    """A variable's table and, per loaded grouping key, its current contents."""

    spec: TableSpec
    var: Variable | None
    table: StateTable
    value_columns: tuple[str, ...]
    user_key_columns: tuple[str, ...] = ()
    fields: dict[str, StateField] = field(default_factory=dict)
    """The value and user key columns, each with its Spark type: values are
    read and written as Spark round-trips them."""
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
        self.vars: dict[str, VarState] = {}
        for spec in specs:
            var = variables.get(spec.name)
            names = stored_names(var, self.key) if var is not None else None
            table = tables[vertex_of[spec.name]]
            self.vars[spec.name] = VarState(
                spec,
                var,
                table,
                names.values if names else (),
                names.user_keys if names else (),
                {
                    c: StateField.of(spec.arrow_schema.field(c))
                    for c in (*names.values, *names.user_keys)
                }
                if names
                else {},
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

    def expiry(self, v: VarState) -> int | None:
        return None if v.spec.ttl_ms is None else self.batch_ts_ms + v.spec.ttl_ms

    def live(self, expires: int | None) -> bool:
        """Spark's ``StateTTL.isExpired``: expired once the batch time reaches it."""
        return expires is None or self.batch_ts_ms < expires

    # -- access for the state objects ------------------------------------------

    def var(self, name: str, kind: str, what: str = "") -> VarState:
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

    def values_of(self, v: VarState, value: Any, what: str) -> tuple[Any, ...]:
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
        return _round_trip(v, v.value_columns, value)

    def user_key_of(self, v: VarState, key: Any, what: str) -> tuple[Any, ...]:
        # Spark takes any iterable here (its client does tuple(key)).
        if key is not None and hasattr(key, "__iter__"):
            key = tuple(key)
        if not isinstance(key, tuple) or len(key) != len(v.user_key_columns):
            raise ConfigError(
                f"{what} takes a user key tuple with one value per field of the map's user "
                f"key schema ({list(v.user_key_columns)}), got {key!r}"
            )
        return _round_trip(v, v.user_key_columns, key)

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

    def release(self) -> None:
        """Forgets the keys read so far (after :meth:`write_back`: their
        changes are in the tables, which a later :meth:`load` reads again)."""
        for v in self.vars.values():
            v.data.clear()
        self.loaded.clear()

    def _frame(self, v: VarState, keys: list[Key], extra: dict[str, pa.Array]) -> pa.Table:
        schema = v.table.schema
        arrays = dict(zip(self.key, self._key_arrays(keys), strict=True))
        if KEY_COLUMN in schema.names and KEY_COLUMN not in extra:
            arrays[KEY_COLUMN] = self.state_keys(keys)
        if GROUP_COLUMN in schema.names:
            arrays[GROUP_COLUMN] = self.state_keys(keys)
        arrays.update(extra)
        return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)

    def _columns(
        self, v: VarState, rows: list[tuple[Any, ...]], names: Sequence[str]
    ) -> dict[str, pa.Array]:
        return {name: v.fields[name].to_arrow([r[i] for r in rows]) for i, name in enumerate(names)}

    def _write_value(self, v: VarState) -> None:
        upd = [k for k in v.dirty if k in v.data]
        gone = [k for k in v.dirty if k not in v.data]
        if upd:
            extra = self._columns(v, [v.data[k][0] for k in upd], v.value_columns)
            if v.spec.ttl_ms is not None:
                extra[EXPIRES_COLUMN] = pa.array([v.data[k][1] for k in upd], pa.int64())
            v.table.update(self._frame(v, upd, extra))
        if gone:
            v.table.delete(self.state_keys(gone))

    def _write_list(self, v: VarState) -> None:
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

    def _write_map(self, v: VarState) -> None:
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

    def _write_timers(self, v: VarState) -> None:
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

    def _expire(self, v: VarState) -> None:
        # The table's time index holds the expiries: no read of its rows.
        keys = v.table.due(self.batch_ts_ms)
        if len(keys):
            v.table.delete(keys)

    # -- timers --------------------------------------------------------------

    def expired_timers(self, threshold_ms: int) -> list[tuple[int, Key]]:
        """Every timer at or before `threshold_ms` (Spark's rule), by time then key."""
        v = self.vars.get(TIMERS)
        if v is None:
            return []
        # The due timers' keys from the table's time index, then their rows.
        keys = v.table.due(threshold_ms)
        due: list[tuple[int, Key]] = []
        if len(keys):
            hit = v.table.get(keys)
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


def _read(v: VarState, batch: Any, column: str) -> list[Any]:
    return v.fields[column].from_arrow(batch.column(column))


def _round_trip(v: VarState, columns: Sequence[str], values: tuple[Any, ...]) -> tuple[Any, ...]:
    """`values` as Spark's state store hands them back (what a ``get`` in the
    same batch returns, and how the batch's dicts key map entries)."""
    fields = v.fields
    return tuple(
        # (A plain Python value of a type a round trip keeps is itself: the
        # common case, spared PySpark's numpy normalization.)
        x if type(x) in _PLAIN and fields[c].unchanged else fields[c].round_trip(_normalize(x))
        for c, x in zip(columns, values, strict=True)
    )


_PLAIN = frozenset({int, float, str, bool, type(None)})


def expired_removed(v: VarState, k: Key) -> set[Any]:
    return v.removed.setdefault(k, set())
