//! Messages between the coordinator and the tasks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::graph::TaskIndex;
use crate::protocol::{CheckpointId, InputId};
use crate::runtime::edge::EdgeRx;

/// Coordinator → task.
#[derive(Debug)]
pub(crate) enum Control {
    /// Start checkpoint `id` at this source; with `pause`, stop emitting
    /// until [`Control::Resume`] (synchronous checkpoints).
    Trigger {
        id: CheckpointId,
        pause: bool,
    },
    Resume,
    Abort(CheckpointId),
    /// Checkpoint `id` is durable: sinks publish what they staged.
    Committed(CheckpointId),
    /// A source may send end-of-stream now (its final checkpoint is done).
    Finish,
    /// `upstream` failover: the sender of `input` restarted; once the old
    /// channel is drained, read from `rx` instead.
    Reattach {
        input: InputId,
        rx: EdgeRx,
    },
}

/// A task's inbox; the flag keeps the empty check off the lock.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    queue: Mutex<VecDeque<Control>>,
    pending: AtomicBool,
}

impl Mailbox {
    pub fn push(&self, c: Control) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(c);
        self.pending.store(true, Ordering::Release);
    }

    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    pub fn drain(&self) -> Vec<Control> {
        if !self.pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        self.pending.store(false, Ordering::Release);
        q.drain(..).collect()
    }
}

/// How many checkpoints of one job attempt the coordinator has started,
/// completed and aborted: written by the coordinator, read through the
/// attempt's [`crate::runtime::JobHandle`] from other threads.
#[derive(Debug, Default)]
pub(crate) struct CheckpointProgress {
    started: AtomicU64,
    completed: AtomicU64,
    aborted: AtomicU64,
}

impl CheckpointProgress {
    pub fn start(&self) {
        self.started.fetch_add(1, Ordering::AcqRel);
    }

    pub fn complete(&self) {
        self.completed.fetch_add(1, Ordering::AcqRel);
    }

    pub fn abort(&self) {
        self.aborted.fetch_add(1, Ordering::AcqRel);
    }

    /// Ended ones are read first: a checkpoint is never seen ended and not
    /// started, so `in_flight` cannot underflow.
    pub fn counts(&self) -> CheckpointCounts {
        let completed = self.completed.load(Ordering::Acquire);
        let aborted = self.aborted.load(Ordering::Acquire);
        let started = self.started.load(Ordering::Acquire);
        CheckpointCounts {
            started,
            completed,
            aborted,
        }
    }
}

/// A job attempt's checkpoints so far ([`crate::runtime::JobHandle::checkpoints`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointCounts {
    /// Triggered at the sources (a trigger queued behind `max_concurrent`
    /// counts once it starts).
    pub started: u64,
    /// Durable: committed to the snapshot sink.
    pub completed: u64,
    /// Aborted: expired, failed to write, or declined by a task.
    pub aborted: u64,
}

impl CheckpointCounts {
    /// Started and neither completed nor aborted yet.
    pub fn in_flight(&self) -> u64 {
        self.started - self.completed - self.aborted
    }
}

/// What a task tells the coordinator about one checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AckStats {
    pub alignment_nanos: u64,
    pub state_bytes: u64,
    pub logged_records: u64,
    pub logged_batches: u64,
}

/// Counters a task reports when it ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TaskCounters {
    pub records_in: u64,
    pub records_out: u64,
    /// Records dropped as replays of a restarted upstream: taken before, or
    /// sent to a receiver that had already ended.
    pub replayed_dropped: u64,
    /// Records received (a source: emitted) per time bucket since the job
    /// started (`JobOptions::timeline_bucket`); empty when that is zero.
    pub timeline: Vec<u64>,
    /// What its operator's spilling state did (`CheckpointConfig::state_memory`).
    pub spill: Option<crate::state::SpillStats>,
}

impl TaskCounters {
    /// Adds `other`'s buckets to `timeline` (an earlier incarnation's).
    pub fn add_timeline(timeline: &mut Vec<u64>, other: &[u64]) {
        if timeline.len() < other.len() {
            timeline.resize(other.len(), 0);
        }
        for (t, n) in timeline.iter_mut().zip(other) {
            *t += n;
        }
    }

    /// Counts `n` records in the bucket of the time `now - started`.
    #[inline]
    pub fn count_at(&mut self, n: u64, started: std::time::Instant, bucket_nanos: u64) {
        if bucket_nanos == 0 {
            return;
        }
        let b = (started.elapsed().as_nanos() / bucket_nanos as u128) as usize;
        if self.timeline.len() <= b {
            self.timeline.resize(b + 1, 0);
        }
        self.timeline[b] += n;
    }
}

/// Task (or job handle) → coordinator.
#[derive(Debug)]
pub(crate) enum CoordMsg {
    Ack {
        id: CheckpointId,
        task: TaskIndex,
        stats: AckStats,
    },
    SourceExhausted {
        task: TaskIndex,
    },
    TaskDone {
        task: TaskIndex,
        counters: TaskCounters,
    },
    TaskFailed {
        task: TaskIndex,
        error: String,
        counters: TaskCounters,
    },
    Trigger {
        savepoint: bool,
    },
    Cancel,
}
