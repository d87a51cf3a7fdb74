//! One task thread: pops items from its inputs, drives its protocol machine
//! with them, and carries out the actions the machine returns.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::graph::TaskIndex;
use crate::operator::{Batch, Operator, Source, TaskState};
use crate::protocol::sequence::{seen, Seen};
use crate::protocol::{Action, CheckpointId, Event, InputId, Protocol, ProtocolKind};
use crate::runtime::control::{AckStats, Control, CoordMsg, Mailbox, TaskCounters};
use crate::runtime::edge::{EdgeRx, Item, Recv, SignalRef};
use crate::runtime::output::{cancelled, Outputs};
use crate::snapshot::{ChannelLog, SnapshotSink, TaskId, TaskSnapshot};

/// Items popped from one input before the task looks at the next one.
const BURST: usize = 16;
/// Longest sleep of an idle task (it also wakes on data, room and control).
const IDLE_WAIT: Duration = Duration::from_millis(10);

/// State shared by every task of a job and its coordinator.
pub(crate) struct JobShared {
    /// Per failover region: its tasks stop when set (the whole job: all set).
    pub region_cancel: Vec<Arc<AtomicBool>>,
    pub region_of: Vec<crate::graph::RegionIndex>,
    /// The newest checkpoint id the coordinator triggered.
    pub latest_triggered: AtomicU64,
    /// Checkpoints started, completed and aborted (the job's handle reads them).
    pub progress: Arc<crate::runtime::control::CheckpointProgress>,
    pub cycles: Vec<CycleTracker>,
    pub sink: Arc<dyn SnapshotSink>,
    pub protocol: ProtocolKind,
    pub alignment_timeout: Duration,
    /// When the job started: time zero of the throughput timeline.
    pub started: Instant,
    /// Per physical channel: its receiver took end-of-stream.
    pub channel_ended: Vec<Arc<AtomicBool>>,
    /// `upstream` failover: an input whose sender stopped without
    /// end-of-stream waits for the restarted sender instead of failing.
    pub reattach_inputs: bool,
    /// Width of a timeline bucket in nanoseconds (0: no timeline).
    pub timeline_bucket_nanos: u64,
}

/// Termination detection for one cycle: it is over when every member has
/// seen end-of-stream on all inputs from outside the cycle and no data item
/// is queued on, or being processed from, a channel inside the cycle.
pub(crate) struct CycleTracker {
    pub inflight: Arc<AtomicI64>,
    pub members: usize,
    pub external_done: AtomicUsize,
    pub done: AtomicBool,
}

pub(crate) struct Input {
    pub rx: EdgeRx,
    pub edge_name: String,
    pub from_subtask: usize,
    /// Counter of the cycle this channel lies on, if any.
    pub loop_counter: Option<Arc<AtomicI64>>,
    pub ended: bool,
    /// Newest barrier id already reported as queued on this input.
    pub queued_reported: CheckpointId,
    /// The number of the last record taken from this channel.
    pub taken: u64,
    /// Set when this channel's receiver took end-of-stream (shared with the sender).
    pub ended_flag: Arc<AtomicBool>,
    /// The sender stopped without end-of-stream; waiting for its restart.
    pub detached: bool,
    /// Channels from restarted senders, read in turn once this one is drained.
    pub reattach: VecDeque<EdgeRx>,
}

pub(crate) enum Body {
    Source(Box<dyn Source>),
    Operator(Box<dyn Operator>),
}

#[derive(Default)]
struct Pending {
    state: Option<TaskState>,
    source_offset: Option<u64>,
    logs: BTreeMap<InputId, Vec<Batch>>,
    first_seen: Option<Instant>,
    alignment: Duration,
    /// Per output channel, records sent when the state was captured.
    sent: Vec<u64>,
    /// Per input, the position of barrier `id` on it.
    taken: BTreeMap<InputId, u64>,
}

