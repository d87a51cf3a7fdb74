//! Spilling (issue 37): a [`StateTable`] with a memory budget keeps its
//! newest rows in memory (the memtable: its slots) over sorted runs that
//! hold the rest (a [`RunSet`], newest first), as RocksDB keeps a memtable
//! over its levels. When the memtable outgrows the budget after a write,
//! its rows, with a tombstone for every key deleted since (the runs may
//! hold it), become one more run (a flush), which a [`RunSink`] keeps where
//! it likes (the store's `LocalRuns` writes it to a local Arrow IPC file
//! and maps it back, so it costs page cache, not heap); the memtable then
//! starts empty.
//!
//! A key's value is the memtable's if it holds the key, else nothing if it
//! was deleted since the last flush (a *shadow*), else the newest run's.
//! Checkpoints stay O(changed keys): a flush also hands the sink the
//! changes since the last checkpoint (the change log's rows and the
//! tombstones) as a *pending* run, and a diff is the pending runs merged
//! with the change log. Past [`MAX_RUNS`] runs, a flush merges the runs
//! above the base into one (or, once they hold a quarter of its rows, all
//! of them into a new base), so a lookup searches a bounded number of runs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{make_array, UInt32Array};
use arrow_array::{new_null_array, Array, ArrayRef, BooleanArray, OffsetSizeTrait, RecordBatch};
use arrow_schema::{DataType, Schema, SchemaRef};
use arrow_select::interleave::interleave;

use super::sorted_slots::SortedSlots;
use super::{arrow_err, StateTable, LIVE_KEYS_METADATA};
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::StateKind;
use crate::state::changelog::grown_bytes;
use crate::state::key::{Key, KeySet};
use crate::state::runs::{
    merge_rows, BloomFilter, Lookup, LookupStats, MergeCursor, Pages, Run, RunChunks, RunSet,
    DEFAULT_FPP,
};

/// The least memory budget: 1 MiB, a few thousand rows of a wide table.
pub const MIN_STATE_MEMORY: usize = 1 << 20;

/// Runs a spilling table keeps before a flush merges them (all, or all
/// but the base: see [`BASE_RATIO`]).
pub const MAX_RUNS: usize = 8;

/// A merge leaves the base alone while the runs above it hold fewer than
/// 1/BASE_RATIO of its rows (the store compactor's quarter).
const BASE_RATIO: usize = 4;

/// Bytes a memtable key costs in the index beside its row (hash map entry
/// and its share of empty buckets): how many rows a write slice takes.
const INDEX_BYTES_PER_KEY: usize = 24;

/// Heap bytes a byte key's copy in the index costs beyond its bytes (which
/// the variable-width estimate counts): the allocator's rounding and header.
const KEY_HEAP_BYTES: usize = 16;

/// Bytes a group index costs a memtable row: the slot's group (a key) and
/// its place in the group's list of slots.
const GROUP_INDEX_BYTES_PER_ROW: usize = 40;

/// Bytes a shadow or tombstone costs (a hash set entry).
const KEY_SET_BYTES: usize = 32;

/// What one probe of a mapped run is counted to touch, per column: a page.
const PAGE_BYTES: usize = 4096;

/// A run a sink kept, if there was one to keep.
type Kept = Option<Arc<Run>>;

/// Where a spilling table's runs go: in memory (tests, [`InMemoryRuns`]) or
/// to local files (`crate::store::LocalRuns`).
pub trait RunSink: Send + Sync {
    /// Keeps `run` (sorted; tombstones included unless a base) and returns
    /// the run to read it from from now on.
    fn keep(&mut self, run: Run) -> Result<Arc<Run>>;
    /// Keeps the run of the rows `chunks` give (in key order: a merge, a
    /// memtable sorted as it flushes) and returns the run to read it from.
    /// Here gathered in memory and kept; a sink of files writes them as
    /// they come, never holding the run whole.
    fn keep_chunks(&mut self, chunks: &mut dyn RunChunks) -> Result<Arc<Run>> {
        let batch = gather_chunks(chunks)?;
        let key = chunks.key_column().to_string();
        self.keep(Run::from_sorted_trusted(batch, &key, DEFAULT_FPP)?)
    }
    /// As [`Self::keep_chunks`], for a run that is read in order and never
    /// probed (a time index's merge): no filter is built, so keeping it
    /// reads none of its keys back.
    fn keep_merged(&mut self, chunks: &mut dyn RunChunks) -> Result<Arc<Run>> {
        let batch = gather_chunks(chunks)?;
        let key = chunks.key_column().to_string();
        self.keep(Run::from_sorted_trusted_unfiltered(batch, &key)?)
    }
    /// `runs` will not be read again (merged, or a checkpoint took them):
    /// what `keep` made for them may go.
    fn release(&mut self, runs: &[Arc<Run>]);
}

/// Every row `chunks` give, as one batch (a sink that keeps runs in memory).
fn gather_chunks(chunks: &mut dyn RunChunks) -> Result<RecordBatch> {
    let mut parts = Vec::new();
    while let Some(chunk) = chunks.next_chunk(usize::MAX)? {
        parts.push(chunk);
    }
    arrow_select::concat::concat_batches(chunks.schema(), &parts).map_err(arrow_err)
}

/// Runs kept as they are, in memory: for tests of the rules.
#[derive(Debug, Default)]
pub struct InMemoryRuns;

impl RunSink for InMemoryRuns {
    fn keep(&mut self, run: Run) -> Result<Arc<Run>> {
        Ok(Arc::new(run))
    }

    fn release(&mut self, _runs: &[Arc<Run>]) {}
}

