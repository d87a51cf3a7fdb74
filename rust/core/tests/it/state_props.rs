//! StateTable vs a BTreeMap model: random upserts, deletes and checkpoints;
//! restoring any checkpoint's chain yields exactly the model at that point.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;
use snapcut_core::snapshot::{StateCapture, StateKind};
use snapcut_core::state::{StatePolicy, StateTable, DELETED_COLUMN};

type Model = BTreeMap<i64, (Option<i64>, Option<String>)>;

#[derive(Clone, Debug)]
enum Op {
    Upsert(Vec<(i64, Option<i64>, Option<String>)>),
    Delete(Vec<i64>),
    Checkpoint,
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("n", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

fn batch(rows: &[(i64, Option<i64>, Option<String>)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2.clone()))),
        ],
    )
    .unwrap()
}

fn contents(t: &StateTable) -> Model {
    let b = t.to_batch();
    let k = b.column(0).as_primitive::<Int64Type>();
    let n = b.column(1).as_primitive::<Int64Type>();
    let s = b.column(2).as_string::<i32>();
    (0..b.num_rows())
        .map(|i| {
            let nv = n.is_valid(i).then(|| n.value(i));
            let sv = s.is_valid(i).then(|| s.value(i).to_string());
            (k.value(i), (nv, sv))
        })
        .collect()
}

