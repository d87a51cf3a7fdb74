//! Compaction's rule: runs that are next to each other in a set, newest
//! first, become one run that answers every lookup as they did together.
//! A k-way merge by key: for a key in several runs the newest row wins,
//! a live row or a tombstone alike. Tombstones stay, since they still hide
//! the key in the runs older than the merged ones, unless the merged runs
//! end with the oldest: nothing is older then, so they are dropped and the
//! output is a base (no `__deleted` column, see [`super::run`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use arrow_array::{make_array, new_empty_array, ArrayRef, BooleanArray, RecordBatch};
use arrow_data::transform::MutableArrayData;
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::keys::{partition_point, KeyColumn, KeyRef};
use super::run::{check_columns, Run};
use crate::error::{Error, Result};
use crate::state::table::DELETED_COLUMN;

/// Sizes in and out of one merge: its write amplification is
/// `bytes_out / bytes_in` of the merged levels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeStats {
    pub runs_in: usize,
    /// Rows read, tombstones included.
    pub rows_in: usize,
    /// Rows written, tombstones included.
    pub rows_out: usize,
    /// Tombstones dropped (merges into the oldest run only).
    pub tombstones_dropped: usize,
    /// [`Run::size_bytes`] of the inputs and of the output.
    pub bytes_in: usize,
    pub bytes_out: usize,
}

/// A merge's output run and what it cost.
#[derive(Clone, Debug)]
pub struct Merged {
    pub run: Run,
    pub stats: MergeStats,
}

/// Merges `runs` (newest first; a base only last) into one run with filter
/// false-positive probability `fpp`. `drop_tombstones` when the last of
/// `runs` is the oldest of its set: the output is then a base. The runs must
/// share their columns and key.
pub fn merge(runs: &[&Run], drop_tombstones: bool, fpp: f64) -> Result<Merged> {
    let mut cursor = MergeCursor::new(runs, drop_tombstones)?;
    let batch = cursor.rest()?;
    let run = Run::from_sorted_trusted(batch, runs[0].key_column(), fpp)?;
    let stats = MergeStats {
        runs_in: runs.len(),
        rows_in: runs.iter().map(|r| r.len()).sum(),
        rows_out: run.len(),
        tombstones_dropped: cursor.tombstones_dropped,
        bytes_in: runs.iter().map(|r| r.size_bytes()).sum(),
        bytes_out: run.size_bytes(),
    };
    Ok(Merged { run, stats })
}

/// As [`merge`], its rows only: no run is made of them, so no filter is
/// built (a compaction writes the rows to a file, and a diff's stored
/// filter is built from the file as written).
pub fn merge_rows(runs: &[&Run], drop_tombstones: bool) -> Result<RecordBatch> {
    MergeCursor::new(runs, drop_tombstones)?.rest()
}

/// Rows of a sorted run in the making, read in key order a chunk at a
/// time, so that a run larger than memory can be written as it is made
/// (`crate::store::StreamedFile`): a merge of runs ([`MergeCursor`]), a
/// memtable sorted as it flushes.
pub trait RunChunks {
    /// The rows' columns.
    fn schema(&self) -> &SchemaRef;
    /// The key column's name.
    fn key_column(&self) -> &str;
    /// The next at most `max_rows` rows, in key order; `None` once every
    /// row was read.
    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordBatch>>;
    /// Lets go of the resident pages of the inputs read so far (mapped
    /// runs, [`Run::release_pages`]); nothing by default.
    fn release_inputs(&self) {}
}

/// A merge of `runs` (as [`merge`]'s) read a chunk of rows at a time, so
/// that its output can be written as it is made (a run larger than memory,
/// `crate::store::StreamedFile`) instead of held whole: the merge holds
/// its heap of one key a run, and a chunk.
pub struct MergeCursor<'a> {
    runs: &'a [&'a Run],
    columns: Vec<KeyColumn<'a>>,
    /// Each run's next key, the newest run first among equal keys.
    heap: BinaryHeap<Reverse<(KeyRef<'a>, usize, usize)>>,
    last: Option<KeyRef<'a>>,
    drop_tombstones: bool,
    schema: SchemaRef,
    tombstones_dropped: usize,
}

