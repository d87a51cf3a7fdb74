//! A spilling `StateTable` with a group column (transformWithState's list
//! and map state) against a model: random upserts, deletes, group deletes,
//! flushes, checkpoints, aborts and restores; every group read must agree
//! with a `BTreeMap` that applied the same operations, whichever of memory
//! and the runs hold a group's rows. Both group prefixes: the group column
//! itself (`encoding`) and an encoded `__group` column (`value`).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::{encode_keys, GroupPrefix, InMemoryRuns, StatePolicy, StateTable, MIN_STATE_MEMORY};
use crate::protocol::CheckpointId;
use crate::snapshot::{StateCapture, StateKind};

/// Composite key k = encode_keys([g, s]); the group column (g itself, or
/// its encoding as `__group`); g and s again, readable; value v.
fn schema(prefix: GroupPrefix) -> SchemaRef {
    let group = match prefix {
        GroupPrefix::Encoding => DataType::Int64,
        GroupPrefix::Value => DataType::Binary,
    };
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Binary, false),
        Field::new("grp", group, false),
        Field::new("g", DataType::Int64, false),
        Field::new("s", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn table(prefix: GroupPrefix, policy: StatePolicy) -> StateTable {
    StateTable::new(schema(prefix), "k", policy)
        .unwrap()
        .with_group("grp")
        .unwrap()
        .with_group_prefix(prefix)
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap()
}

fn int(values: impl IntoIterator<Item = i64>) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(values))
}

fn groups(prefix: GroupPrefix, gs: &[i64]) -> ArrayRef {
    let g = int(gs.iter().copied());
    match prefix {
        GroupPrefix::Encoding => g,
        GroupPrefix::Value => Arc::new(encode_keys(&[g]).unwrap()),
    }
}

fn keys(entries: &[(i64, i64)]) -> BinaryArray {
    encode_keys(&[
        int(entries.iter().map(|e| e.0)),
        int(entries.iter().map(|e| e.1)),
    ])
    .unwrap()
}

fn rows(prefix: GroupPrefix, entries: &[(i64, i64, i64)]) -> RecordBatch {
    let gs: Vec<i64> = entries.iter().map(|e| e.0).collect();
    let pairs: Vec<(i64, i64)> = entries.iter().map(|e| (e.0, e.1)).collect();
    RecordBatch::try_new(
        schema(prefix),
        vec![
            Arc::new(keys(&pairs)),
            groups(prefix, &gs),
            int(gs.iter().copied()),
            int(entries.iter().map(|e| e.1)),
            int(entries.iter().map(|e| e.2)),
        ],
    )
    .unwrap()
}

type Model = BTreeMap<(i64, i64), i64>;

/// (position among the asked groups, g, s, v) of every row read, sorted.
fn read(t: &StateTable, prefix: GroupPrefix, asked: &[i64]) -> Vec<(u32, i64, i64, i64)> {
    let (batch, which) = t.lookup_groups(groups(prefix, asked).as_ref()).unwrap();
    assert_eq!(batch.schema(), t.schema());
    let col = |name: &str| {
        batch
            .column_by_name(name)
            .unwrap()
            .as_primitive::<Int64Type>()
            .clone()
    };
    let (g, s, v) = (col("g"), col("s"), col("v"));
    let mut out: Vec<_> = (0..batch.num_rows())
        .map(|i| (which.value(i), g.value(i), s.value(i), v.value(i)))
        .collect();
    // Each row is its asked group's.
    for &(w, g, _, _) in &out {
        assert_eq!(asked[w as usize], g);
    }
    out.sort();
    out
}

fn model_read(model: &Model, asked: &[i64]) -> Vec<(u32, i64, i64, i64)> {
    let mut out = Vec::new();
    for (i, g) in asked.iter().enumerate() {
        out.extend(
            model
                .range((*g, i64::MIN)..=(*g, i64::MAX))
                .map(|(&(g, s), &v)| (i as u32, g, s, v)),
        );
    }
    out.sort();
    out
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(Vec<(i64, i64, i64)>),
    Delete(Vec<(i64, i64)>),
    DeleteGroups(Vec<i64>),
    Flush,
    Checkpoint,
    Abort,
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    // Negative groups too: their encodings sort below the others'.
    let entry = (-3i64..5, 0i64..5, -100i64..100);
    prop_oneof![
        4 => prop::collection::vec(entry, 0..10).prop_map(Op::Upsert),
        2 => prop::collection::vec((-3i64..5, 0i64..5), 0..5).prop_map(Op::Delete),
        2 => prop::collection::vec(-3i64..6, 0..3).prop_map(Op::DeleteGroups),
        3 => Just(Op::Flush),
        2 => Just(Op::Checkpoint),
        1 => Just(Op::Abort),
        1 => Just(Op::Restore),
    ]
}

