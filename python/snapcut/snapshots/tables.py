"""Tables out of a snapshot root: diff two checkpoints, export one.

The Python API behind ``snapcut snapshots diff|export`` (re-exported by
:mod:`snapcut.snapshots`). States are rebuilt by the existing reader
(nearest full + diffs); this module only compares and writes them.

    >>> for d in snapcut.snapshots.diff_checkpoints("/tmp/ckpt", 3, 5):
    ...     print(d.label, d.added.num_rows, d.removed.num_rows, d.changed_keys)
    >>> snapcut.snapshots.export_checkpoint("/tmp/ckpt", "/tmp/out", format="parquet")
    # /tmp/out/<vertex>/part-00000.parquet, one file per subtask:
    # duckdb: SELECT * FROM '/tmp/out/agg/*.parquet'; spark.read.parquet("/tmp/out/agg")
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from snapcut import _fs
from snapcut._core import SnapshotError
from snapcut._core import format as fmt
from snapcut.snapshots.backend import FsBackend
from snapcut.snapshots.layout import KEY_METADATA, file_component, read_ipc
from snapcut.snapshots.ops import Progress, Root, open_root, resolve_id

Task = tuple[str, int]

FORMATS = ("parquet", "arrow", "csv")
EXPORT_MANIFEST = "_snapcut_export.json"
"""Marks a directory as an export ("complete" once every file is written);
its leading `_` hides it from Spark's reader."""
__all__ = [
    "EXPORT_MANIFEST",
    "FORMATS",
    "ExportResult",
    "ExportedTable",
    "TaskDiff",
    "diff_checkpoints",
    "export_checkpoint",
    "select_tasks",
    "write_diff",
]


def _state_tasks(backend: FsBackend, checkpoint_id: int) -> dict[Task, dict[str, Any]]:
    raw = backend.manifest_bytes(checkpoint_id)
    return {(v, s): e for v, s, e in fmt.state_files(raw, checkpoint_id)}


def select_tasks(tasks: Sequence[Task], spec: str | None) -> list[Task]:
    """The tasks `spec` names: ``vertex-subtask`` (one task) or a vertex (all
    its subtasks); every task when `spec` is None."""
    tasks = sorted(tasks)
    if spec is None:
        return tasks
    exact = [t for t in tasks if f"{t[0]}-{t[1]}" == spec]
    chosen = exact or [t for t in tasks if t[0] == spec]
    if not chosen:
        known = ", ".join(f"{v}-{s}" for v, s in tasks) or "none"
        raise SnapshotError(f"no task with state matches {spec!r}; tasks with state: {known}")
    return chosen


# --- diff ---


@dataclass(frozen=True)
class TaskDiff:
    """How one task's full state changed from checkpoint `a` to checkpoint `b`.

    added: rows of `b` whose key `a` lacks; removed: rows of `a` whose key
    `b` lacks; changed: key columns, then ``before_<col>`` and
    ``after_<col>`` for the keys in both whose values differ. A state
    without a key column is compared as a multiset of whole rows (added and
    removed only).
    """

    vertex: str
    subtask: int
    a: int
    b: int
    key: list[str]
    rows_a: int
    rows_b: int
    added: pa.Table
    removed: pa.Table
    changed: pa.Table

    @property
    def label(self) -> str:
        return f"{self.vertex}-{self.subtask}"

    @property
    def unchanged(self) -> int:
        return int(self.rows_b - self.added.num_rows - self.changed.num_rows)

    def counts(self) -> dict[str, int]:
        return {
            "rows_a": self.rows_a,
            "rows_b": self.rows_b,
            "added": self.added.num_rows,
            "removed": self.removed.num_rows,
            "changed": self.changed.num_rows,
            "unchanged": self.unchanged,
        }

    def to_arrow(self) -> pa.Table:
        """One table: a ``change`` column ("added", "removed", "changed"),
        the key columns, then ``before_<col>`` and ``after_<col>``."""
        schema = pa.schema([pa.field("change", pa.string()), *self.changed.schema])

        def widen(t: pa.Table, change: str, side: str) -> pa.Table:
            n = t.num_rows
            cols: list[Any] = [pa.array([change] * n, pa.string())]
            for f in self.changed.schema:
                name = f.name.removeprefix(f"{side}_")
                if f.name in self.key:
                    cols.append(t[f.name])
                elif name != f.name and name in t.column_names:
                    cols.append(t[name].cast(f.type))
                else:
                    cols.append(pa.nulls(n, f.type))
            return pa.Table.from_arrays(cols, schema=schema)

        changed = self.changed.add_column(0, "change", pa.array(["changed"] * len(self.changed)))
        return pa.concat_tables(
            [
                widen(self.added, "added", "after"),
                widen(self.removed, "removed", "before"),
                changed.cast(schema),
            ]
        )

    def sample(self, n: int = 5) -> dict[str, list[dict[str, Any]]]:
        """Up to `n` rows of each change, smallest keys first, as Python values."""

        def first(t: pa.Table) -> list[dict[str, Any]]:
            if self.key and t.num_rows:
                t = t.sort_by([(k, "ascending") for k in self.key])
            rows: list[dict[str, Any]] = t.slice(0, n).to_pylist()
            return rows

        return {
            "added": first(self.added),
            "removed": first(self.removed),
            "changed": first(self.changed),
        }

    def to_dict(self, sample: int = 5) -> dict[str, Any]:
        return {
            "vertex": self.vertex,
            "subtask": self.subtask,
            "a": self.a,
            "b": self.b,
            "key": self.key,
            **self.counts(),
            "sample": self.sample(sample),
        }