fn op() -> impl Strategy<Value = Op> {
    let row = (
        0i64..40,
        proptest::option::of(any::<i64>()),
        proptest::option::of("[a-z]{0,4}"),
    );
    prop_oneof![
        4 => proptest::collection::vec(row, 0..8).prop_map(Op::Upsert),
        2 => proptest::collection::vec(0i64..40, 0..6).prop_map(Op::Delete),
        1 => Just(Op::Checkpoint),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn restore_any_checkpoint_equals_model(ops in proptest::collection::vec(op(), 1..60), k in 1u32..5) {
        let mut table = StateTable::new(schema(), "k", StatePolicy { full_every: k }).unwrap();
        let mut model = Model::new();
        let mut taken: Vec<(u64, StateCapture, Model)> = Vec::new();
        let mut next_id = 1u64;
        for op in ops {
            match op {
                Op::Upsert(rows) => {
                    table.upsert(&batch(&rows)).unwrap();
                    for (key, n, s) in rows { model.insert(key, (n, s)); }
                }
                Op::Delete(keys) => {
                    let present = keys.iter().collect::<std::collections::BTreeSet<_>>()
                        .into_iter().filter(|key| model.contains_key(key)).count();
                    let removed = table.delete(&Int64Array::from(keys.clone())).unwrap();
                    prop_assert_eq!(removed, present);
                    for key in keys { model.remove(&key); }
                }
                Op::Checkpoint => {
                    let cap = table.checkpoint(next_id).unwrap();
                    if let StateKind::Diff { .. } = cap.kind {
                        prop_assert!(cap.batch.column_by_name(DELETED_COLUMN).is_some());
                    }
                    taken.push((next_id, cap, model.clone()));
                    next_id += 1;
                    prop_assert_eq!(table.changed_len(), 0);
                }
            }
            prop_assert_eq!(table.len(), model.len());
            prop_assert_eq!(&contents(&table), &model);
        }
        for i in 0..taken.len() {
            let start = (0..=i).rev().find(|&j| taken[j].1.kind == StateKind::Full).unwrap();
            prop_assert!(i - start < k as usize, "chain longer than full_every");
            let chain: Vec<(u64, StateCapture)> =
                taken[start..=i].iter().map(|(id, c, _)| (*id, c.clone())).collect();
            let mut restored = StateTable::new(schema(), "k", StatePolicy { full_every: k }).unwrap();
            restored.restore(&chain).unwrap();
            prop_assert_eq!(&contents(&restored), &taken[i].2);
        }
    }
}

#[test]
fn diff_holds_only_changed_keys_and_tombstones() {
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    let rows: Vec<_> = (0..1000).map(|i| (i, Some(i), None)).collect();
    t.upsert(&batch(&rows)).unwrap();
    assert_eq!(t.checkpoint(1).unwrap().kind, StateKind::Full);
    t.upsert(&batch(&[
        (5, Some(50), Some("x".into())),
        (2000, None, None),
    ]))
    .unwrap();
    t.delete(&Int64Array::from(vec![7, 99999])).unwrap();
    let cap = t.checkpoint(2).unwrap();
    assert_eq!(cap.kind, StateKind::Diff { base: 1 });
    assert_eq!(cap.batch.num_rows(), 3);
    let deleted = cap
        .batch
        .column_by_name(DELETED_COLUMN)
        .unwrap()
        .as_boolean();
    let keys = cap.batch.column(0).as_primitive::<Int64Type>();
    let mut tomb: Vec<i64> = (0..3)
        .filter(|&i| deleted.value(i))
        .map(|i| keys.value(i))
        .collect();
    let mut up: Vec<i64> = (0..3)
        .filter(|&i| !deleted.value(i))
        .map(|i| keys.value(i))
        .collect();
    tomb.sort();
    up.sort();
    assert_eq!(tomb, vec![7]);
    assert_eq!(up, vec![5, 2000]);
}

#[test]
fn upsert_after_delete_is_not_a_tombstone() {
    let mut t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    t.upsert(&batch(&[(1, Some(1), None), (2, Some(2), None)]))
        .unwrap();
    t.checkpoint(1).unwrap();
    t.delete(&Int64Array::from(vec![1])).unwrap();
    t.upsert(&batch(&[(1, Some(2), None)])).unwrap();
    let cap = t.checkpoint(2).unwrap();
    assert_eq!(cap.batch.num_rows(), 1);
    assert!(!cap
        .batch
        .column_by_name(DELETED_COLUMN)
        .unwrap()
        .as_boolean()
        .value(0));
}

#[test]
fn a_diff_covering_every_key_is_taken_as_full() {
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    t.upsert(&batch(&[
        (1, Some(1), None),
        (2, Some(2), None),
        (3, Some(3), None),
    ]))
    .unwrap();
    assert_eq!(t.checkpoint(1).unwrap().kind, StateKind::Full);
    // Every key but one rewritten: a diff.
    t.upsert(&batch(&[(1, Some(10), None), (2, Some(20), None)]))
        .unwrap();
    assert_eq!(t.checkpoint(2).unwrap().kind, StateKind::Diff { base: 1 });
    // Every live key rewritten, one deleted: the whole table, without tombstones.
    t.delete(&Int64Array::from(vec![3])).unwrap();
    t.upsert(&batch(&[
        (2, Some(200), None),
        (1, Some(100), Some("a".into())),
    ]))
    .unwrap();
    let cap = t.checkpoint(3).unwrap();
    assert_eq!(cap.kind, StateKind::Full);
    assert!(cap.batch.column_by_name(DELETED_COLUMN).is_none());
    let mut restored = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    restored.restore(&[(3, cap)]).unwrap();
    assert_eq!(contents(&restored), contents(&t));
    assert_eq!(contents(&t).len(), 2);
    // The chain starts again: the next partial change is a diff on 3.
    t.upsert(&batch(&[(1, Some(1000), None)])).unwrap();
    assert_eq!(t.checkpoint(4).unwrap().kind, StateKind::Diff { base: 3 });
}

#[test]
fn aborted_checkpoint_forces_full_next() {
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 10 }).unwrap();
    t.upsert(&batch(&[(1, Some(1), None)])).unwrap();
    t.checkpoint(1).unwrap();
    t.upsert(&batch(&[(2, Some(2), None)])).unwrap();
    assert_eq!(t.checkpoint(2).unwrap().kind, StateKind::Diff { base: 1 });
    t.checkpoint_aborted();
    let cap = t.checkpoint(3).unwrap();
    assert_eq!(cap.kind, StateKind::Full);
    assert_eq!(cap.batch.num_rows(), 2);
}

