"""Experiment 6's pieces: the timed simulator through its binding, the
calibration from measured rows, and the model check's pairing."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.experiment_support import make_row

from snapcut._core import ConfigError, default_cost_model, simulate_scaling
from snapcut.experiments.analysis import Row, summarize
from snapcut.experiments.grid import PRESETS
from snapcut.experiments.scaling_sim import (
    MODEL_CHECK,
    NAME,
    calibrate_from_rows,
    cells,
    model_check,
)


def _sim(protocol: str, nodes: int, interval: float | None, **kw: object) -> dict[str, object]:
    return simulate_scaling(protocol, nodes, 4_000_000, 500_000, interval, **kw)


def test_simulation_replays_from_its_seed_and_reports_every_figure() -> None:
    a = _sim("aligned", 8, 0.1, seed=3)
    assert a == _sim("aligned", 8, 0.1, seed=3)
    assert a["runtime_s"] != _sim("aligned", 8, 0.1, seed=4)["runtime_s"]
    assert a["records"] == 8 * 4_000_000
    assert isinstance(a["checkpoints"], int) and a["checkpoints"] >= 2
    assert len(a["checkpoint_s"]) == a["checkpoints"]
    assert a["paused_s"] == 0.0
    assert a["cost"] == default_cost_model()


def test_sync_pauses_the_sources_and_costs_more_than_abs() -> None:
    none = simulate_scaling("none", 8, 20_000_000, 500_000)
    abs_ = simulate_scaling("aligned", 8, 20_000_000, 500_000, 0.3)
    sync = simulate_scaling("sync", 8, 20_000_000, 500_000, 0.3)
    assert float(sync["paused_s"]) > 0.0
    rt = {k: float(v["runtime_s"]) for k, v in (("none", none), ("abs", abs_), ("sync", sync))}
    assert rt["none"] < rt["abs"] < rt["sync"], rt


def test_cost_overrides_apply_and_bad_ones_are_typed_errors() -> None:
    slow = _sim("none", 2, None, cost={"record_s": 2e-7, "jitter": 0.0})
    fast = _sim("none", 2, None, cost={"record_s": 1e-7, "jitter": 0.0})
    ratio = float(slow["runtime_s"]) / float(fast["runtime_s"])
    assert ratio == pytest.approx(2.0, rel=0.05)
    with pytest.raises(ConfigError, match=r'unknown cost model field "speed".*record_s'):
        _sim("none", 2, None, cost={"speed": 1.0})
    with pytest.raises(ConfigError, match="models none, aligned and sync"):
        _sim("unaligned", 2, 1.0)
    with pytest.raises(ConfigError, match="needs a checkpoint interval"):
        _sim("sync", 2, None)
    with pytest.raises(ConfigError, match=r"cost\.record_s must be"):
        _sim("none", 2, None, cost={"record_s": -1.0})
    with pytest.raises(ConfigError, match="unknown protocol"):
        _sim("abs", 2, 1.0)


def _row(experiment: str, protocol: str, **kw: object) -> Row:
    fields: dict[str, object] = {"keys": 1000, "records": 1_000_000, **kw}
    interval = fields.pop("interval_s", None if protocol == "none" else 1.0)
    return make_row(protocol, interval, experiment=experiment, **fields)


def test_calibration_reads_experiments_1_and_2_first_round_only() -> None:
    rows = [
        _row("interval", "none", runtime_s=0.1),
        _row("interval", "none", runtime_s=0.9, repetition=1),
        _row("interval", "aligned", checkpoint_ms_median=3.0),
        _row("interval", "aligned", interval_s=0.1, checkpoint_ms_median=5.0),
        _row("state-size", "sync", keys=10, state_bytes_max=300, checkpoint_ms_median=1.0),
        _row(
            "state-size", "sync", keys=100_000, state_bytes_max=6_000_000, checkpoint_ms_median=20.0
        ),
    ]
    cal = calibrate_from_rows(rows)
    assert cal is not None
    assert cal.record_s == pytest.approx(0.1 / 1_000_000)
    assert cal.state_bytes_per_key == pytest.approx(6_000_000 / (3 * 100_000))
    assert cal.write_bytes_per_s == pytest.approx(6_000_000 / 0.02)
    cost = cal.cost(4_000_000)
    assert cost["chunk_records"] == 4_000_000 // 200
    assert cost["buffer_records"] == 64 * 4096
    assert cal.cost(600_000_000)["chunk_records"] == 65_536
    assert calibrate_from_rows(rows[:2]) is None
    # No periodic sync checkpoint in experiment 2: experiment 1's sync runs.
    fallback = [r for r in rows if r.experiment != "state-size"] + [
        _row("interval", "sync", keys=1000, state_bytes_max=30_000, checkpoint_ms_median=2.0)
    ]
    cal = calibrate_from_rows(fallback)
    assert cal is not None and cal.write_bytes_per_s == pytest.approx(30_000 / 0.002)


def test_model_check_pairs_one_node_with_experiment_5_at_two_tasks() -> None:
    p = PRESETS["tiny"]
    check_cells = [c for c in cells(p, None) if c.scenario == MODEL_CHECK]
    assert {c.protocol for c in check_cells} == {"none", "aligned", "sync"}
    rows = []
    for c in check_cells:
        rows.append(
            _row(
                NAME,
                c.protocol,
                scenario=MODEL_CHECK,
                parallelism=1,
                keys=c.keys,
                records=c.records,
                interval_s=c.interval_s,
                runtime_s=1.1,
            )
        )
        for par, runtime in ((2, 1.0), (1, 5.0)):
            rows.append(
                _row(
                    "parallelism",
                    c.protocol,
                    parallelism=par,
                    keys=c.keys,
                    records=c.records,
                    interval_s=c.interval_s,
                    runtime_s=runtime,
                )
            )
    got = model_check(summarize(rows))
    assert sorted(k.protocol for k in got) == ["aligned", "none", "sync"]
    for k in got:
        assert (k.measured_s, k.simulated_s) == (1.0, 1.1)
        assert k.error == pytest.approx(0.1)
        # 1.1 s simulated and 1.0 s measured for every protocol: no overheads.
        assert k.measured_overhead == k.simulated_overhead == 0.0


def test_calibration_runs_without_a_periodic_checkpoint_say_what_to_run_instead(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from snapcut.experiments import scaling_sim
    from snapcut.experiments.measurement import Measurement

    def no_checkpoints(_cell: object, _workdir: Path) -> Measurement:
        return Measurement(0.5, 0.6, 8e6, 0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.05, [], [], [])

    monkeypatch.setattr(scaling_sim, "run_cell", no_checkpoints)
    monkeypatch.setattr(scaling_sim, "_measured", {})
    with pytest.raises(RuntimeError, match=r"no periodic checkpoint.*--experiments 1,2,6"):
        scaling_sim.calibrate([], PRESETS["tiny"], tmp_path)
