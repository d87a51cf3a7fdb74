//! Built-in operators and partitionings: union of several inputs,
//! broadcast, round-robin, hash by string key, aggregates and their
//! snapshot/restore, the batch source's replay offsets.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Emitter, Operator, Source};
use snapcut_core::runtime::ops::{
    batch_source, collect_sink, dwell_source, keyed_aggregate, map_batches, union, AggSpec,
    BatchSource, KeyedAggregate,
};
use snapcut_core::runtime::partition::{subtask_for_int, subtask_for_str};
use snapcut_core::runtime::{CheckpointConfig, InMemorySnapshots, Job, JobOptions};

fn kv(keys: &[&str], vals: &[f64]) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Float64, true),
        ])),
        vec![
            Arc::new(StringArray::from(keys.to_vec())),
            Arc::new(Float64Array::from(vals.to_vec())),
        ],
    )
    .unwrap()
}

fn run(g: LogicalGraph) -> snapcut_core::runtime::JobReport {
    let config = CheckpointConfig {
        interval: Some(std::time::Duration::from_millis(2)),
        ..Default::default()
    };
    Job::new(g, config, JobOptions::default())
        .unwrap()
        .run(Arc::new(InMemorySnapshots::new()))
        .unwrap()
}

#[test]
fn union_merges_two_sources_and_string_keys_aggregate_across_subtasks() {
    let mut g = LogicalGraph::new();
    let a = g.add_source(
        "a",
        1,
        batch_source(vec![kv(&["x", "y", "x"], &[1.0, 2.0, 3.0])]),
    );
    let b = g.add_source(
        "b",
        2,
        batch_source(vec![kv(&["y", "z"], &[4.0, 5.0]), kv(&["x"], &[-6.0])]),
    );
    let u = g.add_operator("u", 2, union());
    let agg = g.add_operator(
        "agg",
        3,
        keyed_aggregate(
            "k",
            vec![
                AggSpec::sum("v", "sum"),
                AggSpec::min("v", "min"),
                AggSpec::max("v", "max"),
                AggSpec::mean("v", "mean"),
                AggSpec::count("v", "n"),
            ],
        )
        .unwrap(),
    );
    let (sink, out) = collect_sink();
    let s = g.add_operator("sink", 1, sink);
    g.connect(a, u, Partitioning::RoundRobin);
    g.connect(b, u, Partitioning::RoundRobin);
    g.connect(u, agg, Partitioning::Hash { key: "k".into() });
    g.connect(agg, s, Partitioning::RoundRobin);
    let report = run(g);
    assert_eq!(report.records_in, 6);
    let mut got = BTreeMap::new();
    for b in out.batches() {
        let k = b.column_by_name("k").unwrap().as_string::<i32>();
        let f = |c: &str| {
            b.column_by_name(c)
                .unwrap()
                .as_primitive::<Float64Type>()
                .clone()
        };
        let (sum, min, max, mean) = (f("sum"), f("min"), f("max"), f("mean"));
        let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            got.insert(
                k.value(i).to_string(),
                (
                    sum.value(i),
                    min.value(i),
                    max.value(i),
                    mean.value(i),
                    n.value(i),
                ),
            );
        }
    }
    assert_eq!(got["x"], (-2.0, -6.0, 3.0, -2.0 / 3.0, 3));
    assert_eq!(got["y"], (6.0, 2.0, 4.0, 3.0, 2));
    assert_eq!(got["z"], (5.0, 5.0, 5.0, 5.0, 1));
    assert_eq!(got.len(), 3);
}

