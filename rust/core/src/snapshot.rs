//! The hand-off between a running job and wherever its snapshots go.
//!
//! When a task carries out [`crate::protocol::Action::Snapshot`] it captures a
//! [`TaskSnapshot`]; when its part is final ([`crate::protocol::Action::Complete`])
//! the runtime hands it to a [`SnapshotSink`]. The coordinator calls
//! [`SnapshotSink::commit`] once every task of the checkpoint has reported.
//! The in-memory sink keeps them in a map; the durable store writes Arrow IPC
//! files and a manifest — the runtime does not know which one it talks to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::protocol::{CheckpointId, InputId, ProtocolKind};
use crate::state::runs::{BloomFilter, Run};

/// Name of a physical task: the logical vertex and the subtask index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId {
    pub vertex: String,
    pub subtask: usize,
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.vertex, self.subtask)
    }
}

/// Whether a state capture holds the whole table or the changes since a base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateKind {
    /// Every live key.
    Full,
    /// Upserts and tombstones since checkpoint `base` (a diff batch carries a
    /// boolean column `__deleted`; `true` rows are tombstones).
    Diff { base: CheckpointId },
}

/// Whether a capture whose diff would hold `changed` of a table's `live`
/// keys is written as a full instead: from half the table on. A full then
/// costs at most twice the diff's rows on the task thread, and it ends the
/// chain: the runs before it are read by no newer checkpoint, so retention
/// removes them, and the compactor (which rewrites the whole state once a
/// chain's diffs hold a quarter of its full's rows) has nothing to merge.
/// With hot keys at short intervals each diff is most of the table, and a
/// chain of such diffs holds many copies of it (issue 37: 25x the live state
/// on disk at 1M keys, ~40 % of them changing every 0.5 s). A table of
/// fewer than [`FULL_BEATS_DIFF_MIN_KEYS`] keeps its diffs: its chain is
/// small either way, and a diff says what changed.
pub fn full_beats_diff(changed: usize, live: usize) -> bool {
    live >= FULL_BEATS_DIFF_MIN_KEYS && changed.saturating_mul(2) >= live
}

/// The fewest live keys for which [`full_beats_diff`] can choose a full.
pub const FULL_BEATS_DIFF_MIN_KEYS: usize = 1024;

/// One task's operator state at a checkpoint, as Arrow.
#[derive(Clone, Debug)]
pub struct StateCapture {
    pub kind: StateKind,
    pub batch: RecordBatch,
    /// A restored diff's bloom filter as stored beside its file (format 3),
    /// so the run it becomes need not hash its keys again; `None` for a
    /// capture a task makes, a full, or a file stored without one.
    pub filter: Option<Arc<BloomFilter>>,
    /// A restored full's time index as stored beside its file (format 5),
    /// its bytes checked against its entry: a table indexed by that column
    /// takes it as its index's base run instead of reading every row's
    /// time. `None` for a capture a task makes, a diff, or a file stored
    /// without one.
    pub times: Option<RecordBatch>,
}

/// One task's operator state at a checkpoint left as sorted runs for the
/// sink to merge as it writes the state file (issue 37: a spilling table's
/// capture, never held whole in memory): the merge of `runs`, newest
/// first, with the columns of `schema`; for a full, the whole state with
/// its tombstones dropped, for a diff the changes with their tombstones.
#[derive(Clone, Debug)]
pub struct StateRuns {
    pub kind: StateKind,
    pub runs: Vec<Arc<Run>>,
    pub schema: arrow_schema::SchemaRef,
}

impl StateRuns {
    /// The merge in memory, as a [`StateCapture`] (for a sink that keeps
    /// captures in memory anyway).
    pub fn to_capture(&self) -> Result<StateCapture> {
        let base = self.kind == StateKind::Full;
        let refs: Vec<&Run> = self.runs.iter().map(|r| r.as_ref()).collect();
        let merged = crate::state::runs::merge_rows(&refs, base)?;
        let batch = RecordBatch::try_new(self.schema.clone(), merged.columns().to_vec())
            .map_err(|e| crate::error::Error::Snapshot(format!("merging a capture's runs: {e}")))?;
        Ok(StateCapture {
            kind: self.kind,
            batch,
            filter: None,
            times: None,
        })
    }
}

/// Records recorded in flight on one input channel of a task: Chandy–Lamport
/// channel state, a back-edge log, or data overtaken by an unaligned barrier.
#[derive(Clone, Debug)]
pub struct ChannelLog {
    /// The task's input index the records arrived on.
    pub input: InputId,
    /// Stable name of the channel's logical edge (e.g. `"agg<-map"`).
    pub edge: String,
    /// The upstream subtask the channel comes from.
    pub from_subtask: usize,
    pub records: Vec<RecordBatch>,
}

