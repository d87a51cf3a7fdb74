"""A sink root and its committed output: the root's description
(``_snapcut_sink.json``), which batches are committed, and the pyarrow
readers of the committed rows (no Spark). One :class:`SinkRoot` resolves the
filesystem once and reads the root's description once per read."""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from snapcut import _fs
from snapcut._core import SnapshotError
from snapcut.snapshots import MANIFEST_FILE, FsBackend, checkpoint_dir_name
from snapcut.spark.roots import RootDir, schema_from_bytes

__all__ = [
    "OUTPUT_MODES",
    "OUTPUT_ROLE",
    "SINK_META_FILE",
    "CommittedBatch",
    "SinkRoot",
    "added_columns",
    "committed_output",
    "read_batch_output_arrow",
    "read_output_arrow",
    "read_sink_meta",
    "schema_change",
]

SINK_META_FILE = "_snapcut_sink.json"
SINK_FORMAT = "snapcut-spark-sink"
SINK_FORMAT_VERSION = 1
STAGING_DIR = "_staging"
OUTPUT_ROLE = "output"
OUTPUT_MODES = ("append", "update", "complete")
ORDER_COLUMN = "__order"
_TABLE_READERS = {
    "delta": "deltalake.DeltaTable(uri, version=<the manifest's output.delta.version>)",
    "iceberg": "pyiceberg: catalog.load_table(identifier).scan(snapshot_id=<the manifest's "
    "output.iceberg.snapshot_id>)",
}


@dataclass(frozen=True)
class CommittedBatch:
    """One committed batch of a sink root, as its manifest records it
    (``sink.history()``): readable from anywhere the root is, including a
    Spark Connect client, whose copy of the sink never runs a batch."""

    batch_id: int
    query_id: str
    rows: int
    files: int
    bytes: int
    stage_ms: float
    state_wait_ms: float
    started_ms: int
    finished_ms: int
    state_batch: int | None
    """The state root's version committed with it (``state=``), else None."""
    table_version: int | None = None
    """A table output's commit holding the batch (Delta's table version,
    Iceberg's snapshot id), else None."""

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> CommittedBatch:
        spark, output, state = manifest["spark"], manifest["output"], manifest.get("state")
        return cls(
            batch_id=int(manifest["checkpoint_id"]),
            query_id=str(spark["query_id"]),
            rows=int(output["rows"]),
            files=int(output["files"]),
            bytes=int(output["bytes"]),
            stage_ms=float(spark["stage_ms"]),
            state_wait_ms=float(spark["state_wait_ms"]),
            started_ms=int(manifest["started_ms"]),
            finished_ms=int(manifest["finished_ms"]),
            state_batch=None if state is None else int(state["batch"]),
            table_version=table_version(output),
        )


def table_version(output: dict[str, Any]) -> int | None:
    """The table commit a manifest's ``output`` records: ``delta.version``
    or ``iceberg.snapshot_id`` (None: the rows are in the root)."""
    if "delta" in output:
        return int(output["delta"]["version"])
    if "iceberg" in output:
        return int(output["iceberg"]["snapshot_id"])
    return None


