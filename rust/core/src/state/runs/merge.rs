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

use arrow_array::{new_empty_array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use arrow_select::interleave::interleave;

use super::keys::{KeyColumn, KeyRef};
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
    check_inputs(runs)?;
    let mut picks = newest_per_key(runs)?;
    let before = picks.len();
    if drop_tombstones {
        picks.retain(|&(run, row)| !runs[run].is_deleted(row));
    }
    let first = runs[0];
    let mut arrays = Vec::with_capacity(first.batch().num_columns() + 1);
    for (col, field) in first.data_fields().iter().enumerate() {
        arrays.push(gather(runs, col, field.data_type(), &picks)?);
    }
    // Values are nullable: a tombstone has only its key.
    let mut fields: Vec<Field> = first
        .data_fields()
        .iter()
        .enumerate()
        .map(|(i, f)| f.as_ref().clone().with_nullable(i != first.key_index()))
        .collect();
    if !drop_tombstones {
        let deleted: BooleanArray = picks
            .iter()
            .map(|&(run, row)| Some(runs[run].is_deleted(row)))
            .collect();
        arrays.push(Arc::new(deleted));
        fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
    }
    let schema = Schema::new_with_metadata(fields, first.batch().schema_ref().metadata().clone());
    let batch = RecordBatch::try_new(Arc::new(schema), arrays)
        .map_err(|e| Error::Snapshot(format!("assembling a merged run: {e}")))?;
    let run = Run::from_sorted_trusted(batch, first.key_column(), fpp)?;
    let stats = MergeStats {
        runs_in: runs.len(),
        rows_in: runs.iter().map(|r| r.len()).sum(),
        rows_out: run.len(),
        tombstones_dropped: before - picks.len(),
        bytes_in: runs.iter().map(|r| r.size_bytes()).sum(),
        bytes_out: run.size_bytes(),
    };
    Ok(Merged { run, stats })
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

/// Every key of `runs` once, in key order, as the (run, row) of its newest
/// row: a k-way merge on a heap of each run's next key, ties going to the
/// lowest run index (the newest).
fn newest_per_key(runs: &[&Run]) -> Result<Vec<(usize, usize)>> {
    let columns = runs
        .iter()
        .map(|r| KeyColumn::new(r.keys().as_ref()))
        .collect::<Result<Vec<_>>>()?;
    let mut heap: BinaryHeap<Reverse<(KeyRef<'_>, usize, usize)>> = columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.len() > 0)
        .map(|(run, c)| Reverse((c.at(0), run, 0)))
        .collect();
    let most = columns.iter().map(KeyColumn::len).max().unwrap_or(0);
    let mut picks = Vec::with_capacity(most);
    let mut last: Option<KeyRef<'_>> = None;
    while let Some(Reverse((key, run, row))) = heap.pop() {
        if last != Some(key) {
            picks.push((run, row));
            last = Some(key);
        }
        if row + 1 < columns[run].len() {
            heap.push(Reverse((columns[run].at(row + 1), run, row + 1)));
        }
    }
    Ok(picks)
}

/// Column `col` of the picked rows.
fn gather(
    runs: &[&Run],
    col: usize,
    data_type: &DataType,
    picks: &[(usize, usize)],
) -> Result<ArrayRef> {
    if picks.is_empty() {
        return Ok(new_empty_array(data_type));
    }
    let sources: Vec<_> = runs
        .iter()
        .map(|r| r.batch().column(col).as_ref())
        .collect();
    interleave(&sources, picks)
        .map_err(|e| Error::Snapshot(format!("merging runs' column {col}: {e}")))
}
