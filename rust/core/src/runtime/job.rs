//! [`Job`]: builds the tasks and channels of a graph, runs them on threads
//! with a coordinator, and reports.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::graph::{LogicalGraph, PhysicalGraph};
use crate::protocol::ProtocolKind;
use crate::runtime::config::CheckpointConfig;
use crate::runtime::control::{
    CheckpointCounts, CheckpointProgress, CoordMsg, Mailbox, TaskCounters,
};
use crate::runtime::coordinator::{Coordinator, Failover, TaskInfo};
use crate::runtime::edge::{Signal, SignalRef};
use crate::runtime::failover::{FailoverStrategy, RestartLog, RestartStrategy};
use crate::runtime::launch::Launcher;
use crate::runtime::metrics::{JobReport, TaskReport};
use crate::runtime::task::{CycleTracker, JobShared};
use crate::snapshot::{CompletedCheckpoint, SnapshotSink};

/// Runtime options that are not about checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOptions {
    /// Items (batches, barriers) each channel holds before its sender waits.
    pub channel_capacity: usize,
    /// Which tasks restart when one fails.
    pub failover: FailoverStrategy,
    /// How many restarts, and how soon.
    pub restart: RestartStrategy,
    /// Width of the buckets of [`JobReport::timeline`] (records per vertex
    /// per bucket); zero records no timeline. Default 50 ms.
    pub timeline_bucket: Duration,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            channel_capacity: 64,
            failover: FailoverStrategy::default(),
            restart: RestartStrategy::default(),
            timeline_bucket: Duration::from_millis(50),
        }
    }
}

impl JobOptions {
    pub fn validate(&self) -> Result<()> {
        if self.channel_capacity == 0 {
            return Err(Error::Config(
                "channel_capacity must be at least 1 (batches per channel)".into(),
            ));
        }
        Ok(())
    }
}

/// Controls a job while it runs (from any thread).
#[derive(Clone, Debug)]
pub struct JobHandle {
    tx: mpsc::Sender<CoordMsg>,
    protocol: ProtocolKind,
    progress: Arc<CheckpointProgress>,
}

impl JobHandle {
    fn send(&self, msg: CoordMsg) -> Result<()> {
        self.tx.send(msg).map_err(|_| {
            Error::Config(
                "the job has ended; checkpoints can only be triggered while it runs".into(),
            )
        })
    }

    fn trigger(&self, savepoint: bool) -> Result<()> {
        if self.protocol == ProtocolKind::None {
            return Err(Error::Config(
                "checkpoints are disabled (protocol 'none'); choose a protocol to trigger them"
                    .into(),
            ));
        }
        self.send(CoordMsg::Trigger { savepoint })
    }

    /// Triggers a checkpoint now (queued if `max_concurrent` are in flight;
    /// dropped once the sources have finished).
    pub fn trigger_checkpoint(&self) -> Result<()> {
        self.trigger(false)
    }

    /// Triggers a savepoint: a checkpoint marked to outlive retention.
    pub fn trigger_savepoint(&self) -> Result<()> {
        self.trigger(true)
    }

    /// Stops the job; `run` returns `Error::Task("job cancelled by the user")`.
    pub fn cancel(&self) -> Result<()> {
        self.send(CoordMsg::Cancel)
    }

    /// This attempt's checkpoints so far: started, completed, aborted (a
    /// trigger sent but not yet started is in none of them). Readable after
    /// the attempt ended.
    pub fn checkpoints(&self) -> CheckpointCounts {
        self.progress.counts()
    }
}

