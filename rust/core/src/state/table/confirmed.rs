//! Checkpoints in confirmed-base mode (several in flight: the local
//! runtime) left as runs (issue 37): a spilling table's capture is the
//! merge of sorted runs that the snapshot writer does as it writes the
//! state file, off the task thread and never whole in memory, instead of
//! a batch the task thread builds.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::spill::{CaptureRows, StreamedCapture};
use super::StateTable;
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::StateKind;
use crate::state::runs::{merge_rows, Run, DEFAULT_FPP};

/// The changes of one checkpoint interval (a diff's rows): a batch, as the
/// in-memory capture keeps them, or runs, newest first, as a streamed one
/// leaves them.
#[derive(Debug)]
pub(super) enum Interval {
    Batch(RecordBatch),
    Runs(Vec<Arc<Run>>),
}

impl Interval {
    /// The changes as a diff batch (runs merged in memory, tombstones kept).
    pub(super) fn batch(&self, table: &StateTable) -> Result<RecordBatch> {
        match self {
            Self::Batch(b) => Ok(b.clone()),
            Self::Runs(runs) if runs.is_empty() => {
                Ok(RecordBatch::new_empty(table.diff_schema.clone()))
            }
            Self::Runs(runs) => {
                let refs: Vec<&Run> = runs.iter().map(|r| r.as_ref()).collect();
                let merged = merge_rows(&refs, false)?;
                RecordBatch::try_new(table.diff_schema.clone(), merged.columns().to_vec())
                    .map_err(|e| Error::Snapshot(format!("merging an interval's runs: {e}")))
            }
        }
    }

    /// The changes as runs, newest first (a batch sorted into one).
    fn runs(&self, table: &StateTable) -> Result<Vec<Arc<Run>>> {
        match self {
            Self::Runs(runs) => Ok(runs.clone()),
            Self::Batch(b) if b.num_rows() == 0 => Ok(Vec::new()),
            Self::Batch(b) => Ok(vec![Arc::new(Run::from_unsorted(
                b.clone(),
                table.key_column(),
                DEFAULT_FPP,
            )?)]),
        }
    }
}

impl StateTable {
    /// [`Self::checkpoint_streamed`] in confirmed-base mode, for a table
    /// whose runs hold part of its state. A full flushes the memtable and
    /// is the merge of every run (tombstones dropped); a diff, based on
    /// the newest confirmed checkpoint, is the merge of this interval's
    /// changes (the change log sorted into a run in memory, and the runs
    /// flushes set aside since the last checkpoint) and those of the
    /// intervals not confirmed yet, as [`Self::checkpoint`] would capture
    /// them, with no merge on the task thread.
    pub(super) fn checkpoint_streamed_confirmed(
        &mut self,
        id: CheckpointId,
    ) -> Result<StreamedCapture> {
        let confirm = self.confirm.as_ref().expect("confirmed-base mode");
        let base = match confirm.confirmed {
            Some((base, diffs)) if !self.force_full && diffs + 1 < self.policy.full_every => {
                Some((base, diffs))
            }
            _ => None,
        };
        let first = self.last_checkpoint.is_none();
        let (capture, interval, diffs) = match base {
            None => {
                // The memory flushed, the runs are the whole state.
                self.flush()?;
                let spill = self.spill.as_ref().expect("a table with runs spills");
                let interval = if first {
                    Vec::new()
                } else {
                    spill.pending.clone()
                };
                let rows = CaptureRows::Runs {
                    runs: spill.runs.runs().to_vec(),
                    base: true,
                    schema: self.schema.clone(),
                };
                let kind = StateKind::Full;
                (StreamedCapture { kind, rows }, interval, 0)
            }
            Some((base, diffs)) => {
                let spill = self.spill.as_ref().expect("a table with runs spills");
                let mut interval: Vec<Arc<Run>> =
                    self.log_run()?.map(Arc::new).into_iter().collect();
                interval.extend(spill.pending.iter().cloned());
                let mut runs = interval.clone();
                let confirm = self.confirm.as_ref().expect("confirmed-base mode");
                for (_, _, older) in confirm.unconfirmed.iter().rev() {
                    runs.extend(older.runs(self)?);
                }
                let rows = if runs.is_empty() {
                    CaptureRows::Batch(RecordBatch::new_empty(self.diff_schema.clone()))
                } else {
                    CaptureRows::Runs {
                        runs,
                        base: false,
                        schema: self.diff_schema.clone(),
                    }
                };
                let kind = StateKind::Diff { base };
                (StreamedCapture { kind, rows }, interval, diffs + 1)
            }
        };
        let capture = StreamedCapture {
            rows: self.rows_with_capture_metadata(capture.kind, capture.rows),
            ..capture
        };
        self.confirmed_base_taken(id, diffs, Interval::Runs(interval));
        Ok(capture)
    }
}
