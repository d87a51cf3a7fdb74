"""What the chaos harnesses (local dwell, local fan-out, Spark) share: the run
loop and its error policy, the summary they print, seeding, and the
bookkeeping of checked runs.

The run loop
------------
:func:`run_campaign` runs a harness's runs one after the other, each in a
fresh directory ``<root>/<name>-run-NNNN``. One run (the harness's
``run_one(run, run_dir)``) plans its input and its kills from
:func:`run_rng`, drives the job with :func:`restart_until_done` (start it,
kill it or inject a failure as planned, restart it resumed until it
finishes), and returns the :class:`Check` of what the job committed against
a failure-free run; the campaign adds the check to the summary
(:func:`record_run`). What differs between harnesses is passed in: how an
attempt is started and killed (the ``attempt`` callback), how many restarts
a job may need (``spare``), and whether a planned kill that the job outran
redoes the run (``on_missed``: the fan-out harness) or not.

Which errors fail a run
-----------------------
One policy for every harness (:func:`fails_the_run`), applied by
:func:`run_campaign` to whatever a run raises:

- **A failed run** (counted in ``errors``, listed in ``failed_runs``, its
  directory kept; the campaign goes on with the next run):

  - :class:`ChaosError`: the job did what the harness does not expect of it
    (exited non-zero, hung, was SIGKILLed by no one of ours, never finished,
    outran every planned kill, or left logs its input cannot explain);
  - any :class:`~snapcut.SnapcutError` except :class:`~snapcut.ConfigError`
    (:class:`~snapcut.TaskError`, :class:`~snapcut.SnapshotError`,
    :class:`~snapcut.StorageError`, ...): snapcut failed while running the
    job in-process or reading back what it committed, under the injected
    faults: what the harness is there to find.

- **A harness error** (raised: the campaign stops; ``snapcut chaos`` exits
  2 on a ``ConfigError`` and shows the traceback otherwise):

  - :class:`~snapcut.ConfigError`: options no run can satisfy (every run
    would fail the same way);
  - every other exception (``TypeError``, ``KeyError``, ``OSError``,
    pyarrow's and pandas' errors, ...): a bug in the harness or a problem of
    its machine (a full disk, no Java), not a property of the job under
    test; counting it as a failed run would blame the job for it.
    ``KeyboardInterrupt`` and other ``BaseException`` are never caught.

Torn committed files are neither: a harness reads them into
``Check.corrupt_files``, a check failure of the run like a lost record.
"""

from __future__ import annotations

import enum
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from snapcut._core import ConfigError, SnapcutError


class ChaosError(RuntimeError):
    """A child job failed other than by an injected kill."""


def fails_the_run(error: BaseException) -> bool:
    """The harnesses' error policy (see the module docstring): True if
    `error`, raised while a run was driven or checked, counts as a failed
    run; False if it is a harness error, to be raised."""
    if isinstance(error, ConfigError):
        return False
    return isinstance(error, (ChaosError, SnapcutError))


@dataclass
class Summary:
    protocol: str
    runs: int = 0
    kills: int = 0
    recoveries: int = 0
    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    timer_kills: int = 0
    failpoint_kills: int = 0
    failpoints: dict[str, int] = field(default_factory=dict)
    restored: int = 0
    skipped_checkpoints: int = 0
    #: Flushes and merges of spilling keyed state in the attempts that
    #: finished (killed ones report nothing): `--state-memory`.
    spill_flushes: int = 0
    spill_merges: int = 0
    errors: int = 0
    corrupt_files: int = 0
    failed_runs: list[int] = field(default_factory=list)
    records: int = 0
    seed: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        bad = self.lost + self.duplicated + self.mismatched + self.errors + self.corrupt_files
        return bad == 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)


@dataclass
class Check:
    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    corrupt_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def run_rng(seed: int, run: int) -> random.Random:
    """Every random choice of run `run`: a failing run replays from ``--seed``
    and its number alone."""
    return random.Random(seed * 1_000_003 + run)


def planned_kills(rng: random.Random, max_kills: int) -> int:
    """How many attempts of a run are killed: 1..`max_kills` (none if 0)."""
    return rng.randint(1, max_kills) if max_kills else 0


