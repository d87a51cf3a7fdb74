//! The spilling keyed aggregate against the in-memory one: same results,
//! checkpoints and restores across the two, a memtable that stays near
//! its budget.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, Float64Array, Int32Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

use super::super::aggregate::KeyedAggregate;
use crate::operator::{Batch, Emitter, Operator};
use crate::runtime::StateMemory;
use crate::snapshot::StateKind;
use crate::state::{AggFunc, AggSpec, MIN_STATE_MEMORY};

#[derive(Default)]
struct Out(Vec<RecordBatch>);

impl Emitter for Out {
    fn emit(&mut self, batch: Batch) -> crate::Result<()> {
        self.0.push(batch);
        Ok(())
    }
}

fn specs() -> Vec<AggSpec> {
    let spec = |func, column: Option<&str>, output: &str| AggSpec {
        func,
        column: column.map(str::to_string),
        output: output.to_string(),
    };
    vec![
        spec(AggFunc::Count, None, "n"),
        spec(AggFunc::Sum, Some("v"), "total"),
        spec(AggFunc::Min, Some("w"), "least"),
        spec(AggFunc::Max, Some("f"), "most"),
        spec(AggFunc::Mean, Some("v"), "avg"),
        spec(AggFunc::Mean, Some("f"), "favg"),
    ]
}

/// Batch `i` of a stream over `keys` keys: an int64 key, int64, int32 and
/// float64 values (a few nulls), deterministic.
fn batch(i: u64, rows: u64, keys: u64) -> RecordBatch {
    let mix = |j: u64| (i * rows + j).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
    let k: Int64Array = (0..rows).map(|j| (mix(j) % keys) as i64).collect();
    let v: Int64Array = (0..rows)
        .map(|j| (j % 17 != 0).then_some((mix(j) % 1000) as i64 - 300))
        .collect();
    let w: Int32Array = (0..rows).map(|j| Some((mix(j) % 5000) as i32)).collect();
    let f: Float64Array = (0..rows)
        .map(|j| (j % 13 != 0).then_some((mix(j) % 10_000) as f64 / 7.0))
        .collect();
    let schema = Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("w", DataType::Int32, false),
        Field::new("f", DataType::Float64, true),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(k), Arc::new(v), Arc::new(w), Arc::new(f)],
    )
    .unwrap()
}

fn in_memory() -> KeyedAggregate {
    let mut op = KeyedAggregate::new("k", specs());
    op.set_full_every(4);
    op
}

fn spilling(dir: &std::path::Path) -> KeyedAggregate {
    let mut op = in_memory();
    let memory = StateMemory {
        budget: MIN_STATE_MEMORY,
        spill_dir: dir.to_path_buf(),
    };
    op.set_state_memory(&memory).unwrap();
    op
}

