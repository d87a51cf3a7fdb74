//! A table's time index within its memory budget (issue 37): the index's
//! entries in memory count in the memtable's bytes and, past a share of the
//! budget, move into a sorted run the table's sink keeps
//! ([`crate::state::time_index`]); `due` and `earliest_time` read the runs'
//! entries in time order and keep those whose row still has that time.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef};

use super::StateTable;
use crate::error::{Error, Result};
use crate::snapshot::StateCapture;
use crate::state::key::Key;
use crate::state::runs::{MergeCursor, Run};
use crate::state::time_buckets::BaseTimeChunks;
use crate::state::time_index::TimeIndex;
use crate::state::time_rows::TimedRows;
use crate::state::{time_run_schema, DELETED_COLUMN, TIME_KEY, TIME_METADATA};

/// The index may hold this share of a table's budget in memory (1/8).
const TIME_BUDGET_SHARE: usize = 8;

/// Bytes an entry costs while a base's bucket becomes a sorted run: the
/// (time, key or rank) pair sorted (16) and its encoded bytes with their
/// offset.
const SORT_ENTRY_BYTES: usize = 40;

/// Entries of a stored time index whose order a restore checks (evenly
/// spaced, the first and last among them).
const ORDER_SAMPLES: usize = 64;

/// Whether `keys` ascend at [`ORDER_SAMPLES`] evenly spaced entries.
fn check_sampled_order(keys: &arrow_array::BinaryArray, what: &str) -> Result<()> {
    let n = keys.len();
    let step = n.div_ceil(ORDER_SAMPLES).max(1);
    let rows: Vec<usize> = (0..n).step_by(step).chain(n.checked_sub(1)).collect();
    match rows
        .windows(2)
        .find(|w| w[0] < w[1] && keys.value(w[0]) >= keys.value(w[1]))
    {
        None => Ok(()),
        Some(w) => Err(Error::Snapshot(format!(
            "{what}: entries {} and {} are out of order; a time index is sorted (a corrupt or \
             foreign file)",
            w[0], w[1]
        ))),
    }
}

/// Entries checked against the table a lookup at a time.
const CHECK_CHUNK: usize = 1 << 16;

/// Entries of a run's head checked at a time for the earliest valid one.
const HEAD_CHUNK: usize = 1 << 10;

impl StateTable {
    fn time_index(&self) -> Result<&TimeIndex> {
        self.time.as_ref().ok_or_else(|| {
            Error::Config(
                "this state table has no time index: create it with a time column to find \
                 the keys that are due"
                    .into(),
            )
        })
    }

    /// The keys whose time is at or before `threshold` (inclusive), by time
    /// then key: O(due keys), never a read of the table. With a memory
    /// budget the index's runs give their entries a threshold passed, each
    /// checked against its row (one batched lookup per 64k entries).
    pub fn due(&mut self, threshold: i64) -> Result<ArrayRef> {
        let (entries, ends) = self
            .time_index()?
            .run_entries(threshold, self.key_type.is_int());
        let current = self.still_current(&entries)?;
        let index = self.time.as_mut().expect("checked above");
        let done = index.consume(&ends);
        for ((t, key), keep) in entries.into_iter().zip(current) {
            if keep {
                index.set(key, Some(t));
            }
        }
        let keys = self.key_type.array(&index.due(threshold));
        // A due reads a prefix of each run: its pages need not stay.
        index.release_pages();
        self.release_time_runs(&done);
        self.spill_time_index()?;
        Ok(keys)
    }

    /// The earliest time of the index (None: no key has one, or no index):
    /// each run's stale first entries are consumed until one is current (an
    /// entry whose row has its time is that key's time, whether or not
    /// memory holds the key too).
    pub fn earliest_time(&mut self) -> Result<Option<i64>> {
        let Some(index) = self.time.as_ref() else {
            return Ok(None);
        };
        let int_keys = self.key_type.is_int();
        for run in 0..index.runs_len() {
            loop {
                let index = self.time.as_ref().expect("checked above");
                let head = index.run_head(run, HEAD_CHUNK, int_keys);
                if head.is_empty() {
                    break;
                }
                let first = self.still_current(&head)?.iter().position(|c| *c);
                let index = self.time.as_mut().expect("checked above");
                let start = index.run_start(run);
                index.advance(run, start + first.unwrap_or(head.len()));
                if first.is_some() {
                    break;
                }
            }
        }
        let index = self.time.as_mut().expect("checked above");
        let done = index.drop_consumed();
        let earliest = index.run_head_times().chain(index.earliest()).min();
        index.release_pages();
        self.release_time_runs(&done);
        Ok(earliest)
    }

