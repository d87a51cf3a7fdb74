"""`snapcut experiment`: the --tiny grid end to end through the CLI, and the
pieces that turn measurements into figures (rotation, overheads, stalls)."""

from __future__ import annotations

import csv
import re
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from tests.experiment_support import make_row
from tests.thread_support import named_thread

from snapcut._core import ConfigError
from snapcut.cli import main
from snapcut.experiments import EXPERIMENTS, resolve
from snapcut.experiments.analysis import Row, overheads, read_csv, summarize, write_csv
from snapcut.experiments.grid import PRESETS, Cell, schedule
from snapcut.experiments.job import longest_stall
from snapcut.experiments.machine import Machine
from snapcut.experiments.runner import BUDGET_FLOOR_S

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    width, height = struct.unpack(">II", data[16:24])
    assert data[-8:-4] == b"IEND", f"{path} is truncated"
    return width, height


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("tiny")
    code = main(["experiment", "--tiny", "--out", str(out)])
    assert code == 0
    return out, "ok"


def test_tiny_grid_writes_every_cell_of_every_experiment(tiny_run: tuple[Path, str]) -> None:
    out, _ = tiny_run
    p = PRESETS["tiny"]
    expected = Counter(c for e in EXPERIMENTS.values() for c in e.cells(p, None))
    rows = read_csv(out / "results.csv")
    got = Counter(r.cell for r in rows)
    assert set(got) == set(expected)
    assert all(n == p.repetitions for n in got.values()), got
    # Each experiment's protocols: the paper's five in experiment 1.
    assert {c.protocol for c in got if c.experiment == "interval"} == {
        "none",
        "aligned",
        "unaligned",
        "chandy-lamport",
        "sync",
    }
    for r in rows:
        # Each assertion names its row: CI once failed here with no more said.
        if r.completed < 1.0:
            # Tiny runs take well under a second alone, but a CI pool at nice 10
            # beside a nice -5 stream gets a few % of a core: a run with
            # checkpoints may then reach its budget and be stopped, measured from
            # its last checkpoint (job.stopped_at_budget).
            assert r.protocol != "none" and r.wall_s >= BUDGET_FLOOR_S, r
            if r.completed == 0.0:
                assert r.runtime_s == float("inf") and r.throughput_rps == 0.0, r
                continue
        assert r.runtime_s > 0 and r.throughput_rps > 0, r
        assert r.throughput_rps == pytest.approx(r.records / r.runtime_s, rel=0.05), r
        if r.protocol == "none":
            assert r.checkpoints == 0, r
    assert any(r.checkpoints > 0 for r in rows if r.protocol == "sync"), rows
    # Rounds ran in rotated orders.
    first = {}
    for r in sorted(rows, key=lambda r: r.order):
        first.setdefault(r.repetition, r.cell)
    assert first[0] != first[1], first


