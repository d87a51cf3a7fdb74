//! The barrier machinery shared by [`super::Aligned`] and [`super::Unaligned`].
//!
//! One snapshot id goes through at most two phases at a task:
//! 1. *pending* (aligned modes only): barrier `id` was popped on some inputs,
//!    which are blocked, and the task waits for the rest of its regular inputs;
//! 2. *open*: the task has taken its snapshot and forwarded the barrier, and
//!    logs records on every input whose barrier `id` has not been popped yet.
//!
//! ABS barriers are injected by one coordinator in increasing id order and
//! channels are FIFO, so on every input barrier `n` precedes barrier `n + 1`.
//! That makes a single watermark (`latest`) enough to recognise stale
//! barriers of started or finished checkpoints. Aborts arrive out of band,
//! possibly before older barriers that are still travelling, so aborted ids
//! above the watermark are remembered separately instead of raising it.

use std::collections::{BTreeMap, BTreeSet};

use super::{Action, CheckpointId, Event, InputId, InputKind};

/// How a task reacts to the first sign of a barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Align on regular inputs; never switch.
    Aligned,
    /// Snapshot on the first barrier popped or seen queued.
    Unaligned,
    /// Align first; switch to unaligned on [`Event::AlignmentTimeout`].
    AlignedThenUnaligned,
}

#[derive(Clone, Debug)]
struct Pending {
    id: CheckpointId,
    /// Inputs that popped barrier `id` (and are blocked since).
    arrived: Vec<bool>,
}

#[derive(Clone, Debug)]
pub(crate) struct Core {
    mode: Mode,
    kinds: Vec<InputKind>,
    ended: Vec<bool>,
    blocked: Vec<bool>,
    pending: Option<Pending>,
    /// Snapshots taken whose logs are not all closed: `true` = still logging.
    open: BTreeMap<CheckpointId, Vec<bool>>,
    /// Highest id this task has started, finished or aborted.
    latest: Option<CheckpointId>,
    /// Aborted ids above `latest` (their late barriers must be ignored).
    aborted: BTreeSet<CheckpointId>,
}

impl Core {
    pub(crate) fn new(inputs: &[InputKind], mode: Mode) -> Self {
        let n = inputs.len();
        Core {
            mode,
            kinds: inputs.to_vec(),
            ended: vec![false; n],
            blocked: vec![false; n],
            pending: None,
            open: BTreeMap::new(),
            latest: None,
            aborted: BTreeSet::new(),
        }
    }

    pub(crate) fn is_blocked(&self, input: InputId) -> bool {
        self.blocked.get(input).copied().unwrap_or(false)
    }

    pub(crate) fn aligning(&self) -> Option<CheckpointId> {
        self.pending.as_ref().map(|p| p.id)
    }

    fn is_stale(&self, id: CheckpointId) -> bool {
        self.latest.is_some_and(|l| id <= l) || self.aborted.contains(&id)
    }

