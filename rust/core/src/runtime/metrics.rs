//! What a job reports: per-checkpoint metrics and record counts.

use std::time::Duration;

use crate::protocol::{CheckpointId, ProtocolKind};
use crate::snapshot::{StoreMetrics, TaskId};

/// How a checkpoint ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointStatus {
    Completed,
    /// Aborted (timeout, or the job ended first), with the reason.
    Aborted(String),
}

/// Metrics of one checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointMetrics {
    pub id: CheckpointId,
    pub protocol: ProtocolKind,
    pub savepoint: bool,
    /// Taken when every bounded source had finished.
    pub is_final: bool,
    /// Trigger and end time since the job started.
    pub triggered_at: Duration,
    pub finished_at: Duration,
    /// `finished_at - triggered_at`.
    pub duration: Duration,
    pub status: CheckpointStatus,
    /// Alignment time per task (zero for sources and single-input tasks).
    pub alignment: Vec<(TaskId, Duration)>,
    /// Arrow memory size of every task's captured state.
    pub state_bytes: u64,
    /// Records and batches recorded in flight (channel state, back-edge logs).
    pub logged_records: u64,
    pub logged_batches: u64,
    /// A completed checkpoint's files, runs and compaction, as the durable
    /// store tells them (`None`: aborted, or a sink without files).
    pub store: Option<StoreMetrics>,
}

impl CheckpointMetrics {
    /// The longest alignment of any task.
    pub fn max_alignment(&self) -> Duration {
        self.alignment
            .iter()
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default()
    }
}

/// Record counts of one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskReport {
    pub task: TaskId,
    /// Records received (for a source: records emitted).
    pub records_in: u64,
    pub records_out: u64,
    /// Records dropped as replays of a restarted upstream (`upstream` failover).
    pub replayed_dropped: u64,
    /// Records received (a source: emitted) per timeline bucket, over all
    /// its incarnations (empty without a timeline).
    pub timeline: Vec<u64>,
    /// What its operator's spilling state did by its end (the last
    /// incarnation's), with `CheckpointConfig::state_memory`.
    pub spill: Option<crate::state::SpillStats>,
}

/// What [`crate::runtime::Job::run`] returns.
#[derive(Clone, Debug)]
pub struct JobReport {
    pub protocol: ProtocolKind,
    /// Records emitted by all sources.
    pub records_in: u64,
    /// Records received by all sinks (tasks without outputs).
    pub records_out: u64,
    pub elapsed: Duration,
    /// Every checkpoint triggered, in id order.
    pub checkpoints: Vec<CheckpointMetrics>,
    pub tasks: Vec<TaskReport>,
    /// Tasks restarted during this run after a task failed: its region,
    /// every task (`full`), or its upstream (`upstream`).
    pub restarts: Vec<crate::runtime::failover::Restart>,
    /// Width of a [`JobReport::timeline`] bucket (zero: no timeline).
    pub timeline_bucket: Duration,
    /// Per logical vertex (in graph order), records it received (a source:
    /// emitted) in each bucket since the job started, summed over its
    /// subtasks: the throughput over time, where a stop-the-world pause
    /// shows as empty buckets. A restarted task adds to what it counted
    /// before it failed (a replay counts again).
    pub timeline: Vec<(String, Vec<u64>)>,
}

impl JobReport {
    pub fn completed_checkpoints(&self) -> impl Iterator<Item = &CheckpointMetrics> {
        self.checkpoints
            .iter()
            .filter(|c| c.status == CheckpointStatus::Completed)
    }

    /// Source records per second of wall time.
    pub fn throughput(&self) -> f64 {
        self.records_in as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}