impl<'a> MergeCursor<'a> {
    pub fn new(runs: &'a [&'a Run], drop_tombstones: bool) -> Result<Self> {
        check_inputs(runs)?;
        let columns = runs
            .iter()
            .map(|r| KeyColumn::new(r.keys().as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let heap = columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.len() > 0)
            .map(|(run, c)| Reverse((c.at(0), run, 0)))
            .collect();
        Ok(Self {
            schema: merged_schema(runs[0], drop_tombstones),
            runs,
            columns,
            heap,
            last: None,
            drop_tombstones,
            tombstones_dropped: 0,
        })
    }

    /// Every row not read yet, as one batch.
    fn rest(&mut self) -> Result<RecordBatch> {
        let picks = self.next_picks(usize::MAX);
        self.gather(&picks)
    }

    /// Tombstones dropped so far (merges into the oldest run only).
    pub fn tombstones_dropped(&self) -> usize {
        self.tombstones_dropped
    }

    /// The next at most `max` keys, in key order, as ranges of rows of
    /// each key's newest row: a k-way merge on a heap of each run's next
    /// key, ties going to the lowest run index (the newest). A run whose
    /// next keys all lie below every other run's next key (a base between
    /// a few changed keys) gives them as one range, found by a galloping
    /// search, without a heap operation per row.
    fn next_picks(&mut self, max: usize) -> Picks {
        let mut picks = Picks::default();
        while picks.rows < max {
            let Some(Reverse((key, run, row))) = self.heap.pop() else {
                break;
            };
            let (runs, drop) = (self.runs, self.drop_tombstones);
            let dropped = &mut self.tombstones_dropped;
            if self.last != Some(key) {
                self.last = Some(key);
                pick(runs, drop, dropped, &mut picks, run, row);
            }
            let column = &self.columns[run];
            let mut next = row + 1;
            if next < column.len() {
                // Keys strictly below the other runs' smallest next key are
                // this run's alone: no tie to settle, none seen before.
                let end = match self.heap.peek() {
                    None => column.len(),
                    Some(Reverse((bound, _, _))) => gallop(column, next, |k| k < *bound),
                };
                let end = end.min(next.saturating_add(max - picks.rows));
                if end > next {
                    if drop && runs[run].tombstones().is_some() {
                        for r in next..end {
                            pick(runs, drop, dropped, &mut picks, run, r);
                        }
                    } else {
                        picks.push_range(run, next, end);
                    }
                    self.last = Some(column.at(end - 1));
                    next = end;
                }
                if next < column.len() {
                    self.heap.push(Reverse((column.at(next), run, next)));
                }
            }
        }
        picks
    }

    /// The picked rows as a batch of [`Self::schema`].
    fn gather(&self, picks: &Picks) -> Result<RecordBatch> {
        let runs = self.runs;
        let first = runs[0];
        let mut arrays = Vec::with_capacity(self.schema.fields().len());
        for (col, field) in first.data_fields().iter().enumerate() {
            arrays.push(gather(runs, col, field.data_type(), picks)?);
        }
        if !self.drop_tombstones {
            let deleted: BooleanArray = picks
                .ranges
                .iter()
                .flat_map(|&(run, start, end)| (start..end).map(move |row| (run, row)))
                .map(|(run, row)| Some(runs[run].is_deleted(row)))
                .collect();
            arrays.push(Arc::new(deleted));
        }
        RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| Error::Snapshot(format!("assembling a merged run: {e}")))
    }
}

/// The rows a merge picked, in key order, as ranges `(run, start, end)` of
/// consecutive rows of one run, so that they are copied a range at a time.
#[derive(Default)]
struct Picks {
    ranges: Vec<(usize, usize, usize)>,
    rows: usize,
}

impl Picks {
    fn push(&mut self, run: usize, row: usize) {
        self.push_range(run, row, row + 1);
    }