    fn live_regular_inputs(&self) -> impl Iterator<Item = InputId> + '_ {
        (0..self.kinds.len()).filter(|&i| self.kinds[i] == InputKind::Regular && !self.ended[i])
    }

    pub(crate) fn on_event(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::Record { input } => self.on_record(input, out),
            Event::Barrier { input, id } => self.on_barrier(input, id, out),
            Event::BarrierQueued { id, .. } => {
                if self.is_stale(id) || self.open.contains_key(&id) {
                    return;
                }
                match self.mode {
                    // Overtake the queued data: the input stays open (logged)
                    // until the barrier is popped there.
                    Mode::Unaligned => {
                        self.start(id);
                        let none = vec![false; self.kinds.len()];
                        self.take(id, &none, out);
                    }
                    // As in Flink, the alignment (and its timeout clock)
                    // starts when the barrier is announced, so a timeout can
                    // fire even while backpressure keeps it queued. Only when
                    // nothing else is in flight here: a later id announced
                    // while an earlier one is unfinished must not make the
                    // barriers in between look stale.
                    Mode::AlignedThenUnaligned
                        if self.pending.is_none() && self.open.is_empty() =>
                    {
                        self.start(id);
                        self.pending = Some(Pending {
                            id,
                            arrived: vec![false; self.kinds.len()],
                        });
                        // Without live regular inputs there is nothing to wait for.
                        self.finish_alignment_if_ready(out);
                    }
                    Mode::AlignedThenUnaligned | Mode::Aligned => {}
                }
            }
            Event::Trigger { id } => {
                if self.is_stale(id) || self.pending.is_some() {
                    return;
                }
                // A task with live regular inputs waits for their barriers
                // (aligned); unaligned tasks may snapshot at once.
                if self.mode == Mode::Unaligned || self.live_regular_inputs().next().is_none() {
                    self.start(id);
                    let none = vec![false; self.kinds.len()];
                    self.take(id, &none, out);
                }
            }
            Event::AlignmentTimeout { id } => {
                if self.mode == Mode::AlignedThenUnaligned
                    && self.pending.as_ref().is_some_and(|p| p.id == id)
                {
                    let p = self.pending.take().expect("checked above");
                    self.take(id, &p.arrived, out);
                }
            }
            Event::EndOfInput { input } => self.on_end(input, out),
            Event::Abort { id } => {
                if self.pending.as_ref().is_some_and(|p| p.id == id) {
                    self.pending = None;
                    self.unblock_all(out);
                }
                self.open.remove(&id);
                if !self.is_stale(id) {
                    self.aborted.insert(id);
                }
            }
        }
    }

    fn on_record(&mut self, input: InputId, out: &mut Vec<Action>) {
        debug_assert!(
            !self.is_blocked(input),
            "driver popped a record from blocked input {input}"
        );
        for (&id, logging) in &self.open {
            if logging[input] {
                out.push(Action::Log { input, id });
            }
        }
        out.push(Action::Deliver);
    }

    fn on_barrier(&mut self, input: InputId, id: CheckpointId, out: &mut Vec<Action>) {
        if let Some(logging) = self.open.get_mut(&id) {
            if logging[input] {
                logging[input] = false;
                self.complete_if_closed(id, out);
            }
            return;
        }
        if let Some(p) = &self.pending {
            if p.id == id {
                self.arrive(input, out);
                return;
            }
            if id < p.id {
                return;
            }
            // A newer barrier while aligning an older one: the older one was
            // aborted upstream (its barrier will never come everywhere).
            self.pending = None;
            self.unblock_all(out);
        }
        if self.is_stale(id) {
            return;
        }
        self.start(id);
        match self.mode {
            Mode::Unaligned => {
                let mut closed = vec![false; self.kinds.len()];
                closed[input] = true;
                self.take(id, &closed, out);
            }
            Mode::Aligned | Mode::AlignedThenUnaligned => {
                self.pending = Some(Pending {
                    id,
                    arrived: vec![false; self.kinds.len()],
                });
                self.arrive(input, out);
            }
        }
    }

    fn start(&mut self, id: CheckpointId) {
        let latest = self.latest.map_or(id, |l| l.max(id));
        self.latest = Some(latest);
        // Aborted ids at or below the watermark are covered by it.
        self.aborted = self.aborted.split_off(&latest.saturating_add(1));
    }

    /// Barrier of the pending alignment popped on `input`.
    fn arrive(&mut self, input: InputId, out: &mut Vec<Action>) {
        let p = self.pending.as_mut().expect("pending alignment");
        if p.arrived[input] {
            return;
        }
        p.arrived[input] = true;
        if !self.finish_alignment_if_ready(out) {
            self.blocked[input] = true;
            out.push(Action::Block { input });
        }
    }

    /// Completes the pending alignment when every live regular input has
    /// delivered its barrier. Returns whether it did.
    fn finish_alignment_if_ready(&mut self, out: &mut Vec<Action>) -> bool {
        let Some(p) = &self.pending else {
            return false;
        };
        if self.live_regular_inputs().any(|i| !p.arrived[i]) {
            return false;
        }
        let p = self.pending.take().expect("checked above");
        self.take(p.id, &p.arrived, out);
        true
    }

    /// Takes snapshot `id` now: snapshot, forward, unblock, and log every live
    /// input whose barrier has not been popped (`closed[i]` false).
    fn take(&mut self, id: CheckpointId, closed: &[bool], out: &mut Vec<Action>) {
        out.push(Action::Snapshot { id });
        out.push(Action::Forward { id });
        self.unblock_all(out);
        let logging: Vec<bool> = (0..self.kinds.len())
            .map(|i| !closed[i] && !self.ended[i])
            .collect();
        if logging.iter().any(|&l| l) {
            self.open.insert(id, logging);
        } else {
            out.push(Action::Complete { id });
        }
    }

    fn unblock_all(&mut self, out: &mut Vec<Action>) {
        for (input, b) in self.blocked.iter_mut().enumerate() {
            if *b {
                *b = false;
                out.push(Action::Unblock { input });
            }
        }
    }

    fn complete_if_closed(&mut self, id: CheckpointId, out: &mut Vec<Action>) {
        if self
            .open
            .get(&id)
            .is_some_and(|logging| logging.iter().all(|&l| !l))
        {
            self.open.remove(&id);
            out.push(Action::Complete { id });
        }
    }

    fn on_end(&mut self, input: InputId, out: &mut Vec<Action>) {
        if self.ended[input] {
            return;
        }
        self.ended[input] = true;
        let ids: Vec<CheckpointId> = self.open.keys().copied().collect();
        for id in ids {
            if let Some(logging) = self.open.get_mut(&id) {
                logging[input] = false;
            }
            self.complete_if_closed(id, out);
        }
        self.finish_alignment_if_ready(out);
    }
}
