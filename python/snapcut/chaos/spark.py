"""``snapcut chaos --engine spark``: exactly-once on Spark under SIGKILLs.

Each run writes a few parquet files of generated ``(user, dwell_ms, ts)``
events and runs the dwell-time query on them in a child process
(``python -m snapcut.jobs.spark_dwell ... --sink arrow``: the ``keyed_state``
aggregate per user, count/total/avg, into an ``ArrowSnapshotSink`` with
``state=``; ``availableNow``; ``--files-per-batch`` files per micro-batch),
kills it, and restarts it from its checkpointLocation until it finishes.
One kill per attempt, on the first 1..``--max-kills`` attempts (from the seed):

- ``driver_sigkill``: the harness SIGKILLs the child's whole process tree
  (Python driver, JVM, pyspark daemon and workers) at a random moment: a
  random 0-1.5 s into the n-th progress step of the attempt (a batch planned
  in Spark's offset log, or committed in its commit log; n from the seed),
  or, for n = 0, a random 0-8 s after the start (JVM start-up);
- ``driver_failpoint``: a driver crash point (``sink.before_commit``: output
  staged and state acknowledged, no manifest; ``sink.after_table_commit``,
  with a table output: the batch is in the table, no manifest;
  ``sink.after_commit``: manifest published, Spark has not committed the
  batch) SIGKILLs the driver tree;
- ``python_worker_failpoint``: a task crash point (``state.before_write``,
  ``state.after_write``, ``state.before_adopt`` — reached by a commit that
  adopts a merge a worker's compactor published —, ``state.after_ack``,
  ``sink.before_stage``,
  ``sink.after_stage``; the last two with the Arrow output only: a table
  output's update mode stages nothing) SIGKILLs the Python worker running one
  state partition's task, attempt 0: the driver lives on and Spark retries
  the task; with ``--state-memory`` also ``spill.after_run`` and
  ``spill.merged``, inside a spilling state table's flush and merge (Rust
  crash points the task arms for itself alone), and ``input.part_sent``, in
  a batch applied in parts (level 1 and transformWithState alike); and
  ``compaction.before_publish``, on the compactor thread of the worker whose
  commit handed a merge over (the merge staged, not yet published): it
  SIGKILLs that worker whatever task it runs then;
- ``executor_sigkill`` (``--master local-cluster[...]`` only): the harness
  SIGKILLs one executor JVM with its Python workers at a random moment;
  Spark re-runs its tasks elsewhere.

Crash points are armed with ``SNAPCUT_SPARK_FAILPOINTS`` for one batch (not
yet committed when the attempt starts) and partition; a point the attempt
never reaches (its batch planned differently, the attempt finished first)
kills nothing (``armed_not_hit``); likewise a timed kill whose moment comes
after the attempt ended (``timed_not_reached``).

The final committed output and state are then compared with pandas over the
same events:

- lost: (batch, user) update rows a failure-free run of the batches Spark
  planned (its offset and file-source logs) commits and the sink did not,
  plus the events of input files no batch read;
- duplicated: committed rows beyond those (a (batch, user) row twice, a
  batch Spark never planned), plus the events of files two batches read;
- mismatched: users whose row in some batch, newest committed row
  (``read_output_arrow``) or final state (``read_state_arrow``) differs from
  pandas' count, total and average.

``--session-gap SECONDS`` (levels 2 and 3): the job's function sets an
event-time timeout and closes a user's session once the watermark passes
its last event by the gap (its totals emitted once more, its state
removed); the comparison models the sessions
(:func:`snapcut.chaos.spark_compare.expected`), so the calls for timed-out
keys, in no-data batches too, are checked under the same kills.

``--state-root s3``: each run's state root is a bucket of moto's S3 server on
127.0.0.1, which the harness runs for the campaign (:mod:`snapcut.chaos.s3`);
the final state is read back from the bucket.

``--output delta|iceberg``: the sink merges the rows by user into a Delta or
Iceberg table instead of its root; the same comparison runs on the table's
rows and its history is checked for one commit per batch
(:mod:`snapcut.chaos.spark_tables`).

Every choice comes from ``--seed`` and the run number (see
:func:`snapcut.chaos.core.run_rng`), so a failing run replays its input and its
kill plan; the moment a timed kill lands within its window is wall-clock.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from snapcut import _procs as procs
from snapcut._core import ConfigError, SnapshotError, state_memory_bytes
from snapcut.chaos.core import (
    ChaosError,
    Check,
    Outcome,
    Summary,
    fresh_dir,
    planned_kills,
    record_kill,
    restart_until_done,
    run_campaign,
    run_rng,
)
from snapcut.chaos.s3 import S3Server, moto_server
from snapcut.chaos.spark_compare import (
    check_final,
    check_plan,
    check_updates,
    expected,
    output_rows,
    state_rows,
)
from snapcut.chaos.spark_tables import (
    TableRead,
    TableTarget,
    check_output,
    check_table,
    read_table_run,
)
from snapcut.jobs.spark_dwell import SESSION_DELAY_MS, SESSION_STEPS, STEPS
from snapcut.jobs.spark_session import check_remote
from snapcut.spark import committed_output, failpoints, read_output_arrow, read_state_arrow

# Not in snapcut.spark's public names: the protocol a Spark root records, the
# file a sink root starts with, and one committed batch's rows alone.
from snapcut.spark.query_checkpoint import read_offsets
from snapcut.spark.roots import PROTOCOL
from snapcut.spark.sink.root import SINK_META_FILE, read_batch_output_arrow

DRIVER_POINTS = ("sink.before_commit", "sink.after_table_commit", "sink.after_commit")
# Reached only with a table output (--output delta|iceberg).
TABLE_POINTS = ("sink.after_table_commit",)
# Not reached with a table output: its update mode (the dwell job's) takes the
# batch's rows on the driver with toArrow, no sink task stages anything.
STAGE_POINTS = ("sink.before_stage", "sink.after_stage")


KILL_MODES = ("mixed", "timer", "failpoint", "executor")


KILL_KINDS = (
    "driver_sigkill",
    "driver_failpoint",
    "python_worker_failpoint",
    "executor_sigkill",
)


#: Seconds a Spark child may go without a step of its query (a batch planned
#: or committed) before it is called hung and killed. Counted from its last
#: step, not from its start: at low priority on a loaded machine (the CI's
#: nice 10 workers beside two full-priority streams) one attempt of a small
#: query took 275 s to its third step, and the restart after it needed more
#: than 300 s more, though it never stalled. An attempt is still bounded: it
#: has finitely many steps.
ATTEMPT_TIMEOUT_S = 300.0


class StallClock:
    """Whether a child is hung: its progress has not moved for `timeout`
    seconds (the start counts as a move)."""

    def __init__(self, timeout: float, started: float, steps: int) -> None:
        self.timeout, self.moved, self.steps = timeout, started, steps

    def hung(self, now: float, steps: int) -> bool:
        if steps != self.steps:
            self.moved, self.steps = now, steps
        return now - self.moved > self.timeout


#: Timed kills: the window within a progress step, and the start-up window.
STEP_WINDOW_S = 1.5


STARTUP_WINDOW_S = 8.0


POLL_S = 0.05


TREE_SCAN_S = 0.5


STATE_ROOTS = ("local", "s3")


def check_sizes(o: Any) -> None:
    """The run sizes every Spark campaign's options share (``runs``, ``seed``,
    ``files``, ``records``, ``users``, ``partitions``, ``files_per_batch``,
    ``max_kills``): ints at least their minimum, or a ConfigError naming one."""
    for what, v, least in (
        ("runs", o.runs, 1),
        ("seed", o.seed, 0),
        ("files", o.files, 1),
        ("records", o.records, o.files),
        ("users", o.users, 1),
        ("partitions", o.partitions, 1),
        ("files_per_batch", o.files_per_batch, 1),
        ("max_kills", o.max_kills, 0),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ConfigError(f"{what} must be an int >= {least}, got {v!r}")


@dataclass
class SparkOptions:
    runs: int = 10
    seed: int = 0
    files: int = 5
    records: int = 10_000
    users: int = 200
    partitions: int = 3
    files_per_batch: int = 1
    master: str = "local[2,4]"
    remote: str | None = None
    """A local Spark Connect server (``local[N]``) in the job's process tree
    instead of a classic driver: killing the tree kills the server."""
    max_kills: int = 2
    kill_mode: str = "mixed"
    failpoints: tuple[str, ...] | None = None
    """The crash points kills choose from; None: every one the output reaches."""
    output: str = "arrow"
    """Where the sink's rows go: its root ("arrow"), a "delta" or "iceberg" table."""
    workdir: str | None = None
    keep: bool = False
    attempt_timeout: float = ATTEMPT_TIMEOUT_S
    step: str = "aggregate"
    """The job's stateful step (`STEPS`): "aggregate" (level 1), "tws" (a
    StatefulProcessor through transform_with_state_in_pandas), "map_batches"
    (level 2) or "apply_in_pandas_with_state" (level 3)."""
    session_gap: int | None = None
    """Levels 2 and 3: seconds past a user's last event after which the
    watermark closes its session (an event-time timeout: the call for the
    timed-out key emits its totals and removes its state); None: no timeout."""
    state_memory: str | None = None
    """The job's ``keyed_state(state_memory=)``, each Python worker's budget
    (None: all in memory). Small enough, the state spills mid-run, and the
    spill crash points (``spill.after_run``, ``spill.merged``) and the input
    one (``input.part_sent``) join the ones kills choose from."""
    state_root: str = "local"
    """Where the job's state root lives: "local" (the run's directory) or
    "s3" (a bucket of moto's S3 server on 127.0.0.1, one per run, started by
    the harness: files go first, the manifest last, no renames; a cold task
    reads through the run cache)."""

    def cluster(self) -> bool:
        return (self.remote or self.master).startswith("local-cluster")

    def points(self) -> tuple[str, ...]:
        if self.failpoints is not None:
            return self.failpoints
        skip = set(STAGE_POINTS if self.output != "arrow" else TABLE_POINTS)
        if self.state_memory is None:
            skip |= set(failpoints.RUST_POINTS) | set(failpoints.INPUT_POINTS)
        return tuple(p for p in failpoints.POINTS if p not in skip)

    def table(self, run_dir: Path) -> TableTarget | None:
        """The run's table (None: the rows go to the sink root)."""
        return None if self.output == "arrow" else TableTarget(self.output, run_dir / "table")

    def batches(self) -> int:
        """Micro-batches of a run that never fails."""
        return math.ceil(self.files / self.files_per_batch)

    def check(self) -> None:
        check_sizes(self)
        if self.kill_mode not in KILL_MODES:
            raise ConfigError(
                f"kill_mode must be one of {', '.join(KILL_MODES)}, got {self.kill_mode!r}"
            )
        if self.kill_mode == "executor" and not self.cluster():
            raise ConfigError(
                "executor kills need executor JVMs: use --master local-cluster[2,1,1024]"
            )
        unknown = set(self.points()) - set(failpoints.POINTS)
        if unknown:
            raise ConfigError(
                f"unknown Spark failpoints {sorted(unknown)}; known: {', '.join(failpoints.POINTS)}"
            )
        check_output(self.output)
        if self.output == "arrow" and set(TABLE_POINTS) & set(self.points()):
            raise ConfigError(
                f"{', '.join(TABLE_POINTS)} is reached with a table output only: add "
                "--output delta or --output iceberg, or leave the point out"
            )
        if self.output != "arrow" and set(STAGE_POINTS) & set(self.points()):
            raise ConfigError(
                f"{', '.join(STAGE_POINTS)} is not reached with a table output (its update "
                "mode stages no files: the driver takes the rows): leave the point out"
            )
        if self.step not in STEPS:
            raise ConfigError(f"step must be one of {', '.join(STEPS)}, got {self.step!r}")
        if self.session_gap is not None and (
            self.step not in SESSION_STEPS
            or not isinstance(self.session_gap, int)
            or isinstance(self.session_gap, bool)
            or self.session_gap < 1
        ):
            raise ConfigError(
                f"session_gap must be an int of seconds >= 1 with step "
                f"{' or '.join(SESSION_STEPS)} (a function that sets a timeout); got "
                f"{self.session_gap!r} with step {self.step}"
            )
        if self.state_root not in STATE_ROOTS:
            raise ConfigError(
                f"state_root must be one of {', '.join(STATE_ROOTS)}, got {self.state_root!r}"
            )
        if self.state_memory is not None:
            state_memory_bytes(self.state_memory)
        elif (budgeted := {*failpoints.RUST_POINTS, *failpoints.INPUT_POINTS}) & set(self.points()):
            raise ConfigError(
                f"{', '.join(sorted(budgeted))} are reached only when the state "
                "spills: add --state-memory (e.g. 2MB), or leave the points out"
            )
        if self.kill_mode in ("mixed", "failpoint") and not self.points():
            raise ConfigError("failpoint kills need at least one failpoint")
        if self.remote is not None:
            check_remote(self.remote, "snapcut chaos --engine spark", local_only=True)
        spark_master = self.remote or self.master
        task_points = [p for p in self.points() if p not in DRIVER_POINTS]
        if (
            self.kill_mode in ("mixed", "failpoint")
            and task_points
            and re.fullmatch(r"local\[(\d+|\*)\]", spark_master)
        ):
            flag = "--remote" if self.remote else "--master"
            raise ConfigError(
                f"{flag} {spark_master} tries each task once, so a killed Python worker "
                f"({', '.join(task_points)}) fails the query instead of being retried: use "
                f"{flag} {spark_master[:-1]},4] (four attempts per task)"
            )
        if self.attempt_timeout <= 0:
            raise ConfigError(f"attempt_timeout must be positive, got {self.attempt_timeout!r}")


