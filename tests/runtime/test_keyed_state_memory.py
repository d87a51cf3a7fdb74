"""The Python keyed process (`key_by(k).process(fn)`) under a memory budget
(`Checkpointing(state_memory=)`): its pickles live in the spilling state
table (looked up per batch, written back after the calls), and it answers,
checkpoints and restores exactly as without a budget."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.runtime_support import fold, state_files_by_subtask

from snapcut import Checkpointing, Dataflow, SnapshotError, TaskError, TaskFailure, _core, snapshots
from snapcut.dataflow import dwell_events

#: The smallest budget a table takes (MIN_STATE_MEMORY).
MIB = 1 << 20

#: A padded state's pickle is ~64 KB: 16 keys fill the 1 MiB budget, so a
#: dozen keys already flush and look up in runs.
PAD = b"x" * 64_000


def padded(key: int, rows: pa.RecordBatch, state: Any) -> tuple[Any, Any]:
    """Running sum of `v` per key, in a ~64 KB state; a negative `v` drops it."""
    vs = rows["v"].to_pylist()
    if any(v < 0 for v in vs):
        return None, None
    total = (0 if state is None else state[0]) + sum(vs)
    return pa.RecordBatch.from_pydict({"k": [key], "total": [total]}), (total, PAD)


def batch(keys: list[int], v: int = 1) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"k": keys, "v": [v] * len(keys)})


def totals(state: pa.RecordBatch | pa.Table) -> dict[Any, int]:
    d = state.to_pydict()
    return {k: pickle.loads(s)[0] for k, s in zip(d["k"], d["state"], strict=True)}


def test_a_budget_captures_what_memory_captures(tmp_path: Path) -> None:
    """The same steps with and without a budget give the same checkpoints:
    kinds, bases, keys and pickles; the budgeted one flushed to runs."""
    steps = [
        [batch(list(range(40)))],
        [batch([1, 2, 3]), batch([5], v=-1)],
        [batch(list(range(20, 60)), v=2)],
        [batch([7], v=-1), batch([100, 101])],
        [batch([1])],
    ]
    plain = _core._keyed_checkpoints("k", padded, steps, full_every=4)
    spill: list[dict[str, int] | None] = []
    budgeted = _core._keyed_checkpoints(
        "k", padded, steps, full_every=4, state_memory=MIB, spill_dir=tmp_path, spill=spill
    )
    assert [(k, b) for k, b, _ in budgeted] == [(k, b) for k, b, _ in plain]
    assert [(k, b) for k, b, _ in plain] == [
        ("full", None),
        ("diff", 1),
        ("diff", 2),
        ("diff", 3),
        ("full", None),
    ]
    for (_, _, got), (_, _, want) in zip(budgeted, plain, strict=True):
        assert got.schema == want.schema
        assert got.sort_by("k").to_pydict() == want.sort_by("k").to_pydict()
    (stats,) = spill
    assert stats is not None and stats["flushes"] >= 2 and stats["run_probes"] > 0, stats


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.lists(st.tuples(st.integers(0, 40), st.integers(-1, 5)), max_size=12),
        min_size=1,
        max_size=7,
    ),
    full_every=st.integers(1, 4),
    aborted=st.sets(st.integers(1, 7)),
    restore_budgeted=st.booleans(),
)
def test_every_budgeted_checkpoint_restores_to_the_model(
    tmp_path: Path,
    steps: list[list[tuple[int, int]]],
    full_every: int,
    aborted: set[int],
    restore_budgeted: bool,
) -> None:
    """Random updates and drops over more keys than the budget holds,
    checkpoints and aborts: any completed checkpoint's chain restores (with or
    without a budget) to a plain dict fed the same rows."""
    budget = {"state_memory": MIB, "spill_dir": tmp_path}
    batches = [[batch([k], v) for k, v in step] for step in steps]
    caps = _core._keyed_checkpoints(
        "k", padded, batches, full_every=full_every, aborted=sorted(aborted), **budget
    )
    rows: list[tuple[int, int]] = []
    start = 0
    for i, (kind, base, b) in enumerate(caps):
        cid = i + 1
        rows += steps[i]
        if kind == "full":
            start = i
        else:
            assert base == cid - 1 and (cid - 1) not in aborted
            assert set(b["k"].to_pylist()) <= {k for k, _ in steps[i]}
        if cid in aborted:
            continue
        after = [batch([0, 1], v=3)]
        outputs, end = _core._keyed_restore(
            "k", padded, caps[start : i + 1], after, **(budget if restore_budgeted else {})
        )
        want = fold([*rows, (0, 3), (1, 3)])
        assert totals(end) == want, f"checkpoint {cid}"
        got = {o["k"][0].as_py(): o["total"][0].as_py() for o in outputs}
        assert got == {0: want[0], 1: want[1]}
    # Nothing of a table is left behind once it goes.
    assert list(tmp_path.glob("spill-*/*")) == []


def test_one_batch_may_touch_far_more_keys_than_the_budget(tmp_path: Path) -> None:
    """A first batch creating 60,000 keys of ~200-byte pickles (~12 MB) under
    a 1 MiB budget goes through in steps, spilling as it goes; its diff on a
    later checkpoint holds only the keys touched since."""
    keys = list(range(60_000))

    def wide(key: int, rows: pa.RecordBatch, state: Any) -> tuple[Any, Any]:
        n = (0 if state is None else state[0]) + rows.num_rows
        return None, (n, "y" * 200)

    spill: list[dict[str, int] | None] = []
    caps = _core._keyed_checkpoints(
        "k",
        wide,
        [[batch(keys)], [batch(keys[:10])]],
        full_every=10,
        state_memory=MIB,
        spill_dir=tmp_path,
        spill=spill,
    )
    (kind0, _, first), (kind1, base1, second) = caps
    assert (kind0, first.num_rows) == ("full", 60_000)
    assert (kind1, base1, sorted(second["k"].to_pylist())) == ("diff", 1, keys[:10])
    assert {pickle.loads(s)[0] for s in second["state"].to_pylist()} == {2}
    (stats,) = spill
    assert stats is not None and stats["flushes"] >= 5, stats
    assert stats["memtable_bytes"] <= 2 * MIB, stats


# --- whole jobs ---

USERS, COUNT, BATCH = 40_000, 40_000, 50


def throttle(b: pa.RecordBatch) -> pa.RecordBatch:
    # Keeps the source running for a few seconds, so that periodic
    # checkpoints fall inside the run.
    time.sleep(0.008)
    return b


def counting(user: int, rows: pa.RecordBatch, state: Any) -> tuple[Any, Any]:
    """Events per user, in a ~150-byte state (so that 1 MiB holds a few
    thousand users and the tables spill)."""
    n = (0 if state is None else state[0]) + rows.num_rows
    return pa.RecordBatch.from_pydict({"user": [user], "n": [n]}), (n, b"." * 120)


def counting_flow() -> Dataflow:
    flow = Dataflow(parallelism=2)
    ev = flow.generate_dwell_events(users=USERS, count=COUNT, seed=3, batch_size=BATCH)
    ev.map(throttle).key_by("user").process(counting, name="keyed").collect("out")
    return flow


def final_counts(out: pa.Table) -> dict[int, int]:
    got = out.group_by("user").aggregate([("n", "max")]).to_pydict()
    return dict(zip(got["user"], got["n_max"], strict=True))


def want_counts() -> dict[int, int]:
    events = dwell_events(USERS, COUNT, 3).group_by("user").aggregate([("user", "count")])
    return dict(zip(events["user"].to_pylist(), events["user_count"].to_pylist(), strict=True))


def budget(spill: Path, **kw: Any) -> Checkpointing:
    return Checkpointing(interval=0.02, state_memory="1MB", spill_dir=spill, **kw)


def test_a_budgeted_job_answers_as_one_in_memory(tmp_path: Path) -> None:
    report = counting_flow().run(budget(tmp_path / "spill"))
    assert final_counts(report.results["out"]) == want_counts()
    spilled = {t: s for t, s in report.spill.items() if t.startswith("keyed")}
    assert len(spilled) == 2, report.spill
    for stats in spilled.values():
        assert stats["flushes"] >= 1 and stats["run_probes"] > 0, stats
    assert list((tmp_path / "spill").iterdir()) == []


def test_a_failed_budgeted_process_restarts_from_its_runs(tmp_path: Path) -> None:
    """A keyed subtask fails at its third commit and the job restarts from
    the durable root: the budgeted process opens the stored state files as
    its runs (the full mapped as its base, the diffs after it), its next
    capture is a diff on the checkpoint restored, and every count comes out
    exactly once."""
    root = tmp_path / "chk"
    cp = budget(
        tmp_path / "spill", full_every=1000, retained=1000, failover="full", restart_attempts=1
    )
    report = counting_flow().run(
        cp, checkpoint_dir=str(root), inject_failure=TaskFailure("keyed", 0, "commit", 3)
    )
    assert final_counts(report.results["out"]) == want_counts()
    assert len(report.restarts) == 1, report.restarts
    restored = report.restarts[0].restored_from
    assert restored is not None and restored >= 3, report.restarts
    files = state_files_by_subtask(root, "keyed")
    spilled = {t: s for t, s in report.spill.items() if t.startswith("keyed")}
    assert len(spilled) == 2, report.spill
    for task, stats in spilled.items():
        subtask = int(task.rsplit("-", 1)[1])
        assert stats["bases_mapped"] == 1, (task, stats)
        after = [v for c, v in files[subtask].items() if c > restored]
        assert ("diff", restored) in after, (task, restored, files[subtask])
    # The root reads back without snapcut's runtime: every user's count.
    state = snapshots.open(root).latest()
    counts: dict[int, int] = {}
    for subtask in (0, 1):
        part = state.state("keyed", subtask)
        assert part is not None
        d = part.to_pydict()
        counts.update(zip(d["user"], [pickle.loads(s)[0] for s in d["state"]], strict=True))
    assert counts == want_counts()


def test_a_snapshot_restores_across_budgets(tmp_path: Path) -> None:
    """A checkpoint taken without a budget restores into a budgeted job and
    the other way round, to the same counts."""
    want = want_counts()
    plain = Checkpointing(interval=0.005, min_pause=0.005)
    spilling = budget(tmp_path / "spill")
    for first, second in ((plain, spilling), (spilling, plain)):
        run = counting_flow().run(first)
        mids = [
            s
            for s, c in zip(run.snapshots, run.completed_checkpoints, strict=True)
            if not c.is_final and 0 < sum(s.source_offsets.values()) < COUNT
        ]
        assert mids, "no periodic checkpoint fell inside the run"
        again = counting_flow().run(second, restore_from=mids[len(mids) // 2])
        # A user's output after the restore counts its events before it too.
        got = final_counts(again.results["out"])
        assert len(got) > 1_000
        assert got == {u: want[u] for u in got}


@pytest.mark.parametrize("string_keys", [False, True])
def test_a_budget_keeps_the_key_type_checks(tmp_path: Path, string_keys: bool) -> None:
    """Keys change type between batches: refused as without a budget."""
    first = batch([1, 2]) if not string_keys else pa.RecordBatch.from_pydict({"k": ["a"], "v": [1]})
    second = pa.RecordBatch.from_pydict({"k": ["a"], "v": [1]}) if not string_keys else batch([1])
    with pytest.raises(TaskError, match="changed from"):
        _core._keyed_checkpoints(
            "k", padded, [[first], [second]], full_every=2, state_memory=MIB, spill_dir=tmp_path
        )


def test_budgeted_state_that_does_not_pickle_or_unpickle_names_the_key(tmp_path: Path) -> None:
    """Under a budget the pickling happens as each step ends and the
    unpickling when a batch calls a key (not at restore): the same errors,
    naming the key, at those moments."""
    budget: dict[str, Any] = {"state_memory": MIB, "spill_dir": tmp_path}

    def keep_a_lambda(key: int, rows: pa.RecordBatch, state: Any) -> tuple[None, Any]:
        return None, (lambda: 0) if key == 2 else 1

    with pytest.raises(TaskError, match=r"cannot pickle the state of key 2 .*keep picklable"):
        _core._keyed_checkpoints("k", keep_a_lambda, [[batch([1, 2, 3])]], full_every=3, **budget)

    bad = pa.RecordBatch.from_pydict(
        {"k": pa.array([1, 5], pa.int64()), "state": pa.array([b"ok?", b"not a pickle"])}
    )
    # Restoring reads no pickle; a batch that never calls key 5 runs.
    _core._keyed_restore("k", padded, [("full", None, bad)], [], **budget)
    with pytest.raises(SnapshotError, match="cannot unpickle the state of key 5"):
        _core._keyed_restore("k", padded, [("full", None, bad)], [batch([5])], **budget)


def test_the_test_hook_wants_both_budget_and_spill_dir(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pass both state_memory and spill_dir"):
        _core._keyed_checkpoints("k", padded, [], full_every=1, state_memory=MIB)
