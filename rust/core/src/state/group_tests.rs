//! `StateTable::with_group`: rows read and deleted per group column value,
//! checked against a model over random upserts, deletes, checkpoints and
//! restores.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;

use super::{StatePolicy, StateTable};

/// Composite key "g/s" (Utf8), group g (Int64), value v.
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("g", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn table() -> StateTable {
    StateTable::new(schema(), "k", StatePolicy { full_every: 3 })
        .unwrap()
        .with_group("g")
        .unwrap()
}

fn rows(entries: &[(i64, i64, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                entries.iter().map(|(g, s, _)| format!("{g}/{s}")),
            )),
            Arc::new(Int64Array::from_iter_values(entries.iter().map(|e| e.0))),
            Arc::new(Int64Array::from_iter_values(entries.iter().map(|e| e.2))),
        ],
    )
    .unwrap()
}

/// (group position, key, value) of every row of `groups`, sorted.
fn read(t: &StateTable, groups: &[i64]) -> Vec<(u32, String, i64)> {
    let (batch, which) = t.lookup_groups(&Int64Array::from(groups.to_vec())).unwrap();
    let keys = batch.column(0).as_string::<i32>();
    let vals = batch.column(2).as_primitive::<Int64Type>();
    let mut out: Vec<_> = (0..batch.num_rows())
        .map(|i| (which.value(i), keys.value(i).to_string(), vals.value(i)))
        .collect();
    out.sort();
    out
}

fn model_read(model: &BTreeMap<(i64, i64), i64>, groups: &[i64]) -> Vec<(u32, String, i64)> {
    let mut out = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        for ((mg, s), v) in model {
            if mg == g {
                out.push((i as u32, format!("{g}/{s}"), *v));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn groups_come_back_in_asked_order_with_their_rows() {
    let mut t = table();
    t.upsert(&rows(&[(1, 1, 10), (2, 1, 20), (1, 2, 11), (3, 9, 30)]))
        .unwrap();
    assert_eq!(
        read(&t, &[3, 1, 7]),
        vec![
            (0, "3/9".into(), 30),
            (1, "1/1".into(), 10),
            (1, "1/2".into(), 11)
        ]
    );
    assert_eq!(t.group_count(), 3);
    assert_eq!(t.delete_groups(&Int64Array::from(vec![1])).unwrap(), 2);
    assert_eq!(read(&t, &[1, 2]), vec![(1, "2/1".into(), 20)]);
    assert_eq!(t.len(), 2);
    assert_eq!(t.group_count(), 2);
}

#[test]
fn a_group_keeps_its_rows_in_written_order() {
    let mut t = table();
    t.upsert(&rows(&[(5, 3, 0), (5, 1, 0), (5, 2, 0)])).unwrap();
    t.delete(&StringArray::from(vec!["5/1"])).unwrap();
    t.upsert(&rows(&[(5, 4, 0), (5, 3, 1)])).unwrap();
    let (batch, _) = t.lookup_groups(&Int64Array::from(vec![5])).unwrap();
    let keys: Vec<&str> = batch
        .column(0)
        .as_string::<i32>()
        .iter()
        .flatten()
        .collect();
    assert_eq!(keys, vec!["5/3", "5/2", "5/4"]);
}

#[test]
fn group_reads_need_a_group_column_and_the_right_type() {
    let t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    let err = t.lookup_groups(&Int64Array::from(vec![1])).unwrap_err();
    assert!(err.to_string().contains("no group column"), "{err}");
    let err = StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_group("v")
        .unwrap_err();
    assert!(err.to_string().contains("non-nullable"), "{err}");
    let err = StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_group("nope")
        .unwrap_err();
    assert!(err.to_string().contains("not in the state schema"), "{err}");
    let t = table();
    let err = t.lookup_groups(&StringArray::from(vec!["1"])).unwrap_err();
    assert!(err.to_string().contains("type"), "{err}");
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(Vec<(i64, i64, i64)>),
    Delete(Vec<(i64, i64)>),
    DeleteGroups(Vec<i64>),
    /// Checkpoint, then rebuild a fresh table from the chain so far.
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    let entry = (0i64..5, 0i64..4, any::<i64>());
    prop_oneof![
        prop::collection::vec(entry, 0..8).prop_map(Op::Upsert),
        prop::collection::vec((0i64..5, 0i64..4), 0..4).prop_map(Op::Delete),
        prop::collection::vec(0i64..6, 0..3).prop_map(Op::DeleteGroups),
        Just(Op::Restore),
    ]
}

proptest! {
    #[test]
    fn group_reads_match_a_model(ops in prop::collection::vec(op(), 1..40)) {
        let mut t = table();
        let mut model: BTreeMap<(i64, i64), i64> = BTreeMap::new();
        let mut chain = Vec::new();
        let mut next_id = 1;
        for op in ops {
            match op {
                Op::Upsert(entries) => {
                    t.upsert(&rows(&entries)).unwrap();
                    for (g, s, v) in entries {
                        model.insert((g, s), v);
                    }
                }
                Op::Delete(keys) => {
                    let names: Vec<String> = keys.iter().map(|(g, s)| format!("{g}/{s}")).collect();
                    t.delete(&StringArray::from(names)).unwrap();
                    for k in keys {
                        model.remove(&k);
                    }
                }
                Op::DeleteGroups(groups) => {
                    let before = model.len();
                    model.retain(|(g, _), _| !groups.contains(g));
                    let n = t.delete_groups(&Int64Array::from(groups)).unwrap();
                    prop_assert_eq!(n, before - model.len());
                }
                Op::Restore => {
                    let capture = t.checkpoint(next_id).unwrap();
                    if capture.kind == crate::snapshot::StateKind::Full {
                        chain.clear();
                    }
                    chain.push((next_id, capture));
                    next_id += 1;
                    let mut fresh = table();
                    fresh.restore(&chain).unwrap();
                    t = fresh;
                }
            }
            let all: Vec<i64> = (0..6).collect();
            prop_assert_eq!(read(&t, &all), model_read(&model, &all));
            let groups: std::collections::BTreeSet<i64> = model.keys().map(|k| k.0).collect();
            prop_assert_eq!(t.group_count(), groups.len());
        }
    }
}
