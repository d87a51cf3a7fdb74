"""`snapcut chaos`: proves exactly-once output under injected crashes.

Each run starts the reference dwell-time job (`snapcut.jobs.local_dwell`) in a
child process and kills it with SIGKILL, then restarts it with resume,
until it finishes. Kills are either at a random moment of the run or at a
deterministic crash point (``SNAPCUT_FAILPOINTS``: mid checkpoint write,
between checkpoint files and manifest, between manifest and sink commit,
mid sink commit; and, on a restarted attempt, on the restore path: after
the checkpoint was read, mid sink restore). Every choice comes from
``--seed`` and the run number, so a failing run replays. The committed
output (every ``*.arrow`` file the sinks published, read with pyarrow) is
then compared with a failure-free computation of the same generated
events in plain Python:

- lost: reference records missing from the output (as a multiset),
- duplicated: output records beyond the reference,
- mismatched: users whose count/total/mean row differs (or is missing or doubled);
  with ``--keyed-state process`` (a running row per call) users whose row
  with the largest count differs, or who have two rows of one count.

The last line of stdout is a JSON summary; the exit code is non-zero if
any of lost, duplicated, mismatched (or a child error, or a torn committed file) is non-zero.
Protocol ``none`` is rejected: without checkpoints a killed job has nothing
to resume from.

``--engine spark`` runs the same proof on Spark (:mod:`snapcut.chaos.spark`:
the dwell-time query with the exactly-once Arrow sink, its driver, Python
workers and executors killed), with the same seeding, summary and exit code.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.ipc as ipc

from snapcut._core import ConfigError
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
from snapcut.checkpointing import FAILOVER_STRATEGIES
from snapcut.dataflow import dwell_events
from snapcut.jobs.local_dwell import KEYED_STATES

PROTOCOLS = ("aligned", "unaligned", "chandy-lamport", "sync")


#: Crash points the harness arms (see `snapcut_core::failpoint::POINTS`).
FAILPOINTS = (
    "store.after_state_file",
    "store.before_manifest",
    "store.after_manifest",
    "sink.before_commit_rename",
    "sink.mid_commit",
    "restore.after_load",
    "sink.during_restore",
)


#: Crash points inside the store's background compaction: an input stored in
#: capture order sorted into a scratch file, not yet mapped back; a merged run
#: written but not renamed; and a merged run moved into a checkpoint whose
#: manifest is not written. Not armed by default: a job reaches them only
#: with diffs to merge (more users than an interval touches, a small
#: ``full_every``); arm them with ``failpoints=``.
COMPACTION_FAILPOINTS = (
    "compaction.sorted_copy",
    "compaction.before_rename",
    "compaction.adopted",
)

#: Crash points inside retention holding a directory for the runs kept
#: checkpoints read: its record written beside the manifest, and the manifest
#: removed before the unread files. Reached once a chain's runs span
#: checkpoints retention removes (diffs, a small ``full_every``).
RETENTION_FAILPOINTS = ("retention.held_record", "retention.mid_hold")

#: Crash points of keyed state spilling past its memory budget (`state_memory`):
#: a spilled run written, not mapped back; spilled runs merged, the old not removed.
SPILL_FAILPOINTS = ("spill.after_run", "spill.merged")


#: Crash points on the restore path: only a resumed attempt reaches them.
RESTORE_FAILPOINTS = ("restore.after_load", "sink.during_restore")


#: Hits of a restore point per process (one restore, a few staged files):
#: a larger N would never fire.
RESTORE_MAX_HIT = {"restore.after_load": 1, "sink.during_restore": 2}


#: Batches a runtime channel holds (`JobOptions::channel_capacity`).
CHANNEL_BATCHES = 64


KILL_MODES = ("mixed", "timer", "failpoint")


#: Defaults of the local engine for the CLI options both engines share.
DEFAULT_RECORDS = 20_000


DEFAULT_MAX_KILLS = 3


DEFAULT_JOB_SECONDS = 0.4


CHILD_TIMEOUT_S = 120.0


@dataclass
class Options:
    protocol: str = "aligned"
    runs: int = 10
    seed: int = 0
    records: int = 20_000
    users: int = 200
    workdir: str | None = None
    max_kills: int = 3
    #: None: small enough that a barrier queued behind a full channel (64
    #: batches) waits only ~15 ms, so aligned checkpoints complete often.
    batch_size: int | None = None
    #: The job is throttled to last about this long, so checkpoints (every
    #: 10-50 ms) and kills fall inside it whatever the record count.
    job_seconds: float = 0.4
    unsafe_sink: bool = False
    #: False: the job's checkpoints are not fsynced (`Dataflow.run(fsync=)`);
    #: a SIGKILL keeps the page cache, so exactly-once must still hold.
    fsync: bool = True
    keep: bool = False
    failpoints: tuple[str, ...] = FAILPOINTS
    #: "mixed" (random per kill), "timer" (random moments) or "failpoint" (crash points).
    kill_mode: str = "mixed"
    #: Checkpointing.failover of the job (it matters once a task fails).
    failover: str = "region"
    #: Checkpointing.full_every of the job: the store compacts a task's
    #: runs once this many diffs sit on its full.
    full_every: int = 10
    #: Checkpointing.state_memory of the job (None: no budget): small enough,
    #: its keyed state spills and merges runs mid-run.
    state_memory: str | None = None
    #: What keeps the per-user state: "aggregate" (the built-in keyed
    #: aggregate, one row per user at the end) or "process" (a Python keyed
    #: process, a running row per call).
    keyed_state: str = "aggregate"

    def batch(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        return max(1, round(self.records / 2 / (CHANNEL_BATCHES * self.job_seconds / 0.015)))

    def batches_per_subtask(self) -> float:
        return max(1.0, self.records / self.batch() / 2)

    def throttle_ms(self) -> float:
        return self.job_seconds * 1000 / self.batches_per_subtask()

    def check(self) -> None:
        if self.protocol == "none":
            raise ConfigError(
                "protocol 'none' takes no checkpoints, so a killed job has nothing to resume "
                f"from and exactly-once cannot hold; use one of {', '.join(PROTOCOLS)}"
            )
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"unknown protocol {self.protocol!r}; use one of {', '.join(PROTOCOLS)}"
            )
        for what, v, least in (
            ("runs", self.runs, 1),
            ("records", self.records, 1),
            ("users", self.users, 1),
            ("max_kills", self.max_kills, 0),
            ("seed", self.seed, 0),
            ("batch_size", self.batch(), 1),
            ("full_every", self.full_every, 1),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ConfigError(f"{what} must be an int >= {least}, got {v!r}")
        if self.kill_mode not in KILL_MODES:
            raise ConfigError(
                f"kill_mode must be one of {', '.join(KILL_MODES)}, got {self.kill_mode!r}"
            )
        if self.failover not in FAILOVER_STRATEGIES:
            raise ConfigError(
                f"failover must be one of {', '.join(FAILOVER_STRATEGIES)}, got {self.failover!r}"
            )
        if self.keyed_state not in KEYED_STATES:
            raise ConfigError(
                f"keyed_state must be one of {', '.join(KEYED_STATES)}, got {self.keyed_state!r}"
            )
        if self.kill_mode != "timer" and not self.failpoints:
            raise ConfigError("failpoint kills need at least one failpoint")
        if not 0 < self.job_seconds < 600:
            raise ConfigError(f"job_seconds must be in (0, 600), got {self.job_seconds!r}")
        known = FAILPOINTS + COMPACTION_FAILPOINTS + RETENTION_FAILPOINTS + SPILL_FAILPOINTS
        unknown = set(self.failpoints) - set(known)
        if unknown:
            raise ConfigError(f"unknown failpoints {sorted(unknown)}; known: {', '.join(known)}")


@dataclass(frozen=True)
class Reference:
    records: collections.Counter[tuple[int, int]]
    per_user: dict[int, tuple[int, int]]


def reference(users: int, records: int, seed: int) -> Reference:
    """The failure-free result, in plain Python from the same seeded generator."""
    table = dwell_events(users, records, seed)
    pairs = list(zip(table["user"].to_pylist(), table["dwell_ms"].to_pylist(), strict=True))
    per_user: dict[int, list[int]] = {}
    for user, dwell in pairs:
        slot = per_user.setdefault(user, [0, 0])
        slot[0] += 1
        slot[1] += dwell
    return Reference(collections.Counter(pairs), {u: (c, t) for u, (c, t) in per_user.items()})


def read_committed(directory: Path, corrupt: list[str] | None = None) -> pa.Table | None:
    """Every committed ``*.arrow`` file directly in `directory` (pending or
    temporary files have other names), concatenated; None if there is none.
    Files pyarrow cannot read (torn by a kill) are named in `corrupt`."""
    if not directory.is_dir():
        return None
    tables = []
    for path in sorted(directory.glob("*.arrow")):
        if path.name.startswith("."):
            continue
        try:
            with ipc.open_file(path) as f:
                tables.append(f.read_all())
        except (pa.ArrowInvalid, OSError) as e:
            if corrupt is None:
                raise
            corrupt.append(f"{path}: {e}")
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="default")


def check_output(output_dir: Path, ref: Reference, running: bool = False) -> Check:
    """Compares the committed output of one run with the reference. With
    `running`, the aggregate rows are a keyed process's running rows: each
    user's row with the largest count is checked, and two rows of one count
    (a call's output committed twice) are a mismatch too."""
    out = Check()
    events = read_committed(output_dir / "events", out.corrupt_files)
    got: collections.Counter[tuple[int, int]] = collections.Counter()
    if events is not None:
        got.update(zip(events["user"].to_pylist(), events["dwell_ms"].to_pylist(), strict=True))
    missing = ref.records - got
    extra = got - ref.records
    out.lost = sum(missing.values())
    out.duplicated = sum(extra.values())
    if out.lost:
        out.problems.append(f"{out.lost} event records lost (e.g. {next(iter(missing))})")
    if out.duplicated:
        out.problems.append(f"{out.duplicated} event records extra (e.g. {next(iter(extra))})")

    agg = read_committed(output_dir / "agg", out.corrupt_files)
    rows: dict[int, list[tuple[int, int, float]]] = {}
    if agg is not None:
        for user, count, total, mean in zip(
            agg["user"].to_pylist(),
            agg["count"].to_pylist(),
            agg["total"].to_pylist(),
            agg["mean"].to_pylist(),
            strict=True,
        ):
            rows.setdefault(user, []).append((count, total, mean))
    if running:
        rows = {u: _final_running_row(have) for u, have in rows.items()}
    bad = []
    for user in ref.per_user.keys() | rows.keys():
        want = ref.per_user.get(user)
        have = rows.get(user, [])
        if want is None or len(have) != 1:
            bad.append(user)
            continue
        count, total, mean = have[0]
        if (count, total) != want or abs(mean - want[1] / want[0]) > 1e-9 * max(1.0, abs(mean)):
            bad.append(user)
    out.mismatched = len(bad)
    if out.corrupt_files:
        out.problems.append(f"unreadable committed files: {out.corrupt_files}")
    if bad:
        u = sorted(bad)[0]
        out.problems.append(
            f"{len(bad)} users' aggregates differ (e.g. user {u}: got {rows.get(u, [])}, "
            f"expected {ref.per_user.get(u)})"
        )
    return out


def _final_running_row(rows: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """A user's running rows as its one final row: the row with the largest
    count, or every row if two share a count (then the check sees two)."""
    counts = [r[0] for r in rows]
    if len(set(counts)) != len(counts):
        return rows
    return [max(rows)]


@dataclass
class Attempt:
    """What one child process did."""

    killed: bool
    failpoint: str | None
    finished: dict[str, Any] | None
    returncode: int
    seconds: float


def _child_cmd(opts: Options, run_dir: Path, interval: float, resume: bool) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "snapcut.jobs.local_dwell",
        "--protocol",
        opts.protocol,
        "--records",
        str(opts.records),
        "--users",
        str(opts.users),
        "--seed",
        str(opts.seed),
        "--interval",
        f"{interval:.4f}",
        "--batch-size",
        str(opts.batch()),
        "--throttle-ms",
        f"{opts.throttle_ms():.3f}",
        "--checkpoint-dir",
        str(run_dir / "checkpoints"),
        "--output-dir",
        str(run_dir / "out"),
        "--failover",
        opts.failover,
        "--full-every",
        str(opts.full_every),
    ]
    if opts.state_memory is not None:
        cmd += ["--state-memory", opts.state_memory, "--spill-dir", str(run_dir / "spill")]
    if opts.keyed_state != "aggregate":
        cmd += ["--keyed-state", opts.keyed_state]
    if resume:
        cmd.append("--resume")
    if opts.unsafe_sink:
        cmd.append("--unsafe-sink")
    if not opts.fsync:
        cmd.append("--no-fsync")
    return cmd


def child_env(failpoint: str | None) -> dict[str, str]:
    """The environment of a local job's child: ``SNAPCUT_FAILPOINTS`` armed
    with `failpoint` (``POINT=N``) or, None, cleared."""
    env = dict(os.environ)
    env.pop("SNAPCUT_FAILPOINTS", None)
    if failpoint is not None:
        env["SNAPCUT_FAILPOINTS"] = failpoint
    return env


def _failpoint_hit(stderr: IO[str]) -> str | None:
    stderr.seek(0)
    for line in stderr:
        if line.startswith("snapcut: failpoint "):
            return line.split()[2]
    return None


def run_child(
    cmd: list[str], env: dict[str, str], kill_after: float | None, stderr_path: Path
) -> Attempt:
    """Runs the job once; SIGKILLs it `kill_after` seconds after it started running."""
    with open(stderr_path, "w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "running" once the job started, "" if it died
        start = time.monotonic()
        if kill_after is not None and first.strip() == "running":
            try:
                proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        try:
            rest, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise ChaosError(f"child {cmd} hung for {CHILD_TIMEOUT_S}s; killed") from None
        seconds = time.monotonic() - start
        fp = _failpoint_hit(err)
        if proc.returncode == -signal.SIGKILL:
            return Attempt(True, fp, None, proc.returncode, seconds)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read()[-2000:]
            raise ChaosError(f"child exited with {proc.returncode}:\n{tail}")
    lines = [ln for ln in rest.splitlines() if ln.startswith("{")]
    finished = json.loads(lines[-1]) if lines else {}
    return Attempt(False, None, finished, 0, seconds)


def run_one(
    opts: Options, run: int, run_dir: Path, ref: Reference, summary: Summary, est: list[float]
) -> Check:
    """One run: planned kills, then restarts until the job completes; then the check."""
    rng = run_rng(opts.seed, run)
    fresh_dir(run_dir)
    interval = rng.uniform(0.01, 0.05)
    planned = planned_kills(rng, opts.max_kills)

    def attempt(n: int) -> Outcome:
        failpoint = None
        kill_after = None
        if n < planned:
            use_failpoint = rng.random() < 0.5
            if opts.kill_mode != "mixed":
                use_failpoint = opts.kill_mode == "failpoint"
            # A first attempt does not restore: restore points would never fire.
            points = [p for p in opts.failpoints if n > 0 or p not in RESTORE_FAILPOINTS]
            if use_failpoint and points:
                point = rng.choice(points)
                failpoint = f"{point}={rng.randint(1, RESTORE_MAX_HIT.get(point, 4))}"
            else:
                kill_after = rng.uniform(0.0, est[0])
        cmd = _child_cmd(opts, run_dir, interval, resume=n > 0)
        a = run_child(cmd, child_env(failpoint), kill_after, run_dir / f"stderr-{n}.txt")
        if a.killed:
            record_kill(summary, a.failpoint)
            return Outcome.KILLED
        # Timer kills aim at the job's whole length, learnt from finished runs.
        est[0] = max(est[0] * 0.8, a.seconds)
        done = a.finished or {}
        if done.get("restored_from") is not None:
            summary.restored += 1
        summary.skipped_checkpoints += int(done.get("skipped", 0))
        summary.spill_flushes += int(done.get("spill_flushes", 0))
        summary.spill_merges += int(done.get("spill_merges", 0))
        return Outcome.FINISHED

    restart_until_done(attempt, summary, planned=planned, spare=5)
    return check_output(run_dir / "out", ref, running=opts.keyed_state == "process")


def run_chaos(opts: Options, log: Callable[[str], None] = lambda _: None) -> Summary:
    """Runs `opts.runs` chaos runs and returns the summary; an error of a run
    is counted or raised as :func:`snapcut.chaos.core.fails_the_run` says."""
    opts.check()
    summary = Summary(protocol=opts.protocol, records=opts.records, seed=opts.seed)
    ref = reference(opts.users, opts.records, opts.seed)
    est = [opts.job_seconds + 0.1]
    return run_campaign(
        summary,
        opts.runs,
        lambda run, run_dir: run_one(opts, run, run_dir, ref, summary, est),
        name=opts.protocol,
        workdir=opts.workdir,
        keep=opts.keep,
        log=log,
    )
