"""snapcut._core.KeyedAggregates, StateTable.lookup and encode_keys through the
Python API: batches folded into a StateTable agree with a plain-Python model
(and with pyarrow's group_by), diffs hold only touched keys, composite keys
encode alike in every process, and bad inputs raise ConfigError saying what to fix."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapcut import ConfigError, _core

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("f", pa.float64()), ("s", pa.string())])
SPECS: list[tuple[str, str | None, str]] = [
    ("count", None, "rows"),
    ("count", "v", "n_v"),
    ("sum", "v", "sum_v"),
    ("sum", "f", "sum_f"),
    ("min", "v", "min_v"),
    ("max", "s", "max_s"),
    ("mean", "v", "avg_v"),
    ("mean", "f", "avg_f"),
    ("first", "s", "first_s"),
    ("last", "v", "last_v"),
]

Row = tuple[str, int | None, float | None, str | None]


def batch(rows: list[Row]) -> pa.RecordBatch:
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, t.type) for c, t in zip(cols, SCHEMA, strict=True)], schema=SCHEMA
    )


def model(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Results of SPECS over rows, folded one row at a time."""
    out: dict[str, dict[str, Any]] = {}
    for k, v, f, s in rows:
        a = out.setdefault(
            k,
            {
                "rows": 0,
                "n_v": 0,
                "sum_v": None,
                "sum_f": None,
                "min_v": None,
                "max_s": None,
                "vs": [],
                "fs": [],
                "first_s": None,
                "last_v": None,
            },
        )
        a["rows"] += 1
        if v is not None:
            a["n_v"] += 1
            a["sum_v"] = (a["sum_v"] or 0) + v
            a["min_v"] = v if a["min_v"] is None else min(a["min_v"], v)
            a["vs"].append(v)
            a["last_v"] = v
        if f is not None:
            a["sum_f"] = (a["sum_f"] or 0.0) + f
            a["fs"].append(f)
        if s is not None:
            a["max_s"] = s if a["max_s"] is None else max(a["max_s"], s)
            if a["first_s"] is None:
                a["first_s"] = s
    for a in out.values():
        vs, fs = a.pop("vs"), a.pop("fs")
        a["avg_v"] = sum(vs) / len(vs) if vs else None
        a["avg_f"] = a["sum_f"] / len(fs) if fs else None
    return out


def results(
    aggs: _core.KeyedAggregates, rows: pa.RecordBatch | pa.Table
) -> dict[str, dict[str, Any]]:
    d = aggs.output(rows).to_pydict()
    keys = d.pop("k")
    return {k: {c: d[c][i] for c in d} for i, k in enumerate(keys)}


def close(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> bool:
    """Equal, with float results compared to a relative 1e-12."""
    if a.keys() != b.keys():
        return False
    for k in a:
        for c, x in a[k].items():
            y = b[k][c]
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-12):
                    return False
            elif x != y:
                return False
    return True


def new(
    specs: list[tuple[str, str | None, str]] = SPECS,
) -> tuple[_core.KeyedAggregates, _core.StateTable]:
    aggs = _core.KeyedAggregates(SCHEMA, "k", specs)
    return aggs, _core.StateTable(aggs.state_schema, "k", full_every=100)


def test_round_trip_over_batches_and_tables() -> None:
    aggs, table = new()
    steps: list[list[Row]] = [
        [("a", 1, 0.5, "x"), ("b", None, None, None), ("a", 5, None, "q")],
        [("b", 7, 2.0, "z"), ("c", None, 1.5, None)],
        [("a", None, 0.25, "y"), ("a", -2, None, None)],
    ]
    seen: list[Row] = []
    for i, rows in enumerate(steps):
        data: pa.RecordBatch | pa.Table = batch(rows)
        if i == 1:  # a Table of several chunks is joined into one batch
            data = pa.Table.from_batches([batch(rows[:1]), batch(rows[1:])])
        touched = aggs.apply(table, data)
        seen += rows
        assert isinstance(touched, pa.RecordBatch)
        assert touched.schema.equals(aggs.state_schema)
        assert touched.column("k").to_pylist() == list(dict.fromkeys(r[0] for r in rows))
        want = model(seen)
        assert close(results(aggs, touched), {k: want[k] for k in touched.column("k").to_pylist()})
    assert close(results(aggs, table.to_arrow()), model(seen))
    assert aggs.output_schema.names == ["k"] + [s[2] for s in SPECS]


