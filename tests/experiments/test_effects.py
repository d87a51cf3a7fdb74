"""Windowed effects, their verdicts and the windows' plan: pure pieces of
`snapcut experiment`'s windowed method (the end-to-end test is
test_windowed_runner.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from snapcut.dataflow import CheckpointCounts
from snapcut.experiments import resolve
from snapcut.experiments.effects import WINDOWED, Effect, windowed_effect, write_windows_csv
from snapcut.experiments.grid import PRESETS, Cell
from snapcut.experiments.runner import Plan
from snapcut.experiments.verdicts import claim, resolved, trends, width
from snapcut.experiments.windows import (
    MIN_ON_WINDOWS,
    InFlightSkip,
    WindowPlan,
    WindowRun,
    plan_windows,
    run_records,
)


def _cell(protocol: str = "aligned", interval: float | None = 0.1, keys: int = 100) -> Cell:
    return Cell("interval", protocol, interval, keys, 2, 1000)


def test_windows_hold_a_whole_number_of_intervals_and_long_ones_are_fewer() -> None:
    full = PRESETS["full"]
    for iv in (0.05, 0.1, 0.25, 1.0, 2.5, 5.0):
        p = plan_windows(_cell(interval=iv), full)
        n = p.span_s / iv
        assert n >= 1 and abs(n - round(n)) < 1e-9, (iv, p)
        assert MIN_ON_WINDOWS <= p.on_windows <= full.on_windows
    short, long = plan_windows(_cell(interval=0.1), full), plan_windows(_cell(interval=5.0), full)
    assert short.on_windows == full.on_windows and long.on_windows == MIN_ON_WINDOWS
    assert short.seconds <= full.window_cell_s + 1


def test_the_full_grid_plans_to_fit_an_hour() -> None:
    """At the rate the last recorded full run's `none` reached (25-38 M records/s)."""
    full = PRESETS["full"]
    experiments = resolve(None)
    cells = [c for e in experiments for c in e.cells(full, None)]
    plan = Plan(experiments, full, full.repetitions, cells, rate=25e6)
    assert plan.total_estimate() <= 3600
    # Every overhead cell of experiments 1, 2, 4 and 5 gets an effect.
    windowed = {"interval", "state-size", "backpressure", "parallelism"}
    overhead = {c for c in cells if c.protocol != "none" and c.experiment in windowed}
    assert set(plan.windowed_cells) | set(plan.runaway_cells) == overhead
    # Runaways are sync cells whose full write outlasts half the interval.
    assert plan.runaway_cells
    assert all(c.protocol == "sync" and c.keys >= 1_000_000 for c in plan.runaway_cells)
    quick = PRESETS["quick"]
    qcells = [c for e in experiments for c in e.cells(quick, None)]
    assert not Plan(experiments, quick, quick.repetitions, qcells).runaway_cells


def _run(cell: Cell, rates: list[float], run: int = 0) -> WindowRun:
    return WindowRun(
        cell=cell,
        run=run,
        rates=rates,
        cpu_s_per_record=[1.0 / r for r in rates],
        idle=[0.1 if i % 2 else 0.0 for i in range(len(rates))],
        records=1000,
        runtime_s=1.0,
        checkpoints=3,
        skipped=1,
        plan=WindowPlan(0.5, 0.1, 0.5, 4),
    )


def test_a_windowed_run_is_sized_for_its_on_windows_slowdown() -> None:
    """A run spends equal time in off windows (at `rate`) and on windows (at
    rate / (1 + x)): its records fill `run_seconds` at the mean of the two,
    and `off_rate` recovers the off rate from such a run."""
    from snapcut.experiments.runner import off_rate

    plan = WindowPlan(1.0, 0.2, 1.0, 12)
    rate = 1e6
    plain, doubled = run_records(rate, plan, 0.0), run_records(rate, plan, 1.0)
    assert plain == int(rate * plan.run_seconds)
    assert plan.seconds < plan.run_seconds <= plan.seconds * 1.2
    # Half the time at half the rate: three quarters of the records.
    assert abs(doubled / plain - 0.75) < 1e-6
    assert run_records(rate, plan, -0.2) == plain  # a faster on window is not assumed
    assert run_records(rate, plan, 50.0) == run_records(rate, plan, 3.0)  # capped
    w = _run(_cell(), [100.0 if i % 2 == 0 else 50.0 for i in range(25)])
    w.records, w.runtime_s = doubled, plan.run_seconds
    assert abs(off_rate(w) / rate - 1) < 1e-6


