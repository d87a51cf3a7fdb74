//! [`Job`]: builds the tasks and channels of a graph, runs them on threads
//! with a coordinator, and reports.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::graph::{LogicalGraph, PhysicalGraph, VertexKind};
use crate::protocol::{for_task, ProtocolKind};
use crate::runtime::config::CheckpointConfig;
use crate::runtime::control::{CoordMsg, Mailbox};
use crate::runtime::coordinator::{Coordinator, TaskInfo};
use crate::runtime::edge::{edge, EdgeRx, EdgeTx, Signal, SignalRef};
use crate::runtime::metrics::{JobReport, TaskReport};
use crate::runtime::output::{OutChannel, Outputs};
use crate::runtime::task::{Body, CycleTracker, Input, JobShared, Task};
use crate::snapshot::{CompletedCheckpoint, SnapshotSink};

/// Runtime options that are not about checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOptions {
    /// Items (batches, barriers) each channel holds before its sender waits.
    pub channel_capacity: usize,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            channel_capacity: 64,
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
}

impl Job {
    /// Validates the configuration and the graph (nothing runs yet).
    pub fn new(graph: LogicalGraph, config: CheckpointConfig, options: JobOptions) -> Result<Self> {
        config.validate()?;
        options.validate()?;
        let physical = graph.expand()?;
        let (tx, rx) = mpsc::channel();
        Ok(Self {
            graph,
            physical,
            config,
            options,
            tx,
            rx: Mutex::new(Some(rx)),
            restore: None,
            first_id: None,
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

    pub fn physical(&self) -> &PhysicalGraph {
        &self.physical
    }

    pub fn handle(&self) -> JobHandle {
        JobHandle {
            tx: self.tx.clone(),
            protocol: self.config.protocol,
        }
    }

    /// Runs the job to its end (bounded sources) or until cancelled; task
    /// snapshots go to `sink`.
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
        let wakers: Vec<SignalRef> = (0..n).map(|_| Signal::new()).collect();
        let mailboxes: Vec<Arc<Mailbox>> = (0..n).map(|_| Arc::new(Mailbox::default())).collect();
        let cancel = Arc::new(AtomicBool::new(false));

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
        let counters: Vec<Arc<AtomicI64>> = cycles.iter().map(|c| c.inflight.clone()).collect();
        let loop_counter = |t: usize| phys.tasks[t].cycle.map(|c| counters[c].clone());

        let mut txs: Vec<Option<EdgeTx>> = Vec::with_capacity(phys.channels.len());
        let mut rxs: Vec<Option<EdgeRx>> = Vec::with_capacity(phys.channels.len());
        for ch in &phys.channels {
            let (tx, rx) = edge(
                self.options.channel_capacity,
                wakers[ch.from].clone(),
                wakers[ch.to].clone(),
            )?;
            txs.push(Some(tx));
            rxs.push(Some(rx));
        }

        let shared = Arc::new(JobShared {
            cancel: cancel.clone(),
            latest_triggered: AtomicU64::new(0),
            cycles,
            sink,
            protocol: self.config.protocol,
            alignment_timeout: self.config.alignment_timeout,
        });
        let aligned_first = self.config.protocol == ProtocolKind::Unaligned
            && !self.config.alignment_timeout.is_zero();

        let mut tasks = Vec::with_capacity(n);
        for (ti, pt) in phys.tasks.iter().enumerate() {
            let mut body = match &self.graph.vertices[pt.vertex].kind {
                VertexKind::Source(f) => Body::Source(f.create(pt.id.subtask, pt.parallelism)?),
                VertexKind::Operator(f) => Body::Operator(f.create(pt.id.subtask, pt.parallelism)?),
            };
            let mut replay = Vec::new();
            if let Body::Operator(op) = &mut body {
                op.set_full_every(self.config.full_every);
            }
            if let Some(snap) = self.restore.as_ref().and_then(|c| c.tasks.get(&pt.id)) {
                match &mut body {
                    Body::Source(src) => src.seek(snap.source_offset.unwrap_or(0))?,
                    Body::Operator(op) => {
                        if let Some(state) = &snap.state {
                            op.restore(std::slice::from_ref(state))?;
                        }
                    }
                }
                for log in &snap.channels {
                    if log.input >= pt.inputs.len() {
                        return Err(Error::Snapshot(format!(
                            "task {} logged input {} but has {} inputs",
                            pt.id,
                            log.input,
                            pt.inputs.len()
                        )));
                    }
                    replay.extend(log.records.iter().map(|b| (log.input, b.clone())));
                }
            }
            let inputs = pt
                .inputs
                .iter()
                .map(|&c| {
                    let ch = &phys.channels[c];
                    Input {
                        rx: rxs[c].take().expect("each channel has one receiver"),
                        edge_name: ch.edge_name.clone(),
                        from_subtask: ch.from_subtask,
                        loop_counter: if ch.in_cycle { loop_counter(ti) } else { None },
                        ended: false,
                        queued_reported: 0,
                    }
                })
                .collect();
            let out_ids: Vec<usize> = pt
                .outputs
                .iter()
                .flat_map(|g| g.channels.iter().copied())
                .collect();
            let out_channels = out_ids
                .iter()
                .map(|&c| {
                    let ch = &phys.channels[c];
                    OutChannel {
                        tx: txs[c].take().expect("each channel has one sender"),
                        unbounded: ch.kind == crate::protocol::InputKind::BackEdge,
                        loop_counter: if ch.in_cycle { loop_counter(ti) } else { None },
                        overflow: Default::default(),
                    }
                })
                .collect();
            let outputs = Outputs::new(
                &pt.outputs,
                out_channels,
                &out_ids,
                wakers[ti].clone(),
                cancel.clone(),
            );
            let protocol = for_task(self.config.protocol, &pt.input_kinds, aligned_first);
            tasks.push(Task::new(
                ti,
                pt.id.clone(),
                body,
                inputs,
                outputs,
                protocol,
                wakers[ti].clone(),
                mailboxes[ti].clone(),
                self.tx.clone(),
                shared.clone(),
                pt.cycle,
                replay,
            ));
        }

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
        );
        coordinator.started = started;
        let restored_next = self.restore.as_ref().map_or(1, |c| c.meta.id + 1);
        coordinator.first_id(self.first_id.unwrap_or(1).max(restored_next));

        let mut threads = Vec::with_capacity(n);
        let mut spawn_error = None;
        for task in tasks {
            let name = format!("snapcut-{}", task.id);
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || task.run())
            {
                Ok(h) => threads.push(h),
                Err(e) => {
                    spawn_error = Some(Error::io("spawning a task thread", e));
                    cancel.store(true, std::sync::atomic::Ordering::SeqCst);
                    break;
                }
            }
        }
        let outcome = if let Some(e) = spawn_error {
            Err(e)
        } else {
            coordinator.run()
        };
        for t in threads {
            let _ = t.join();
        }
        outcome?;

        let mut report = JobReport {
            protocol: self.config.protocol,
            records_in: 0,
            records_out: 0,
            elapsed: started.elapsed(),
            checkpoints: std::mem::take(&mut coordinator.metrics),
            tasks: Vec::with_capacity(n),
        };
        report.checkpoints.sort_by_key(|c| c.id);
        for (pt, c) in phys.tasks.iter().zip(&coordinator.counters) {
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
            });
        }
        Ok(report)
    }
}