/// Everything one task contributes to one checkpoint.
#[derive(Clone, Debug)]
pub struct TaskSnapshot {
    pub task: TaskId,
    pub state: Option<StateCapture>,
    /// The state as runs instead of `state` (at most one of them is set).
    pub state_runs: Option<StateRuns>,
    pub channels: Vec<ChannelLog>,
    /// A source's replay position (records emitted before the barrier).
    pub source_offset: Option<u64>,
    /// Time the task spent aligning barriers for this checkpoint, in nanoseconds.
    pub alignment_nanos: u64,
    /// Per output channel (in the task's output order): records sent on it
    /// before the barrier — where a restored sender resumes numbering.
    pub sent_seq: Vec<u64>,
    /// Per input: the sequence number of the last record before the
    /// barrier — a restored receiver's high-water mark, below which records
    /// are replays. Empty (a checkpoint written before channels were
    /// numbered): every channel starts from 0 on both ends.
    pub taken_seq: Vec<u64>,
}

/// What the coordinator knows of a checkpoint once every task has reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub id: CheckpointId,
    pub protocol: ProtocolKind,
    /// Wall-clock start and end, milliseconds since the Unix epoch.
    pub started_ms: u64,
    pub finished_ms: u64,
    /// Fingerprint of the physical graph: a restore into another shape fails.
    pub graph_fingerprint: String,
    /// A savepoint is user-triggered and never removed by retention.
    pub savepoint: bool,
}

/// What a store's background compactor has done since the store opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionStats {
    /// Jobs handed over (not dropped for a full queue or a busy task).
    pub submitted: u64,
    /// Outputs written.
    pub merged: u64,
    /// Outputs a commit named in its manifest.
    pub adopted: u64,
    /// Outputs thrown away: their inputs were superseded or pruned.
    pub discarded: u64,
    /// Jobs that failed (an input unreadable, a state whose keys runs do
    /// not order, a file under `compacting/` that could not be written);
    /// the state stays as it was.
    pub failed: u64,
    /// Tasks not compacted any more: their runs could not be merged.
    pub refused: u64,
    /// Jobs handed over and not yet adopted or dropped.
    pub pending: u64,
    /// Bytes of run files read and of outputs written.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Time spent in jobs (reading, merging, writing) and resting after
    /// them ([`CompactionBudget::rest`]).
    pub busy: Duration,
    pub rested: Duration,
}

/// What a durable store tells of a checkpoint it committed (its metrics:
/// `CheckpointMetrics::store`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreMetrics {
    /// Bytes of the checkpoint's own files (what its commit wrote).
    pub bytes_written: u64,
    /// Most sorted runs one task's state is made of, and every task's runs.
    pub runs_max: u64,
    pub runs_total: u64,
    /// Bytes of diff runs on the tasks' fulls: what a restore reads beyond
    /// them, and what compaction folds.
    pub debt_bytes: u64,
    /// The compactor at this commit.
    pub compaction: CompactionStats,
}

/// Where completed task snapshots go. Implementations must be callable from
/// many task threads at once.
pub trait SnapshotSink: Send + Sync {
    /// A task's part of checkpoint `id` (called once per task per checkpoint).
    fn task_snapshot(&self, id: CheckpointId, snapshot: TaskSnapshot) -> Result<()>;
    /// Every task has reported: make checkpoint `id` durable and visible.
    fn commit(&self, meta: CheckpointMeta) -> Result<()>;
    /// Checkpoint `id` will never complete: drop what was staged for it.
    fn abort(&self, id: CheckpointId) -> Result<()>;
    /// The newest committed checkpoint that can be restored, whole (diffs
    /// resolved), if any: where a failed region restarts from.
    fn latest_completed(&self) -> Result<Option<CompletedCheckpoint>>;
    /// Whether this sink bounds diff chains itself (merging them off the
    /// tasks' threads: the store's compactor, or rebuilding full state in
    /// memory). Then operators send only diffs
    /// after their first capture, and no task ever stalls for an O(state)
    /// full capture; otherwise they send a full one every `full_every`.
    fn materializes(&self) -> bool {
        false
    }
    /// What the store tells of committed checkpoint `id` (`None`: a sink
    /// with no files, or `id` no longer held).
    fn store_metrics(&self, _id: CheckpointId) -> Option<StoreMetrics> {
        None
    }
}

/// A completed checkpoint held in memory.
#[derive(Clone, Debug)]
pub struct CompletedCheckpoint {
    pub meta: CheckpointMeta,
    pub tasks: BTreeMap<TaskId, TaskSnapshot>,
    /// A checkpoint loaded without rebuilding state (a durable store's
    /// restore point): each stateful task's state as the runs that rebuild
    /// it, the full first, then diffs, each with the checkpoint whose state
    /// it ends at; that task's [`TaskSnapshot::state`] is then `None`.
    /// Empty where the states are whole in `tasks`.
    pub state_runs: BTreeMap<TaskId, Vec<(CheckpointId, StateCapture)>>,
}

impl serde::Serialize for ProtocolKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for ProtocolKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}
