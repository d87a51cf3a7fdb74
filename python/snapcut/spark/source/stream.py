"""``spark.readStream.format("snapcut").load(SINK_ROOT)``: a sink root's
committed batches as a streaming source, each read once.

**Offsets** are batch ids of the sink root: ``{"batch_id": N}`` means every
committed batch up to N has been read; a new query starts at
``{"batch_id": -1}`` (before the first batch), or before ``startingBatchId``.
The latest offset is the newest *committed* batch: a batch without its
manifest (still running, or failed) is not offered, and staged files are
never read. ``maxBatchesPerTrigger`` caps how many of the root's batches one
micro-batch takes (Spark's ReadLimits count rows, files or bytes, none
counts batches, so the cap is this source's own and holds for every
trigger; an ``availableNow`` query then runs several micro-batches up to the
newest batch committed when it started).

**Planning** is from manifests only: the micro-batch ``(start, end]`` is one
Spark partition per output file of the committed batches start+1..end.
Committed files never change, so planning the same range again (Spark
re-running a micro-batch after a restart, from the offsets in its
checkpoint) gives the same partitions and the same rows: with an
exactly-once sink downstream the chain is exactly once.

**Rows** are every committed row of each batch, as the sink wrote it,
whatever the sink root's output mode: an ``update`` root gives each batch's
upserted rows (not the newest row per key across batches), a ``complete``
root each batch's whole table. Each file is checked against its manifest's
size and checksum and cast to the root's schema.

**Errors.** A batch in ``(start, end]`` that retention has removed from the
root (``snapcut snapshots prune``) cannot be read: the read fails with a
:class:`~snapcut.SnapshotError` naming the root, the batch, the oldest
batch it still holds and the fixes; so does a root that lost batches some
other way (replaced, rolled back). Options of a batch read (``batchId``,
the state options) are refused with a :class:`~snapcut.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from snapcut._core import SnapshotError
from snapcut.spark.sink.root import SinkRoot, output_files, read_output_file
from snapcut.spark.source.options import ReadOptions

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pyspark < 4.2: no admission control; Spark never calls it

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        def prepareForTriggerAvailableNow(self) -> None: ...


if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit

__all__ = ["OFFSET_KEY", "SinkStreamReader"]

OFFSET_KEY = "batch_id"


class _File(InputPartition):
    """One committed output file: ``value`` is ``(batch, manifest entry)``."""


class SinkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader of one sink root (see the module). Spark builds
    it in its planner's Python worker (offsets, partitions, commit) and
    pickles it to the executors (``read``)."""

    def __init__(self, root: SinkRoot, opts: ReadOptions) -> None:
        opts.refuse_batch_options(root.name)
        meta = root.output_meta()  # a root whose rows are in a Delta table is refused
        self.root = root
        self.schema: pa.Schema = meta["arrow_schema"]
        self.first_batch = int(meta["first_batch"])
        self.max_batches = opts.max_batches
        self.start = -1 if opts.starting_batch is None else opts.starting_batch - 1
        self._target: int | None = None
        """availableNow: the newest batch committed when the query started."""
        self._planned: int | None = None
        """The end of the last range planned or committed (for Spark's
        ``latestOffset()`` without a start, before 4.2)."""

    # -- offsets -------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        return {OFFSET_KEY: self.start}

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        committed = self.root.backend().complete()
        begin = self._planned if start is None else self._batch(start)
        if begin is not None and begin > self.start and (not committed or committed[-1] < begin):
            raise self._rolled_back(f"has read up to batch {begin}", committed)
        newer = [b for b in committed if begin is None or b > begin]
        if self._target is not None:
            newer = [b for b in newer if b <= self._target]
        if begin is not None and self.max_batches is not None:
            newer = newer[: self.max_batches]
        if not newer:
            return {OFFSET_KEY: self.start if begin is None else begin}
        return {OFFSET_KEY: newer[-1]}

    def reportLatestOffset(self) -> dict[str, int] | None:
        committed = self.root.backend().complete()
        return {OFFSET_KEY: committed[-1]} if committed else None

    def prepareForTriggerAvailableNow(self) -> None:
        # Batches the root commits after this are left for the next run.
        committed = self.root.backend().complete()
        self._target = committed[-1] if committed else -1

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to release: the files are the sink root's, read-only here.
        self._planned = self._batch(end)

    def stop(self) -> None:
        pass

    # -- planning and reading ------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        lo, hi = self._batch(start), self._batch(end)
        self._planned = hi
        if hi <= lo:
            return []
        backend = self.root.backend()
        committed = backend.complete()
        # Batches before the root's first one never existed: nothing to read.
        wanted = range(max(lo + 1, self.first_batch), hi + 1)
        have = set(committed)
        missing = [b for b in wanted if b not in have]
        if missing:
            raise self._missing(missing[0], lo, hi, committed)
        files = output_files([backend.manifest(b) for b in wanted])
        return [_File((batch, entry)) for batch, entry in files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batch, entry = partition.value
        table = read_output_file(self.root.backend(), int(batch), entry)
        yield from table.select(self.schema.names).cast(self.schema).to_batches()

    # -- errors ----------------------------------------------------------------

    def _batch(self, offset: dict[str, Any]) -> int:
        value = offset.get(OFFSET_KEY) if isinstance(offset, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            raise SnapshotError(
                f"offset {offset!r} in the query's checkpoint is not one of format('snapcut') "
                f"(a {{{OFFSET_KEY!r}: N}}): the checkpointLocation belongs to another source; "
                "start this query from a new checkpointLocation"
            )
        return value

    def _missing(self, batch: int, lo: int, hi: int, committed: list[int]) -> SnapshotError:
        name = self.root.name
        if committed and batch < committed[0]:
            oldest = committed[0]
            skipped = (
                f"batch {batch} is" if batch == oldest - 1 else f"batches {batch}..{oldest - 1} are"
            )
            return SnapshotError(
                f"sink root {name} no longer holds batch {batch}: retention removed it (the "
                f"oldest batch the root holds is {oldest}), and this streaming query, which has "
                f"read the root up to batch {lo}, needs batches {lo + 1}..{hi}. Restart the "
                "query from a new checkpointLocation (with .option('startingBatchId', "
                f"{oldest}) it starts at the oldest batch held; {skipped} then not read), "
                f"or keep more batches in {name} (prune it with a larger --keep) so that its "
                "readers keep up"
            )
        if not committed or batch > committed[-1]:
            return self._rolled_back(f"is to read batches {lo + 1}..{hi}", committed)
        return SnapshotError(
            f"sink root {name} has no committed batch {batch}, though it holds batches "
            f"{committed[0]}..{committed[-1]}: its chk-{batch} was removed or damaged outside "
            "its sink. Restore it from a backup, or restart this streaming query from a new "
            "checkpointLocation with .option('startingBatchId', N) past the hole"
        )

    def _rolled_back(self, what: str, committed: list[int]) -> SnapshotError:
        newest = f"its newest committed batch is {committed[-1]}" if committed else "it holds none"
        return SnapshotError(
            f"this streaming query {what} of sink root {self.root.name}, but {newest}: the "
            "root was replaced or rolled back. Restart the query from a new checkpointLocation "
            "to read the root as it is now"
        )
