"""`Dataflow`: build a streaming job in Python, run it on snapcut's Rust runtime.

    flow = Dataflow(parallelism=2)
    events = flow.generate_dwell_events(users=1000, count=1_000_000, seed=7)
    avg = events.key_by("user").aggregate(count="count", total=("sum", "dwell_ms"))
    avg.collect("result")
    report = flow.run(checkpointing=Checkpointing(protocol="aligned", interval=0.1))
    report.results["result"]   # pyarrow.Table

Records move as Arrow record batches. Python functions get a whole
`pyarrow.RecordBatch` per call (the GIL is taken once per batch); everything
else runs in Rust with the GIL released.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from snapcut import _core
from snapcut._core import ConfigError, GraphError
from snapcut.checkpointing import (
    ChannelLog,
    Checkpointing,
    CheckpointMetrics,
    CompactionStats,
    Snapshot,
    StoreMetrics,
    TaskState,
)


def dwell_events(users: int, count: int, seed: int = 0) -> pa.Table:
    """The records `generate_dwell_events(users, count, seed)` emits (any parallelism)."""
    return pa.Table.from_batches([_core.dwell_events(users, count, seed)])


AGGREGATES = ("count", "sum", "min", "max", "mean")

BatchFn = Callable[[pa.RecordBatch], Any]
KeyedFn = Callable[[Any, pa.RecordBatch, Any], tuple[Any, Any]]
AggSpec = str | tuple[str, str]


@dataclass
class _Input:
    node: int
    partitioning: str | None = None  # None = forward, or round-robin on a parallelism change
    key: str | None = None
    feedback: bool = False


@dataclass
class _Node:
    kind: str
    name: str
    parallelism: int
    params: dict[str, Any]
    inputs: list[_Input] = field(default_factory=list)


def _check_count(name: str, value: object, meaning: str = "") -> int:
    """`value` as an int >= 1, else a ConfigError naming `name` (and what it means)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1{meaning}, got {value!r}")
    return value


def _check_parallelism(value: object) -> int:
    return _check_count("parallelism", value)


FSYNC_MODES = ("syncfs", "per-file", "off")


def _fsync_mode(fsync: object) -> str:
    """`run(fsync=)` as the store's mode: True is "syncfs", False "off"."""
    if fsync is True:
        return "syncfs"
    if fsync is False:
        return "off"
    if isinstance(fsync, str) and fsync in FSYNC_MODES:
        return fsync
    raise ConfigError(
        f"fsync must be True, False or one of {', '.join(map(repr, FSYNC_MODES))}, got {fsync!r}"
    )


def _check_callable(what: str, fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"{what} needs a callable, got {type(fn).__name__}")


DEFAULT_CHANNEL_CAPACITY = 64
"""Batches a channel holds before its sender waits (`JobOptions::channel_capacity`)."""


