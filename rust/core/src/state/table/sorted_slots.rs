//! A flush's run read in key order a chunk at a time ([`SortedSlots`]):
//! the memtable's live rows (or the change log's) and a tombstone for
//! each deleted key, sorted by key without a sorted copy of them, so a
//! sink of files (`crate::store::LocalRuns`) writes the run as it sorts
//! it. What the flush holds beside the memtable is the keys and their
//! order (12 bytes a row for an integer key), and one chunk.

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use arrow_select::take::take_record_batch;

use super::{arrow_err, StateTable};
use crate::error::{Error, Result};
use crate::state::column::Column;
use crate::state::key::Key;
use crate::state::runs::keys::KeyColumn;
use crate::state::runs::RunChunks;

pub(super) struct SortedSlots<'a> {
    table: &'a StateTable,
    columns: &'a [Box<dyn Column>],
    live: Vec<u32>,
    dead: Vec<Key>,
    /// The rows in key order: below `live.len()` a live slot's place in
    /// `live`, else a dead key's in `dead` (after the live ones).
    order: Vec<u32>,
    at: usize,
}

impl<'a> SortedSlots<'a> {
    /// The rows of `columns` (the table's slots, or its change log's) at
    /// `live`, then a tombstone for each of `dead`; `None` if there are
    /// neither.
    pub(super) fn new(
        table: &'a StateTable,
        columns: &'a [Box<dyn Column>],
        live: Vec<u32>,
        dead: Vec<Key>,
    ) -> Result<Option<Self>> {
        if live.is_empty() && dead.is_empty() {
            return Ok(None);
        }
        let keys = columns[table.key_col].gather(&live);
        let keys = if dead.is_empty() {
            keys
        } else {
            let dead_keys = table.key_type.array(&dead);
            arrow_select::concat::concat(&[keys.as_ref(), dead_keys.as_ref()]).map_err(arrow_err)?
        };
        let column = KeyColumn::new(keys.as_ref())?;
        let (order, tie) = column.order();
        if let Some([a, b]) = tie {
            // A memtable holds a key once, and a deleted key is not live.
            return Err(Error::Snapshot(format!(
                "flushing state table '{}': key {} is in rows {a} and {b} of the memtable's run",
                table.key_column(),
                column.at(a as usize)
            )));
        }
        Ok(Some(Self {
            table,
            columns,
            live,
            dead,
            order,
            at: 0,
        }))
    }
}

impl RunChunks for SortedSlots<'_> {
    // A flushed run is a diff: its rows carry `__deleted`.
    #[allow(clippy::misnamed_getters)]
    fn schema(&self) -> &SchemaRef {
        &self.table.diff_schema
    }

    fn key_column(&self) -> &str {
        self.table.key_column()
    }

    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordBatch>> {
        let end = self.order.len().min(self.at.saturating_add(max_rows));
        let rows = &self.order[self.at..end];
        if rows.is_empty() {
            return Ok(None);
        }
        self.at = end;
        let n_live = self.live.len() as u32;
        let live: Vec<u32> = (rows.iter())
            .filter(|&&r| r < n_live)
            .map(|&r| self.live[r as usize])
            .collect();
        let dead: Vec<Key> = (rows.iter())
            .filter(|&&r| r >= n_live)
            .map(|&r| self.dead[(r - n_live) as usize].clone())
            .collect();
        // `diff_batch` puts the live rows first; this puts each row back in
        // its place in key order.
        let (mut next_live, mut next_dead) = (0u32, live.len() as u32);
        let place: UInt32Array = (rows.iter())
            .map(|&r| {
                let at = if r < n_live {
                    &mut next_live
                } else {
                    &mut next_dead
                };
                *at += 1;
                *at - 1
            })
            .collect();
        let batch = self.table.diff_batch(self.columns, &live, &dead);
        take_record_batch(&batch, &place)
            .map(Some)
            .map_err(arrow_err)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use arrow_select::concat::concat_batches;

    use super::SortedSlots;
    use crate::state::runs::RunChunks;
    use crate::state::{StatePolicy, StateTable};
    use crate::store::format::sort_by_key;

    #[test]
    fn a_flush_reads_its_rows_and_tombstones_in_key_order_a_chunk_at_a_time() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let mut t = StateTable::new(schema.clone(), "k", StatePolicy::default()).unwrap();
        let rows = |keys: Vec<String>, v: i64| {
            let n = keys.len() as i64;
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(keys)),
                    Arc::new(Int64Array::from_iter(
                        (0..n).map(|i| (i % 3 != 0).then_some(i + v)),
                    )),
                ],
            )
            .unwrap()
        };
        t.upsert(&rows((0..500).map(|i| format!("k{i:04}")).collect(), 0))
            .unwrap();
        t.checkpoint(1).unwrap();
        // Changes since: rewrites, new keys, and deletes of old ones (the
        // tombstones interleave with the live rows in key order).
        t.upsert(&rows(
            (0..500)
                .rev()
                .step_by(3)
                .map(|i| format!("k{i:04}"))
                .collect(),
            7,
        ))
        .unwrap();
        t.upsert(&rows((0..90).map(|i| format!("n{i:03}")).collect(), 9))
            .unwrap();
        let doomed: Vec<String> = (0..500).step_by(7).map(|i| format!("k{i:04}")).collect();
        t.delete(&StringArray::from(doomed)).unwrap();
        let want = sort_by_key(&t.changes(), "k").unwrap();
        for chunk in [1, 7, 64, 10_000] {
            let mut slots =
                SortedSlots::new(&t, &t.log.columns, t.log.live(), t.tombstones.to_vec())
                    .unwrap()
                    .unwrap();
            let mut parts = Vec::new();
            while let Some(part) = slots.next_chunk(chunk).unwrap() {
                assert!(part.num_rows() <= chunk);
                parts.push(part);
            }
            let got = concat_batches(slots.schema(), &parts).unwrap();
            assert_eq!(got, want, "chunks of {chunk}");
        }
        // Nothing to flush: no rows.
        assert!(SortedSlots::new(&t, &t.log.columns, vec![], vec![])
            .unwrap()
            .is_none());
    }
}
