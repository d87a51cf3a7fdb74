"""Chained queries on Spark under SIGKILL: exactly once from A's input
through A's sink root, read as a stream by B, to B's output.

Each run writes a few parquet files of generated ``(user, dwell_ms, ts)``
events and runs :mod:`snapcut.jobs.spark_chain` on them in a child process:
query A (the ``keyed_state`` dwell aggregate into an ``ArrowSnapshotSink``)
and, in the same driver, query B (``readStream.format("snapcut")`` of A's
sink root → its own ``keyed_state`` aggregate → its own sink), B reading A's
batches while A commits them. The harness SIGKILLs the child's whole process
tree (Python driver, JVM, Python workers: A's and B's driver at once) at a
random moment, and restarts it, both queries resuming from their
checkpoints, until it finishes. One kill per attempt on the first
1..``max_kills`` attempts (from the seed), a random 0-1.5 s into the n-th
progress step of the attempt (a batch of A or B logged in its ``offsets/``
or ``commits/``; n from the seed), or for n = 0 0-8 s after the start. A
kill is counted by what it interrupted: ``a_only`` (A unfinished, B not
started yet), ``a_and_b``, ``b_only`` (A had consumed its input), ``neither``
(the start-up of an attempt whose A had finished before).

A query that fails only because Spark's Python worker did not connect back
within Spark's fixed 10 s (a loaded machine) is started again by the job
itself, from its checkpoint; ``query_restarts`` counts those.

The run loop, its error policy and the summary's common fields are
:mod:`snapcut.chaos.core`'s; the input, A's checks and the process-tree
handling are :mod:`snapcut.chaos.spark`'s. The checks, against pandas over
the events and Spark's own plans (its offset logs):

- A, as :func:`snapcut.chaos.spark.compare` checks the dwell query: every
  input file read by one batch, A's committed update rows per batch, its
  newest rows and its state equal pandas;
- B's plan: the A batches each B batch read (its offsets: ``(end of the
  previous batch, end]``) cover A's committed batches once, in order;
- B's update rows per B batch equal what a failure-free B commits for the A
  batches it read (computed from pandas over A's plan, not from A's output):
  ``lost`` = (B batch, user) rows missing, ``duplicated`` = rows beyond;
- B's newest row per user equals pandas: ``rows``/``count_sum``/``total_sum``
  over the update rows a failure-free A commits, ``count_max``/``total_max``
  = count and total per user over A's input (``mismatched``: users that
  differ anywhere).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from snapcut._core import ConfigError, SnapshotError
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
from snapcut.chaos.spark import (
    POLL_S,
    STARTUP_WINDOW_S,
    STEP_WINDOW_S,
    StallClock,
    _Child,
    _log_entries,
    check_sizes,
    compare,
    generate_events,
    progress,
    read_run,
    write_input,
)
from snapcut.chaos.spark_compare import expected_updates, reference, tally
from snapcut.jobs.spark_chain import A_FINISHED, B_RUNNING, RESTART_MARK
from snapcut.spark.query_checkpoint import read_offsets
from snapcut.spark.roots import PROTOCOL
from snapcut.spark.sink.root import SINK_META_FILE, SinkRoot, read_batch_output_arrow

__all__ = ["ChainOptions", "ChainSummary", "run_chain_chaos"]

KILL_KINDS = ("a_only", "a_and_b", "b_only", "neither")

#: Seconds an attempt may go without a step of its chain (two queries in one
#: driver on a loaded machine) before it is called hung; counted from the last
#: step, as `snapcut.chaos.spark.ATTEMPT_TIMEOUT_S` is.
ATTEMPT_TIMEOUT_S = 420.0

Figures = tuple[int, int, int, int, int]
"""B's row: rows, count_sum, total_sum, count_max, total_max."""
FIGURES = ("rows", "count_sum", "total_sum", "count_max", "total_max")


