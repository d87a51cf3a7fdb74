//! [`Launcher`]: builds the tasks and channels of one failover region (or of
//! every region), restores them from a checkpoint, and runs them on threads;
//! relaunches a region after its tasks have stopped.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::graph::{LogicalGraph, PhysicalGraph, Regions, TaskIndex, VertexKind};
use crate::operator::Operator;
use crate::protocol::CheckpointId;
use crate::protocol::{for_task, ProtocolKind};
use crate::runtime::config::CheckpointConfig;
use crate::runtime::control::{Control, CoordMsg, Mailbox};
use crate::runtime::edge::{edge, SignalRef};
use crate::runtime::output::{OutChannel, Outputs};
use crate::runtime::task::{Body, Input, JobShared, Task};
use crate::snapshot::{CompletedCheckpoint, StateCapture, StateKind};

/// Starts tasks again after a failure (the coordinator's view of a [`Launcher`]).
pub(crate) trait Relaunch {
    /// Starts `tasks` (a restart set: a union of cancellation units whose
    /// inputs all come from inside it) anew, restored from `from` (or from
    /// the beginning); their old tasks must all have ended.
    fn relaunch(&mut self, tasks: &[TaskIndex], from: Option<&CompletedCheckpoint>) -> Result<()>;
}

/// A channel from a rebuilt task to a task that kept running: its
/// receiving end, to be handed over.
pub(crate) struct Boundary {
    pub channel: usize,
    pub to: TaskIndex,
    pub input: usize,
    pub rx: crate::runtime::edge::EdgeRx,
}

pub(crate) struct Launcher<'a> {
    pub graph: &'a LogicalGraph,
    pub physical: &'a PhysicalGraph,
    pub config: &'a CheckpointConfig,
    pub channel_capacity: usize,
    /// Cancellation units: a failure stops whole units.
    pub units: &'a Regions,
    pub wakers: Vec<SignalRef>,
    pub mailboxes: Vec<Arc<Mailbox>>,
    pub shared: Arc<JobShared>,
    pub coord: mpsc::Sender<CoordMsg>,
    threads: Vec<Option<JoinHandle<()>>>,
}

