"""`Checkpointing`: how a `Dataflow` takes snapshots, with Flink's names and defaults.

Types are checked here; the values are validated once, in Rust
(`CheckpointConfig::validate`), so Python and Rust can never disagree.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from snapcut import _core
from snapcut._core import ConfigError

Seconds = float | int | timedelta

PROTOCOLS = ("aligned", "unaligned", "chandy-lamport", "sync", "sync-capture", "none")
FAILOVER_STRATEGIES = ("region", "full", "upstream")


def _seconds(name: str, value: object) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigError(
            f"{name} must be seconds (int/float) or a timedelta, "
            f"got {type(value).__name__} {value!r}"
        )
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ConfigError(f"{name} must be a finite, non-negative duration, got {value!r}")
    return seconds


def _optional_seconds(name: str, value: object) -> float | None:
    return None if value is None else _seconds(name, value)


def _count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ConfigError(f"{name} must not be negative, got {value}")
    return value


def _share(name: str, value: object) -> float:
    """A number; its range is checked in Rust (`CompactionBudget::validate`)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


@dataclass(frozen=True)
class Checkpointing:
    """Checkpointing of a job (Flink's `CheckpointConfig`).

    protocol: "aligned" (ABS, Flink's default), "unaligned", "chandy-lamport",
        "sync" (the stop-the-world baseline of the ABS paper: pause the
        sources, drain, write every task's full state durably, then resume),
        "sync-capture" (pause and drain, resume once every task has captured
        its state; the store writes it in the background) or "none".
        README "Protocols" says what each does during a checkpoint.
    interval: time between checkpoints (seconds or timedelta); None = no
        periodic checkpoints (as in Flink), only the final one.
    timeout: a checkpoint running longer is aborted (Flink: 10 min).
    min_pause: least time between the end of one checkpoint and the next start.
    max_concurrent: checkpoints in flight at once (1; unaligned needs 1).
    tolerable_failures: failed checkpoints tolerated before the job fails.
    retained: completed checkpoints kept.
    alignment_timeout: with "unaligned", start aligned and switch to unaligned
        after this long (0 = unaligned from the start).
    final_checkpoint: take a checkpoint when bounded sources end.
    full_every: keyed state is checkpointed incrementally (changed keys and
        tombstones); every full_every-th checkpoint of a chain holds the full
        state, so a restore reads at most full_every files (1 = always full).
        The snapshot store (or the in-memory sink) rebuilds that full state
        from the chain at commit, off the tasks' threads: a task only ever
        captures what changed since its last checkpoint, after its first.
        A capture in which at least half the keys changed is stored as full
        state (at most twice the diff's cost; it ends the chain, so nothing
        needs rebuilding and the runs before it can be removed), and so is
        a keyed aggregate's capture once its chain's diffs would hold as
        many rows as the table (its full is a copy of its columns, cheaper
        than a compaction reading the chain back). When every
        key changed twice in a row, a keyed aggregate stops tracking
        changed keys for 1, 2, 4, then up to 8 intervals, whose captures are
        full: per-row tracking costs more than it saves on a hot key space.
        A diff is relative to the last checkpoint known to have completed,
        so with max_concurrent > 1 an aborted checkpoint never breaks a
        later one.
    compaction_cpu_share: a durable run's store merges each task's runs in
        a background thread (`docs/format.md`, runs and compaction); after
        each chunk of a merge the thread rests so that it works at most this
        share of one core's time (0.01 <= share <= 1; 1, the default: no rest), leaving
        the rest to the tasks.
    compaction_bytes_per_s: and writes at most this many bytes per second
        (None, the default: no limit). Neither ever delays a commit: a
        slower compactor leaves more runs for a restore to read.
    state_memory: bytes (an int, or a size such as "256MB", read as Spark
        reads sizes) of keyed state each keyed aggregate or keyed process
        subtask keeps in memory; past it, its rows spill to sorted runs
        (Arrow IPC files mapped back from disk) under spill_dir, and reads
        search memory, then the runs (pruned by key range and bloom
        filter). None, the default: no limit. At least 1 MiB. Checkpoints
        stay incremental (the flushed changes go into the next diff). A
        Python keyed process (`key_by().process(...)`) then keeps its
        states pickled in the table, as Spark's applyInPandasWithState
        does: each call gets its key's state unpickled, and its new state
        is pickled back after the call. docs/runtime.md, "State beyond
        memory".
    spill_dir: a local directory for state_memory's runs (each subtask
        spills into a directory of its own under it, removed when the task
        ends); default: the system temp directory.
    restart_attempts: after a task fails, restart from the last completed
        checkpoint this many times in all (Flink's fixed-delay restart
        strategy; 0 = no restarts, the default). Without checkpoints, a
        restart begins again from the start.
    restart_delay: wait before each restart (Flink: 1 s).
    failover: which tasks a failure restarts (Flink's failover strategy):
        "region" (the default) restarts only the failed task's region, the
        tasks connected to it by channels, so independent pipelines of one
        job keep running; "full" restarts every task; "upstream"
        (SeaTunnel's regional failover) restarts the failed task and its
        upstream only: the tasks downstream of that set, such as the other
        sinks of a one-source, many-sink job, keep running and drop what the
        restarted upstream replays by per-channel sequence number. It falls
        back to "region", saying why in `Restart.fallback`, when the
        upstream is the whole job or when a task on it merges several inputs
        or deals batches round-robin (its replay order is not determined).
    """

    protocol: str = "aligned"
    interval: Seconds | None = None
    timeout: Seconds = 600.0
    min_pause: Seconds = 0.0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retained: int = 1
    alignment_timeout: Seconds = 0.0
    final_checkpoint: bool = True
    full_every: int = 10
    compaction_cpu_share: float = 1.0
    compaction_bytes_per_s: int | None = None
    state_memory: int | str | None = None
    spill_dir: str | os.PathLike[str] | None = None
    restart_attempts: int = 0
    restart_delay: Seconds = 1.0
    failover: str = "region"
    _config: _core._CheckpointConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str):
            raise ConfigError(
                f"protocol must be a string (one of {', '.join(PROTOCOLS)}), "
                f"got {type(self.protocol).__name__} {self.protocol!r}"
            )
        if not isinstance(self.final_checkpoint, bool):
            raise ConfigError(f"final_checkpoint must be a bool, got {self.final_checkpoint!r}")
        config = _core.checkpoint_config(
            protocol=self.protocol,
            interval=_optional_seconds("interval", self.interval),
            timeout=_seconds("timeout", self.timeout),
            min_pause=_seconds("min_pause", self.min_pause),
            max_concurrent=_count("max_concurrent", self.max_concurrent),
            tolerable_failures=_count("tolerable_failures", self.tolerable_failures),
            retained=_count("retained", self.retained),
            alignment_timeout=_seconds("alignment_timeout", self.alignment_timeout),
            final_checkpoint=self.final_checkpoint,
            full_every=_count("full_every", self.full_every),
            compaction_cpu_share=_share("compaction_cpu_share", self.compaction_cpu_share),
            compaction_bytes_per_s=None
            if self.compaction_bytes_per_s is None
            else _count("compaction_bytes_per_s", self.compaction_bytes_per_s),
            state_memory=self.state_memory,
            spill_dir=None if self.spill_dir is None else os.fspath(self.spill_dir),
        )
        _count("restart_attempts", self.restart_attempts)
        _seconds("restart_delay", self.restart_delay)
        if self.failover not in FAILOVER_STRATEGIES:
            raise ConfigError(
                f"failover must be one of {', '.join(map(repr, FAILOVER_STRATEGIES))} "
                "(restart the failed task's region, every task, or the failed task and its "
                f"upstream), got {self.failover!r}"
            )
        object.__setattr__(self, "protocol", config.protocol)
        object.__setattr__(self, "_config", config)

    @property
    def enabled(self) -> bool:
        """Whether any checkpoint is taken."""
        return self.protocol != "none"