type Row = (
    i64,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Results by key; floats as text rounded to 6 significant digits (the
/// two operators add a mean's values in different orders).
fn results(op: &mut KeyedAggregate) -> BTreeMap<i64, Row> {
    let mut out = Out::default();
    op.finish(&mut out).unwrap();
    let mut m = BTreeMap::new();
    for b in &out.0 {
        let col = |name: &str| b.column_by_name(name).unwrap().clone();
        let float = |name: &str, i: usize| {
            let c = col(name);
            let c = c.as_primitive::<Float64Type>();
            c.is_valid(i).then(|| format!("{:.6e}", c.value(i)))
        };
        let int = |name: &str, i: usize| {
            let c = col(name);
            let c = c.as_primitive::<Int64Type>();
            c.is_valid(i).then(|| c.value(i))
        };
        for i in 0..b.num_rows() {
            let row = (
                int("n", i).unwrap(),
                int("total", i).unwrap_or(0),
                int("least", i),
                float("most", i),
                float("avg", i),
                float("favg", i),
            );
            m.insert(int("k", i).unwrap(), row);
        }
    }
    m
}

fn feed(op: &mut KeyedAggregate, batches: std::ops::Range<u64>, keys: u64) {
    let mut sink = Out::default();
    for i in batches {
        op.process(0, batch(i, 2_000, keys), &mut sink).unwrap();
    }
}

#[test]
fn spills_under_its_budget_and_matches_the_in_memory_operator() {
    let dir = tempfile::tempdir().unwrap();
    let (mut mem, mut spill) = (in_memory(), spilling(dir.path()));
    for step in 0..10u64 {
        feed(&mut mem, step * 10..step * 10 + 10, 60_000);
        feed(&mut spill, step * 10..step * 10 + 10, 60_000);
        // Checkpoints in between, confirmed: diffs on confirmed bases.
        let (a, b) = (
            mem.snapshot(step + 1).unwrap(),
            spill.snapshot(step + 1).unwrap(),
        );
        assert_eq!(a.is_some(), b.is_some());
        mem.commit(step + 1).unwrap();
        spill.commit(step + 1).unwrap();
    }
    let stats = spill.spill_stats().expect("a spilling operator reports");
    assert!(stats.flushes >= 3, "{stats:?}");
    assert!(stats.memtable_bytes <= 2 * MIN_STATE_MEMORY, "{stats:?}");
    assert!(stats.run_probes > 0, "{stats:?}");
    let want = results(&mut mem);
    assert!(want.len() > 50_000);
    assert_eq!(results(&mut spill), want);
}

#[test]
fn checkpoints_stay_diffs_of_the_changed_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut op = spilling(dir.path());
    feed(&mut op, 0..40, 60_000);
    let first = op.snapshot(1).unwrap().unwrap();
    assert_eq!(first.kind, StateKind::Full);
    op.commit(1).unwrap();
    // A few keys only: the next capture is a diff of exactly those.
    let mut sink = Out::default();
    let few = batch(999, 50, 60_000);
    let touched: std::collections::HashSet<i64> = few
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .iter()
        .copied()
        .collect();
    op.process(0, few, &mut sink).unwrap();
    let second = op.snapshot(2).unwrap().unwrap();
    assert_eq!(second.kind, StateKind::Diff { base: 1 });
    assert_eq!(second.batch.num_rows(), touched.len());
    // An aborted checkpoint: the next one is full again.
    op.abort(2).unwrap();
    feed(&mut op, 40..41, 60_000);
    assert_eq!(op.snapshot(3).unwrap().unwrap().kind, StateKind::Full);
}

#[test]
fn each_operator_restores_the_others_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut whole = in_memory();
    feed(&mut whole, 0..60, 30_000);
    let want = results(&mut whole);
    for spilling_first in [true, false] {
        let mut first = if spilling_first {
            spilling(dir.path())
        } else {
            in_memory()
        };
        first.set_full_every(1);
        feed(&mut first, 0..30, 30_000);
        let state = first.snapshot(1).unwrap().unwrap();
        assert_eq!(state.kind, StateKind::Full);
        let mut second = if spilling_first {
            in_memory()
        } else {
            spilling(dir.path())
        };
        second.restore(std::slice::from_ref(&state)).unwrap();
        // Finished before any batch: the restored state's results.
        let mut idle = if spilling_first {
            in_memory()
        } else {
            spilling(dir.path())
        };
        idle.restore(std::slice::from_ref(&state)).unwrap();
        assert_eq!(results(&mut idle).len(), state.batch.num_rows());
        // A checkpoint before any batch is the restored state as it was.
        let again = second.snapshot(2).unwrap().unwrap();
        assert_eq!(again.kind, StateKind::Full);
        assert_eq!(again.batch.num_rows(), state.batch.num_rows());
        feed(&mut second, 30..60, 30_000);
        assert_eq!(
            results(&mut second),
            want,
            "spilling first: {spilling_first}"
        );
    }
}

#[test]
fn a_budget_below_the_minimum_or_after_a_batch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut op = in_memory();
    feed(&mut op, 0..1, 100);
    let memory = StateMemory {
        budget: MIN_STATE_MEMORY,
        spill_dir: dir.path().to_path_buf(),
    };
    let err = op.set_state_memory(&memory).unwrap_err().to_string();
    assert!(err.contains("before its first batch"), "{err}");
    let config = crate::runtime::CheckpointConfig {
        state_memory: Some(StateMemory {
            budget: MIN_STATE_MEMORY - 1,
            spill_dir: dir.path().to_path_buf(),
        }),
        ..Default::default()
    };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("below the minimum"), "{err}");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let config = crate::runtime::CheckpointConfig {
        state_memory: Some(StateMemory {
            budget: MIN_STATE_MEMORY,
            spill_dir: file,
        }),
        ..Default::default()
    };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("is not a directory"), "{err}");
    // A spill directory that cannot be made fails when the operator is set up.
    let mut op = in_memory();
    let under_a_file = StateMemory {
        budget: MIN_STATE_MEMORY,
        spill_dir: dir.path().join("a-file").join("runs"),
    };
    let err = op.set_state_memory(&under_a_file).unwrap_err().to_string();
    assert!(err.contains("creating the state spill directory"), "{err}");
}