    /// Rows `start..end` of `run`.
    fn push_range(&mut self, run: usize, start: usize, end: usize) {
        self.rows += end - start;
        match self.ranges.last_mut() {
            Some((r, _, last)) if *r == run && *last == start => *last = end,
            _ => self.ranges.push((run, start, end)),
        }
    }

    fn is_empty(&self) -> bool {
        self.rows == 0
    }
}

/// Takes row `row` of `run` into `picks`, or drops it (counted in
/// `dropped`): a tombstone when tombstones are dropped (`drop`).
fn pick(runs: &[&Run], drop: bool, dropped: &mut usize, picks: &mut Picks, run: usize, row: usize) {
    if drop && runs[run].is_deleted(row) {
        *dropped += 1;
    } else {
        picks.push(run, row);
    }
}

/// The first row at or after `from` whose key fails `below` (which holds
/// for a prefix of the rows from `from` on): doubling steps, then a binary
/// search, so a stretch of `n` rows costs O(log n) comparisons.
fn gallop(column: &KeyColumn<'_>, from: usize, below: impl Fn(KeyRef<'_>) -> bool) -> usize {
    let len = column.len();
    let mut lo = from;
    let mut step = 1;
    while lo + step < len && below(column.at(lo + step)) {
        lo += step;
        step *= 2;
    }
    if lo >= len || !below(column.at(lo)) {
        return lo;
    }
    partition_point(lo + 1, (lo + step).min(len), |i| below(column.at(i)))
}

impl RunChunks for MergeCursor<'_> {
    /// The runs' columns (values nullable: a tombstone has only its key),
    /// then `__deleted` unless tombstones are dropped.
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn key_column(&self) -> &str {
        self.runs[0].key_column()
    }

    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordBatch>> {
        let picks = self.next_picks(max_rows);
        if picks.is_empty() {
            return Ok(None);
        }
        self.gather(&picks).map(Some)
    }

    fn release_inputs(&self) {
        self.runs.iter().for_each(|r| r.release_pages());
    }
}

fn merged_schema(first: &Run, drop_tombstones: bool) -> SchemaRef {
    let mut fields: Vec<Field> = first
        .data_fields()
        .iter()
        .enumerate()
        .map(|(i, f)| f.as_ref().clone().with_nullable(i != first.key_index()))
        .collect();
    if !drop_tombstones {
        fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
    }
    Arc::new(Schema::new_with_metadata(
        fields,
        first.batch().schema_ref().metadata().clone(),
    ))
}

fn check_inputs(runs: &[&Run]) -> Result<()> {
    let Some((first, _)) = runs.split_first() else {
        return Err(Error::Config("a merge needs at least one run".into()));
    };
    for (i, run) in runs.iter().enumerate() {
        check_columns(run, first.data_fields(), first.key_index(), "merging runs")?;
        if run.is_base() && i + 1 < runs.len() {
            return Err(Error::Config(format!(
                "merging runs: run {i} of {} is a base, which is the oldest run of its set; \
                 only the last run merged may be a base",
                runs.len()
            )));
        }
    }
    Ok(())
}

/// Column `col` of the picked rows, copied a range at a time.
fn gather(runs: &[&Run], col: usize, data_type: &DataType, picks: &Picks) -> Result<ArrayRef> {
    if picks.is_empty() {
        return Ok(new_empty_array(data_type));
    }
    let sources: Vec<ArrayData> = runs
        .iter()
        .map(|r| r.batch().column(col).to_data())
        .collect();
    let refs: Vec<&ArrayData> = sources.iter().collect();
    let mut out = MutableArrayData::new(refs, false, picks.rows);
    for &(run, start, end) in &picks.ranges {
        // Offsets past i32 (over 2 GiB of one string column in one chunk).
        out.try_extend(run, start, end)
            .map_err(|e| Error::Snapshot(format!("merging runs' column {col}: {e}")))?;
    }
    Ok(make_array(out.freeze()))
}
