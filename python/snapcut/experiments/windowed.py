"""The windowed method: a protocol's overhead from windows of one long run.

Whole runs on this guest differ by a third in speed (its two speed modes),
more than the effects measured. So one run alternates windows (``--window``
seconds, e.g. 1 s) with the thing measured off and on (checkpoints
triggered every ``interval_s`` in on windows, or any switch), and each on
window is compared with the off windows either side of it: (their mean
records/s) / (its records/s) - 1, so a linear drift cancels. Per window the
rate comes from the runtime's own timeline, after a guard at the window's
start (the last checkpoint finishing, the first alignment). The median over
on windows gets a bootstrap 95 % interval (runs resampled, then windows
within them). CPU seconds per record, the machine's idle share and the CPU
of each thread role are read per window too, to tell extra work from stalls.

Used by ``bench/peers/windowed.py`` and ``snapcut experiment``.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ROLES",
    "Counters",
    "Trigger",
    "Window",
    "bootstrap_median_ci",
    "clustered_median_ci",
    "cpu_shift",
    "machine_counters",
    "on_differences",
    "on_overheads",
    "pin_threads",
    "thread_role",
    "window_counters",
    "window_rates",
]


def bootstrap_median_ci(
    values: Sequence[float], resamples: int = 2000, seed: int = 1
) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of `values`."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(max(resamples, 1)))
    return medians[int(0.025 * (len(medians) - 1))], medians[int(0.975 * (len(medians) - 1))]


ROLES = ("writer", "coordinator", "tasks", "other")
"""Thread roles whose CPU a window reports (`thread_role`)."""

Counters = tuple[float, float, float, dict[str, tuple[float, float]]]
"""(process CPU seconds, machine idle ticks, machine ticks, role -> (user s, system s))."""


def thread_role(name: str) -> str:
    """Which part of snapcut a thread of this name is (Linux cuts names to 15 bytes)."""
    if name.startswith("snapcut-store-w"):
        return "writer"
    if name == "snapcut-job":
        return "coordinator"
    return "tasks" if name.startswith("snapcut-") else "other"


def pin_threads(async_cpu: int, threads: dict[int, str] | None = None) -> dict[str, int]:
    """Pins the writer and the coordinator to `async_cpu` and the tasks to
    every other CPU this process may use; other threads keep theirs.
    `threads`: thread id -> name, by default every live thread of this
    process. Returns how many threads of each role were pinned."""
    from snapcut.experiments.machine import thread_ids

    others = os.sched_getaffinity(0) - {async_cpu}
    cpus_of = {"writer": {async_cpu}, "coordinator": {async_cpu}, "tasks": others}
    pinned: dict[str, int] = {}
    for tid, name in (thread_ids() if threads is None else threads).items():
        role = thread_role(name)
        cpus = cpus_of.get(role)
        if cpus is None:
            continue
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # the thread ended
        pinned[role] = pinned.get(role, 0) + 1
    return pinned


def machine_counters() -> Counters:
    """`Counters` now."""
    from snapcut.experiments.machine import cpu_ticks, thread_cpu

    t = os.times()
    idle, total = cpu_ticks() or (0, 0)
    roles: dict[str, tuple[float, float]] = {}
    for name, (user, system) in thread_cpu().items():
        role = thread_role(name)
        u, k = roles.get(role, (0.0, 0.0))
        roles[role] = (u + user, k + system)
    return t.user + t.system, float(idle), float(total), roles


class Trigger(threading.Thread):
    """Runs the on/off windows of one job run: every `interval_s` in on
    windows (odd ones, counted from `warmup_s` after the job started) it
    calls `fire` (default: a checkpoint, ``control.trigger_checkpoint``);
    at each window's start it calls `switch(on)` if given (something other
    than checkpoints turned on and off, e.g. an injected slowdown); and it
    reads `machine_counters` at each window's guard end and end. With
    `async_cpu`, pins the job's threads (`pin_threads`) when the warm-up ends.
    `offset_s`: the first trigger of an on window comes this long after its
    start (then every `interval_s` to its end), e.g. the guard, so that the
    measured part of the window holds exactly its share of checkpoints."""

    def __init__(
        self,
        control: Any,
        window_s: float,
        guard_s: float,
        interval_s: float | None,
        warmup_s: float,
        async_cpu: int | None = None,
        *,
        fire: Callable[[], None] | None = None,
        switch: Callable[[bool], None] | None = None,
        offset_s: float = 0.0,
    ) -> None:
        super().__init__(daemon=True)
        self.control = control
        self.window_s, self.guard_s, self.interval_s = window_s, guard_s, interval_s
        self.warmup_s = warmup_s
        self.fire = fire
        self.switch = switch
        self.offset_s = offset_s
        self.stop = threading.Event()
        self.marks: list[tuple[int, str, Counters]] = []
        self.triggered = 0
        self.async_cpu = async_cpu
        self.pinned: dict[str, int] = {}

    def run(self) -> None:
        while not self.control.started and not self.stop.is_set():
            time.sleep(0.001)
        t0 = time.perf_counter() + self.warmup_s
        if self.async_cpu is not None:
            if self.stop.wait(self.warmup_s):
                return
            self.pinned = pin_threads(self.async_cpu)
        events = self._events(t0)
        while not self.stop.is_set():
            at, kind, window = next(events)
            delay = at - time.perf_counter()
            if delay > 0 and self.stop.wait(delay):
                return
            if kind == "trigger":
                try:
                    (self.fire or self.control.trigger_checkpoint)()
                except Exception:  # the job has ended
                    return
                self.triggered += 1
            elif kind == "start":
                if self.switch is not None:
                    self.switch(window % 2 == 1)
            else:
                self.marks.append((window, kind, machine_counters()))

    def _events(self, t0: float) -> Iterator[tuple[float, str, int]]:
        """(time, "start" | "trigger" | "guard" | "end", window) in time order, forever."""
        w = 0
        span = self.window_s - self.offset_s
        per_window = 0 if self.interval_s is None else round(span / self.interval_s)
        while True:
            start = t0 + w * self.window_s
            ev = [
                (start, "start", w),
                (start + self.guard_s, "guard", w),
                (start + self.window_s, "end", w),
            ]
            if w % 2 == 1 and self.interval_s is not None:
                ev += [
                    (start + self.offset_s + k * self.interval_s, "trigger", w)
                    for k in range(per_window)
                ]
            yield from sorted(ev, key=lambda e: (e[0], e[1] != "end"))
            w += 1


def window_rates(
    counts: list[int], bucket_s: float, window_s: float, guard_s: float, warmup_s: float
) -> list[float]:
    """Records/s in each complete window after its guard, from a timeline of
    per-bucket counts; the last complete window is dropped too (the sources
    may have run dry in it)."""
    per = round(window_s / bucket_s)
    first = round(warmup_s / bucket_s)
    guard = round(guard_s / bucket_s)
    n = (len(counts) - first) // per - 1
    out = []
    for w in range(max(n, 0)):
        seg = counts[first + w * per + guard : first + (w + 1) * per]
        out.append(sum(seg) / (len(seg) * bucket_s))
    return out


def on_overheads(values: list[float], higher_is_faster: bool = True) -> list[float]:
    """Per on window (odd index) with an off window either side: the
    overhead against the mean of its neighbours."""
    out = []
    for w in range(1, len(values) - 1, 2):
        base = (values[w - 1] + values[w + 1]) / 2
        on = values[w]
        if base > 0 and on > 0:
            out.append(base / on - 1 if higher_is_faster else on / base - 1)
    return out


def on_differences(values: list[float]) -> list[float]:
    """Per on window (odd index) with an off window either side: its value
    minus the mean of its neighbours'."""
    return [values[w] - (values[w - 1] + values[w + 1]) / 2 for w in range(1, len(values) - 1, 2)]


