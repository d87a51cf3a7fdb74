"""The windowed method end to end through `snapcut experiment`'s runner:
a known slowdown (more sleep per batch at a slow operator, switched on in
on windows instead of checkpoints) is recovered within its 95 % interval,
and a cell's verdict says it is resolved."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from typing import Any

import pytest
from rich.console import Console

from snapcut.experiments import backpressure, flows
from snapcut.experiments.effects import WINDOWED
from snapcut.experiments.flows import BATCH, scenario_name
from snapcut.experiments.grid import PRESETS, Cell
from snapcut.experiments.runner import Plan, execute
from snapcut.experiments.verdicts import resolved
from snapcut.experiments.windows import WindowRun, measure_windows

# The injection doubles the slow operator's sleep: a loaded CI guest (3 pytest
# workers on 2 cores, Spark beside) once drowned a +50 % one in its noise.
SLOW_MS, INJECT_S = 2.0, 0.002
SLOW_S = SLOW_MS / 1e3


def test_an_injected_slowdown_is_recovered_through_the_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # When each batch's sleep began, and how long it was asked to be: the
    # slow operator's own clock of its batches, apart from the runtime's timeline.
    calls: list[tuple[float, float]] = []
    sleep = time.sleep

    def timed_sleep(s: float) -> None:
        calls.append((time.perf_counter(), round(s, 6)))
        sleep(s)

    monkeypatch.setattr(flows.time, "sleep", timed_sleep)
    preset = dataclasses.replace(
        PRESETS["tiny"],
        repetitions=2,
        windowed_experiments=None,
        window_span_s=0.4,
        window_guard_s=0.1,
        window_warmup_s=0.3,
        on_windows=12,
        window_cell_s=10.0,
    )
    scenario = scenario_name("slow-operator", SLOW_MS)
    cells = [
        Cell("backpressure", p, iv, 1000, 1, 400_000, scenario)
        for p, iv in (("none", None), ("aligned", 0.1))
    ]
    plan = Plan([backpressure.EXPERIMENT], preset, preset.repetitions, cells)
    assert plan.windowed_cells == cells[1:]

    def windowed(*args: Any, **kwargs: Any) -> WindowRun:
        calls.clear()  # the windowed run's batches only
        return measure_windows(*args, inject_s=INJECT_S, **kwargs)

    out = execute(
        plan,
        Console(quiet=True),
        windows=windowed,
    )
    assert len(out.rows) == 4  # the whole runs stay
    [run] = out.windows
    [effect] = out.effects
    assert effect.method == WINDOWED and effect.samples >= 5, effect
    # The slow operator is the bottleneck: the time from one of its batches
    # to the next is the job's time per batch. Its mean in on windows (INJECT_S
    # more sleep, and whatever else that brings) over off windows, - 1, is the
    # slowdown the windows should find.
    gaps: dict[float, list[float]] = {}
    for (t0, s0), (t1, s1) in itertools.pairwise(calls):
        if s0 == s1 and s0 in (SLOW_S, round(SLOW_S + INJECT_S, 6)):
            gaps.setdefault(s0, []).append(t1 - t0)
    off, on = (statistics.mean(gaps[s]) for s in (SLOW_S, round(SLOW_S + INJECT_S, 6)))
    truth = on / off - 1
    # The injection must be a clear slowdown for the rest to mean anything; how
    # clear depends on the machine's load (a loaded guest oversleeps both
    # windows, which shrinks the ratio: 0.285 of a nominal 0.5 was seen in CI),
    # so only its order is checked here. Whether the windows find it is
    # checked below.
    assert 0.3 < truth < 1.6, (truth, INJECT_S / (BATCH / statistics.median(run.rates[0::2])))
    # Batches straddling a switch, the timeline's 50 ms buckets: two points.
    assert effect.low - 0.02 <= truth <= effect.high + 0.02, (effect, truth)
    assert resolved(effect) == "resolved: slower", (effect, truth)
    assert effect.checkpoints == 0  # the injection replaced the checkpoints