def test_a_windowed_effect_is_the_median_on_window_overhead_with_a_run_clustered_interval(
    tmp_path: Path,
) -> None:
    cell = _cell()
    # Off windows at 100 (drifting up), on windows 20 % slower than their neighbours.
    runs = [
        _run(cell, [100, 105 / 1.2, 110, 115 / 1.2, 120, 125 / 1.2, 130, 135 / 1.2, 140], 0),
        _run(cell, [50, 51 / 1.25, 52, 53 / 1.25, 54, 55 / 1.25, 56], 1),
    ]
    e = windowed_effect(runs)
    assert e is not None and e.method == WINDOWED
    assert e.samples == 7 and e.runs == 2
    assert abs(e.overhead - 0.2) < 1e-9
    assert 0.2 - 1e-9 <= e.low <= e.overhead <= e.high <= 0.25 + 1e-9
    assert e.cpu_overhead is not None and abs(e.cpu_overhead - e.overhead) < 0.03
    assert e.idle_on == 0.1 and e.idle_off == 0.0
    assert e.checkpoints == 6 and e.skipped == 2
    assert windowed_effect([_run(cell, [100, 90])]) is None  # no on window with two neighbours
    write_windows_csv(runs, tmp_path / "w.csv")
    lines = (tmp_path / "w.csv").read_text().splitlines()
    assert len(lines) == 1 + 9 + 7 and lines[1].startswith("interval,,aligned,0.1,100,2,0,0,0")


def _effect(protocol: str, lo: float, hi: float, **cell: float) -> Effect:
    c = dataclasses.replace(_cell(protocol), **cell)  # type: ignore[arg-type]
    return Effect(c, WINDOWED, (lo + hi) / 2, lo, hi, 10, 1)


def test_verdicts_say_resolved_width_and_the_papers_claim() -> None:
    abs_small = _effect("aligned", 0.01, 0.05)
    sync_big = _effect("sync", 0.2, 0.4)
    effects = [abs_small, sync_big]
    assert resolved(abs_small) == "resolved: slower"
    assert resolved(_effect("aligned", -0.05, -0.01)) == "resolved: faster"
    assert resolved(_effect("aligned", -0.01, 0.01)).startswith("not resolved")
    assert width(abs_small) == "4.0 pts"
    # 20 points over 10 samples: 10 points would take (20/10)^2 = 4x the samples.
    assert width(sync_big) == "20.0 pts (> 10 pts: ~40 on windows, has 10)"
    assert claim(abs_small, effects).startswith("holds")
    assert claim(_effect("aligned", 0.12, 0.2), effects).startswith("fails")
    assert claim(_effect("aligned", 0.05, 0.2), effects).startswith("undecided")
    assert claim(sync_big, effects) == "holds: sync costs more than ABS"
    assert claim(_effect("sync", -0.02, 0.0), effects) == "fails: sync costs less than ABS"
    assert claim(_effect("sync", 0.03, 0.1), effects).startswith("undecided")


def test_sync_trends_compare_the_ends_of_each_sweep() -> None:
    effects = [
        _effect("sync", 0.3, 0.5, interval_s=0.05),
        _effect("sync", 0.0, 0.02, interval_s=1.0),
        _effect("sync", 0.2, 0.4, interval_s=0.05, keys=10_000),
        _effect("sync", 0.25, 0.45, interval_s=1.0, keys=10_000),
    ]
    by = {t.what: t.verdict() for t in trends(effects)}
    assert by["interval, 100 keys: sync at 0.05 s costs more than at 1 s"] == "holds"
    assert by["interval, 10,000 keys: sync at 0.05 s costs more than at 1 s"].startswith(
        "undecided"
    )
    assert by["interval @ 1 s: sync with 10,000 keys costs more than with 100"] == "holds"


class _Control:
    """A JobControl whose checkpoints end when the test says so."""

    def __init__(self) -> None:
        self.triggered = 0
        self.counts = CheckpointCounts(0, 0, 0)

    def trigger_checkpoint(self) -> None:
        self.triggered += 1

    def checkpoints(self) -> CheckpointCounts:
        return self.counts


def test_a_trigger_is_skipped_while_the_last_checkpoint_is_in_flight() -> None:
    control = _Control()
    fire = InFlightSkip(control)  # type: ignore[arg-type]
    fire()
    assert control.triggered == 1
    fire()  # sent, not yet started by the coordinator: in no count
    assert (control.triggered, fire.skipped) == (1, 1)
    control.counts = CheckpointCounts(1, 0, 0)
    fire()  # started, not completed
    assert (control.triggered, fire.skipped) == (1, 2)
    control.counts = CheckpointCounts(1, 1, 0)
    fire()
    assert (control.triggered, fire.skipped) == (2, 2)
    control.counts = CheckpointCounts(2, 1, 1)  # checkpoint 2 aborted: the next fires
    fire()
    assert (control.triggered, fire.skipped) == (3, 2)


def test_with_an_offset_an_on_windows_measured_span_holds_exactly_its_checkpoints() -> None:
    from snapcut.experiments.windowed import Trigger

    # A 1 s interval in windows of 0.2 s guard + 1 s: one trigger, at the guard's end.
    trigger = Trigger(None, 1.2, 0.2, 1.0, 0.0, offset_s=0.2)
    events = trigger._events(0.0)
    every = [next(events) for _ in range(9)]
    assert [e for e in every if e[1] == "trigger"] == [(1.4, "trigger", 1)]
    trigger = Trigger(None, 0.6, 0.1, 0.25, 0.0, offset_s=0.1)
    events = trigger._events(0.0)
    every = [next(events) for _ in range(10)]
    assert [e[0] for e in every if e[1] == "trigger"] == [0.7, 0.95]


