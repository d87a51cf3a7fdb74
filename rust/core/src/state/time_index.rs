//! A secondary index of a [`super::StateTable`] by a time column: the keys
//! whose time is at or before a threshold, without reading the table.
//!
//! Timers (a row per timer), time-to-live (an expiry per row) and
//! `GroupState` timeouts are due when their time passes. Finding them by
//! reading every row costs O(table) per micro-batch, and with a memory
//! budget it reads every spilled run back. The index keeps (time, key) in
//! order, as Spark's RocksDB provider keeps a TTL index column family, so
//! expiry costs O(due keys · log n). It is derived from the rows: a full's
//! writer stores it beside the file (format 5, `store::time_files`), and a
//! restore takes that as it is (`StateTable::take_stored_times`), else
//! rebuilds it from the rows.
//!
//! In memory it holds each key's newest time (about [`ENTRY_BYTES`] a key).
//! A table with a memory budget moves those entries out past a share of the
//! budget, as one sorted run of (time, key) pairs encoded to sort as the
//! pairs do ([`TIME_KEY`]), kept by the table's run sink as its other runs
//! are. A run's entry goes stale when its key's time changes or its row
//! goes (the newer entry is in memory, or there is none): runs are only
//! appended to, so a run's entry counts only while the table's row still
//! has that time and memory holds nothing newer for the key (the table
//! checks, [`TimeIndex::run_entries`]). Entries are read in time order, so
//! the ones a threshold passed are a prefix of each run: `due` consumes
//! that prefix (moving the entries still valid into memory), and a run read
//! to its end goes. Stale entries thus live until their time passes (a key
//! updated k times within its time-to-live leaves up to k entries on disk),
//! or until a merge of runs drops exact duplicates.
//!
//! A restored base's entries skip memory's map and tree: they become one
//! such run at once, the stored one or one made from the rows
//! (`StateTable::note_base_times`), held in memory without a budget and
//! written a bucket of times at a time under one
//! ([`super::time_buckets`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_array::builder::BinaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use rustc_hash::FxHashMap;

use super::key::Key;
use super::runs::keys::partition_point;
use super::runs::{KeyRef, Run};
use super::DELETED_COLUMN;
use crate::error::{Error, Result};

/// The key column of a time index's runs: a time and a key in bytes that
/// sort as the (time, key) pair does.
pub(crate) const TIME_KEY: &str = "time_key";

/// Estimated bytes of one entry in memory: its place in the key → time map
/// and in the (time, key) set, with their spare room (a byte key's heap
/// bytes, held twice, are counted apart).
pub(crate) const ENTRY_BYTES: usize = 96;

/// Runs past which the newest ones merge (see [`TimeIndex::merge_upto`]).
pub(crate) const MAX_TIME_RUNS: usize = 8;

/// A run is left out of a merge while it holds more than this many times
/// the entries of all runs newer than it (as the table's base).
const RUN_RATIO: usize = 4;

pub(crate) struct TimeIndex {
    /// The time column's position in the table's schema (Int64, nullable: a
    /// row with a null time is not in the index).
    pub(crate) col: usize,
    by_key: FxHashMap<Key, i64>,
    by_time: BTreeSet<(i64, Key)>,
    /// Heap bytes of the byte keys in memory (each held twice).
    heap_bytes: usize,
    /// Entries moved out of memory, newest run first, each with how many of
    /// its first entries were consumed.
    runs: Vec<(Arc<Run>, usize)>,
    /// Tests set how many entries memory holds before they move to a run
    /// (otherwise the table derives it from its budget).
    pub(crate) memory_entries: Option<usize>,
}

impl TimeIndex {
    pub(crate) fn new(col: usize) -> Self {
        Self {
            col,
            by_key: FxHashMap::default(),
            by_time: BTreeSet::new(),
            heap_bytes: 0,
            runs: Vec::new(),
            memory_entries: None,
        }
    }