@dataclass
class ChainOptions:
    runs: int = 3
    seed: int = 0
    files: int = 4
    records: int = 4_000
    users: int = 200
    partitions: int = 2
    files_per_batch: int = 1
    master: str = "local[2,4]"
    max_kills: int = 2
    workdir: str | None = None
    keep: bool = False
    attempt_timeout: float = ATTEMPT_TIMEOUT_S

    def batches(self) -> int:
        """A's micro-batches in a run that never fails."""
        return math.ceil(self.files / self.files_per_batch)

    def check(self) -> None:
        check_sizes(self)
        if self.attempt_timeout <= 0:
            raise ConfigError(f"attempt_timeout must be positive, got {self.attempt_timeout!r}")


@dataclass
class ChainSummary(Summary):
    """The common summary; ``kills`` are driver-tree SIGKILLs (all timed),
    ``kill_kinds`` says which queries each one killed mid-run, ``a_batches``
    / ``b_batches`` the committed batches of the runs' A and B."""

    engine: str = "spark-chain"
    master: str = ""
    files: int = 0
    kill_kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KILL_KINDS, 0))
    timed_not_reached: int = 0
    attempts: int = 0
    query_restarts: int = 0
    """Queries the job started again after Spark's Python worker did not
    connect back in time (:data:`snapcut.jobs.spark_chain.TRANSIENT`)."""
    a_batches: int = 0
    b_batches: int = 0
    run_seconds: list[float] = field(default_factory=list)


# -- the expected output -----------------------------------------------------------


def b_plan(checkpoint: Path) -> dict[int, tuple[int, int]]:
    """B batch → the A batches it read, ``(first, last)`` (first > last: none),
    from B's offset log."""
    plan: dict[int, tuple[int, int]] = {}
    prev = -1
    for batch in sorted(_log_entries(checkpoint / "offsets")):
        sources = read_offsets(str(checkpoint), batch)["sources"]
        if len(sources) != 1 or not isinstance(sources[0], dict) or "batch_id" not in sources[0]:
            raise ChaosError(f"B's batch {batch}: expected one snapcut offset, got {sources}")
        end = int(sources[0]["batch_id"])
        plan[batch] = (prev + 1, end)
        prev = end
    return plan


def expected_b(
    a_updates: dict[tuple[int, int], tuple[int, int]], plan: dict[int, tuple[int, int]]
) -> dict[tuple[int, int], Figures]:
    """(B batch, user) → the row a failure-free B commits, from A's update rows
    (``a_updates``: (A batch, user) → running count, total)."""
    running: dict[int, Figures] = {}
    out: dict[tuple[int, int], Figures] = {}
    for batch in sorted(plan):
        first, last = plan[batch]
        for (a_batch, user), (c, t) in sorted(a_updates.items()):
            if not first <= a_batch <= last:
                continue
            n, cs, ts, cm, tm = running.get(user, (0, 0, 0, 0, 0))
            running[user] = (n + 1, cs + c, ts + t, max(cm, c), max(tm, t))
            out[(batch, user)] = running[user]
    return out


def figures(table: pa.Table) -> dict[int, list[Figures]]:
    out: dict[int, list[Figures]] = {}
    for r in table.to_pylist():
        out.setdefault(int(r["user"]), []).append(tuple(int(r[c]) for c in FIGURES))  # type: ignore[arg-type]
    return out


def check_b(
    frames: list[pd.DataFrame], a_plan: dict[int, list[int]], run_dir: Path, check: Check
) -> set[int]:
    """Reads B's plan and committed output and judges them (:func:`judge_b`)."""
    a_batches = SinkRoot(str(run_dir / "a" / "out")).backend().complete()
    plan = b_plan(run_dir / "b" / "chk")
    out = run_dir / "b" / "out"
    committed = SinkRoot(str(out)).backend().complete() if (out / SINK_META_FILE).exists() else []
    batches: dict[int, pa.Table] = {}
    for batch in committed:
        try:
            batches[batch] = read_batch_output_arrow(str(out), batch)
        except SnapshotError as e:
            check.corrupt_files.append(f"B's output of batch {batch}: {e}")
    newest = None
    if committed:
        try:
            newest = SinkRoot(str(out)).read_arrow()
        except SnapshotError as e:
            check.corrupt_files.append(f"B's newest output: {e}")
    return judge_b(frames, a_plan, a_batches, plan, batches, newest, check)


