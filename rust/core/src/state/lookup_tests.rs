//! `StateTable::lookup`: one row per asked key, in order, nulls for absent keys.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::{StatePolicy, StateTable};

fn schema(key: DataType) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", key, false),
        Field::new("n", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]))
}

fn int_table() -> StateTable {
    let mut t = StateTable::new(schema(DataType::Int64), "k", StatePolicy::default()).unwrap();
    let batch = RecordBatch::try_new(
        schema(DataType::Int64),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(Int64Array::from(vec![10, 20, 30])),
            Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
        ],
    )
    .unwrap();
    t.upsert(&batch).unwrap();
    t
}

fn ints(a: &dyn Array) -> Vec<Option<i64>> {
    a.as_primitive::<Int64Type>().iter().collect()
}

fn strs(a: &dyn Array) -> Vec<Option<String>> {
    a.as_string::<i32>()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect()
}

#[test]
fn lookup_keeps_order_duplicates_and_absent_keys() {
    let t = int_table();
    let (rows, present) = t.lookup(&Int64Array::from(vec![3, 9, 1, 3, 2])).unwrap();
    assert_eq!(rows.schema(), t.lookup_schema());
    assert_eq!(ints(rows.column(0)), [3, 9, 1, 3, 2].map(Some));
    assert_eq!(
        ints(rows.column(1)),
        vec![Some(30), None, Some(10), Some(30), Some(20)]
    );
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        strs(rows.column(2)),
        vec![s("c"), None, s("a"), s("c"), None]
    );
    let mask: Vec<bool> = present.iter().map(Option::unwrap).collect();
    assert_eq!(mask, vec![true, false, true, true, true]);
    // Lookup is a read: nothing changes.
    assert_eq!(t.len(), 3);
}

#[test]
fn lookup_schema_makes_values_nullable_and_keeps_the_key_not_null() {
    let t = int_table();
    let schema = t.lookup_schema();
    assert!(!schema.field(0).is_nullable());
    assert!(
        schema.field(1).is_nullable(),
        "absent keys have null values"
    );
    assert!(!t.schema().field(1).is_nullable());
    assert_eq!(schema.metadata(), t.schema().metadata());
}

#[test]
fn lookup_all_present_all_absent_empty_and_empty_table() {
    let t = int_table();
    let (rows, present) = t.lookup(&Int64Array::from(vec![2, 1])).unwrap();
    assert_eq!(ints(rows.column(1)), vec![Some(20), Some(10)]);
    assert_eq!(present.true_count(), 2);
    let (rows, present) = t.lookup(&Int64Array::from(vec![7, 8])).unwrap();
    assert_eq!(rows.num_rows(), 2);
    assert_eq!(rows.column(1).null_count(), 2);
    assert_eq!(present.true_count(), 0);
    let (rows, present) = t.lookup(&Int64Array::from(Vec::<i64>::new())).unwrap();
    assert_eq!((rows.num_rows(), present.len()), (0, 0));
    let empty = StateTable::new(schema(DataType::Int64), "k", StatePolicy::default()).unwrap();
    let (rows, _) = empty.lookup(&Int64Array::from(vec![1, 1])).unwrap();
    assert_eq!(ints(rows.column(0)), vec![Some(1), Some(1)]);
    assert_eq!(rows.column(2).null_count(), 2);
}

#[test]
fn lookup_by_string_and_int32_keys() {
    let mut t = StateTable::new(schema(DataType::Utf8), "k", StatePolicy::default()).unwrap();
    t.upsert(
        &RecordBatch::try_new(
            schema(DataType::Utf8),
            vec![
                Arc::new(StringArray::from(vec!["x", "y"])),
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("sx"), Some("sy")])),
            ],
        )
        .unwrap(),
    )
    .unwrap();
    // A sliced key array: only its own rows are looked up.
    let keys = StringArray::from(vec!["zz", "y", "q", "x"]).slice(1, 3);
    let (rows, present) = t.lookup(&keys).unwrap();
    assert_eq!(
        strs(rows.column(0)),
        vec![Some("y".into()), Some("q".into()), Some("x".into())]
    );
    assert_eq!(ints(rows.column(1)), vec![Some(2), None, Some(1)]);
    assert_eq!(present.true_count(), 2);

    let mut t = StateTable::new(schema(DataType::Int32), "k", StatePolicy::default()).unwrap();
    t.upsert(
        &RecordBatch::try_new(
            schema(DataType::Int32),
            vec![
                Arc::new(Int32Array::from(vec![5])),
                Arc::new(Int64Array::from(vec![50])),
                Arc::new(StringArray::from(vec![None::<&str>])),
            ],
        )
        .unwrap(),
    )
    .unwrap();
    let (rows, _) = t.lookup(&Int32Array::from(vec![4, 5])).unwrap();
    assert_eq!(ints(rows.column(1)), vec![None, Some(50)]);
}

#[test]
fn lookup_rejects_wrong_key_type_and_null_keys() {
    let t = int_table();
    let err = t.lookup(&StringArray::from(vec!["1"])).unwrap_err();
    assert!(err.to_string().contains("key type is Int64"), "{err}");
    let err = t
        .lookup(&Int64Array::from(vec![Some(1), None]))
        .unwrap_err();
    assert!(err.to_string().contains("null"), "{err}");
}
