"""One batch's walk through a table output (Delta or Iceberg), as the sink
(:mod:`.arrow_sink`) drives it: the table's checks and the replay test
before the batch's Spark action, where the tasks write, the one table
commit, and what the manifest records (``output.<format>``). The outputs
themselves: :mod:`.table`, :mod:`.delta`, :mod:`.iceberg`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from snapcut.spark import failpoints
from snapcut.spark.roots import schema_bytes
from snapcut.spark.sink.report import BatchReport
from snapcut.spark.sink.staging import StagingTarget
from snapcut.spark.sink.table import BatchCommit, TableOutput, counts_of

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["TableBatch"]


class TableBatch:
    """Batch `batch` of query `owner` into `output`, for the sink root at
    `root_path` (the app id is ``snapcut:<owner>:<root_path>``); `writable`
    runs a write with the sink's storage errors."""

    def __init__(
        self,
        output: TableOutput,
        output_mode: str,
        key: tuple[str, ...],
        root_path: str,
        owner: str,
        schema: pa.Schema,
        batch: int,
        writable: Callable[[Callable[[], Any]], Any],
    ) -> None:
        self.output, self.output_mode, self.key = output, output_mode, key
        self.owner, self.batch = owner, batch
        self.app_id = f"snapcut:{owner}:{root_path}"
        self.schema = output.table_schema(schema)
        self.table = output.table()
        output.check(self.table, self.app_id, self.schema)
        self.done = output.committed_version(self.table, self.app_id, batch)
        self.files = output.files(self.table, owner, batch, self.schema)
        self.info: dict[str, Any] | None = self.done
        if self.done is None:
            # A run that failed before the table commit left files here.
            writable(lambda: output.clean(self.files))

    @property
    def takes_rows(self) -> bool:
        """Update mode: the driver merges the batch's rows into the table
        (delta-rs' MERGE, Iceberg's copy-on-write), so it takes them with
        ``toArrow()``, which ships them from the JVM straight to the
        driver, on a classic and a Spark Connect session alike (where
        foreachBatch runs in the server's Python worker). Staging them as
        Arrow IPC on the executors and reading that back cost one Python
        UDF per batch and a second pass over the rows, and bought nothing:
        Spark's collect returns one successful attempt's rows per
        partition, as the staged files' attempt bookkeeping did, and the
        root names no file of a table output. The one new limit: a batch's
        rows must fit ``spark.driver.maxResultSize`` (which the staging
        job's file descriptions never approached); the driver held them
        all before as well. Append and complete keep the executors writing
        Parquet into the table: those rows never need the driver."""
        return self.output_mode == "update"

    def target(self, ipc: StagingTarget) -> StagingTarget:
        """Append and complete write Parquet into the table (update mode
        stages nothing: :attr:`takes_rows`)."""
        return replace(ipc, schema_ipc=schema_bytes(self.schema), table=self.files)

    def commit(
        self, files: list[dict[str, Any]], report: BatchReport, rows: pa.Table | None = None
    ) -> int:
        """The batch's one table commit (none if it is there already);
        returns the commit's version (Delta) or snapshot id (Iceberg).
        `rows`: the batch's rows (update mode, :attr:`takes_rows`)."""
        if self.done is not None:
            # Replayed: the table has the batch; its counts are in its commit.
            report.rows, report.files, report.bytes = counts_of(self.done)
            return int(self.done["version"])
        if self.takes_rows:
            assert rows is not None, "update mode takes the batch's rows on the driver"
            rows = rows.cast(self.schema)
        counts = {"rows": report.rows, "files": report.files, "bytes": report.bytes}
        commit = BatchCommit(
            self.output_mode,
            self.key,
            self.schema,
            files,
            rows,
            self.app_id,
            self.batch,
            counts,
            self.files,
        )
        self.info = self.output.commit(self.table, commit)
        failpoints.hit("sink.after_table_commit", self.batch, 0)
        if self.output_mode != "update":
            # Committed: what else is in the batch's directory lost.
            keep = [f["path"] for f in files]
            with contextlib.suppress(OSError):
                self.output.clean(self.files, keep)
        return int(self.info["version"])

    def record(self) -> dict[str, Any]:
        """The manifest's ``output.<format>``."""
        assert self.info is not None
        return {
            **self.output.record(self.info),
            "app_id": self.app_id,
            "replayed": self.done is not None,
        }
