//! A restored base's time index entries as one run, made a bucket of times
//! at a time (issue 37): a base of 10M keys under a budget would otherwise
//! sort its entries into ~17 runs of a budget's share each and merge them
//! twice over. Bounds drawn from a sample of the base's entries cut it into
//! buckets of about a share each; each bucket is found by a pass over the
//! time column, sorted, and given out in order, so the one run is written
//! as it is made and every entry once. Entries are (time, rank) pairs
//! ([`super::time_rows`]): no key is read until an entry is encoded.

use arrow_array::{Array, RecordBatch};
use arrow_schema::SchemaRef;

use super::runs::RunChunks;
use super::time_index::{run_schema, TIME_KEY};
use super::time_rows::{TimedRow, TimedRows};
use crate::error::Result;

/// Sampled entries a bucket: its bounds' error is then about a quarter of it.
const SAMPLES_PER_BUCKET: usize = 64;

pub(crate) struct BaseTimeChunks<'a> {
    rows: TimedRows<'a>,
    /// Each bucket's last entry but the last bucket's, ascending.
    bounds: Vec<TimedRow>,
    per_bucket: usize,
    next_bucket: usize,
    bucket: Vec<TimedRow>,
    at: usize,
    schema: SchemaRef,
}

impl<'a> BaseTimeChunks<'a> {
    /// The entries of rows `times` and `keys` (a null time not indexed) in
    /// buckets of about `per_bucket` entries.
    pub(crate) fn new(times: &dyn Array, keys: &'a dyn Array, per_bucket: usize) -> Result<Self> {
        let rows = TimedRows::new(times, keys)?;
        let per_bucket = per_bucket.max(1);
        let bounds = sample_bounds(&rows, per_bucket);
        Ok(Self {
            rows,
            bounds,
            per_bucket,
            next_bucket: 0,
            bucket: Vec::new(),
            at: 0,
            schema: run_schema(),
        })
    }

    /// How many entries the chunks give and their encoded bytes, when that
    /// is known before they are sorted ([`TimedRows::exact_sizes`]).
    pub(crate) fn sizes(&self) -> Option<(usize, u64)> {
        self.rows.exact_sizes()
    }

    /// Makes the next bucket's entries, sorted, `self.bucket` (false:
    /// every bucket was given). The bucket's room is kept for the next.
    fn next_bucket(&mut self) -> bool {
        let b = self.next_bucket;
        if b > self.bounds.len() {
            return false;
        }
        self.next_bucket += 1;
        let lo = b.checked_sub(1).map(|i| self.bounds[i]);
        if self.bucket.capacity() == 0 && !self.bounds.is_empty() {
            // A share, with room for the bounds' error.
            self.bucket.reserve(self.per_bucket + self.per_bucket / 2);
        }
        self.rows
            .between(lo, self.bounds.get(b).copied(), &mut self.bucket);
        self.at = 0;
        true
    }
}

fn sample_bounds(rows: &TimedRows<'_>, per_bucket: usize) -> Vec<TimedRow> {
    let entries = rows.timed();
    let buckets = entries.div_ceil(per_bucket);
    if buckets <= 1 {
        return Vec::new();
    }
    // Every so many rows with a time (not every so many rows: nulls in a
    // pattern could hide every row a stride lands on).
    let sample = rows.sample((entries / (buckets * SAMPLES_PER_BUCKET)).max(1));
    let mut bounds: Vec<TimedRow> = (1..buckets)
        .map(|b| sample[b * sample.len() / buckets])
        .collect();
    bounds.dedup();
    bounds
}

