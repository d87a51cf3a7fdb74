"""``snapcut chaos --engine spark``: the comparison catches lost, duplicated
and wrong rows (no Spark), the pieces it relies on (Spark's logs read as a
plan, killing a process tree, crash points logged), and a short chaos on
Spark that must come out exact."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from tests.spark_support import child_env

from snapcut import _procs as procs
from snapcut._core import ConfigError
from snapcut.chaos import spark as chaos
from snapcut.chaos import spark_compare as model
from snapcut.cli import main as cli_main
from snapcut.spark import failpoints as fp

FILES, RECORDS, USERS = 3, 900, 40


@pytest.fixture
def frames() -> list[pd.DataFrame]:
    return chaos.generate_events(FILES, RECORDS, USERS, seed=5)


def perfect(frames: list[pd.DataFrame], plan: dict[int, list[int]]) -> chaos.RunOutput:
    """What a failure-free run of `plan` commits, built from pandas."""
    want = model.expected_updates(frames, plan)
    batches = {}
    for batch in plan:
        rows = sorted((u, c, t) for (b, u), (c, t) in want.items() if b == batch)
        batches[batch] = output_table(rows)
    newest: dict[int, tuple[int, int, int]] = {}
    for (_, u), (c, t) in sorted(want.items()):
        newest[u] = (u, c, t)
    ref = model.reference(frames)
    state = pa.table(
        {
            "user": [u for u in sorted(ref)],
            "count": [ref[u][0] for u in sorted(ref)],
            "total": [ref[u][1] for u in sorted(ref)],
            "avg__sum": [ref[u][1] for u in sorted(ref)],
            "avg__count": [ref[u][0] for u in sorted(ref)],
        }
    )
    return chaos.RunOutput(plan, batches, output_table(list(newest.values())), state)


def output_table(rows: list[tuple[int, int, int]]) -> pa.Table:
    return pa.table(
        {
            "user": pa.array([r[0] for r in rows], pa.int64()),
            "count": pa.array([r[1] for r in rows], pa.int64()),
            "total": pa.array([r[2] for r in rows], pa.int64()),
            "avg": pa.array([r[2] / r[1] for r in rows], pa.float64()),
        }
    )


PLAN = {0: [0], 1: [1], 2: [2]}


def counts(check: chaos.Check) -> tuple[int, int, int]:
    return check.lost, check.duplicated, check.mismatched


def test_a_perfect_output_passes(frames: list[pd.DataFrame]) -> None:
    check = chaos.compare(frames, perfect(frames, PLAN))
    assert counts(check) == (0, 0, 0) and not check.problems, check.problems
    # A re-planned run (batch 1 read two files) is exact too, against its own plan.
    check = chaos.compare(frames, perfect(frames, {0: [0], 1: [1, 2]}))
    assert counts(check) == (0, 0, 0), check.problems


def test_a_lost_row_is_caught(frames: list[pd.DataFrame]) -> None:
    out = perfect(frames, PLAN)
    out.batches[1] = out.batches[1].slice(1)  # one user's update of batch 1 is gone
    assert counts(chaos.compare(frames, out)) == (1, 0, 0)


def test_a_duplicated_row_and_batch_are_caught(frames: list[pd.DataFrame]) -> None:
    out = perfect(frames, PLAN)
    out.batches[2] = pa.concat_tables([out.batches[2], out.batches[2].slice(0, 1)])
    assert counts(chaos.compare(frames, out)) == (0, 1, 0)
    out = perfect(frames, PLAN)
    out.batches[3] = out.batches[2]  # a batch Spark never planned, committed again
    assert counts(chaos.compare(frames, out)) == (0, out.batches[2].num_rows, 0)


def test_a_mismatched_row_is_caught(frames: list[pd.DataFrame]) -> None:
    out = perfect(frames, PLAN)
    t = out.batches[0]
    wrong = t.set_column(
        1,
        "count",
        pa.array([c + (i == 3) for i, c in enumerate(t["count"].to_pylist())], pa.int64()),
    )
    out.batches[0] = wrong
    check = chaos.compare(frames, out)
    assert counts(check) == (0, 0, 1) and "(batch, user) (0," in check.problems[0]


def test_a_wrong_newest_output_or_state_is_caught(frames: list[pd.DataFrame]) -> None:
    out = perfect(frames, PLAN)
    assert out.final is not None and out.state is not None
    out.final = out.final.slice(1)  # a user missing from read_output_arrow
    assert counts(chaos.compare(frames, out)) == (0, 0, 1)
    out = perfect(frames, PLAN)
    assert out.state is not None
    sums = out.state["avg__sum"].to_pylist()
    sums[0] += 1  # the state's average of one user is off
    out.state = out.state.set_column(3, "avg__sum", pa.array(sums, pa.int64()))
    assert counts(chaos.compare(frames, out)) == (0, 0, 1)
    out.state = None  # no state at all: every user mismatched
    assert counts(chaos.compare(frames, out)) == (0, 0, len(model.reference(frames)))


def test_sessions_close_when_the_watermark_passes_their_gap() -> None:
    """The model of ``--session-gap`` (gap 30 s, watermark 10 s behind the
    latest event of the batches before): a user's session closes in the
    first batch, a no-data one too, whose watermark is past its last event
    plus the gap and that has no rows of it; its totals are emitted once
    more, its state goes, and its next event starts afresh."""

    def frame(rows: list[tuple[int, int, int]]) -> pd.DataFrame:
        users, dwell, secs = zip(*rows, strict=True)
        ts = pd.to_datetime(list(secs), unit="s", utc=True)
        return pd.DataFrame({"user": list(users), "dwell_ms": list(dwell), "ts": ts})

    frames = [
        frame([(1, 10, 5), (2, 20, 50)]),
        frame([(2, 30, 70), (3, 40, 100)]),
        frame([(1, 50, 130)]),
    ]
    plan = {0: [0], 1: [1], 2: [2], 3: []}
    want = model.expected(frames, plan, gap_ms=30_000, delay_ms=10_000)
    assert want.updates == {
        (0, 1): (1, 10),
        (0, 2): (1, 20),
        (1, 1): (1, 10),  # watermark 40 s > 5 s + 30 s: user 1 closes
        (1, 2): (2, 50),
        (1, 3): (1, 40),
        (2, 1): (1, 50),  # a new session
        (3, 2): (2, 50),  # the no-data batch: watermark 120 s > 70 s + 30 s
    }
    assert want.newest == {1: (1, 50), 2: (2, 50), 3: (1, 40)}
    assert want.state == {1: (1, 50), 3: (1, 40)}
    # No gap: totals over every event, whatever the batches.
    plain = model.expected(frames, plan)
    assert plain.state == plain.newest == {1: (2, 60), 2: (2, 50), 3: (1, 40)}


def test_input_read_by_no_batch_or_twice_is_lost_or_duplicated(
    frames: list[pd.DataFrame],
) -> None:
    check = chaos.compare(frames, perfect(frames, {0: [0], 1: [2]}))
    assert check.lost == len(frames[1]) and check.mismatched > 0
    check = chaos.compare(frames, perfect(frames, {0: [0], 1: [1], 2: [2], 3: [1]}))
    assert check.duplicated == len(frames[1])


def write_logs(chk: Path, offsets: list[int], source: dict[int, list[str]]) -> None:
    """Spark's offset log (one file source) and the file source's log, by hand."""
    (chk / "offsets").mkdir(parents=True)
    (chk / "sources" / "0").mkdir(parents=True)
    for batch, offset in enumerate(offsets):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
        text = f"v1\n{json.dumps(meta)}\n{json.dumps({'logOffset': offset})}"
        (chk / "offsets" / str(batch)).write_text(text)
    for sb, files in source.items():
        lines = [
            json.dumps({"path": f"file:///in/{f}", "timestamp": 1, "batchId": sb}) for f in files
        ]
        (chk / "sources" / "0" / str(sb)).write_text("\n".join(["v1", *lines]))


def test_the_plan_is_read_from_sparks_logs(tmp_path: Path) -> None:
    names = [f"part-{i:05d}.parquet" for i in range(4)]
    # Source batches 0..3 one file each; streaming batch 1 took source batches 1 and 2.
    write_logs(tmp_path, [0, 2, 3], {i: [names[i]] for i in range(4)})
    assert chaos.read_plan(tmp_path, names) == {0: [0], 1: [1, 2], 2: [3]}
    assert chaos.progress(tmp_path) == 3


def test_a_file_that_is_no_input_is_an_error(tmp_path: Path) -> None:
    write_logs(tmp_path, [0], {0: ["other.parquet"]})
    with pytest.raises(chaos.ChaosError, match="not inputs"):
        chaos.read_plan(tmp_path, ["part-00000.parquet"])


# --- kills ---------------------------------------------------------------------

TREE = """
import os, subprocess, sys, time
sys.stdout.write(f"{os.getpid()}\\n")
# a child in this group, and one leading a group of its own (like pyspark's daemon)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
sys.stdout.flush()
time.sleep(60)
"""


def test_kill_tree_kills_children_and_their_process_groups() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, process_group=0
    )
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    deadline = time.monotonic() + 10
    while len(procs.tree(pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = procs.tree(pid)
    assert len(members) == 3 and len({p.pgrp for p in members}) == 2
    procs.kill_tree(pid)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert procs.wait_gone(members) == []


DRIVER_KILL = """
import subprocess, sys, time
from snapcut.spark import failpoints
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
failpoints.hit("sink.after_commit", 4, 0)
print("survived", flush=True)
"""


def test_a_driver_crash_point_kills_the_driver_tree_and_logs_the_hit(tmp_path: Path) -> None:
    log = tmp_path / "hits.jsonl"
    env = {**os.environ, fp.ENV: "sink.after_commit:4:*:kill", fp.LOG_ENV: str(log)}
    res = subprocess.run(
        [sys.executable, "-c", DRIVER_KILL],
        env=env,
        capture_output=True,
        text=True,
        process_group=0,
        timeout=60,
    )
    assert res.returncode == -signal.SIGKILL and "survived" not in res.stdout
    assert "snapcut: failpoint sink.after_commit hit (batch 4, partition 0): kill" in res.stderr
    child = int(res.stdout.split()[0])
    time.sleep(0.2)
    state = Path(f"/proc/{child}/stat")
    assert not state.exists() or state.read_text().split(")")[1].split()[0] in "ZX"
    [hit] = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert hit["point"] == "sink.after_commit" and hit["where"] == "driver"


SPILL_KILL = """
import pyarrow as pa
from snapcut import StateTable
from snapcut.spark import failpoints