    /// Whether each (time, key) is its row's time now: the key is present
    /// and its time column holds that time.
    fn still_current(&self, entries: &[(i64, Key)]) -> Result<Vec<bool>> {
        let col = self.time_index()?.col;
        let name = self.schema.field(col).name().clone();
        let mut current = Vec::with_capacity(entries.len());
        for chunk in entries.chunks(CHECK_CHUNK) {
            let keys: Vec<Key> = chunk.iter().map(|(_, k)| k.clone()).collect();
            let (rows, found) = self.lookup(self.key_type.array(&keys).as_ref())?;
            let times = rows
                .column_by_name(&name)
                .expect("a lookup has the table's columns")
                .as_primitive::<Int64Type>();
            current.extend(
                chunk
                    .iter()
                    .enumerate()
                    .map(|(i, (t, _))| found.value(i) && times.is_valid(i) && times.value(i) == *t),
            );
        }
        Ok(current)
    }

    /// Written rows (checked columns in schema order) update the time index;
    /// a later row of the same key wins, as in the table. Under a budget
    /// the rows go a memory's worth at a time, the index's memory moving
    /// into a run between them (a restore of 20M rows holds a run's worth).
    pub(super) fn note_times(&mut self, arrays: &[ArrayRef]) -> Result<()> {
        let Some(col) = self.time.as_ref().map(|t| t.col) else {
            return Ok(());
        };
        let rows = arrays.first().map_or(0, |a| a.len());
        let step = self.time_memory_entries().unwrap_or(rows).max(1);
        let mut lo = 0;
        while lo < rows {
            let n = step.min(rows - lo);
            let timed = self.timed_keys(arrays, col, lo, n)?;
            let index = self.time.as_mut().expect("checked above");
            for (key, time) in timed {
                index.set(key, time);
            }
            self.spill_time_index()?;
            lo += n;
        }
        Ok(())
    }

    /// Rows `lo..lo + n`'s keys with their times (None: a null time).
    fn timed_keys(
        &self,
        arrays: &[ArrayRef],
        col: usize,
        lo: usize,
        n: usize,
    ) -> Result<impl Iterator<Item = (Key, Option<i64>)>> {
        let name = self.schema.field(self.key_col).name();
        let keys = (self.key_type).keys(name, arrays[self.key_col].slice(lo, n).as_ref())?;
        let times = arrays[col].slice(lo, n).as_primitive::<Int64Type>().clone();
        Ok(keys
            .into_iter()
            .enumerate()
            .map(move |(i, key)| (key, times.is_valid(i).then(|| times.value(i)))))
    }

    /// A restored base's rows (checked columns in schema order, each key
    /// once) into an empty index in one sweep, as one sorted run, never
    /// through memory's map and tree: without a budget held in memory;
    /// under one written by the sink a bucket of times at a time, each about
    /// the index's share of the budget ([`BaseTimeChunks`]). Its entries are
    /// checked against the rows as any run's are. An index that holds
    /// entries takes the rows as any rows.
    pub(super) fn note_base_times(&mut self, arrays: &[ArrayRef]) -> Result<()> {
        let Some(index) = self.time.as_ref() else {
            return Ok(());
        };
        if !index.is_empty() {
            return self.note_times(arrays);
        }
        let col = index.col;
        let times = arrays[col].as_ref();
        if times.len() == times.null_count() {
            return Ok(());
        }
        let per_run = match (self.memory_budget(), index.memory_entries) {
            (None, _) => None,
            (Some(_), Some(n)) => Some(n),
            (Some(b), None) => Some(b / TIME_BUDGET_SHARE / SORT_ENTRY_BYTES),
        };
        let keys = arrays[self.key_col].as_ref();
        let run = match (per_run, self.spill.as_mut()) {
            (Some(per_run), Some(spill)) => {
                let mut chunks = BaseTimeChunks::new(times, keys, per_run)?;
                spill.stats.time_flushes += 1;
                spill.sink.keep_merged(&mut chunks)?
            }
            // Held in memory: the entries' bytes (16 and an offset for an
            // integer key), not the map's and tree's ~96 an entry.
            _ => {
                let rows = TimedRows::new(times, keys)?;
                let entries = rows.all();
                Arc::new(TimeIndex::rows_run(rows.batch(&entries)?)?)
            }
        };
        self.time.as_mut().expect("checked above").push_run(run);
        crate::heap::release_freed();
        Ok(())
    }

