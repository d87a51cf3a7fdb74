"""A description of the machine a run used: cores, CPU model, memory, load."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def load() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


BUSY_SAMPLE_S = 0.5
BUSY_SHARE = 0.25
"""Share of all CPUs busy just before a run above which its report warns."""


def cpu_ticks() -> tuple[int, int] | None:
    """(idle + iowait, all) jiffies of every CPU since boot, from /proc/stat."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    return fields[3] + fields[4], sum(fields)


CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""Jiffies a second: the unit of /proc/stat and of /proc/<pid>/task/<tid>/stat."""


def busy_seconds(before: tuple[float, float], after: tuple[float, float]) -> float:
    """CPU seconds, summed over every CPU, that were not idle between two
    `cpu_ticks` readings."""
    return ((after[1] - before[1]) - (after[0] - before[0])) / CLOCK_TICKS_PER_S


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Share of the CPUs' time between two `cpu_ticks` readings that was not idle."""
    total = after[1] - before[1]
    if total <= 0:
        return None
    return max(0.0, min(1.0, 1 - (after[0] - before[0]) / total))


def parse_task_stat(text: str) -> tuple[str, int, int]:
    """(thread name, user ticks, system ticks) of one `/proc/<pid>/task/<tid>/stat`.

    The name sits in parentheses and may itself hold spaces and parentheses,
    so the fields are counted from its last ')'."""
    start, end = text.index("("), text.rindex(")")
    fields = text[end + 2 :].split()
    # Fields 14 and 15 of proc(5) (utime, stime); fields[0] is field 3 (state).
    return text[start + 1 : end], int(fields[11]), int(fields[12])


def _per_thread(pid: int | str, file: str) -> Iterator[tuple[int, str]]:
    """(thread id, text of `/proc/<pid>/task/<tid>/<file>`) of every live
    thread of process `pid`; nothing off Linux."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            yield int(tid), Path(f"/proc/{pid}/task/{tid}/{file}").read_text()
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read


def thread_cpu(pid: int | str = "self") -> dict[str, tuple[float, float]]:
    """CPU seconds (user, system) per thread name of process `pid` since each
    thread started, threads of one name summed; {} off Linux. Threads that
    have ended are not counted: compare readings of threads that outlive both."""
    tick = CLOCK_TICKS_PER_S
    out: dict[str, tuple[float, float]] = {}
    for _, text in _per_thread(pid, "stat"):
        try:
            name, user, system = parse_task_stat(text)
        except (ValueError, IndexError):
            continue  # cut short: the thread ended while it was read
        u, s = out.get(name, (0.0, 0.0))
        out[name] = (u + user / tick, s + system / tick)
    return out


def thread_ids(pid: int | str = "self") -> dict[int, str]:
    """Thread id -> thread name of every live thread of process `pid`; {} off
    Linux. Thread ids are what `os.sched_setaffinity` takes to pin one thread."""
    return {tid: name.rstrip("\n") for tid, name in _per_thread(pid, "comm")}


def cpu_busy(sample_s: float = BUSY_SAMPLE_S) -> float | None:
    """Share of all CPUs busy over the next `sample_s` seconds (None off Linux).

    What a benchmark needs to know is whether something else is running now;
    the 1-minute load average still carries the benchmark that just ended for
    minutes after it did."""
    before = cpu_ticks()
    if before is None:
        return None
    time.sleep(sample_s)
    after = cpu_ticks()
    return None if after is None else busy_share(before, after)


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@dataclass
class Machine:
    cpu_model: str = field(default_factory=_cpu_model)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    usable_cores: int = field(
        default_factory=lambda: (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    )
    memory_gib: float | None = field(default_factory=_memory_gib)
    system: str = field(default_factory=lambda: f"{platform.system()} {platform.release()}")
    python: str = field(default_factory=lambda: sys.version.split()[0])
    commit: str | None = field(default_factory=_git_commit)
    started_utc: str = field(
        default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    )
    finished_utc: str | None = None
    load_before: tuple[float, float, float] | None = field(default_factory=load)
    busy_before: float | None = field(default_factory=cpu_busy)
    """Share of all CPUs busy in the half second before the run (`cpu_busy`)."""
    load_after: tuple[float, float, float] | None = None

    def finish(self) -> None:
        self.finished_utc = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        self.load_after = load()

    def markdown(self) -> str:
        def fmt(ld: tuple[float, float, float] | None) -> str:
            return "unknown" if ld is None else " / ".join(f"{x:.2f}" for x in ld)

        mem = "unknown" if self.memory_gib is None else f"{self.memory_gib:.1f} GiB"
        busy = ""
        if self.busy_before is not None:
            if self.busy_before > BUSY_SHARE:
                busy = (
                    f"\n\n**The machine was busy when the run started** (its CPUs were "
                    f"{self.busy_before:.0%} busy in the {BUSY_SAMPLE_S:g} s before it): other "
                    "processes competed for the CPU, so absolute figures are low and noisy; "
                    "compare protocols only through the same-round ratios."
                )
        elif self.load_before and self.load_before[0] > 0.5 * self.usable_cores:
            busy = (
                f"\n\n**The machine was busy when the run started** (1-minute load "
                f"{self.load_before[0]:.2f} on {self.usable_cores} cores): other processes "
                "competed for the CPU, so absolute figures are low and noisy; compare "
                "protocols only through the same-round ratios."
            )
        idle_line = (
            ""
            if self.busy_before is None
            else f"\n- CPUs busy in the {BUSY_SAMPLE_S:g} s before the run: {self.busy_before:.0%}"
        )
        return (
            f"- CPU: {self.cpu_model}; {self.cores} cores ({self.usable_cores} usable)\n"
            f"- memory: {mem}; {self.system}; Python {self.python}\n"
            f"- snapcut commit: {self.commit or 'unknown'}\n"
            f"- run: {self.started_utc} → {self.finished_utc or '?'} UTC\n"
            f"- load average (1/5/15 min) before: {fmt(self.load_before)}; "
            f"after: {fmt(self.load_after)}" + idle_line + busy
        )
