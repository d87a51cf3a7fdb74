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
    let schema = batch.schema();
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
    let schema = Arc::new(Schema::new_with_metadata(schema.fields().clone(), metadata));
    batch
        .clone()
        .with_schema(schema)
        .map_err(|e| Error::Snapshot(format!("state table: {e}")))
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
    if let Some(order) = key_order(column.as_ref()) {
        if order.iter().enumerate().all(|(i, j)| i as u32 == *j) {
            return Ok(batch.clone());
        }
        let indices = arrow_array::UInt32Array::from(order);
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
fn key_order(column: &dyn Array) -> Option<Vec<u32>> {
    if column.null_count() > 0 {
        return None;
    }
    KeyColumn::new(column).ok().map(|keys| keys.order().0)
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