#[test]
fn broadcast_reaches_every_subtask_and_round_robin_deals_batches() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, dwell_source(10_000, 5, 1, 100).unwrap());
    let m = g.add_operator("m", 3, map_batches(|b| Ok(Some(b))));
    let r = g.add_operator("r", 2, union());
    let (sink, out) = collect_sink();
    let k = g.add_operator("sink", 1, sink);
    g.connect(s, m, Partitioning::Broadcast);
    g.connect(m, r, Partitioning::RoundRobin);
    g.connect(r, k, Partitioning::RoundRobin);
    let report = run(g);
    assert_eq!(out.num_rows(), 30_000);
    let per_task: BTreeMap<String, u64> = report
        .tasks
        .iter()
        .map(|t| (t.task.to_string(), t.records_in))
        .collect();
    for sub in 0..3 {
        assert_eq!(per_task[&format!("m-{sub}")], 10_000);
    }
    // Round-robin deals whole batches: both receivers get some.
    assert!(per_task["r-0"] > 0 && per_task["r-1"] > 0);
    assert_eq!(per_task["r-0"] + per_task["r-1"], 30_000);
}

#[test]
fn hash_partitioning_sends_each_key_to_one_subtask() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 2, dwell_source(50_000, 37, 9, 512).unwrap());
    // Each subtask tags its rows with its own index.
    let tag = Arc::new(
        |sub: usize, _: usize| -> snapcut_core::Result<Box<dyn Operator>> {
            struct Tag(usize);
            impl Operator for Tag {
                fn process(
                    &mut self,
                    _: usize,
                    b: Batch,
                    out: &mut dyn Emitter,
                ) -> snapcut_core::Result<()> {
                    let sub = Int64Array::from(vec![self.0 as i64; b.num_rows()]);
                    let schema = Arc::new(Schema::new(vec![
                        Field::new("user", DataType::Int64, false),
                        Field::new("sub", DataType::Int64, false),
                    ]));
                    out.emit(
                        RecordBatch::try_new(schema, vec![b.column(0).clone(), Arc::new(sub)])
                            .unwrap(),
                    )
                }
            }
            Ok(Box::new(Tag(sub)))
        },
    );
    let t = g.add_operator("tag", 4, tag);
    let (sink, out) = collect_sink();
    let k = g.add_operator("sink", 1, sink);
    g.connect(s, t, Partitioning::Hash { key: "user".into() });
    g.connect(t, k, Partitioning::RoundRobin);
    run(g);
    let mut seen: BTreeMap<i64, i64> = BTreeMap::new();
    for b in out.batches() {
        let u = b.column(0).as_primitive::<Int64Type>();
        let s = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let prev = *seen.entry(u.value(i)).or_insert(s.value(i));
            assert_eq!(prev, s.value(i), "user {} reached two subtasks", u.value(i));
            assert_eq!(subtask_for_int(u.value(i), 4) as i64, s.value(i));
        }
    }
    assert_eq!(seen.len(), 37);
    assert_eq!(subtask_for_str("abc", 7), subtask_for_str("abc", 7));
}

struct Sink(Vec<Batch>);
impl Emitter for Sink {
    fn emit(&mut self, b: Batch) -> snapcut_core::Result<()> {
        self.0.push(b);
        Ok(())
    }
}

#[test]
fn aggregate_state_round_trips_through_restore() {
    let specs = vec![
        AggSpec::sum("v", "s"),
        AggSpec::mean("v", "m"),
        AggSpec::max("v", "x"),
    ];
    let mut a = KeyedAggregate::new("k", specs.clone());
    let mut out = Sink(Vec::new());
    a.process(0, kv(&["p", "q", "p"], &[1.0, 2.0, 5.0]), &mut out)
        .unwrap();
    let state = a.snapshot(1).unwrap().unwrap();
    assert_eq!(state.batch.num_rows(), 2);
    let mut b = KeyedAggregate::new("k", specs);
    b.restore(&[state]).unwrap();
    a.process(0, kv(&["q"], &[10.0]), &mut out).unwrap();
    b.process(0, kv(&["q"], &[10.0]), &mut out).unwrap();
    let (mut ra, mut rb) = (Sink(Vec::new()), Sink(Vec::new()));
    a.finish(&mut ra).unwrap();
    b.finish(&mut rb).unwrap();
    assert_eq!(ra.0, rb.0);
    assert!(out.0.is_empty(), "aggregates emit only at the end");
}

