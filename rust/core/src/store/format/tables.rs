//! The tables a checkpoint's Arrow files hold: a task's state table as
//! stored (its key column named in the schema, sorted by key for
//! deterministic bytes) and the source offsets of `sources.arrow`.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch, StringArray, UInt64Array};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::state::runs::keys::KeyColumn;
use crate::state::{DELETED_COLUMN, KEY_METADATA};
use crate::store::manifest::TaskEntry;

/// The state table to store for `task`, checked: it names its key column
/// (schema metadata `snapcut.key`, set here), a diff has its `__deleted`
/// column.
pub fn state_batch(batch: &RecordBatch, key: &str, diff: bool) -> Result<RecordBatch> {
    let schema = state_schema(batch.schema_ref(), key, diff)?;
    batch
        .clone()
        .with_schema(schema)
        .map_err(|e| Error::Snapshot(format!("state table: {e}")))
}

/// The schema of a state file of `schema`'s columns, as [`state_batch`]
/// makes it (a batch written a chunk at a time has no batch to pass it).
pub fn state_schema(schema: &Schema, key: &str, diff: bool) -> Result<SchemaRef> {
    if schema.index_of(key).is_err() {
        return Err(Error::Snapshot(format!(
            "state table has no key column '{key}'"
        )));
    }
    if diff && schema.index_of(DELETED_COLUMN).is_err() {
        return Err(Error::Snapshot(format!(
            "a diff needs a base id and a boolean '{DELETED_COLUMN}' column"
        )));
    }
    let mut metadata = schema.metadata().clone();
    metadata.insert(KEY_METADATA.into(), key.into());
    Ok(Arc::new(Schema::new_with_metadata(
        schema.fields().clone(),
        metadata,
    )))
}

/// `batch` sorted by its `key` column, ascending, nulls last: a state file
/// written from a table's capture has deterministic bytes (a retry or a
/// duplicate task rewrites the same file).
pub fn sort_by_key(batch: &RecordBatch, key: &str) -> Result<RecordBatch> {
    let at = batch
        .schema()
        .index_of(key)
        .map_err(|_| Error::Snapshot(format!("state table has no key column '{key}'")))?;
    let column = batch.column(at);
    let err = |e: arrow_schema::ArrowError| Error::Snapshot(format!("sorting by '{key}': {e}"));
    // Every state key (a key type, no nulls) sorts without the row format.
    if let Some(keys) = key_column(column.as_ref()) {
        // A sorted capture (a spilling table's full, a merge's output) is
        // the common case: one pass in place, where the order would take
        // 20 bytes a row (a 10M-key full: 200 MB) to find it is the identity.
        if (1..keys.len()).all(|i| keys.at(i - 1) <= keys.at(i)) {
            return Ok(batch.clone());
        }
        let indices = arrow_array::UInt32Array::from(keys.order().0);
        return arrow_select::take::take_record_batch(batch, &indices).map_err(err);
    }
    let field = SortField::new_with_options(
        column.data_type().clone(),
        arrow_schema::SortOptions {
            descending: false,
            nulls_first: false,
        },
    );
    let rows = RowConverter::new(vec![field])
        .and_then(|c| c.convert_columns(std::slice::from_ref(column)))
        .map_err(err)?;
    let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
    order.sort_by(|a, b| rows.row(*a as usize).cmp(&rows.row(*b as usize)));
    if order.iter().enumerate().all(|(i, j)| i as u32 == *j) {
        return Ok(batch.clone());
    }
    let indices = arrow_array::UInt32Array::from(order);
    arrow_select::take::take_record_batch(batch, &indices).map_err(err)
}

/// The row order of a key column without nulls, ascending, ties in row
/// order: keys compared as the sorted runs compare them (`KeyColumn`), not
/// through the row format (a compaction sorts millions of rows).
fn key_column(column: &dyn Array) -> Option<KeyColumn<'_>> {
    if column.null_count() > 0 {
        return None;
    }
    KeyColumn::new(column).ok()
}

/// Schema of `sources.arrow`.
pub fn sources_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("vertex", DataType::Utf8, false),
        Field::new("subtask", DataType::UInt64, false),
        Field::new("offset", DataType::UInt64, false),
    ]))
}

/// `sources.arrow`'s rows: every task with a source offset, in `tasks` order.
pub fn sources_batch(tasks: &[TaskEntry]) -> RecordBatch {
    let sources: Vec<&TaskEntry> = tasks.iter().filter(|t| t.source_offset.is_some()).collect();
    RecordBatch::try_new(
        sources_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                sources.iter().map(|t| &t.vertex),
            )),
            Arc::new(UInt64Array::from_iter_values(
                sources.iter().map(|t| t.subtask as u64),
            )),
            Arc::new(UInt64Array::from_iter_values(
                sources.iter().map(|t| t.source_offset.unwrap_or_default()),
            )),
        ],
    )
    .expect("sources batch matches its schema")
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use proptest::prelude::*;

    use super::*;

    fn batch(keys: ArrayRef) -> RecordBatch {
        let n = keys.len() as i64;
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("k", keys.data_type().clone(), true),
                Field::new("v", DataType::Int64, false),
            ])),
            vec![keys, Arc::new(Int64Array::from_iter_values(0..n))],
        )
        .unwrap()
    }

    #[test]
    fn a_sorted_batch_comes_back_as_it_is_and_others_sorted_stably() {
        let sorted = batch(Arc::new(Int64Array::from(vec![1, 2, 2, 5])));
        let out = sort_by_key(&sorted, "k").unwrap();
        // The same buffers, no copy.
        assert_eq!(
            out.column(0).to_data().buffers()[0].as_ptr(),
            sorted.column(0).to_data().buffers()[0].as_ptr()
        );
        let words = batch(Arc::new(StringArray::from(vec!["b", "a", "b", "a"])));
        let out = sort_by_key(&words, "k").unwrap();
        assert_eq!(
            out.column(1).as_primitive::<Int64Type>().values().to_vec(),
            vec![1, 3, 0, 2],
            "ties keep their rows' order"
        );
        let nulls = batch(Arc::new(Int64Array::from(vec![Some(2), None, Some(1)])));
        let out = sort_by_key(&nulls, "k").unwrap();
        assert_eq!(
            out.column(1).as_primitive::<Int64Type>().values().to_vec(),
            vec![2, 0, 1],
            "nulls last"
        );
    }

    proptest! {
        #[test]
        fn sorting_orders_by_key_then_row(keys in proptest::collection::vec(-5i64..5, 0..60)) {
            let out = sort_by_key(&batch(Arc::new(Int64Array::from(keys.clone()))), "k").unwrap();
            let mut want: Vec<(i64, i64)> =
                keys.iter().copied().zip(0..).collect();
            want.sort();
            let got: Vec<(i64, i64)> = out
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .copied()
                .zip(out.column(1).as_primitive::<Int64Type>().values().iter().copied())
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