def judge_b(
    frames: list[pd.DataFrame],
    a_plan: dict[int, list[int]],
    a_batches: list[int],
    plan: dict[int, tuple[int, int]],
    batches: dict[int, pa.Table],
    newest: pa.Table | None,
    check: Check,
) -> set[int]:
    """B's plan (`plan`, against A's committed `a_batches`), its committed
    rows per batch (`batches`) and its newest rows (`newest`) against pandas
    (see the module); adds to `check`, returns the users with a wrong row."""
    a_updates = expected_updates(frames, a_plan)
    read = [a for first, last in plan.values() for a in range(first, last + 1)]
    if read != sorted(a_batches):
        check.problems.append(f"B read A's batches {read}, A committed {sorted(a_batches)}")
    if sorted(batches) != sorted(plan):
        check.problems.append(
            f"B committed batches {sorted(batches)}, Spark planned {sorted(plan)}"
        )
    want = expected_b(a_updates, plan)
    got: dict[tuple[int, int], list[Figures]] = {}
    for batch, table in batches.items():
        for user, rows in figures(table).items():
            got.setdefault((batch, user), []).extend(rows)
    tally(want, got, check, "B: ")
    bad = {user for (b, user), rows in got.items() if want.get((b, user), rows[0]) != rows[0]}
    if bad:
        check.problems.append(f"B: {len(bad)} users have a committed row unlike pandas'")
    # The newest row per user: pandas over A's input (maxima) and A's updates (sums).
    ref = reference(frames)
    sums: dict[int, Figures] = {}
    for (_, user), (c, t) in sorted(a_updates.items()):
        n, cs, ts, _, _ = sums.get(user, (0, 0, 0, 0, 0))
        sums[user] = (n + 1, cs + c, ts + t, *ref[user])
    have = figures(newest) if newest is not None else {}
    wrong = {u for u in sums.keys() | have.keys() if have.get(u) != [sums.get(u)]}
    if wrong:
        u = min(wrong)
        check.problems.append(
            f"B's newest output: {len(wrong)} users differ from pandas, e.g. user {u}: got "
            f"{have.get(u)}, expected {sums.get(u)}"
        )
    return bad | wrong


def compare_chain(frames: list[pd.DataFrame], names: list[str], run_dir: Path) -> Check:
    """A's check (:func:`snapcut.chaos.spark.compare`) plus B's."""
    a_out = read_run(run_dir / "a", names)
    check = compare(frames, a_out)
    check.problems = [f"A: {p}" for p in check.problems]
    bad_a = check.mismatched
    bad_b = check_b(frames, a_out.plan, run_dir, check)
    check.mismatched = bad_a + len(bad_b)
    return check


# -- one run -----------------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    after_steps: int
    delay: float


def plan_kill(rng: Any, opts: ChainOptions, steps_done: int) -> Kill:
    """The attempt's kill (two draws whatever it is, so a replay stays in
    step): after 0..n progress steps, n = the steps a failure-free chain has
    left at the least (A's offsets and commits of every batch, B's of one),
    so that the kill comes before the chain ends."""
    u_steps, u_delay = rng.random(), rng.random()
    remaining = max(1, 2 * opts.batches() + 2 - steps_done)
    steps = int(u_steps * remaining)
    return Kill(steps, u_delay * (STARTUP_WINDOW_S if steps == 0 else STEP_WINDOW_S))


def chain_progress(run_dir: Path) -> int:
    return progress(run_dir / "a" / "chk") + progress(run_dir / "b" / "chk")


def child_cmd(opts: ChainOptions, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snapcut.jobs.spark_chain",
        str(run_dir / "input"),
        str(run_dir),
        "--partitions",
        str(opts.partitions),
        "--files-per-batch",
        str(opts.files_per_batch),
        "--master",
        opts.master,
    ]


