"""bench/peers without the peers installed (what CI can check): the grid of
run.py --dry-run, the snapcut job's JSON line, the generator the peers share,
and the message for a missing peer virtualenv."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tests.thread_support import named_thread

import snapcut
from snapcut.dataflow import dwell_events

REPO = Path(__file__).resolve().parents[2]
PEERS = REPO / "bench" / "peers"
SNAPCUT_PATH = Path(snapcut.__file__).resolve().parents[1]
"""Where this run's snapcut imports from (the wheel's site-packages in CI, python/
under `maturin develop`): the scripts run here must import the same one."""


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SNAPCUT_PATH), env.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def test_dry_run_lists_the_grid() -> None:
    out = run(str(PEERS / "run.py"), "--dry-run", "--venv-dir", "/nonexistent")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "configurations x 3 rounds" in text
    assert "estimated" in text
    for system in ("snapcut", "flink", "bytewax", "spark"):
        for ck in ("off", "1s", "100ms"):
            assert any(
                line.split()[0] == system and f"ckpt={ck}" in line
                for line in text.splitlines()
                if line.startswith("  ")
            ), (system, ck)
    assert "three-shuffle" in text and "100,000 keys" in text
    assert "unaligned" in text and "aligned-minibatch" in text
    assert not any(
        line.split()[:2] == ["spark", "three-shuffle"] for line in map(str.strip, text.splitlines())
    ), "Spark cannot express the three-shuffle job"
    # dry-run only warns about the missing venvs
    assert "warning: flink:" in text and "bench/peers/setup.sh" in text


def test_dry_run_filters_systems() -> None:
    out = run(str(PEERS / "run.py"), "--dry-run", "--quick", "--systems", "snapcut")
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("  ")]
    assert lines and all(ln.split()[0] == "snapcut" for ln in lines)
    assert "x 1 rounds" in out.stdout
    # 2 jobs x 1k keys x (off + aligned/unaligned at 1 s and 100 ms)
    assert len(lines) == 10


@pytest.mark.parametrize(
    ("job", "checkpointing", "mode"),
    [("dwell", "off", "aligned"), ("three-shuffle", "100ms", "unaligned")],
)
def test_snapcut_job_prints_one_json_line(
    tmp_path: Path, job: str, checkpointing: str, mode: str
) -> None:
    out = run(
        str(PEERS / "snapcut_job.py"),
        *("--job", job, "--keys", "50", "--records", "20000"),
        *("--checkpointing", checkpointing, "--mode", mode, "--workdir", str(tmp_path)),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["system"] == "snapcut"
    assert line["job"] == job and line["checkpointing"] == checkpointing
    assert line["records"] == 20000 and line["keys"] == 50 and line["parallelism"] == 2
    assert line["seconds"] > 0 and line["records_per_s"] > 0
    assert "versions" in line and "snapcut" in line["versions"]
    assert isinstance(line["checkpoints"], int)
    assert (line["checkpoint_bytes"] > 0) == (checkpointing != "off")
    assert list(tmp_path.iterdir()) == []  # checkpoints removed after the run


def test_missing_peer_venv_is_a_clear_error(tmp_path: Path) -> None:
    out = run(
        str(PEERS / "run.py"),
        *("--systems", "bytewax", "flink", "--quick", "--venv-dir", str(tmp_path)),
        *("--out", str(tmp_path / "out")),
    )
    assert out.returncode == 2
    assert "bench/peers/setup.sh" in out.stderr
    assert str(tmp_path / ".venv-flink" / "bin" / "python") in out.stderr
    assert str(tmp_path / ".venv-bytewax" / "bin" / "python") in out.stderr
    assert not (tmp_path / "out").exists()


def peers_module(name: str) -> ModuleType:
    """bench/peers/<name>.py as a module (bench/peers is not a package)."""
    spec = importlib.util.spec_from_file_location(f"peers_{name}", PEERS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_shared_generator_is_snapcuts() -> None:
    common = peers_module("common")
    expected = dwell_events(100_000, 3000, common.SEED)
    users, dwell = common.dwell_batch(common.SEED, 0, 3000, 100_000)
    assert users == expected["user"].to_pylist()
    assert dwell == expected["dwell_ms"].to_pylist()
    assert common.dwell_record(common.SEED, 2999, 100_000) == (users[-1], dwell[-1])


def test_extras_pin_what_setup_installs() -> None:
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    setup = (PEERS / "setup.sh").read_text()
    flink = next(p for p in extras["peers-flink"] if p.startswith("apache-flink=="))
    bytewax = next(p for p in extras["peers-bytewax"] if p.startswith("bytewax=="))
    assert f"FLINK_VERSION={flink.split('==')[1]}" in setup
    assert f"BYTEWAX_VERSION={bytewax.split('==')[1]}" in setup


def test_overheads_pair_each_round_in_wall_and_cpu_time() -> None:
    harness = peers_module("run")
    off = harness.Config("snapcut", "dwell", 1000, "off", "aligned", 2, 100)
    on = harness.Config("snapcut", "dwell", 1000, "100ms", "aligned", 2, 100)

    def result(rps: float, cpu_s: float) -> dict[str, object]:
        return {"records_per_s": rps, "records": 100, "process_cpu_s": cpu_s}

    # Round 0 runs fast, round 1 at half speed: pairing within a round keeps
    # the guest's slow mode out of the overhead.
    runs = [
        {"config_key": list(off.key()), "round": 0, "result": result(100.0, 2.0)},
        {"config_key": list(on.key()), "round": 0, "result": result(80.0, 2.2)},
        {"config_key": list(off.key()), "round": 1, "result": result(50.0, 4.0)},
        {"config_key": list(on.key()), "round": 1, "result": result(40.0, 5.0)},
    ]
    row = next(r for r in harness.summarize([off, on], runs) if r["checkpointing"] == "100ms")
    assert row["overhead"] == pytest.approx(0.25)
    assert row["cpu_overhead"] == pytest.approx((0.10 + 0.25) / 2)
    assert (row["cpu_overhead_min"], row["cpu_overhead_max"]) == pytest.approx((0.10, 0.25))
    md = harness._overhead_spread([row])
    assert "+25.0% [+25%, +25%] | +17.5% [+10%, +25%]" in md[-1]


def test_schedule_runs_each_config_next_to_its_baseline_and_rotates() -> None:
    harness = peers_module("run")
    configs = harness.grid(("snapcut",), ("dwell", "three-shuffle"), (1000, 100_000), quick=True)
    rounds = 3
    order = harness.schedule(configs, rounds)
    for r in range(rounds):
        ran = [c for rnd, c in order if rnd == r]
        assert sorted(c.key() for c in ran) == sorted(c.key() for c in configs)
        # Blocks: every run sits within one block of its baseline (5 runs here:
        # off, aligned 1s/100ms, unaligned 1s/100ms).
        position = {c.key(): i for i, c in enumerate(ran)}
        for i, c in enumerate(ran):
            assert abs(i - position[c.baseline_key()]) < 5, (r, c.label())
    firsts = [next(c for rnd, c in order if rnd == r) for r in range(rounds)]
    assert len({c.key() for c in firsts}) == rounds  # each round starts elsewhere
    unaligned = next(c for c in configs if c.mode == "unaligned")
    assert unaligned.baseline_key() == (
        "snapcut",
        unaligned.job,
        unaligned.keys,
        "off",
        "aligned",
        2,
    )


def test_store_memory_has_no_checkpoint_dir_and_disk_nofsync_writes_one(tmp_path: Path) -> None:
    out = run(
        str(PEERS / "snapcut_job.py"),
        *("--keys", "50", "--records", "20000", "--checkpointing", "100ms"),
        *("--store", "memory", "--workdir", str(tmp_path)),
    )
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["store"] == "memory" and line["checkpoint_bytes"] == 0
    unsynced = run(
        str(PEERS / "snapcut_job.py"),
        *("--keys", "50", "--records", "20000", "--checkpointing", "100ms"),
        *("--store", "disk-nofsync", "--workdir", str(tmp_path)),
    )
    assert unsynced.returncode == 0, unsynced.stderr
    line = json.loads(unsynced.stdout.strip().splitlines()[-1])
    assert line["store"] == "disk-nofsync" and line["checkpoint_bytes"] > 0
    bad = run(str(PEERS / "snapcut_job.py"), "--store", "tape")
    assert bad.returncode == 2 and "invalid choice: 'tape'" in bad.stderr


def test_store_cost_pairs_each_variant_with_its_rounds_off_run() -> None:
    store_cost = peers_module("store_cost")

    def result(r: int, variant: str, rps: float, cpu_s: float) -> dict[str, object]:
        return {
            "round": r,
            "job": "dwell",
            "keys": 1000,
            "variant": variant,
            "records": 100,
            "records_per_s": rps,
            "process_cpu_s": cpu_s,
            "checkpoints": 10,
        }

    runs = [
        result(0, "off", 100.0, 1.0),
        result(0, "aligned, disk", 80.0, 1.1),
        result(1, "off", 50.0, 2.0),
        result(1, "aligned, disk", 25.0, 3.0),
        result(2, "aligned, disk", 10.0, 9.0),  # no off run in round 2: not paired
    ]
    plan = store_cost.variants(["memory", "disk"])
    assert [label for label, _, _ in plan] == [
        "off",
        "aligned, memory",
        "aligned, disk",
        "unaligned, memory",
        "unaligned, disk",
    ]
    rows = store_cost.summarize(runs, [("dwell", 1000)], plan)
    disk = next(r for r in rows if r["variant"] == "aligned, disk")
    assert disk["rounds"] == 2
    assert disk["overhead"] == pytest.approx((0.25 + 1.0) / 2)
    assert (disk["cpu_overhead_min"], disk["cpu_overhead_max"]) == pytest.approx((0.1, 0.5))
    memory = next(r for r in rows if r["variant"] == "aligned, memory")
    assert memory["rounds"] == 0 and memory["overhead"] is None
    failed = {"round": 2, "job": "dwell", "keys": 1000, "variant": "off", "error": "exit 2: boom"}
    md = store_cost.report(
        {
            "machine_md": "- machine",
            "command": "python store_cost.py",
            "rounds": 3,
            "wall_s": 60.0,
            "runs": [*runs, failed],
            "summary": rows,
        }
    )
    assert "| dwell | 1,000 | aligned, disk | 2 | +62.5% [+25%, +100%] |" in md
    assert "1 run(s) failed" in md and "- r2 dwell 1,000 off: exit 2: boom" in md


def test_interleaved_runs_abba_and_pairs_adjacent_runs() -> None:
    il = peers_module("interleaved")
    assert il.abba(3) == [(0, False), (0, True), (1, True), (1, False), (2, False), (2, True)]

    def result(pair: int, on: bool, seconds: float, cpu_s: float) -> dict[str, object]:
        return {
            "job": "three-shuffle",
            "keys": 1000,
            "mode": "aligned",
            "pair": pair,
            "checkpointed": on,
            "records": 100,
            "seconds": seconds,
            "cpu_s": cpu_s,
            "checkpoints": 20 if on else 0,
            "checkpoint_ms": 30.0 if on else None,
            "alignment_ms": 5.0 if on else None,
        }

    # The guest halves its speed after pair 0: each pair still says +10 % or +20 %.
    runs = [
        result(0, False, 1.0, 2.0),
        result(0, True, 1.1, 2.2),
        result(1, True, 2.4, 4.4),
        result(1, False, 2.0, 4.0),
        result(2, False, 2.0, 4.0),
        result(2, True, 2.2, 4.4),
        result(3, True, 9.0, 9.0),  # its off run never came: not a pair
    ]
    (row,) = il.summarize(runs)
    assert row["pairs"] == 3
    assert row["overhead"] == pytest.approx(0.10)
    assert row["overhead_range"] == pytest.approx([0.10, 0.20])
    lo, hi = row["overhead_ci"]
    assert 0.10 - 1e-9 <= lo <= row["overhead"] <= hi <= 0.20 + 1e-9
    assert row["cpu_overhead"] == pytest.approx(0.10)
    assert row["baseline_rps"] == pytest.approx(50.0)
    # Slower half: pair 1 (50 records/s, +20 %); faster half: pair 0 (100/s, +10 %).
    assert row["overhead_slow_half"] == pytest.approx(0.20)
    assert row["overhead_fast_half"] == pytest.approx(0.10)
    assert row["verdict"] == il.verdict(lo, row["overhead"], hi)
    md = il.report(
        {
            "machine_md": "- machine",
            "command": "python interleaved.py",
            "pairs": 3,
            "store": "disk",
            "records_scale": 0.4,
            "wall_s": 60.0,
            "summary": [row],
        }
    )
    assert "| three-shuffle | 1,000 | aligned | 3 | **+10.0%** |" in md
    assert "| +20.0% / +10.0% |" in md


def test_interleaved_bootstrap_and_verdict() -> None:
    il = peers_module("interleaved")
    assert il.bootstrap_median_ci([0.05] * 7) == pytest.approx((0.05, 0.05))
    lo, hi = il.bootstrap_median_ci([0.0, 0.02, 0.04, 0.06, 0.3, 0.5, 0.6])
    assert 0.0 <= lo <= 0.06 <= hi <= 0.6 and lo < hi
    assert il.verdict(0.01, 0.05, 0.09).startswith("met (")
    assert il.verdict(0.11, 0.15, 0.2).startswith("missed (")
    assert il.verdict(0.05, 0.08, 0.14).startswith("met at the median")
    assert il.verdict(0.05, 0.12, 0.14).startswith("missed at the median")


def test_interleaved_runs_a_cell_and_refuses_zero_pairs(tmp_path: Path) -> None:
    out = run(
        str(PEERS / "interleaved.py"),
        *("--pairs", "1", "--records-scale", "0.0005", "--jobs", "dwell", "--keys", "50"),
        *("--modes", "aligned", "--out", str(tmp_path)),
    )
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "interleaved.json").read_text())
    assert [(r["pair"], r["checkpointed"]) for r in data["runs"]] == [(0, False), (0, True)]
    assert all(r["records"] == 200_000 for r in data["runs"])
    (row,) = data["summary"]
    assert row["pairs"] == 1 and "overhead" in row
    assert "| dwell | 50 | aligned | 1 |" in (tmp_path / "interleaved.md").read_text()
    (tmp_path / "interleaved.md").unlink()
    again = run(str(PEERS / "interleaved.py"), "--regenerate", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert "| dwell | 50 | aligned | 1 |" in (tmp_path / "interleaved.md").read_text()
    missing = run(str(PEERS / "interleaved.py"), "--regenerate", "--out", str(tmp_path / "x"))
    assert missing.returncode != 0 and "run without --regenerate first" in missing.stderr
    bad = run(str(PEERS / "interleaved.py"), "--pairs", "0", "--out", str(tmp_path))
    assert bad.returncode == 2 and "--pairs must be at least 1" in bad.stderr


def test_windowed_reads_window_rates_after_their_guard() -> None:
    wd = peers_module("windowed")
    # 0.1 s buckets, warm-up 0.2 s, windows of 0.4 s with a 0.1 s guard.
    warm = [999, 999]
    windows = [[50, 10, 10, 10], [50, 8, 8, 8], [50, 12, 12, 12], [50, 9, 9, 9]]
    counts = warm + [n for w in windows for n in w] + [1, 1]
    rates = wd.window_rates(counts, 0.1, 0.4, 0.1, 0.2)
    # The last complete window is dropped (the sources may have run dry in it).
    assert rates == pytest.approx([100.0, 80.0, 120.0])
    # On window 1 against the mean of windows 0 and 2: 110 / 80 - 1.
    assert wd.on_overheads(rates) == pytest.approx([110 / 80 - 1])
    # CPU per record: higher is slower, so on / mean(off) - 1.
    assert wd.on_overheads([1.0, 1.2, 1.0], higher_is_faster=False) == pytest.approx([0.2])
    assert wd.on_overheads([100.0, 80.0]) == []


def test_windowed_counters_pair_guard_and_end_marks() -> None:
    wd = peers_module("windowed")
    w = {"writer": (0.0, 0.0), "tasks": (1.0, 0.1)}
    marks = [
        (0, "guard", (1.0, 10.0, 100.0, w)),
        (0, "end", (2.5, 15.0, 200.0, {"writer": (0.0, 0.0), "tasks": (2.4, 0.2)})),
        (1, "guard", (2.6, 15.0, 210.0, {"writer": (0.0, 0.0), "tasks": (2.5, 0.2)})),
        (1, "end", (4.0, 15.0, 410.0, {"writer": (0.1, 0.3), "tasks": (3.5, 0.3)})),
        (2, "guard", (4.1, 15.0, 420.0, w)),  # the job ended before window 2 did
    ]
    windows = wd.window_counters(marks, 3)
    assert [w.cpu_s for w in windows] == pytest.approx([1.5, 1.4])
    assert [w.idle for w in windows] == pytest.approx([0.05, 0.0])
    assert windows[0].roles["tasks"] == pytest.approx([1.4, 0.1])
    assert windows[1].roles["writer"] == pytest.approx([0.1, 0.3])
    assert "coordinator" not in windows[1].roles
    # Window 0: 95 busy ticks of the machine, 1.5 s of them this process's.
    tick = os.sysconf("SC_CLK_TCK")
    assert windows[0].outside_s == pytest.approx(95 / tick - 1.5)


def test_windowed_names_thread_roles_and_their_extra_cpu() -> None:
    wd = peers_module("windowed")
    assert wd.thread_role("snapcut-store-w") == "writer"
    assert wd.thread_role("snapcut-job") == "coordinator"
    assert wd.thread_role("snapcut-stage1[0") == "tasks"
    assert wd.thread_role("python") == "other"
    assert wd.protocol_label("unaligned", 0.02) == "unaligned, aligned first for 20 ms"
    assert wd.protocol_label("unaligned", 0.0) == "unaligned"
    # On windows 1 and 3 against the mean of their neighbours.
    assert wd.on_differences([0.0, 0.3, 0.1, 0.5, 0.1]) == pytest.approx([0.25, 0.4])
    runs = [
        {"thread_cpu_share": {"writer system": [0.0, 0.04, 0.0], "tasks user": [1.9, 1.8, 1.9]}},
        {"thread_cpu_share": {"writer system": [0.0, 0.06, 0.0]}},
        {},  # recorded before threads were counted
    ]
    shift = wd.cpu_shift(runs)
    assert shift["writer system"] == pytest.approx(0.05)  # the mean of 0.04 and 0.06
    assert shift["tasks user"] == pytest.approx(-0.1)
    assert "coordinator user" not in shift


def test_windowed_pins_writer_and_coordinator_apart_from_the_tasks() -> None:
    wd = peers_module("windowed")
    usable = os.sched_getaffinity(0)
    if len(usable) < 2:
        pytest.skip("pinning needs two usable CPUs")
    spare = max(usable)
    with (
        named_thread("snapcut-store-w") as writer,
        named_thread("snapcut-job") as coordinator,
        named_thread("snapcut-stage1[") as task,
        named_thread("pytest-other") as other,
    ):
        # Only these: pytest's process may hold threads of other tests.
        names = {writer: "snapcut-store-w", coordinator: "snapcut-job", task: "snapcut-stage1["}
        pinned = wd.pin_threads(spare, names | {other: "pytest-other"})
        assert os.sched_getaffinity(writer) == {spare}
        assert os.sched_getaffinity(coordinator) == {spare}
        assert os.sched_getaffinity(task) == usable - {spare}
        assert os.sched_getaffinity(other) == usable
    assert pinned == {"writer": 1, "coordinator": 1, "tasks": 1}
    assert os.sched_getaffinity(0) == usable  # the test's own thread is not a task


def test_windowed_trigger_fires_only_in_odd_windows() -> None:
    wd = peers_module("windowed")
    trigger = wd.Trigger(None, window_s=1.0, guard_s=0.2, interval_s=0.25, warmup_s=0.0)
    events = trigger._events(0.0)
    every = [next(events) for _ in range(13)]
    # Each window starts with a "start" (the switch, when one is given).
    starts = [e for e in every if e[1] == "start"]
    assert starts == [(0.0, "start", 0), (1.0, "start", 1), (2.0, "start", 2)]
    first = [e for e in every if e[1] != "start"]
    assert [e for e in first if e[1] == "trigger"] == [
        (1.0, "trigger", 1),
        (1.25, "trigger", 1),
        (1.5, "trigger", 1),
        (1.75, "trigger", 1),
    ]
    # A window's end comes before the next window's first trigger at the same instant.
    assert first[:4] == [
        (0.2, "guard", 0),
        (1.0, "end", 0),
        (1.0, "trigger", 1),
        (1.2, "guard", 1),
    ]


# A timed run sized by a cold calibration run: beside CI's Spark streams at nice
# 10 the two ran at speeds six times apart (one window, fresh-clone check of
# stop 63); the priority stream runs it.
@pytest.mark.full_priority
def test_windowed_runs_a_cell_and_refuses_bad_windows(tmp_path: Path) -> None:
    # The run is sized from a cold calibration run; 24 s leaves three complete
    # windows (after the 1 s warm-up: 2.5 s) even when the measured run goes
    # eight times as fast as that one. 7 s and then 12 s were not enough beside
    # CI's other streams (fresh17 and stop 63's check: one window, the
    # calibration run slowed by the load).
    out = run(
        str(PEERS / "windowed.py"),
        *("--seconds", "24", "--window", "0.5", "--guard", "0.1", "--jobs", "dwell"),
        *("--keys", "50", "--modes", "aligned", "unaligned", "--channel-capacity", "8"),
        *("--alignment-timeout", "0.02", "--async-cpu", "1", "--out", str(tmp_path)),
    )
    assert out.returncode == 0, out.stderr
    first = (tmp_path / "windowed.md").read_text()
    assert "channels of 8 batches" in first
    assert "the store's writer and the coordinator to CPU 1" in first
    data = json.loads((tmp_path / "windowed.json").read_text())
    r, unaligned = data["runs"]
    assert r["triggered"] >= 1 and r["checkpoints"] >= 1
    # Pinned once warmed up: the writer, the coordinator and the dwell job's tasks.
    assert r["pinned"]["writer"] == 1 and r["pinned"]["coordinator"] == 1
    assert r["pinned"]["tasks"] >= 2
    # The timeout applies to unaligned checkpoints only.
    assert (r["protocol"], unaligned["protocol"]) == (
        "aligned",
        "unaligned, aligned first for 20 ms",
    )
    assert len(r["rates"]) >= 3 and all(v > 0 for v in r["rates"])
    row, _ = data["summary"]
    assert row["windows"] >= 1 and "overhead" in row
    # The tasks' CPU is counted per window. Not asserted > 0 in every window: beside
    # CI's other streams a 0.5 s window can pass with the tasks descheduled (stop 56's CI
    # saw one at 0 ticks); most windows must show them.
    tasks = r["thread_cpu_share"]["tasks user"]
    assert len(tasks) == len(r["rates"])
    assert sum(v > 0 for v in tasks) * 2 > len(tasks), tasks
    assert len(r["thread_cpu_share"]["outside"]) >= 3
    md = (tmp_path / "windowed.md").read_text()
    assert "| dwell | 50 | aligned |" in md and "## Where the CPU goes in on windows" in md
    assert "| dwell | 50 | unaligned, aligned first for 20 ms |" in md
    (tmp_path / "windowed.md").unlink()
    again = run(str(PEERS / "windowed.py"), "--regenerate", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert "| dwell | 50 | aligned |" in (tmp_path / "windowed.md").read_text()
    bad = run(str(PEERS / "windowed.py"), "--guard", "1", "--window", "1", "--out", str(tmp_path))
    assert bad.returncode == 2 and "--guard must be at least 0" in bad.stderr
    zero = run(str(PEERS / "windowed.py"), "--channel-capacity", "0", "--out", str(tmp_path))
    assert zero.returncode == 2 and "--channel-capacity must be at least 1" in zero.stderr
    short = run(str(PEERS / "windowed.py"), "--seconds", "2", "--out", str(tmp_path))
    assert short.returncode == 2 and "--seconds must be at least" in short.stderr
    neg = run(str(PEERS / "windowed.py"), "--alignment-timeout", "-1", "--out", str(tmp_path))
    assert neg.returncode == 2 and "--alignment-timeout must be at least 0" in neg.stderr
    cpu = run(str(PEERS / "windowed.py"), "--async-cpu", "4096", "--out", str(tmp_path))
    assert cpu.returncode == 2
    assert "--async-cpu 4096 is not a CPU this process may use" in cpu.stderr


def test_windowed_interval_covers_the_spread_between_runs() -> None:
    wd = peers_module("windowed")
    one = wd.clustered_median_ci([[0.05] * 9])
    assert one == pytest.approx((0.05, 0.05))
    # Two runs that disagree: each run's windows agree, so a plain bootstrap
    # over all windows would be narrow; resampling runs first is not.
    lo, hi = wd.clustered_median_ci([[0.02] * 10, [0.12] * 10])
    assert lo == pytest.approx(0.02) and hi == pytest.approx(0.12)
    il = peers_module("interleaved")
    plain_lo, plain_hi = il.bootstrap_median_ci([0.02] * 10 + [0.12] * 10)
    assert plain_hi - plain_lo <= hi - lo


def test_file_churn_measures_per_file_and_per_mb_and_refuses_bad_input(tmp_path: Path) -> None:
    out = run(str(PEERS / "file_churn.py"), "--rounds", "5", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "file_churn.json").read_text())
    assert [(r["files"], r["mb"], r["fsync"]) for r in data["rows"]][:2] == [
        (2, 0.0, False),
        (20, 0.0, False),
    ]
    assert {r["fsync"] for r in data["rows"]} == {False, True}
    assert all(r["wall_ms"] > 0 and r["outside_ms"] >= 0 for r in data["rows"])
    # Each row wrote what it names (no timing compared: this is a test, not a bench).
    rows = {(r["files"], r["mb"], r["fsync"]): r for r in data["rows"]}
    assert rows[(20, 0.0, False)]["bytes_per_round"] == 0
    assert 12 * 2**20 - 20 <= rows[(20, 12.0, True)]["bytes_per_round"] <= 12 * 2**20
    md = (tmp_path / "file_churn.md").read_text()
    assert "- Without fsync, kernel and outside CPU" in md and "- With fsync" in md
    few = run(str(PEERS / "file_churn.py"), "--rounds", "2", "--out", str(tmp_path))
    assert few.returncode == 2 and "--rounds must be at least 5" in few.stderr
    nodir = run(
        str(PEERS / "file_churn.py"), "--dir", str(tmp_path / "nope"), "--out", str(tmp_path)
    )
    assert nodir.returncode == 2 and "is not a directory" in nodir.stderr
