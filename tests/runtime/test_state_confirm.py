"""snapcut.StateTable with several checkpoints in flight: confirm_bases()
bases each diff on the last checkpoint confirmed with checkpoint_committed(),
so a diff never depends on a checkpoint that may still be aborted."""

from __future__ import annotations

import pyarrow as pa

from snapcut import StateTable

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])


def rows(keys: list[int], add: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(keys, pa.int64()), pa.array([k + add for k in keys], pa.int64())],
        schema=SCHEMA,
    )


def contents(t: StateTable) -> dict[int, int]:
    d = t.to_arrow().to_pydict()
    return dict(zip(d["k"], d["v"], strict=True))


def test_diff_skips_an_unconfirmed_checkpoint_and_restores_after_its_abort() -> None:
    t = StateTable(SCHEMA, "k")
    t.confirm_bases()
    t.update(rows([1, 2]))
    c1 = t.checkpoint(1)
    assert c1[1] == "full" and t.last_base is None
    t.checkpoint_committed(1)
    t.update(rows([3]))
    assert t.checkpoint(2)[1] == "diff" and t.last_base == 1
    t.update(rows([4], add=10))
    t.delete([1])
    c3 = t.checkpoint(3)  # 2 is still in flight: based on 1, with 2's changes
    assert c3[1] == "diff" and t.last_base == 1
    diff = c3[2].to_pydict()
    assert sorted(zip(diff["k"], diff["__deleted"], strict=True)) == [
        (1, True),
        (3, False),
        (4, False),
    ]
    t.checkpoint_aborted()  # 2 timed out; 3 does not need it
    restored = StateTable(SCHEMA, "k")
    restored.restore([c1, c3])
    assert contents(restored) == contents(t) == {2: 2, 3: 3, 4: 14}


def test_without_confirm_bases_a_diff_is_based_on_the_last_checkpoint() -> None:
    t = StateTable(SCHEMA, "k")
    t.update(rows([1]))
    t.checkpoint(1)
    t.update(rows([2]))
    t.checkpoint(2)
    t.checkpoint_committed(1)  # ignored in this mode
    t.update(rows([3]))
    assert t.checkpoint(3)[1] == "diff" and t.last_base == 2
