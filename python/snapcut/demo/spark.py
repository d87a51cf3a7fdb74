"""`snapcut demo` (engine spark): the dwell-time pipeline on local Spark,
killed midway and restarted, checked against pandas.

1. A generator thread writes `(user, dwell_ms, ts)` parquet files into
   ``<dir>/events`` while the query runs.
2. The query (``python -m snapcut.jobs.spark_dwell``, a child process: its
   own driver JVM, ``local[2]``) reads them one file per micro-batch, keeps
   per-user count, total and average in ``keyed_state`` (Rust state,
   snapshotted per batch under ``<dir>/state``) and writes each batch with
   ``ArrowSnapshotSink`` under ``<dir>/output``: one global snapshot of state
   diffs, output files and Spark's offsets per batch.
3. Once a few batches are committed the demo SIGKILLs the driver's whole
   process group (JVM and Python workers), then restarts the query from its
   ``checkpointLocation`` to the end of the input.
4. Every user's count, total and average in the committed output and in the
   state are compared with pandas on the same events; a table of the
   micro-batches says what each wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from snapcut._core import ConfigError, SnapcutError
from snapcut.jobs.spark_session import check_remote

if TYPE_CHECKING:
    import pandas as pd  # the `spark` extra: imported where used, so `snapcut --help` works without


#: The child's query (see snapcut.jobs.spark_dwell): 3 state partitions, a full every 3 batches.
PARTITIONS = 3


@dataclass
class DemoPaths:
    base: Path

    @property
    def events(self) -> Path:
        return self.base / "events"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def output(self) -> Path:
        return self.base / "output"

    @property
    def checkpoint(self) -> Path:
        return self.base / "spark-checkpoint"

    @property
    def logs(self) -> Path:
        return self.base / "logs"


@dataclass
class Phases:
    """Wall-clock seconds of each phase, in order."""

    seconds: dict[str, float] = field(default_factory=dict)
    _t: float = field(default_factory=time.perf_counter)

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self._t
        self._t = now


def event_frames(files: int, rows: int, users: int, seed: int) -> list[pd.DataFrame]:
    """`files` frames of (user, dwell_ms, ts); event time grows file by file."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    out = []
    for i in range(files):
        user = rng.integers(0, users, rows)
        dwell = rng.integers(1, 10_000, rows)
        secs = 1_700_000_000 + i * 60 + rng.integers(0, 60, rows)
        ts = pd.to_datetime(secs, unit="s", utc=True)
        out.append(pd.DataFrame({"user": user, "dwell_ms": dwell, "ts": ts}))
    return out


def write_event_file(directory: Path, i: int, frame: pd.DataFrame) -> None:
    """Written under a hidden name, then renamed: the file source never sees half a file."""
    tmp = directory / f".part-{i:05d}.parquet.tmp"
    frame.to_parquet(tmp, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
    tmp.rename(directory / f"part-{i:05d}.parquet")


class Generator(threading.Thread):
    """Writes the event files one by one, `every` seconds apart."""

    def __init__(self, directory: Path, frames: list[pd.DataFrame], every: float) -> None:
        super().__init__(name="snapcut-demo-generator", daemon=True)
        self.directory, self.frames, self.every = directory, frames, every
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i, frame in enumerate(self.frames):
                write_event_file(self.directory, i, frame)
                time.sleep(self.every)
        except BaseException as e:  # reported by the main thread
            self.error = e


def start_query(
    paths: DemoPaths, trigger: str, attempt: int, remote: str | None = None
) -> subprocess.Popen[bytes]:
    """The query in its own process group, so one SIGKILL takes the driver
    JVM and its Python workers down together. Its output goes to a file (an
    unread pipe would block Spark's logging)."""
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    log = open(paths.logs / f"query-{attempt}.log", "wb")  # noqa: SIM115 (owned by the child)
    cmd = [
        sys.executable,
        "-m",
        "snapcut.jobs.spark_dwell",
        str(paths.events),
        str(paths.state),
        str(paths.checkpoint),
        str(paths.output),
        "--sink",
        "arrow",
        "--partitions",
        str(PARTITIONS),
        "--trigger",
        trigger,
        *([] if remote is None else ["--remote", remote]),
    ]
    # Its own process group (kill_group), in this session: it keeps this
    # process's scheduling (nice, the session's autogroup).
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, process_group=0
    )


