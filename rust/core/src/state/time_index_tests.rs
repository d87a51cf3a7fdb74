//! `StateTable::with_time_index`: `due` follows upserts, deletes, group
//! deletes and diffs, skips null times, is rebuilt on restore and on an
//! index added to a full table; bad time columns are refused.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::{StatePolicy, StateTable, DELETED_COLUMN};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("g", DataType::Utf8, false),
        Field::new("at", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
    ]))
}

fn rows(r: &[(&str, &str, Option<i64>)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.0))),
            Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.1))),
            Arc::new(Int64Array::from_iter(r.iter().map(|x| x.2))),
            Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.0))),
        ],
    )
    .unwrap()
}

fn table() -> StateTable {
    StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_group("g")
        .unwrap()
        .with_time_index("at")
        .unwrap()
}

fn due(t: &StateTable, threshold: i64) -> Vec<String> {
    let keys = t.due(threshold).unwrap();
    keys.as_string::<i32>()
        .iter()
        .map(|k| k.unwrap().to_string())
        .collect()
}

#[test]
fn due_keys_follow_writes_deletes_and_null_times() {
    let mut t = table();
    assert_eq!(t.time_column(), Some("at"));
    t.upsert(&rows(&[
        ("a", "x", Some(30)),
        ("b", "x", Some(10)),
        ("c", "y", None),
        ("d", "y", Some(10)),
        ("b", "x", Some(20)), // the later row of a key wins
    ]))
    .unwrap();
    assert_eq!(due(&t, 9), Vec::<String>::new());
    assert_eq!(due(&t, 20), ["d", "b"]);
    assert_eq!(t.earliest_time(), Some(10));
    t.upsert(&rows(&[("d", "y", None), ("c", "y", Some(5))]))
        .unwrap();
    assert_eq!(due(&t, 25), ["c", "b"]);
    t.delete(&StringArray::from(vec!["c", "zz"])).unwrap();
    t.delete_groups(&StringArray::from(vec!["x"])).unwrap();
    assert_eq!(due(&t, i64::MAX), Vec::<String>::new());
    assert_eq!(t.earliest_time(), None);
}

#[test]
fn restore_and_diffs_rebuild_the_index() {
    let mut t = table();
    t.upsert(&rows(&[("a", "x", Some(1)), ("b", "x", Some(2))]))
        .unwrap();
    let full = t.checkpoint(1).unwrap();
    t.upsert(&rows(&[("c", "y", Some(3))])).unwrap();
    t.delete(&StringArray::from(vec!["a"])).unwrap();
    let diff = t.checkpoint(2).unwrap();
    let mut back = table();
    back.restore(&[(1, full), (2, diff)]).unwrap();
    assert_eq!(due(&back, 10), ["b", "c"]);
    // A diff applied by hand: its tombstones leave the index too.
    let mut tomb = rows(&[("b", "x", None)]).columns().to_vec();
    tomb.push(Arc::new(BooleanArray::from(vec![true])));
    let mut fields: Vec<Field> = schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
    let tomb = RecordBatch::try_new(Arc::new(Schema::new(fields)), tomb).unwrap();
    back.apply(&tomb, true).unwrap();
    assert_eq!(due(&back, 10), ["c"]);
}

#[test]
fn an_index_added_to_a_full_table_indexes_its_rows() {
    let mut t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    t.upsert(&rows(&[("a", "x", Some(7)), ("b", "x", None)]))
        .unwrap();
    let t = t.with_time_index("at").unwrap();
    assert_eq!(due(&t, 7), ["a"]);
}

#[test]
fn bad_time_columns_are_refused_naming_the_fix() {
    let new = || StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    let err = |c: &str| new().with_time_index(c).unwrap_err().to_string();
    assert!(err("when").contains("time column 'when' is not in the state schema"));
    assert!(err("name").contains("must be an Int64 value column"));
    assert!(err("k").contains("not the key"));
    let plain = new();
    assert!(plain
        .due(0)
        .unwrap_err()
        .to_string()
        .contains("no time index"));
}