pub(crate) struct Task {
    pub index: TaskIndex,
    pub id: TaskId,
    pub body: Body,
    pub inputs: Vec<Input>,
    pub outputs: Outputs,
    pub protocol: Option<Box<dyn Protocol>>,
    pub waker: SignalRef,
    pub mailbox: Arc<Mailbox>,
    pub coord: mpsc::Sender<CoordMsg>,
    pub shared: Arc<JobShared>,
    /// The stop flag of this task's failover region.
    pub cancel: Arc<AtomicBool>,
    pub cycle: Option<usize>,
    pending: BTreeMap<CheckpointId, Pending>,
    actions: Vec<Action>,
    counters: TaskCounters,
    /// Newest checkpoint this task completed or saw aborted.
    last_done: CheckpointId,
    /// (checkpoint, since, timeout sent) of the alignment in progress.
    align: Option<(CheckpointId, Instant, bool)>,
    external_reported: bool,
    finished: bool,
    /// In-flight records of a restored checkpoint, delivered first.
    replay: Vec<(InputId, Batch)>,
}

/// Whether `e` is the error of a task stopped by a job cancellation.
pub(crate) fn is_cancelled(e: &Error) -> bool {
    matches!(e, Error::Task(m) if m == "job cancelled")
}

impl Task {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: TaskIndex,
        id: TaskId,
        body: Body,
        inputs: Vec<Input>,
        outputs: Outputs,
        protocol: Option<Box<dyn Protocol>>,
        waker: SignalRef,
        mailbox: Arc<Mailbox>,
        coord: mpsc::Sender<CoordMsg>,
        shared: Arc<JobShared>,
        cycle: Option<usize>,
        replay: Vec<(InputId, Batch)>,
    ) -> Self {
        let cancel = shared.region_cancel[shared.region_of[index]].clone();
        Self {
            index,
            id,
            body,
            inputs,
            outputs,
            protocol,
            waker,
            mailbox,
            coord,
            shared,
            cancel,
            cycle,
            pending: BTreeMap::new(),
            actions: Vec::new(),
            counters: TaskCounters::default(),
            last_done: 0,
            align: None,
            external_reported: false,
            finished: false,
            replay,
        }
    }

    /// Runs the task to its end; reports the outcome to the coordinator.
    pub fn run(mut self) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if matches!(self.body, Body::Source(_)) {
                self.run_source()
            } else {
                self.run_operator()
            }
        }));
        let (index, coord) = (self.index, self.coord.clone());
        self.counters.replayed_dropped += self.outputs.replayed_dropped;
        if let Body::Operator(op) = &self.body {
            self.counters.spill = op.spill_stats();
        }
        let msg = match result {
            Ok(Ok(())) => CoordMsg::TaskDone {
                task: index,
                counters: std::mem::take(&mut self.counters),
            },
            Ok(Err(e)) if is_cancelled(&e) => CoordMsg::TaskDone {
                task: index,
                counters: std::mem::take(&mut self.counters),
            },
            Ok(Err(e)) => {
                self.cancel.store(true, Ordering::SeqCst);
                // The coordinator wraps this in `Error::Task("<task>: …")`: pass a
                // task error's bare message so "task failed:" is not said twice.
                let error = match e {
                    Error::Task(message) => message,
                    other => other.to_string(),
                };
                CoordMsg::TaskFailed {
                    task: index,
                    error,
                    counters: std::mem::take(&mut self.counters),
                }
            }
            Err(panic) => {
                self.cancel.store(true, Ordering::SeqCst);
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                CoordMsg::TaskFailed {
                    task: index,
                    error: format!("panicked: {what}"),
                    counters: std::mem::take(&mut self.counters),
                }
            }
        };
        // Drop channel ends first so that neighbours see the disconnection.
        drop(self);
        let _ = coord.send(msg);
    }

    fn check_cancel(&self) -> Result<()> {
        if self.cancel.load(Ordering::Relaxed) {
            Err(cancelled())
        } else {
            Ok(())
        }
    }

    fn run_source(&mut self) -> Result<()> {
        let mut paused = false;
        let mut exhausted = false;
        let mut finish = false;
        loop {
            self.check_cancel()?;
            for c in self.mailbox.drain() {
                match c {
                    Control::Trigger { id, pause } => {
                        self.pending.entry(id).or_default();
                        self.event(Event::Trigger { id }, None)?;
                        paused |= pause;
                    }
                    Control::Resume => paused = false,
                    Control::Finish => finish = true,
                    other => self.common_control(other)?,
                }
            }
            self.outputs.flush_overflow();
            if finish {
                self.outputs.end_of_stream()?;
                while self.outputs.has_overflow() {
                    self.check_cancel()?;
                    self.outputs.flush_overflow();
                    self.waker
                        .wait_until_timeout(|| false, Duration::from_millis(1));
                }
                return Ok(());
            }
            if !paused && !exhausted {
                let Body::Source(src) = &mut self.body else {
                    unreachable!("source body")
                };
                match src.next_batch()? {
                    Some(batch) => {
                        let n = batch.num_rows() as u64;
                        self.counters.records_in += n;
                        self.counters.count_at(
                            n,
                            self.shared.started,
                            self.shared.timeline_bucket_nanos,
                        );
                        crate::operator::Emitter::emit(&mut self.outputs, batch)?;
                        self.counters.records_out = self.outputs.records_out;
                    }
                    None => {
                        exhausted = true;
                        let _ = self
                            .coord
                            .send(CoordMsg::SourceExhausted { task: self.index });
                    }
                }
                continue;
            }
            let (mailbox, cancel) = (&self.mailbox, &self.cancel);
            self.waker.wait_until_timeout(
                || mailbox.has_pending() || cancel.load(Ordering::Relaxed),
                IDLE_WAIT,
            );
        }
    }

    fn run_operator(&mut self) -> Result<()> {
        // Restored channel state sat at the head of its channels.
        for (input, batch) in std::mem::take(&mut self.replay) {
            self.check_cancel()?;
            self.counters.records_in += batch.num_rows() as u64;
            self.deliver(input, batch)?;
        }
        let n = self.inputs.len();
        let mut rr = 0;
        loop {
            self.check_cancel()?;
            for c in self.mailbox.drain() {
                self.common_control(c)?;
            }
            self.outputs.flush_overflow();
            self.alignment_clock()?;
            self.scan_queued()?;
            let mut progress = false;
            for k in 0..n {
                let i = (rr + k) % n;
                for _ in 0..BURST {
                    if self.inputs[i].ended || self.inputs[i].detached || self.is_blocked(i) {
                        break;
                    }
                    match self.inputs[i].rx.try_recv() {
                        Recv::Item(item) => {
                            progress = true;
                            self.on_item(i, item)?;
                        }
                        Recv::Empty => break,
                        Recv::Closed => {
                            self.check_cancel()?;
                            self.on_closed(i)?;
                            progress = true;
                            break;
                        }
                    }
                }
            }
            rr = (rr + 1) % n.max(1);
            if !self.finished && self.ready_to_finish() {
                let Body::Operator(op) = &mut self.body else {
                    unreachable!("operator body")
                };
                op.finish(&mut self.outputs)?;
                self.outputs.end_of_stream()?;
                self.counters.records_out = self.outputs.records_out;
                self.finished = true;
                progress = true;
            }
            if self.finished && self.inputs.iter().all(|i| i.ended) && !self.outputs.has_overflow()
            {
                return Ok(());
            }
            if !progress {
                self.idle_wait();
            }
        }
    }

    fn idle_wait(&self) {
        let timeout = if self.cycle.is_some() || self.outputs.has_overflow() {
            Duration::from_millis(1)
        } else {
            IDLE_WAIT
        };
        let protocol = self.protocol.as_deref();
        let (inputs, mailbox, cancel) = (&self.inputs, &self.mailbox, &self.cancel);
        self.waker.wait_until_timeout(
            || {
                mailbox.has_pending()
                    || cancel.load(Ordering::Relaxed)
                    || inputs.iter().enumerate().any(|(i, inp)| {
                        !inp.ended
                            && !inp.detached
                            && !protocol.is_some_and(|p| p.is_blocked(i))
                            && inp.rx.is_ready()
                    })
            },
            timeout,
        );
    }

    fn is_blocked(&self, input: InputId) -> bool {
        self.protocol.as_ref().is_some_and(|p| p.is_blocked(input))
    }

    fn ready_to_finish(&mut self) -> bool {
        let Some(c) = self.cycle else {
            return self.inputs.iter().all(|i| i.ended);
        };
        let tracker = &self.shared.cycles[c];
        if !self.external_reported {
            if !self
                .inputs
                .iter()
                .all(|i| i.ended || i.loop_counter.is_some())
            {
                return false;
            }
            self.external_reported = true;
            tracker.external_done.fetch_add(1, Ordering::SeqCst);
        }
        if tracker.done.load(Ordering::SeqCst) {
            return true;
        }
        if tracker.external_done.load(Ordering::SeqCst) == tracker.members
            && tracker.inflight.load(Ordering::SeqCst) == 0
        {
            tracker.done.store(true, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// `input`'s sender stopped without end-of-stream: under `upstream`
    /// failover it restarts, so read its next channel (or wait for it).
    fn on_closed(&mut self, input: InputId) -> Result<()> {
        if !self.shared.reattach_inputs {
            return Err(Error::Task(format!(
                "input {input} ({}) closed without end of stream",
                self.inputs[input].edge_name
            )));
        }
        let inp = &mut self.inputs[input];
        match inp.reattach.pop_front() {
            Some(rx) => inp.rx = rx,
            None => inp.detached = true,
        }
        Ok(())
    }

    fn reattach(&mut self, input: InputId, rx: EdgeRx) -> Result<()> {
        let Some(inp) = self.inputs.get_mut(input) else {
            return Err(Error::Task(format!(
                "a restarted sender was attached to input {input}, but the task has {}",
                self.inputs.len()
            )));
        };
        if inp.ended {
            return Ok(()); // it took everything; the sender drops its replay
        }
        if inp.detached {
            inp.rx = rx;
            inp.detached = false;
        } else {
            inp.reattach.push_back(rx);
        }
        Ok(())
    }

    /// Drops the records of `batch` (numbered up to `end` on `input`) that
    /// this task took before: replays of a restarted sender.
    fn unseen(&mut self, input: InputId, batch: Batch, end: u64) -> Result<Option<Batch>> {
        let n = batch.num_rows() as u64;
        let inp = &mut self.inputs[input];
        let taken = inp.taken;
        match seen(taken, n, end) {
            Seen::Gap { first } => Err(Error::Task(format!(
                "input {input} ({}): records {} to {} never arrived (took up to {taken}, the \
                 next batch starts at {first}); a restarted sender did not replay what it had sent",
                inp.edge_name,
                taken + 1,
                first - 1
            ))),
            Seen::All => {
                self.counters.replayed_dropped += n;
                Ok(None)
            }
            Seen::Prefix(skip) => {
                inp.taken = end;
                if skip == 0 {
                    return Ok(Some(batch));
                }
                self.counters.replayed_dropped += skip;
                Ok(Some(batch.slice(skip as usize, (n - skip) as usize)))
            }
        }
    }

    fn on_item(&mut self, input: InputId, item: Item) -> Result<()> {
        match item {
            Item::Data { batch, end } => {
                let Some(batch) = self.unseen(input, batch, end)? else {
                    if let Some(c) = &self.inputs[input].loop_counter {
                        c.fetch_sub(1, Ordering::SeqCst);
                    }
                    return Ok(());
                };
                if self.finished {
                    return Err(Error::Task(format!(
                        "received data on {} after finishing; operators on a cycle must not emit from finish()",
                        self.inputs[input].edge_name
                    )));
                }
                let n = batch.num_rows() as u64;
                self.counters.records_in += n;
                self.counters
                    .count_at(n, self.shared.started, self.shared.timeline_bucket_nanos);
                let counter = self.inputs[input].loop_counter.clone();
                if self.protocol.is_some() {
                    self.event(Event::Record { input }, Some((input, batch)))?;
                } else {
                    self.deliver(input, batch)?;
                }
                if let Some(c) = counter {
                    c.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Item::Barrier { id, seq } => {
                // The coordinator tells a task that checkpoint n committed
                // before it triggers n+1: applying pending controls first
                // lets operators base checkpoint n+1's diff on n.
                for c in self.mailbox.drain() {
                    self.common_control(c)?;
                }
                if self.protocol.is_some() {
                    // While a restarted sender replays what this task took
                    // before, its barrier's position lags this task's own:
                    // the checkpoint keeps the higher one, which is what a
                    // restore of both must skip.
                    let taken = seq.max(self.inputs[input].taken);
                    let p = self.pending.entry(id).or_default();
                    p.first_seen.get_or_insert_with(Instant::now);
                    p.taken.insert(input, taken);
                    self.event(Event::Barrier { input, id }, None)?;
                }
            }
            Item::EndOfStream => {
                self.inputs[input].ended = true;
                self.inputs[input].ended_flag.store(true, Ordering::SeqCst);
                if self.protocol.is_some() {
                    self.event(Event::EndOfInput { input }, None)?;
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, input: InputId, batch: Batch) -> Result<()> {
        match &mut self.body {
            Body::Operator(op) => op.process(input, batch, &mut self.outputs)?,
            Body::Source(_) => unreachable!("sources have no inputs"),
        }
        self.counters.records_out = self.outputs.records_out;
        Ok(())
    }

    /// Feeds `event` to the protocol and carries out its actions; `record`
    /// is the data item the event is about, if any.
    fn event(&mut self, event: Event, mut record: Option<(InputId, Batch)>) -> Result<()> {
        let Some(p) = self.protocol.as_mut() else {
            return Ok(());
        };
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        p.on_event(event, &mut actions);
        let mut result = Ok(());
        for (k, action) in actions.iter().enumerate() {
            result = self.act(*action, &mut record, &actions[k + 1..]);
            if result.is_err() {
                break;
            }
        }
        self.actions = actions;
        result
    }

    fn act(
        &mut self,
        action: Action,
        record: &mut Option<(InputId, Batch)>,
        rest: &[Action],
    ) -> Result<()> {
        match action {
            Action::Deliver => {
                let needed_later = rest.iter().any(|a| matches!(a, Action::Log { .. }));
                let (input, batch) = if needed_later {
                    record.clone()
                } else {
                    record.take()
                }
                .ok_or_else(|| Error::Task("protocol asked to deliver without a record".into()))?;
                self.deliver(input, batch)?;
            }
            Action::Log { input, id } => {
                let (_, batch) = record
                    .as_ref()
                    .ok_or_else(|| Error::Task("protocol asked to log without a record".into()))?;
                self.pending
                    .entry(id)
                    .or_default()
                    .logs
                    .entry(input)
                    .or_default()
                    .push(batch.clone());
            }
            Action::Block { .. } | Action::Unblock { .. } => {}
            Action::Snapshot { id } => {
                let (state, offset) = match &mut self.body {
                    Body::Operator(op) => {
                        let state = op.snapshot_runs(id)?;
                        op.pre_commit(id)?;
                        (state, None)
                    }
                    Body::Source(src) => (None, Some(src.offset())),
                };
                let sent = self.outputs.sent_seqs();
                let p = self.pending.entry(id).or_default();
                p.state = state;
                p.source_offset = offset;
                p.sent = sent;
                p.alignment = p.first_seen.map(|t| t.elapsed()).unwrap_or_default();
            }
            Action::Forward { id } => self.outputs.barrier(id)?,
            Action::Complete { id } => self.complete(id)?,
        }
        Ok(())
    }

    fn complete(&mut self, id: CheckpointId) -> Result<()> {
        let p = self.pending.remove(&id).unwrap_or_default();
        let mut stats = AckStats {
            alignment_nanos: p.alignment.as_nanos() as u64,
            state_bytes: p.state.as_ref().map_or(0, |s| match s {
                TaskState::Capture(c) => c.batch.get_array_memory_size() as u64,
                TaskState::Runs(r) => r.runs.iter().map(|r| r.size_bytes() as u64).sum(),
            }),
            ..Default::default()
        };
        let (state, state_runs) = match p.state {
            Some(TaskState::Capture(c)) => (Some(c), None),
            Some(TaskState::Runs(r)) => (None, Some(r)),
            None => (None, None),
        };
        let channels: Vec<ChannelLog> = p
            .logs
            .into_iter()
            .map(|(input, records)| {
                stats.logged_batches += records.len() as u64;
                stats.logged_records += records.iter().map(|b| b.num_rows() as u64).sum::<u64>();
                ChannelLog {
                    input,
                    edge: self.inputs[input].edge_name.clone(),
                    from_subtask: self.inputs[input].from_subtask,
                    records,
                }
            })
            .collect();
        self.shared.sink.task_snapshot(
            id,
            TaskSnapshot {
                task: self.id.clone(),
                state,
                state_runs,
                channels,
                source_offset: p.source_offset,
                alignment_nanos: stats.alignment_nanos,
                sent_seq: p.sent,
                taken_seq: (0..self.inputs.len())
                    .map(|i| p.taken.get(&i).copied().unwrap_or(self.inputs[i].taken))
                    .collect(),
            },
        )?;
        self.last_done = self.last_done.max(id);
        let _ = self.coord.send(CoordMsg::Ack {
            id,
            task: self.index,
            stats,
        });
        Ok(())
    }

    fn common_control(&mut self, c: Control) -> Result<()> {
        match c {
            Control::Abort(id) => {
                self.event(Event::Abort { id }, None)?;
                if let Body::Operator(op) = &mut self.body {
                    op.abort(id)?;
                }
                self.pending.remove(&id);
                self.last_done = self.last_done.max(id);
            }
            Control::Committed(id) => {
                if let Body::Operator(op) = &mut self.body {
                    op.commit(id)?;
                }
            }
            Control::Reattach { input, rx } => self.reattach(input, rx)?,
            Control::Trigger { .. } | Control::Resume | Control::Finish => {}
        }
        Ok(())
    }

    /// Starts the alignment-timeout clock when the protocol starts aligning
    /// and tells it when the timeout has passed.
    fn alignment_clock(&mut self) -> Result<()> {
        let timeout = self.shared.alignment_timeout;
        if timeout.is_zero() {
            return Ok(());
        }
        let aligning = self.protocol.as_ref().and_then(|p| p.aligning());
        match (aligning, self.align) {
            (None, _) => self.align = None,
            (Some(id), Some((cur, since, sent))) if cur == id => {
                if !sent && since.elapsed() >= timeout {
                    self.align = Some((id, since, true));
                    for inp in &mut self.inputs {
                        inp.queued_reported = inp.queued_reported.min(id.saturating_sub(1));
                    }
                    self.event(Event::AlignmentTimeout { id }, None)?;
                }
            }
            (Some(id), _) => self.align = Some((id, Instant::now(), false)),
        }
        Ok(())
    }

    /// Unaligned checkpoints: while one is in flight, report barriers queued
    /// behind data so that the protocol can overtake that data.
    fn scan_queued(&mut self) -> Result<()> {
        if self.shared.protocol != ProtocolKind::Unaligned {
            return Ok(());
        }
        let latest = self.shared.latest_triggered.load(Ordering::Acquire);
        if latest <= self.last_done {
            return Ok(());
        }
        for i in 0..self.inputs.len() {
            if self.inputs[i].ended {
                continue;
            }
            if let Some(id) = self.inputs[i].rx.queued_barrier() {
                if id > self.inputs[i].queued_reported && id > self.last_done {
                    self.inputs[i].queued_reported = id;
                    self.pending
                        .entry(id)
                        .or_default()
                        .first_seen
                        .get_or_insert_with(Instant::now);
                    self.event(Event::BarrierQueued { input: i, id }, None)?;
                }
            }
        }
        Ok(())
    }
}
