//! Durable runs: checkpoints to a [`SnapshotStore`], resume from its newest
//! intact checkpoint, and job-level restarts (Flink's fixed-delay restart
//! strategy) from the last completed checkpoint after a failure.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::graph::LogicalGraph;
use crate::protocol::CheckpointId;
use crate::runtime::config::CheckpointConfig;
use crate::runtime::job::{Job, JobHandle, JobOptions};
use crate::runtime::metrics::JobReport;
use crate::store::{Skipped, SnapshotStore, StoreOptions};

/// Where and how a durable run keeps its checkpoints.
#[derive(Clone, Debug)]
pub struct DurableOptions {
    /// Snapshot root (a local directory, created if missing).
    pub root: PathBuf,
    /// Start from the newest intact checkpoint under `root`, if any.
    pub resume: bool,
    /// Restarts after a failure before the job fails (Flink's fixed-delay
    /// strategy; 0 = no restarts, Flink's default without checkpointing).
    pub restart_attempts: u32,
    /// Wait before each restart (Flink: 1 s).
    pub restart_delay: Duration,
}

impl DurableOptions {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            resume: false,
            restart_attempts: 0,
            restart_delay: Duration::from_secs(1),
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
    /// Restarts after failures, each with the error that caused it and the
    /// checkpoint it restarted from.
    pub restarts: Vec<(String, Option<CheckpointId>)>,
}

/// Whether a failure may be retried by a restart (a user cancel, bad
/// configuration or graph may not).
fn restartable(e: &Error) -> bool {
    match e {
        Error::Task(m) => !m.contains("cancelled by the user"),
        Error::Io { .. } | Error::Snapshot(_) => true,
        _ => false,
    }
}

/// The newest intact checkpoint of `store`, if it has any, with what was skipped.
fn latest(
    store: &SnapshotStore,
) -> Result<(Option<crate::snapshot::CompletedCheckpoint>, Vec<Skipped>)> {
    let reader = store.reader();
    if reader.scan()?.is_empty() {
        return Ok((None, Vec::new()));
    }
    match reader.latest_intact() {
        Ok((manifest, skipped)) => Ok((Some(reader.load(manifest.checkpoint_id)?), skipped)),
        Err(_) => {
            // Nothing intact: report every checkpoint as skipped, start fresh.
            let mut skipped = Vec::new();
            for (id, _) in reader.scan()?.into_iter().rev() {
                if let Err(e) = reader.verify(id) {
                    skipped.push(Skipped {
                        id,
                        reason: e.to_string(),
                    });
                }
            }
            Ok((None, skipped))
        }
    }
}

/// Runs `graph` with checkpoints written to `durable.root`; on a failure,
/// restarts the whole job from the last completed checkpoint up to
/// `restart_attempts` times. `on_start` sees each attempt's [`JobHandle`]
/// (to trigger savepoints or cancel).
pub fn run_durable(
    graph: LogicalGraph,
    config: CheckpointConfig,
    options: JobOptions,
    durable: &DurableOptions,
    on_start: &mut dyn FnMut(JobHandle),
) -> Result<DurableReport> {
    config.validate()?;
    let store = SnapshotStore::open(
        &durable.root,
        StoreOptions {
            retain: config.retained,
            ..Default::default()
        },
    )?;
    let mut restored_from = None;
    let mut skipped = Vec::new();
    let mut restarts = Vec::new();
    let mut restore_next = durable.resume;
    loop {
        let mut job = Job::new(graph.clone(), config.clone(), options.clone())?;
        let mut from = None;
        if restore_next {
            let (checkpoint, skip) = latest(&store)?;
            if restarts.is_empty() {
                skipped = skip;
            }
            if let Some(c) = checkpoint {
                job = job.restore_from(&c)?;
                from = Some(c.meta.id);
            }
        }
        if restarts.is_empty() {
            restored_from = from;
        }
        // Never reuse an id present under the root (complete, corrupt or partial).
        job = job.first_checkpoint_id(store.reader().next_checkpoint_id()?);
        on_start(job.handle());
        match job.run(store.clone()) {
            Ok(report) => {
                return Ok(DurableReport {
                    report,
                    restored_from,
                    skipped,
                    restarts,
                })
            }
            Err(e) if restartable(&e) && (restarts.len() as u32) < durable.restart_attempts => {
                let next = latest(&store)?.0.map(|c| c.meta.id);
                restarts.push((e.to_string(), next));
                restore_next = true;
                std::thread::sleep(durable.restart_delay);
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
        StoreOptions {
            retain: config.retained,
            ..Default::default()
        },
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