    /// Keys with a time in memory.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Estimated bytes of the entries in memory.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.by_key.len() * ENTRY_BYTES + 2 * self.heap_bytes
    }

    /// Runs holding entries moved out of memory.
    pub(crate) fn runs_len(&self) -> usize {
        self.runs.len()
    }

    /// Bytes of the runs' entries ([`Run::size_bytes`]): memory for runs
    /// no sink wrote (a restored base's times without a budget).
    pub(crate) fn runs_bytes(&self) -> usize {
        self.runs.iter().map(|(run, _)| run.size_bytes()).sum()
    }

    /// `key`'s row now has `time` (None: a null time, not indexed).
    pub(crate) fn set(&mut self, key: Key, time: Option<i64>) {
        match time {
            None => self.remove(&key),
            Some(t) => {
                match self.by_key.insert(key.clone(), t) {
                    Some(old) if old == t => return,
                    Some(old) => {
                        self.by_time.remove(&(old, key.clone()));
                    }
                    None => self.heap_bytes += heap_len(&key),
                }
                self.by_time.insert((t, key));
            }
        }
    }

    /// `key`'s row is gone (absent keys are ignored).
    pub(crate) fn remove(&mut self, key: &Key) {
        if let Some(old) = self.by_key.remove(key) {
            self.by_time.remove(&(old, key.clone()));
            self.heap_bytes -= heap_len(key);
        }
    }

    /// Keys in memory whose time is at or before `threshold`, by time then
    /// key (the table moves the runs' valid due entries into memory first).
    pub(crate) fn due(&self, threshold: i64) -> Vec<Key> {
        self.by_time
            .iter()
            .take_while(|(t, _)| *t <= threshold)
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// The earliest time in memory.
    pub(crate) fn earliest(&self) -> Option<i64> {
        self.by_time.first().map(|(t, _)| *t)
    }

    /// Empties the index; returns its runs, for their sink to release.
    pub(crate) fn clear(&mut self) -> Vec<Arc<Run>> {
        self.by_key = FxHashMap::default();
        self.by_time = BTreeSet::new();
        self.heap_bytes = 0;
        self.runs.drain(..).map(|(r, _)| r).collect()
    }

    /// The entries in memory as one sorted run, memory emptied (its room
    /// given back); None when memory holds none.
    pub(crate) fn take_memory(&mut self) -> Result<Option<Run>> {
        if self.by_time.is_empty() {
            return Ok(None);
        }
        let run = sorted_run(self.by_time.iter(), self.by_time.len())?;
        self.by_key = FxHashMap::default();
        self.by_time = BTreeSet::new();
        self.heap_bytes = 0;
        Ok(Some(run))
    }

    /// Whether the index holds no entry, in memory or in runs.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty() && self.runs.is_empty()
    }

    /// A run of `batch`, a restored base's entries as
    /// [`super::time_rows::TimedRows::batch`] encodes them (sorted, each once).
    pub(crate) fn rows_run(batch: RecordBatch) -> Result<Run> {
        Run::from_sorted_unfiltered(batch, TIME_KEY, "a restored base's time index")
    }

    /// Keeps `run` (entries [`Self::take_memory`] moved out) as the newest.
    pub(crate) fn push_run(&mut self, run: Arc<Run>) {
        self.runs.insert(0, (run, 0));
    }

    /// The runs' unconsumed entries at or before `threshold` whose key has
    /// no newer entry in memory, by time then key, each once; and, per run,
    /// where those entries end (for [`Self::consume`]). The table keeps the
    /// ones whose row still has that time.
    pub(crate) fn run_entries(
        &self,
        threshold: i64,
        int_keys: bool,
    ) -> (Vec<(i64, Key)>, Vec<usize>) {
        let bound = flip(threshold);
        let mut entries = Vec::new();
        let mut ends = Vec::with_capacity(self.runs.len());
        for (run, start) in &self.runs {
            let column = run.keys().as_binary::<i32>();
            let end = partition_point(*start, column.len(), |i| column.value(i)[..8] <= bound[..]);
            for i in *start..end {
                let (t, key) = decode(column.value(i), int_keys);
                if !self.by_key.contains_key(&key) {
                    entries.push((t, key));
                }
            }
            ends.push(end);
        }
        entries.sort_unstable();
        entries.dedup();
        (entries, ends)
    }

    /// Up to `most` unconsumed entries of run `run` from its first.
    pub(crate) fn run_head(&self, run: usize, most: usize, int_keys: bool) -> Vec<(i64, Key)> {
        let (r, start) = &self.runs[run];
        let column = r.keys().as_binary::<i32>();
        (*start..column.len().min(start + most))
            .map(|i| decode(column.value(i), int_keys))
            .collect()
    }

    /// The first unconsumed entry's time of each run.
    pub(crate) fn run_head_times(&self) -> impl Iterator<Item = i64> + '_ {
        self.runs.iter().filter_map(|(r, start)| {
            let column = r.keys().as_binary::<i32>();
            (*start < column.len()).then(|| unflip(&column.value(*start)[..8]))
        })
    }

    /// Where run `run`'s unconsumed entries begin.
    pub(crate) fn run_start(&self, run: usize) -> usize {
        self.runs[run].1
    }

    /// Releases the pages reads brought in of the runs' mapped files.
    pub(crate) fn release_pages(&self) {
        self.runs.iter().for_each(|(r, _)| r.release_pages());
    }

    /// Marks run `run`'s entries before `end` consumed.
    pub(crate) fn advance(&mut self, run: usize, end: usize) {
        let (_, start) = &mut self.runs[run];
        *start = (*start).max(end);
    }

    /// Marks each run's entries before its end in `ends` consumed (as
    /// [`Self::run_entries`] gave them); returns the runs read to their end,
    /// no longer kept, for their sink to release.
    pub(crate) fn consume(&mut self, ends: &[usize]) -> Vec<Arc<Run>> {
        for (i, &end) in ends.iter().enumerate() {
            self.advance(i, end);
        }
        self.drop_consumed()
    }

    /// Runs read to their end go (returned for their sink to release).
    pub(crate) fn drop_consumed(&mut self) -> Vec<Arc<Run>> {
        let (done, kept): (Vec<_>, Vec<_>) = self
            .runs
            .drain(..)
            .partition(|(r, start)| *start >= r.len());
        self.runs = kept;
        done.into_iter().map(|(r, _)| r).collect()
    }

    /// Past [`MAX_TIME_RUNS`] runs: how many of the newest merge into one
    /// (every run, unless the oldest holds [`RUN_RATIO`] times the others'
    /// entries: then the others); None below it.
    pub(crate) fn merge_upto(&self) -> Option<usize> {
        let n = self.runs.len();
        if n <= MAX_TIME_RUNS {
            return None;
        }
        let left = |i: usize| self.runs[i].0.len() - self.runs[i].1;
        let above: usize = (0..n - 1).map(left).sum();
        Some(if above * RUN_RATIO < left(n - 1) {
            n - 1
        } else {
            n
        })
    }

    /// The unconsumed entries of the newest `upto` runs, as runs to merge.
    pub(crate) fn merge_inputs(&self, upto: usize) -> Result<Vec<Run>> {
        self.runs[..upto]
            .iter()
            .map(|(r, start)| r.tail(*start, "a time index run"))
            .collect()
    }

    /// The newest `upto` runs replaced by `merged`; returns them, for their
    /// sink to release.
    pub(crate) fn replace_merged(&mut self, upto: usize, merged: Arc<Run>) -> Vec<Arc<Run>> {
        let old = self
            .runs
            .splice(..upto, [(merged, 0)])
            .map(|(r, _)| r)
            .collect();
        self.drop_consumed();
        old
    }
}

