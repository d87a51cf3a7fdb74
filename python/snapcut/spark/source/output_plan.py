"""Reading a sink root's committed output through the data source: the
table as of a batch (``read_output_arrow``'s rows), one Spark partition per
committed output file, never a staged one.

``append`` reads every file up to the batch; ``complete`` the newest batch's
files. ``update`` keeps the newest row per key with no shuffle: the task of
file *i* keeps its file's newest row per key, less the keys a later file
writes again (it reads those files' key columns), so each key comes out of
the one file that wrote it last.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError, SnapshotError
from snapcut.spark.sink.root import SinkRoot, newest_per_key, output_files, read_output_file
from snapcut.spark.source.options import ReadOptions

__all__ = ["OutputPlan", "plan_output"]


@dataclass(frozen=True)
class OutputPlan:
    """What executors need to read a sink root's output as of one batch. Picklable."""

    sink: SinkRoot
    schema: pa.Schema
    files: tuple[tuple[int, dict[str, Any]], ...]
    """(batch, entry) of every output file read, oldest first."""
    key: tuple[str, ...] | None = None
    """The key of an ``update`` root (None: every row counts)."""

    @property
    def partitions(self) -> range:
        return range(len(self.files))

    def read(self, index: int) -> Iterator[pa.RecordBatch]:
        backend = self.sink.backend()
        batch, entry = self.files[index]
        table = read_output_file(backend, batch, entry)
        if self.key is not None and table.num_rows:
            key = list(self.key)
            table = newest_per_key(table, key)
            rest = self.files[index + 1 :]
            later = [read_output_file(backend, b, e).select(key) for b, e in rest]
            if later:
                rewritten = pa.concat_tables(later).group_by(key, use_threads=False).aggregate([])
                table = table.join(rewritten, keys=key, join_type="left anti", use_threads=False)
        yield from table.select(self.schema.names).cast(self.schema).to_batches()


def plan_output(sink: SinkRoot, opts: ReadOptions) -> OutputPlan:
    """The plan of `opts` on `sink`: the files of the table as of ``batchId``."""
    opts.refuse_state_options(sink.name)
    opts.refuse_stream_options(sink.name)
    meta = sink.output_meta()  # a root whose rows are in a Delta table is refused
    backend = sink.backend()
    committed = backend.complete()
    if not committed:
        raise SnapshotError(f"sink root {sink.name} has no committed batch yet")
    if opts.batch_id is not None and opts.batch_id not in committed:
        raise ConfigError(
            f"option 'batchId' is {opts.batch_id}, which sink root {sink.name} has not "
            f"committed or no longer retains (committed: {committed[0]}..{committed[-1]}): "
            "pass one of those"
        )
    manifests = sink.output_manifests(meta, opts.batch_id, backend)
    update = meta["output_mode"] == "update"
    return OutputPlan(
        sink=sink,
        schema=meta["arrow_schema"],
        files=tuple(output_files(manifests)),
        key=tuple(meta["key"]) if update else None,
    )
