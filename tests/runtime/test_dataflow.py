"""The Python Dataflow API end to end on the threaded runtime, checked
against plain Python computations of the same data."""

import pickle
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from snapcut import Checkpointing, Dataflow, RunReport
from snapcut.dataflow import dwell_events

PROTOCOLS = ["aligned", "unaligned", "chandy-lamport", "sync", "sync-capture", "none"]
USERS, COUNT, SEED = 300, 120_000, 7


def expected_dwell() -> dict[int, tuple[int, int]]:
    """(count, total) per user, in plain Python."""
    events = dwell_events(USERS, COUNT, SEED).to_pydict()
    acc: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for user, dwell in zip(events["user"], events["dwell_ms"], strict=True):
        acc[user][0] += 1
        acc[user][1] += dwell
    return {u: (c, t) for u, (c, t) in acc.items()}


def checkpointing(protocol: str) -> Checkpointing:
    if protocol == "none":
        return Checkpointing(protocol="none")
    return Checkpointing(protocol=protocol, interval=0.002, min_pause=0.002)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dwell_time_job_equals_plain_python(protocol: str) -> None:
    flow = Dataflow(parallelism=2)
    events = flow.generate_dwell_events(users=USERS, count=COUNT, seed=SEED, batch_size=512)
    avg = events.key_by("user").aggregate(
        count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms")
    )
    avg.collect("result")
    report = flow.run(checkpointing=checkpointing(protocol))

    got = report.results["result"].to_pydict()
    want = expected_dwell()
    assert sorted(got["user"]) == sorted(want)
    for user, count, total, mean in zip(
        got["user"], got["count"], got["total"], got["avg"], strict=True
    ):
        assert (count, total) == want[user]
        assert mean == pytest.approx(total / count)
    assert report.records_in == COUNT
    assert report.protocol == protocol
    if protocol == "none":
        assert report.checkpoints == [] and report.snapshots == []
    else:
        assert_sane_checkpoints(report)


def assert_sane_checkpoints(report: RunReport) -> None:
    completed = report.completed_checkpoints
    assert completed, "a bounded job with checkpointing on ends with a final checkpoint"
    assert completed[-1].is_final
    ids = [c.id for c in report.checkpoints]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for c in report.checkpoints:
        assert c.duration_s >= 0 and c.finished_s >= c.triggered_s >= 0
        assert all(ns >= 0 for ns in c.alignment_ns.values())
        assert c.state_bytes >= 0 and c.logged_records >= 0
    # Every completed checkpoint has a snapshot with every task and the sources' offsets.
    assert [s.id for s in report.snapshots] == [c.id for c in completed]
    final = report.snapshots[-1]
    offsets = final.source_offsets
    assert len(offsets) >= 1 and all(o >= 0 for o in offsets.values())
    stateful = [t for t in final.tasks.values() if t.state is not None]
    assert stateful, "the aggregate's state is captured as Arrow"
    assert all(isinstance(t.state, pa.Table) for t in stateful)


def test_final_snapshot_holds_every_record_and_the_aggregate_state() -> None:
    flow = Dataflow(parallelism=2)
    events = flow.generate_dwell_events(users=50, count=10_000, seed=3)
    events.key_by("user").aggregate(n="count").collect("r")
    report = flow.run(Checkpointing(protocol="aligned"))
    final = report.snapshots[-1]
    assert sum(final.source_offsets.values()) == 10_000
    assert set(final.source_offsets) == {"dwell_events-0", "dwell_events-1"}
    assert final.tasks["aggregate-0"].state is not None


def test_map_filter_flat_map_on_batches() -> None:
    rows = [{"k": i % 7, "v": i} for i in range(5_000)]
    flow = Dataflow(parallelism=2)
    src = flow.from_iterable(rows, batch_size=128)
    doubled = src.map(lambda b: b.append_column("w", pc.multiply(b["v"], 2)))
    even = doubled.filter(lambda b: pc.equal(pc.bit_wise_and(b["v"], 1), 0))
    twice = even.flat_map(lambda b: [b, b.slice(0, 1)])
    twice.collect("out")
    report = flow.run()

    out = report.results["out"]
    evens = [r for r in rows if r["v"] % 2 == 0]
    assert set(out.column_names) == {"k", "v", "w"}
    assert pc.all(pc.equal(out["w"], pc.multiply(out["v"], 2))).as_py()
    # flat_map emitted each batch plus its first row again
    assert len(out) > len(evens)
    assert sorted(set(out["v"].to_pylist())) == [r["v"] for r in evens]