def spill(start):
    # 1 MiB of memtable holds some 10k rows of (k, v): 60k rows flush.
    table = StateTable(
        pa.schema([("k", pa.int64()), ("v", pa.int64())]), "k", state_memory=1 << 20
    )
    for i in range(start, start + 60_000, 5_000):
        keys = list(range(i, i + 5_000))
        table.update(pa.table({"k": keys, "v": keys}))
    assert table.spill_stats()["flushes"] > 0

with failpoints.rust_points(2, 1):
    spill(0)  # armed for batch 3, not 2
print("survived batch 2", flush=True)
with failpoints.rust_points(3, 1):
    pass  # armed, and disarmed with the block
spill(100_000)
print("survived the disarm", flush=True)
with failpoints.rust_points(3, 1):
    spill(200_000)
print("survived batch 3", flush=True)
"""


def test_a_spill_crash_point_kills_inside_the_armed_block_only(tmp_path: Path) -> None:
    """``spill.after_run`` is a crash point in Rust: a task arms it for its
    own (batch, partition) alone, so the process dies at the first spilled
    run inside that block and nowhere else, and the hit reaches the log in
    the Python points' format."""
    log = tmp_path / "hits.jsonl"
    env = {**os.environ, fp.ENV: "spill.after_run:3:1:kill", fp.LOG_ENV: str(log)}
    res = subprocess.run(
        [sys.executable, "-c", SPILL_KILL], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert res.stdout.split("\n")[:2] == ["survived batch 2", "survived the disarm"]
    assert "survived batch 3" not in res.stdout
    assert "snapcut: failpoint spill.after_run hit 1" in res.stderr
    [hit] = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert (hit["point"], hit["batch"], hit["partition"], hit["action"]) == (
        "spill.after_run",
        3,
        1,
        "kill",
    )


def test_spill_points_need_a_budget_and_can_only_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    plain, budget = chaos.SparkOptions(), chaos.SparkOptions(state_memory="2MB")
    assert not {*fp.RUST_POINTS, *fp.INPUT_POINTS} & set(plain.points())
    assert {*fp.RUST_POINTS, *fp.INPUT_POINTS} <= set(budget.points())
    # transformWithState and levels 2 and 3 apply a large batch in parts too.
    for step in ("tws", "map_batches", "apply_in_pandas_with_state"):
        opts = chaos.SparkOptions(state_memory="2MB", step=step)
        opts.check()
        assert {*fp.RUST_POINTS, *fp.INPUT_POINTS} <= set(opts.points())
        cmd = chaos.child_cmd(opts, Path("/run"))
        assert cmd[cmd.index("--step") + 1] == step
    with pytest.raises(ConfigError, match="step must be one of"):
        chaos.SparkOptions(step="flat_map_groups_with_state").check()
    budget.check()
    cmd = chaos.child_cmd(budget, Path("/run"))
    assert cmd[cmd.index("--state-memory") + 1] == "2MB" and "--metrics-log" in cmd
    with pytest.raises(ConfigError, match="reached only when the state spills"):
        chaos.SparkOptions(failpoints=("spill.merged",)).check()
    with pytest.raises(ConfigError, match="reached only when the state spills"):
        chaos.SparkOptions(failpoints=("input.part_sent",)).check()
    with pytest.raises(ConfigError, match="not a size"):
        chaos.SparkOptions(state_memory="lots").check()
    monkeypatch.setenv(fp.ENV, "spill.merged:1:0:raise")
    with pytest.raises(ConfigError, match="can only kill"), fp.rust_points(1, 0):
        pass


def test_a_child_is_hung_only_after_a_stall_not_a_long_run() -> None:
    """A slow attempt that keeps stepping is not hung (at low priority on a
    loaded machine one took 275 s to its third step); one whose steps stop
    for the timeout is."""
    clock = chaos.StallClock(timeout=10.0, started=100.0, steps=2)
    assert not clock.hung(109.0, 2)
    assert not clock.hung(115.0, 3)  # a step: the clock restarts at 115
    assert not clock.hung(124.0, 3) and not clock.hung(130.0, 4)
    assert not clock.hung(140.0, 4)  # exactly the timeout is not over it
    assert clock.hung(140.5, 4)


def test_kill_plans_replay_from_the_seed() -> None:
    opts = chaos.SparkOptions(files=5, partitions=3)
    a = [chaos.plan_kill(random.Random(9), opts, c) for c in range(5)]
    b = [chaos.plan_kill(random.Random(9), opts, c) for c in range(5)]
    assert a == b
    many = [chaos.plan_kill(random.Random(s), opts, 2) for s in range(200)]
    assert {k.kind for k in many} == {"driver", "failpoint"}
    for k in many:
        if k.failpoint is not None:
            point, batch, partition, action, attempt = k.failpoint.split(":")
            assert point in fp.POINTS and 2 <= int(batch) < 5 and action == "kill"
            assert attempt == "0" and 0 <= int(partition) < 3
    cluster = chaos.SparkOptions(master="local-cluster[2,1,1024]", kill_mode="executor")
    assert all(chaos.plan_kill(random.Random(s), cluster, 0).after_steps >= 1 for s in range(50))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "spark", "--protocol", "aligned"], "--protocol applies to --engine local"),
        (["--engine", "spark", "--kill-mode", "executor"], "local-cluster"),
        (["--engine", "spark", "--failpoints", "state.nowhere"], "unknown Spark failpoints"),
        (["--master", "local[2]"], "--master applies to --engine spark only"),
        (["--kill-mode", "executor"], "applies to --engine spark only"),
        (["--state-root", "s3"], "--state-root applies to --engine spark only"),
        (["--session-gap", "30"], "--session-gap applies to --engine spark only"),
        (
            ["--engine", "spark", "--session-gap", "30"],
            "session_gap must be an int of seconds >= 1 with step map_batches or "
            "apply_in_pandas_with_state",
        ),
        (
            ["--engine", "spark", "--step", "map_batches", "--session-gap", "0"],
            "got 0 with step map_batches",
        ),
        (["--engine", "spark", "--state-root", "gcs"], "state_root must be one of local, s3"),
    ],
)
def test_bad_options_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["chaos", "--runs", "1", *argv]) == 2
    assert message in capsys.readouterr().err