/// What a spilling table did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Flushes of the memtable into a run.
    pub flushes: u64,
    /// Rows those flushes wrote, tombstones included.
    pub rows_flushed: u64,
    /// `Run::size_bytes` of the runs flushed.
    pub bytes_flushed: u64,
    /// Merges of every run into one base.
    pub merges: u64,
    /// Keys looked up in the runs (the memtable lacked them) and of them
    /// found there (a live row or a tombstone).
    pub run_probes: u64,
    pub run_hits: u64,
    /// Restores that took a mapped state file as the base run as it is
    /// (`StateTable::restore_mapped`), with no copy.
    pub bases_mapped: u64,
    /// Restored diffs taken as runs as they are (mapped, sorted).
    pub diffs_mapped: u64,
    /// Of those, the diffs whose run took the filter stored beside their
    /// file (format 3) instead of hashing their keys.
    pub filters_stored: u64,
    /// Restores whose time index took the one stored beside the full
    /// (format 5) instead of reading every row's time.
    pub times_stored: u64,
    /// Runs now, and the memtable's estimated bytes now.
    pub runs: usize,
    pub memtable_bytes: usize,
    /// Moves of the time index's entries out of memory into a run, and
    /// merges of those runs ([`StateTable::due`]).
    pub time_flushes: u64,
    pub time_merges: u64,
    /// The time index's runs now.
    pub time_runs: usize,
}

/// A checkpoint's capture as [`StateTable::checkpoint_streamed`] gives it.
#[derive(Clone, Debug)]
pub struct StreamedCapture {
    pub kind: StateKind,
    pub rows: CaptureRows,
}

/// A capture's rows: in memory, or runs to merge as they are written.
#[derive(Clone, Debug)]
pub enum CaptureRows {
    /// As [`StateTable::checkpoint`] captures them.
    Batch(RecordBatch),
    /// The merge of `runs` (newest first) with the columns of `schema`: a
    /// base (`base`: the whole state, tombstones dropped) for a full, the
    /// changes with their tombstones for a diff.
    Runs {
        runs: Vec<Arc<Run>>,
        base: bool,
        schema: SchemaRef,
    },
}

pub(super) struct Spill {
    /// `None`: no budget, the runs only a mapped restore's files, opened
    /// lazily ([`StateTable::restore_mapped`]); the memtable never flushes.
    budget: Option<usize>,
    pub(super) sink: Box<dyn RunSink>,
    pub(super) runs: RunSet,
    /// Changes since the last checkpoint that flushes moved out of the
    /// change log, newest first.
    pub(super) pending: Vec<Arc<Run>>,
    /// Live keys whose newest value is only in the runs.
    outside: usize,
    /// Keys deleted since the last flush that the runs may hold.
    pub(super) shadows: KeySet,
    /// Bytes of a row's fixed-width values; the variable-width ones are
    /// measured as they come (`var_bytes` over `var_rows`).
    fixed_row_bytes: usize,
    var_bytes: u64,
    var_rows: u64,
    pub(super) stats: SpillStats,
    probes: AtomicU64,
    hits: AtomicU64,
    /// The bytes of the mapped runs' pages lookups may leave resident
    /// ([`StateTable::with_mapped_memory`]); `None`: no bound.
    pages_limit: Option<usize>,
    /// Estimated bytes of mapped pages read since they were last released.
    pages_touched: AtomicUsize,
}

impl Spill {
    /// One batched search of the runs for `probes`, counted in the stats
    /// (a hit: a live row or a tombstone answered the probe).
    /// Its result's hits and stats are read already: the runs' pages may
    /// be released before it is used (not so for [`Lookup::to_batch`]:
    /// [`Self::gather`]).
    fn search<'a>(&'a self, probes: &'a dyn Array) -> Result<Lookup<'a>> {
        let lookup = self.runs.lookup(probes)?;
        self.count(probes.len(), lookup.stats());
        self.touched(probes.len());
        Ok(lookup)
    }

    fn count(&self, probes: usize, stats: LookupStats) {
        self.probes.fetch_add(probes as u64, Ordering::Relaxed);
        self.hits
            .fetch_add((stats.found + stats.deleted) as u64, Ordering::Relaxed);
    }

    /// The runs' rows for `probes` ([`Lookup::to_batch`]), counted in the
    /// stats; a search that may touch more of the runs' mapped pages than
    /// the table's bound on them goes in chunks of key order, the pages
    /// released after each ([`RunSet::gather_in_key_chunks`]).
    fn gather(&self, probes: &dyn Array) -> Result<(RecordBatch, BooleanArray)> {
        let chunks = self.key_chunks(probes.len());
        let (batch, found, stats) = if chunks > 1 {
            self.runs
                .gather_in_key_chunks(probes, chunks, &mut || self.release_pages())?
        } else {
            let out = self.runs.gather_in_key_chunks(probes, 1, &mut || ())?;
            self.touched(probes.len());
            out
        };
        self.count(probes.len(), stats);
        Ok((batch, found))
    }

    /// How many of `probes` the runs hold live, counted in the stats; a
    /// search that may touch more of the mapped pages than the bound goes
    /// in chunks of key order, the pages released after each (as
    /// [`Self::gather`]): an upsert of 500k keys new to the memtable read
    /// ~70 MB of a 10M-key partition's runs at once to count them.
    fn found(&self, probes: &dyn Array) -> Result<usize> {
        let chunks = self.key_chunks(probes.len());
        let stats = if chunks > 1 {
            self.runs
                .stats_in_key_chunks(probes, chunks, &mut || self.release_pages())?
        } else {
            let stats = self.runs.lookup(probes)?.stats();
            self.touched(probes.len());
            stats
        };
        self.count(probes.len(), stats);
        Ok(stats.found)
    }

    /// The chunks of key order a search of `probes` probes goes in so
    /// that each touches at most the bound's worth of mapped pages (1: no
    /// bound, or the mapped runs fit in it).
    fn key_chunks(&self, probes: usize) -> usize {
        match self.pages_limit {
            Some(limit) => self.touch_estimate(probes).div_ceil(limit.max(1)).max(1),
            None => 1,
        }
    }

    /// Bytes of the runs that lie in pages they can release.
    fn mapped_bytes(&self) -> usize {
        (self.runs.iter())
            .filter(|r| r.has_pages())
            .map(|r| r.size_bytes())
            .sum()
    }

    /// Bytes of mapped pages a search of `probes` probes may read: a page
    /// per column a probe, at most every mapped run whole. 0 without a
    /// bound, or when the mapped runs all fit in it: nothing to release.
    fn touch_estimate(&self, probes: usize) -> usize {
        let mapped = self.mapped_bytes();
        if self.pages_limit.is_none_or(|limit| mapped <= limit) {
            return 0;
        }
        let columns = self.runs.lookup_schema().fields().len();
        probes.saturating_mul(PAGE_BYTES * columns).min(mapped)
    }

