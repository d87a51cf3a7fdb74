//! The checkpoint coordinator: triggers checkpoints at the sources, collects
//! acknowledgements, commits or aborts, and ends the job.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::graph::{restart_set, FailoverStrategy, Regions, TaskIndex, Topology};
use crate::protocol::{CheckpointId, ProtocolKind};
use crate::runtime::config::CheckpointConfig;
use crate::runtime::control::{AckStats, Control, CoordMsg, Mailbox, TaskCounters};
use crate::runtime::edge::SignalRef;
use crate::runtime::failover::{Restart, RestartLog, RestartScope};
use crate::runtime::launch::Relaunch;
use crate::runtime::metrics::{CheckpointMetrics, CheckpointStatus};
use crate::runtime::task::JobShared;
use crate::snapshot::{CheckpointMeta, TaskId};

/// Longest the coordinator sleeps between looks at its clocks.
const TICK: Duration = Duration::from_millis(20);

/// How the coordinator restarts failed tasks.
pub(crate) struct Failover {
    pub strategy: FailoverStrategy,
    pub topology: Topology,
    /// Cancellation units (regions; one per task under `upstream`).
    pub units: Regions,
    /// Connected components: the region numbers reported.
    pub components: Regions,
    pub delay: Duration,
    pub log: Arc<RestartLog>,
}

/// Tasks that are stopping after a failure, to be relaunched once all have ended.
struct Restarting {
    /// Ascending task indices.
    tasks: Vec<TaskIndex>,
    failed: TaskIndex,
    /// Whether they are the failed task's upstream (not its region).
    upstream: bool,
    fallback: Option<String>,
    error: String,
    at: Instant,
    not_before: Instant,
}

pub(crate) struct TaskInfo {
    pub id: TaskId,
    pub mailbox: Arc<Mailbox>,
    pub waker: SignalRef,
    pub is_source: bool,
}

struct InFlight {
    triggered: Instant,
    started_ms: u64,
    acks: Vec<Option<AckStats>>,
    remaining: usize,
    savepoint: bool,
    is_final: bool,
}

