"""Experiment 7 (`snapcut experiment --experiments spark`) end to end on a
small size: the three variants' queries run at once in each round, fed one
micro-batch at a time in turn, through the grid runner; every micro-batch
after the state-building one is measured, and background / sync get a
paired effect against snapshots off."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from tests.spark_support import start_session

from snapcut import ConfigError
from snapcut.experiments import EXPERIMENTS
from snapcut.experiments.grid import PRESETS, Cell
from snapcut.experiments.runner import Plan, execute
from snapcut.experiments.spark_writes import (
    PAIRED_BATCHES,
    VARIANTS,
    feed,
    run_round,
    simulate,
    start_query,
    write_inputs,
)
from snapcut.experiments.verdicts import claim

# One query round a grid round (clustering over several is
# tests/experiments/test_effects.py's): each round is three queries, and two
# a grid round made this the slowest test in CI's pool (199 s).
SIZE = dataclasses.replace(
    PRESETS["tiny"], spark_keys=(2_000,), spark_records=4_000, spark_batches=2, spark_rounds=(1,)
)
QUERY_ROUNDS = SIZE.spark_rounds[0]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # The experiment's own session (getOrCreate) is this one.
    session = start_session("local[2]")
    yield session
    session.stop()


def test_experiment_7_pairs_each_variants_batches_with_snapshots_off(spark: Any) -> None:
    experiment = EXPERIMENTS["spark"]
    cells = experiment.cells(SIZE, None)
    assert {c.protocol for c in cells} == set(VARIANTS)
    plan = Plan([experiment], SIZE, 2, cells)
    out = execute(plan, Console(file=io.StringIO()))
    assert len(out.rows) == 6 and len(out.batches) == 6
    # Rounds rotate the order: no variant always runs first.
    firsts = {r.cell.protocol for r in out.rows if r.order % 3 == 0}
    assert len(firsts) == 2, [(r.order, r.cell.protocol) for r in out.rows]
    for (cell, _round), played in out.batches.items():
        # Each grid round runs the size's query rounds (spark_rounds).
        assert len(played) == QUERY_ROUNDS, (cell, played)
        for times in played:
            assert len(times) == SIZE.spark_batches and all(t > 0 for t in times), (cell, times)
    for row in out.rows:
        # Each measured batch committed one state version (none: no snapshots).
        want = 0 if row.cell.protocol == "none" else QUERY_ROUNDS * SIZE.spark_batches
        assert row.checkpoints == want, row
        assert (row.state_bytes_max > 0) == (row.cell.protocol != "none"), row
    effects = {e.cell.protocol: e for e in out.effects}
    assert set(effects) == {"background", "sync"}
    # sync is held against background writes (the asynchronous phase), not `aligned`
    assert not claim(effects["sync"], out.effects).startswith("no ABS cell")
    verdict = claim(effects["background"], out.effects)
    assert verdict.startswith(("holds: ABS", "fails: ABS", "undecided")), verdict
    for e in effects.values():
        assert e.method == PAIRED_BATCHES
        # Clustered by query round: 2 grid rounds x the query rounds.
        runs = 2 * QUERY_ROUNDS
        assert (e.samples, e.runs) == (runs * SIZE.spark_batches, runs)
        assert e.low <= e.overhead <= e.high


def test_a_query_without_a_measured_batch_is_refused(spark: Any, tmp_path: Path) -> None:
    cell = Cell("spark", "sync", None, 100, 2, 200)
    with pytest.raises(ConfigError, match="at least one measured one"):
        simulate(cell, [], dataclasses.replace(SIZE, spark_batches=0), tmp_path)
    with pytest.raises(ConfigError, match="is not one of"):
        simulate(dataclasses.replace(cell, protocol="aligned"), [], SIZE, tmp_path)
    # spark_rounds names a count per size, each at least 1.
    for wrong in ((2, 2), (0,)):
        bad = dataclasses.replace(SIZE, spark_rounds=wrong)
        with pytest.raises(ConfigError, match="must give a count >= 1 for each of spark_keys"):
            EXPERIMENTS["spark"].cells(bad, None)


def test_a_round_feeds_the_variants_batch_by_batch_in_rotated_turns(
    spark: Any, tmp_path: Path
) -> None:
    src = write_inputs(tmp_path / "in", 300, 600, 3)
    got = run_round(spark, src, 3, tmp_path / "work", turn=1)
    assert set(got) == set(VARIANTS)
    for v in got.values():
        assert len(v.times) == 3 and all(t > 0 for t in v.times), v
        assert len(v.fed) == 4 and v.wall_s >= sum(v.times) * 0.5, v
    # Batch i of every variant is fed before batch i + 1 of any: they share a moment.
    for i in range(3):
        assert max(v.fed[i] for v in got.values()) < min(v.fed[i + 1] for v in got.values())
    # The first fed of each batch turns (turn 1, then +1 per batch): no variant always first.
    firsts = [min(got, key=lambda name: got[name].fed[i]) for i in range(4)]
    assert firsts[:3] == [VARIANTS[1], VARIANTS[2], VARIANTS[0]], firsts


def test_a_batch_that_does_not_come_times_out_naming_its_query(spark: Any, tmp_path: Path) -> None:
    [file] = [*write_inputs(tmp_path / "in", 50, 0, 0).glob("part-*.parquet")]
    q = start_query(spark, "none", tmp_path / "work", "late")
    try:
        # Its one file makes one batch: a second never comes.
        with pytest.raises(TimeoutError, match="query late did not finish its batch 2 within 2 s"):
            feed(q, file, 2, timeout=2.0)
        assert q.handle.isActive
    finally:
        q.handle.stop()


def test_a_stopped_query_or_missing_input_is_an_error_not_a_wait(
    spark: Any, tmp_path: Path
) -> None:
    src = write_inputs(tmp_path / "in", 50, 20, 1)
    with pytest.raises(ConfigError, match="holds 2 input files, expected 4"):
        run_round(spark, src, 3, tmp_path / "work", turn=0)
    q = start_query(spark, "none", tmp_path / "work", "gone")
    q.handle.stop()
    with pytest.raises(RuntimeError, match="query gone stopped before its batch 1"):
        feed(q, sorted(src.glob("part-*.parquet"))[0], 1, timeout=60.0)
