//! A batch given out a chunk at a time in the order that sorts it
//! ([`super::run_order`]), so that a sorted copy of it is written as it is
//! made instead of held whole (issue 37): a compaction's input in capture
//! order (an in-memory aggregate's full) costs the order (4 bytes a row)
//! and a chunk, not a second copy of the state.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use arrow_select::take::take_record_batch;

use super::merge::RunChunks;
use super::run::Pages;
use crate::error::{Error, Result};

pub struct OrderedChunks<'a> {
    batch: &'a RecordBatch,
    order: UInt32Array,
    key: String,
    at: usize,
    /// The pages `batch` lies in, let go of as the chunks read them.
    pages: Option<Arc<dyn Pages>>,
}

impl<'a> OrderedChunks<'a> {
    /// `batch`'s rows in `order` (each row once), keyed by column `key`.
    pub fn new(
        batch: &'a RecordBatch,
        order: UInt32Array,
        key: &str,
        pages: Option<Arc<dyn Pages>>,
    ) -> Result<Self> {
        if order.len() != batch.num_rows() || order.null_count() > 0 {
            return Err(Error::Config(format!(
                "an order of {} rows ({} null) for a batch of {}: give each row once",
                order.len(),
                order.null_count(),
                batch.num_rows()
            )));
        }
        Ok(Self {
            batch,
            order,
            key: key.to_string(),
            at: 0,
            pages,
        })
    }
}

impl RunChunks for OrderedChunks<'_> {
    fn schema(&self) -> &SchemaRef {
        self.batch.schema_ref()
    }

    fn key_column(&self) -> &str {
        &self.key
    }

    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordBatch>> {
        let n = max_rows.max(1).min(self.order.len() - self.at);
        if n == 0 {
            return Ok(None);
        }
        let rows = self.order.slice(self.at, n);
        self.at += n;
        take_record_batch(self.batch, &rows)
            .map(Some)
            .map_err(|e| Error::Snapshot(format!("taking a chunk of a batch in key order: {e}")))
    }

    fn release_inputs(&self) {
        if let Some(pages) = &self.pages {
            pages.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::state::runs::run_order;

    #[test]
    fn chunks_give_the_rows_in_key_order() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let keys = Int64Array::from(vec![5, 3, 9, 1, 7]);
        let values = Int64Array::from(vec![50, 30, 90, 10, 70]);
        let batch = RecordBatch::try_new(schema, vec![Arc::new(keys), Arc::new(values)]).unwrap();
        let order = run_order(&batch, "k").unwrap().expect("not sorted");
        let mut chunks = OrderedChunks::new(&batch, order, "k", None).unwrap();
        let mut got = Vec::new();
        while let Some(chunk) = chunks.next_chunk(2).unwrap() {
            assert!(chunk.num_rows() <= 2);
            let v = chunk.column(1).as_primitive::<Int64Type>();
            got.extend(v.values().iter().copied());
        }
        assert_eq!(got, vec![10, 30, 50, 70, 90]);
        assert!(chunks.next_chunk(2).unwrap().is_none());
    }

    #[test]
    fn an_order_of_another_length_is_refused() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![2, 1]))]).unwrap();
        let err = OrderedChunks::new(&batch, UInt32Array::from(vec![0]), "k", None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("an order of 1 rows"), "{err}");
    }
}