class Dataflow:
    """A dataflow job under construction. `parallelism` is the default of every operator.

    channel_capacity: batches each channel between two subtasks holds before
    its sender waits (Flink's buffers per channel). In a job whose channels
    run full, it bounds the data in flight: what an aligned barrier queues
    behind, and what an unaligned checkpoint logs. Fewer batches make those
    smaller, but threads then wait on each other more: in the three-shuffle
    benchmark, 8 batches logged 11x fewer records per unaligned checkpoint
    than the default 64, and the job ran at half the speed
    (`bench/results/snapcut_overhead/README.md`)."""

    def __init__(
        self, parallelism: int = 1, channel_capacity: int = DEFAULT_CHANNEL_CAPACITY
    ) -> None:
        self.parallelism = _check_parallelism(parallelism)
        self.channel_capacity = _check_count(
            "channel_capacity",
            channel_capacity,
            " (batches each channel holds before its sender waits; "
            f"default {DEFAULT_CHANNEL_CAPACITY})",
        )
        self._nodes: list[_Node] = []
        self._names: set[str] = set()
        self._results: set[str] = set()

    # ---- graph plumbing -------------------------------------------------
    def _add(
        self,
        kind: str,
        name: str | None,
        parallelism: int | None,
        inputs: list[_Input],
        **params: Any,
    ) -> Stream:
        base = name or kind
        unique = base
        for n in itertools.count(1):
            if unique not in self._names:
                break
            if name is not None:
                raise GraphError(f"operator name {name!r} is used twice; names must be unique")
            unique = f"{base}-{n}"
        self._names.add(unique)
        p = self.parallelism if parallelism is None else _check_parallelism(parallelism)
        self._nodes.append(_Node(kind, unique, p, params, inputs))
        return Stream(self, len(self._nodes) - 1)

    # ---- sources ---------------------------------------------------------
    def generate_dwell_events(
        self,
        users: int,
        count: int,
        seed: int = 0,
        *,
        batch_size: int = 4096,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Built-in Rust generator of `(user: int64, dwell_ms: int64)` events.
        `dwell_events(users, count, seed)` returns the same records as a
        pyarrow Table, so results can be checked in plain Python."""
        for what, v in (("users", users), ("count", count), ("batch_size", batch_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if what == "count" else 1):
                raise ConfigError(f"{what} must be a positive int, got {v!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {seed!r}")
        return self._add(
            "dwell_events",
            name,
            parallelism,
            [],
            users=users,
            count=count,
            seed=seed,
            batch_size=batch_size,
        )

    def from_batches(
        self,
        data: pa.RecordBatch | pa.Table | Iterable[pa.RecordBatch],
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Batches held in memory (Rust-side while the job runs); with
        parallelism p, batch i goes to subtask i mod p."""
        if isinstance(data, pa.Table):
            batches = data.to_batches()
        elif isinstance(data, pa.RecordBatch):
            batches = [data]
        else:
            batches = list(data)
            for b in batches:
                if not isinstance(b, pa.RecordBatch):
                    raise TypeError(
                        f"from_batches takes pyarrow RecordBatches, got {type(b).__name__}"
                    )
        return self._add("batches", name, parallelism, [], batches=batches)

    def from_iterable(
        self,
        items: Iterable[Any] | Callable[[], Iterable[Any]],
        *,
        schema: pa.Schema | None = None,
        names: list[str] | None = None,
        batch_size: int = 1024,
        name: str | None = None,
        parallelism: int = 1,
    ) -> Stream:
        """A Python source of RecordBatches, dicts or tuples (tuples need
        `names` or `schema`). Pass a list, or a function returning a fresh
        iterable, so that the source can be replayed from an offset; a
        one-shot iterator is read into a list first."""
        if callable(items):
            factory: Callable[[], Iterable[Any]] = items
        else:
            if iter(items) is items:
                items = list(items)
            kept = items
            factory = lambda: kept  # noqa: E731
        if names is None and schema is not None:
            names = list(schema.names)

        def make_iter() -> Iterator[pa.RecordBatch]:
            return _to_batches(factory(), schema, names, batch_size)

        return self._add("python_source", name, parallelism, [], make_iter=make_iter)

    def from_dataset(
        self,
        source: Any,
        *,
        columns: list[str] | None = None,
        filter: Any = None,
        format: str = "parquet",
        batch_size: int = 64 * 1024,
        name: str | None = None,
        parallelism: int = 1,
    ) -> Stream:
        """A `pyarrow.dataset.Dataset`, a `pyarrow.Table` or a path/URI that
        `pyarrow.dataset.dataset` opens; scanned in a fixed order (replayable)."""
        import pyarrow.dataset as ds

        if isinstance(source, pa.Table):
            source = ds.dataset(source)
        elif not isinstance(source, ds.Dataset):
            source = ds.dataset(source, format=format)
        dataset = source

        def make_iter() -> Iterator[pa.RecordBatch]:
            return iter(
                dataset.to_batches(
                    columns=columns, filter=filter, batch_size=batch_size, use_threads=False
                )
            )

        return self._add("python_source", name, parallelism, [], make_iter=make_iter)

    # ---- multi-input -----------------------------------------------------
    def union(
        self, *streams: Stream, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """Records of every stream (schemas must match)."""
        if len(streams) < 2:
            raise GraphError("union needs at least two streams")
        for s in streams:
            self._own(s)
        return self._add("union", name, parallelism, [_Input(s._node) for s in streams])

    def iterate(
        self,
        stream: Stream,
        step: Callable[[Stream], tuple[Stream, Stream]],
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """A cyclic job (Flink's iterations): `step(loop)` builds the loop body
        from `loop` (the records entering plus those fed back) and returns
        `(feedback, output)`. Feedback records go round again; the iteration
        ends when no record is in flight in the loop and the input has ended."""
        self._own(stream)
        head = self._add("iteration_head", name or "iterate", parallelism, [_Input(stream._node)])
        feedback, output = step(head)
        self._own(feedback)
        self._own(output)
        if feedback._node <= head._node:
            raise GraphError("the feedback stream of iterate must be built from the loop stream")
        self._nodes[head._node].inputs.append(_Input(feedback._node, feedback=True))
        return output

    def _own(self, s: Stream) -> None:
        if not isinstance(s, Stream) or s._flow is not self:
            raise GraphError("a stream can only be used in the Dataflow that made it")

    # ---- run -------------------------------------------------------------
    def run(
        self,
        checkpointing: Checkpointing | None = None,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        resume: bool = False,
        restore_from: Snapshot | None = None,
        control: JobControl | None = None,
        fsync: bool | str = True,
        inject_failure: TaskFailure | None = None,
        direct_io: bool = True,
    ) -> RunReport:
        """Runs the job to completion (bounded sources); the GIL is released
        while it runs. Raises TaskError if an operator fails.

        checkpoint_dir: write checkpoints durably to this local directory (a
        `SnapshotStore`: Arrow IPC files + manifest; `Checkpointing.retained`
        are kept, savepoints always). resume: start from the newest intact
        checkpoint there if one exists (corrupt or partial ones are skipped
        with a warning naming them and why), else from the beginning.
        `Checkpointing.restart_attempts` restarts failed tasks (their region,
        or the whole job: `Checkpointing.failover`) from the last completed
        checkpoint, durable there or in memory without `checkpoint_dir`.

        fsync: a checkpoint in `checkpoint_dir` counts once its files and
        directories are durable, so it survives an OS crash or power loss.
        True (= "syncfs", on Linux 5.8+) makes them durable with one syncfs
        of the filesystem and one directory fsync, whatever the number of
        files; it also writes back other processes' dirty files there.
        "per-file" (what "syncfs" falls back to elsewhere) fsyncs every file
        and directory, one device flush each: on a slow disk, up to 10
        points more overhead at 100 ms (bench/results/store_cost/syncfs/).
        False (= "off") leaves writing them back to the OS: a checkpoint
        then survives the job's process being killed, not the machine going
        down (what Flink gives when it checkpoints to a local directory).

        direct_io: write the files in `checkpoint_dir` with direct I/O
        (`O_DIRECT`) where its filesystem takes it (elsewhere, tmpfs before Linux 6.6 say,
        through the page cache): a checkpoint's files are read again only
        by a restore or a compaction, and passing hundreds of MB a second
        through the page cache costs CPU the job feels (at 10M keys ~2.5 s
        more a run here, `bench/results/state_store/direct_io/`). The files
        are the same bytes either way, and as durable: `fsync` still applies.

        control: a `JobControl` to trigger savepoints/checkpoints or cancel
        the job from another thread while it runs.

        restore_from: a snapshot of an earlier run of the same graph (same
        operators, names, parallelism): every operator restores its state,
        every source resumes at its offset and recorded in-flight records are
        replayed, so the job finishes as if it had never stopped. Results
        collected here are those produced after the snapshot.

        inject_failure: for chaos tests, a `TaskFailure` making one subtask
        of an operator or sink fail once (a task error, not a process
        kill), so that `Checkpointing.failover` restarts what it names."""
        if checkpointing is None:
            checkpointing = Checkpointing(protocol="none")
        if not isinstance(checkpointing, Checkpointing):
            raise ConfigError(
                f"checkpointing must be a snapcut.Checkpointing, got {type(checkpointing).__name__}"
            )
        if not any(n.kind in ("collect", "write_arrow") for n in self._nodes):
            raise GraphError("the job has no sink; add .collect(name) or .write_arrow(path)")
        if not isinstance(resume, bool):
            raise ConfigError(f"resume must be a bool, got {resume!r}")
        if not isinstance(direct_io, bool):
            raise ConfigError(f"direct_io must be a bool, got {direct_io!r}")
        fsync_mode = _fsync_mode(fsync)
        root = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        if root is None and resume:
            raise ConfigError(
                "resume=True needs checkpoint_dir= "
                "(the directory checkpoints are written to and restored from)"
            )
        if root is None and fsync is not True:
            raise ConfigError(
                f"fsync={fsync!r} applies to checkpoint_dir= (how checkpoints written there "
                "are made durable); without it checkpoints stay in memory"
            )
        if root is not None and not checkpointing.enabled:
            raise ConfigError(
                "checkpoint_dir needs checkpoints: pass Checkpointing(protocol=...) "
                "with a protocol other than 'none'"
            )
        if root is not None and restore_from is not None:
            raise ConfigError(
                "restore_from and checkpoint_dir cannot be combined; use resume=True "
                "to restore from the checkpoint directory"
            )
        handle = None
        if restore_from is not None:
            if not isinstance(restore_from, Snapshot) or restore_from._handle is None:
                raise ConfigError(
                    "restore_from takes a Snapshot from RunReport.snapshots, "
                    f"got {type(restore_from).__name__}"
                )
            handle = restore_from._handle
        failure = None
        if inject_failure is not None:
            if not isinstance(inject_failure, TaskFailure):
                raise ConfigError(
                    "inject_failure takes a snapcut.TaskFailure, "
                    f"got {type(inject_failure).__name__}"
                )
            failure = inject_failure.checked()
        builder = self._build()
        delay = checkpointing.restart_delay
        delay_s = delay.total_seconds() if hasattr(delay, "total_seconds") else float(delay)
        raw = builder.run(
            checkpointing._config,
            handle,
            root,
            resume,
            checkpointing.restart_attempts,
            delay_s,
            checkpointing.failover,
            None if control is None else control._inner,
            fsync_mode,
            self.channel_capacity,
            failure,
            direct_io,
        )
        report = RunReport.from_raw(raw)
        if report.skipped:
            why = "; ".join(f"checkpoint {i}: {r}" for i, r in report.skipped)
            warnings.warn(
                f"resume skipped {len(report.skipped)} unusable checkpoint(s) in {root} "
                f"({why}); restored from "
                + (
                    f"checkpoint {report.restored_from}"
                    if report.restored_from is not None
                    else "the beginning"
                ),
                RuntimeWarning,
                stacklevel=2,
            )
        return report

    def _build(self) -> _core._GraphBuilder:
        b = _core._GraphBuilder()
        for node in self._nodes:
            _add_vertex(b, node)
        for i, node in enumerate(self._nodes):
            for inp in node.inputs:
                up = self._nodes[inp.node]
                part = inp.partitioning
                if part is None:
                    part = "forward" if up.parallelism == node.parallelism else "round_robin"
                b.connect(inp.node, i, part, inp.key, inp.feedback)
        return b


def _add_vertex(b: _core._GraphBuilder, node: _Node) -> int:
    p, n, kw = node.parallelism, node.name, node.params
    match node.kind:
        case "dwell_events":
            return b.add_dwell_events(n, p, kw["users"], kw["count"], kw["seed"], kw["batch_size"])
        case "batches":
            return b.add_batches_source(n, p, kw["batches"])
        case "python_source":
            return b.add_python_source(n, p, kw["make_iter"])
        case "map" | "filter" | "flat_map":
            return b.add_udf(n, p, node.kind, kw["fn"])
        case "process":
            return b.add_keyed_process(n, p, kw["key"], kw["fn"])
        case "aggregate":
            return b.add_aggregate(n, p, kw["key"], kw["specs"], kw["forward"])
        case "union":
            return b.add_union(n, p)
        case "iteration_head":
            return b.add_iteration_head(n, p)
        case "collect":
            return b.add_collect(n, p, kw["result"])
        case "write_arrow":
            return b.add_arrow_sink(n, p, kw["path"])
    raise AssertionError(f"unknown node kind {node.kind}")


def _to_batches(
    items: Iterable[Any], schema: pa.Schema | None, names: list[str] | None, batch_size: int
) -> Iterator[pa.RecordBatch]:
    rows: list[Any] = []

    def flush() -> pa.RecordBatch:
        if rows and isinstance(rows[0], Mapping):
            batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        else:
            if names is None:
                raise ConfigError("from_iterable of tuples needs names=[...] or schema=")
            columns: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array(c, type=schema.field(i).type if schema else None)
                    for i, c in enumerate(columns)
                ],
                names=names,
            )
        rows.clear()
        return batch

    for item in items:
        if isinstance(item, pa.RecordBatch):
            if rows:
                yield flush()
            yield item
        elif isinstance(item, pa.Table):
            if rows:
                yield flush()
            yield from item.to_batches()
        else:
            rows.append(item)
            if len(rows) >= batch_size:
                yield flush()
    if rows:
        yield flush()


class CheckpointCounts(NamedTuple):
    """A job attempt's checkpoints so far (`JobControl.checkpoints()`)."""

    started: int
    """Triggered at the sources (a trigger waiting behind one in flight
    counts once it starts)."""
    completed: int
    """Durable: committed to the snapshot store."""
    aborted: int
    """Expired, failed to write, or declined."""

    @property
    def in_flight(self) -> int:
        """Started, and neither completed nor aborted yet."""
        return self.started - self.completed - self.aborted


class JobControl:
    """Controls a running `Dataflow.run(..., control=...)` from another thread."""

    def __init__(self) -> None:
        self._inner = _core._JobControl()

    @property
    def started(self) -> bool:
        """Whether the job has started (it may have ended since)."""
        return self._inner.started

    def trigger_savepoint(self) -> None:
        """Takes a savepoint: a checkpoint that retention never removes.
        Raises ConfigError if the job has not started, has ended, or has
        checkpoints disabled."""
        self._inner.trigger_savepoint()

    def trigger_checkpoint(self) -> None:
        """Takes a checkpoint now, with or without a periodic `interval`; it
        waits behind a checkpoint still in flight, as a periodic one does.
        Raises ConfigError like `trigger_savepoint`."""
        self._inner.trigger_checkpoint()

    def cancel(self) -> None:
        """Stops the job: `run` raises TaskError("job cancelled by the user")."""
        self._inner.cancel()

    def checkpoints(self) -> CheckpointCounts:
        """The current attempt's checkpoints so far (a restart starts new
        counts); readable after the run ended. Raises ConfigError before the
        job started."""
        return CheckpointCounts(*self._inner.checkpoints())


FAILURE_POINTS = ("process", "checkpoint", "commit")


class TaskFailure(NamedTuple):
    """A failure to inject into a run (`Dataflow.run(inject_failure=...)`):
    subtask `subtask` of operator (or sink) `operator` fails once, at its
    `nth` call (from 1) of `at`: "process" (a batch), "checkpoint" (a state
    capture was taken and staged, not acknowledged: mid-checkpoint) or
    "commit" (a checkpoint completed, its output not yet published:
    mid-commit)."""

    operator: str
    subtask: int
    at: str
    nth: int

    def checked(self) -> tuple[str, int, str, int]:
        if not isinstance(self.operator, str) or not self.operator:
            raise ConfigError(f"TaskFailure.operator must be a name, got {self.operator!r}")
        for what, v, least in (("subtask", self.subtask, 0), ("nth", self.nth, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ConfigError(f"TaskFailure.{what} must be an int >= {least}, got {v!r}")
        if self.at not in FAILURE_POINTS:
            raise ConfigError(
                f"TaskFailure.at must be one of {', '.join(FAILURE_POINTS)}, got {self.at!r}"
            )
        return (self.operator, self.subtask, self.at, self.nth)


class Restart(NamedTuple):
    """One restart after a failure.

    error: the failure (task and message). restored_from: the checkpoint
    restarted from, None = from the beginning. region: the failover region
    restarted (`Checkpointing.failover` "region" or "full"), None for an
    "upstream" restart or when the whole job was rebuilt after a job-level
    failure. tasks: the restarted tasks, "vertex-subtask"; empty for a
    whole-job rebuild. scope: "region", "upstream" or "job". failed: the task
    whose failure caused it (None for a job-level failure). fallback: why an
    "upstream" failover restarted the region instead (its upstream was the
    whole job, or a task on it merges inputs), else None. at_s: when the
    failure was reported, seconds since the job started; downtime_s: from
    then to the relaunch (None for a job-level failure).
    """

    error: str
    restored_from: int | None
    region: int | None = None
    tasks: tuple[str, ...] = ()
    scope: str = "region"
    failed: str | None = None
    fallback: str | None = None
    at_s: float | None = None
    downtime_s: float | None = None


@dataclass(frozen=True)
class RunReport:
    """What a finished job leaves.

    results: collected tables by name. checkpoints: metrics of every
    checkpoint triggered, in id order (of the last attempt). snapshots: the
    completed in-memory snapshots (task states as pyarrow, channel logs,
    source offsets); empty with `checkpoint_dir` (read those with
    `snapcut.snapshots`). restored_from: the checkpoint the run started
    from (`resume`/`restore_from`), or None. skipped: (checkpoint id, reason)
    of corrupt/partial checkpoints `resume` passed over. restarts: each
    restart after a failure, in order (see `Restart`). timeline: per
    operator (by name), the records it received (a source: emitted) in each
    `timeline_bucket_s` bucket since the job started, summed over its
    subtasks — throughput over time, where a stop-the-world pause shows as
    empty buckets. replayed_dropped: per task ("vertex-subtask"), the
    records it dropped as replays of a restarted upstream
    (`Checkpointing.failover="upstream"`). task_timeline: per task, the
    records it received (a source: emitted) per `timeline_bucket_s` bucket,
    over all its incarnations (a restarted task adds to what it counted
    before it failed). spill: per task whose keyed state spills
    (`Checkpointing.state_memory`), what its table did by the task's end
    (its last incarnation): flushes, rows_flushed, bytes_flushed, merges,
    run_probes and run_hits (keys looked up in the runs, and found there),
    runs and memtable_bytes (at the end), as `StateTable.spill_stats()`.
    """

    results: dict[str, pa.Table]
    checkpoints: list[CheckpointMetrics]
    snapshots: list[Snapshot]
    protocol: str
    records_in: int
    records_out: int
    duration_s: float
    restored_from: int | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    timeline_bucket_s: float = 0.0
    timeline: dict[str, list[int]] = field(default_factory=dict)
    replayed_dropped: dict[str, int] = field(default_factory=dict)
    task_timeline: dict[str, list[int]] = field(default_factory=dict)
    spill: dict[str, dict[str, int]] = field(default_factory=dict)

    @staticmethod
    def from_raw(raw: dict[str, Any]) -> RunReport:
        return RunReport(
            results=dict(raw["results"]),
            checkpoints=[_checkpoint(c) for c in raw["checkpoints"]],
            snapshots=[_snapshot(c) for c in raw["snapshots"]],
            protocol=str(raw["protocol"]),
            records_in=int(raw["records_in"]),
            records_out=int(raw["records_out"]),
            duration_s=float(raw["duration_s"]),
            restored_from=raw.get("restored_from"),
            skipped=[(int(i), str(r)) for i, r in raw.get("skipped", [])],
            restarts=[
                Restart(str(e), c, r, tuple(str(t) for t in tasks), *rest)
                for e, c, r, tasks, *rest in raw.get("restarts", [])
            ],
            timeline_bucket_s=float(raw.get("timeline_bucket_s", 0.0)),
            timeline={str(k): [int(n) for n in v] for k, v in raw.get("timeline", {}).items()},
            replayed_dropped={str(k): int(n) for k, n in raw.get("replayed_dropped", {}).items()},
            task_timeline={
                str(k): [int(n) for n in v] for k, v in raw.get("task_timeline", {}).items()
            },
            spill={
                str(k): {str(f): int(n) for f, n in v.items()}
                for k, v in raw.get("spill", {}).items()
            },
        )

    @property
    def completed_checkpoints(self) -> list[CheckpointMetrics]:
        return [c for c in self.checkpoints if c.completed]

    @property
    def throughput(self) -> float:
        """Source records per second of wall time."""
        return self.records_in / max(self.duration_s, 1e-9)


def _checkpoint(c: dict[str, Any]) -> CheckpointMetrics:
    store = c.pop("store", None)
    if store is not None:
        store = StoreMetrics(**store | {"compaction": CompactionStats(**store["compaction"])})
    return CheckpointMetrics(**c, store=store)


def _snapshot(c: dict[str, Any]) -> Snapshot:
    tasks = {
        t["task"]: TaskState(
            task=t["task"],
            state=t["state"],
            channels=[ChannelLog(**ch) for ch in t["channels"]],
            source_offset=t["source_offset"],
            alignment_ns=t["alignment_ns"],
        )
        for t in c["tasks"]
    }
    return Snapshot(
        c["id"], c["protocol"], c["started_ms"], c["finished_ms"], tasks, _handle=c["handle"]
    )


class Stream:
    """A stream of record batches in a `Dataflow`."""

    def __init__(self, flow: Dataflow, node: int) -> None:
        self._flow = flow
        self._node = node

    @property
    def name(self) -> str:
        return self._flow._nodes[self._node].name

    def _then(
        self,
        kind: str,
        name: str | None,
        parallelism: int | None,
        inp: _Input | None = None,
        **kw: Any,
    ) -> Stream:
        return self._flow._add(kind, name, parallelism, [inp or _Input(self._node)], **kw)

    def map(
        self, fn: BatchFn, *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """`fn(batch) -> RecordBatch | Table | None`."""
        _check_callable("map", fn)
        return self._then("map", name, parallelism, fn=fn)

    def filter(
        self, fn: BatchFn, *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """`fn(batch) -> boolean mask` (pyarrow array, numpy array or list)."""
        _check_callable("filter", fn)
        return self._then("filter", name, parallelism, fn=fn)

    def flat_map(
        self, fn: BatchFn, *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """`fn(batch) -> iterable of RecordBatch`."""
        _check_callable("flat_map", fn)
        return self._then("flat_map", name, parallelism, fn=fn)

    def key_by(self, column: str) -> KeyedStream:
        """Partitions by `column`'s hash: one key always reaches one subtask."""
        if not isinstance(column, str) or not column:
            raise ConfigError(f"key_by takes a column name, got {column!r}")
        return KeyedStream(self, column)

    def union(self, *others: Stream, name: str | None = None) -> Stream:
        return self._flow.union(self, *others, name=name)

    def collect(self, name: str, *, parallelism: int | None = None) -> None:
        """Keeps the records in memory: `report.results[name]` (a pyarrow.Table)."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"collect needs a result name, got {name!r}")
        if name in self._flow._results:
            raise GraphError(f"result name {name!r} is collected twice")
        self._flow._results.add(name)
        self._then("collect", f"collect-{name}", parallelism, result=name)

    def write_arrow(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> None:
        """Writes Arrow IPC files into directory `path`, exactly once (two-phase
        commit): `part-<subtask>-<checkpoint>.arrow` appears when the
        checkpoint that ends it completes (or when the job ends). Staged files
        start with a dot, so `pyarrow.dataset.dataset(path, format="arrow")`
        and `*.arrow` globs see only committed output; a resumed run commits
        what its checkpoint staged and removes stale staged files."""
        self._then("write_arrow", name, parallelism, path=os.fspath(path))


class KeyedStream:
    """A stream partitioned by a key column."""

    def __init__(self, stream: Stream, key: str) -> None:
        self._stream = stream
        self.key = key

    def _input(self) -> _Input:
        return _Input(self._stream._node, "hash", self.key)

    def aggregate(
        self,
        *,
        name: str | None = None,
        parallelism: int | None = None,
        forward: bool = False,
        **specs: AggSpec,
    ) -> Stream:
        """Per key, built-in aggregates running in Rust: `out="count"` or
        `out=(fn, column)` with fn in count, sum, min, max, mean. Emits one
        row per key (key column first) when the input ends.

        forward=True makes it a streaming stateful stage: every input batch
        is passed on unchanged once it is folded into the keyed state
        (checkpointed like any aggregate), and nothing is emitted at the
        end; chains of these with `key_by` between them give every stage
        keyed state (the ABS paper's topology)."""
        if not isinstance(forward, bool):
            raise ConfigError(f"aggregate forward= must be a bool, got {forward!r}")
        if not specs:
            raise ConfigError("aggregate needs at least one output, e.g. count='count'")
        parsed: list[tuple[str, str, str | None]] = []
        for out, spec in specs.items():
            if spec == "count":
                parsed.append((out, "count", None))
                continue
            if (
                not isinstance(spec, tuple)
                or len(spec) != 2
                or spec[0] not in AGGREGATES
                or not isinstance(spec[1], str)
            ):
                raise ConfigError(
                    f"aggregate {out}={spec!r}: use 'count' or (fn, column) with fn one of "
                    f"{', '.join(AGGREGATES)}"
                )
            parsed.append((out, spec[0], spec[1]))
        s = self._stream
        return s._then(
            "aggregate",
            name,
            parallelism,
            self._input(),
            key=self.key,
            specs=parsed,
            forward=forward,
        )

    def process(
        self, fn: KeyedFn, *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """Keyed state in Python (Spark's applyInPandasWithState shape): per
        batch and key, `fn(key, rows, state) -> (output | None, new_state)`.
        `state` is None for a new key; returning new_state None drops it.
        State must be picklable: it is checkpointed as Arrow (key + pickle),
        incrementally: a checkpoint holds only the keys `fn` ran for since
        the previous one (a dropped key as a `__deleted` tombstone), every
        `Checkpointing.full_every`-th one every key. So mutate a key's state
        only inside its own call. Every row needs a non-null int or str key.
        Under `Checkpointing(state_memory=)` the states live pickled in a
        spilling state table: each call gets its key's state unpickled and
        its new state is pickled back after it (a state object is not the
        same object from one batch to the next, as in Spark's
        applyInPandasWithState)."""
        _check_callable("process", fn)
        s = self._stream
        return s._then("process", name, parallelism, self._input(), key=self.key, fn=fn)