def fresh_dir(path: Path) -> None:
    """`path` as an empty directory (a run starts from nothing)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


class Outcome(enum.Enum):
    """How one attempt of a job ended."""

    KILLED = "killed"
    """Killed (by the harness or at a crash point): restarted, resumed."""
    FINISHED = "finished"
    """Ran to its end."""
    MISSED = "missed"
    """Ran to its end before the kill planned for it: the run is done again
    if :func:`restart_until_done` has ``on_missed``, else as FINISHED."""


def restart_until_done(
    attempt: Callable[[int], Outcome],
    summary: Summary,
    *,
    planned: int,
    spare: int,
    what: str = "job",
    on_missed: Callable[[], None] | None = None,
) -> int:
    """Runs a job until it finishes; returns the attempts it took.

    ``attempt(n)`` starts attempt `n` (0 from nothing, later ones resumed
    from what the killed one left), kills it or injects what the harness
    planned for it (`planned`: how many attempts are to be killed), and says
    how it ended. Every attempt after a kill is a restart, counted in
    ``summary.recoveries`` once it ran to an outcome (finished or killed
    again). More than ``planned + spare`` restarts raise :class:`ChaosError`
    (the `what` never finishes). A MISSED attempt with `on_missed` redoes
    the run: ``on_missed()`` makes a clean start (or raises to give up) and
    attempts count from 0 again."""
    n = 0
    while True:
        if n > planned + spare:
            raise ChaosError(f"the {what} did not finish after {n} attempts")
        outcome = attempt(n)
        if n > 0:
            summary.recoveries += 1
        n += 1
        if outcome is Outcome.KILLED:
            continue
        if outcome is Outcome.MISSED and on_missed is not None:
            on_missed()
            n = 0
            continue
        return n


S = TypeVar("S", bound=Summary)


def run_campaign(
    summary: S,
    runs: int,
    run_one: Callable[[int, Path], Check],
    *,
    name: str,
    workdir: str | None,
    keep: bool,
    log: Callable[[str], None],
    prefix: str = "snapcut-chaos-",
) -> S:
    """Runs ``run_one(run, run_dir)`` for runs 0..`runs`-1 and adds each to
    `summary`, which it returns with the campaign's seconds.

    Run directories are ``<workdir>/<name>-run-NNNN`` (`workdir` None: a
    temporary directory named `prefix`..., removed at the end unless a run
    failed or `keep`). An error a run raises is judged by
    :func:`fails_the_run`: a failed run is counted (:func:`record_error`)
    and the next run starts; a harness error is raised."""
    started = time.monotonic()
    owned = workdir is None
    root = Path(workdir or tempfile.mkdtemp(prefix=prefix))
    root.mkdir(parents=True, exist_ok=True)
    try:
        for run in range(runs):
            run_dir = root / f"{name}-run-{run:04d}"
            try:
                check = run_one(run, run_dir)
            except Exception as e:
                if not fails_the_run(e):
                    raise
                record_error(summary, run, e, run_dir, log)
                continue
            record_run(summary, run, check, run_dir, keep, log)
    finally:
        if owned and not keep and not summary.failed_runs:
            shutil.rmtree(root, ignore_errors=True)
    summary.seconds = round(time.monotonic() - started, 2)
    return summary


def record_kill(summary: Summary, failpoint: str | None) -> None:
    """Counts one SIGKILLed attempt: at crash point `failpoint`, or (None)
    at a random moment."""
    summary.kills += 1
    if failpoint is None:
        summary.timer_kills += 1
        return
    summary.failpoint_kills += 1
    summary.failpoints[failpoint] = summary.failpoints.get(failpoint, 0) + 1


def record_run(
    summary: Summary,
    run: int,
    check: Check,
    run_dir: Path,
    keep: bool,
    log: Callable[[str], None],
) -> None:
    """Adds one checked run to `summary`; a clean run's directory is removed
    unless `keep`, a failed one's is kept and named."""
    summary.runs += 1
    summary.lost += check.lost
    summary.duplicated += check.duplicated
    summary.mismatched += check.mismatched
    summary.corrupt_files += len(check.corrupt_files)
    if check.problems:
        summary.failed_runs.append(run)
        log(f"run {run}: FAILED: {'; '.join(check.problems)} (kept in {run_dir})")
    else:
        log(f"run {run}: ok")
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def record_error(
    summary: Summary, run: int, error: Exception, run_dir: Path, log: Callable[[str], None]
) -> None:
    """Counts a failed run (:func:`fails_the_run`): its job failed other
    than by an injected kill, or snapcut could not read back its output."""
    summary.errors += 1
    summary.failed_runs.append(run)
    log(f"run {run}: ERROR {error} (kept in {run_dir})")