/// `vertex x parallelism, ...` of a set of tasks, in name order.
fn shape<'a>(tasks: impl Iterator<Item = &'a crate::snapshot::TaskId>) -> String {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for t in tasks {
        *counts.entry(t.vertex.as_str()).or_default() += 1;
    }
    counts
        .iter()
        .map(|(v, n)| format!("{v} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A validated job, ready to run.
pub struct Job {
    graph: LogicalGraph,
    physical: PhysicalGraph,
    config: CheckpointConfig,
    options: JobOptions,
    tx: mpsc::Sender<CoordMsg>,
    rx: Mutex<Option<mpsc::Receiver<CoordMsg>>>,
    restore: Option<CompletedCheckpoint>,
    first_id: Option<crate::protocol::CheckpointId>,
    /// Restarts so far (shared with earlier attempts of a durable run).
    restarts: Arc<RestartLog>,
    progress: Arc<CheckpointProgress>,
}

impl Job {
    /// Validates the configuration and the graph (nothing runs yet).
    pub fn new(graph: LogicalGraph, config: CheckpointConfig, options: JobOptions) -> Result<Self> {
        config.validate()?;
        options.validate()?;
        let physical = graph.expand()?;
        let (tx, rx) = mpsc::channel();
        let restarts = Arc::new(RestartLog::new(options.restart.attempts));
        Ok(Self {
            graph,
            physical,
            config,
            options,
            tx,
            rx: Mutex::new(Some(rx)),
            restore: None,
            first_id: None,
            restarts,
            progress: Arc::default(),
        })
    }

    /// Starts from checkpoint `checkpoint` instead of the beginning: every
    /// operator restores its state, every source seeks to its offset, and
    /// the recorded in-flight records are delivered before anything else.
    /// The checkpoint must come from a graph of the same shape.
    pub fn restore_from(mut self, checkpoint: &CompletedCheckpoint) -> Result<Self> {
        if checkpoint.meta.graph_fingerprint != self.physical.fingerprint {
            let theirs = shape(checkpoint.tasks.keys());
            let ours = shape(self.physical.tasks.iter().map(|t| &t.id));
            return Err(Error::Snapshot(format!(
                "checkpoint {} was taken from graph {} [{theirs}], but this job's graph is {} \
                 [{ours}] (vertex x parallelism); restore into the same vertices, parallelism \
                 and edges",
                checkpoint.meta.id, checkpoint.meta.graph_fingerprint, self.physical.fingerprint
            )));
        }
        for t in &self.physical.tasks {
            if !checkpoint.tasks.contains_key(&t.id) {
                return Err(Error::Snapshot(format!(
                    "checkpoint {} has no snapshot of task {}; it is incomplete",
                    checkpoint.meta.id, t.id
                )));
            }
        }
        self.restore = Some(checkpoint.clone());
        Ok(self)
    }

    /// Numbers this job's checkpoints from `id` on (at least one past the
    /// restored checkpoint), so that a store never sees an id twice.
    pub fn first_checkpoint_id(mut self, id: crate::protocol::CheckpointId) -> Self {
        self.first_id = Some(id.max(1));
        self
    }

    /// Counts this job's restarts in `log` (shared with earlier attempts).
    pub(crate) fn share_restarts(mut self, log: Arc<RestartLog>) -> Self {
        self.restarts = log;
        self
    }

    pub fn physical(&self) -> &PhysicalGraph {
        &self.physical
    }

    pub fn handle(&self) -> JobHandle {
        JobHandle {
            tx: self.tx.clone(),
            protocol: self.config.protocol,
            progress: self.progress.clone(),
        }
    }

    /// Runs the job to its end (bounded sources) or until cancelled; task
    /// snapshots go to `sink`. A failed task restarts its failover region
    /// (or the whole job, per [`JobOptions::failover`]) from the sink's
    /// newest completed checkpoint while [`JobOptions::restart`] allows.
    pub fn run(self, sink: Arc<dyn SnapshotSink>) -> Result<JobReport> {
        let started = Instant::now();
        let rx = self
            .rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| Error::Config("a job runs once".into()))?;
        let phys = &self.physical;
        let n = phys.tasks.len();
        let topology = phys.topology();
        // Cancellation units: a failure stops whole units.
        let units = self.options.failover.regions(&topology);
        let components = self.options.failover.reported_regions(&topology);
        let wakers: Vec<SignalRef> = (0..n).map(|_| Signal::new()).collect();
        let mailboxes: Vec<Arc<Mailbox>> = (0..n).map(|_| Arc::new(Mailbox::default())).collect();

        let n_cycles = phys
            .tasks
            .iter()
            .filter_map(|t| t.cycle)
            .max()
            .map_or(0, |c| c + 1);
        let cycles: Vec<CycleTracker> = (0..n_cycles)
            .map(|c| CycleTracker {
                inflight: Arc::new(AtomicI64::new(0)),
                members: phys.tasks.iter().filter(|t| t.cycle == Some(c)).count(),
                external_done: AtomicUsize::new(0),
                done: AtomicBool::new(false),
            })
            .collect();

        let shared = Arc::new(JobShared {
            region_cancel: (0..units.len())
                .map(|_| Arc::new(AtomicBool::new(false)))
                .collect(),
            region_of: units.of_task.clone(),
            channel_ended: (0..phys.channels.len())
                .map(|_| Arc::new(AtomicBool::new(false)))
                .collect(),
            reattach_inputs: self.options.failover == FailoverStrategy::Upstream,
            latest_triggered: AtomicU64::new(0),
            progress: self.progress.clone(),
            cycles,
            sink,
            protocol: self.config.protocol,
            alignment_timeout: self.config.alignment_timeout,
            started,
            timeline_bucket_nanos: self.options.timeline_bucket.as_nanos() as u64,
        });
        let mut launcher = Launcher::new(
            &self.graph,
            phys,
            &self.config,
            self.options.channel_capacity,
            &units,
            wakers.clone(),
            mailboxes.clone(),
            shared.clone(),
            self.tx.clone(),
        );
        let all: Vec<usize> = (0..n).collect();
        let (tasks, _) = launcher.build(&all, self.restore.as_ref())?;

        let infos = phys
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| TaskInfo {
                id: t.id.clone(),
                mailbox: mailboxes[i].clone(),
                waker: wakers[i].clone(),
                is_source: t.is_source,
            })
            .collect();
        let mut coordinator = Coordinator::new(
            self.config.clone(),
            shared.clone(),
            infos,
            rx,
            phys.fingerprint.clone(),
            Failover {
                strategy: self.options.failover,
                topology,
                units: units.clone(),
                components,
                delay: self.options.restart.delay,
                log: self.restarts.clone(),
            },
        );
        coordinator.started = started;
        let restored_next = self.restore.as_ref().map_or(1, |c| c.meta.id + 1);
        coordinator.first_id(self.first_id.unwrap_or(1).max(restored_next));

        let restarts_before = self.restarts.len();
        let outcome = match launcher.spawn(tasks) {
            Ok(()) => coordinator.run(&mut launcher),
            Err(e) => Err(e),
        };
        launcher.join_all();
        outcome?;

        let mut report = JobReport {
            protocol: self.config.protocol,
            records_in: 0,
            records_out: 0,
            elapsed: started.elapsed(),
            checkpoints: std::mem::take(&mut coordinator.metrics),
            tasks: Vec::with_capacity(n),
            restarts: self.restarts.entries().split_off(restarts_before),
            timeline_bucket: self.options.timeline_bucket,
            timeline: Vec::new(),
        };
        report.checkpoints.sort_by_key(|c| c.id);
        // Per task, every incarnation's buckets: a restart does not erase
        // what the task did before it failed.
        let timelines: Vec<Vec<u64>> = coordinator
            .counters
            .iter()
            .zip(&coordinator.earlier_timeline)
            .map(|(c, earlier)| {
                let mut t = earlier.clone();
                TaskCounters::add_timeline(&mut t, &c.timeline);
                t
            })
            .collect();
        if !self.options.timeline_bucket.is_zero() {
            for (v, vertex) in self.graph.vertices.iter().enumerate() {
                let mut sum: Vec<u64> = Vec::new();
                for (pt, t) in phys.tasks.iter().zip(&timelines) {
                    if pt.vertex == v {
                        TaskCounters::add_timeline(&mut sum, t);
                    }
                }
                report.timeline.push((vertex.name.clone(), sum));
            }
        }
        for ((pt, c), timeline) in phys.tasks.iter().zip(&coordinator.counters).zip(timelines) {
            if pt.is_source {
                report.records_in += c.records_in;
            }
            if pt.outputs.is_empty() {
                report.records_out += c.records_in;
            }
            report.tasks.push(TaskReport {
                task: pt.id.clone(),
                records_in: c.records_in,
                records_out: c.records_out,
                replayed_dropped: c.replayed_dropped,
                timeline,
                spill: c.spill,
            });
        }
        Ok(report)
    }
}
