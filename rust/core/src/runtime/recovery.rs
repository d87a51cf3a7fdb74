//! Durable runs: checkpoints to a [`SnapshotStore`], resume from its newest
//! intact checkpoint, and restarts from the last completed checkpoint after
//! a failure (Flink's fixed-delay restart strategy).

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::graph::LogicalGraph;
use crate::protocol::CheckpointId;
use crate::runtime::config::CheckpointConfig;
use crate::runtime::failover::{Restart, RestartLog, RestartScope};
use crate::runtime::job::{Job, JobHandle, JobOptions};
use crate::runtime::metrics::JobReport;
use crate::store::{FsyncMode, Skipped, SnapshotStore, StoreOptions};

/// Where and how a durable run keeps its checkpoints. Restarts follow
/// [`JobOptions::restart`] and [`JobOptions::failover`].
#[derive(Clone, Debug)]
pub struct DurableOptions {
    /// Snapshot root (a local directory, created if missing).
    pub root: PathBuf,
    /// Start from the newest intact checkpoint under `root`, if any.
    pub resume: bool,
    /// How each checkpoint is made durable (`StoreOptions::fsync`).
    pub fsync: FsyncMode,
    /// Write checkpoint files with direct I/O where the filesystem takes
    /// it (`StoreOptions::direct_io`).
    pub direct_io: bool,
}

impl DurableOptions {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            resume: false,
            fsync: FsyncMode::default(),
            direct_io: true,
        }
    }
}

/// A durable run's outcome.
#[derive(Debug)]
pub struct DurableReport {
    /// The report of the last (successful) attempt.
    pub report: JobReport,
    /// Checkpoint the first attempt started from (`resume`), if any.
    pub restored_from: Option<CheckpointId>,
    /// Corrupt or partial checkpoints passed over when resuming, and why.
    pub skipped: Vec<Skipped>,
    /// Every restart, of regions and of the whole job, in order.
    pub restarts: Vec<Restart>,
}

/// The store a durable run writes to: it keeps `retained` checkpoints and
/// merges a task's runs in the background once `full_every` diffs sit on
/// its full, so the tasks themselves only ever capture what changed and no
/// commit rebuilds a state.
fn store_options(config: &CheckpointConfig, fsync: FsyncMode, direct_io: bool) -> StoreOptions {
    StoreOptions {
        retain: config.retained,
        materialize_every: Some(config.full_every.max(1) as usize),
        compaction: config.compaction,
        fsync,
        direct_io,
        sort_state_files: config.state_memory.is_some(),
        ..Default::default()
    }
}

/// Whether a job-level failure may be retried by rebuilding the job (a user
/// cancel, bad configuration or graph may not). Task failures do not get
/// here while restarts are left: the job restarts their region itself.
fn restartable(e: &Error) -> bool {
    match e {
        Error::Task(m) => !m.contains("cancelled by the user"),
        Error::Io { .. } | Error::Snapshot(_) => true,
        _ => false,
    }
}

/// Runs `graph` with checkpoints written to `durable.root`. A failed task
/// restarts its region (or the job) from the last completed checkpoint;
/// a job-level failure (e.g. more failed checkpoints than tolerated)
/// rebuilds the job from it. Both count against `options.restart.attempts`.
/// `on_start` sees each attempt's [`JobHandle`] (to trigger savepoints or cancel).
pub fn run_durable(
    graph: LogicalGraph,
    config: CheckpointConfig,
    options: JobOptions,
    durable: &DurableOptions,
    on_start: &mut dyn FnMut(JobHandle),
) -> Result<DurableReport> {
    config.validate()?;
    options.validate()?;
    let store = SnapshotStore::open(
        &durable.root,
        store_options(&config, durable.fsync, durable.direct_io),
    )?;
    let log = Arc::new(RestartLog::new(options.restart.attempts));
    let mut restored_from = None;
    let mut skipped = Vec::new();
    let mut restore_next = durable.resume;
    let mut first = true;
    loop {
        let mut job =
            Job::new(graph.clone(), config.clone(), options.clone())?.share_restarts(log.clone());
        let mut from = None;
        if restore_next {
            let (checkpoint, skip) = store.reader().restore_point()?;
            if first {
                skipped = skip;
            }
            if let Some(c) = checkpoint {
                job = job.restore_from(&c)?;
                from = Some(c.meta.id);
            }
        }
        if first {
            restored_from = from;
        }
        first = false;
        // Never reuse an id present under the root (complete, corrupt or partial).
        job = job.first_checkpoint_id(store.reader().next_checkpoint_id()?);
        on_start(job.handle());
        match job.run(store.clone()) {
            Ok(report) => {
                return Ok(DurableReport {
                    report,
                    restored_from,
                    skipped,
                    restarts: log.entries(),
                })
            }
            Err(e) if restartable(&e) && log.has_budget(0) => {
                // The id the next attempt will restore (verified, not loaded twice).
                let next = store
                    .reader()
                    .latest_intact()
                    .ok()
                    .map(|(m, _)| m.checkpoint_id);
                log.record(Restart {
                    scope: RestartScope::Job,
                    error: e.to_string(),
                    restored_from: next,
                    failed: None,
                    fallback: None,
                    at: None,
                    downtime: None,
                });
                restore_next = true;
                std::thread::sleep(options.restart.delay);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Restores `graph` into a job from checkpoint `id` of the store at `root`
/// (e.g. a savepoint), numbering new checkpoints after every id there.
pub fn job_from_store(
    graph: LogicalGraph,
    config: CheckpointConfig,
    options: JobOptions,
    root: impl Into<PathBuf>,
    id: Option<CheckpointId>,
) -> Result<(Job, Arc<SnapshotStore>)> {
    let store = SnapshotStore::open(
        root.into(),
        store_options(&config, FsyncMode::default(), true),
    )?;
    let checkpoint = match id {
        Some(id) => store.reader().load(id)?,
        None => store.reader().load_latest_intact()?.0,
    };
    let next = store.reader().next_checkpoint_id()?;
    let job = Job::new(graph, config, options)?
        .restore_from(&checkpoint)?
        .first_checkpoint_id(next);
    Ok((job, store))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::CompactionBudget;

    #[test]
    fn a_durable_runs_store_gets_the_jobs_compaction_budget() {
        let budget = CompactionBudget {
            cpu_share: 0.25,
            bytes_per_s: Some(64 << 20),
        };
        let config = CheckpointConfig {
            compaction: budget,
            full_every: 4,
            retained: 2,
            ..Default::default()
        };
        let options = store_options(&config, FsyncMode::Off, true);
        assert_eq!(options.compaction, budget);
        assert_eq!((options.materialize_every, options.retain), (Some(4), 2));
    }
}
