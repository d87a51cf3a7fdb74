"""One state partition's work in one micro-batch, free of Spark.

Per (batch N, partition p): load version N-1 (from this process's cache when
it holds exactly N-1, else from the root: nearest full + diffs), let a
processor apply the batch, hand version N's diff (or full) to the Rust
encoder (which sorts it by key, so its bytes are deterministic), acknowledge
it, and finalize N's manifest if this task finds every partition's
acknowledgement (``StateRoot.finalize_if_acked``). The Spark glue
(``keyed_state``) only supplies the batch id, the partition and the rows.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from snapcut._core import SnapshotError, StateTable
from snapcut.snapshots.runs import run_counts
from snapcut.spark import failpoints
from snapcut.spark.roots import schema_from_bytes
from snapcut.spark.state.compaction import WorkerCompactor, committing
from snapcut.spark.state.compactors import compactor_for
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import TableLayout
from snapcut.spark.state.warm import CACHE, Runs, StateCache, Tables
from snapcut.spark.state.worker_memory import (
    mapped_memory,
    release_unused_arrow_memory,
    table_memory,
)

__all__ = ["BatchInfo", "PartitionTask", "Processor"]

NO_EVENT_TIME = -(2**63)

#: A table's own full_every where a compactor merges its runs: it never
#: captures a full by itself; the commit decides (first version, a
#: migration, or runs past the cap).
NEVER_FULL = 2**32 - 1


@dataclass(frozen=True)
class BatchInfo:
    """What a processor knows about the batch it is applying."""

    batch_id: int
    partition: int
    watermark_ms: int
    """The watermark of this batch: decides event-time timeouts (Spark's
    watermark for eviction)."""
    processing_time_ms: int
    watermark_present: bool
    late_watermark_ms: int = 0
    """The previous batch's watermark: rows at or before it are late (Spark's
    watermark for late events, since Spark 3.4)."""
    query_id: str = ""
    run_id: str | None = None
    """Spark's run id of the query, where the task can know it (a classic
    session's task property); None under Spark Connect."""


class Processor(Protocol):
    """Applies one partition's rows of a batch to its state: the root's one
    table, or (a root of several tables) a dict of them by vertex."""

    def process(self, table: Any, rows: pa.Table, info: BatchInfo) -> pa.Table:
        """Updates the state in place and returns the output rows."""
        ...

    def max_event_time_ms(self, rows: pa.Table) -> int:
        """The largest event time in `rows` (NO_EVENT_TIME without one)."""
        ...


@dataclass
class Loaded:
    tables: Tables
    runs: Runs
    """Each table's runs at N-1 (what version N is written on)."""
    watermark_ms: int
    max_event_time_ms: int
    from_cache: bool
    late_watermark_ms: int = 0
    bytes_read: int = 0
    """Bytes of the state files a cache miss read from the root (their Arrow buffers)."""
    load_ms: float = 0.0
    """How long a cache miss took to read and restore the tables."""
    run_cache_hits: int = 0
    """Of the state files a cache miss read from a remote root: found in the
    run cache, fetched into it, and the bytes fetched."""
    run_cache_misses: int = 0
    run_cache_bytes_fetched: int = 0