    /// Counts a search of `probes` probes against the bound on mapped
    /// pages; past it, releases the runs' pages.
    pub(super) fn touched(&self, probes: usize) {
        let Some(limit) = self.pages_limit else {
            return;
        };
        let estimate = self.touch_estimate(probes);
        if estimate > 0
            && self.pages_touched.fetch_add(estimate, Ordering::Relaxed) + estimate >= limit
        {
            self.release_pages();
        }
    }

    /// Releases every run's mapped pages ([`Run::release_pages`]).
    pub(super) fn release_pages(&self) {
        self.runs.iter().for_each(|r| r.release_pages());
        self.pages_touched.store(0, Ordering::Relaxed);
    }

    fn release_all(&mut self) {
        let runs: Vec<Arc<Run>> = self
            .runs
            .iter()
            .cloned()
            .chain(self.pending.drain(..))
            .collect();
        self.sink.release(&runs);
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// Bytes of a row of `schema` in slot storage, without variable-width
/// values: each value and its validity byte.
fn fixed_row_bytes(schema: &Schema) -> usize {
    schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Boolean => 2,
            t => t.primitive_width().unwrap_or(16) + 1,
        })
        .sum()
}

fn offsets_span<O: OffsetSizeTrait>(offsets: &[O]) -> u64 {
    match (offsets.first(), offsets.last()) {
        (Some(a), Some(b)) => (b.as_usize() - a.as_usize()) as u64,
        _ => 0,
    }
}

/// Bytes of the values of a variable-width array (its slice only).
fn var_bytes(array: &dyn Array) -> u64 {
    match array.data_type() {
        DataType::Utf8 => offsets_span(array.as_string::<i32>().value_offsets()),
        DataType::LargeUtf8 => offsets_span(array.as_string::<i64>().value_offsets()),
        DataType::Binary => offsets_span(array.as_binary::<i32>().value_offsets()),
        DataType::LargeBinary => offsets_span(array.as_binary::<i64>().value_offsets()),
        _ => 0,
    }
}

/// Parses a memory size: a number of bytes, or a number with a unit as
/// Spark's byte strings take them (`k`, `m`, `g`, `t`, with or without `b`
/// or `ib`, any case; binary: `256m` and `256MB` are 256 MiB).
pub fn parse_memory(text: &str) -> Result<usize> {
    let bad = || {
        Error::Config(format!(
            "state memory '{text}' is not a size: give bytes (268435456) or a number with a \
             unit (256MB, 256m, 1GiB; binary units, as Spark reads them)"
        ))
    };
    let t = text.trim().to_ascii_lowercase();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(bad());
    }
    let n: usize = t[..digits].parse().map_err(|_| bad())?;
    let shift = match t[digits..].trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1usize << shift).ok_or_else(bad)
}

/// `budget_bytes` if a table can work within it: at least [`MIN_STATE_MEMORY`].
pub fn check_memory_budget(budget_bytes: usize) -> Result<usize> {
    if budget_bytes < MIN_STATE_MEMORY {
        return Err(Error::Config(format!(
            "state memory of {budget_bytes} bytes is below the minimum of {MIN_STATE_MEMORY} \
             bytes (1 MiB) a table needs between two flushes; raise it, or leave it unset for \
             no limit"
        )));
    }
    Ok(budget_bytes)
}

impl StateTable {
    /// Keeps at most about `budget_bytes` of rows in memory: past it, a
    /// write flushes the memtable into a sorted run that `sink` keeps
    /// (module docs). Reads, writes, deletes and checkpoints then see the
    /// memtable and the runs as one table. A budget below
    /// [`MIN_STATE_MEMORY`] is refused, naming both; so is a table with a
    /// group column but no group prefix (its groups could not be found in
    /// the runs).
    pub fn with_memory_budget(
        mut self,
        budget_bytes: usize,
        sink: Box<dyn RunSink>,
    ) -> Result<Self> {
        check_memory_budget(budget_bytes)?;
        if let Some(g) = self.group.as_ref().filter(|g| g.prefix.is_none()) {
            return Err(Error::Config(format!(
                "a state table with group column '{}' spills only if its keys begin with their \
                 group (encode_keys([group, ...])): declare it with with_group_prefix (Python: \
                 group_prefix=\"value\" or \"encoding\"), or leave the memory budget unset",
                self.schema.field(g.col).name()
            )));
        }
        self.spill = Some(self.new_spill(Some(budget_bytes), sink)?);
        self.after_write()?;
        Ok(self)
    }

    fn new_spill(&self, budget: Option<usize>, sink: Box<dyn RunSink>) -> Result<Spill> {
        Ok(Spill {
            budget,
            sink,
            runs: RunSet::new(&self.schema, self.key_column())?,
            pending: Vec::new(),
            outside: 0,
            shadows: self.key_type.new_set(),
            fixed_row_bytes: fixed_row_bytes(&self.schema),
            var_bytes: 0,
            var_rows: 0,
            stats: SpillStats::default(),
            probes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            pages_limit: None,
            pages_touched: AtomicUsize::new(0),
        })
    }

    /// Before a mapped restore of a table without a budget: its runs will
    /// be the chain's files as they are, opened lazily (no rebuild of the
    /// state in memory; lookups read only the pages of the keys they touch),
    /// with no budget over the memtable (its sink is never asked to keep a
    /// run). Not a table that spills already, nor one with a group but no
    /// group prefix (its groups could not be found in runs), which restores
    /// into memory as ever.
    pub(super) fn open_lazily(&mut self) -> Result<()> {
        if self.spill.is_none() && self.group.as_ref().is_none_or(|g| g.prefix.is_some()) {
            self.spill = Some(self.new_spill(None, Box::new(InMemoryRuns))?);
        }
        Ok(())
    }

    /// A table opened lazily ([`Self::open_lazily`]) that restores into
    /// memory again (a plain restore, or a chain that cannot be mapped), or
    /// whose memtable came to hold every live key, holds everything in
    /// memory, as a table without a budget does.
    pub(super) fn close_lazy(&mut self) {
        if self.spill.as_ref().is_some_and(|s| s.budget.is_none()) {
            self.clear_runs();
            self.spill = None;
        }
    }