def test_tiny_report_names_the_machine_and_shows_tables_and_plots(
    tiny_run: tuple[Path, str],
) -> None:
    out, _ = tiny_run
    report = (out / "report.md").read_text()
    m = Machine()
    assert m.cpu_model in report
    assert f"{m.cores} cores" in report
    assert "load average" in report and "before" in report and "after" in report
    assert "smoke run" in report
    for e in EXPERIMENTS.values():
        assert f"## {e.number}. {e.title}" in report
    assert "| sync |" in report and "| aligned |" in report
    # Experiment 1's overhead cells ran windowed too (--tiny: only experiment 1).
    effects = report.split("### 1. Overheads with 95 % intervals")[1].split("\n## ")[0]
    rows = [line for line in effects.splitlines() if line.startswith("| ") and "---" not in line]
    cells_1 = [c for c in EXPERIMENTS["interval"].cells(PRESETS["tiny"], None)]
    # Under heavy load a run may end before an on window has both neighbours: named.
    unmeasured = effects.split("No effect")[1].count("interval · ") if "No effect" in effects else 0
    assert len(rows) - 1 + unmeasured == sum(1 for c in cells_1 if c.protocol != "none")
    assert len(rows) - 1 >= 1
    assert all("| windowed |" in r for r in rows[1:])
    assert re.search(r"\| \*\*[+-]\d+\.\d%\*\* \| \[[+-]\d+\.\d%, [+-]\d+\.\d%\] \|", effects)
    assert "### 2. Overheads" not in report
    with (out / "windows.csv").open() as f:
        windows = list(csv.DictReader(f))
    assert {w["protocol"] for w in windows} == {"aligned", "unaligned", "chandy-lamport", "sync"}
    assert {w["on"] for w in windows} == {"0", "1"}
    with (out / "effects.csv").open() as f:
        effect_rows = list(csv.DictReader(f))
    assert len(effect_rows) == len(rows) - 1
    for r in effect_rows:
        assert float(r["low"]) <= float(r["overhead"]) <= float(r["high"])
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    assert {
        "interval_paper_figure.png",
        "interval_runtime.png",
        "interval_overhead.png",
        "timeline.png",
        "state_size_overhead.png",
        "parallelism_throughput.png",
        "backpressure.png",
        "scaling_sim.png",
    } <= names
    # Experiment 6 says it is a simulation, how it was calibrated, and how
    # far the model is from experiment 5 where they overlap.
    assert "**This is a simulation**" in report
    # From experiments 1 and 2 when their sync runs took periodic checkpoints
    # (timing-dependent at this size), else from two short calibration runs.
    assert re.search(r"Cost model \(calibrated from (experiments 1 and 2|two short)", report)
    assert "| record_s |" in report and "| write_bytes_per_s |" in report
    check = report.split("Model check against experiment 5")[1].split("\n\n")[1]
    assert {line.split("|")[1].strip() for line in check.splitlines()[2:]} == {
        "none",
        "aligned",
        "sync",
    }
    assert "Not in this harness yet" not in report
    for p in pngs:
        w, h = _png_size(p)
        assert w > 100 and h > 100
        assert f"]({p.name})" in report
    # The timeline holds the source's records of each timeline cell, all of them.
    with (out / "timeline.csv").open() as f:
        lines = list(csv.DictReader(f))
    by_protocol = Counter[str]()
    for line in lines:
        by_protocol[line["protocol"]] += int(line["source_records"])
    timeline_records = PRESETS["tiny"].timeline_records
    assert dict(by_protocol) == {p: timeline_records for p in ("none", "aligned", "sync")}


def _row(protocol: str, interval: float | None, rep: int, runtime: float, **kw: int) -> Row:
    return make_row(protocol, interval, rep, runtime, **kw)


def test_overhead_is_paired_with_none_of_the_same_round_and_group() -> None:
    rows = [
        _row("none", None, 0, 2.0),
        _row("none", None, 1, 4.0),  # a busier round: everything slower
        _row("sync", 0.1, 0, 3.0),
        _row("sync", 0.1, 1, 5.0),
        _row("aligned", 0.1, 0, 2.2),
        _row("aligned", 0.1, 1, 4.4),
        # Another group (more keys) with its own baseline.
        _row("none", None, 0, 10.0, keys=1000),
        _row("sync", 0.1, 0, 30.0, keys=1000),
        # No baseline in its group: no overhead.
        _row("sync", 0.1, 0, 1.0, keys=7),
    ]
    ovh = overheads(rows)
    sync = Cell("interval", "sync", 0.1, 100, 2, 1000)
    assert ovh[sync] == pytest.approx([0.5, 0.25])
    by_cell = {s.cell: s for s in summarize(rows)}
    s = by_cell[sync]
    assert s.overhead_median == pytest.approx(0.375)
    assert (s.overhead_min, s.overhead_max) == pytest.approx((0.25, 0.5))
    assert (s.runtime_median, s.runtime_min, s.runtime_max) == (4.0, 3.0, 5.0)
    aligned = by_cell[Cell("interval", "aligned", 0.1, 100, 2, 1000)]
    assert aligned.overhead_median == pytest.approx(0.1)
    assert by_cell[Cell("interval", "sync", 0.1, 1000, 2, 1000)].overhead_median == 2.0
    assert by_cell[Cell("interval", "sync", 0.1, 7, 2, 1000)].overhead_median is None
    assert by_cell[Cell("interval", "none", None, 100, 2, 1000)].overhead_median == 0.0