@dataclass(frozen=True)
class CompactionStats:
    """What a durable store's background compactor has done since the
    store opened: jobs submitted, merged (outputs written), adopted (named
    by a commit), discarded (their inputs superseded), failed and pending
    (handed over, not yet adopted or dropped); tasks refused (runs that
    cannot merge); bytes read and written; seconds working and resting
    (`Checkpointing.compaction_cpu_share`)."""

    submitted: int
    merged: int
    adopted: int
    discarded: int
    failed: int
    refused: int
    pending: int
    bytes_read: int
    bytes_written: int
    busy_s: float
    rested_s: float


@dataclass(frozen=True)
class StoreMetrics:
    """What the durable store tells of a completed checkpoint.

    bytes_written: its own files. runs_max / runs_total: the most sorted
    runs one task's state is made of, and every task's (a restore reads
    them). debt_bytes: diff runs on the tasks' fulls, what compaction
    folds. compaction: the compactor at this commit.
    """

    bytes_written: int
    runs_max: int
    runs_total: int
    debt_bytes: int
    compaction: CompactionStats


@dataclass(frozen=True)
class CheckpointMetrics:
    """One checkpoint as the runtime measured it.

    triggered_s / finished_s: since the job started; duration_s = finished -
    triggered. status: "completed" or "aborted" (abort_reason says why).
    alignment_ns: per task ("vertex-subtask"), time spent aligning barriers.
    state_bytes: Arrow memory of every captured state. logged_records /
    logged_batches: in-flight records recorded (channel state, back-edge
    logs, data overtaken by unaligned barriers). store: `StoreMetrics`.
    """

    id: int
    protocol: str
    status: str
    abort_reason: str | None
    is_final: bool
    savepoint: bool
    triggered_s: float
    finished_s: float
    duration_s: float
    alignment_ns: dict[str, int]
    state_bytes: int
    logged_records: int
    logged_batches: int
    store: StoreMetrics | None = None
    """A completed checkpoint of a durable run: its files, runs and the
    compaction (None: aborted, or checkpoints kept in memory)."""

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def max_alignment_ms(self) -> float:
        return max(self.alignment_ns.values(), default=0) / 1e6


@dataclass(frozen=True)
class ChannelLog:
    """Records a checkpoint recorded in flight on one input channel of a task
    (Chandy-Lamport channel state, a back-edge log, or unaligned overtaken data)."""

    edge: str
    input: int
    from_subtask: int
    records: Any  # pyarrow.Table


@dataclass(frozen=True)
class TaskState:
    """One task's part of a snapshot."""

    task: str
    state: Any  # pyarrow.Table | None
    channels: list[ChannelLog]
    source_offset: int | None
    alignment_ns: int


@dataclass(frozen=True)
class Snapshot:
    """A completed in-memory snapshot: every task's state, channel logs and source offsets."""

    id: int
    protocol: str
    started_ms: int
    finished_ms: int
    tasks: dict[str, TaskState]
    # The checkpoint on the Rust side, for `Dataflow.run(restore_from=...)`.
    _handle: Any = field(default=None, repr=False, compare=False)

    @property
    def source_offsets(self) -> dict[str, int]:
        return {k: t.source_offset for k, t in self.tasks.items() if t.source_offset is not None}

    @property
    def channel_logs(self) -> list[tuple[str, ChannelLog]]:
        return [(k, c) for k, t in self.tasks.items() for c in t.channels]