#[test]
fn string_keys_round_trip() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("user", DataType::Utf8, false),
        Field::new("count", DataType::UInt64, false),
        Field::new("flag", DataType::Boolean, true),
        Field::new("avg", DataType::Float64, true),
        Field::new("blob", DataType::Binary, true),
    ]));
    let mk = |users: Vec<&str>, c: Vec<u64>| {
        let n = users.len();
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(users)),
                Arc::new(arrow_array::UInt64Array::from(c)),
                Arc::new(arrow_array::BooleanArray::from(vec![Some(true); n])),
                Arc::new(arrow_array::Float64Array::from(vec![Some(1.5); n])),
                Arc::new(arrow_array::BinaryArray::from(vec![
                    Some(&b"\x00\x01"[..]);
                    n
                ])),
            ],
        )
        .unwrap()
    };
    let mut t = StateTable::new(schema.clone(), "user", StatePolicy { full_every: 3 }).unwrap();
    t.upsert(&mk(vec!["ann", "bob", "dan"], vec![1, 2, 3]))
        .unwrap();
    let c1 = t.checkpoint(10).unwrap();
    t.upsert(&mk(vec!["bob", "cy"], vec![5, 6])).unwrap();
    t.delete(&StringArray::from(vec!["ann"])).unwrap();
    let c2 = t.checkpoint(11).unwrap();
    let got = t
        .get(&StringArray::from(vec!["cy", "nobody", "bob"]))
        .unwrap();
    assert_eq!(got.num_rows(), 2);
    assert_eq!(got.column(0).as_string::<i32>().value(0), "cy");
    let mut r = StateTable::new(schema, "user", StatePolicy { full_every: 3 }).unwrap();
    assert_eq!(c2.kind, StateKind::Diff { base: 10 });
    r.restore(&[(10, c1), (11, c2)]).unwrap();
    assert_eq!(r.len(), 3);
    let bob = r.get(&StringArray::from(vec!["bob"])).unwrap();
    assert_eq!(
        bob.column(1)
            .as_primitive::<arrow_array::types::UInt64Type>()
            .value(0),
        5
    );
    assert_eq!(r.to_batch().schema().metadata()["snapcut.key"], "user");
}

#[test]
fn bad_input_errors_name_the_problem() {
    let err = StateTable::new(schema(), "nope", StatePolicy::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("key column 'nope' is not in the state schema"),
        "{err}"
    );
    let float_key = Arc::new(Schema::new(vec![Field::new("f", DataType::Float64, false)]));
    let err = StateTable::new(float_key, "f", StatePolicy::default()).unwrap_err();
    assert!(err.to_string().contains("a state key must be"), "{err}");
    let err = StateTable::new(schema(), "k", StatePolicy { full_every: 0 }).unwrap_err();
    assert!(err.to_string().contains("full_every"), "{err}");

    let mut t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    let missing = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![1]))],
    )
    .unwrap();
    let err = t.upsert(&missing).unwrap_err();
    assert!(err.to_string().contains("batch has no column 'n'"), "{err}");
    let wrong = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("n", DataType::Utf8, true),
            Field::new("s", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1])),
            Arc::new(StringArray::from(vec!["x"])),
            Arc::new(StringArray::from(vec!["x"])),
        ],
    )
    .unwrap();
    let err = t.upsert(&wrong).unwrap_err();
    assert!(
        err.to_string().contains("column 'n' has type Utf8"),
        "{err}"
    );
    let err = t.delete(&StringArray::from(vec!["x"])).unwrap_err();
    assert!(err.to_string().contains("key type is Int64"), "{err}");
    let err = t
        .delete(&Int64Array::from(vec![None, Some(1)]))
        .unwrap_err();
    assert!(err.to_string().contains("non-null"), "{err}");
    t.checkpoint(5).unwrap();
    let err = t.checkpoint(5).unwrap_err();
    assert!(err.to_string().contains("must increase"), "{err}");
    let cap = t.checkpoint(6).unwrap();
    let err = t.restore(&[(6, cap)]).unwrap_err();
    assert!(
        err.to_string().contains("must start with a full capture"),
        "{err}"
    );
}

#[test]
fn a_key_rewritten_many_times_is_one_diff_row() {
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    // Before the first checkpoint the diff is simply every row.
    t.upsert(&batch(&[(1, Some(1), None), (2, Some(2), None)]))
        .unwrap();
    assert_eq!(t.changes().num_rows(), 2);
    t.checkpoint(1).unwrap();
    for v in 0..5 {
        t.upsert(&batch(&[(1, Some(v), None), (3, Some(v), None)]))
            .unwrap();
    }
    t.delete(&Int64Array::from(vec![3])).unwrap();
    let diff = t.checkpoint(2).unwrap().batch;
    assert_eq!(diff.num_rows(), 2);
    let keys = diff.column(0).as_primitive::<Int64Type>();
    let vals = diff.column(1).as_primitive::<Int64Type>();
    let deleted = diff.column_by_name(DELETED_COLUMN).unwrap().as_boolean();
    assert_eq!(
        (keys.value(0), vals.value(0), deleted.value(0)),
        (1, 4, false)
    );
    assert_eq!((keys.value(1), deleted.value(1)), (3, true));
}