    /// Bounds the pages of the table's mapped runs (its spilled runs, a
    /// mapped restore's files) that its lookups leave in the process's
    /// resident set to about `bytes`: a mapped page a lookup reads stays
    /// resident while the file is mapped, so random lookups over runs
    /// larger than the budget would end up holding them all, counted in
    /// the process's RSS (what a Spark worker's container limit sees). The
    /// table counts a page a column a probe and, past `bytes`, releases
    /// them ([`Run::release_pages`]: the page cache keeps them, a later
    /// read maps them back); a lookup that would read more goes through
    /// the runs in chunks of key order, releasing between them. Reading
    /// them back costs page faults, so a process whose page cache may stay
    /// mapped (the local runtime) leaves this unset. Needs a memory budget;
    /// at least [`MIN_STATE_MEMORY`].
    pub fn with_mapped_memory(mut self, bytes: usize) -> Result<Self> {
        let Some(spill) = self.spill.as_mut().filter(|s| s.budget.is_some()) else {
            return Err(Error::Config(
                "a bound on mapped memory needs a memory budget (state_memory=): only a table \
                 that spills maps runs as it goes"
                    .into(),
            ));
        };
        if bytes < MIN_STATE_MEMORY {
            return Err(Error::Config(format!(
                "mapped memory of {bytes} bytes is below the minimum of {MIN_STATE_MEMORY} \
                 bytes (1 MiB); give at least that, or leave it unbounded"
            )));
        }
        spill.pages_limit = Some(bytes);
        Ok(self)
    }

    /// Lets go of the pages of the table's mapped runs that reads brought
    /// into this process's resident set ([`Run::release_pages`]): a table
    /// put aside (a Spark worker's warm partition) then holds only its
    /// memtable. Reads map them back from the page cache.
    pub fn release_pages(&self) {
        if let Some(spill) = &self.spill {
            spill.release_pages();
            spill.pending.iter().for_each(|r| r.release_pages());
        }
    }

    /// The memory budget in bytes, if one was set.
    pub fn memory_budget(&self) -> Option<usize> {
        self.spill.as_ref().and_then(|s| s.budget)
    }

    /// What spilling did so far (`None` for a table that holds everything in
    /// memory: no memory budget, not opened lazily by a mapped restore).
    pub fn spill_stats(&self) -> Option<SpillStats> {
        let s = self.spill.as_ref()?;
        Some(SpillStats {
            run_probes: s.probes.load(Ordering::Relaxed),
            run_hits: s.hits.load(Ordering::Relaxed),
            runs: s.runs.len(),
            memtable_bytes: self.memtable_bytes(s),
            time_runs: self.time_runs(),
            ..s.stats
        })
    }

    /// Live keys whose newest value is only in the runs.
    pub(super) fn outside_len(&self) -> usize {
        self.spill.as_ref().map_or(0, |s| s.outside)
    }