def committed(paths: DemoPaths) -> list[int]:
    """Batch ids the sink committed (its manifests)."""
    return sorted(
        int(p.parent.name.split("-")[1]) for p in paths.output.glob("chk-*/manifest.json")
    )


def wait_until(cond: Any, child: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if child.poll() is not None:
            raise SnapcutError(f"the query exited with code {child.returncode} before {what}")
        if time.monotonic() > deadline:
            raise SnapcutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def kill_group(child: subprocess.Popen[bytes]) -> None:
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def expected_per_user(frames: list[pd.DataFrame]) -> pd.DataFrame:
    import pandas as pd

    events = pd.concat(frames, ignore_index=True)
    g = events.groupby("user")["dwell_ms"].agg(["count", "sum", "mean"])
    return g.rename(columns={"sum": "total", "mean": "avg"})


def compare(output: pa.Table, expected: pd.DataFrame) -> list[str]:
    """Problems between the committed output (newest row per user) and
    pandas; empty when every user's count, total and average match."""
    got = output.to_pandas().set_index("user").sort_index()
    problems = []
    if got.index.has_duplicates:
        doubled = sorted(set(got.index[got.index.duplicated()]))
        problems.append(f"users {doubled[:5]} have more than one row in the committed output")
        got = got[~got.index.duplicated(keep="last")]
    missing = expected.index.difference(got.index)
    extra = got.index.difference(expected.index)
    problems += [f"user {u}: missing from the output" for u in missing[:5]]
    problems += [f"user {u}: in the output, not in the events" for u in extra[:5]]
    common = expected.index.intersection(got.index)
    for u in common:
        e, g = expected.loc[u], got.loc[u]
        if (int(g["count"]), int(g["total"])) != (int(e["count"]), int(e["total"])) or not (
            abs(float(g["avg"]) - float(e["avg"])) <= 1e-9 * max(1.0, abs(float(e["avg"])))
        ):
            problems.append(
                f"user {u}: got count {g['count']}, total {g['total']}, avg {g['avg']}; "
                f"pandas says {e['count']}, {e['total']}, {e['avg']}"
            )
    return problems


def batch_rows(paths: DemoPaths, restart_ms: int) -> list[tuple[str, ...]]:
    """One row per committed micro-batch, from the state's and the sink's
    manifests; a batch that started before the restart and committed after
    it was interrupted by the kill and re-run."""
    rows: list[tuple[str, ...]] = []
    for b in committed(paths):
        sink = json.loads((paths.output / f"chk-{b:08d}" / "manifest.json").read_text())
        state_path = paths.state / f"chk-{b:08d}" / "manifest.json"
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        spark = state.get("spark", {})
        kinds = sorted({f.get("kind", "") for f in state.get("files", []) if f["role"] == "state"})
        took = (int(sink["finished_ms"]) - int(state.get("started_ms", sink["started_ms"]))) / 1e3
        rows.append(
            (
                str(b),
                f"{spark.get('rows_in', 0):,}",
                f"{sink['output']['rows']:,}",
                f"{took:.2f}",
                f"{spark.get('state_bytes', 0) / 1024:,.0f} KiB",
                "+".join(kinds),
                f"{spark.get('write_ms', 0):.0f}",
                "killed mid-batch, re-run"
                if int(state.get("started_ms", 0)) < restart_ms < int(sink["finished_ms"])
                else "",
            )
        )
    return rows


def run_demo(args: argparse.Namespace) -> int:
    from snapcut._console import Out
    from snapcut.spark.sink.root import read_output_arrow
    from snapcut.spark.state.read import read_state_arrow

    out = Out()
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ConfigError("Spark needs Java 17: install it (e.g. apt install openjdk-17-jre)")
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            "the Spark demo needs pyspark: run bash scripts/setup.sh, or pip install "
            "'snapcut[spark]' (or run the local-runtime demo: snapcut demo --engine local)"
        ) from e
    if args.kill_after >= args.files:
        raise ConfigError(f"--kill-after ({args.kill_after}) must be below --files ({args.files})")
    if args.remote is not None:
        check_remote(args.remote, "snapcut demo", local_only=True)
    paths = DemoPaths(Path(args.dir).resolve())
    if paths.base.exists():
        out.line(f"removing the previous demo's {paths.base}")
        shutil.rmtree(paths.base)
    for d in (paths.events, paths.logs):
        d.mkdir(parents=True)
    phases = Phases()
    frames = event_frames(args.files, args.rows, args.users, args.seed)
    where = "local[2]" if args.remote is None else f"Connect ({args.remote})"
    out.line(
        f"dwell-time pipeline on Spark {where}: {args.files} files x {args.rows:,} events, "
        f"{args.users:,} users, one file per micro-batch (the restart may fold two into one), "
        f"{PARTITIONS} state partitions"
    )
    generator = Generator(paths.events, frames, args.every)
    generator.start()
    first = start_query(paths, "1 second", attempt=1, remote=args.remote)
    out.line(f"query started (pid {first.pid}); Spark's start-up takes ~10 s of the run")
    try:
        wait_until(lambda: committed(paths), first, 180, "its first micro-batch")
        phases.mark("Spark start-up + first batch")
        enough = lambda: len(committed(paths)) >= args.kill_after  # noqa: E731
        wait_until(enough, first, 180, "the batches to kill after")
        phases.mark(f"batches up to {args.kill_after - 1}")
    except BaseException:
        kill_group(first)
        raise
    before = committed(paths)
    kill_group(first)
    out.line(
        f"SIGKILLed the Spark driver's process group after batches {before} were committed "
        f"(the JVM and its Python workers; nothing shut down cleanly)"
    )
    generator.join()
    if generator.error is not None:
        raise generator.error
    phases.mark("rest of the input arrives")
    restart_ms = int(time.time() * 1000)
    second = start_query(paths, "available-now", attempt=2, remote=args.remote)
    out.line("restarted the query from its checkpointLocation, to the end of the input")
    code = second.wait(timeout=300)
    if code != 0:
        raise SnapcutError(f"the restarted query exited with code {code}: see {paths.logs}")
    phases.mark("restart: Spark start-up + remaining batches")

    expected = expected_per_user(frames)
    output = read_output_arrow(str(paths.output))
    state = read_state_arrow(str(paths.state))
    problems = compare(output, expected)
    state_problems = compare(
        state.select(["user", "count", "total", "avg"])
        if "avg" in state.column_names
        else _state_as_output(state),
        expected,
    )
    phases.mark("check against pandas")

    out.line()
    out.table(
        ("batch", "rows in", "rows out", "batch s", "state", "kind", "state write ms", ""),
        batch_rows(paths, restart_ms),
        right=(0, 1, 2, 3, 4, 6),
        title="micro-batches (each one global snapshot: state diffs + output + Spark offsets)",
    )
    out.line()
    out.table(
        ("phase", "seconds"),
        [(k, f"{v:.1f}") for k, v in phases.seconds.items()],
        right=(1,),
        title="where the time went",
    )
    out.line()
    n = len(expected)
    if problems or state_problems:
        out.line(f"MISMATCH with pandas ({len(problems) + len(state_problems)} problems):")
        for p in (problems + state_problems)[:10]:
            out.line(f"  {p}")
        return 1
    out.line(
        f"verified: all {n:,} users' count, total and average in the committed output and in "
        f"the state equal pandas on the same {args.files * args.rows:,} events, despite the kill"
    )
    out.line(f"snapshots: state {paths.state}, output {paths.output}")
    out.line(f"inspect them: snapcut snapshots list {paths.output}")
    return 0


def _state_as_output(state: pa.Table) -> pa.Table:
    """The state table's mean is kept as sum and count (``avg__sum``, ``avg__count``)."""
    avg = pa.compute.divide(pa.compute.cast(state["avg__sum"], pa.float64()), state["avg__count"])
    cols = {"user": state["user"], "count": state["count"], "total": state["total"]}
    return pa.table({**cols, "avg": avg})
