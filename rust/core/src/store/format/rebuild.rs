//! Rebuilding a task's state from its chain: a full, then diffs whose rows
//! replace or delete the rows of their keys. Works on any column type: keys
//! are compared in Arrow's row format.

use std::collections::HashSet;

use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::Schema;

use super::chain::kind_name;
use crate::error::{Error, Result};
use crate::state::{DELETED_COLUMN, KEY_METADATA};
use crate::store::manifest::FileKind;

/// Full state from a chain of `(kind, batch)`: one full, then diffs. A diff's
/// rows replace the rows of their keys (the key column is named by the full
/// file's `snapcut.key` metadata); rows with `__deleted` true remove them.
/// A lone full is the state itself, whatever its layout. Any column type.
pub fn rebuild_state(chain: &[(FileKind, RecordBatch)]) -> Result<RecordBatch> {
    let Some(((first_kind, full), diffs)) = chain.split_first() else {
        return Err(Error::Snapshot(
            "a state chain must start with a full state file".into(),
        ));
    };
    if *first_kind != FileKind::Full {
        return Err(Error::Snapshot(
            "a state chain must start with a full state file".into(),
        ));
    }
    if diffs.is_empty() {
        return Ok(full.clone());
    }
    let schema = full.schema();
    let key = schema
        .metadata()
        .get(KEY_METADATA)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            Error::Snapshot(format!(
                "state file has no '{KEY_METADATA}' metadata naming its key"
            ))
        })?
        .clone();
    let key_at = |s: &Schema| {
        s.index_of(&key)
            .map_err(|_| Error::Snapshot(format!("state file has no key column '{key}'")))
    };
    let converter = RowConverter::new(vec![SortField::new(
        schema.field(key_at(&schema)?).data_type().clone(),
    )])
    .map_err(|e| Error::Snapshot(format!("state key '{key}': {e}")))?;
    let mut state = full.clone();
    for (kind, diff) in diffs {
        if *kind != FileKind::Diff {
            return Err(Error::Snapshot(format!(
                "state chain continues with a '{}' file, expected a diff",
                kind_name(*kind)
            )));
        }
        let rows = |b: &RecordBatch| -> Result<arrow_row::Rows> {
            converter
                .convert_columns(&[b.column(key_at(&b.schema())?).clone()])
                .map_err(|e| Error::Snapshot(format!("state key '{key}': {e}")))
        };
        let diff_keys = rows(diff)?;
        let changed: HashSet<&[u8]> = diff_keys.iter().map(|r| r.data()).collect();
        let state_keys = rows(&state)?;
        let keep: BooleanArray = state_keys
            .iter()
            .map(|r| Some(!changed.contains(r.data())))
            .collect();
        let kept = arrow_select::filter::filter_record_batch(&state, &keep)
            .map_err(|e| Error::Snapshot(format!("rebuilding state: {e}")))?;
        let deleted_at = diff.schema().index_of(DELETED_COLUMN).map_err(|_| {
            Error::Snapshot(format!("a state diff has no '{DELETED_COLUMN}' column"))
        })?;
        let deleted = diff
            .column(deleted_at)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| Error::Snapshot(format!("'{DELETED_COLUMN}' is not boolean")))?;
        let upsert: BooleanArray = (0..deleted.len())
            .map(|i| Some(!(deleted.is_valid(i) && deleted.value(i))))
            .collect();
        let mut upserts = arrow_select::filter::filter_record_batch(diff, &upsert)
            .map_err(|e| Error::Snapshot(format!("rebuilding state: {e}")))?;
        upserts.remove_column(deleted_at);
        let upserts = RecordBatch::try_new(schema.clone(), upserts.columns().to_vec())
            .map_err(|e| Error::Snapshot(format!("a state diff does not match its full: {e}")))?;
        state = arrow_select::concat::concat_batches(&schema, [&kept, &upserts])
            .map_err(|e| Error::Snapshot(format!("rebuilding state: {e}")))?;
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field};

    use super::*;

    #[test]
    fn rebuild_replaces_and_deletes_by_key_for_any_type() {
        use arrow_array::types::Int64Type;
        use arrow_array::{Int64Array, ListArray};
        let list =
            |v: Vec<Option<Vec<Option<i64>>>>| ListArray::from_iter_primitive::<Int64Type, _, _>(v);
        let schema = Arc::new(Schema::new_with_metadata(
            vec![
                Field::new("k", DataType::Int64, false),
                Field::new_list("l", Field::new_list_field(DataType::Int64, true), true),
            ],
            [(KEY_METADATA.to_string(), "k".to_string())].into(),
        ));
        let full = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(list(vec![Some(vec![Some(1)]), None, Some(vec![])])),
            ],
        )
        .unwrap();
        let diff_schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new_list("l", Field::new_list_field(DataType::Int64, true), true),
            Field::new(DELETED_COLUMN, DataType::Boolean, true),
        ]));
        let diff = RecordBatch::try_new(
            diff_schema,
            vec![
                Arc::new(Int64Array::from(vec![2, 3, 4])),
                Arc::new(list(vec![Some(vec![Some(7)]), None, Some(vec![Some(8)])])),
                Arc::new(BooleanArray::from(vec![Some(false), Some(true), None])),
            ],
        )
        .unwrap();
        let out = rebuild_state(&[(FileKind::Full, full), (FileKind::Diff, diff)]).unwrap();
        let keys = out.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(keys.values().to_vec(), vec![1, 2, 4]);
        assert_eq!(out.schema(), schema);
        assert!(rebuild_state(&[]).is_err());
    }
}
