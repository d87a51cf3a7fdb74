//! A source over in-memory Arrow record batches, replayable by record offset.

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::operator::{Batch, Source, SourceFactory};

/// Emits its batches in order; the offset counts records, so a restore can
/// resume in the middle of a batch.
pub struct BatchSource {
    batches: Vec<RecordBatch>,
    /// Index of the next batch and rows of it already emitted.
    next: usize,
    skip: usize,
    offset: u64,
}

impl BatchSource {
    pub fn new(batches: Vec<RecordBatch>) -> Self {
        Self {
            batches,
            next: 0,
            skip: 0,
            offset: 0,
        }
    }
}

impl Source for BatchSource {
    fn next_batch(&mut self) -> Result<Option<Batch>> {
        while let Some(b) = self.batches.get(self.next) {
            let rest = b.num_rows() - self.skip;
            let out = if self.skip == 0 {
                b.clone()
            } else {
                b.slice(self.skip, rest)
            };
            self.next += 1;
            self.skip = 0;
            if rest > 0 {
                self.offset += rest as u64;
                return Ok(Some(out));
            }
        }
        Ok(None)
    }

    fn offset(&self) -> u64 {
        self.offset
    }

    fn seek(&mut self, offset: u64) -> Result<()> {
        let mut left = offset;
        for (i, b) in self.batches.iter().enumerate() {
            let rows = b.num_rows() as u64;
            if left < rows || (left == rows && i + 1 == self.batches.len()) {
                self.next = i;
                self.skip = left as usize;
                self.offset = offset;
                return Ok(());
            }
            left -= rows;
        }
        if left == 0 {
            self.next = self.batches.len();
            self.skip = 0;
            self.offset = offset;
            return Ok(());
        }
        Err(Error::Snapshot(format!(
            "batch source offset {offset} is past its end ({} records)",
            offset - left
        )))
    }
}

struct Factory {
    batches: Vec<RecordBatch>,
}

impl SourceFactory for Factory {
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>> {
        let mine = self
            .batches
            .iter()
            .enumerate()
            .filter(|(i, _)| i % parallelism == subtask)
            .map(|(_, b)| b.clone())
            .collect();
        Ok(Box::new(BatchSource::new(mine)))
    }
}

/// A source over `batches`; with parallelism p, subtask s emits batches s, s+p, ...
pub fn batch_source(batches: Vec<RecordBatch>) -> Arc<dyn SourceFactory> {
    Arc::new(Factory { batches })
}
