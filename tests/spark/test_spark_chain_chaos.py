"""``snapcut chaos --engine spark --topology chain``: B's checks catch lost,
duplicated and wrong rows and a plan that reads an A batch twice (no Spark),
kill plans replay from the seed, bad flags are refused, and a short chained
campaign on Spark (A and B in one driver, SIGKILLed, resumed) comes out
exact."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from tests.spark_support import child_env

from snapcut.chaos import spark_chain as chain
from snapcut.chaos.core import Check, run_rng
from snapcut.chaos.spark import generate_events
from snapcut.chaos.spark_compare import expected_updates
from snapcut.cli import main as cli_main

pytestmark = pytest.mark.spark

A_PLAN = {0: [0], 1: [1], 2: [2]}
"""A read input file i in batch i."""
B_PLAN = {0: (0, 0), 1: (1, 2)}
"""B read A's batch 0, then A's batches 1 and 2."""


@pytest.fixture
def frames() -> list[pd.DataFrame]:
    return generate_events(3, 600, 30, seed=3)


def b_tables(
    frames: list[pd.DataFrame], plan: dict[int, tuple[int, int]]
) -> tuple[dict[int, pa.Table], pa.Table]:
    """What a failure-free B commits for `plan` (per batch, and newest), from pandas."""
    want = chain.expected_b(expected_updates(frames, A_PLAN), plan)
    names = ["user", *chain.FIGURES]

    def table(rows: list[tuple[int, ...]]) -> pa.Table:
        columns = {n: pa.array([r[i] for r in rows], pa.int64()) for i, n in enumerate(names)}
        return pa.table(columns)

    batches = {b: table([(u, *f) for (bb, u), f in sorted(want.items()) if bb == b]) for b in plan}
    newest = {u: (u, *f) for (_, u), f in sorted(want.items())}
    return batches, table(list(newest.values()))


def judge(
    frames: list[pd.DataFrame],
    batches: dict[int, pa.Table],
    newest: pa.Table,
    plan: dict[int, tuple[int, int]] = B_PLAN,
) -> tuple[Check, set[int]]:
    check = Check()
    bad = chain.judge_b(frames, A_PLAN, [0, 1, 2], plan, batches, newest, check)
    return check, bad


def test_a_perfect_b_passes_and_its_maxima_are_pandas_over_a_input(
    frames: list[pd.DataFrame],
) -> None:
    batches, newest = b_tables(frames, B_PLAN)
    check, bad = judge(frames, batches, newest)
    assert (check.lost, check.duplicated, bad, check.problems) == (0, 0, set(), [])
    totals = pd.concat(frames).groupby("user")["dwell_ms"].agg(["size", "sum"])
    got = {r["user"]: (r["count_max"], r["total_max"]) for r in newest.to_pylist()}
    assert got == {int(u): (int(r["size"]), int(r["sum"])) for u, r in totals.iterrows()}
    # Another plan of B (each A batch alone) is exact against itself.
    alone = {0: (0, 0), 1: (1, 1), 2: (2, 2)}
    batches, newest = b_tables(frames, alone)
    check, bad = judge(frames, batches, newest, alone)
    assert (check.lost, check.duplicated, bad, check.problems) == (0, 0, set(), [])


def test_lost_duplicated_and_wrong_b_rows_are_caught(frames: list[pd.DataFrame]) -> None:
    batches, newest = b_tables(frames, B_PLAN)
    dup = {**batches, 1: pa.concat_tables([batches[1], batches[1].slice(0, 2)])}
    check, _ = judge(frames, dup, newest)
    assert (check.lost, check.duplicated) == (0, 2) and "2 rows extra" in check.problems[0]
    lost = {**batches, 0: batches[0].slice(3)}
    check, _ = judge(frames, lost, newest)
    assert (check.lost, check.duplicated) == (3, 0)
    assert "3 (batch, user) rows lost" in check.problems[0]
    rows = newest.to_pylist()
    rows[0]["total_sum"] += 1
    check, bad = judge(frames, batches, pa.Table.from_pylist(rows, schema=newest.schema))
    assert bad == {rows[0]["user"]} and "B's newest output: 1 users differ" in check.problems[0]
    first = batches[0].to_pylist()
    first[0]["rows"] += 1
    check, bad = judge(frames, {**batches, 0: pa.Table.from_pylist(first)}, newest)
    assert bad == {first[0]["user"]}


def test_a_b_plan_reading_an_a_batch_twice_or_never_is_caught(frames: list[pd.DataFrame]) -> None:
    batches, newest = b_tables(frames, B_PLAN)
    check, _ = judge(frames, batches, newest, {0: (0, 0), 1: (0, 2)})
    assert "B read A's batches [0, 0, 1, 2], A committed [0, 1, 2]" in check.problems
    check, _ = judge(frames, batches, newest, {0: (0, 0), 1: (2, 2)})
    assert "B read A's batches [0, 2], A committed [0, 1, 2]" in check.problems
    check, _ = judge(frames, {0: batches[0]}, newest)
    assert "B committed batches [0], Spark planned [0, 1]" in check.problems


def test_kill_plans_replay_from_the_seed_and_land_before_the_chain_ends() -> None:
    opts = chain.ChainOptions(files=4)
    plans = [chain.plan_kill(run_rng(9, r), opts, 0) for r in range(50)]
    assert plans == [chain.plan_kill(run_rng(9, r), opts, 0) for r in range(50)]
    # A failure-free chain logs A's offsets and commits of 4 batches and B's of one at least.
    assert {p.after_steps for p in plans} == set(range(10))
    assert all(p.delay < (8.0 if p.after_steps == 0 else 1.5) for p in plans)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "local", "--topology", "chain"], "add --engine spark"),
        (["--engine", "spark", "--topology", "chain", "--kill-mode", "failpoint"], "--kill-mode"),
        (["--engine", "spark", "--topology", "chain", "--remote", "local[2]"], "--remote"),
        (["--engine", "spark", "--topology", "chain", "--files", "0"], "files must be an int"),
    ],
)
def test_bad_flags_are_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["chaos", *args]) == 2
    assert message in capsys.readouterr().err


# B reads A's root through the streaming data source, whose reader process has
# Spark's fixed 10 s to connect back: with the Connect tests, at full priority.
@pytest.mark.connect_port
def test_chained_chaos_on_spark_is_exactly_once(tmp_path: Path) -> None:
    """One run of 2 files (A: 2 batches; B: 1-2), one SIGKILL of the driver
    tree, resumed from both checkpoints: the harness end to end (the recorded
    campaign, bench/results/chaos_spark_chain/, has the runs). Seed 55 plans
    the kill 0.4-0.8 s after the chain's second progress step (A's batch 0
    planned and committed, or B's first batch planned): a moment at which
    both queries run, so A's and B's drivers die mid-run."""
    cmd = [sys.executable, "-m", "snapcut", "chaos", "--engine", "spark", "--topology", "chain"]
    cmd += ["--runs", "1", "--seed", "55", "--files", "2", "--records", "600", "--users", "40"]
    cmd += ["--max-kills", "1", "--workdir", str(tmp_path)]
    env = child_env(PYSPARK_PYTHON=sys.executable)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.stdout.strip(), res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["engine"] == "spark-chain" and summary["runs"] == 1, res.stdout
    assert summary["errors"] == 0 and summary["corrupt_files"] == 0, res.stdout
    assert (summary["lost"], summary["duplicated"], summary["mismatched"]) == (0, 0, 0), res.stdout
    assert summary["kills"] == 1 and summary["recoveries"] == 1, res.stdout
    assert sum(summary["kill_kinds"].values()) == summary["kills"]
    assert summary["a_batches"] >= 2 and summary["b_batches"] >= 1, res.stdout
    assert res.returncode == 0, res.stdout