/// The run of `len` entries `sorted` gives in (time, key) order.
fn sorted_run<'a>(sorted: impl Iterator<Item = &'a (i64, Key)> + Clone, len: usize) -> Result<Run> {
    Run::from_sorted_unfiltered(entries_batch(sorted, len)?, TIME_KEY, "a time index run")
}

/// The rows of a run of the `len` entries `sorted` gives.
pub(crate) fn entries_batch<'a>(
    sorted: impl Iterator<Item = &'a (i64, Key)> + Clone,
    len: usize,
) -> Result<RecordBatch> {
    let bytes: usize = sorted.clone().map(|(_, k)| 8 + key_len(k)).sum();
    let mut column = BinaryBuilder::with_capacity(len, bytes);
    let mut buf = Vec::with_capacity(64);
    for (t, k) in sorted {
        buf.clear();
        encode(*t, k, &mut buf);
        column.append_value(&buf);
    }
    let live = BooleanArray::from(vec![false; len]);
    RecordBatch::try_new(
        run_schema(),
        vec![Arc::new(column.finish()), Arc::new(live)],
    )
    .map_err(|e| Error::Config(format!("building a time index run: {e}")))
}

/// A run's entries and a `__deleted` column that is always false: the
/// runs are diffs to the merge (which takes a base only as the oldest of
/// its inputs), so any newest few of them merge.
pub(crate) fn run_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new(TIME_KEY, DataType::Binary, false),
        Field::new(DELETED_COLUMN, DataType::Boolean, false),
    ]))
}