# --- on Spark --------------------------------------------------------------------


def run_chaos_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """One run of ``snapcut chaos --engine spark --runs 1 *args`` as a child
    (15 min at most), checked for what every chaos test on Spark asserts: a
    JSON summary of one run as stdout's last line, no errors, nothing lost,
    duplicated or mismatched, exit code 0. Returns the summary and stdout, for the
    test's own assertions (and their messages). `env`: the child's
    environment; None: this process's with ``PYSPARK_PYTHON`` set to this
    interpreter. One place for the run and its common checks, so the tests
    differ only in their arguments and in what they assert beyond these."""
    if env is None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = [sys.executable, "-m", "snapcut", "chaos", "--engine", "spark", "--runs", "1", *args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.stdout.strip(), res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["runs"] == 1 and summary["errors"] == 0, res.stdout
    assert (summary["lost"], summary["duplicated"], summary["mismatched"]) == (0, 0, 0), res.stdout
    assert res.returncode == 0, res.stdout
    return dict(summary), res.stdout


@pytest.mark.full_priority
@pytest.mark.parametrize(
    ("step", "seed", "kind"),
    [("aggregate", 15, "driver_sigkill"), ("tws", 16, "python_worker_failpoint")],
)
def test_chaos_on_spark_is_exactly_once(tmp_path: Path, step: str, seed: int, kind: str) -> None:
    """One run of the CLI on Spark, 4 files of 1000 events, one kill; with the
    level-1 aggregate, seed 15 draws (see ``plan_kill``) a SIGKILL of the
    driver tree just after batch 1 started (the query restarts); with a
    StatefulProcessor (value, list and map state), seed 16 draws a crash
    point killing the Python worker of state partition 1 after it
    acknowledged batch 2 (Spark retries the task). Nothing lost, duplicated
    or mismatched. (One kill kind per step here; the recorded campaigns,
    bench/results/chaos_spark/, draw both kinds for both steps.)"""
    args = ["--step", step]
    args += ["--seed", str(seed), "--files", "4", "--records", "4000", "--users", "150"]
    args += [
        "--max-kills",
        "1",
        "--failpoints",
        "sink.before_commit,sink.after_commit,state.after_ack",
    ]
    args += ["--workdir", str(tmp_path)]
    summary, out = run_chaos_cli(args)
    assert summary["kills"] == 1 and summary["recoveries"] >= 1, summary
    assert summary["engine"] == "spark" and sum(summary["kill_kinds"].values()) == summary["kills"]
    assert summary["kill_kinds"][kind] == 1, out


@pytest.mark.full_priority
def test_a_replayed_batch_the_sink_committed_runs_through_sparks_state_store_check(
    tmp_path: Path,
) -> None:
    """Level 2 with ``--session-gap 30``: the step's event-time timeout puts a
    Spark state operator in the plan (the no-data companion). The driver dies
    at ``sink.after_commit`` (batch 1 committed by the sink, not by Spark); the
    restarted query re-delivers batch 1, which the sink skips. Spark 4.1+
    then checks that every state store committed in the batch: the sink runs
    the skipped batch's DataFrame to its end (``sink.replay``), else the
    query fails there. Sessions closed (keys timed out); nothing lost,
    duplicated or mismatched."""
    args = ["--step", "map_batches", "--session-gap", "30", "--seed", "0"]
    args += ["--files", "3", "--records", "3000", "--users", "2000", "--max-kills", "1"]
    args += ["--kill-mode", "failpoint", "--failpoints", "sink.after_commit"]
    args += ["--workdir", str(tmp_path)]
    summary, out = run_chaos_cli(args)
    assert summary["failpoints"] == {"sink.after_commit": 1}, out
    assert summary["keys_timed_out"] > 0, out


@pytest.mark.full_priority
def test_chaos_on_spark_with_a_memory_budget_kills_inside_a_spill(tmp_path: Path) -> None:
    """The level-1 aggregate under ``--state-memory 2MB`` (1 MiB for the table
    a task works on) with 90k users over 3 partitions, 90k records a batch:
    every batch's tables flush to local runs (a cold task maps its partition's
    state files as runs, so only a batch's own changes fill its memory).
    Seed 3 draws (see ``plan_kill``) ``spill.after_run`` for one task: its
    Python worker dies right after writing a spilled run,
    Spark retries the task, and nothing is lost, duplicated or mismatched."""
    sizes = ["--seed", "3", "--files", "3", "--records", "270000", "--users", "90000"]
    one_budgeted_worker_kill(tmp_path, "spill.after_run", sizes)


@pytest.mark.full_priority
def test_chaos_kills_a_level_3_task_between_the_parts_of_its_batch(tmp_path: Path) -> None:
    """Level 3 (``applyInPandasWithState``) under ``--state-memory 2MB`` (a
    task holds 512 KiB of its input): 80k rows a batch over 3 partitions
    (~640 KB each) come in parts of whole keys. ``input.part_sent`` kills the
    Python worker of one task right after it sent its first part's output
    (its state version not yet written); Spark retries the task, which applies
    every part again from the partition's last version, and the rows of the
    killed attempt are not committed. With ``--session-gap 30`` the function
    sets event-time timeouts: batch 1 closes the sessions of batch 0's users
    it has no rows of after its parts (the no-rows calls for timed-out keys),
    the no-data batch after it more. Cold opens (the retry, a new worker's
    first task) take their time index as stored beside the partition's full.
    Nothing lost, duplicated or mismatched."""
    sizes = ["--step", "apply_in_pandas_with_state", "--seed", "5", "--files", "2"]
    sizes += ["--records", "160000", "--users", "60000", "--session-gap", "30"]
    summary = one_budgeted_worker_kill(tmp_path, "input.part_sent", sizes)
    assert summary["keys_timed_out"] > 0, summary
    # Cold opens (the killed task's retry, a new worker's first task) took
    # their time index as stored beside a full, not rebuilt from every row.
    assert summary["cold_loads"] > 0 and summary["times_stored"] > 0, summary


def one_budgeted_worker_kill(tmp_path: Path, point: str, args: list[str]) -> dict[str, Any]:
    """One chaos run of the CLI on Spark under ``--state-memory 2MB`` whose one
    kill is crash point `point` in a Python worker (Spark retries the task):
    nothing lost, duplicated or mismatched, and the state spilled."""
    args = [*args, "--state-memory", "2MB", "--max-kills", "1", "--failpoints", point]
    args += ["--kill-mode", "failpoint", "--workdir", str(tmp_path)]
    summary, out = run_chaos_cli(args)
    assert summary["failpoints"] == {point: 1}, out
    assert summary["kill_kinds"]["python_worker_failpoint"] == 1, out
    assert summary["spill_flushes"] > 0, out
    return summary


@pytest.mark.full_priority
def test_a_worker_killed_before_it_adopts_a_merge_is_retried_exactly_once(tmp_path: Path) -> None:
    """The job's state root merges its runs off the tasks' path
    (``full_every=3``: a worker's compactor merges a partition's runs after
    batch 3's commit, and batch 4's commit adopts the merge). Seed 3 draws the
    crash point ``state.before_adopt`` in batch 4 of partition 0: the Python
    worker dies with its diff written, the merge not yet linked into
    ``chk-4/``; Spark's retry (another worker, the partition cold) adopts it.
    Nothing lost, duplicated or mismatched; every partition's batch 4 names
    the merged run."""
    args = ["--seed", "3", "--files", "6", "--records", "3000", "--users", "300"]
    args += ["--max-kills", "1", "--kill-mode", "failpoint", "--failpoints", "state.before_adopt"]
    args += ["--workdir", str(tmp_path), "--keep"]
    summary, out = run_chaos_cli(args)
    assert summary["failpoints"] == {"state.before_adopt": 1}, out
    assert summary["kill_kinds"]["python_worker_failpoint"] == 1, out
    manifest = json.loads(
        next(tmp_path.glob("spark-run-*/state/chk-00000004/manifest.json")).read_text()
    )
    adopted = [
        r["path"]
        for f in manifest["files"]
        if f["role"] == "state"
        for r in f["runs"]
        if r["checkpoint"] == 4 and ".run-" in r["path"]
    ]
    assert sorted(adopted) == [f"state-{p}.run-0-3.state.arrow" for p in range(3)], manifest


@pytest.mark.full_priority
def test_chaos_with_the_state_root_on_s3_is_exactly_once(tmp_path: Path) -> None:
    """``--state-root s3``: the query's state root in a bucket of moto's S3
    server that the harness runs (no renames: files first, the manifest
    last), under ``--state-memory 2MB``. Seed 2 draws (see ``plan_kill``) a
    crash point that kills the Python worker of one state partition after it
    wrote its state file to S3 and before its acknowledgement; Spark retries
    the task on a new worker, which finds the partition cold and reads it from
    S3 (through the run cache). Nothing lost, duplicated or mismatched; the
    final state is read back from the bucket."""
    args = ["--state-root", "s3", "--seed", "2", "--files", "3", "--records", "3000"]
    args += ["--users", "2000", "--state-memory", "2MB", "--max-kills", "1"]
    args += ["--kill-mode", "failpoint", "--failpoints", "state.after_write"]
    args += ["--workdir", str(tmp_path)]
    summary, out = run_chaos_cli(args)
    assert summary["state_root"] == "s3", out
    assert summary["failpoints"] == {"state.after_write": 1}, out
    assert summary["kill_kinds"]["python_worker_failpoint"] == 1, out
    # Nothing of the state root was written locally.
    assert not list(tmp_path.glob("spark-run-*/state")), list(tmp_path.rglob("state"))


@pytest.mark.full_priority
@pytest.mark.parametrize("output", ["delta", "iceberg"])
def test_chaos_into_a_table_commits_each_batch_once(tmp_path: Path, output: str) -> None:
    """``--output delta|iceberg``: one run of 3 files, its driver killed at
    ``sink.after_table_commit`` (seed 1 draws batch 2): the batch is in the
    table, its manifest is not. The restarted query finds the batch in the
    table and commits only the manifest (``replayed``): the table's rows per
    user equal pandas', 3 table commits for 3 batches, none twice, none missing."""
    pytest.importorskip("deltalake" if output == "delta" else "pyiceberg")
    args = ["--output", output, "--seed", "1", "--files", "3", "--records", "3000"]
    args += ["--users", "150", "--max-kills", "1", "--kill-mode", "failpoint"]
    args += ["--failpoints", "sink.after_table_commit", "--workdir", str(tmp_path), "--keep"]
    summary, out = run_chaos_cli(args)
    assert summary["output"] == output, out
    assert summary["failpoints"] == {"sink.after_table_commit": 1}, out
    assert summary["kill_kinds"]["driver_failpoint"] == 1 and summary["recoveries"] == 1
    assert summary["table_commits"] == 3, out
    assert (summary["table_double_commits"], summary["table_missing_batches"]) == (0, 0)
    manifest = tmp_path / "spark-run-0000" / "out" / "chk-00000002" / "manifest.json"
    assert json.loads(manifest.read_text())["output"][output]["replayed"] is True


@pytest.mark.connect_server
def test_chaos_on_spark_connect_is_exactly_once(tmp_path: Path) -> None:
    """The same harness on Spark Connect (``--remote local[2,4]``: a local
    Connect server in the job's process tree). Seed 13 draws the crash point
    ``sink.after_commit`` of batch 1: hit in the server's foreachBatch
    worker, it SIGKILLs the whole tree (client, server JVM, workers) after
    the manifest is published and before Spark commits the batch; the job
    restarts from its checkpointLocation, Spark re-delivers batch 1, and the
    sink skips it. Nothing lost, duplicated or mismatched."""
    args = ["--remote", "local[2,4]", "--seed", "13", "--files", "3", "--records", "3000"]
    args += ["--users", "150", "--max-kills", "1", "--workdir", str(tmp_path)]
    args += ["--failpoints", "sink.before_commit,sink.after_commit,state.after_ack"]
    summary, out = run_chaos_cli(args, env=child_env(PYSPARK_PYTHON=sys.executable))
    assert summary["remote"] == "local[2,4]", out
    assert summary["kill_kinds"]["driver_failpoint"] == 1, out
    assert summary["failpoints"] == {"sink.after_commit": 1} and summary["recoveries"] == 1


def test_chaos_refuses_a_remote_it_cannot_kill_or_retry() -> None:
    with pytest.raises(ConfigError, match="must be the job's own: use --remote local"):
        chaos.SparkOptions(remote="sc://host:15002").check()
    with pytest.raises(ConfigError, match=r"not a Spark Connect URL"):
        chaos.SparkOptions(remote="yarn").check()
    with pytest.raises(ConfigError, match=r"tries each task once.*use --remote local\[2,4\]"):
        chaos.SparkOptions(remote="local[2]").check()
    with pytest.raises(ConfigError, match=r"use --master local\[2,4\]"):
        chaos.SparkOptions(master="local[2]").check()
    chaos.SparkOptions(remote="local[2]", failpoints=("sink.after_commit",)).check()
    chaos.SparkOptions(remote="local[2,4]").check()