impl RunChunks for BaseTimeChunks<'_> {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn key_column(&self) -> &str {
        TIME_KEY
    }

    /// `max_rows` entries, however many buckets they span (a streamed
    /// file's chunks but its last must hold what was asked).
    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordBatch>> {
        let max_rows = max_rows.max(1);
        let mut rows: Vec<TimedRow> = Vec::new();
        while rows.len() < max_rows {
            if self.at >= self.bucket.len() {
                if !self.next_bucket() {
                    break;
                }
                continue;
            }
            let take = (max_rows - rows.len()).min(self.bucket.len() - self.at);
            rows.extend_from_slice(&self.bucket[self.at..self.at + take]);
            self.at += take;
        }
        if rows.is_empty() {
            return Ok(None);
        }
        self.rows.batch(&rows).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Int64Array, StringArray};
    use proptest::prelude::*;

    use super::*;
    use crate::state::key::Key;
    use crate::state::time_index::entries_batch;

    fn given(chunks: &mut BaseTimeChunks<'_>, max_rows: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut short = false;
        while let Some(batch) = chunks.next_chunk(max_rows).unwrap() {
            // Only the last chunk may hold fewer rows than asked.
            assert!(!short && batch.num_rows() <= max_rows);
            short = batch.num_rows() < max_rows;
            let column = batch.column(0).as_binary::<i32>();
            out.extend(column.iter().map(|v| v.unwrap().to_vec()));
        }
        out
    }

    proptest! {
        /// Whatever the bucket size, ties and nulls, the chunks give every
        /// entry once, in (time, key) order: what one sort of them gives.
        #[test]
        fn buckets_give_every_entry_once_in_order(
            rows in prop::collection::vec((prop::option::of(-3i64..4), any::<bool>()), 0..300),
            per_bucket in 1usize..40,
            max_rows in 1usize..50,
        ) {
            let keys: Vec<String> = (0..rows.len()).map(|i| format!("k{}", (i * 7919) % 1000)).collect();
            let mut seen = std::collections::HashSet::new();
            let unique: Vec<usize> = (0..rows.len()).filter(|&i| seen.insert(keys[i].clone())).collect();
            let times = Int64Array::from_iter(unique.iter().map(|&i| rows[i].0));
            let key_array = StringArray::from_iter_values(unique.iter().map(|&i| keys[i].as_str()));
            let mut chunks =
                BaseTimeChunks::new(&times, &key_array, per_bucket).unwrap();
            let got = given(&mut chunks, max_rows);
            let mut want: Vec<(i64, Key)> = unique
                .iter()
                .filter_map(|&i| rows[i].0.map(|t| (t, Key::Bytes(Box::from(keys[i].as_bytes())))))
                .collect();
            want.sort_unstable();
            let want = entries_batch(want.iter(), want.len()).unwrap();
            let want: Vec<Vec<u8>> =
                want.column(0).as_binary::<i32>().iter().map(|v| v.unwrap().to_vec()).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn nulls_in_a_pattern_leave_the_sample_its_rows() {
        // Every other row has a time, and 60 buckets of 84 would make a
        // stride of 2 rows over 10,000: it would see only nulls.
        let times = Int64Array::from_iter((0..10_000i64).map(|i| (i % 2 == 1).then_some(i % 97)));
        let keys: Arc<dyn Array> = Arc::new(Int64Array::from_iter_values(0..10_000));
        let mut chunks = BaseTimeChunks::new(&times, keys.as_ref(), 84).unwrap();
        assert_eq!(chunks.bounds.len(), 59);
        let got = given(&mut chunks, 64);
        assert_eq!(got.len(), 5_000);
        assert!(got.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn int_keys_with_one_time_split_by_key() {
        let times = Int64Array::from(vec![5; 100]);
        let keys: Arc<dyn Array> = Arc::new(Int64Array::from_iter_values((0..100).rev()));
        let mut chunks = BaseTimeChunks::new(&times, keys.as_ref(), 10).unwrap();
        assert!(chunks.bounds.len() >= 5, "{:?}", chunks.bounds);
        let got = given(&mut chunks, 7);
        assert_eq!(got.len(), 100);
        assert!(got.windows(2).all(|w| w[0] < w[1]));
    }
}