class PartitionTask:
    """Runs one (batch, partition) against a root."""

    def __init__(
        self,
        root: StateRoot,
        batch_id: int,
        partition: int,
        owner: str,
        watermark_delay_ms: int | None,
        initial: Any = None,
        cache: StateCache = CACHE,
        run_id: str | None = None,
        state_memory: int | None = None,
        compactor: WorkerCompactor | bool | None = True,
    ) -> None:
        """`compactor`: True for this process's compactor of the root
        (:func:`compactors.compactor_for`), or one given, or False/None for
        none (a full in the commit every `full_every` batches)."""
        self.root = root
        self.batch_id = batch_id
        self.partition = partition
        self.owner = owner
        self.delay = watermark_delay_ms
        self.initial = initial
        self.cache = cache
        self.run_id = run_id
        self.state_memory = state_memory
        self._spilled: dict[str, int] = {}
        spec = root.spec
        # The schemas are part of the key: a restart with a migrated schema
        # in the same process must not take the old tables.
        shape = hashlib.sha256(b"".join(x.schema for x in spec.layouts())).hexdigest()[:16]
        self.cache_key = (spec.uri, f"{spec.vertex}#{shape}", partition)
        self.migrated: list[str] = []
        if compactor is True:
            compactor = compactor_for(spec, root.fs, root.path)
        self.compactor: WorkerCompactor | None = compactor or None

    def _new_table(self, layout: TableLayout) -> StateTable:
        # A table with a group column (transformWithState's list and map
        # state, its timers) spills too: a group's rows in the runs are the
        # keys that begin with its prefix.
        memory = (
            None
            if self.state_memory is None
            else table_memory(self.state_memory, self.root.spec.layouts())
        )
        return StateTable(
            schema_of(layout),
            layout.state_key,
            full_every=NEVER_FULL if self.compactor is not None else self.root.spec.full_every,
            group=layout.group,
            group_prefix=layout.group_prefix,
            time_column=layout.time,
            state_memory=memory,
            mapped_memory=None if memory is None else mapped_memory(memory),
        )

    def _new_tables(self) -> Tables:
        return {layout.vertex: self._new_table(layout) for layout in self.root.spec.layouts()}

    def load(self) -> Loaded:
        """Version N-1 of this partition (or the initial state before batch 0)."""
        n = self.batch_id
        layouts = self.root.spec.layouts()
        if n == 0:
            tables = self._new_tables()
            if self.initial is not None:
                rows = self.initial(self.partition)
                if rows is not None and rows.num_rows:
                    tables[layouts[0].vertex].update(rows)
            return Loaded(tables, {v: [] for v in tables}, 0, NO_EVENT_TIME, False)
        prev = self.root.committed(n - 1)
        if prev is None:
            acked = set(self.root.acked(n - 1))
            missing = [p for p in range(self.root.spec.partitions) if p not in acked]
            raise SnapshotError(
                f"batch {n} runs, so Spark committed batch {n - 1}, but state root "
                f"{self.root.name} has no version {n - 1} of partition(s) {missing}: the root "
                "was changed by hand, or another query's state was put in its place; restore the "
                "root or start the query afresh on a new root and checkpointLocation"
            )
        spark = prev.get("spark", {})
        delay = self.delay
        max_event = int(spark.get("max_event_time_ms", NO_EVENT_TIME))
        late_watermark = watermark = int(spark.get("watermark_ms", 0))
        if delay is not None and max_event != NO_EVENT_TIME:
            watermark = max(watermark, max_event - delay)
        warm = self.cache.take(self.cache_key, n - 1)
        if warm is not None:
            tables, runs = warm
            return Loaded(tables, runs, watermark, max_event, True, late_watermark)
        from snapcut.spark.state.evolution import conform_file

        tables, runs = {}, {}
        t0 = time.perf_counter()
        read = 0
        cache = self.root.backend.run_cache if self.root.mappable else None
        before = cache.stats.copy() if cache is not None else None
        for layout in layouts:
            table = self._new_table(layout)
            # A local root's files are mapped, a remote root's from the run cache
            # (downloaded once): a table with a memory budget takes its sorted
            # full as its base run as it is (no copy, no local file). Without a
            # run cache a remote root's are read into memory, and the table
            # copies its base into a local run, as its budget needs.
            mapped = self.root.mappable
            files = self.root.read_chain_files(prev, self.partition, layout.vertex, mapped)
            schema = schema_of(layout)
            fitted = [(f.checkpoint, f.kind, conform_file(f.table, schema)) for f in files]
            migrated = any(a.table is not b[2] for a, b in zip(files, fitted, strict=True))
            if migrated:
                # Written before a schema migration: the next file is a full one,
                # so every chain from here on has one schema.
                self.migrated.append(layout.vertex)
            if files:
                # A migrated file was converted in memory: not mapped. A diff's
                # stored filter spares its run hashing the diff's keys; the
                # full's stored time index, reading every row's time.
                keep = mapped and not migrated
                filters = [f.filter for f in files] if keep else None
                pages = [f.pages for f in files] if keep else None
                times = None if migrated else files[0].times
                table.restore(fitted, mapped=keep, filters=filters, pages=pages, times=times)
                if files[0].times_pages is not None:
                    files[0].times_pages.release()
            read += sum(f.table.get_total_buffer_size() for f in files)
            tables[layout.vertex] = table
            # What version N is written on (none: a table with nothing stored yet).
            task = (layout.vertex, self.partition)
            runs[layout.vertex] = self.root.backend.state_runs(n - 1, task, prev) or []
        load_ms = (time.perf_counter() - t0) * 1000
        fetched = (0, 0, 0)
        if cache is not None and before is not None:
            now = cache.stats
            fetched = (
                now.hits - before.hits,
                now.misses - before.misses,
                now.bytes_fetched - before.bytes_fetched,
            )
        return Loaded(
            tables, runs, watermark, max_event, False, late_watermark, read, load_ms, *fetched
        )

    def run(self, rows: pa.Table, processor: Processor, batch_ts_ms: int | None) -> pa.Table:
        """Applies the batch and makes version N durable; returns the output."""
        out = self.apply(rows, processor, batch_ts_ms)
        self.commit()
        return out

    def apply(self, rows: pa.Table, processor: Processor, batch_ts_ms: int | None) -> pa.Table:
        """The synchronous part: load N-1, apply the batch, return the output.
        :meth:`commit` then writes version N (it may run on another thread
        while the output goes to Spark: the table is not touched again)."""
        state = self._begin(batch_ts_ms)
        out = processor.process(state, rows, self._info)
        # The batch's lookups and the processor's own tables are freed.
        release_unused_arrow_memory()
        self._metrics = {
            "rows_in": rows.num_rows,
            "rows_out": out.num_rows,
            "late_rows": int(getattr(processor, "late_rows", 0)),
            "timed_out_keys": int(getattr(processor, "timed_out_keys", 0)),
            "batch_max_event_ms": processor.max_event_time_ms(rows),
            "input_rows_spilled": 0,
        }
        return out

    def apply_parts(
        self, parts: Iterable[pa.Table], processor: Processor, batch_ts_ms: int | None
    ) -> Iterator[pa.Table]:
        """As :meth:`apply`, over the batch as parts that each hold whole keys
        (:func:`snapcut.spark.state.key_parts.key_parts`), for a processor whose
        output for a key depends only on that key's rows and state (level 1 in
        update mode; levels 2 and 3 and transformWithState, whose
        ``process_parts`` runs the batch's calls over the parts, the timed-out
        keys and timers after them): yields each part's output as it is
        ready. :meth:`commit` only once the parts are exhausted."""
        state = self._begin(batch_ts_ms)
        seen = {"rows_in": 0, "max_event": NO_EVENT_TIME}

        def counted() -> Iterator[pa.Table]:
            for rows in parts:
                seen["rows_in"] += rows.num_rows
                seen["max_event"] = max(seen["max_event"], processor.max_event_time_ms(rows))
                yield rows
                del rows
                # A part's transient tables (its lookups, the function's
                # own, its output) are freed by now: their pages go back.
                release_unused_arrow_memory()

        figures = {"rows_out": 0, "late_rows": 0, "timed_out_keys": 0}
        whole = getattr(processor, "process_parts", None)
        if whole is not None:
            # One run of the batch's calls over every part; its figures are the batch's.
            for out in whole(state, counted(), self._info):
                figures["rows_out"] += out.num_rows
                yield out
            figures["late_rows"] = int(getattr(processor, "late_rows", 0))
            figures["timed_out_keys"] = int(getattr(processor, "timed_out_keys", 0))
        else:
            for rows in counted():
                out = processor.process(state, rows, self._info)
                figures["rows_out"] += out.num_rows
                figures["late_rows"] += int(getattr(processor, "late_rows", 0))
                figures["timed_out_keys"] += int(getattr(processor, "timed_out_keys", 0))
                yield out
        # (The parts are of a spilled input: every row went through a local file.)
        self._metrics = {
            **figures,
            "rows_in": seen["rows_in"],
            "batch_max_event_ms": seen["max_event"],
            "input_rows_spilled": seen["rows_in"],
        }

    def _begin(self, batch_ts_ms: int | None) -> Any:
        """Claims the root, loads N-1; the state a processor applies to."""
        self._started = _now_ms()
        self.root.claim(self.owner)
        self._loaded = self.load()
        self._info = BatchInfo(
            batch_id=self.batch_id,
            partition=self.partition,
            watermark_ms=self._loaded.watermark_ms,
            processing_time_ms=batch_ts_ms if batch_ts_ms is not None else self._started,
            watermark_present=self.delay is not None,
            late_watermark_ms=self._loaded.late_watermark_ms,
            query_id=self.owner,
            run_id=self.run_id,
        )
        tables = self._loaded.tables
        self._spilled = spill_totals(tables)
        return tables if self.root.spec.tables else next(iter(tables.values()))

    def commit(self) -> None:
        """Writes version N (sorted by key: deterministic bytes), acknowledges
        it, finalizes the batch's manifest if every partition has, and only
        then puts the table back in the cache."""
        # A compactor's upload in this process waits while it runs.
        with committing():
            self._commit()

    def _commit(self) -> None:
        loaded, info, metrics = self._loaded, self._info, self._metrics
        failpoints.hit("state.before_write", self.batch_id, self.partition)
        t0 = time.perf_counter()
        entries: list[dict[str, Any]] = []
        runs: Runs = {}
        adopted = 0
        for layout in self.root.spec.layouts():
            entry, n = self._write_table(layout)
            entries.append(entry)
            runs[layout.vertex] = entry["runs"]
            adopted += n
        failpoints.hit("state.after_write", self.batch_id, self.partition)
        write_ms = (time.perf_counter() - t0) * 1000
        ack = {
            "query_id": self.owner,
            "files": entries,
            **({"migrated": self.migrated} if self.migrated else {}),
            "watermark_ms": info.watermark_ms,
            "max_event_time_ms": max(loaded.max_event_time_ms, metrics["batch_max_event_ms"]),
            "batch_timestamp_ms": info.processing_time_ms,
            "rows_in": metrics["rows_in"],
            "rows_out": metrics["rows_out"],
            "late_rows": metrics["late_rows"],
            "state_keys": sum(len(t) for t in loaded.tables.values()),
            "write_ms": round(write_ms, 3),
            "compactions_adopted": adopted,
            "from_cache": loaded.from_cache,
            "started_ms": self._started,
            "finished_ms": _now_ms(),
        }
        self._ack = ack
        self.root.write_ack(self.batch_id, self.partition, ack)
        failpoints.hit("state.after_ack", self.batch_id, self.partition)
        self.root.finalize_if_acked(self.batch_id)
        self.cache.put(self.cache_key, self.batch_id, runs, loaded.tables, memory=self.state_memory)
        self._compact(runs)
        none = {"merged": 0, "busy_ms": 0}
        self._compaction = none if self.compactor is None else self.compactor.report()

    def _write_table(self, layout: TableLayout) -> tuple[dict[str, Any], int]:
        """Writes version N of one table: a diff on N-1's runs, adopting the
        merges published for it; a full for the first version, after a
        schema migration, or once its runs reach the cap (`full_every`
        without a compactor, twice that with one: its merges fell behind).
        Returns the entry and the merges it adopted."""
        table = self._loaded.tables[layout.vertex]
        base = self._loaded.runs[layout.vertex]
        spec, compactor = self.root.spec, self.compactor
        cap = spec.full_every if compactor is None else 2 * spec.full_every
        # A local root's commits look every time (one listing of a small
        # directory): each removes what was adopted before, whose file would
        # otherwise keep its disk space. A remote root's look (a LIST
        # request) only where a merge of these runs may wait: once they hold
        # more than `full_every` runs (the commit that made them so handed
        # one over).
        look = compactor is not None and (
            compactor.looks_every_commit or len(base) > spec.full_every
        )
        if layout.vertex in self.migrated or (
            len(base) + 1 > cap
            and not (
                look
                and compactor is not None
                and compactor.adoptable(
                    self.batch_id, layout.vertex, self.partition, base, spec.retain
                )
            )
        ):
            table.checkpoint_aborted()  # forces a full: bounds (or re-types) the runs
        # A table over its memory budget leaves the capture as runs that
        # the writer merges as it writes the file, never holding it whole.
        _, kind, capture = table.checkpoint_streamed(self.batch_id)
        entry = self.root.write_state(self.batch_id, self.partition, capture, kind, base, layout)
        if compactor is None or not look or kind != "diff":
            return entry, 0
        return compactor.adopt(
            self.batch_id,
            layout.vertex,
            self.partition,
            entry,
            spec.retain,
            before_link=lambda: failpoints.hit("state.before_adopt", self.batch_id, self.partition),
        )

    def _compact(self, runs: Runs) -> None:
        """Hands this version's tables whose runs call for a merge to the
        worker's compactor; never waits for it."""
        if self.compactor is None:
            return
        spec = self.root.spec
        for layout in spec.layouts():
            if len(runs[layout.vertex]) > spec.full_every:
                self.compactor.submit(
                    layout.vertex,
                    self.partition,
                    layout.state_key,
                    runs[layout.vertex],
                    spec.full_every,
                    self.batch_id,
                )

    def figures(self) -> dict[str, int]:
        """This task's part of the step's observed metrics (after :meth:`commit`)."""
        ack = self._ack
        spilled = spill_totals(self._loaded.tables)
        hit = bool(ack["from_cache"])
        stored = run_counts(ack["files"])
        return {
            "rows_in": int(ack["rows_in"]),
            "rows_out": int(ack["rows_out"]),
            "late_rows_dropped": int(ack["late_rows"]),
            "keys_timed_out": int(self._metrics["timed_out_keys"]),
            "state_rows": int(ack["state_keys"]),
            "state_bytes_written": sum(int(e["bytes"]) for e in ack["files"]),
            # Tables written whole: O(the partition's state) in this commit.
            "state_fulls_written": sum(e["kind"] == "full" for e in ack["files"]),
            # Merges a worker's compactor made off the task's path, adopted here.
            "state_compactions_adopted": int(ack["compactions_adopted"]),
            "state_write_ms_max": round(float(ack["write_ms"])),
            "state_cache_hits": int(hit),
            "state_cache_misses": int(not hit),
            "state_bytes_read": self._loaded.bytes_read,
            "state_load_ms_max": round(self._loaded.load_ms),
            # A miss's restore took the time index stored beside its full.
            "state_times_stored": 0 if hit else self._spilled["times_stored"],
            **{f"state_{k}": spilled[k] - self._spilled.get(k, 0) for k in SPILL_SUMS},
            "state_runs_max": spilled["runs_max"],
            "state_stored_runs_max": stored["runs_max"],
            "state_compaction_debt_bytes": stored["debt_bytes"],
            "state_compactions_merged": self._compaction["merged"],
            "state_compaction_ms": self._compaction["busy_ms"],
            "input_rows_spilled": int(self._metrics["input_rows_spilled"]),
            "state_run_cache_hits": self._loaded.run_cache_hits,
            "state_run_cache_misses": self._loaded.run_cache_misses,
            "state_run_cache_bytes_fetched": self._loaded.run_cache_bytes_fetched,
        }


SPILL_SUMS = ("flushes", "rows_flushed", "merges", "run_probes", "run_hits")


def spill_totals(tables: Tables) -> dict[str, int]:
    """What the tables' spilling did so far (0 without a memory budget)."""
    stats = [s for t in tables.values() if (s := t.spill_stats()) is not None]
    out = {k: sum(s[k] for s in stats) for k in SPILL_SUMS}
    out["runs_max"] = max((s["runs"] for s in stats), default=0)
    out["times_stored"] = sum(s["times_stored"] for s in stats)
    return out


def schema_of(layout: TableLayout) -> pa.Schema:
    return schema_from_bytes(layout.schema)


def _now_ms() -> int:
    return int(time.time() * 1000)