def test_a_windowed_run_that_ended_early_is_run_once_more_at_its_own_rate() -> None:
    from rich.console import Console

    from snapcut.experiments.measurement import Measurement
    from snapcut.experiments.runner import execute

    def whole(cell: Cell, workdir: Path, budget_s: float | None = None) -> Measurement:
        t = 1.0 if cell.protocol == "none" else 1.5
        return Measurement(t, t, cell.records, 0, 0, 0, 0, 0, 0, 0, 0.05, [], [], [])

    asked: list[tuple[float, int, float]] = []

    def windows(
        cell: Cell,
        plan: WindowPlan,
        rate: float,
        workdir: Path,
        *,
        run: int = 0,
        overhead: float = 0.0,
    ) -> WindowRun:
        asked.append((rate, run, overhead))
        n = 5 if run == 0 else 2 * plan.on_windows + 1  # the first: two on windows
        r = _run(cell, [100.0 if i % 2 == 0 else 90.0 for i in range(n)], run)
        r.records, r.runtime_s = 1000, 4.0
        return r

    preset = dataclasses.replace(PRESETS["tiny"], repetitions=1, on_windows=6, window_cell_s=99)
    cells = [_cell("none", None), _cell("aligned", 0.1)]
    plan = Plan(resolve(["interval"]), preset, 1, cells)
    out = execute(plan, Console(quiet=True), run=whole, windows=windows)
    # The whole runs' rate and overhead (+50 %), then its own mean rate.
    assert asked == [(1000.0, 0, 0.5), (250.0, 1, 0.0)]
    [e] = out.effects
    assert e.runs == 2 and e.samples == 2 + 6


def test_the_figures_with_intervals_draw_experiments_1_and_2(tmp_path: Path) -> None:
    from snapcut.experiments.figure import paper_figure, state_figure

    effects = [
        _effect(p, lo, hi, interval_s=iv, keys=k)
        for p, lo, hi in (("aligned", 0.0, 0.05), ("sync", 0.1, 0.3))
        for iv in (0.1, 1.0)
        for k in (100, 10_000)
    ]
    state = [
        dataclasses.replace(e, cell=dataclasses.replace(e.cell, experiment="state-size"))
        for e in effects
    ]
    [fig1] = paper_figure(effects, tmp_path)
    [fig2] = state_figure(state, tmp_path)
    for f in (fig1, fig2):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 10_000
    assert paper_figure(state, tmp_path) == [] and state_figure(effects, tmp_path) == []


def test_paired_batches_recover_a_known_slowdown_and_pair_within_a_round(
    tmp_path: Path,
) -> None:
    """Experiment 7's estimator: sync's batches take 1.3x the same round's
    snapshots-off batch (with noise), background's the same time; a slower
    round slows all three variants alike and must not leak into the ratio."""
    import random

    from snapcut.experiments.spark_writes import (
        PAIRED_BATCHES,
        paired_effects,
        write_batches_csv,
    )

    rng = random.Random(3)
    # Two grid rounds of two query rounds each: four query rounds, clustered apart.
    played: dict[tuple[Cell, int], list[tuple[float, ...]]] = {}
    for rnd in range(4):
        speed = 1.0 + rnd  # query round 3 runs 4x slower than query round 0
        base = [speed * rng.uniform(0.8, 1.2) for _ in range(8)]
        for variant, factor in (("none", 1.0), ("background", 1.0), ("sync", 1.3)):
            cell = Cell("spark", variant, None, 1000, 2, 500)
            times = tuple(t * factor * rng.uniform(0.97, 1.03) for t in base)
            played.setdefault((cell, rnd // 2), []).append(times)
    batches = {k: tuple(v) for k, v in played.items()}
    effects = {e.cell.protocol: e for e in paired_effects(batches)}
    assert set(effects) == {"background", "sync"}
    sync, background = effects["sync"], effects["background"]
    assert sync.method == PAIRED_BATCHES and (sync.samples, sync.runs) == (32, 4)
    assert sync.low <= 0.3 <= sync.high and sync.width < 0.05, sync
    assert background.low <= 0.0 <= background.high, background
    from snapcut.experiments.effects_report import effects_table

    row = next(line for line in effects_table([sync], [sync]).splitlines() if "| sync |" in line)
    assert "| paired batches |" in row and "windowed" not in row, row
    # batches.csv: every measured batch, by grid round and query round.
    write_batches_csv(batches, tmp_path / "batches.csv")
    lines = (tmp_path / "batches.csv").read_text().splitlines()
    assert len(lines) == 1 + 4 * 3 * 8, lines[:3]
    assert lines[1].startswith("spark,") and {ln.split(",")[4] for ln in lines[1:]} == {"0", "1"}