def test_filter_accepts_numpy_and_list_masks() -> None:
    import numpy as np

    flow = Dataflow()
    src = flow.from_batches(pa.table({"x": list(range(10))}))
    src.filter(lambda b: np.asarray(b["x"]) > 6).collect("np")
    src.filter(lambda b: [v % 3 == 0 for v in b["x"].to_pylist()]).collect("list")
    report = flow.run()
    assert sorted(report.results["np"]["x"].to_pylist()) == [7, 8, 9]
    assert sorted(report.results["list"]["x"].to_pylist()) == [0, 3, 6, 9]


def running_sum(key: int, rows: pa.RecordBatch, state: int | None) -> tuple[pa.RecordBatch, int]:
    total = (state or 0) + pc.sum(rows["v"]).as_py()
    return pa.RecordBatch.from_pydict(
        {"k": [key] * rows.num_rows, "total": [total] * rows.num_rows}
    ), total


@pytest.mark.parametrize("protocol", ["aligned", "unaligned", "chandy-lamport"])
def test_keyed_python_state(protocol: str) -> None:
    rows = [{"k": f"key{i % 11}", "v": i} for i in range(3_000)]
    flow = Dataflow(parallelism=2)
    out = flow.from_iterable(rows, batch_size=64).key_by("k").process(running_sum)
    out.collect("sums")
    report = flow.run(Checkpointing(protocol=protocol, interval=0.001, min_pause=0.001))

    got = report.results["sums"].group_by("k").aggregate([("total", "max")]).to_pydict()
    want: dict[str, int] = defaultdict(int)
    for r in rows:
        want[r["k"]] += r["v"]
    assert dict(zip(got["k"], got["total_max"], strict=True)) == want
    # The final snapshot holds each key's state, pickled, under the key column;
    # with unaligned barriers, records the barrier overtook are in the channel
    # logs instead: state + logged records = everything.
    states: dict[str, int] = defaultdict(int)
    for name, task in report.snapshots[-1].tasks.items():
        if not name.startswith("process"):
            continue
        for k, blob in zip(
            task.state["k"].to_pylist(), task.state["state"].to_pylist(), strict=True
        ):
            states[k] += pickle.loads(blob)
        for log in task.channels:
            for k, v in zip(
                log.records["k"].to_pylist(), log.records["v"].to_pylist(), strict=True
            ):
                states[k] += v
    assert states == want


def test_keyed_state_none_drops_the_key() -> None:
    def keep_odd_keys(key: int, rows: pa.RecordBatch, state: int | None) -> tuple[None, int | None]:
        return None, (1 if key % 2 else None)

    flow = Dataflow(parallelism=1)
    flow.from_batches(pa.table({"k": list(range(10))})).key_by("k").process(keep_odd_keys).collect(
        "r"
    )
    report = flow.run(Checkpointing())
    state = next(
        t.state for t in report.snapshots[-1].tasks.values() if t.task.startswith("process")
    )
    assert sorted(state["k"].to_pylist()) == [1, 3, 5, 7, 9]


def test_union_of_two_sources() -> None:
    flow = Dataflow(parallelism=2)
    a = flow.from_batches(pa.table({"x": list(range(0, 500))}), parallelism=1)
    b = flow.from_iterable([(i,) for i in range(500, 800)], names=["x"], batch_size=50)
    a.union(b).collect("all")
    report = flow.run(Checkpointing(protocol="aligned", interval=0.001))
    assert sorted(report.results["all"]["x"].to_pylist()) == list(range(800))