#[test]
fn a_restored_state_of_other_aggregates_is_refused_naming_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = in_memory();
    first.set_full_every(1);
    feed(&mut first, 0..2, 1_000);
    let state = first.snapshot(1).unwrap().unwrap();
    // Another job's aggregates: no "favg__sum" column in this state.
    let mut other = KeyedAggregate::new("k", specs()[..5].to_vec());
    other.set_full_every(1);
    feed(&mut other, 0..2, 1_000);
    let partial = other.snapshot(1).unwrap().unwrap();
    let mut op = spilling(dir.path());
    op.restore(std::slice::from_ref(&partial)).unwrap();
    let mut sink = Out::default();
    let err = op
        .process(0, batch(5, 100, 1_000), &mut sink)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no column \"favg__sum\"") && err.contains("other aggregates"),
        "{err}"
    );
    // The state of the same aggregates restores.
    let mut op = spilling(dir.path());
    op.restore(std::slice::from_ref(&state)).unwrap();
    op.process(0, batch(5, 100, 1_000), &mut sink).unwrap();
}

#[test]
fn a_store_s_runs_restore_lazily_and_the_next_capture_is_a_diff_on_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut whole = in_memory();
    feed(&mut whole, 0..40, 100_000);
    let want = results(&mut whole);
    let mut first = spilling(dir.path());
    first.set_full_every(1000);
    // ~33k keys, then ~18k of ~50k change: under half, a diff.
    feed(&mut first, 0..20, 100_000);
    let full = first.snapshot(1).unwrap().unwrap();
    first.commit(1).unwrap();
    feed(&mut first, 20..30, 100_000);
    let diff = first.snapshot(2).unwrap().unwrap();
    first.commit(2).unwrap();
    assert_eq!(
        (full.kind, diff.kind),
        (StateKind::Full, StateKind::Diff { base: 1 })
    );
    let runs = vec![(1, full), (2, diff)];
    assert!(!in_memory().restores_runs());
    let mut second = spilling(dir.path());
    second.set_full_every(1000);
    assert!(second.restores_runs());
    second.restore_runs(&runs).unwrap();
    // Before any batch a capture is the restored state whole (rebuilt).
    let idle = second.snapshot(3).unwrap().unwrap();
    assert_eq!(idle.kind, StateKind::Full);
    assert_eq!(
        idle.batch.num_rows(),
        crate::store::rebuild_chain(&runs).unwrap().num_rows()
    );
    feed(&mut second, 30..40, 100_000);
    let stats = second.spill_stats().unwrap();
    assert_eq!(stats.bases_mapped, 1, "{stats:?}");
    // The restored checkpoint is the table's confirmed base.
    assert_eq!(
        second.snapshot(4).unwrap().unwrap().kind,
        StateKind::Diff { base: 2 }
    );
    assert_eq!(results(&mut second), want);
}

#[test]
fn runs_are_refused_by_an_in_memory_aggregate_and_without_a_full_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = spilling(dir.path());
    first.set_full_every(1000);
    // ~8,600 keys, then one batch of 2,000 rows: under half of them
    // change, so the second capture is a diff.
    feed(&mut first, 0..10, 10_000);
    let full = first.snapshot(1).unwrap().unwrap();
    first.commit(1).unwrap();
    feed(&mut first, 10..11, 10_000);
    let diff = first.snapshot(2).unwrap().unwrap();
    assert_eq!(diff.kind, StateKind::Diff { base: 1 });
    let err = in_memory()
        .restore_runs(&[(1, full.clone())])
        .unwrap_err()
        .to_string();
    assert!(err.contains("restores from one full capture"), "{err}");
    let err = spilling(dir.path())
        .restore_runs(&[(2, diff)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("must start with a full capture"), "{err}");
}