def test_state_schema_names_and_types() -> None:
    aggs, _ = new()
    state = aggs.state_schema
    assert state.names == [
        "k",
        "rows",
        "n_v",
        "sum_v",
        "sum_f",
        "min_v",
        "max_s",
        "avg_v__sum",
        "avg_v__count",
        "avg_f__sum",
        "avg_f__count",
        "first_s",
        "last_v",
    ]
    assert state.field("sum_v").type == pa.int64()
    assert state.field("sum_f").type == pa.float64()
    assert state.field("avg_v__sum").type == pa.int64()  # exact for integer input
    assert state.field("max_s").type == pa.string()
    assert not state.field("k").nullable and not state.field("rows").nullable
    assert state.metadata == {b"snapcut.key": b"k"}
    assert aggs.output_schema.field("avg_v").type == pa.float64()
    assert "count(*) AS rows" in repr(aggs)


def test_against_pyarrow_group_by() -> None:
    aggs, table = new(
        [
            ("count", None, "n"),
            ("sum", "v", "t"),
            ("min", "f", "lo"),
            ("max", "f", "hi"),
            ("mean", "f", "avg"),
        ]
    )
    rows: list[Row] = [
        (f"k{i % 7}", i if i % 3 else None, (i * 37 % 11) / 4, None) for i in range(300)
    ]
    for start in range(0, 300, 64):
        aggs.apply(table, batch(rows[start : start + 64]))
    got = aggs.output(table.to_arrow()).to_pylist()
    ref = (
        pa.Table.from_batches([batch(rows)])
        .group_by("k", use_threads=False)
        .aggregate([([], "count_all"), ("v", "sum"), ("f", "min"), ("f", "max"), ("f", "mean")])
        .to_pylist()
    )
    by_key = {r["k"]: r for r in ref}
    assert len(got) == len(ref) == 7
    for r in got:
        want = by_key[r["k"]]
        assert (r["n"], r["t"], r["lo"], r["hi"]) == (
            want["count_all"],
            want["v_sum"],
            want["f_min"],
            want["f_max"],
        )
        assert math.isclose(r["avg"], want["f_mean"], rel_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["a", "b", "c", "d"]),
                st.none() | st.integers(-(10**6), 10**6),
                st.none() | st.integers(-400, 400).map(lambda q: q / 4),
                st.none() | st.text("xyz", max_size=2),
            ),
            max_size=12,
        ),
        max_size=6,
    )
)
def test_random_batches_equal_the_model(steps: list[list[Row]]) -> None:
    aggs, table = new()
    seen: list[Row] = []
    for rows in steps:
        aggs.apply(table, batch(rows))
        seen += rows
    assert close(results(aggs, table.to_arrow()), model(seen))


def test_checkpoint_diff_holds_only_touched_keys_and_restores() -> None:
    aggs, table = new([("sum", "v", "t")])
    aggs.apply(table, batch([(f"k{i}", i, None, None) for i in range(50)]))
    _, kind, full = table.checkpoint(1)
    assert kind == "full"
    aggs.apply(table, batch([("k3", 10, None, None), ("new", 1, None, None)]))
    _, kind, diff = table.checkpoint(2)
    assert kind == "diff"
    assert sorted(diff.column("k").to_pylist()) == ["k3", "new"]
    restored = _core.StateTable(aggs.state_schema, "k")
    restored.restore([(1, "full", full), (2, "diff", diff)])
    aggs.apply(restored, batch([("k3", 1, None, None)]))
    assert results(aggs, restored.get(["k3", "new"])) == {"k3": {"t": 14}, "new": {"t": 1}}


def test_lookup_order_duplicates_and_absent_keys() -> None:
    table = _core.StateTable(pa.schema([("k", pa.int64()), ("n", pa.int64())]), "k")
    table.update(pa.record_batch({"k": [1, 2], "n": [10, 20]}))
    rows, present = table.lookup([2, 9, 1, 2])
    assert isinstance(rows, pa.RecordBatch) and isinstance(present, pa.BooleanArray)
    assert rows.to_pydict() == {"k": [2, 9, 1, 2], "n": [20, None, 10, 20]}
    assert present.to_pylist() == [True, False, True, True]
    assert rows.schema.field("n").nullable and not rows.schema.field("k").nullable
    rows, present = table.lookup(pa.chunked_array([[2], [5]], pa.int64()))
    assert rows.column("n").to_pylist() == [20, None]
    with pytest.raises(ConfigError, match="key type is Int64"):
        table.lookup(pa.array(["1"]))