def test_slowdown_is_runtime_over_the_paired_none() -> None:
    from snapcut.experiments.plots import slowdown

    rows = [
        _row("none", None, 0, 2.0),
        _row("none", None, 1, 4.0),
        _row("sync", 0.1, 0, 3.0),
        _row("sync", 0.1, 1, 5.0),
        _row("sync", 0.1, 0, 1.0, keys=7),  # no baseline in its group
    ]
    by_cell = {s.cell: s for s in summarize(rows)}
    assert slowdown(by_cell[Cell("interval", "sync", 0.1, 100, 2, 1000)]) == pytest.approx(
        (1.375, 1.25, 1.5)
    )
    assert slowdown(by_cell[Cell("interval", "sync", 0.1, 7, 2, 1000)]) is None


def test_results_csv_round_trips(tmp_path: Path) -> None:
    rows = [_row("none", None, 0, 2.0), _row("sync", 0.25, 1, 3.5, keys=5)]
    write_csv(rows, tmp_path / "r.csv")
    assert read_csv(tmp_path / "r.csv") == rows


def test_schedule_rotates_each_round_and_runs_every_cell_once_per_round() -> None:
    cells = [Cell("interval", "sync", float(i), 1, 1, 1) for i in range(6)]
    runs = schedule(cells, 3)
    assert len(runs) == 18
    for r in range(3):
        assert sorted(c for rep, c in runs if rep == r) == sorted(cells)
    firsts = [c for i, (_, c) in enumerate(runs) if i % 6 == 0]
    assert len(set(firsts)) == 3


def test_estimate_charges_sync_stalls_and_their_runaway_when_they_outlast_the_interval() -> None:
    from snapcut.experiments.runner import Plan

    plan = Plan([], PRESETS["quick"], 1, [], rate=5e6)
    none = plan.estimate(Cell("state-size", "none", None, 1_000_000, 2, 4_000_000))
    aligned = plan.estimate(Cell("state-size", "aligned", 0.1, 1_000_000, 2, 4_000_000))
    sync_1s = plan.estimate(Cell("state-size", "sync", 1.0, 1_000_000, 2, 4_000_000))
    sync_100ms = plan.estimate(Cell("state-size", "sync", 0.1, 1_000_000, 2, 4_000_000))
    assert none == aligned
    assert none < sync_1s < sync_100ms
    # Measured: this cell ran 123 s, 918 back-to-back checkpoints.
    assert sync_100ms > 30 * (none - 0.15)


def test_runs_with_checkpoints_get_a_budget_of_twenty_times_their_job_without() -> None:
    from snapcut.experiments.runner import BUDGET_FACTOR, BUDGET_FLOOR_S, SETUP_S, Plan

    plan = Plan([], PRESETS["quick"], 1, [], rate=5e6)
    none = Cell("state-size", "none", None, 1_000_000, 2, 100_000_000)
    sync = Cell("state-size", "sync", 0.1, 1_000_000, 2, 100_000_000)
    assert plan.budget(none) is None
    budget = plan.budget(sync)
    assert budget == pytest.approx(BUDGET_FACTOR * (100_000_000 / 5e6 + SETUP_S))
    # The stall outlasts the interval: the estimate is the budget, not 50x.
    assert plan.estimate(sync) == budget
    small = Cell("state-size", "sync", 1.0, 10_000, 2, 1_000_000)
    assert plan.budget(small) == BUDGET_FLOOR_S