#[test]
fn aggregate_captured_before_its_first_batch_stays_consistent() {
    use snapcut_core::snapshot::StateKind;
    // A checkpoint can reach an aggregate before any record does; its
    // capture then has placeholder int64 columns. The next capture must be
    // full (a utf8 diff on an int64 base cannot merge), and a restore from
    // the empty capture must still accept utf8 keys.
    let mut a = KeyedAggregate::new("k", vec![AggSpec::sum("v", "s")]);
    a.set_full_every(10);
    let empty = a.snapshot(1).unwrap().unwrap();
    assert_eq!(empty.kind, StateKind::Full);
    a.commit(1).unwrap();
    let mut out = Sink(Vec::new());
    a.process(0, kv(&["p"], &[1.0]), &mut out).unwrap();
    let second = a.snapshot(2).unwrap().unwrap();
    assert_eq!(
        second.kind,
        StateKind::Full,
        "first capture with real types"
    );
    assert_eq!(second.batch.schema().field(0).data_type(), &DataType::Utf8);
    a.commit(2).unwrap();
    a.process(0, kv(&["q"], &[2.0]), &mut out).unwrap();
    let third = a.snapshot(3).unwrap().unwrap();
    assert_eq!(third.kind, StateKind::Diff { base: 2 }, "diffs resume");

    let mut b = KeyedAggregate::new("k", vec![AggSpec::sum("v", "s")]);
    b.restore(&[empty]).unwrap();
    b.process(0, kv(&["p", "p"], &[1.0, 2.0]), &mut out)
        .unwrap();
    let mut rb = Sink(Vec::new());
    b.finish(&mut rb).unwrap();
    let sums = rb.0[0]
        .column_by_name("s")
        .unwrap()
        .as_primitive::<Float64Type>();
    assert_eq!(sums.value(0), 3.0);
}

#[test]
fn an_aborted_capture_of_every_key_is_never_left_out_of_a_later_diff() {
    use snapcut_core::snapshot::StateKind;
    // 3 captures every key and is aborted; 4 is full but not confirmed yet
    // when 5 is taken: a diff at 5 on 2 must hold 3's changes too (q, x, r).
    let specs = vec![AggSpec::sum("v", "s")];
    let mut a = KeyedAggregate::new("k", specs.clone());
    a.set_full_every(100);
    let mut out = Sink(Vec::new());
    a.process(0, kv(&["p", "q", "x"], &[1.0, 2.0, 3.0]), &mut out)
        .unwrap();
    let first = a.snapshot(1).unwrap().unwrap();
    a.commit(1).unwrap();
    a.process(0, kv(&["p"], &[1.0]), &mut out).unwrap();
    let second = a.snapshot(2).unwrap().unwrap();
    assert_eq!(second.kind, StateKind::Diff { base: 1 });
    a.commit(2).unwrap();
    a.process(
        0,
        kv(&["p", "q", "x", "r"], &[1.0, 2.0, 3.0, 4.0]),
        &mut out,
    )
    .unwrap();
    assert_eq!(a.snapshot(3).unwrap().unwrap().kind, StateKind::Full);
    a.abort(3).unwrap();
    a.process(0, kv(&["s"], &[5.0]), &mut out).unwrap();
    assert_eq!(a.snapshot(4).unwrap().unwrap().kind, StateKind::Full);
    a.process(0, kv(&["p"], &[6.0]), &mut out).unwrap();
    let fifth = a.snapshot(5).unwrap().unwrap();
    let full = match fifth.kind {
        StateKind::Full => fifth,
        StateKind::Diff { base } => {
            // Rebuilt from its chain, as a store does.
            assert_eq!(base, 2);
            let schema = first.batch.schema();
            let mut t = snapcut_core::state::StateTable::new(
                schema,
                "k",
                snapcut_core::state::StatePolicy { full_every: 100 },
            )
            .unwrap();
            t.restore(&[(1, first), (2, second), (5, fifth)]).unwrap();
            snapcut_core::snapshot::StateCapture {
                kind: StateKind::Full,
                batch: t.to_batch(),
                filter: None,
                times: None,
            }
        }
    };
    let mut b = KeyedAggregate::new("k", specs);
    b.restore(&[full]).unwrap();
    let (mut ra, mut rb) = (Sink(Vec::new()), Sink(Vec::new()));
    a.finish(&mut ra).unwrap();
    b.finish(&mut rb).unwrap();
    assert_eq!(ra.0, rb.0, "5 restores the state at 5");
}