def test_composite_keys_with_encode_keys() -> None:
    data = pa.table({"a": [1, 1, 2, 1], "b": ["x", "y", "x", "x"], "v": [1, 2, 3, 4]})
    keys = _core.encode_keys([data["a"], data["b"]])
    assert isinstance(keys, pa.BinaryArray)
    assert keys.to_pylist() == _core.encode_keys(data.select(["a", "b"])).to_pylist()
    assert (
        keys.to_pylist() == _core.encode_keys(data.select(["a", "b"]).to_batches()[0]).to_pylist()
    )
    assert keys[0] == keys[3] and len(set(keys.to_pylist())) == 3
    schema = pa.schema([("key", pa.binary()), ("v", pa.int64())])
    aggs = _core.KeyedAggregates(schema, "key", [("sum", "v", "t")])
    table = _core.StateTable(aggs.state_schema, "key")
    out = aggs.apply(table, pa.record_batch([keys, data["v"].combine_chunks()], schema=schema))
    assert out.column("t").to_pylist() == [5, 2, 3]


def test_encode_keys_is_the_same_in_another_process() -> None:
    code = (
        "import pyarrow as pa; from snapcut import _core;"
        "print(_core.encode_keys([pa.array([1, None, -5]), pa.array(['é', '', None]),"
        " pa.array([0.5, -0.0, float('nan')])]).to_pylist())"
    )
    here = _core.encode_keys(
        [pa.array([1, None, -5]), pa.array(["é", "", None]), pa.array([0.5, 0.0, float("nan")])]
    ).to_pylist()
    there = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert there.stdout.strip() == str(here)
    assert len(set(here)) == 3


def test_encode_keys_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="at least one key column"):
        _core.encode_keys([])
    with pytest.raises(ConfigError, match="one length"):
        _core.encode_keys([pa.array([1, 2]), pa.array([1])])
    with pytest.raises(TypeError, match="for one key column pass"):
        _core.encode_keys(pa.array([1, 2]))
    with pytest.raises(TypeError, match="list of arrays"):
        _core.encode_keys(42)


@pytest.mark.parametrize(
    ("key", "specs", "message"),
    [
        ("k", [("median", "v", "m")], "use one of: count, sum, min, max, mean, first, last"),
        ("k", [("sum", "nope", "x")], "not in the input schema"),
        ("k", [("sum", "s", "x")], "needs a numeric column"),
        ("k", [("sum", None, "x")], "only count may have none"),
        ("k", [("count", None, "k")], "equals the key"),
        ("k", [("count", None, "n"), ("sum", "v", "n")], "used twice"),
        ("k", [("count", None, "__n")], "reserved for state columns"),
        ("k", [("mean", "v", "m"), ("sum", "v", "m__sum")], "clashes"),
        ("k", [], "at least one aggregate"),
        ("f", [("count", None, "n")], "encode_keys"),
        ("missing", [("count", None, "n")], "not in the input schema"),
    ],
)
def test_bad_specs_raise_config_error(
    key: str, specs: list[tuple[str, str | None, str]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _core.KeyedAggregates(SCHEMA, key, specs)


def test_bad_batches_and_tables_raise_config_error() -> None:
    aggs, table = new([("sum", "v", "t")])
    with pytest.raises(ConfigError, match=r"holds 1 null\(s\).*filter or fill"):
        aggs.apply(table, batch([(None, 1, None, None)]))  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="cast it first"):
        aggs.apply(table, pa.record_batch({"k": ["a"], "v": [1.5]}))
    with pytest.raises(ConfigError, match="batch has no column 'v'"):
        aggs.apply(table, pa.record_batch({"k": ["a"]}))
    wrong = _core.StateTable(pa.schema([("k", pa.string()), ("t", pa.float64())]), "k")
    with pytest.raises(ConfigError, match="create it from their state_schema"):
        aggs.apply(wrong, batch([("a", 1, None, None)]))
    assert len(table) == 0 and len(wrong) == 0
    with pytest.raises(_core.TaskError, match="cast the column to float64"):
        aggs.apply(table, batch([("a", 2**62, None, None), ("a", 2**62, None, None)]))
    assert len(table) == 0