pub(crate) struct Coordinator {
    pub config: CheckpointConfig,
    pub shared: Arc<JobShared>,
    pub tasks: Vec<TaskInfo>,
    pub rx: mpsc::Receiver<CoordMsg>,
    pub fingerprint: String,
    pub started: Instant,
    next_id: CheckpointId,
    in_flight: BTreeMap<CheckpointId, InFlight>,
    pub metrics: Vec<CheckpointMetrics>,
    last_trigger: Instant,
    last_end: Option<Instant>,
    exhausted: Vec<bool>,
    final_id: Option<CheckpointId>,
    finish_sent: bool,
    manual: VecDeque<bool>,
    failures: u32,
    done: Vec<bool>,
    pub counters: Vec<TaskCounters>,
    /// Per task, the timeline of its earlier incarnations (before restarts).
    pub earlier_timeline: Vec<Vec<u64>>,
    error: Option<Error>,
    failover: Failover,
    restarting: Vec<Restarting>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Coordinator {
    pub fn new(
        config: CheckpointConfig,
        shared: Arc<JobShared>,
        tasks: Vec<TaskInfo>,
        rx: mpsc::Receiver<CoordMsg>,
        fingerprint: String,
        failover: Failover,
    ) -> Self {
        let n = tasks.len();
        let now = Instant::now();
        Self {
            config,
            shared,
            tasks,
            rx,
            fingerprint,
            started: now,
            next_id: 1,
            in_flight: BTreeMap::new(),
            metrics: Vec::new(),
            last_trigger: now,
            last_end: None,
            exhausted: vec![false; n],
            final_id: None,
            finish_sent: false,
            manual: VecDeque::new(),
            failures: 0,
            done: vec![false; n],
            counters: vec![TaskCounters::default(); n],
            earlier_timeline: vec![Vec::new(); n],
            error: None,
            failover,
            restarting: Vec::new(),
        }
    }

    /// Numbers checkpoints from `id` on (after a restore).
    pub fn first_id(&mut self, id: CheckpointId) {
        self.next_id = id;
    }

    /// Runs until every task has ended (failed regions relaunched through
    /// `relaunch`); the job's outcome.
    pub fn run(&mut self, relaunch: &mut dyn Relaunch) -> Result<()> {
        loop {
            if self.done.iter().all(|&d| d) && (self.restarting.is_empty() || self.error.is_some())
            {
                break;
            }
            let wait = self
                .next_wake()
                .saturating_duration_since(Instant::now())
                .min(TICK);
            match self.rx.recv_timeout(wait) {
                Ok(msg) => self.handle(msg),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            while let Ok(msg) = self.rx.try_recv() {
                self.handle(msg);
            }
            if self.error.is_none() {
                self.maybe_relaunch(relaunch);
            }
            if self.error.is_none() {
                self.expire();
            }
            if self.error.is_none() && self.restarting.is_empty() {
                self.maybe_trigger();
                self.maybe_finish();
            }
        }
        let reason = if self.error.is_some() {
            "the job failed"
        } else {
            "the job ended before it completed"
        };
        let ids: Vec<CheckpointId> = self.in_flight.keys().copied().collect();
        for id in ids {
            self.abort(id, reason.into(), false);
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn next_wake(&self) -> Instant {
        let mut t = Instant::now() + TICK;
        if let Some(iv) = self.config.interval {
            t = t.min(self.last_trigger + iv);
        }
        for f in self.in_flight.values() {
            t = t.min(f.triggered + self.config.timeout);
        }
        for r in &self.restarting {
            t = t.min(r.not_before);
        }
        t
    }

    fn handle(&mut self, msg: CoordMsg) {
        match msg {
            CoordMsg::Ack { id, task, stats } => {
                let Some(f) = self.in_flight.get_mut(&id) else {
                    return; // aborted meanwhile
                };
                if f.acks[task].is_none() {
                    f.acks[task] = Some(stats);
                    f.remaining -= 1;
                }
                if f.remaining == 0 && self.error.is_none() {
                    self.complete(id);
                }
            }
            CoordMsg::SourceExhausted { task } => {
                self.exhausted[task] = true;
                // A source relaunched after the job began to finish ends
                // as soon as it has caught up.
                if self.finish_sent {
                    self.tasks[task].mailbox.push(Control::Finish);
                    self.tasks[task].waker.notify();
                }
            }
            CoordMsg::TaskDone { task, counters } => {
                self.done[task] = true;
                self.counters[task] = counters;
            }
            CoordMsg::TaskFailed {
                task,
                error,
                counters,
            } => {
                self.done[task] = true;
                self.counters[task] = counters;
                if self.restarting.iter().any(|r| r.tasks.contains(&task)) {
                    return; // stopping with an earlier failure
                }
                let name = self.tasks[task].id.to_string();
                let error = format!("{name}: {error}");
                if self.error.is_none() && self.failover.log.has_budget(self.restarting.len()) {
                    self.begin_restart(task, error);
                } else {
                    self.fail(Error::Task(error));
                }
            }
            CoordMsg::Trigger { savepoint } => {
                if self.config.protocol != ProtocolKind::None && !self.finishing() {
                    self.manual.push_back(savepoint);
                }
            }
            CoordMsg::Cancel => self.fail(Error::Task("job cancelled by the user".into())),
        }
    }

    fn fail(&mut self, e: Error) {
        if self.error.is_none() {
            self.error = Some(e);
        }
        for c in &self.shared.region_cancel {
            c.store(true, Ordering::SeqCst);
        }
        for t in &self.tasks {
            t.waker.notify();
        }
    }

    /// Stops the tasks that restart with `failed` (its region, or its
    /// upstream: [`restart_set`]); they are relaunched from the newest
    /// completed checkpoint once all have ended. A set that overlaps one
    /// already stopping joins it. Checkpoints in flight cannot complete
    /// without the stopped tasks: aborted.
    fn begin_restart(&mut self, failed: TaskIndex, error: String) {
        let names = |t: TaskIndex| self.tasks[t].id.to_string();
        let set = restart_set(
            self.failover.strategy,
            &self.failover.topology,
            failed,
            &names,
        );
        let mut tasks = set.tasks;
        let mut fallback = set.fallback;
        let mut upstream =
            self.failover.strategy == FailoverStrategy::Upstream && fallback.is_none();
        let (mut first_failed, mut first_error, mut at) = (failed, error, Instant::now());
        // Merge with overlapping sets still stopping (earliest failure first).
        while let Some(k) = self
            .restarting
            .iter()
            .position(|r| r.tasks.iter().any(|t| tasks.contains(t)))
        {
            let r = self.restarting.remove(k);
            tasks.extend(r.tasks);
            tasks.sort_unstable();
            tasks.dedup();
            upstream &= r.upstream;
            fallback = fallback.or(r.fallback);
            if r.at < at {
                (first_failed, first_error, at) = (r.failed, r.error, r.at);
            }
        }
        for &t in &tasks {
            self.shared.region_cancel[self.failover.units.of_task[t]].store(true, Ordering::SeqCst);
            self.tasks[t].waker.notify();
        }
        let ids: Vec<CheckpointId> = self.in_flight.keys().copied().collect();
        for id in ids {
            self.abort(id, format!("a task failed ({first_error})"), false);
        }
        // The final checkpoint, if aborted, is taken again once the
        // relaunched sources are exhausted too.
        if self.final_id.is_some_and(|id| !self.completed_final(id)) {
            self.final_id = None;
        }
        self.restarting.push(Restarting {
            tasks,
            failed: first_failed,
            upstream,
            fallback,
            error: first_error,
            at,
            not_before: Instant::now() + self.failover.delay,
        });
    }

    fn completed_final(&self, id: CheckpointId) -> bool {
        self.metrics
            .iter()
            .any(|m| m.id == id && m.status == CheckpointStatus::Completed)
    }

    /// Relaunches each stopping set whose tasks have all ended and whose
    /// restart delay has passed.
    fn maybe_relaunch(&mut self, relaunch: &mut dyn Relaunch) {
        let now = Instant::now();
        while let Some(k) = self
            .restarting
            .iter()
            .position(|r| now >= r.not_before && r.tasks.iter().all(|&t| self.done[t]))
        {
            let restarting = self.restarting.remove(k);
            let from = match self.shared.sink.latest_completed() {
                Ok(c) => c,
                Err(e) => {
                    self.fail(Error::Snapshot(format!(
                        "cannot restart after {}: reading the last checkpoint failed: {e}",
                        restarting.error
                    )));
                    return;
                }
            };
            let members = restarting.tasks;
            for &t in &members {
                self.done[t] = false;
                self.exhausted[t] = false;
                let old = std::mem::take(&mut self.counters[t]);
                TaskCounters::add_timeline(&mut self.earlier_timeline[t], &old.timeline);
            }
            let ids = members.iter().map(|&t| self.tasks[t].id.clone()).collect();
            self.failover.log.record(Restart {
                scope: if restarting.upstream {
                    RestartScope::Upstream { tasks: ids }
                } else {
                    RestartScope::Region {
                        region: self.failover.components.of_task[restarting.failed],
                        tasks: ids,
                    }
                },
                error: restarting.error.clone(),
                restored_from: from.as_ref().map(|c| c.meta.id),
                failed: Some(self.tasks[restarting.failed].id.clone()),
                fallback: restarting.fallback,
                at: Some(restarting.at.duration_since(self.started)),
                downtime: Some(restarting.at.elapsed()),
            });
            if let Err(e) = relaunch.relaunch(&members, from.as_ref()) {
                for &t in &members {
                    self.done[t] = true;
                }
                self.fail(Error::Task(format!(
                    "restarting after {} failed: {e}",
                    restarting.error
                )));
                return;
            }
        }
    }

    fn finishing(&self) -> bool {
        self.final_id.is_some() || self.finish_sent
    }

    fn all_exhausted(&self) -> bool {
        self.tasks
            .iter()
            .zip(&self.exhausted)
            .all(|(t, &e)| !t.is_source || e)
    }

    fn slot_free(&self) -> bool {
        let limit = match self.config.protocol {
            // Sources stay paused until the checkpoint ends: one at a time.
            ProtocolKind::Sync | ProtocolKind::SyncCapture | ProtocolKind::Unaligned => 1,
            _ => self.config.max_concurrent,
        };
        self.in_flight.len() < limit
    }

    fn maybe_trigger(&mut self) {
        if self.config.protocol == ProtocolKind::None || self.finishing() || !self.slot_free() {
            return;
        }
        if let Some(savepoint) = self.manual.pop_front() {
            self.trigger(savepoint, false);
            return;
        }
        let Some(iv) = self.config.interval else {
            return;
        };
        let now = Instant::now();
        let paused_enough = self
            .last_end
            .is_none_or(|e| now.duration_since(e) >= self.config.min_pause);
        if now.duration_since(self.last_trigger) >= iv && paused_enough && !self.all_exhausted() {
            self.trigger(false, false);
        }
    }

    fn maybe_finish(&mut self) {
        if self.finish_sent || !self.all_exhausted() {
            return;
        }
        let wants_final =
            self.config.protocol != ProtocolKind::None && self.config.final_checkpoint;
        if wants_final {
            match self.final_id {
                None => {
                    if self.slot_free() {
                        let id = self.trigger(false, true);
                        self.final_id = Some(id);
                    }
                    return;
                }
                Some(id) if self.in_flight.contains_key(&id) => return,
                Some(_) => {}
            }
        }
        self.finish_sent = true;
        for t in self.tasks.iter().filter(|t| t.is_source) {
            t.mailbox.push(Control::Finish);
            t.waker.notify();
        }
    }

    fn trigger(&mut self, savepoint: bool, is_final: bool) -> CheckpointId {
        let id = self.next_id;
        self.next_id += 1;
        let now = Instant::now();
        self.in_flight.insert(
            id,
            InFlight {
                triggered: now,
                started_ms: now_ms(),
                acks: vec![None; self.tasks.len()],
                remaining: self.tasks.len(),
                savepoint,
                is_final,
            },
        );
        self.last_trigger = now;
        self.shared.latest_triggered.store(id, Ordering::Release);
        self.shared.progress.start();
        let pause = self.config.protocol.pauses_sources();
        for t in self.tasks.iter().filter(|t| t.is_source) {
            t.mailbox.push(Control::Trigger { id, pause });
            t.waker.notify();
        }
        // Unaligned tasks scan their queues while a checkpoint is in flight.
        if self.config.protocol == ProtocolKind::Unaligned {
            for t in &self.tasks {
                t.waker.notify();
            }
        }
        id
    }

    /// Every task has acknowledged checkpoint `id`: commit it to the sink
    /// (for the durable store: wait for every file the background writer
    /// has queued, fsync it, write `sources.arrow` and the manifest by
    /// atomic rename), then tell the tasks.
    ///
    /// Stop-the-world protocols resume their paused sources here. `Sync`
    /// (the paper's baseline) resumes only after the commit returned, so no
    /// record is processed between the pause and the durable commit;
    /// `SyncCapture` resumes before the commit, as soon as every task has
    /// captured its state, and the write overlaps processing.
    fn complete(&mut self, id: CheckpointId) {
        let Some(f) = self.in_flight.remove(&id) else {
            return;
        };
        if self.config.protocol == ProtocolKind::SyncCapture {
            self.resume_sources();
        }
        let meta = CheckpointMeta {
            id,
            protocol: self.config.protocol,
            started_ms: f.started_ms,
            finished_ms: now_ms(),
            graph_fingerprint: self.fingerprint.clone(),
            savepoint: f.savepoint,
        };
        if let Err(e) = self.shared.sink.commit(meta) {
            // A checkpoint that cannot be written is a failed checkpoint
            // (Flink): aborted, counted against tolerable_failures.
            self.in_flight.insert(id, f);
            self.abort(id, format!("could not be written: {e}"), true);
            return;
        }
        let now = Instant::now();
        self.last_end = Some(now);
        self.shared.progress.complete();
        let mut m = self.metrics_of(id, &f, now, CheckpointStatus::Completed);
        m.store = self.shared.sink.store_metrics(id);
        self.metrics.push(m);
        for t in &self.tasks {
            t.mailbox.push(Control::Committed(id));
            t.waker.notify();
        }
        if self.config.protocol == ProtocolKind::Sync {
            self.resume_sources();
        }
    }

    /// Lets paused sources emit again (stop-the-world protocols). A source
    /// that is not paused ignores it.
    fn resume_sources(&self) {
        for t in self.tasks.iter().filter(|t| t.is_source) {
            t.mailbox.push(Control::Resume);
            t.waker.notify();
        }
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let expired: Vec<CheckpointId> = self
            .in_flight
            .iter()
            .filter(|(_, f)| now.duration_since(f.triggered) >= self.config.timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            let reason = format!(
                "expired after the checkpoint timeout of {:?}",
                self.config.timeout
            );
            self.abort(id, reason, true);
        }
    }

    fn abort(&mut self, id: CheckpointId, reason: String, counts_as_failure: bool) {
        let Some(f) = self.in_flight.remove(&id) else {
            return;
        };
        let _ = self.shared.sink.abort(id);
        let now = Instant::now();
        self.last_end = Some(now);
        self.shared.progress.abort();
        self.metrics
            .push(self.metrics_of(id, &f, now, CheckpointStatus::Aborted(reason.clone())));
        let resume = self.config.protocol.pauses_sources();
        for t in &self.tasks {
            t.mailbox.push(Control::Abort(id));
            if resume && t.is_source {
                t.mailbox.push(Control::Resume);
            }
            t.waker.notify();
        }
        if counts_as_failure {
            self.failures += 1;
            if self.failures > self.config.tolerable_failures {
                self.fail(Error::Snapshot(format!(
                    "checkpoint {id} {reason}; {} failed checkpoints exceed tolerable_failures = {} \
                     (raise the timeout or tolerable_failures)",
                    self.failures, self.config.tolerable_failures
                )));
            }
        }
    }

    fn metrics_of(
        &self,
        id: CheckpointId,
        f: &InFlight,
        end: Instant,
        status: CheckpointStatus,
    ) -> CheckpointMetrics {
        let mut m = CheckpointMetrics {
            id,
            protocol: self.config.protocol,
            savepoint: f.savepoint,
            is_final: f.is_final,
            triggered_at: f.triggered.duration_since(self.started),
            finished_at: end.duration_since(self.started),
            duration: end.duration_since(f.triggered),
            status,
            alignment: Vec::new(),
            state_bytes: 0,
            logged_records: 0,
            logged_batches: 0,
            store: None,
        };
        for (t, ack) in self.tasks.iter().zip(&f.acks) {
            if let Some(a) = ack {
                m.alignment
                    .push((t.id.clone(), Duration::from_nanos(a.alignment_nanos)));
                m.state_bytes += a.state_bytes;
                m.logged_records += a.logged_records;
                m.logged_batches += a.logged_batches;
            }
        }
        m
    }
}