def run_attempt(
    opts: ChainOptions, run_dir: Path, kill: Kill | None, stderr: Path
) -> tuple[int, str | None, float]:
    """Runs the child once, killing its tree as `kill` says: (return code,
    the kill's kind if the harness killed it, seconds)."""
    (run_dir / B_RUNNING).unlink(missing_ok=True)
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    base = chain_progress(run_dir)
    child = _Child(child_cmd(opts, run_dir), env, stderr)
    stall = StallClock(opts.attempt_timeout, child.started, base)
    window: float | None = None
    killed: str | None = None
    try:
        while child.proc.poll() is None:
            now = time.monotonic()
            steps = chain_progress(run_dir)
            if stall.hung(now, steps):
                child.kill_driver()
                child.proc.wait()
                tail = stderr.read_text(errors="replace")[-2000:]
                raise ChaosError(
                    f"the chain made no progress for {opts.attempt_timeout:.0f} s; killed:\n{tail}"
                )
            child.scan()
            if kill is not None and killed is None:
                if window is None and steps - base >= kill.after_steps:
                    window = now
                if window is not None and now - window >= kill.delay:
                    b = (run_dir / B_RUNNING).exists()
                    a = not (run_dir / A_FINISHED).exists()
                    child.kill_driver()
                    killed = {(1, 1): "a_and_b", (1, 0): "a_only", (0, 1): "b_only"}.get(
                        (int(a), int(b)), "neither"
                    )
            time.sleep(POLL_S)
    finally:
        child.reap()
    return child.proc.returncode, killed, time.monotonic() - child.started


def run_one(
    opts: ChainOptions,
    run: int,
    run_dir: Path,
    summary: ChainSummary,
    log: Callable[[str], None] = lambda _: None,
) -> Check:
    """One run: input, 1..max_kills killed attempts, restarts until the chain
    finishes; then the comparison."""
    rng = run_rng(opts.seed, run)
    fresh_dir(run_dir)
    frames = generate_events(opts.files, opts.records, opts.users, rng.randrange(2**32))
    names = write_input(run_dir / "input", frames)
    planned = planned_kills(rng, opts.max_kills)
    started = time.monotonic()

    def attempt(n: int) -> Outcome:
        kill = plan_kill(rng, opts, chain_progress(run_dir)) if n < planned else None
        stderr = run_dir / f"stderr-{n}.txt"
        code, killed, seconds = run_attempt(opts, run_dir, kill, stderr)
        summary.attempts += 1
        summary.query_restarts += stderr.read_text(errors="replace").count(RESTART_MARK)
        what = (
            "no kill" if kill is None else f"kill {kill.delay:.1f} s into step {kill.after_steps}"
        )
        if code == -signal.SIGKILL and killed is not None:
            record_kill(summary, None)
            summary.kill_kinds[killed] += 1
            log(f"run {run} attempt {n} ({what}): SIGKILLed ({killed}) after {seconds:.1f} s")
            return Outcome.KILLED
        if code == -signal.SIGKILL:
            raise ChaosError(f"the chain was SIGKILLed by no one of ours; see {stderr}")
        if code != 0:
            tail = stderr.read_text(errors="replace")[-3000:]
            raise ChaosError(f"the chain exited with {code}:\n{tail}")
        if kill is not None:
            summary.timed_not_reached += 1
        log(f"run {run} attempt {n} ({what}): finished after {seconds:.1f} s")
        return Outcome.FINISHED

    restart_until_done(attempt, summary, planned=planned, spare=3, what="chain")
    summary.run_seconds.append(round(time.monotonic() - started, 1))
    if (run_dir / "a" / "out" / SINK_META_FILE).exists():
        summary.a_batches += len(SinkRoot(str(run_dir / "a" / "out")).backend().complete())
    if (run_dir / "b" / "out" / SINK_META_FILE).exists():
        summary.b_batches += len(SinkRoot(str(run_dir / "b" / "out")).backend().complete())
    return compare_chain(frames, names, run_dir)


def run_chain_chaos(
    opts: ChainOptions, log: Callable[[str], None] = lambda _: None
) -> ChainSummary:
    """Runs `opts.runs` chained chaos runs; errors are counted or raised as
    :func:`snapcut.chaos.core.fails_the_run` says."""
    opts.check()
    summary = ChainSummary(
        protocol=PROTOCOL,
        records=opts.records,
        seed=opts.seed,
        master=opts.master,
        files=opts.files,
    )
    return run_campaign(
        summary,
        opts.runs,
        lambda run, run_dir: run_one(opts, run, run_dir, summary, log),
        name="spark-chain",
        workdir=opts.workdir,
        keep=opts.keep,
        log=log,
        prefix="snapcut-spark-chain-",
    )