@dataclass
class SparkSummary(Summary):
    """The local summary (same keys, same meaning) plus Spark's kill kinds.

    ``kills`` counts every kill of any kind; ``recoveries`` the restarts of
    the driver after a driver kill plus the kills of a worker or executor
    that the attempt survived (Spark retried the tasks, the batch committed).
    ``timer_kills`` are the harness's (driver tree, executor),
    ``failpoint_kills`` the crash points' (driver tree, Python worker).
    With a table output, ``table_commits`` counts its commits,
    ``table_double_commits`` those beyond one per batch and
    ``table_missing_batches`` the committed batches it lacks
    (:func:`snapcut.chaos.spark_tables.check_table`); either fails the campaign."""

    engine: str = "spark"
    master: str = ""
    remote: str | None = None
    files: int = 0
    kill_kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KILL_KINDS, 0))
    armed_not_hit: int = 0
    timed_not_reached: int = 0
    keys_timed_out: int = 0
    """Keys the step timed out in the batches the children finished (with
    ``session_gap``; a batch re-run after a kill counts again)."""
    compactions_merged: int = 0
    compactions_adopted: int = 0
    """Merges the workers' compactors made and the commits adopted, in the
    batches the children finished (their ``observedMetrics``)."""
    cold_loads: int = 0
    times_stored: int = 0
    """Tasks that opened a partition their Python worker did not hold (read
    from the root: a restart, a task that moved), and the tables of those
    opens whose time index was the one stored beside their full, not rebuilt
    from every row's time (a step with timeouts under a budget), in the
    batches the children finished."""
    attempts: int = 0
    run_seconds: list[float] = field(default_factory=list)
    output: str = "arrow"
    state_root: str = "local"
    table_commits: int = 0
    table_double_commits: int = 0
    table_missing_batches: int = 0

    @property
    def ok(self) -> bool:
        return super().ok and self.table_double_commits + self.table_missing_batches == 0


