"""`snapcut chaos --topology fan-out`: one source, a keyed stateful stage and
four sinks of three kinds (:mod:`snapcut.jobs.local_fan_out`); each run
makes one sink subtask fail once, a task error at a seeded moment: on a
batch, mid-checkpoint (its state captured and staged, not acknowledged) or
mid-commit (its checkpoint complete, its output not published). The
failover strategy (``--failover``, default ``upstream``) decides what
restarts. With ``--process-kills`` the job's whole process is also
SIGKILLed (at a random moment or a crash point) and resumed from its
checkpoint, to show that the two recoveries compose.

Every sink's output is compared with a failure-free computation:

- lost / duplicated: event records missing from, or extra in, the
  two-phase-commit Arrow sink and the in-memory sink (as multisets), and
  event ids missing from the idempotent sink (an upsert by id absorbs a
  replay by design);
- mismatched: ids whose row differs in the idempotent sink, users whose
  (count, total) differs in the counts sink.

The in-memory sink lives in the job's process: it is compared in runs whose
process was not killed. The summary adds ``task_failures`` (injected
failures that fired), ``healthy_sink_restarts`` (sink subtasks restarted
that did not fail: 0 under ``upstream``), ``replayed_dropped`` (records the
healthy tasks dropped as replays), ``fallbacks`` (upstream restarts that
fell back to the region) and ``missed_kills`` (planned process kills that
missed because the job ended first; that run is done again, killed inside
the length it showed).
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError
from snapcut.chaos.core import (
    ChaosError,
    Check,
    Outcome,
    Summary,
    fresh_dir,
    record_kill,
    restart_until_done,
    run_campaign,
    run_rng,
)
from snapcut.chaos.local import (
    FAILPOINTS,
    KILL_MODES,
    RESTORE_FAILPOINTS,
    child_env,
    read_committed,
    run_child,
)
from snapcut.checkpointing import FAILOVER_STRATEGIES, Checkpointing
from snapcut.dataflow import FAILURE_POINTS, TaskFailure
from snapcut.jobs import local_fan_out as job

PROTOCOLS = ("aligned", "unaligned", "chandy-lamport")

#: Process crash points that fire on the fan-out job (its sinks and store).
PROCESS_FAILPOINTS = tuple(p for p in FAILPOINTS if p not in RESTORE_FAILPOINTS)

BATCH_SIZE = 100

#: How often a run whose planned kill missed is done again before it counts as an error.
MAX_KILL_REDOS = 3


@dataclass
class FanOutOptions:
    protocol: str = "aligned"
    failover: str = "upstream"
    runs: int = 10
    seed: int = 0
    records: int = 20_000
    users: int = 200
    job_seconds: float = 0.4
    process_kills: bool = False
    kill_mode: str = "mixed"
    workdir: str | None = None
    keep: bool = False

    def throttle_ms(self) -> float:
        return self.job_seconds * 1000 / max(1, self.records // BATCH_SIZE)

    def check(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"the fan-out job runs {', '.join(PROTOCOLS)}, not {self.protocol!r}")
        if self.failover not in FAILOVER_STRATEGIES:
            raise ConfigError(
                f"failover must be one of {', '.join(FAILOVER_STRATEGIES)}, got {self.failover!r}"
            )
        if self.kill_mode not in KILL_MODES:
            raise ConfigError(f"kill_mode must be one of {', '.join(KILL_MODES)}")
        for what, v, least in (
            ("runs", self.runs, 1),
            ("records", self.records, BATCH_SIZE),
            ("users", self.users, 1),
            ("seed", self.seed, 0),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ConfigError(f"{what} must be an int >= {least}, got {v!r}")
        if not 0 < self.job_seconds < 600:
            raise ConfigError(f"job_seconds must be in (0, 600), got {self.job_seconds!r}")


@dataclass
class FanOutSummary(Summary):
    topology: str = "fan-out"
    failover: str = "upstream"
    task_failures: int = 0
    failed_sinks: dict[str, int] = field(default_factory=dict)
    failure_points: dict[str, int] = field(default_factory=dict)
    healthy_sink_restarts: int = 0
    replayed_dropped: int = 0
    fallbacks: int = 0
    memory_checked: int = 0
    missed_kills: int = 0


@dataclass(frozen=True)
class Reference:
    rows: collections.Counter[tuple[int, int, int]]
    by_id: dict[int, tuple[int, int]]
    per_user: dict[int, tuple[int, int]]


def reference(records: int, users: int, seed: int) -> Reference:
    t = job.events(records, users, seed)
    ids, us, ds = t["id"].to_pylist(), t["user"].to_pylist(), t["dwell_ms"].to_pylist()
    per_user: dict[int, list[int]] = {}
    for u, d in zip(us, ds, strict=True):
        slot = per_user.setdefault(u, [0, 0])
        slot[0] += 1
        slot[1] += d
    return Reference(
        collections.Counter(zip(ids, us, ds, strict=True)),
        {i: (u, d) for i, u, d in zip(ids, us, ds, strict=True)},
        {u: (c, s) for u, (c, s) in per_user.items()},
    )


def _rows(t: pa.Table | None) -> collections.Counter[tuple[int, int, int]]:
    if t is None:
        return collections.Counter()
    return collections.Counter(
        zip(t["id"].to_pylist(), t["user"].to_pylist(), t["dwell_ms"].to_pylist(), strict=True)
    )


def check_output(out_dir: Path, ref: Reference, check_memory: bool) -> Check:
    c = Check()
    sinks = [("arrow-sink", read_committed(out_dir / "arrow", c.corrupt_files))]
    if check_memory:
        sinks.append(("collect-memory", read_committed_file(out_dir / "memory.arrow")))
    for name, table in sinks:
        got = _rows(table)
        missing, extra = ref.rows - got, got - ref.rows
        c.lost += sum(missing.values())
        c.duplicated += sum(extra.values())
        if missing:
            c.problems.append(f"{name}: {sum(missing.values())} records lost")
        if extra:
            c.problems.append(f"{name}: {sum(extra.values())} records extra")
    idem = read_committed(out_dir / "idempotent", c.corrupt_files)
    upserted: dict[int, set[tuple[int, int]]] = {}
    for i, u, d in _rows(idem):
        upserted.setdefault(i, set()).add((u, d))
    lost_ids = ref.by_id.keys() - upserted.keys()
    wrong = [i for i, rows in upserted.items() if rows != {ref.by_id.get(i)}]
    c.lost += len(lost_ids)
    c.mismatched += len(wrong)
    if lost_ids:
        c.problems.append(f"idempotent-sink: {len(lost_ids)} ids missing")
    if wrong:
        c.problems.append(f"idempotent-sink: {len(wrong)} ids with other rows")
    counts = read_committed(out_dir / "counts", c.corrupt_files)
    rows: dict[int, list[tuple[int, int]]] = {}
    if counts is not None:
        for u, n, s in zip(
            counts["user"].to_pylist(),
            counts["count"].to_pylist(),
            counts["total"].to_pylist(),
            strict=True,
        ):
            rows.setdefault(u, []).append((n, s))
    bad = [u for u in ref.per_user.keys() | rows.keys() if rows.get(u) != [ref.per_user.get(u)]]
    c.mismatched += len(bad)
    if bad:
        u = sorted(bad)[0]
        c.problems.append(
            f"counts-sink: {len(bad)} users differ (e.g. {u}: {rows.get(u)} vs "
            f"{ref.per_user.get(u)})"
        )
    if c.corrupt_files:
        c.problems.append(f"unreadable committed files: {c.corrupt_files}")
    return c


def read_committed_file(path: Path) -> pa.Table | None:
    if not path.is_file():
        return None
    with pa.ipc.open_file(path) as f:
        return f.read_all()


def plan_failure(opts: FanOutOptions, rng: Any) -> TaskFailure:
    """One sink subtask, a moment, and which occurrence of it."""
    sink = rng.choice(sorted(job.SINKS))
    at = rng.choice(FAILURE_POINTS)
    # The counts sink takes its rows in a few batches at the end of input.
    batches = 1 if sink == "counts-sink" else max(1, opts.records // BATCH_SIZE // 2)
    nth = rng.randint(1, batches) if at == "process" else rng.randint(1, 3)
    return TaskFailure(sink, rng.randrange(job.PARALLELISM), at, nth)


def account(summary: FanOutSummary, done: dict[str, Any]) -> None:
    """Adds a finished attempt's restarts and replays to `summary`."""
    for r in done.get("restarts", []):
        summary.recoveries += 1
        if r["failed"] is not None and "injected failure" in r["error"]:
            summary.task_failures += 1
        if r["fallback"] is not None:
            summary.fallbacks += 1
        failed = r["failed"]
        for t in r["tasks"]:
            if t != failed and t.rsplit("-", 1)[0] in job.SINKS:
                summary.healthy_sink_restarts += 1
    summary.replayed_dropped += sum(int(n) for n in done.get("replayed_dropped", {}).values())