impl<'a> Launcher<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        graph: &'a LogicalGraph,
        physical: &'a PhysicalGraph,
        config: &'a CheckpointConfig,
        channel_capacity: usize,
        units: &'a Regions,
        wakers: Vec<SignalRef>,
        mailboxes: Vec<Arc<Mailbox>>,
        shared: Arc<JobShared>,
        coord: mpsc::Sender<CoordMsg>,
    ) -> Self {
        let n = physical.tasks.len();
        Self {
            graph,
            physical,
            config,
            channel_capacity,
            units,
            wakers,
            mailboxes,
            shared,
            coord,
            threads: (0..n).map(|_| None).collect(),
        }
    }

    /// Builds the tasks in `members` (every input of a member comes from a
    /// member), wired by fresh channels and restored from `from` if given.
    /// Channels from a member to a task outside are returned as
    /// [`Boundary`]s: that task keeps running and takes them over.
    pub fn build(
        &self,
        members: &[TaskIndex],
        from: Option<&CompletedCheckpoint>,
    ) -> Result<(Vec<Task>, Vec<Boundary>)> {
        let phys = self.physical;
        let mut in_set = vec![false; phys.tasks.len()];
        for &t in members {
            in_set[t] = true;
        }
        let mut txs = Vec::with_capacity(phys.channels.len());
        let mut rxs = Vec::with_capacity(phys.channels.len());
        let mut boundary = Vec::new();
        for (c, ch) in phys.channels.iter().enumerate() {
            if in_set[ch.to] && !in_set[ch.from] {
                return Err(Error::Task(format!(
                    "cannot restart {} without {}, which feeds it (channel {})",
                    phys.tasks[ch.to].id, phys.tasks[ch.from].id, ch.edge_name
                )));
            }
            if !in_set[ch.from] {
                txs.push(None);
                rxs.push(None);
                continue;
            }
            let (tx, rx) = edge(
                self.channel_capacity,
                self.wakers[ch.from].clone(),
                self.wakers[ch.to].clone(),
            )?;
            txs.push(Some(tx));
            if in_set[ch.to] {
                self.shared.channel_ended[c].store(false, Ordering::SeqCst);
                rxs.push(Some(rx));
            } else {
                rxs.push(None);
                boundary.push(Boundary {
                    channel: c,
                    to: ch.to,
                    input: ch.to_input,
                    rx,
                });
            }
        }
        let loop_counter = |t: TaskIndex| {
            phys.tasks[t]
                .cycle
                .map(|c| self.shared.cycles[c].inflight.clone())
        };
        let aligned_first = self.config.protocol == ProtocolKind::Unaligned
            && !self.config.alignment_timeout.is_zero();

        let mut tasks = Vec::with_capacity(members.len());
        for &ti in members {
            let pt = &phys.tasks[ti];
            let mut body = match &self.graph.vertices[pt.vertex].kind {
                VertexKind::Source(f) => Body::Source(f.create(pt.id.subtask, pt.parallelism)?),
                VertexKind::Operator(f) => Body::Operator(f.create(pt.id.subtask, pt.parallelism)?),
            };
            let mut replay = Vec::new();
            let snap = from.and_then(|c| c.tasks.get(&pt.id));
            let n_out: usize = pt.outputs.iter().map(|g| g.channels.len()).sum();
            let sent_seq = seqs(snap.map(|s| &s.sent_seq), n_out, &pt.id, "output channels")?;
            let taken_seq = seqs(
                snap.map(|s| &s.taken_seq),
                pt.inputs.len(),
                &pt.id,
                "inputs",
            )?;
            if let Body::Operator(op) = &mut body {
                // The synchronous baseline writes every task's whole state at
                // every checkpoint (Naiad); the others capture what changed.
                op.set_full_every(if self.config.protocol.full_state_every_time() {
                    1
                } else if self.shared.sink.materializes() {
                    u32::MAX
                } else {
                    self.config.full_every
                });
                if let Some(memory) = &self.config.state_memory {
                    op.set_state_memory(memory)?;
                }
            }
            if let Some(snap) = snap {
                match &mut body {
                    Body::Source(src) => src.seek(snap.source_offset.unwrap_or(0))?,
                    Body::Operator(op) => {
                        let runs = from.and_then(|c| c.state_runs.get(&pt.id));
                        if let Some(runs) = runs {
                            restore_runs(op.as_mut(), runs)?;
                        } else if let Some(state) = &snap.state {
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
                .enumerate()
                .map(|(i, &c)| {
                    let ch = &phys.channels[c];
                    Input {
                        rx: rxs[c].take().expect("each channel has one receiver"),
                        edge_name: ch.edge_name.clone(),
                        from_subtask: ch.from_subtask,
                        loop_counter: if ch.in_cycle { loop_counter(ti) } else { None },
                        ended: false,
                        queued_reported: 0,
                        taken: taken_seq[i],
                        ended_flag: self.shared.channel_ended[c].clone(),
                        detached: false,
                        reattach: Default::default(),
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
                .enumerate()
                .map(|(k, &c)| {
                    let ch = &phys.channels[c];
                    OutChannel {
                        tx: txs[c].take().expect("each channel has one sender"),
                        sent: sent_seq[k],
                        receiver_ended: self.shared.channel_ended[c].clone(),
                        unbounded: ch.kind == crate::protocol::InputKind::BackEdge,
                        loop_counter: if ch.in_cycle { loop_counter(ti) } else { None },
                        overflow: Default::default(),
                    }
                })
                .collect();
            let unit = self.units.of_task[ti];
            let outputs = Outputs::new(
                &pt.outputs,
                out_channels,
                &out_ids,
                self.wakers[ti].clone(),
                self.shared.region_cancel[unit].clone(),
            );
            let protocol = for_task(self.config.protocol, &pt.input_kinds, aligned_first);
            tasks.push(Task::new(
                ti,
                pt.id.clone(),
                body,
                inputs,
                outputs,
                protocol,
                self.wakers[ti].clone(),
                self.mailboxes[ti].clone(),
                self.coord.clone(),
                self.shared.clone(),
                pt.cycle,
                replay,
            ));
        }
        Ok((tasks, boundary))
    }

    /// Runs `tasks` on one thread each. On a spawn failure the tasks already
    /// started are cancelled and the error returned.
    pub fn spawn(&mut self, tasks: Vec<Task>) -> Result<()> {
        for task in tasks {
            let index = task.index;
            let name = format!("snapcut-{}", task.id);
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || task.run())
            {
                Ok(h) => self.threads[index] = Some(h),
                Err(e) => {
                    for c in &self.shared.region_cancel {
                        c.store(true, Ordering::SeqCst);
                    }
                    return Err(Error::io("spawning a task thread", e));
                }
            }
        }
        Ok(())
    }

    /// Waits for every task thread to end.
    pub fn join_all(&mut self) {
        for h in self.threads.iter_mut().filter_map(Option::take) {
            let _ = h.join();
        }
    }
}

impl Relaunch for Launcher<'_> {
    fn relaunch(
        &mut self,
        members: &[TaskIndex],
        from: Option<&CompletedCheckpoint>,
    ) -> Result<()> {
        for &t in members {
            if let Some(h) = self.threads[t].take() {
                let _ = h.join();
            }
            // Controls meant for the old tasks (commits, aborts) are stale.
            self.mailboxes[t].drain();
        }
        let mut cycles: Vec<usize> = members
            .iter()
            .filter_map(|&t| self.physical.tasks[t].cycle)
            .collect();
        cycles.sort_unstable();
        cycles.dedup();
        for c in cycles {
            let tracker = &self.shared.cycles[c];
            tracker.inflight.store(0, Ordering::SeqCst);
            tracker.external_done.store(0, Ordering::SeqCst);
            tracker.done.store(false, Ordering::SeqCst);
        }
        let (tasks, boundary) = self.build(members, from)?;
        for &t in members {
            self.shared.region_cancel[self.units.of_task[t]].store(false, Ordering::SeqCst);
        }
        for b in boundary {
            // A receiver that took end-of-stream took everything: its
            // sender drops the replay (OutChannel::receiver_ended).
            if !self.shared.channel_ended[b.channel].load(Ordering::SeqCst) {
                self.mailboxes[b.to].push(Control::Reattach {
                    input: b.input,
                    rx: b.rx,
                });
                self.wakers[b.to].notify();
            }
        }
        self.spawn(tasks)
    }
}

/// Restores `op` from a stored state's runs: as they are where the operator
/// keeps runs (a budgeted keyed aggregate opens them lazily), else rebuilt
/// here into the one full capture it restores from.
fn restore_runs(op: &mut dyn Operator, runs: &[(CheckpointId, StateCapture)]) -> Result<()> {
    if op.restores_runs() {
        return op.restore_runs(runs);
    }
    let full = StateCapture {
        kind: StateKind::Full,
        batch: crate::store::rebuild_chain(runs)?,
        filter: None,
        times: None,
    };
    op.restore(std::slice::from_ref(&full))
}

/// A checkpoint's per-channel numbers for a task with `n` channels (all 0
/// when the checkpoint predates them).
fn seqs(
    recorded: Option<&Vec<u64>>,
    n: usize,
    task: &crate::snapshot::TaskId,
    what: &str,
) -> Result<Vec<u64>> {
    match recorded {
        None => Ok(vec![0; n]),
        Some(v) if v.is_empty() => Ok(vec![0; n]),
        Some(v) if v.len() == n => Ok(v.clone()),
        Some(v) => Err(Error::Snapshot(format!(
            "the checkpoint numbers {} {what} of task {task}, which has {n}; restore into \
             the graph it was taken from",
            v.len()
        ))),
    }
}