def _differs(x: pa.ChunkedArray, y: pa.ChunkedArray) -> pa.Array:
    """Per row: do `x` and `y` differ? (two nulls are equal)."""
    try:
        ne = pc.fill_null(pc.not_equal(x, y), True)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        return pc.and_(ne, pc.invert(both_null))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        # Nested or mismatched types: compare as Python values.
        return pa.array(
            [p != q for p, q in zip(x.to_pylist(), y.to_pylist(), strict=True)], pa.bool_()
        )


def _key_of(tables: Sequence[pa.Table | None], entries: Sequence[dict[str, Any] | None]) -> str:
    for t in tables:
        if t is not None:
            key = str((t.schema.metadata or {}).get(KEY_METADATA.encode(), b"").decode())
            if key and key in t.column_names:
                return key
    for e in entries:
        if e is not None and e.get("key"):
            return str(e["key"])
    return ""


def _chunked(x: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    return x if isinstance(x, pa.ChunkedArray) else pa.chunked_array([x])


def _type(a: pa.Table, b: pa.Table, column: str) -> pa.DataType:
    return (a if column in a.column_names else b).schema.field(column).type


def _diff_keyed(a: pa.Table, b: pa.Table, key: str) -> tuple[pa.Table, pa.Table, pa.Table]:
    keys_a = a[key].combine_chunks()
    keys_b = b[key].combine_chunks()
    in_a = pc.is_in(keys_b, value_set=keys_a)
    added = b.filter(pc.invert(in_a))
    removed = a.filter(pc.invert(pc.is_in(keys_a, value_set=keys_b)))
    after = b.filter(in_a)
    before = a.take(pc.index_in(after[key], value_set=keys_a))
    n = after.num_rows
    values = [c for c in dict.fromkeys([*a.column_names, *b.column_names]) if c != key]
    mask = _chunked(pa.array([False] * n, pa.bool_()))
    cols: dict[str, pa.ChunkedArray] = {key: _chunked(after[key])}
    for c in values:
        x = _chunked(before[c] if c in a.column_names else pa.nulls(n, _type(a, b, c)))
        y = _chunked(after[c] if c in b.column_names else pa.nulls(n, _type(b, a, c)))
        mask = pc.or_(mask, _differs(x, y))
        cols[f"before_{c}"], cols[f"after_{c}"] = x, y
    changed = pa.table(cols).filter(mask)
    return added, removed, changed


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def _diff_rows(a: pa.Table, b: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Multiset difference of whole rows (a state with no key column)."""

    def rows(t: pa.Table) -> list[Any]:
        return [_hashable(tuple(r.values())) for r in t.to_pylist()]

    left = Counter(rows(a))
    added_idx = []
    for i, r in enumerate(rows(b)):
        if left[r] > 0:
            left[r] -= 1
        else:
            added_idx.append(i)
    removed_idx = []
    for i, r in enumerate(rows(a)):
        if left[r] > 0:
            left[r] -= 1
            removed_idx.append(i)
    values = dict.fromkeys([*a.column_names, *b.column_names])
    changed = pa.table(
        {
            f"{side}_{c}": pa.array([], _type(x, y, c))
            for c in values
            for side, x, y in (("before", a, b), ("after", b, a))
        }
    )
    return (
        b.take(pa.array(added_idx, pa.int64())),
        a.take(pa.array(removed_idx, pa.int64())),
        changed,
    )


def _diff_task(
    backend: FsBackend,
    a: tuple[int, dict[Task, dict[str, Any]]],
    b: tuple[int, dict[Task, dict[str, Any]]],
    task: Task,
) -> TaskDiff:
    (ida, sa), (idb, sb) = a, b
    ea, eb = sa.get(task), sb.get(task)
    ta = backend.state(ida, task) if ea is not None else None
    tb = backend.state(idb, task) if eb is not None else None
    key = _key_of([tb, ta], [eb, ea])
    present = tb if tb is not None else ta
    assert present is not None
    ta = ta if ta is not None else present.schema.empty_table()
    tb = tb if tb is not None else present.schema.empty_table()
    if key:
        added, removed, changed = _diff_keyed(ta, tb, key)
        keys = [key]
    else:
        added, removed, changed = _diff_rows(ta, tb)
        keys = []
    return TaskDiff(
        task[0], task[1], ida, idb, keys, ta.num_rows, tb.num_rows, added, removed, changed
    )


def diff_checkpoints(
    root: Root, a: int, b: int, task: str | None = None, filesystem: Any = None
) -> list[TaskDiff]:
    """Per task with state in `a` or `b` (or the tasks `task` names, see
    :func:`select_tasks`): keys added, removed and changed from `a` to `b`,
    on the full states rebuilt from each checkpoint's chain."""
    backend = open_root(root, filesystem)
    sa, sb = _state_tasks(backend, a), _state_tasks(backend, b)
    tasks = select_tasks(list(sa.keys() | sb.keys()), task)
    return [_diff_task(backend, (a, sa), (b, sb), t) for t in tasks]


# --- export ---


@dataclass(frozen=True)
class ExportedTable:
    """One exported table: a directory of part files, one per task or file."""

    name: str
    role: str
    path: str
    parts: list[str]
    rows: int
    key: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "path": self.path,
            "parts": self.parts,
            "rows": self.rows,
            "key": self.key,
        }


@dataclass(frozen=True)
class ExportResult:
    checkpoint: int
    root: str
    out: str
    format: str
    tables: list[ExportedTable]

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "root": self.root,
            "out": self.out,
            "format": self.format,
            "tables": [t.to_dict() for t in self.tables],
        }