def countdown_body(loop):  # type: ignore[no-untyped-def]
    step = loop.map(lambda b: pa.RecordBatch.from_pydict({"x": pc.subtract(b["x"], 1)}))
    again = step.filter(lambda b: pc.greater(b["x"], 0), name="again")
    done = step.filter(lambda b: pc.equal(b["x"], 0), name="done")
    return again, done


@pytest.mark.parametrize("protocol", ["aligned", "chandy-lamport", "unaligned"])
@pytest.mark.parametrize("interval", [None, 0.002])
def test_iteration_reaches_a_fixed_point_with_back_edge_logs(
    protocol: str, interval: float | None
) -> None:
    # Each record x goes round the loop x times; the output holds one 0 per input.
    n = 1_000
    flow = Dataflow(parallelism=2)
    table = pa.table({"x": [i % 30 + 1 for i in range(n)]})
    src = flow.from_batches(table.to_batches(max_chunksize=50))
    flow.iterate(src, countdown_body).collect("zeros")
    report = flow.run(Checkpointing(protocol=protocol, interval=interval))

    assert report.results["zeros"]["x"].to_pylist() == [0] * n
    assert report.completed_checkpoints
    assert report.completed_checkpoints[-1].is_final
    logs = [(task, log) for s in report.snapshots for task, log in s.channel_logs]
    back_edge = [log for task, log in logs if task.startswith("iterate") and "again" in log.edge]
    assert all(pc.all(pc.greater(log.records["x"], 0)).as_py() for log in back_edge)
    if interval is None:
        # The final checkpoint starts when the source ends: its 20 batches
        # are then still going round the loop (30 rounds each), so the
        # barrier finds records on the feedback edge and logs them.
        # Unaligned barriers overtake in-flight data anywhere in the loop, so
        # its logs may sit on the map's or a filter's input instead.
        caught = back_edge if protocol != "unaligned" else [log for _, log in logs]
        assert caught, "records in flight in the loop are in the checkpoint"
        assert sum(log.records.num_rows for log in caught) > 0


def test_run_releases_the_gil_for_other_python_threads() -> None:
    # A UDF (on a task thread) hands off to a plain Python thread and waits
    # for its answer: both need the GIL while the main thread is in run().
    import threading

    asked, answered = threading.Event(), threading.Event()
    helper = threading.Thread(target=lambda: asked.wait(10) and answered.set(), daemon=True)
    helper.start()

    def handshake(batch: pa.RecordBatch) -> pa.RecordBatch:
        asked.set()
        ok = answered.wait(10)
        return batch.append_column("ok", pa.array([ok] * batch.num_rows))

    flow = Dataflow()
    flow.from_batches(pa.table({"x": [1, 2]})).map(handshake).collect("r")
    report = flow.run()
    helper.join(10)
    assert report.results["r"]["ok"].to_pylist() == [True, True]


def test_channel_capacity_bounds_what_unaligned_checkpoints_log() -> None:
    """Behind a slow operator every channel runs full; an unaligned barrier
    overtakes what is queued and logs it, so the capacity bounds the log."""
    import time

    batch = 256

    def logged(capacity: int) -> int:
        flow = Dataflow(parallelism=1, channel_capacity=capacity)
        src = flow.generate_dwell_events(users=50, count=120 * batch, seed=3, batch_size=batch)

        def slow(b: pa.RecordBatch) -> pa.RecordBatch:
            time.sleep(0.002)
            return b

        src.map(slow).key_by("user").aggregate(count="count").collect("r")
        report = flow.run(Checkpointing(protocol="unaligned", interval=0.01))
        counted = pc.sum(report.results["r"]["count"]).as_py()
        assert counted == 120 * batch
        periodic = [c for c in report.completed_checkpoints if not c.is_final]
        assert periodic, "no checkpoint completed while the job ran"
        return max(c.logged_records for c in periodic)

    # One input channel per task here (parallelism 1): at most `capacity`
    # batches queued ahead of a barrier (the barrier takes a slot itself).
    small = logged(2)
    assert small <= 2 * batch
    assert logged(16) > 2 * batch