    /// Whether reads must look past the memtable.
    pub(super) fn has_runs(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| !s.runs.is_empty())
    }

    /// Rows of the pending runs (changes since the last checkpoint that
    /// flushes moved out of the change log).
    pub(super) fn pending_rows(&self) -> usize {
        self.spill
            .as_ref()
            .map_or(0, |s| s.pending.iter().map(|r| r.len()).sum())
    }

    /// Whether the changes since the last checkpoint are partly in pending runs.
    fn has_pending(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| !s.pending.is_empty())
    }

    /// The memtable's memory: what its slots, change log and index
    /// allocated (capacities: a vector grown by doubling, a hash table
    /// with room to spare, a cleared log that kept its room), the heap
    /// bytes of its variable-width values (measured as they come), and
    /// the group index's and key sets' estimates.
    fn memtable_bytes(&self, s: &Spill) -> usize {
        let var = s.var_bytes.checked_div(s.var_rows).unwrap_or(0) as usize;
        let group = if self.group.is_some() {
            GROUP_INDEX_BYTES_PER_ROW
        } else {
            0
        };
        let key_bytes = if self.key_type.is_int() {
            0
        } else {
            KEY_HEAP_BYTES
        };
        self.columns
            .iter()
            .map(|c| c.allocated_bytes())
            .sum::<usize>()
            + self.log.allocated_bytes()
            + self.index.allocated_bytes()
            + self.occupied.capacity()
            + self.free.capacity() * std::mem::size_of::<u32>()
            + (self.occupied.len() + self.log.len()) * var
            + self.occupied.len() * (group + key_bytes)
            + (s.shadows.len() + self.tombstones.len()) * KEY_SET_BYTES
            + self.time.as_ref().map_or(0, |t| {
                // Without a budget no sink writes the index's runs: a
                // restored base's times are held as one run in memory.
                t.memory_bytes()
                    + if s.budget.is_none() {
                        t.runs_bytes()
                    } else {
                        0
                    }
            })
    }

    /// Before `arrays` (schema order) are upserted: measures their
    /// variable-width values; keys new to the memtable that the runs hold
    /// leave `outside`, and a shadow of an upserted key goes (its new row
    /// hides the runs' from now on).
    pub(super) fn before_upsert(
        &mut self,
        arrays: &[ArrayRef],
        present: Option<&BooleanArray>,
    ) -> Result<()> {
        let key_col = self.key_col;
        let Some(spill) = self.spill.as_mut() else {
            return Ok(());
        };
        let rows = arrays.first().map_or(0, |a| a.len()) as u64;
        spill.var_bytes += arrays.iter().map(|a| var_bytes(a.as_ref())).sum::<u64>();
        spill.var_rows += rows;
        if spill.runs.is_empty() && spill.shadows.len() == 0 {
            return Ok(());
        }
        let keys = arrays[key_col].as_ref();
        let slots = self.index.slots_of(keys);
        let absent: Vec<u32> = (0..slots.len() as u32)
            .filter(|&i| slots[i as usize].is_none())
            .collect();
        if absent.is_empty() {
            return Ok(());
        }
        let probes = arrow_select::take::take(keys, &UInt32Array::from(absent.clone()), None)
            .map_err(arrow_err)?;
        let name = self.schema.field(key_col).name();
        let mut seen = HashSet::new();
        let mut ask = Vec::new();
        for (&row, key) in absent
            .iter()
            .zip(self.key_type.keys(name, probes.as_ref())?)
        {
            if !seen.insert(key.clone()) {
                continue;
            }
            if spill.shadows.contains(&key) {
                // Deleted since the flush: not counted in `outside`.
                spill.shadows.remove(&key);
            } else if let Some(present) = present {
                // Looked up just now: a key new to memory that no shadow
                // hides was found in the runs exactly when it was present.
                spill.outside -= usize::from(present.value(row as usize));
            } else {
                ask.push(key);
            }
        }
        if ask.is_empty() || spill.runs.is_empty() {
            return Ok(());
        }
        let asked = self.key_type.array(&ask);
        let found = spill.found(asked.as_ref())?;
        spill.outside -= found;
        Ok(())
    }

    /// Rows one upsert writes before the memtable is checked against the
    /// budget: a quarter of the budget's worth (at least 1,024 rows), or
    /// every row without a budget.
    pub(super) fn upsert_slice_rows(&self, arrays: &[ArrayRef]) -> usize {
        let Some((spill, budget)) = self.spill.as_ref().and_then(|s| Some((s, s.budget?))) else {
            return usize::MAX;
        };
        let rows = arrays.first().map_or(0, |a| a.len()).max(1);
        let var = arrays.iter().map(|a| var_bytes(a.as_ref())).sum::<u64>() as usize / rows;
        // A row's bytes in the slots and in the change log, and its index
        // entries (the key's, and the group's if the table has one).
        let group = if self.group.is_some() {
            GROUP_INDEX_BYTES_PER_ROW
        } else {
            0
        };
        let row = 2 * (spill.fixed_row_bytes + var) + INDEX_BYTES_PER_KEY + group + 1;
        (budget / 4 / row).max(1024)
    }

    /// Before `rows` rows are written: flushes the memtable first if the
    /// room they may take would carry it past the budget (each a new key:
    /// the slots, the change log and the index short of room grow to
    /// about twice their size). Checked only after the write, one slice
    /// near the budget could double the memtable past it, the old vectors
    /// still held while they were copied: 150 MB over a 128 MB memtable
    /// (issue 37: a Spark worker's peak within its budget).
    pub(super) fn before_write(&mut self, rows: usize) -> Result<()> {
        let Some(budget) = self.spill.as_ref().and_then(|s| s.budget) else {
            return Ok(());
        };
        if self.index.len() == 0 && self.log.len() == 0 {
            return Ok(());
        }
        let slots = self.occupied.len() + rows.saturating_sub(self.free.len());
        let slot_bytes = self
            .columns
            .iter()
            .map(|c| c.allocated_bytes())
            .sum::<usize>()
            + self.occupied.capacity();
        let logged = if self.logging() { rows } else { 0 };
        let spill = self.spill.as_ref().expect("checked above");
        // Variable-width values at the average seen so far, in the slots
        // and in the log, as `memtable_bytes` counts them.
        let var = spill.var_bytes.checked_div(spill.var_rows).unwrap_or(0) as usize;
        let growth = grown_bytes(slot_bytes, self.occupied.capacity(), slots)
            + self.log.growth_bytes(logged, slots)
            + self.index.growth_bytes(rows)
            + (rows + logged) * var;
        if self.memtable_bytes(spill) + growth > budget {
            self.flush()?;
        }
        Ok(())
    }

    /// After a write: flushes the memtable if it outgrew the budget.
    pub(super) fn after_write(&mut self) -> Result<()> {
        let over = (self.spill.as_ref())
            .is_some_and(|s| s.budget.is_some_and(|b| self.memtable_bytes(s) > b));
        if over {
            return self.flush();
        }
        // Opened lazily and every live key rewritten since: the runs hold
        // nothing a read needs, and pin the mapped files (which retention
        // may have deleted) for nothing.
        if (self.spill.as_ref()).is_some_and(|s| s.budget.is_none() && s.outside == 0) {
            self.close_lazy();
        }
        Ok(())
    }

    /// Deletes `keys` that the memtable lacks from the runs (each at most
    /// once, the shadowed ones already gone); returns how many were live.
    pub(super) fn delete_from_runs(&mut self, keys: Vec<Key>) -> Result<usize> {
        let logging = self.logging();
        let Some(spill) = self.spill.as_mut() else {
            return Ok(0);
        };
        let mut seen = HashSet::new();
        let ask: Vec<Key> = keys
            .into_iter()
            .filter(|k| !spill.shadows.contains(k) && seen.insert(k.clone()))
            .collect();
        if ask.is_empty() {
            return Ok(0);
        }
        let asked = self.key_type.array(&ask);
        let hits = spill.search(asked.as_ref())?.hits().to_vec();
        let mut removed = 0;
        for (key, hit) in ask.into_iter().zip(hits) {
            if hit.is_some() {
                spill.outside -= 1;
                spill.shadows.insert(key.clone());
                if logging {
                    self.tombstones.insert(key);
                }
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// A key deleted from the memtable: the runs may hold an older row.
    pub(super) fn shadow(&mut self, key: &Key) {
        if let Some(spill) = self.spill.as_mut().filter(|s| !s.runs.is_empty()) {
            spill.shadows.insert(key.clone());
        }
    }

    /// `StateTable::lookup` with runs: the memtable's rows, and for the keys
    /// it lacks that no shadow hides, the runs' (one batched search).
    pub(super) fn lookup_with_runs(&self, keys: &dyn Array) -> Result<(RecordBatch, BooleanArray)> {
        let spill = self.spill.as_ref().expect("a table with runs spills");
        let n = keys.len();
        let slots = self.index.slots_of(keys);
        let hidden: Vec<bool> = if spill.shadows.len() == 0 {
            vec![false; n]
        } else {
            self.key_type
                .keys(self.key_column(), keys)?
                .iter()
                .map(|k| spill.shadows.contains(k))
                .collect()
        };
        let ask: Vec<u32> = (0..n as u32)
            .filter(|&i| slots[i as usize].is_none() && !hidden[i as usize])
            .collect();
        let probes = arrow_select::take::take(keys, &UInt32Array::from(ask.clone()), None)
            .map_err(arrow_err)?;
        let (from_runs, found_in_runs) = spill.gather(probes.as_ref())?;
        let in_memory: Vec<u32> = slots.iter().flatten().copied().collect();
        // Per asked key: (0, memtable row), (1, probe) or (2, 0): a null row.
        let mut picks = Vec::with_capacity(n);
        let mut present = Vec::with_capacity(n);
        let (mut mem, mut probe) = (0usize, 0usize);
        for (i, slot) in slots.iter().enumerate() {
            if slot.is_some() {
                picks.push((0, mem));
                present.push(true);
                mem += 1;
            } else if !hidden[i] {
                let found = found_in_runs.value(probe);
                picks.push(if found { (1, probe) } else { (2, 0) });
                present.push(found);
                probe += 1;
            } else {
                picks.push((2, 0));
                present.push(false);
            }
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for (i, column) in self.columns.iter().enumerate() {
            if i == self.key_col {
                arrays.push(make_array(keys.to_data()));
                continue;
            }
            let mine = column.gather(&in_memory);
            let null = new_null_array(self.schema.field(i).data_type(), 1);
            let sources = [mine.as_ref(), from_runs.column(i).as_ref(), null.as_ref()];
            arrays.push(interleave(&sources, &picks).map_err(arrow_err)?);
        }
        let batch = RecordBatch::try_new(self.lookup_schema.clone(), arrays)
            .expect("columns match the lookup schema");
        Ok((batch, BooleanArray::from(present)))
    }

    /// Every key the memtable deleted since the last flush, once.
    fn deleted_since_flush(&self) -> Vec<Key> {
        let mut keys: HashSet<Key> = self.tombstones.to_vec().into_iter().collect();
        if let Some(s) = &self.spill {
            keys.extend(s.shadows.to_vec());
        }
        keys.into_iter().collect()
    }

    /// The memtable as a run: its live rows and a tombstone for every key
    /// deleted since the last flush (`None` if it holds neither).
    fn memtable_run(&self) -> Result<Option<Run>> {
        let live = self.live_slots();
        let dead = self.deleted_since_flush();
        if live.is_empty() && dead.is_empty() {
            return Ok(None);
        }
        let batch = self.diff_batch(&self.columns, &live, &dead);
        Run::from_unsorted(batch, self.key_column(), DEFAULT_FPP).map(Some)
    }

    /// The change log (changes since the last checkpoint or flush) as a run.
    pub(super) fn log_run(&self) -> Result<Option<Run>> {
        let live = self.log.live();
        let dead = self.tombstones.to_vec();
        if live.is_empty() && dead.is_empty() {
            return Ok(None);
        }
        let batch = self.diff_batch(&self.log.columns, &live, &dead);
        Run::from_unsorted(batch, self.key_column(), DEFAULT_FPP).map(Some)
    }

    /// Moves the memtable into a run (and, while logging, its changes since
    /// the last checkpoint into a pending run), then empties it, giving its
    /// memory back; past [`MAX_RUNS`] runs merges them into one base.
    pub fn flush(&mut self) -> Result<()> {
        if self.memory_budget().is_none() {
            return Err(Error::Config(
                "flush needs a memory budget (StateTable::with_memory_budget)".into(),
            ));
        }
        let dead = self.deleted_since_flush();
        // The sink is borrowed mutably while the rows it keeps are read from
        // the table: the spill is out of the table meanwhile.
        let mut spill = self.spill.take().expect("checked above");
        let kept = self.keep_memtable(&mut spill, dead);
        self.spill = Some(spill);
        let (run, pending) = kept?;
        let len = self.len();
        let spill = self.spill.as_mut().expect("checked above");
        if let Some(run) = run {
            spill.stats.flushes += 1;
            spill.stats.rows_flushed += run.len() as u64;
            spill.stats.bytes_flushed += run.size_bytes() as u64;
            spill.runs.push_newest(run)?;
        }
        if let Some(changes) = pending {
            spill.pending.insert(0, changes);
        }
        spill.outside = len;
        spill.shadows.drain();
        if spill.runs.len() > MAX_RUNS {
            // As the store's compactor: the runs above the base merge into one
            // diff run while they hold under a quarter of the base's rows (a
            // base of 10M keys is not rewritten for every few flushes); past
            // that, or with no base, every run merges into a new base.
            let end = spill.runs.len();
            let runs = spill.runs.runs();
            let above: usize = runs[..end - 1].iter().map(|r| r.len()).sum();
            let oldest = &runs[end - 1];
            let upto = if oldest.is_base() && above * BASE_RATIO < oldest.len() {
                end - 1
            } else {
                end
            };
            let inputs: Vec<&Run> = runs[..upto].iter().map(|r| r.as_ref()).collect();
            let kept = spill
                .sink
                .keep_chunks(&mut MergeCursor::new(&inputs, upto == end)?)?;
            let old = spill.runs.replace(0..upto, kept)?;
            crate::failpoint::hit("spill.merged");
            spill.sink.release(&old);
            spill.stats.merges += 1;
        }
        self.empty_memtable();
        // The memtable and the flush's copies were freed: hand them back now,
        // not when the allocator next gets round to it.
        crate::heap::release_freed();
        Ok(())
    }

    /// Checkpoint `id` as [`Self::checkpoint`] takes it, its capture left
    /// for the writer to merge as it writes when runs hold the state (a
    /// table with a memory budget that flushed): the memtable and the
    /// change log are flushed first, so the capture is the merge of runs
    /// only ([`CaptureRows::Runs`]), which `crate::store::write_state_runs`
    /// writes a chunk at a time, never holding it whole as
    /// [`Self::checkpoint`]'s batch would (a full of 20M keys under a
    /// 256 MB budget). In confirmed-base mode (the local runtime) a diff
    /// keeps the memtable and is the change log sorted into a run with the
    /// flushed and unconfirmed changes (`checkpoint_streamed_confirmed`).
    /// Otherwise the capture is [`Self::checkpoint`]'s, in memory. The rows
    /// are the same either way.
    pub fn checkpoint_streamed(&mut self, id: CheckpointId) -> Result<StreamedCapture> {
        let streams = self.has_runs() && self.memory_budget().is_some();
        if streams && self.confirm.is_some() {
            self.check_next_id(id)?;
            return self.checkpoint_streamed_confirmed(id);
        }
        if !streams {
            let capture = self.checkpoint(id)?;
            return Ok(StreamedCapture {
                kind: capture.kind,
                rows: CaptureRows::Batch(capture.batch),
            });
        }
        self.check_next_id(id)?;
        let full = self.next_is_full();
        self.flush()?;
        let spill = self.spill.as_ref().expect("a table with runs spills");
        let (kind, rows) = if full {
            let runs = spill.runs.runs().to_vec();
            let schema = self.schema.clone();
            (
                StateKind::Full,
                CaptureRows::Runs {
                    runs,
                    base: true,
                    schema,
                },
            )
        } else {
            let base = self.last_checkpoint.expect("a diff has a base");
            let rows = if spill.pending.is_empty() {
                // Nothing changed since the last checkpoint.
                CaptureRows::Batch(self.log_changes())
            } else {
                let runs = spill.pending.clone();
                let schema = self.diff_schema.clone();
                CaptureRows::Runs {
                    runs,
                    base: false,
                    schema,
                }
            };
            (StateKind::Diff { base }, rows)
        };
        let rows = self.rows_with_capture_metadata(kind, rows);
        self.checkpoint_taken(id, kind);
        Ok(StreamedCapture { kind, rows })
    }

    /// A capture's rows with its metadata, as [`Self::checkpoint`] names its
    /// batch (`StateTable::with_capture_metadata`).
    pub(super) fn rows_with_capture_metadata(
        &self,
        kind: StateKind,
        rows: CaptureRows,
    ) -> CaptureRows {
        match rows {
            CaptureRows::Batch(batch) => {
                CaptureRows::Batch(self.batch_with_capture_metadata(kind, &batch))
            }
            CaptureRows::Runs { runs, base, schema } => CaptureRows::Runs {
                runs,
                base,
                schema: self.capture_schema(kind, &schema),
            },
        }
    }

    /// The memtable kept by `spill`'s sink as a run (its live rows and a
    /// tombstone for each of `dead`), and, while logging, the changes since
    /// the last checkpoint as a pending run; each read in key order a chunk
    /// at a time ([`SortedSlots`]), so a sink of files writes it with no
    /// sorted copy of the memtable beside it.
    fn keep_memtable(&self, spill: &mut Spill, dead: Vec<Key>) -> Result<(Kept, Kept)> {
        let mut keep = |columns, live, dead| -> Result<Kept> {
            match SortedSlots::new(self, columns, live, dead)? {
                Some(mut rows) => spill.sink.keep_chunks(&mut rows).map(Some),
                None => Ok(None),
            }
        };
        let run = keep(&self.columns, self.live_slots(), dead)?;
        let pending = if self.logging() {
            keep(&self.log.columns, self.log.live(), self.tombstones.to_vec())?
        } else {
            None
        };
        Ok((run, pending))
    }

    /// The state as one full batch when runs hold part of it.
    pub(super) fn full_with_runs(&self) -> Result<RecordBatch> {
        let spill = self.spill.as_ref().expect("a table with runs spills");
        self.merged(self.memtable_run()?, spill.runs.runs(), self.schema.clone())
    }

    /// The changes since the last checkpoint when flushes moved some of
    /// them into pending runs: those and the change log, merged.
    pub(super) fn changes_with_pending(&self) -> Result<RecordBatch> {
        let spill = self.spill.as_ref().expect("pending runs spill");
        self.merged(self.log_run()?, &spill.pending, self.diff_schema.clone())
    }

    /// `newest` over `older` (newest first) merged into one batch of
    /// `schema`: the table's (a base: tombstones dropped, since `older` ends
    /// with the oldest run) or the diff schema (tombstones kept).
    fn merged(
        &self,
        newest: Option<Run>,
        older: &[Arc<Run>],
        schema: arrow_schema::SchemaRef,
    ) -> Result<RecordBatch> {
        let inputs: Vec<&Run> = newest
            .iter()
            .chain(older.iter().map(|r| r.as_ref()))
            .collect();
        let base = schema.column_with_name(super::DELETED_COLUMN).is_none();
        let merged = merge_rows(&inputs, base)?;
        RecordBatch::try_new(schema, merged.columns().to_vec()).map_err(arrow_err)
    }

    /// The changes since the last checkpoint, wherever they are.
    pub(super) fn interval_changes(&self) -> Result<RecordBatch> {
        if self.has_pending() {
            return self.changes_with_pending();
        }
        if self.last_checkpoint.is_none() && self.has_runs() {
            // Before the first checkpoint everything changed.
            let full = self.full_with_runs()?;
            let mut columns = full.columns().to_vec();
            columns.push(Arc::new(BooleanArray::from(vec![false; full.num_rows()])));
            return RecordBatch::try_new(self.diff_schema.clone(), columns).map_err(arrow_err);
        }
        Ok(self.log_changes())
    }

    /// A checkpoint took the changes: the pending runs are done with.
    pub(super) fn drop_pending(&mut self) {
        if let Some(spill) = self.spill.as_mut() {
            let done: Vec<Arc<Run>> = spill.pending.drain(..).collect();
            spill.sink.release(&done);
        }
    }

    /// A restore's full state becomes the table's one run, a base, sorted
    /// once and kept by the sink (a local file, mapped): no row goes through
    /// the memtable, so the restore holds the capture and the run, never the
    /// table in memory as well. The table must be empty.
    ///
    /// `mapped`: the batch's buffers are a mapped file that no one writes
    /// again (a state file of the root, `StateTable::restore_mapped`): sorted
    /// already, it becomes the base as it is, costing page cache, not heap,
    /// and no copy; else (or unsorted) the sink keeps a sorted copy. A table
    /// opened lazily has no sink to keep a copy: it adopts nothing then and
    /// returns `false` (the caller restores it into memory).
    pub(super) fn adopt_base(
        &mut self,
        full: &RecordBatch,
        mapped: bool,
        pages: Option<Arc<dyn Pages>>,
    ) -> Result<bool> {
        let arrays = self.columns_of(full)?;
        self.key_type
            .check(self.key_column(), arrays[self.key_col].as_ref())?;
        if arrays[self.key_col].is_empty() {
            return Ok(true);
        }
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(arrow_err)?;
        let rows = batch.num_rows();
        // A mapped file sorted already (every state file a table writes) is
        // taken as it is, with no filter (`Run::from_sorted_unfiltered`).
        let key = self.key_column().to_string();
        let as_is = mapped
            .then(|| Run::from_sorted_unfiltered(batch.clone(), &key, "a mapped full"))
            .and_then(Result::ok)
            .map(|run| match pages {
                Some(pages) => run.with_pages(pages),
                None => run,
            });
        let spill = self
            .spill
            .as_mut()
            .expect("only a spilling table adopts a base");
        let kept = match as_is {
            Some(base) => {
                spill.stats.bases_mapped += 1;
                Arc::new(base)
            }
            None if spill.budget.is_none() => return Ok(false),
            None => {
                let base = Run::from_unsorted(batch, &key, DEFAULT_FPP)?;
                spill.sink.keep(base)?
            }
        };
        spill.runs.push_newest(kept)?;
        spill.outside = rows;
        Ok(true)
    }

    /// Takes a restored diff (the chain's next, after the runs adopted so
    /// far and before any row in the memtable) as one more run as it is, if
    /// the table has room for it and it is a run already: sorted by key
    /// (every state file a table writes is) with `__deleted` last. Its keys
    /// are looked up in the older runs once, to count the live keys it adds
    /// and removes; a time index notes its rows' times (a tombstone's key
    /// leaves memory; its entries in the index's runs no longer match a
    /// row). Returns whether it did; if not, the caller applies the
    /// diff through the memtable (and every diff after it: a run adopted
    /// later would read as older than the memtable's rows).
    ///
    /// `filter`: the diff's filter as stored beside its file (`what` names
    /// it); one that lacks a key of the diff is an error, not a fallback.
    pub(super) fn adopt_diff(
        &mut self,
        diff: &RecordBatch,
        filter: Option<&BloomFilter>,
        what: &str,
        pages: Option<Arc<dyn Pages>>,
    ) -> Result<bool> {
        let room = self
            .spill
            .as_ref()
            .is_some_and(|s| s.runs.len() + 2 <= MAX_RUNS && !s.runs.is_empty());
        if !room || self.index.len() > 0 {
            return Ok(false);
        }
        // The diff's columns by name, in the diff schema's order (a tombstone's
        // values are nulls; `__deleted` last); anything else is applied instead.
        let arrays: Option<Vec<ArrayRef>> = self
            .diff_schema
            .fields()
            .iter()
            .map(|f| {
                diff.column_by_name(f.name())
                    .filter(|c| c.data_type() == f.data_type())
                    .cloned()
            })
            .collect();
        let Some(Ok(batch)) = arrays.map(|a| RecordBatch::try_new(self.diff_schema.clone(), a))
        else {
            return Ok(false);
        };
        let key = self.key_column().to_string();
        // The time index learns the diff's rows: a tombstone's key leaves it.
        let timed = self.time.as_ref().map(|_| batch.columns().to_vec());
        let run = match filter {
            Some(filter) => match Run::from_sorted_unfiltered(batch, &key, what) {
                Ok(run) => run.with_filter(filter.clone(), what)?,
                Err(_) => return Ok(false),
            },
            None => match Run::from_sorted(batch, &key, DEFAULT_FPP, what) {
                Ok(run) => run,
                Err(_) => return Ok(false),
            },
        };
        let run = match pages {
            Some(pages) => run.with_pages(pages),
            None => run,
        };
        let stored = diff.schema().metadata().get(LIVE_KEYS_METADATA).cloned();
        let spill = self
            .spill
            .as_mut()
            .expect("only a spilling table adopts a diff");
        let live = match stored {
            Some(n) => stored_live_keys(&n, spill.outside, &run, what)?,
            None => {
                // Written without the count: each key looked up once.
                let keys = run.keys();
                let was_live = spill.search(keys.as_ref())?.found();
                let mut live = spill.outside;
                for (row, was) in was_live.values().iter().enumerate() {
                    let now = !run.is_deleted(row);
                    match (was, now) {
                        (false, true) => live += 1,
                        (true, false) => live -= 1,
                        _ => {}
                    }
                }
                live
            }
        };
        spill.runs.push_newest(run)?;
        spill.outside = live;
        spill.stats.diffs_mapped += 1;
        spill.stats.filters_stored += u64::from(filter.is_some());
        if let Some(mut arrays) = timed {
            let col = self.time.as_ref().expect("timed only with an index").col;
            let deleted = arrays.pop().expect("a diff ends with __deleted");
            arrays[col] = arrow_select::nullif::nullif(arrays[col].as_ref(), deleted.as_boolean())
                .map_err(arrow_err)?;
            self.note_times(&arrays)?;
        }
        Ok(true)
    }

    /// Forgets the runs (a `clear`, a restore).
    pub(super) fn clear_runs(&mut self) {
        if let Some(spill) = self.spill.as_mut() {
            spill.release_all();
            spill.runs = RunSet::new(&self.schema, self.schema.field(self.key_col).name())
                .expect("the table's schema made a run set before");
            spill.outside = 0;
            spill.shadows.drain();
        }
    }
}

/// The live keys a diff's file says its table held ([`LIVE_KEYS_METADATA`]),
/// checked against what applying the diff to `before` live keys can give:
/// its upserts are live, and it adds at most them and removes at most its
/// tombstones. Anything else is an error naming the file, not a guess.
fn stored_live_keys(stored: &str, before: usize, diff: &Run, what: &str) -> Result<usize> {
    let deletes = diff.tombstone_count();
    let upserts = diff.len() - deletes;
    let low = before.saturating_sub(deletes).max(upserts);
    let high = before + upserts;
    match stored.parse::<usize>() {
        Ok(n) if (low..=high).contains(&n) => Ok(n),
        _ => Err(Error::Snapshot(format!(
            "{what}: its '{LIVE_KEYS_METADATA}' metadata says {stored:?} live keys, which this \
             diff ({upserts} upserts, {deletes} deletes) cannot leave on the {before} keys \
             before it (between {low} and {high}); the chain's files do not belong together: \
             restore from another checkpoint"
        ))),
    }
}