#[test]
fn aggregate_capture_of_half_the_keys_is_full() {
    use snapcut_core::snapshot::{StateKind, FULL_BEATS_DIFF_MIN_KEYS};
    let keys: Vec<String> = (0..2 * FULL_BEATS_DIFF_MIN_KEYS)
        .map(|k| format!("u{k}"))
        .collect();
    let some = |r: std::ops::Range<usize>| {
        let ks: Vec<&str> = keys[r].iter().map(String::as_str).collect();
        kv(&ks, &vec![1.0; ks.len()])
    };
    let half = FULL_BEATS_DIFF_MIN_KEYS;
    let mut a = KeyedAggregate::new("k", vec![AggSpec::sum("v", "s")]);
    a.set_full_every(100);
    let mut out = Sink(Vec::new());
    a.process(0, some(0..2 * half), &mut out).unwrap();
    assert_eq!(a.snapshot(1).unwrap().unwrap().kind, StateKind::Full);
    a.commit(1).unwrap();
    // One key short of half: a diff.
    a.process(0, some(0..half - 1), &mut out).unwrap();
    let second = a.snapshot(2).unwrap().unwrap();
    assert_eq!(second.kind, StateKind::Diff { base: 1 });
    assert_eq!(second.batch.num_rows(), half - 1);
    a.commit(2).unwrap();
    // Half in this interval: full.
    a.process(0, some(half..2 * half), &mut out).unwrap();
    assert_eq!(a.snapshot(3).unwrap().unwrap().kind, StateKind::Full);
    a.commit(3).unwrap();
    // A third, then (3's successor not confirmed) another third: the second
    // diff would carry two thirds of the keys, so it is full.
    a.process(0, some(0..half * 2 / 3), &mut out).unwrap();
    assert_eq!(
        a.snapshot(4).unwrap().unwrap().kind,
        StateKind::Diff { base: 3 }
    );
    a.process(0, some(half..half + half * 2 / 3), &mut out)
        .unwrap();
    let fifth = a.snapshot(5).unwrap().unwrap();
    assert_eq!(fifth.kind, StateKind::Full);
    let mut b = KeyedAggregate::new("k", vec![AggSpec::sum("v", "s")]);
    b.restore(&[fifth]).unwrap();
    let (mut ra, mut rb) = (Sink(Vec::new()), Sink(Vec::new()));
    a.finish(&mut ra).unwrap();
    b.finish(&mut rb).unwrap();
    assert_eq!(ra.0, rb.0);
}

/// A chain whose diffs would hold as many rows as the table ends with a
/// full capture, though no single interval changed half the keys.
#[test]
fn aggregate_chain_as_long_as_the_table_ends_with_a_full() {
    use snapcut_core::snapshot::{StateKind, FULL_BEATS_DIFF_MIN_KEYS};
    let n = 2 * FULL_BEATS_DIFF_MIN_KEYS;
    let keys: Vec<String> = (0..n).map(|k| format!("u{k}")).collect();
    let some = |r: std::ops::Range<usize>| {
        let ks: Vec<&str> = keys[r].iter().map(String::as_str).collect();
        kv(&ks, &vec![1.0; ks.len()])
    };
    let specs = vec![AggSpec::sum("v", "s")];
    let mut a = KeyedAggregate::new("k", specs.clone());
    // As under a store that compacts: no periodic full.
    a.set_full_every(u32::MAX);
    let mut out = Sink(Vec::new());
    a.process(0, some(0..n), &mut out).unwrap();
    assert_eq!(a.snapshot(1).unwrap().unwrap().kind, StateKind::Full);
    a.commit(1).unwrap();
    // A third of the keys an interval: three diffs hold 3 x n/3 < n rows;
    // a fourth would pass n, so that capture is the table.
    let third = n / 3;
    let mut kinds = Vec::new();
    for id in 2..=7u64 {
        let start = (id as usize * third) % (n - third);
        a.process(0, some(start..start + third), &mut out).unwrap();
        let capture = a.snapshot(id).unwrap().unwrap();
        kinds.push(capture.kind);
        a.commit(id).unwrap();
        if capture.kind == StateKind::Full {
            assert_eq!(capture.batch.num_rows(), n);
            let mut b = KeyedAggregate::new("k", specs.clone());
            b.restore(&[capture]).unwrap();
            let (mut ra, mut rb) = (Sink(Vec::new()), Sink(Vec::new()));
            a.finish(&mut ra).unwrap();
            b.finish(&mut rb).unwrap();
            assert_eq!(ra.0, rb.0);
        }
    }
    assert_eq!(
        kinds,
        vec![
            StateKind::Diff { base: 1 },
            StateKind::Diff { base: 2 },
            StateKind::Diff { base: 3 },
            StateKind::Full,
            StateKind::Diff { base: 5 },
            StateKind::Diff { base: 6 },
        ]
    );
}

