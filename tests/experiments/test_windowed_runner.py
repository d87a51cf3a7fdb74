"""The windowed method end to end through `snapcut experiment`'s runner:
a known slowdown (more sleep per batch at a slow operator, switched on in
on windows instead of checkpoints) is recovered within its 95 % interval,
and a cell's verdict says it is resolved."""

from __future__ import annotations

import dataclasses
import functools
import statistics

from rich.console import Console

from snapcut.experiments import backpressure
from snapcut.experiments.effects import WINDOWED
from snapcut.experiments.flows import BATCH, scenario_name
from snapcut.experiments.grid import PRESETS, Cell
from snapcut.experiments.runner import Plan, execute
from snapcut.experiments.verdicts import resolved
from snapcut.experiments.windows import measure_windows

SLOW_MS, INJECT_S = 2.0, 0.001


def test_an_injected_slowdown_is_recovered_through_the_runner() -> None:
    preset = dataclasses.replace(
        PRESETS["tiny"],
        repetitions=2,
        windowed_experiments=None,
        window_span_s=0.4,
        window_guard_s=0.1,
        window_warmup_s=0.3,
        on_windows=8,
        window_cell_s=10.0,
    )
    scenario = scenario_name("slow-operator", SLOW_MS)
    cells = [
        Cell("backpressure", p, iv, 1000, 1, 400_000, scenario)
        for p, iv in (("none", None), ("aligned", 0.1))
    ]
    plan = Plan([backpressure.EXPERIMENT], preset, preset.repetitions, cells)
    assert plan.windowed_cells == cells[1:]
    out = execute(
        plan,
        Console(quiet=True),
        windows=functools.partial(measure_windows, inject_s=INJECT_S),
    )
    assert len(out.rows) == 4  # the whole runs stay
    [run] = out.windows
    [effect] = out.effects
    assert effect.method == WINDOWED and effect.samples >= 5, effect
    # The slow operator is the bottleneck: a batch takes BATCH / (records/s
    # off) there, and INJECT_S more in on windows.
    batch_s = BATCH / statistics.median(run.rates[0::2])
    truth = INJECT_S / batch_s
    assert 0.2 < truth < 0.5, truth
    # `truth` leans on the batch time read from the off windows: two points.
    assert effect.low - 0.02 <= truth <= effect.high + 0.02, (effect, truth)
    assert resolved(effect) == "resolved: slower"
    assert effect.checkpoints == 0  # the injection replaced the checkpoints
