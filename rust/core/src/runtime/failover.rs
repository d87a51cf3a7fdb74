//! What happens when a task fails: Flink's restart strategy (fixed delay)
//! and failover strategy (which tasks restart: [`crate::graph::failover`]).

use std::sync::Mutex;
use std::time::Duration;

pub use crate::graph::FailoverStrategy;
use crate::graph::RegionIndex;
use crate::protocol::CheckpointId;
use crate::snapshot::TaskId;

/// How often and how soon failed tasks restart (Flink's fixed-delay
/// restart strategy). Every restart counts against `attempts`, whether of a
/// region or of the whole job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartStrategy {
    /// Restarts before the job fails (0 = none, Flink's default without checkpointing).
    pub attempts: u32,
    /// Wait before each restart (Flink: 1 s).
    pub delay: Duration,
}

impl Default for RestartStrategy {
    fn default() -> Self {
        Self {
            attempts: 0,
            delay: Duration::from_secs(1),
        }
    }
}

/// What one restart restarted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestartScope {
    /// The whole job, rebuilt (a job-level failure, e.g. too many failed checkpoints).
    Job,
    /// One region of the running job (with [`FailoverStrategy::Full`], the
    /// single region holding every task).
    Region {
        region: RegionIndex,
        tasks: Vec<TaskId>,
    },
    /// The failed task and its upstream closure ([`FailoverStrategy::Upstream`]);
    /// every other task kept running.
    Upstream { tasks: Vec<TaskId> },
}

/// One restart: why, what, and from which checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restart {
    pub scope: RestartScope,
    /// The failure that caused it.
    pub error: String,
    /// The checkpoint restored (`None`: restarted from the beginning).
    pub restored_from: Option<CheckpointId>,
    /// The task whose failure caused it (`None` for a job-level failure).
    pub failed: Option<TaskId>,
    /// Why `upstream` failover restarted the region instead, if it did.
    pub fallback: Option<String>,
    /// When the failure was reported, since the job started (`None` for a
    /// job-level failure, which rebuilds the job).
    pub at: Option<Duration>,
    /// From the failure to the relaunch of the restarted tasks (the restart
    /// delay, the wait for the failed set's tasks to stop, and the restore).
    pub downtime: Option<Duration>,
}

/// Restarts so far, shared by every attempt of a job so that one budget
/// covers region and job restarts alike.
#[derive(Debug)]
pub(crate) struct RestartLog {
    attempts: u32,
    entries: Mutex<Vec<Restart>>,
}

impl RestartLog {
    pub fn new(attempts: u32) -> Self {
        Self {
            attempts,
            entries: Mutex::new(Vec::new()),
        }
    }

    /// Whether another restart is allowed, with `pending` restarts begun
    /// but not yet recorded.
    pub fn has_budget(&self, pending: usize) -> bool {
        ((self.lock().len() + pending) as u64) < u64::from(self.attempts)
    }

    pub fn record(&self, restart: Restart) {
        self.lock().push(restart);
    }

    pub fn entries(&self) -> Vec<Restart> {
        self.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Restart>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_allows_exactly_the_budgeted_restarts() {
        let log = RestartLog::new(2);
        for _ in 0..2 {
            assert!(log.has_budget(0));
            log.record(Restart {
                scope: RestartScope::Job,
                error: "x".into(),
                restored_from: None,
                failed: None,
                fallback: None,
                at: None,
                downtime: None,
            });
        }
        assert!(!log.has_budget(0));
        assert!(!RestartLog::new(1).has_budget(1));
        assert_eq!(log.len(), 2);
    }
}
