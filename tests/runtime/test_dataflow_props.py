"""Property: for random data, parallelism, batch sizes and protocols, the
built-in keyed aggregates and a keyed Python state give what plain Python gives."""

from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapcut import Checkpointing, Dataflow

PROTOCOLS = ["aligned", "unaligned", "chandy-lamport", "sync", "sync-capture", "none"]

rows_strategy = st.lists(
    st.tuples(st.integers(0, 20), st.integers(-1_000, 1_000)), min_size=1, max_size=400
)


def python_sum(key: int, rows: pa.RecordBatch, state: int | None) -> tuple[None, int]:
    return None, (state or 0) + pc.sum(rows["v"]).as_py()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_strategy,
    parallelism=st.integers(1, 3),
    batch=st.integers(1, 64),
    protocol=st.sampled_from(PROTOCOLS),
    python_stage=st.booleans(),
)
def test_keyed_aggregates_match_plain_python(
    rows: list[tuple[int, int]], parallelism: int, batch: int, protocol: str, python_stage: bool
) -> None:
    table = pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]})
    flow = Dataflow(parallelism=parallelism)
    src = flow.from_batches(table.to_batches(max_chunksize=batch))
    if python_stage:
        src = src.map(lambda b: b).filter(lambda b: pc.is_valid(b["v"]))
    keyed = src.key_by("k")
    keyed.aggregate(
        n="count", s=("sum", "v"), lo=("min", "v"), hi=("max", "v"), m=("mean", "v")
    ).collect("agg")
    keyed.process(python_sum).collect("unused")
    interval = None if protocol == "none" else 0.001
    report = flow.run(Checkpointing(protocol=protocol, interval=interval))

    groups: dict[int, list[int]] = defaultdict(list)
    for k, v in rows:
        groups[k].append(v)
    got = report.results["agg"].to_pydict()
    assert sorted(got["k"]) == sorted(groups)
    for i, k in enumerate(got["k"]):
        vs = groups[k]
        assert (got["n"][i], got["s"][i], got["lo"][i], got["hi"][i]) == (
            len(vs),
            sum(vs),
            min(vs),
            max(vs),
        )
        assert abs(got["m"][i] - sum(vs) / len(vs)) < 1e-9
    if protocol != "none":
        # The final snapshot is a consistent cut: the Python state plus the rows
        # recorded in flight on the way to it (unaligned barriers log what they
        # overtake at the map, filter or process inputs) is every row's sum.
        import pickle

        state: dict[int, int] = defaultdict(int)
        for name, task in report.snapshots[-1].tasks.items():
            if name.startswith("process") and task.state is not None:
                for k, blob in zip(
                    task.state["k"].to_pylist(), task.state["state"].to_pylist(), strict=True
                ):
                    state[k] += pickle.loads(blob)
            if name.startswith(("process", "map", "filter")):
                for log in task.channels:
                    for k, v in zip(
                        log.records["k"].to_pylist(), log.records["v"].to_pylist(), strict=True
                    ):
                        state[k] += v
        assert state == {k: sum(vs) for k, vs in groups.items()}