/// Heap bytes a byte key's copy costs: its bytes and the allocator's
/// header and rounding.
fn heap_len(key: &Key) -> usize {
    match key {
        Key::Int(_) => 0,
        Key::Bytes(b) => b.len() + 16,
    }
}

fn key_len(key: &Key) -> usize {
    match key {
        Key::Int(_) => 8,
        Key::Bytes(b) => b.len(),
    }
}

/// An i64 as 8 bytes that sort as the numbers do.
fn flip(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

fn unflip(b: &[u8]) -> i64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[..8]);
    (u64::from_be_bytes(raw) ^ (1 << 63)) as i64
}

/// (time, key) as bytes that sort as the pair does: a byte key is last, so
/// its own order (bytewise) follows the time's.
fn encode(time: i64, key: &Key, out: &mut Vec<u8>) {
    encode_ref(time, KeyRef::of(key), out)
}

/// As [`encode`], of a key read in place.
pub(crate) fn encode_ref(time: i64, key: KeyRef<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(&flip(time));
    match key {
        KeyRef::Int(k) => out.extend_from_slice(&flip(k)),
        KeyRef::Bytes(b) => out.extend_from_slice(b),
    }
}

fn decode(bytes: &[u8], int_keys: bool) -> (i64, Key) {
    let rest = &bytes[8..];
    let key = if int_keys {
        Key::Int(unflip(rest))
    } else {
        Key::Bytes(Box::from(rest))
    };
    (unflip(bytes), key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn due_keys_come_by_time_then_key_and_follow_updates() {
        let mut ix = TimeIndex::new(1);
        ix.set(Key::Int(3), Some(20));
        ix.set(Key::Int(1), Some(10));
        ix.set(Key::Int(2), Some(10));
        ix.set(Key::Int(4), None);
        assert_eq!(ix.due(9), vec![]);
        assert_eq!(ix.due(10), vec![Key::Int(1), Key::Int(2)]);
        ix.set(Key::Int(1), Some(30)); // moved later
        ix.set(Key::Int(3), None); // its time cleared
        ix.remove(&Key::Int(2));
        ix.remove(&Key::Int(99));
        assert_eq!(ix.due(25), vec![]);
        assert_eq!((ix.len(), ix.earliest()), (1, Some(30)));
        ix.clear();
        assert_eq!((ix.len(), ix.earliest()), (0, None));
    }

    proptest! {
        /// Against a model map: after any sequence of sets and removals,
        /// `due(t)` is exactly the model's keys with time <= t, ordered.
        #[test]
        fn matches_a_model(
            ops in prop::collection::vec((0i64..20, prop::option::of(-5i64..5), any::<bool>()), 0..200),
            threshold in -6i64..6,
        ) {
            let mut ix = TimeIndex::new(0);
            let mut model: BTreeMap<i64, i64> = BTreeMap::new();
            for (k, t, remove) in ops {
                if remove {
                    ix.remove(&Key::Int(k));
                    model.remove(&k);
                } else {
                    ix.set(Key::Int(k), t);
                    match t {
                        Some(t) => { model.insert(k, t); }
                        None => { model.remove(&k); }
                    }
                }
            }
            let mut want: Vec<(i64, i64)> =
                model.iter().filter(|(_, t)| **t <= threshold).map(|(k, t)| (*t, *k)).collect();
            want.sort();
            let want: Vec<Key> = want.into_iter().map(|(_, k)| Key::Int(k)).collect();
            prop_assert_eq!(ix.due(threshold), want);
            prop_assert_eq!(ix.len(), model.len());
        }
    }
}