def _params(opts: FanOutOptions, out_dir: Path) -> job.Params:
    return job.Params(
        records=opts.records,
        users=opts.users,
        seed=opts.seed,
        batch_size=BATCH_SIZE,
        throttle_ms=opts.throttle_ms(),
        output_dir=str(out_dir),
    )


def _child_cmd(
    opts: FanOutOptions, run_dir: Path, interval: float, failure: TaskFailure | None, resume: bool
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "snapcut.jobs.local_fan_out",
        "--protocol",
        opts.protocol,
        "--failover",
        opts.failover,
        "--records",
        str(opts.records),
        "--users",
        str(opts.users),
        "--seed",
        str(opts.seed),
        "--interval",
        f"{interval:.4f}",
        "--batch-size",
        str(BATCH_SIZE),
        "--throttle-ms",
        f"{opts.throttle_ms():.3f}",
        "--checkpoint-dir",
        str(run_dir / "checkpoints"),
        "--output-dir",
        str(run_dir / "out"),
    ]
    if failure is not None:
        cmd += ["--fail", f"{failure.operator}:{failure.subtask}:{failure.at}:{failure.nth}"]
    if resume:
        cmd.append("--resume")
    return cmd


def run_one(
    opts: FanOutOptions, run: int, run_dir: Path, ref: Reference, summary: FanOutSummary
) -> Check:
    rng = run_rng(opts.seed, run)
    fresh_dir(run_dir)
    (run_dir / "out").mkdir()
    interval = rng.uniform(0.01, 0.05)
    failure = plan_failure(opts, rng)
    summary.failed_sinks[failure.operator] = summary.failed_sinks.get(failure.operator, 0) + 1
    summary.failure_points[failure.at] = summary.failure_points.get(failure.at, 0) + 1
    if not opts.process_kills:
        cfg = Checkpointing(
            protocol=opts.protocol,
            interval=interval,
            retained=2,
            restart_attempts=1,
            restart_delay=0,
            failover=opts.failover,
        )
        done = job.run(
            _params(opts, run_dir / "out"), cfg, str(run_dir / "checkpoints"), failure=failure
        )
        account(summary, done)
        summary.memory_checked += 1
        return check_output(run_dir / "out", ref, check_memory=True)
    # Every attempt gets the task failure (it fires once per process); the
    # first one is also killed whole and the resumed ones run to the end. A
    # planned kill can miss (the job ended before the timer, or the crash
    # point was not reached that often): the run is then done again from a
    # clean directory, killed by a timer inside the length it just showed.
    est = opts.job_seconds + 0.3
    misses = 0

    def attempt(n: int) -> Outcome:
        nonlocal est
        failpoint = None
        kill_after = None
        if n == 0:
            mode = "timer" if misses else opts.kill_mode
            if mode == "mixed":
                mode = rng.choice(("timer", "failpoint"))
            if mode == "failpoint":
                point = rng.choice(PROCESS_FAILPOINTS)
                failpoint = f"{point}={rng.randint(1, 4)}"
            else:
                kill_after = rng.uniform(0.0, est * (0.8 if misses else 1.0))
        cmd = _child_cmd(opts, run_dir, interval, failure, n > 0)
        a = run_child(cmd, child_env(failpoint), kill_after, run_dir / f"stderr-{n}.txt")
        if a.killed:
            record_kill(summary, a.failpoint)
            return Outcome.KILLED
        if n == 0:
            est = a.seconds
            return Outcome.MISSED
        done = a.finished or {}
        account(summary, done)
        if done.get("restored_from") is not None:
            summary.restored += 1
        return Outcome.FINISHED

    def redo() -> None:
        nonlocal misses
        misses += 1
        if misses > MAX_KILL_REDOS:
            raise ChaosError(
                f"{misses} planned kills missed: the job ended first every time (last run "
                f"{est:.2f}s); raise --job-seconds"
            )
        summary.missed_kills += 1
        fresh_dir(run_dir)
        (run_dir / "out").mkdir()

    restart_until_done(attempt, summary, planned=1, spare=4, on_missed=redo)
    return check_output(run_dir / "out", ref, check_memory=False)


def run_fan_out_chaos(
    opts: FanOutOptions, log: Callable[[str], None] = lambda _: None
) -> FanOutSummary:
    """Runs `opts.runs` runs and returns the summary; an error of a run is
    counted or raised as :func:`snapcut.chaos.core.fails_the_run` says (a
    job that fails other than by the injected failure is a failed run)."""
    opts.check()
    summary = FanOutSummary(
        protocol=opts.protocol, failover=opts.failover, records=opts.records, seed=opts.seed
    )
    ref = reference(opts.records, opts.users, opts.seed)
    return run_campaign(
        summary,
        opts.runs,
        lambda run, run_dir: run_one(opts, run, run_dir, ref, summary),
        name=f"{opts.protocol}-{opts.failover}",
        workdir=opts.workdir,
        keep=opts.keep,
        log=log,
        prefix="snapcut-chaos-fan-out-",
    )