@dataclass
class Window:
    """What one window's counters say, between its guard end and its end."""

    cpu_s: float
    """The process's CPU seconds."""
    idle: float
    """The machine's idle share."""
    roles: dict[str, list[float]]
    """Per thread role, [user, system] CPU seconds (threads that ended within
    the window are not counted)."""
    outside_s: float
    """The machine's busy CPU seconds that were not this process's: write-back
    threads, interrupts, other programs."""


def window_counters(marks: list[tuple[int, str, Counters]], windows: int) -> list[Window]:
    """Per window with both its marks (the first without ends the list)."""
    from snapcut.experiments.machine import busy_seconds

    by: dict[tuple[int, str], Counters] = {(w, k): c for w, k, c in marks}
    out = []
    zero = (0.0, 0.0)
    for w in range(windows):
        a, b = by.get((w, "guard")), by.get((w, "end"))
        if a is None or b is None:
            break
        cpu = b[0] - a[0]
        out.append(
            Window(
                cpu_s=cpu,
                idle=(b[1] - a[1]) / max(b[2] - a[2], 1.0),
                roles={
                    r: [b[3].get(r, zero)[i] - a[3].get(r, zero)[i] for i in (0, 1)]
                    for r in ROLES
                    if r in a[3] or r in b[3]
                },
                outside_s=busy_seconds((a[1], a[2]), (b[1], b[2])) - cpu,
            )
        )
    return out


def clustered_median_ci(
    groups: list[list[float]], resamples: int = 2000, seed: int = 1
) -> tuple[float, float]:
    """95 % bootstrap interval of the median of all values, resampling whole
    runs first and then windows within each: windows of one run share that
    run's conditions, so with several runs the interval must also cover how
    much runs differ. One run: the plain bootstrap over its windows."""
    groups = [g for g in groups if g]
    if len(groups) == 1:
        return bootstrap_median_ci(groups[0], resamples, seed)
    rng = random.Random(seed)
    medians = []
    for _ in range(max(resamples, 1)):
        values = [v for g in rng.choices(groups, k=len(groups)) for v in rng.choices(g, k=len(g))]
        medians.append(statistics.median(values))
    medians.sort()
    return medians[int(0.025 * (len(medians) - 1))], medians[int(0.975 * (len(medians) - 1))]


def cpu_shift(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per "role kind" (e.g. "writer system"): the mean over on windows of
    the share of one CPU it used beyond the mean of the off windows either
    side. A mean, not a median: threads' CPU comes in 10 ms ticks, a few per
    window, so a median would only say how many ticks. Runs recorded before
    threads were counted have none."""
    keys = [f"{r} {k}" for r in ROLES for k in ("user", "system")] + ["outside"]
    out = {}
    for key in keys:
        diffs = [
            d for r in runs for d in on_differences(r.get("thread_cpu_share", {}).get(key, []))
        ]
        if diffs:
            out[key] = statistics.mean(diffs)
    return out