#[test]
fn aggregate_capture_of_every_key_is_full() {
    use snapcut_core::snapshot::StateKind;
    let specs = vec![AggSpec::sum("v", "s")];
    let mut a = KeyedAggregate::new("k", specs.clone());
    a.set_full_every(100);
    let mut out = Sink(Vec::new());
    a.process(0, kv(&["p", "q"], &[1.0, 2.0]), &mut out)
        .unwrap();
    assert_eq!(a.snapshot(1).unwrap().unwrap().kind, StateKind::Full);
    a.commit(1).unwrap();
    a.process(0, kv(&["p"], &[1.0]), &mut out).unwrap();
    assert_eq!(
        a.snapshot(2).unwrap().unwrap().kind,
        StateKind::Diff { base: 1 }
    );
    a.commit(2).unwrap();
    // Every key changed in the interval: the whole table, ending the chain.
    a.process(0, kv(&["q", "p"], &[3.0, 4.0]), &mut out)
        .unwrap();
    let third = a.snapshot(3).unwrap().unwrap();
    assert_eq!(third.kind, StateKind::Full);
    assert_eq!(third.batch.num_rows(), 2);
    a.commit(3).unwrap();
    a.process(0, kv(&["p"], &[5.0]), &mut out).unwrap();
    assert_eq!(
        a.snapshot(4).unwrap().unwrap().kind,
        StateKind::Diff { base: 3 }
    );
    // 4 not confirmed yet: 5's diff on 3 would carry p (from 4) and q, every key.
    a.process(0, kv(&["q"], &[6.0]), &mut out).unwrap();
    let fifth = a.snapshot(5).unwrap().unwrap();
    assert_eq!(fifth.kind, StateKind::Full);
    let mut b = KeyedAggregate::new("k", specs);
    b.restore(&[fifth]).unwrap();
    let (mut ra, mut rb) = (Sink(Vec::new()), Sink(Vec::new()));
    a.finish(&mut ra).unwrap();
    b.finish(&mut rb).unwrap();
    assert_eq!(ra.0, rb.0);
    let sums = ra.0[0]
        .column_by_name("s")
        .unwrap()
        .as_primitive::<Float64Type>();
    assert_eq!(sums.values().iter().sum::<f64>(), 22.0);
}