def generate_events(files: int, records: int, users: int, seed: int) -> list[pd.DataFrame]:
    """`records` events over `files` frames of (user, dwell_ms, ts); event
    time grows file by file."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(files):
        n = records // files + (1 if i < records % files else 0)
        secs = i * 60 + rng.integers(0, 60, n)
        frames.append(
            pd.DataFrame(
                {
                    "user": rng.integers(0, users, n),
                    "dwell_ms": rng.integers(1, 10_000, n),
                    "ts": pd.to_datetime(secs, unit="s", utc=True),
                }
            )
        )
    return frames


def write_input(directory: Path, frames: list[pd.DataFrame]) -> list[str]:
    """One parquet file per frame (µs timestamps: Spark 4 reads no nanos),
    modification times a second apart so the file source takes them in
    order; returns the file names, index = frame."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    base = time.time() - len(frames) - 10
    for i, frame in enumerate(frames):
        name = f"part-{i:05d}.parquet"
        tmp = directory / f".{name}.tmp"
        frame.to_parquet(tmp, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
        os.utime(tmp, (base + i, base + i))
        tmp.rename(directory / name)
        names.append(name)
    return names


@dataclass
class RunOutput:
    plan: dict[int, list[int]]
    """Batch → input file indices, as Spark planned them (its logs)."""
    batches: dict[int, pa.Table]
    """Batch → the rows the sink committed for it."""
    final: pa.Table | None
    """``read_output_arrow``: the newest committed row per user."""
    state: pa.Table | None
    """``read_state_arrow``: the newest committed state."""
    unreadable: list[str] = field(default_factory=list)
    table: TableRead | None = None
    """A table output's history and the batches committed to it."""


def _log_entries(directory: Path) -> dict[int, Path]:
    """Spark metadata log files (``N`` or ``N.compact``) by id."""
    if not directory.is_dir():
        return {}
    out = {}
    for p in directory.iterdir():
        stem = p.name.removesuffix(".compact")
        if stem.isdigit():
            out[int(stem)] = p
    return out


def source_files(checkpoint: Path) -> dict[int, list[str]]:
    """The file source's log (``sources/0``): its batch id → file names."""
    out: dict[int, list[str]] = {}
    for path in _log_entries(checkpoint / "sources" / "0").values():
        for line in path.read_text().splitlines()[1:]:
            entry = json.loads(line)
            name = entry["path"].rsplit("/", 1)[-1]
            files = out.setdefault(int(entry["batchId"]), [])
            if name not in files:
                files.append(name)
    return out


def read_plan(checkpoint: Path, names: list[str]) -> dict[int, list[int]]:
    """Which input files each micro-batch read: batch N covers the file
    source's log entries after batch N-1's ``logOffset`` up to its own (a
    second source reading the same files at the same offset counts once)."""
    logged = source_files(checkpoint)
    plan: dict[int, list[int]] = {}
    prev = -1
    for batch in sorted(_log_entries(checkpoint / "offsets")):
        sources = read_offsets(str(checkpoint), batch)["sources"]
        # With an event-time timeout the step's no-data companion reads the
        # same files as a second source (snapcut.spark.no_data): one offset.
        if not sources or any(not isinstance(s, dict) or s != sources[0] for s in sources):
            raise ChaosError(f"batch {batch}: expected one file source offset, got {sources}")
        offset = int(sources[0]["logOffset"])
        files = [f for b in range(prev + 1, offset + 1) for f in logged.get(b, [])]
        unknown = [f for f in files if f not in names]
        if unknown:
            raise ChaosError(f"batch {batch} read files that are not inputs: {unknown}")
        plan[batch] = [names.index(f) for f in files]
        prev = offset
    return plan


def spark_commits(checkpoint: Path) -> int:
    """Batches Spark committed (its ``commits`` log)."""
    return len(_log_entries(checkpoint / "commits"))


def progress(checkpoint: Path) -> int:
    """Steps of a query so far: batches planned plus batches committed."""
    return len(_log_entries(checkpoint / "offsets")) + spark_commits(checkpoint)


def read_run(
    run_dir: Path,
    names: list[str],
    step: str = "aggregate",
    table: TableTarget | None = None,
    state: str | None = None,
) -> RunOutput:
    """Spark's plan, the sink's committed batches (from its root, or its
    `table`) and the final state of a run of the job's `step` (its state
    root `state`, default the run's ``state`` directory)."""
    out = RunOutput(read_plan(run_dir / "chk", names), {}, None, None)
    sink = run_dir / "out"
    if table is not None:
        done = set(_log_entries(run_dir / "chk" / "commits"))
        run = read_table_run(table, sink, done)
        out.batches, out.final, out.table = run.batches, run.final, run.read
    elif (sink / SINK_META_FILE).exists():
        for manifest in committed_output(str(sink)):
            batch = int(manifest["checkpoint_id"])
            try:
                out.batches[batch] = read_batch_output_arrow(str(sink), batch)
            except SnapshotError as e:
                out.unreadable.append(f"output of batch {batch}: {e}")
        try:
            out.final = read_output_arrow(str(sink))
        except SnapshotError as e:
            out.unreadable.append(f"read_output_arrow: {e}")
    try:
        # A transformWithState root: the per-user totals are its "totals" variable.
        variable = "totals" if step == "tws" else None
        out.state = read_state_arrow(state or str(run_dir / "state"), variable=variable)
    except SnapshotError as e:
        out.unreadable.append(f"read_state_arrow: {e}")
    return out


def compare(frames: list[pd.DataFrame], out: RunOutput, gap_ms: int | None = None) -> Check:
    """A run's committed output and state against pandas over its events
    (with sessions that close `gap_ms` after a user's last event, if set)."""
    check = Check(corrupt_files=list(out.unreadable))
    check_plan(frames, out.plan, check)
    want = expected(frames, out.plan, gap_ms, SESSION_DELAY_MS)
    bad = check_updates(want.updates, out.batches, check)
    bad |= check_final("newest committed output", output_rows(out.final), want.newest, check)
    bad |= check_final("final state", state_rows(out.state), want.state, check)
    check.mismatched = len(bad)
    if out.unreadable:
        check.problems.append(f"unreadable committed data: {out.unreadable}")
    return check


@dataclass(frozen=True)
class KillPlan:
    """The kill of one attempt."""

    kind: str
    """"driver" or "executor" (timed, by the harness) or "failpoint"."""
    failpoint: str | None = None
    """``SNAPCUT_SPARK_FAILPOINTS`` for a failpoint kill."""
    after_steps: int = 0
    """Timed kills: progress steps of the attempt before the window opens."""
    delay: float = 0.0
    """Timed kills: seconds into the window."""
    pick: float = 0.0
    """Executor kills: which executor, as a fraction of the sorted list."""


def kill_kinds(opts: SparkOptions) -> list[str]:
    if opts.kill_mode == "timer":
        return ["driver"]
    if opts.kill_mode == "failpoint":
        return ["failpoint"]
    if opts.kill_mode == "executor":
        return ["executor"]
    return ["driver", "failpoint", *(["executor"] if opts.cluster() else [])]


def plan_kill(rng: random.Random, opts: SparkOptions, committed: int) -> KillPlan:
    """One attempt's kill, drawn from `rng` (seven draws whatever the kind,
    so a replay stays in step). `committed`: batches Spark committed before
    the attempt; crash points aim at a batch after those."""
    u_kind, u_point, u_batch, u_part, u_steps, u_delay, u_pick = (rng.random() for _ in range(7))
    kinds = kill_kinds(opts)
    kind = kinds[int(u_kind * len(kinds))]
    remaining = max(1, opts.batches() - committed)
    if kind == "failpoint":
        points = opts.points()
        point = points[int(u_point * len(points))]
        batch = committed + int(u_batch * remaining)
        partition = 0 if point in DRIVER_POINTS else int(u_part * opts.partitions)
        return KillPlan(kind, failpoint=f"{point}:{batch}:{partition}:kill:0")
    steps = int(u_steps * 2 * remaining)
    if kind == "executor":
        steps = max(1, steps)  # executors register after the driver is up
    window = STARTUP_WINDOW_S if steps == 0 else STEP_WINDOW_S
    return KillPlan(kind, after_steps=steps, delay=u_delay * window, pick=u_pick)


@dataclass
class Attempt:
    returncode: int
    killed_by: str | None
    """"driver" or "executor" when the harness killed, else None."""
    hits: list[dict[str, Any]]
    """Crash points hit during the attempt (the failpoint log)."""
    seconds: float


def child_cmd(opts: SparkOptions, run_dir: Path, state: str | None = None) -> list[str]:
    """The job's command line; `state`: its state root (default the run's
    ``state`` directory)."""
    table = opts.table(run_dir)
    return [
        sys.executable,
        "-m",
        "snapcut.jobs.spark_dwell",
        str(run_dir / "input"),
        state or str(run_dir / "state"),
        str(run_dir / "chk"),
        str(run_dir / "out"),
        "--sink",
        "arrow",
        "--partitions",
        str(opts.partitions),
        "--files-per-batch",
        str(opts.files_per_batch),
        "--step",
        opts.step,
        *(["--master", opts.master] if opts.remote is None else ["--remote", opts.remote]),
        *([] if table is None else table.child_args()),
        *([] if opts.state_memory is None else ["--state-memory", opts.state_memory]),
        *([] if opts.session_gap is None else ["--session-gap", str(opts.session_gap)]),
        "--metrics-log",
        str(run_dir / METRICS_LOG),
    ]


#: The child's step figures, a JSON line per micro-batch it finished (over all
#: attempts: a batch re-run after a kill appears again).
METRICS_LOG = "metrics.jsonl"


def count_step_figures(run_dir: Path, summary: SparkSummary) -> None:
    """Adds the run's spill flushes and merges, its timed-out keys, its
    compactions and its cold loads (every attempt's finished batches, from the
    child's metrics log) to the summary."""
    log = run_dir / METRICS_LOG
    if not log.exists():
        return
    for line in log.read_text().splitlines():
        figures = json.loads(line)
        summary.spill_flushes += int(figures.get("state_flushes", 0))
        summary.spill_merges += int(figures.get("state_merges", 0))
        summary.keys_timed_out += int(figures.get("keys_timed_out", 0))
        summary.compactions_merged += int(figures.get("state_compactions_merged", 0))
        summary.compactions_adopted += int(figures.get("state_compactions_adopted", 0))
        summary.cold_loads += int(figures.get("state_cache_misses", 0))
        summary.times_stored += int(figures.get("state_times_stored", 0))


def child_env(kill: KillPlan | None, hit_log: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.pop(failpoints.ENV, None)
    env[failpoints.LOG_ENV] = str(hit_log)
    if kill is not None and kill.failpoint is not None:
        env[failpoints.ENV] = kill.failpoint
    return env


def read_hits(hit_log: Path, skip: int) -> list[dict[str, Any]]:
    """Crash points logged after the first `skip` lines."""
    if not hit_log.exists():
        return []
    lines = hit_log.read_text().splitlines()[skip:]
    return [json.loads(ln) for ln in lines if ln.strip()]


class _Child:
    """A running child and every process it started (remembered, so that
    what outlives a killed driver can be killed too)."""

    def __init__(self, cmd: list[str], env: dict[str, str], stderr: Path) -> None:
        with stderr.open("wb") as err:  # a file: an unread pipe blocks Spark's logging
            # A process group of its own (kill_tree kills it whole), in this
            # session: the child keeps this process's scheduling (nice, and the
            # session's autogroup), where a new session would escape it.
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                process_group=0,
            )
        self.started = time.monotonic()
        self.seen: dict[tuple[int, int], procs.Proc] = {}
        self._scanned = 0.0

    def scan(self) -> None:
        now = time.monotonic()
        if now - self._scanned >= TREE_SCAN_S:
            self.seen.update({(p.pid, p.start): p for p in procs.tree(self.proc.pid)})
            self._scanned = now

    def kill_driver(self) -> None:
        self.scan()
        procs.kill_tree(self.proc.pid)

    def kill_executor(self, pick: float) -> bool:
        execs = sorted(procs.executors(self.proc.pid), key=lambda p: p.pid)
        if not execs:
            return False
        victim = execs[int(pick * len(execs))]
        procs.kill(procs.tree(victim.pid))
        return True

    def reap(self) -> None:
        """Kills whatever of the child's processes outlived it."""
        left = [p for p in self.seen.values() if procs.alive(p)]
        procs.kill(left)
        procs.wait_gone(left)


def run_attempt(
    cmd: list[str],
    env: dict[str, str],
    kill: KillPlan | None,
    checkpoint: Path,
    stderr: Path,
    timeout: float,
) -> Attempt:
    """Runs the query once; a timed `kill` is done here, a failpoint kill by the child."""
    base = progress(checkpoint)
    child = _Child(cmd, env, stderr)
    stall = StallClock(timeout, child.started, base)
    timed = kill is not None and kill.kind in ("driver", "executor")
    window: float | None = None
    killed_by = None
    try:
        while child.proc.poll() is None:
            now = time.monotonic()
            steps = progress(checkpoint)
            if stall.hung(now, steps):
                child.kill_driver()
                child.proc.wait()
                tail = stderr.read_text(errors="replace")[-2000:]
                raise ChaosError(
                    f"the Spark child made no progress for {timeout:.0f} s; killed:\n{tail}"
                )
            child.scan()
            if timed and killed_by is None and kill is not None:
                if window is None and steps - base >= kill.after_steps:
                    window = now
                if window is not None and now - window >= kill.delay:
                    if kill.kind == "driver":
                        child.kill_driver()
                        killed_by = "driver"
                    elif child.kill_executor(kill.pick):
                        killed_by = "executor"
            time.sleep(POLL_S)
    finally:
        child.reap()
    return Attempt(child.proc.returncode, killed_by, [], time.monotonic() - child.started)


def _count_kill(summary: SparkSummary, kind: str, point: str | None = None) -> None:
    record_kill(summary, point)
    summary.kill_kinds[kind] += 1


def describe(kill: KillPlan | None) -> str:
    if kill is None:
        return "no kill"
    if kill.failpoint is not None:
        return f"armed {kill.failpoint}"
    return f"{kill.kind} kill {kill.delay:.1f} s into progress step {kill.after_steps}"


def classify(
    a: Attempt, kill: KillPlan | None, summary: SparkSummary, stderr: Path
) -> tuple[bool, str]:
    """Counts what happened to one attempt: (whether the driver was killed,
    so the query must be restarted; what happened, for the log)."""
    killers = [h for h in a.hits if h["action"] == "kill"]
    if a.returncode == -signal.SIGKILL:
        if a.killed_by == "driver":
            _count_kill(summary, "driver_sigkill")
            return True, "driver tree SIGKILLed"
        driver_hits = [h for h in killers if h["where"] == "driver"]
        if driver_hits:
            _count_kill(summary, "driver_failpoint", driver_hits[0]["point"])
            return True, f"driver killed itself at {driver_hits[0]['point']}"
        raise ChaosError(f"the Spark child was SIGKILLed by no one of ours; see {stderr}")
    if a.returncode != 0:
        tail = stderr.read_text(errors="replace")[-3000:]
        raise ChaosError(f"the Spark child exited with {a.returncode}:\n{tail}")
    notes = []
    for h in killers:
        _count_kill(summary, "python_worker_failpoint", h["point"])
        summary.recoveries += 1
        notes.append(f"Python worker killed at {h['point']} (task retried)")
    if a.killed_by == "executor":
        _count_kill(summary, "executor_sigkill")
        summary.recoveries += 1
        notes.append("an executor SIGKILLed (its tasks re-ran)")
    if kill is not None and kill.kind == "failpoint" and not killers:
        summary.armed_not_hit += 1
        notes.append("the crash point was not reached")
    if kill is not None and kill.kind in ("driver", "executor") and a.killed_by != "executor":
        summary.timed_not_reached += 1  # (or the driver finished as it was killed)
        notes.append("finished before the kill")
    return False, "finished" + (f": {'; '.join(notes)}" if notes else "")


def run_one(
    opts: SparkOptions,
    run: int,
    run_dir: Path,
    summary: SparkSummary,
    log: Callable[[str], None] = lambda _: None,
    s3: S3Server | None = None,
) -> Check:
    """One run: input, 1..max_kills killed attempts, restarts until the query
    finishes; then the comparison. `s3`: the server whose new bucket holds
    the run's state root (``state_root="s3"``)."""
    rng = run_rng(opts.seed, run)
    fresh_dir(run_dir)
    state = None if s3 is None else s3.uri(f"{s3.bucket('chaos')}/state")
    frames = generate_events(opts.files, opts.records, opts.users, rng.randrange(2**32))
    names = write_input(run_dir / "input", frames)
    table = opts.table(run_dir)
    if table is not None:
        table.prepare()
    planned = planned_kills(rng, opts.max_kills)
    hit_log = run_dir / "failpoints.jsonl"
    started = time.monotonic()
    committed = 0  # batches Spark had committed when the last attempt started

    def attempt(n: int) -> Outcome:
        nonlocal committed
        committed = spark_commits(run_dir / "chk")
        kill = plan_kill(rng, opts, committed) if n < planned else None
        skip = len(read_hits(hit_log, 0))
        stderr = run_dir / f"stderr-{n}.txt"
        a = run_attempt(
            child_cmd(opts, run_dir, state),
            child_env(kill, hit_log),
            kill,
            run_dir / "chk",
            stderr,
            opts.attempt_timeout,
        )
        a.hits = read_hits(hit_log, skip)
        summary.attempts += 1
        restart, what = classify(a, kill, summary, stderr)
        log(f"run {run} attempt {n} ({describe(kill)}): {what} after {a.seconds:.1f} s")
        return Outcome.KILLED if restart else Outcome.FINISHED

    attempts = restart_until_done(attempt, summary, planned=planned, spare=3, what="query")
    if attempts > 1 and committed > 0:
        summary.restored += 1
    summary.run_seconds.append(round(time.monotonic() - started, 1))
    count_step_figures(run_dir, summary)
    out = read_run(run_dir, names, opts.step, table, state)
    gap_ms = None if opts.session_gap is None else opts.session_gap * 1000
    check = compare(frames, out, gap_ms)
    if out.table is not None:
        facts = check_table(out.table, check)
        summary.table_commits += facts.commits
        summary.table_double_commits += facts.double_commits
        summary.table_missing_batches += facts.missing_batches
    return check


def run_spark_chaos(
    opts: SparkOptions, log: Callable[[str], None] = lambda _: None
) -> SparkSummary:
    """Runs `opts.runs` chaos runs on Spark; an error of a run is counted or
    raised as :func:`snapcut.chaos.core.fails_the_run` says (a query that
    fails other than by an injected kill is a failed run)."""
    opts.check()
    summary = SparkSummary(
        protocol=PROTOCOL,
        records=opts.records,
        seed=opts.seed,
        master=opts.master,
        remote=opts.remote,
        files=opts.files,
        output=opts.output,
        state_root=opts.state_root,
    )
    with contextlib.ExitStack() as stack:
        # One server for the campaign, in this process: kills of the job's
        # tree never reach it. Its AWS variables reach the job through the
        # environment (child_env), and Spark's Python workers by inheritance.
        s3 = stack.enter_context(moto_server()) if opts.state_root == "s3" else None
        return run_campaign(
            summary,
            opts.runs,
            lambda run, run_dir: run_one(opts, run, run_dir, summary, log, s3),
            name="spark",
            workdir=opts.workdir,
            keep=opts.keep,
            log=log,
            prefix="snapcut-spark-chaos-",
        )
