"""What both chaos harnesses (local runtime and Spark) share: the summary they
print, a run's check, seeding, and the bookkeeping of checked runs."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path


class ChaosError(RuntimeError):
    """A child job failed other than by an injected kill."""


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
    """Counts a run whose child failed other than by an injected kill."""
    summary.errors += 1
    summary.failed_runs.append(run)
    log(f"run {run}: ERROR {error} (kept in {run_dir})")