/// A hot key space (every key written in two intervals in a row) stops
/// per-row change tracking for a while: the captures stay full, restore to
/// the same state, and diffs come back once an interval leaves keys alone.
#[test]
fn aggregate_hot_key_space_takes_full_captures_then_diffs_again() {
    use snapcut_core::snapshot::StateKind;
    let specs = vec![AggSpec::sum("v", "s")];
    let mut a = KeyedAggregate::new("k", specs.clone());
    a.set_full_every(100);
    let mut out = Sink(Vec::new());
    let mut kinds = Vec::new();
    let mut last = None;
    for id in 1..=4 {
        a.process(0, kv(&["p", "q"], &[1.0, 2.0]), &mut out)
            .unwrap();
        let capture = a.snapshot(id).unwrap().unwrap();
        kinds.push(capture.kind);
        a.commit(id).unwrap();
        last = Some(capture);
    }
    // Every key changes each time: 1 and 2 tracked, 3 untracked, 4 tracked
    // again; all full.
    assert_eq!(kinds, vec![StateKind::Full; 4]);
    let mut b = KeyedAggregate::new("k", specs.clone());
    b.restore(&[last.unwrap()]).unwrap();
    let (mut ra, mut rb) = (Sink(Vec::new()), Sink(Vec::new()));
    a.finish(&mut ra).unwrap();
    b.finish(&mut rb).unwrap();
    assert_eq!(ra.0, rb.0);
    // 5, 6: untracked (the backoff doubled) though one key changes; 7 is
    // tracked, finds only p, and is a diff on 6.
    for id in 5..=7 {
        a.process(0, kv(&["p"], &[1.0]), &mut out).unwrap();
        let capture = a.snapshot(id).unwrap().unwrap();
        let want = if id < 7 {
            StateKind::Full
        } else {
            StateKind::Diff { base: 6 }
        };
        assert_eq!(capture.kind, want, "checkpoint {id}");
        if id == 7 {
            assert_eq!(capture.batch.num_rows(), 1);
        }
        a.commit(id).unwrap();
    }
}

/// With `full_every` 1 nothing is tracked; raising it later makes the next
/// capture full (no diff may rest on untracked changes), then diffs follow.
#[test]
fn aggregate_raising_full_every_starts_with_a_full_capture() {
    use snapcut_core::snapshot::StateKind;
    let mut a = KeyedAggregate::new("k", vec![AggSpec::sum("v", "s")]);
    let mut out = Sink(Vec::new());
    a.process(0, kv(&["p", "q"], &[1.0, 2.0]), &mut out)
        .unwrap();
    assert_eq!(a.snapshot(1).unwrap().unwrap().kind, StateKind::Full);
    a.commit(1).unwrap();
    a.process(0, kv(&["q"], &[3.0]), &mut out).unwrap();
    a.set_full_every(10);
    assert_eq!(a.snapshot(2).unwrap().unwrap().kind, StateKind::Full);
    a.commit(2).unwrap();
    a.process(0, kv(&["p"], &[4.0]), &mut out).unwrap();
    let third = a.snapshot(3).unwrap().unwrap();
    assert_eq!(third.kind, StateKind::Diff { base: 2 });
    assert_eq!(third.batch.num_rows(), 1);
}

#[test]
fn aggregate_rejects_null_keys_and_bad_types_clearly() {
    let mut a = KeyedAggregate::new("k", vec![AggSpec::sum("v", "s")]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Utf8, false),
    ]));
    let b = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(StringArray::from(vec!["a", "b"])),
        ],
    )
    .unwrap();
    let e = a
        .process(0, b, &mut Sink(Vec::new()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"v\" has type Utf8"), "{e}");
    let mut a = KeyedAggregate::new("missing", vec![AggSpec::sum("v", "s")]);
    let e = a
        .process(0, kv(&["p"], &[1.0]), &mut Sink(Vec::new()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"missing\" is not in the batch"), "{e}");
}

#[test]
fn batch_source_replays_from_any_record_offset() {
    let batches = vec![
        kv(&["a", "b", "c"], &[1.0, 2.0, 3.0]),
        kv(&["d", "e"], &[4.0, 5.0]),
    ];
    let all = |s: &mut BatchSource| {
        let mut keys = Vec::new();
        while let Some(b) = s.next_batch().unwrap() {
            keys.extend(
                b.column(0)
                    .as_string::<i32>()
                    .iter()
                    .map(|k| k.unwrap().to_string()),
            );
        }
        keys
    };
    for offset in 0..=5u64 {
        let mut s = BatchSource::new(batches.clone());
        s.seek(offset).unwrap();
        let keys = all(&mut s);
        let want: Vec<String> = ["a", "b", "c", "d", "e"][offset as usize..]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(keys, want, "offset {offset}");
        assert_eq!(s.offset(), 5);
    }
    assert!(BatchSource::new(batches).seek(6).is_err());
}