fn check(ops: Vec<Op>, prefix: GroupPrefix) -> Result<(), TestCaseError> {
    let policy = StatePolicy { full_every: 3 };
    let mut t = table(prefix, policy);
    let mut model = Model::new();
    let mut stored: (Vec<(CheckpointId, StateCapture)>, Model) = (Vec::new(), Model::new());
    let mut next: CheckpointId = 1;
    // Groups asked in a shuffled order, one twice, one absent.
    let asked = [4, -3, 0, 2, 9, 1, -1, -2, 3, 0];
    for op in ops {
        match op {
            Op::Upsert(entries) => {
                t.upsert(&rows(prefix, &entries)).unwrap();
                for (g, s, v) in entries {
                    model.insert((g, s), v);
                }
            }
            Op::Delete(pairs) => {
                let mut expected = 0;
                let mut gone = std::collections::BTreeSet::new();
                for p in &pairs {
                    if gone.insert(*p) && model.remove(p).is_some() {
                        expected += 1;
                    }
                }
                prop_assert_eq!(t.delete(&keys(&pairs)).unwrap(), expected);
            }
            Op::DeleteGroups(gs) => {
                let before = model.len();
                model.retain(|(g, _), _| !gs.contains(g));
                let n = t.delete_groups(groups(prefix, &gs).as_ref()).unwrap();
                prop_assert_eq!(n, before - model.len());
            }
            Op::Flush => t.flush().unwrap(),
            Op::Checkpoint => {
                let capture = t.checkpoint(next).unwrap();
                if capture.kind == StateKind::Full {
                    stored.0.clear();
                }
                stored.0.push((next, capture));
                stored.1 = model.clone();
                next += 1;
            }
            Op::Abort => {
                t.checkpoint(next).unwrap();
                t.checkpoint_aborted();
                next += 1;
            }
            Op::Restore => {
                if stored.0.is_empty() {
                    continue;
                }
                // Into a fresh spilling table: its state becomes one run.
                t = table(prefix, policy);
                t.restore(&stored.0).unwrap();
                model = stored.1.clone();
            }
        }
        prop_assert_eq!(t.len(), model.len());
        prop_assert_eq!(read(&t, prefix, &asked), model_read(&model, &asked));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn spilled_groups_match_a_model_by_encoding(ops in prop::collection::vec(op(), 1..50)) {
        check(ops, GroupPrefix::Encoding)?;
    }

    #[test]
    fn spilled_groups_match_a_model_by_value(ops in prop::collection::vec(op(), 1..50)) {
        check(ops, GroupPrefix::Value)?;
    }
}

#[test]
fn a_group_reads_its_memory_rows_then_its_runs_rows() {
    let p = GroupPrefix::Encoding;
    let mut t = table(p, StatePolicy::default());
    t.upsert(&rows(p, &[(1, 3, 30), (2, 1, 21), (1, 1, 10)]))
        .unwrap();
    t.flush().unwrap();
    // Newer rows hide the run's: one changed, one deleted, one new.
    t.upsert(&rows(p, &[(1, 2, 20), (1, 3, 31)])).unwrap();
    t.delete(&keys(&[(1, 1)])).unwrap();
    let (batch, which) = t.lookup_groups(groups(p, &[1, 2]).as_ref()).unwrap();
    let s: Vec<i64> = batch
        .column(3)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    let v: Vec<i64> = batch
        .column(4)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(s, [2, 3, 1], "memory (written order), then the run's");
    assert_eq!(v, [20, 31, 21]);
    assert_eq!(which.values().to_vec(), [0, 0, 1]);
    assert_eq!(t.delete_groups(groups(p, &[1]).as_ref()).unwrap(), 2);
    assert_eq!(t.len(), 1);
    t.flush().unwrap();
    assert_eq!(
        t.lookup_groups(groups(p, &[1]).as_ref())
            .unwrap()
            .0
            .num_rows(),
        0
    );
}

#[test]
fn refuses_a_spilling_group_without_a_prefix_and_keys_outside_their_group() {
    let p = GroupPrefix::Encoding;
    let err = StateTable::new(schema(p), "k", StatePolicy::default())
        .unwrap()
        .with_group("grp")
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap_err();
    assert!(err.to_string().contains("with_group_prefix"), "{err}");
    let err = table(p, StatePolicy::default())
        .with_group("grp")
        .unwrap_err();
    assert!(
        err.to_string().contains("before its memory budget"),
        "{err}"
    );
    let err = StateTable::new(schema(p), "k", StatePolicy::default())
        .unwrap()
        .with_group_prefix(p)
        .unwrap_err();
    assert!(err.to_string().contains("no group column"), "{err}");
    // A row whose key begins with another group's encoding.
    let mut t = table(p, StatePolicy::default());
    let mut bad = rows(p, &[(1, 0, 0), (2, 0, 0)]).columns().to_vec();
    bad[1] = int([1, 1]);
    let bad = RecordBatch::try_new(schema(p), bad).unwrap();
    let err = t.upsert(&bad).unwrap_err();
    assert!(
        err.to_string().contains("row 1") && err.to_string().contains("group 1"),
        "{err}"
    );
    assert_eq!(t.len(), 0, "nothing of the refused batch was written");
}