    /// A restored full's stored time index (format 5) as the empty index's
    /// base run, if the full carries one of the index's column: its columns
    /// are checked, its order at [`ORDER_SAMPLES`] entries (a full check
    /// would read every page of a file its checksum vouched for already:
    /// `verify` checks every entry), and its count against the full's rows
    /// with a time (so an index stored beside another file is refused); its
    /// entries are then checked against the rows as any run's are. One in
    /// memory (not `mapped`) goes to the sink of a table with a budget, as
    /// its runs do. False: none to take (the caller reads the rows' times).
    pub(super) fn take_stored_times(
        &mut self,
        full: &StateCapture,
        mapped: bool,
        what: &str,
    ) -> Result<bool> {
        let (Some(index), Some(times)) = (self.time.as_ref(), full.times.as_ref()) else {
            return Ok(false);
        };
        if times.schema().fields() != time_run_schema().fields() {
            return Err(Error::Snapshot(format!(
                "{what} is not a time index: its columns are not '{TIME_KEY}' (binary) and \
                 '{DELETED_COLUMN}' (boolean)"
            )));
        }
        let column = self.schema.field(index.col).name();
        if !index.is_empty() || times.schema().metadata().get(TIME_METADATA) != Some(column) {
            return Ok(false);
        }
        let rows = self.columns_of(&full.batch)?;
        let timed = rows[index.col].len() - rows[index.col].null_count();
        if times.num_rows() != timed {
            return Err(Error::Snapshot(format!(
                "{what}: holds {} entries, but the full has {timed} rows with a '{column}'; \
                 it is not this file's index",
                times.num_rows()
            )));
        }
        check_sampled_order(times.column(0).as_binary::<i32>(), what)?;
        let run = Run::from_sorted_trusted_unfiltered(times.clone(), TIME_KEY)?;
        let budgeted = self.memory_budget().is_some();
        if let Some(spill) = self.spill.as_mut() {
            spill.stats.times_stored += 1;
        }
        let run = match self.spill.as_mut() {
            Some(spill) if !mapped && budgeted => spill.sink.keep(run)?,
            _ => Arc::new(run),
        };
        self.time.as_mut().expect("checked above").push_run(run);
        Ok(true)
    }

    /// With a budget, how many entries the index keeps in memory before
    /// they move into a run: its share of the budget (or a test's count).
    fn time_memory_entries(&self) -> Option<usize> {
        let index = self.time.as_ref()?;
        let budget = self.memory_budget()?;
        if let Some(n) = index.memory_entries {
            return Some(n);
        }
        let per_entry = index.memory_bytes().checked_div(index.len()).unwrap_or(0);
        let per_entry = per_entry.max(crate::state::time_index::ENTRY_BYTES);
        Some((budget / TIME_BUDGET_SHARE / per_entry).max(1))
    }

    /// Moves the index's entries in memory into a run once they outgrow
    /// their share; past [`crate::state::time_index::MAX_TIME_RUNS`] runs
    /// merges the newest (exact duplicates go).
    fn spill_time_index(&mut self) -> Result<()> {
        let Some(limit) = self.time_memory_entries() else {
            return Ok(());
        };
        let (Some(index), Some(spill)) = (self.time.as_mut(), self.spill.as_mut()) else {
            return Ok(());
        };
        if index.len() <= limit {
            return Ok(());
        }
        if let Some(run) = index.take_memory()? {
            let kept = spill.sink.keep(run)?;
            index.push_run(kept);
            spill.stats.time_flushes += 1;
        }
        self.merge_time_runs()?;
        crate::heap::release_freed();
        Ok(())
    }

    /// Past [`crate::state::time_index::MAX_TIME_RUNS`] runs merges the
    /// newest (exact duplicates go).
    fn merge_time_runs(&mut self) -> Result<()> {
        let (Some(index), Some(spill)) = (self.time.as_mut(), self.spill.as_mut()) else {
            return Ok(());
        };
        if let Some(upto) = index.merge_upto() {
            let inputs = index.merge_inputs(upto)?;
            let inputs: Vec<&Run> = inputs.iter().collect();
            let kept = spill
                .sink
                .keep_merged(&mut MergeCursor::new(&inputs, false)?)?;
            let old = index.replace_merged(upto, kept);
            spill.sink.release(&old);
            spill.stats.time_merges += 1;
        }
        Ok(())
    }

    /// The index's runs `runs` are no longer read.
    fn release_time_runs(&mut self, runs: &[Arc<Run>]) {
        if let Some(spill) = self.spill.as_mut() {
            if !runs.is_empty() {
                spill.sink.release(runs);
            }
        }
    }

    /// Empties the time index, its runs released.
    pub(super) fn clear_time_index(&mut self) {
        if let Some(index) = self.time.as_mut() {
            let runs = index.clear();
            self.release_time_runs(&runs);
        }
    }

    /// The index's runs (0 without a time index).
    pub fn time_runs(&self) -> usize {
        self.time.as_ref().map_or(0, TimeIndex::runs_len)
    }

    /// Tests: the index moves its memory into a run past `entries` entries
    /// (with a budget).
    #[cfg(test)]
    pub(crate) fn with_time_memory_entries(mut self, entries: usize) -> Self {
        if let Some(index) = self.time.as_mut() {
            index.memory_entries = Some(entries);
        }
        self
    }
}
