//! [`Launcher`]: builds the tasks and channels of one failover region (or of
//! every region), restores them from a checkpoint, and runs them on threads;
//! relaunches a region after its tasks have stopped.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::graph::{LogicalGraph, PhysicalGraph, RegionIndex, Regions, TaskIndex, VertexKind};
use crate::protocol::{for_task, ProtocolKind};
use crate::runtime::config::CheckpointConfig;
use crate::runtime::control::{CoordMsg, Mailbox};
use crate::runtime::edge::{edge, SignalRef};
use crate::runtime::output::{OutChannel, Outputs};
use crate::runtime::task::{Body, Input, JobShared, Task};
use crate::snapshot::CompletedCheckpoint;

/// Starts regions again after a failure (the coordinator's view of a [`Launcher`]).
pub(crate) trait Relaunch {
    /// Starts `region`'s tasks anew, restored from `from` (or from the
    /// beginning); its old tasks must all have ended.
    fn relaunch(&mut self, region: RegionIndex, from: Option<&CompletedCheckpoint>) -> Result<()>;
}

pub(crate) struct Launcher<'a> {
    pub graph: &'a LogicalGraph,
    pub physical: &'a PhysicalGraph,
    pub config: &'a CheckpointConfig,
    pub channel_capacity: usize,
    pub regions: &'a Regions,
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
        regions: &'a Regions,
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
            regions,
            wakers,
            mailboxes,
            shared,
            coord,
            threads: (0..n).map(|_| None).collect(),
        }
    }

    /// Builds the tasks in `members` (a union of whole regions), wired to
    /// each other by fresh channels, restored from `from` if given.
    pub fn build(
        &self,
        members: &[TaskIndex],
        from: Option<&CompletedCheckpoint>,
    ) -> Result<Vec<Task>> {
        let phys = self.physical;
        let mut in_set = vec![false; phys.tasks.len()];
        for &t in members {
            in_set[t] = true;
        }
        let mut txs = Vec::with_capacity(phys.channels.len());
        let mut rxs = Vec::with_capacity(phys.channels.len());
        for ch in &phys.channels {
            // Regions are connected components: no channel leaves one.
            debug_assert_eq!(in_set[ch.to], in_set[ch.from], "{}", ch.edge_name);
            if in_set[ch.to] {
                let (tx, rx) = edge(
                    self.channel_capacity,
                    self.wakers[ch.from].clone(),
                    self.wakers[ch.to].clone(),
                )?;
                txs.push(Some(tx));
                rxs.push(Some(rx));
            } else {
                txs.push(None);
                rxs.push(None);
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
            }
            if let Some(snap) = from.and_then(|c| c.tasks.get(&pt.id)) {
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
            let region = self.regions.of_task[ti];
            let outputs = Outputs::new(
                &pt.outputs,
                out_channels,
                &out_ids,
                self.wakers[ti].clone(),
                self.shared.region_cancel[region].clone(),
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
        Ok(tasks)
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
    fn relaunch(&mut self, region: RegionIndex, from: Option<&CompletedCheckpoint>) -> Result<()> {
        let members = self.regions.members[region].clone();
        for &t in &members {
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
        let tasks = self.build(&members, from)?;
        self.shared.region_cancel[region].store(false, Ordering::SeqCst);
        self.spawn(tasks)
    }
}