def test_a_runaway_sync_run_is_stopped_at_its_budget_and_projected_from_its_progress(
    tmp_path: Path,
) -> None:
    from snapcut.experiments.analysis import row_of
    from snapcut.experiments.job import run_cell
    from snapcut.experiments.report import table

    # 300k keys in three stages: every 10 ms the job stops to write ~20 MiB.
    cell = Cell("state-size", "sync", 0.01, 300_000, 2, 50_000_000)
    m = run_cell(cell, tmp_path, budget_s=4.0)
    assert 0.0 < m.completed < 1.0
    assert m.wall_s >= 4.0
    assert m.runtime_s == pytest.approx(m.wall_s / m.completed)
    assert m.throughput_rps == pytest.approx(m.completed * cell.records / m.wall_s)
    assert m.checkpoints >= 1 and m.state_bytes_max > 0
    assert not (tmp_path / "checkpoints").exists()
    row = row_of(cell, m, repetition=0, order=0)
    write_csv([row], tmp_path / "r.csv")
    assert read_csv(tmp_path / "r.csv") == [row]
    (summary,) = summarize([row])
    assert summary.stopped == 1 and summary.completed_min == m.completed
    line = table([summary]).splitlines()[-1]
    assert "1 (1 stopped" in line and "projected" in line


def test_a_run_stopped_before_any_checkpoint_has_no_known_progress(tmp_path: Path) -> None:
    from snapcut.experiments.job import stopped_at_budget

    cell = Cell("state-size", "sync", 0.1, 10, 2, 1000)
    m = stopped_at_budget(cell, tmp_path / "never-written", 2.0)
    assert m.completed == 0.0 and m.runtime_s == float("inf") and m.checkpoints == 0


def test_results_written_before_budgets_read_as_finished(tmp_path: Path) -> None:
    rows = [_row("none", None, 0, 2.0), _row("sync", 0.25, 0, 3.5)]
    write_csv(rows, tmp_path / "r.csv")
    lines = (tmp_path / "r.csv").read_text().splitlines()
    old = [",".join(line.split(",")[:-1]) for line in lines]  # drop `completed`
    assert lines[0].endswith(",completed") and "completed" not in old[0]
    (tmp_path / "old.csv").write_text("\n".join(old) + "\n")
    assert read_csv(tmp_path / "old.csv") == rows


def test_quick_preset_keeps_sync_stalls_shorter_than_its_intervals() -> None:
    from snapcut.experiments.runner import STATE_BYTES_PER_KEY, WRITE_BYTES_PER_S

    quick = PRESETS["quick"]
    stall = 2 * max(quick.state_keys) * STATE_BYTES_PER_KEY / WRITE_BYTES_PER_S
    assert stall < 0.5 * min(quick.state_intervals)


def test_longest_stall_counts_empty_buckets_inside_the_run() -> None:
    assert longest_stall([0, 0, 5, 0, 0, 0, 3, 0, 4, 0, 0], 0.05) == pytest.approx(0.15)
    assert longest_stall([1, 2, 3], 0.05) == 0.0
    assert longest_stall([], 0.05) == 0.0