@dataclass(frozen=True)
class _Part:
    table: str
    role: str
    index: int
    task: Task | None
    entry: dict[str, Any]


def _plan(backend: FsBackend, checkpoint_id: int) -> list[_Part]:
    """Every part an export writes (the Rust ``format::export_plan``)."""
    raw = backend.manifest_bytes(checkpoint_id)
    return [
        _Part(table, role, index, task, entry)
        for table, role, index, task, entry in fmt.export_plan(raw, checkpoint_id)
    ]


def _read_part(backend: FsBackend, checkpoint_id: int, part: _Part) -> pa.Table:
    if part.task is not None:
        table = backend.state(checkpoint_id, part.task)
        assert table is not None
        return table
    data = backend.read_checked(checkpoint_id, part.entry)
    if str(part.entry["path"]).endswith(".parquet"):
        return pq.read_table(pa.BufferReader(data))
    return read_ipc(data)


def _csv_ready(table: pa.Table) -> pa.Table:
    """CSV holds text: binary columns become base64, nested ones JSON."""
    cols = []
    for col in table.columns:
        t = col.type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            values = [None if v is None else base64.b64encode(v).decode() for v in col.to_pylist()]
            col = pa.array(values, pa.string())
        elif pa.types.is_nested(t):
            col = pa.array(
                [None if v is None else json.dumps(v, default=str) for v in col.to_pylist()],
                pa.string(),
            )
        cols.append(col)
    return pa.table(cols, names=table.column_names)


def _write(fs: Any, path: str, table: pa.Table, fmt: str) -> None:
    with fs.open_output_stream(path) as sink:
        if fmt == "parquet":
            pq.write_table(table, sink)
        elif fmt == "arrow":
            with ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
        else:
            pcsv.write_csv(_csv_ready(table), sink)


def _prepare_out(fs: Any, out: str, overwrite: bool) -> None:
    """An empty directory `out`, marked as an export in progress (so that a
    failed export can be overwritten)."""
    _clear_out(fs, out, overwrite)
    _finish_out(fs, out, {"complete": False})