class SinkRoot:
    """One sink root (a local path or any pyarrow-filesystem URI). Picklable."""

    def __init__(self, uri: str | os.PathLike[str], filesystem: Any = None) -> None:
        self.dir = RootDir(uri, filesystem)
        self.uri, self.fs, self.path, self.name = (
            self.dir.uri,
            self.dir.fs,
            self.dir.path,
            self.dir.name,
        )
        self.local = _fs.local_path(self.fs, self.path) is not None

    def chk(self, batch_id: int) -> str:
        return f"{self.path}/{checkpoint_dir_name(batch_id)}"

    def committed(self, batch_id: int) -> bool:
        """Whether batch `batch_id` is committed in this root."""
        return _fs.exists(self.fs, f"{self.chk(batch_id)}/{MANIFEST_FILE}")

    def meta(self) -> dict[str, Any]:
        """What the root holds: output mode, key and schema (``arrow_schema``)."""
        if not self.dir.exists(SINK_META_FILE):
            _fs.check_bucket(self.fs, self.path, f"reading sink root {self.name}")
            raise SnapshotError(
                f"{self.name} is not a snapcut sink root: it has no {SINK_META_FILE} (is the "
                "path right? the first batch a sink writes creates it)"
            )
        meta = self.dir.read_json(SINK_META_FILE)
        if meta.get("format") != SINK_FORMAT:
            raise SnapshotError(
                f"{self.dir.file(SINK_META_FILE)} is not a snapcut sink root "
                f"(format {meta.get('format')!r})"
            )
        meta["arrow_schema"] = schema_from_bytes(base64.b64decode(meta["schema_ipc"]))
        return meta

    def output_meta(self) -> dict[str, Any]:
        """The root's description, refusing a root whose rows are in a table:
        its manifests name no output files to read."""
        meta = self.meta()
        table = meta.get("output")
        if table is not None:
            raise SnapshotError(
                f"sink root {self.name} writes its rows to the {table['format']} table "
                f"{table['table']}, not to the root: read the table "
                f"({_TABLE_READERS[table['format']]}); sink.history() gives each batch's "
                "table_version"
            )
        return meta

    def backend(self) -> FsBackend:
        return FsBackend(self.fs, self.path)

    def output_manifests(
        self, meta: dict[str, Any], batch: int | None = None, backend: FsBackend | None = None
    ) -> list[dict[str, Any]]:
        """The manifests whose output files make the table as of `batch`
        (default: the newest committed): every committed batch up to it for
        append and update, the newest one for complete."""
        backend = backend or self.backend()
        ids = backend.complete()
        if batch is not None:
            if batch not in ids:
                raise SnapshotError(
                    f"batch {batch} is not committed in sink root {self.name}; committed: {ids}"
                )
            ids = [i for i in ids if i <= batch]
        if meta["output_mode"] == "complete":
            ids = ids[-1:]
        return [backend.manifest(i) for i in ids]

    def read_arrow(self, batch: int | None = None) -> pa.Table:
        """The committed output as of `batch` (see :func:`read_output_arrow`)."""
        meta = self.output_meta()
        backend = self.backend()
        manifests = self.output_manifests(meta, batch, backend)
        if not manifests:
            raise SnapshotError(f"sink root {self.name} has no committed batch yet")
        schema = meta["arrow_schema"]
        tables = [read_output_file(backend, b, f) for b, f in output_files(manifests)]
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        if meta["output_mode"] == "update":
            table = newest_per_key(table, meta["key"])
        return table

    def history(self) -> list[CommittedBatch]:
        """Every committed batch, oldest first, from the manifests."""
        backend = self.backend()
        return [CommittedBatch.of(backend.manifest(b)) for b in backend.complete()]

    def read_batch_arrow(self, batch: int) -> pa.Table:
        """The rows committed batch `batch` wrote, alone."""
        meta = self.output_meta()
        backend = self.backend()
        if batch not in backend.complete():
            raise SnapshotError(f"batch {batch} is not committed in sink root {self.name}")
        tables = [
            read_output_file(backend, b, f) for b, f in output_files([backend.manifest(batch)])
        ]
        schema: pa.Schema = meta["arrow_schema"]
        return pa.concat_tables(tables) if tables else schema.empty_table()


