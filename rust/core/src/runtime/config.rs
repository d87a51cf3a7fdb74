//! Checkpointing configuration, with Flink's names and defaults.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::protocol::ProtocolKind;
use crate::store::CompactionBudget;

/// How a job takes checkpoints (Flink's `CheckpointConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// Which snapshot protocol runs; `None` disables checkpoints.
    pub protocol: ProtocolKind,
    /// Time between checkpoint triggers; `None` = only manual/final ones
    /// (Flink: checkpointing is off until an interval is set).
    pub interval: Option<Duration>,
    /// A checkpoint still running after this is aborted (Flink: 10 min).
    pub timeout: Duration,
    /// Least time from the end of one checkpoint to the start of the next (Flink: 0).
    pub min_pause: Duration,
    /// Checkpoints in flight at once (Flink: 1).
    pub max_concurrent: usize,
    /// Failed checkpoints tolerated before the job fails (Flink: 0).
    pub tolerable_failures: u32,
    /// Completed checkpoints kept (Flink: 1).
    pub retained: usize,
    /// With `Unaligned`: start aligned and switch to unaligned after this
    /// (Flink's aligned-checkpoint-timeout; 0 = unaligned from the start).
    pub alignment_timeout: Duration,
    /// Take a final checkpoint when every bounded source has finished, so
    /// that everything before end-of-input commits.
    pub final_checkpoint: bool,
    /// Incremental keyed state: every `full_every`-th checkpoint is a full
    /// capture, the others diffs (changed keys + tombstones); 1 = always full.
    pub full_every: u32,
    /// How much of the machine the durable store's background compaction
    /// may take (a share of one core, bytes written per second).
    pub compaction: CompactionBudget,
    /// Keyed state kept in memory per operator subtask before it spills to
    /// sorted runs on local disk (`None`: no limit, all of it in memory).
    pub state_memory: Option<StateMemory>,
}

/// A memory budget for keyed state and where state past it spills.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMemory {
    /// Bytes of rows an operator subtask's state table keeps in memory
    /// (at least [`crate::state::MIN_STATE_MEMORY`]).
    pub budget: usize,
    /// A local directory; each subtask's table spills into a directory of
    /// its own under it, removed when the table goes.
    pub spill_dir: std::path::PathBuf,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            protocol: ProtocolKind::Aligned,
            interval: None,
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 0,
            retained: 1,
            alignment_timeout: Duration::ZERO,
            final_checkpoint: true,
            full_every: 10,
            compaction: CompactionBudget::UNBOUNDED,
            state_memory: None,
        }
    }
}

impl CheckpointConfig {
    /// Rejects inconsistent settings before anything runs.
    pub fn validate(&self) -> Result<()> {
        if self.interval == Some(Duration::ZERO) {
            return Err(Error::Config(
                "checkpoint interval must be positive; leave it unset to disable periodic checkpoints"
                    .into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(Error::Config("checkpoint timeout must be positive".into()));
        }
        if self.max_concurrent == 0 {
            return Err(Error::Config(
                "max_concurrent_checkpoints must be at least 1".into(),
            ));
        }
        if self.full_every == 0 {
            return Err(Error::Config(
                "full_every must be at least 1 (1 = every checkpoint is a full capture)".into(),
            ));
        }
        self.compaction.validate()?;
        if let Some(memory) = &self.state_memory {
            crate::state::check_memory_budget(memory.budget)?;
            if memory.spill_dir.exists() && !memory.spill_dir.is_dir() {
                return Err(Error::Config(format!(
                    "state spill directory {} is not a directory; name a local directory (it \
                     is created if missing)",
                    memory.spill_dir.display()
                )));
            }
        }
        if self.retained == 0 {
            return Err(Error::Config(
                "retained checkpoints must be at least 1".into(),
            ));
        }
        if self.protocol == ProtocolKind::Unaligned && self.max_concurrent > 1 {
            return Err(Error::Config(
                "unaligned checkpoints need max_concurrent_checkpoints = 1 (as in Flink); \
                 lower it or use protocol 'aligned'"
                    .into(),
            ));
        }
        if !self.alignment_timeout.is_zero() && self.protocol != ProtocolKind::Unaligned {
            return Err(Error::Config(format!(
                "alignment_timeout only applies to protocol 'unaligned', not {:?}",
                self.protocol.name()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_flinks_and_valid() {
        let c = CheckpointConfig::default();
        assert_eq!(c.timeout, Duration::from_secs(600));
        assert_eq!(
            (c.max_concurrent, c.retained, c.tolerable_failures),
            (1, 1, 0)
        );
        c.validate().unwrap();
    }

    #[test]
    fn unaligned_with_concurrency_is_rejected() {
        let c = CheckpointConfig {
            protocol: ProtocolKind::Unaligned,
            max_concurrent: 2,
            ..Default::default()
        };
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("max_concurrent_checkpoints = 1"), "{msg}");
    }

    #[test]
    fn zero_interval_is_rejected() {
        let c = CheckpointConfig {
            interval: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("interval"));
    }
}
