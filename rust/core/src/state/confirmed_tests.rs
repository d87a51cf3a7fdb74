//! A spilling table in confirmed-base mode (the local runtime: several
//! checkpoints in flight, a diff based on the newest confirmed one)
//! against a model, its checkpoints taken in memory (`checkpoint`) or left
//! as runs (`checkpoint_streamed`, merged here as a sink would), in any
//! mix: each capture, applied on top of the state its base stood for,
//! gives the model's state when it was taken.

use std::collections::BTreeMap;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::spill_tests::{as_map, rows, schema};
use super::{CaptureRows, InMemoryRuns, StatePolicy, StateTable, DELETED_COLUMN, MIN_STATE_MEMORY};
use crate::protocol::CheckpointId;
use crate::snapshot::{StateKind, StateRuns};

#[derive(Clone, Debug)]
enum Op {
    Upsert(Vec<(i64, i64)>),
    Delete(Vec<i64>),
    Flush,
    /// `true`: `checkpoint_streamed`.
    Checkpoint(bool),
    /// Confirms the n-th (mod count) checkpoint taken and not yet confirmed.
    Confirm(usize),
    /// A checkpoint taken and aborted: the next is full.
    Abort(bool),
}

fn op() -> impl Strategy<Value = Op> {
    let key = -40i64..40;
    prop_oneof![
        4 => prop::collection::vec((key.clone(), -100i64..100), 0..16).prop_map(Op::Upsert),
        2 => prop::collection::vec(key, 0..8).prop_map(Op::Delete),
        1 => Just(Op::Flush),
        3 => any::<bool>().prop_map(Op::Checkpoint),
        2 => (0usize..4).prop_map(Op::Confirm),
        1 => any::<bool>().prop_map(Op::Abort),
    ]
}

/// The capture's rows as a batch: in memory, or its runs merged.
fn materialize(t: &mut StateTable, id: CheckpointId, streamed: bool) -> (StateKind, RecordBatch) {
    if !streamed {
        let c = t.checkpoint(id).unwrap();
        return (c.kind, c.batch);
    }
    let c = t.checkpoint_streamed(id).unwrap();
    match c.rows {
        CaptureRows::Batch(batch) => (c.kind, batch),
        CaptureRows::Runs { runs, schema, base } => {
            assert_eq!(base, c.kind == StateKind::Full);
            let merged = StateRuns {
                kind: c.kind,
                runs,
                schema,
            }
            .to_capture()
            .unwrap();
            (merged.kind, merged.batch)
        }
    }
}

fn patched(mut state: BTreeMap<i64, i64>, diff: &RecordBatch) -> BTreeMap<i64, i64> {
    let k = diff.column(0).as_primitive::<Int64Type>();
    let v = diff.column(1).as_primitive::<Int64Type>();
    let dead = diff
        .column_by_name(DELETED_COLUMN)
        .expect("a diff has tombstones")
        .as_boolean();
    for i in 0..diff.num_rows() {
        if dead.value(i) {
            state.remove(&k.value(i));
        } else {
            state.insert(k.value(i), v.value(i));
        }
    }
    state
}

fn check(ops: Vec<Op>, full_every: u32) -> Result<(), TestCaseError> {
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every })
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap();
    t.confirm_bases();
    let mut model: BTreeMap<i64, i64> = BTreeMap::new();
    // What each checkpoint's capture stands for, and which are confirmed.
    let mut states: BTreeMap<CheckpointId, BTreeMap<i64, i64>> = BTreeMap::new();
    let mut unconfirmed: Vec<CheckpointId> = Vec::new();
    let mut confirmed: Vec<CheckpointId> = Vec::new();
    let mut next: CheckpointId = 1;
    for op in ops {
        match op {
            Op::Upsert(pairs) => {
                t.upsert(&rows(&pairs)).unwrap();
                model.extend(pairs);
            }
            Op::Delete(keys) => {
                t.delete(&Int64Array::from(keys.clone())).unwrap();
                for k in &keys {
                    model.remove(k);
                }
            }
            Op::Flush => t.flush().unwrap(),
            Op::Checkpoint(streamed) => {
                let (kind, batch) = materialize(&mut t, next, streamed);
                let state = match kind {
                    StateKind::Full => as_map(&batch),
                    StateKind::Diff { base } => {
                        prop_assert_eq!(confirmed.last(), Some(&base), "a diff on {}", base);
                        patched(states[&base].clone(), &batch)
                    }
                };
                prop_assert_eq!(&state, &model, "checkpoint {} ({:?})", next, kind);
                states.insert(next, state);
                unconfirmed.push(next);
                next += 1;
            }
            Op::Confirm(_) if unconfirmed.is_empty() => {}
            Op::Confirm(n) => {
                let at = n % unconfirmed.len();
                let id = unconfirmed[at];
                t.checkpoint_committed(id);
                unconfirmed.drain(..=at);
                confirmed.push(id);
            }
            Op::Abort(streamed) => {
                materialize(&mut t, next, streamed);
                t.checkpoint_aborted();
                next += 1;
            }
        }
        prop_assert_eq!(t.len(), model.len());
    }
    Ok(())
}

proptest! {
    #[test]
    fn confirmed_base_checkpoints_in_memory_or_as_runs_agree_with_the_model(
        ops in prop::collection::vec(op(), 1..80),
        full_every in 1u32..6,
    ) {
        check(ops, full_every)?;
    }
}

#[test]
fn a_streamed_diff_after_flushes_is_runs_and_carries_the_unconfirmed_changes() {
    // 60k keys under a 1 MiB budget: the memtable flushes, so the captures
    // are runs; checkpoint 2 is unconfirmed, so 3's diff (on 1) holds both.
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 10 })
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap();
    t.confirm_bases();
    let all: Vec<(i64, i64)> = (0..60_000).map(|k| (k, k)).collect();
    t.upsert(&rows(&all)).unwrap();
    let first = t.checkpoint_streamed(1).unwrap();
    assert_eq!(first.kind, StateKind::Full);
    assert!(matches!(first.rows, CaptureRows::Runs { base: true, .. }));
    t.checkpoint_committed(1);
    t.upsert(&rows(&[(5, -5)])).unwrap();
    t.checkpoint_streamed(2).unwrap();
    t.upsert(&rows(&[(6, -6)])).unwrap();
    t.delete(&Int64Array::from(vec![7])).unwrap();
    let (kind, batch) = materialize(&mut t, 3, true);
    assert_eq!(kind, StateKind::Diff { base: 1 });
    let want = patched(as_map(&rows(&all)), &batch);
    let mut model = as_map(&rows(&all));
    model.insert(5, -5);
    model.insert(6, -6);
    model.remove(&7);
    assert_eq!(want, model);
    assert_eq!(batch.num_rows(), 3);
}