def output_files(manifests: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(batch, entry) of every output file the manifests name, in order."""
    return [
        (int(m["checkpoint_id"]), f)
        for m in manifests
        for f in m["files"]
        if f["role"] == OUTPUT_ROLE
    ]


def read_output_file(backend: FsBackend, batch: int, entry: dict[str, Any]) -> pa.Table:
    """One committed output file, checked against its size and checksum."""
    data = backend.read_checked(batch, entry)
    return ipc.open_file(pa.BufferReader(data)).read_all()


def newest_per_key(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """The newest (last) row of each key, in the order of those rows; keys
    compare as IS NOT DISTINCT FROM (one null key is one key)."""
    if unique_keys(table, key):
        return table  # every row is its key's newest, already in that order
    return newest_by_group(table, key)


def newest_by_group(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """:func:`newest_per_key` without the uniqueness check, for rows known
    to repeat keys (a table's old rows followed by a batch's)."""
    order = pa.array(range(table.num_rows), pa.int64())
    table = table.append_column(ORDER_COLUMN, order)
    newest = table.group_by(list(key), use_threads=False).aggregate([(ORDER_COLUMN, "max")])
    idx = pc.sort_indices(newest[f"{ORDER_COLUMN}_max"])
    rows = table.take(pc.take(newest[f"{ORDER_COLUMN}_max"], idx))
    return rows.drop_columns([ORDER_COLUMN])


def unique_keys(table: pa.Table, key: Sequence[str]) -> bool:
    """Whether no two rows of `table` share a key, checked by one hash count
    (no grouping, no take): Spark's update output of an aggregation has one
    row per key, so ``newest_per_key`` can skip its group-by and sort. Only a
    single key column is checked (False otherwise: the general path)."""
    if table.num_rows <= 1:
        return True
    if len(key) != 1:
        return False
    try:
        # mode="all": a null key is one more distinct value, as it is one key.
        distinct = pc.count_distinct(table[key[0]], mode="all").as_py()
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False  # a key type the hash count does not take
    return bool(distinct == table.num_rows)


def schema_change(old: pa.Schema, new: pa.Schema) -> str:
    """How `new` differs from `old` in names and types ("" if it does not)."""
    parts = []
    added = [n for n in new.names if n not in old.names]
    removed = [n for n in old.names if n not in new.names]
    changed = [
        f"{n} {old.field(n).type} -> {new.field(n).type}"
        for n in new.names
        if n in old.names and old.field(n).type != new.field(n).type
    ]
    if added:
        parts.append(f"added {added}")
    if removed:
        parts.append(f"removed {removed}")
    if changed:
        parts.append("changed " + ", ".join(changed))
    if not parts and old.names != new.names:
        parts.append(f"column order {old.names} -> {new.names}")
    return "; ".join(parts)


def added_columns(old: pa.Schema, new: pa.Schema) -> list[str] | None:
    """The columns `new` adds to `old` when that is all that differs (every
    column of `old` is in `new` with its type; order and nullability
    aside), else None."""
    for field in old:
        if field.name not in new.names or new.field(field.name).type != field.type:
            return None
    return [n for n in new.names if n not in old.names]


# -- the readers' function forms (one SinkRoot each) -----------------------------


def read_sink_meta(root: str | os.PathLike[str], filesystem: Any = None) -> dict[str, Any]:
    """What a sink root holds: output mode, key and schema (``arrow_schema``)."""
    return SinkRoot(root, filesystem).meta()


def committed_output(
    root: str | os.PathLike[str], batch: int | None = None, filesystem: Any = None
) -> list[dict[str, Any]]:
    """The manifests whose output files make the table as of `batch`
    (default: the newest committed): every committed batch up to it for
    append and update, the newest one for complete."""
    sink = SinkRoot(root, filesystem)
    return sink.output_manifests(sink.meta(), batch)


def read_output_arrow(
    root: str | os.PathLike[str], batch: int | None = None, filesystem: Any = None
) -> pa.Table:
    """The committed output as of `batch` (default: the newest committed) as
    pyarrow, every file checked against its size and checksum: append → all
    rows; update → the newest row per key; complete → the newest batch."""
    return SinkRoot(root, filesystem).read_arrow(batch)


def read_batch_output_arrow(
    root: str | os.PathLike[str], batch: int, filesystem: Any = None
) -> pa.Table:
    """The rows committed batch `batch` wrote, alone (not merged with other
    batches whatever the output mode), every file checked."""
    return SinkRoot(root, filesystem).read_batch_arrow(batch)