fn numbered(keys: std::ops::Range<i64>, n: i64) -> RecordBatch {
    let rows: Vec<_> = keys.map(|k| (k, Some(n), None)).collect();
    batch(&rows)
}

#[test]
fn a_diff_of_half_the_keys_or_more_is_taken_as_full() {
    use snapcut_core::snapshot::FULL_BEATS_DIFF_MIN_KEYS;
    let keys = 2 * FULL_BEATS_DIFF_MIN_KEYS as i64;
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    t.upsert(&numbered(0..keys, 0)).unwrap();
    assert_eq!(t.checkpoint(1).unwrap().kind, StateKind::Full);
    // One key short of half: a diff of exactly those keys.
    t.upsert(&numbered(0..keys / 2 - 1, 1)).unwrap();
    let diff = t.checkpoint(2).unwrap();
    assert_eq!(diff.kind, StateKind::Diff { base: 1 });
    assert_eq!(diff.batch.num_rows() as i64, keys / 2 - 1);
    // Half of them (a delete counts): the whole table, ending the chain.
    t.upsert(&numbered(10..keys / 2 + 9, 2)).unwrap();
    t.delete(&Int64Array::from(vec![0])).unwrap();
    let full = t.checkpoint(3).unwrap();
    assert_eq!(full.kind, StateKind::Full);
    assert!(full.batch.column_by_name(DELETED_COLUMN).is_none());
    let mut back = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    back.restore(&[(3, full)]).unwrap();
    assert_eq!(contents(&back), contents(&t));
    assert_eq!(contents(&t).len() as i64, keys - 1);
    t.upsert(&numbered(5..6, 3)).unwrap();
    assert_eq!(t.checkpoint(4).unwrap().kind, StateKind::Diff { base: 3 });
    // A small table keeps its diffs whatever share changed.
    let mut small = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    small.upsert(&numbered(0..10, 0)).unwrap();
    small.checkpoint(1).unwrap();
    small.upsert(&numbered(0..9, 1)).unwrap();
    assert_eq!(
        small.checkpoint(2).unwrap().kind,
        StateKind::Diff { base: 1 }
    );
}

#[test]
fn confirmed_bases_count_every_unconfirmed_change_toward_a_full() {
    use snapcut_core::snapshot::FULL_BEATS_DIFF_MIN_KEYS;
    let keys = 2 * FULL_BEATS_DIFF_MIN_KEYS as i64;
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    t.confirm_bases();
    t.upsert(&numbered(0..keys, 0)).unwrap();
    t.checkpoint(1).unwrap();
    t.checkpoint_committed(1);
    // Two intervals of a third each, the first not confirmed: the second
    // diff would carry two thirds of the keys.
    t.upsert(&numbered(0..keys / 3, 1)).unwrap();
    assert_eq!(t.checkpoint(2).unwrap().kind, StateKind::Diff { base: 1 });
    t.upsert(&numbered(keys / 3..2 * keys / 3, 2)).unwrap();
    let full = t.checkpoint(3).unwrap();
    assert_eq!(full.kind, StateKind::Full);
    assert_eq!(full.batch.num_rows() as i64, keys);
    t.checkpoint_committed(3);
    t.upsert(&numbered(0..1, 3)).unwrap();
    assert_eq!(t.checkpoint(4).unwrap().kind, StateKind::Diff { base: 3 });
    // 4 not confirmed; this interval alone changes half the keys: full,
    // with 4's change in it.
    t.upsert(&numbered(keys / 2..keys, 4)).unwrap();
    let full = t.checkpoint(5).unwrap();
    assert_eq!(full.kind, StateKind::Full);
    let mut back = StateTable::new(schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    back.restore(&[(5, full)]).unwrap();
    assert_eq!(contents(&back), contents(&t));
    assert_eq!(contents(&back)[&0], (Some(3), None));
}