def test_unknown_names_are_typed_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="unknown experiment 'speed'"):
        resolve(["speed"])
    assert [e.name for e in resolve(["6"])] == ["scaling-sim"]
    assert [e.name for e in resolve(["7"])] == ["spark"]
    with pytest.raises(ConfigError, match="unknown experiment '8'"):
        resolve(["8"])
    assert [e.name for e in resolve(["3,interval"])] == ["interval", "timeline"]
    assert main(["experiment", "--tiny", "--experiments", "nope", "--dry-run"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert main(["experiment", "--tiny", "--protocols", "none,abs", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown protocol 'abs'" in err and "chandy-lamport" in err
    assert main(["experiment", "--tiny", "--repetitions", "0", "--dry-run"]) == 2
    assert "repetitions must be at least 1" in capsys.readouterr().err


def test_module_entry_point_prints_the_plan_and_estimate() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "snapcut.experiments", "--tiny", "--dry-run", "--no-plots"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "preset tiny" in out and "estimated time" in out
    assert "1. Runtime vs snapshot interval (interval)" in out


def test_the_paper_job_passes_every_record_through_every_stage_and_times_them() -> None:
    from snapcut import Checkpointing
    from snapcut.experiments.job import build

    flow = build(records=20_000, keys=50, parallelism=2)
    report = flow.run(Checkpointing(protocol="aligned", interval=0.001))
    result = report.results["result"]
    assert result.num_rows == 50
    assert sum(result["count"].to_pylist()) == 20_000
    assert report.timeline_bucket_s == pytest.approx(0.05)
    # The timeline counts what each operator received (the source: emitted).
    sums = {name: sum(counts) for name, counts in report.timeline.items()}
    assert sums["source"] == sums["stage1"] == sums["stage2"] == sums["stage3"] == 20_000
    assert sums["collect-result"] == 50
    # Keyed state at every stage: each checkpoint captured all three.
    assert any(c.state_bytes > 0 for c in report.completed_checkpoints)


def test_forward_must_be_a_bool() -> None:
    from snapcut import Dataflow

    flow = Dataflow()
    events = flow.generate_dwell_events(users=3, count=10)
    with pytest.raises(ConfigError, match="forward= must be a bool"):
        events.key_by("user").aggregate(forward="yes", n="count")  # type: ignore[arg-type]


def test_thread_cpu_reads_each_threads_user_and_system_time() -> None:
    from snapcut.experiments.machine import parse_task_stat, thread_cpu

    # A name with spaces and parentheses: the fields count from the last ')'.
    line = "4242 (snapcut-a) b) R 1 2 3 4 5 6 7 8 9 10 250 17 0 0 20 0 1 0"
    assert parse_task_stat(line) == ("snapcut-a) b", 250, 17)
    with pytest.raises(ValueError):
        parse_task_stat("4242 no name here")
    if not thread_cpu():
        pytest.skip("no /proc/self/task on this platform")

    def spin() -> None:
        # Its own CPU clock, not the wall clock: on a busy machine it just takes longer.
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    assert "snapcut-tcpu" not in thread_cpu()
    # Read while the thread is alive: an ended thread is not counted.
    with named_thread("snapcut-tcpu", spin):
        during = thread_cpu()
    user, system = during["snapcut-tcpu"]
    assert 0.2 <= user + system <= 5
    assert all(u >= 0 and k >= 0 for u, k in during.values())


def test_thread_ids_name_each_live_thread() -> None:
    from snapcut.experiments.machine import thread_ids

    if not thread_ids():
        pytest.skip("no /proc/self/task on this platform")
    assert thread_ids()[threading.get_native_id()]  # this thread has a name
    with named_thread("snapcut-tids") as tid:
        assert thread_ids()[tid] == "snapcut-tids"
    # join() returns when Python's thread state is released, a moment before
    # the OS thread leaves /proc/self/task: wait for it, at most 5 s.
    deadline = time.monotonic() + 5.0
    while tid in thread_ids() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tid not in thread_ids()


def test_machine_warns_on_cpus_busy_now_not_on_a_past_load() -> None:
    from snapcut.experiments.machine import busy_share

    assert busy_share((100, 1000), (150, 1100)) == pytest.approx(0.5)
    assert busy_share((100, 1000), (200, 1100)) == pytest.approx(0.0)
    assert busy_share((100, 1000), (100, 1000)) is None
    from snapcut.experiments.machine import CLOCK_TICKS_PER_S, busy_seconds

    # 100 ticks passed, 50 of them idle: 50 busy ticks.
    assert busy_seconds((100, 1000), (150, 1100)) == pytest.approx(50 / CLOCK_TICKS_PER_S)
    # The benchmark that just ended left a 1-minute load of 9: no warning
    # while the CPUs are idle now.
    quiet = Machine(load_before=(9.0, 7.0, 5.0), busy_before=0.03).markdown()
    assert "was busy" not in quiet and "before the run: 3%" in quiet
    busy = Machine(load_before=(0.1, 0.1, 0.1), busy_before=0.6).markdown()
    assert "**The machine was busy when the run started** (its CPUs were 60% busy" in busy
    # Without /proc/stat, the load average decides.
    no_proc = Machine(load_before=(3.0, 1.0, 1.0), busy_before=None, usable_cores=2).markdown()
    assert "1-minute load 3.00 on 2 cores" in no_proc
