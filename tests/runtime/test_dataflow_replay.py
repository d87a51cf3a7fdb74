"""Replay and restore of the Python-backed sources and keyed operator, driven
directly (the runtime's job restore is not exposed to Python yet)."""

import pickle
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from snapcut import _core
from snapcut.dataflow import _to_batches


def make_iter() -> Any:
    return _to_batches(({"v": i} for i in range(1_000)), None, None, 64)


def values(batches: list[pa.RecordBatch]) -> list[int]:
    return [v for b in batches for v in b["v"].to_pylist()]


@pytest.mark.parametrize("parallelism", [1, 3])
@pytest.mark.parametrize("offset", [0, 1, 63, 64, 65, 200])
def test_python_source_replays_from_an_offset(parallelism: int, offset: int) -> None:
    for subtask in range(parallelism):
        full, end = _core._replay_source(subtask, parallelism, 0, make_iter=make_iter)
        rest, end2 = _core._replay_source(subtask, parallelism, offset, make_iter=make_iter)
        assert values(rest) == values(full)[offset:]
        assert end == end2 == len(values(full))


def test_python_sources_split_items_between_subtasks() -> None:
    parts = [values(_core._replay_source(s, 3, 0, make_iter=make_iter)[0]) for s in range(3)]
    assert sorted(v for p in parts for v in p) == list(range(1_000))
    assert all(parts)


def test_batches_source_replays_from_an_offset() -> None:
    batches = pa.table({"v": list(range(500))}).to_batches(max_chunksize=50)
    for subtask in range(2):
        full, _ = _core._replay_source(subtask, 2, 0, batches=batches)
        rest, end = _core._replay_source(subtask, 2, 75, batches=batches)
        assert values(rest) == values(full)[75:]
        assert end == len(values(full))


def test_seek_past_the_end_is_an_error() -> None:
    with pytest.raises(_core.TaskError, match="cannot seek to offset 5000"):
        _core._replay_source(0, 1, 5_000, make_iter=make_iter)


def running(key: str, rows: pa.RecordBatch, state: dict[str, int] | None) -> tuple[Any, Any]:
    state = state or {"n": 0, "sum": 0}
    state = {"n": state["n"] + rows.num_rows, "sum": state["sum"] + pc.sum(rows["v"]).as_py()}
    out = pa.RecordBatch.from_pydict({"k": [key], "n": [state["n"]], "sum": [state["sum"]]})
    return out, state


def test_keyed_state_restores_from_its_snapshot() -> None:
    rows = pa.table({"k": [f"u{i % 4}" for i in range(400)], "v": list(range(400))})
    batches = rows.to_batches(max_chunksize=37)
    before, after = batches[:5], batches[5:]
    snap, outputs, end = _core._keyed_roundtrip("k", running, before, after)

    # The snapshot is Arrow: the key column plus the pickled state.
    assert snap.schema.names == ["k", "state"]
    restored = {k: pickle.loads(s) for k, s in zip(*snap.to_pydict().values(), strict=True)}
    seen = pa.Table.from_batches(before).to_pydict()
    for key, state in restored.items():
        mine = [v for k, v in zip(seen["k"], seen["v"], strict=True) if k == key]
        assert state == {"n": len(mine), "sum": sum(mine)}

    # Continuing from the restored state gives what one uninterrupted run gives.
    final = {k: pickle.loads(s) for k, s in zip(*end.to_pydict().values(), strict=True)}
    all_rows = rows.to_pydict()
    for key in {f"u{i}" for i in range(4)}:
        mine = [v for k, v in zip(all_rows["k"], all_rows["v"], strict=True) if k == key]
        assert final[key] == {"n": len(mine), "sum": sum(mine)}
    last = pa.Table.from_batches(outputs).to_pydict()
    assert last["sum"][-1] == final[last["k"][-1]]["sum"]


def test_keyed_state_with_integer_keys_round_trips() -> None:
    batches = pa.table({"k": [1, 2, 1, 3], "v": [1, 2, 3, 4]}).to_batches(max_chunksize=2)
    snap, _, end = _core._keyed_roundtrip("k", running, batches[:1], batches[1:])
    assert snap.schema.field("k").type == pa.int64()
    assert sorted(end["k"].to_pylist()) == [1, 2, 3]