def _finish_out(fs: Any, out: str, meta: dict[str, Any]) -> None:
    data = json.dumps({**meta, "exported_ms": int(time.time() * 1000)}, indent=2).encode()
    _fs.write_bytes(fs, f"{out}/{EXPORT_MANIFEST}", data + b"\n")


def _clear_out(fs: Any, out: str, overwrite: bool) -> None:
    from pyarrow.fs import FileSelector, FileType

    info = fs.get_file_info(out)
    if info.type == FileType.NotFound:
        fs.create_dir(out, recursive=True)
        return
    if info.type != FileType.Directory:
        raise SnapshotError(f"export target {out} exists and is not a directory")
    if not fs.get_file_info(FileSelector(out)):
        return
    if not overwrite:
        raise SnapshotError(
            f"export target {out} is not empty: choose a new directory, or overwrite an "
            "earlier export"
        )
    if not _fs.exists(fs, f"{out}/{EXPORT_MANIFEST}"):
        raise SnapshotError(
            f"export target {out} is not empty and holds no {EXPORT_MANIFEST}: it is not an "
            "earlier export, so it is left alone"
        )
    fs.delete_dir_contents(out)


def export_checkpoint(
    root: Root,
    out: Root,
    checkpoint_id: int | None = None,
    format: str = "parquet",
    filesystem: Any = None,
    out_filesystem: Any = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ExportResult:
    """Writes the full state of every task of a checkpoint (default: the
    newest complete one), and every file of a non-state role (e.g. a Spark
    batch's outputs), as tables Spark, DuckDB and Polars read natively:
    ``OUT/<table>/part-<subtask>.<parquet|arrow|csv>``, plus
    ``OUT/_snapcut_export.json`` describing them (written first with
    ``"complete": false``, last with true). Every file read is checked
    against its checksum. With `overwrite`, an earlier export in `out` is
    replaced; any other non-empty `out` is refused."""
    if format not in FORMATS:
        raise SnapshotError(f"export format must be one of {', '.join(FORMATS)}, got {format!r}")
    backend = open_root(root, filesystem)
    cid = resolve_id(backend, checkpoint_id)
    parts = _plan(backend, cid)
    out_fs, out_path = _fs.resolve(out, out_filesystem)
    if progress is not None:
        progress(0, len(parts))
    _prepare_out(out_fs, out_path, overwrite)
    tables: dict[str, ExportedTable] = {}
    for part in parts:
        table = _read_part(backend, cid, part)
        name = file_component(part.table)
        out_fs.create_dir(f"{out_path}/{name}", recursive=True)
        file = f"{name}/part-{part.index:05d}.{format}"
        _write(out_fs, f"{out_path}/{file}", table, format)
        prev = tables.get(part.table)
        key = (table.schema.metadata or {}).get(KEY_METADATA.encode(), b"").decode() or None
        tables[part.table] = ExportedTable(
            part.table,
            part.role,
            name,
            [*(prev.parts if prev else []), file],
            (prev.rows if prev else 0) + table.num_rows,
            key if prev is None else prev.key,
        )
        if progress is not None:
            progress(1, len(parts))
    result = ExportResult(cid, backend.root, out_path, format, list(tables.values()))
    _finish_out(out_fs, out_path, {**result.to_dict(), "complete": True})
    return result


def write_diff(
    diffs: Sequence[TaskDiff],
    out: Root,
    out_filesystem: Any = None,
    overwrite: bool = False,
) -> list[str]:
    """Writes each task's :meth:`TaskDiff.to_arrow` as
    ``OUT/<vertex>/part-<subtask>.arrow`` (the export layout), plus
    ``OUT/_snapcut_export.json``. Returns the files written, relative to `out`."""
    out_fs, out_path = _fs.resolve(out, out_filesystem)
    _prepare_out(out_fs, out_path, overwrite)
    files = []
    for d in diffs:
        name = file_component(d.vertex)
        out_fs.create_dir(f"{out_path}/{name}", recursive=True)
        file = f"{name}/part-{d.subtask:05d}.arrow"
        _write(out_fs, f"{out_path}/{file}", d.to_arrow(), "arrow")
        files.append(file)
    meta = {
        "diff": {"a": diffs[0].a, "b": diffs[0].b} if diffs else None,
        "tasks": [{**d.to_dict(sample=0), "file": f} for d, f in zip(diffs, files, strict=True)],
        "complete": True,
    }
    _finish_out(out_fs, out_path, meta)
    return files
