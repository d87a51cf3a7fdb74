//! The event loop of the timed simulator: tasks, shuffles, the coordinator.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use super::{TimedConfig, TimedReport};
use crate::error::{Error, Result};
use crate::protocol::ProtocolKind;
use crate::sim::SplitMix64;

/// Source, stage1, stage2, stage3; stages 1..=3 are keyed, each behind a
/// shuffle (shuffle `g` feeds stage `g + 1`).
const STAGES: usize = 4;
const KEYED_STAGES: f64 = 3.0;
/// Source tasks capture only their offsets.
const SOURCE_CAPTURE_S: f64 = 1e-6;

type Nanos = u64;

fn ns(seconds: f64) -> Nanos {
    (seconds * 1e9).round().max(0.0) as Nanos
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    /// A task finished its current work item.
    Done(usize),
    /// Records (per receiver) reach a shuffle's receivers; `after` is the
    /// newest checkpoint whose barrier the sender had emitted first.
    Arrive {
        shuffle: usize,
        amount: f64,
        after: u64,
    },
    BarrierArrive {
        shuffle: usize,
        id: u64,
    },
    EndArrive {
        shuffle: usize,
    },
    /// The coordinator's interval timer.
    Trigger,
    SourceTrigger {
        task: usize,
        id: u64,
    },
    WriteDone,
    AckArrive {
        id: u64,
    },
    Committed {
        id: u64,
    },
    Resume {
        task: usize,
    },
}

struct Scheduled {
    at: Nanos,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    /// Earliest first in a max-heap; ties in scheduling order (FIFO channels).
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Work {
    Idle,
    Chunk(f64),
    Capture(u64),
}

#[derive(Debug)]
struct Task {
    stage: usize,
    work: Work,
    /// Records taken from the input shuffle (per this receiver).
    consumed: f64,
    /// Source: records still to emit.
    remaining: f64,
    /// Output of the last chunk, not yet sent (its shuffle was full).
    pending_out: f64,
    /// Newest checkpoint captured / whose barrier was emitted.
    epoch: u64,
    /// Source: newest checkpoint triggered here.
    triggered: u64,
    paused_at: Option<Nanos>,
    records_since_capture: f64,
    write_until: Nanos,
    waiting: bool,
    blocked: bool,
    finished: bool,
}

/// One all-to-all shuffle, by symmetry: every figure is per receiver.
#[derive(Debug, Default)]
struct Shuffle {
    arrived: f64,
    sent: f64,
    /// Of `arrived`: sent after the sender's barrier of `open`.
    post: f64,
    /// The checkpoint whose barriers are arriving (0: none).
    open: u64,
    barriered: usize,
    ended: usize,
    first_barrier: Nanos,
    /// Sent after the sender's barrier of the coordinator's open checkpoint.
    sent_post: f64,
    /// Receivers that captured the open checkpoint.
    captured: usize,
    /// Multiset of the receivers' `consumed` (as f64 bits: ordered for >= 0).
    consumed: BTreeMap<u64, u32>,
    /// Receivers waiting for any data / for pre-barrier data, by consumed.
    wait_any: BinaryHeap<Reverse<(u64, usize)>>,
    wait_pre: BinaryHeap<Reverse<(u64, usize)>>,
    /// Senders waiting for room: before / after their barrier (while
    /// receivers align, the data after a barrier is held in its own
    /// channels' buffers and blocks only its senders, as in Flink).
    blocked_pre: VecDeque<usize>,
    blocked_post: VecDeque<usize>,
}

impl Shuffle {
    fn pre_barrier(&self) -> f64 {
        self.arrived - self.post
    }

    /// Whether a sender (after its barrier or not) must wait for room.
    fn full(&self, post_sender: bool, n: usize, limit: f64) -> bool {
        if self.captured == n || (self.sent_post == 0.0 && !post_sender) {
            self.sent - self.least_consumed() >= limit
        } else if post_sender {
            self.sent_post >= limit
        } else {
            (self.sent - self.sent_post) - self.least_consumed() >= limit
        }
    }

    fn least_consumed(&self) -> f64 {
        self.consumed
            .keys()
            .next()
            .map_or(0.0, |&b| f64::from_bits(b))
    }

    fn move_consumed(&mut self, from: f64, to: f64) {
        let k = from.to_bits();
        if let Some(n) = self.consumed.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.consumed.remove(&k);
            }
        }
        *self.consumed.entry(to.to_bits()).or_insert(0) += 1;
    }
}

#[derive(Debug, Default)]
struct Coordinator {
    open: u64,
    next_id: u64,
    triggered_at: Nanos,
    acks: usize,
    ack_free_at: Nanos,
    bytes: f64,
    alignment: Nanos,
}

pub(super) struct Sim {
    cfg: TimedConfig,
    n: usize,
    rng: SplitMix64,
    now: Nanos,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    tasks: Vec<Task>,
    shuffles: Vec<Shuffle>,
    coord: Coordinator,
    finished: usize,
    last_finish: Nanos,
    sources_done: usize,
    report: TimedReport,
    paused_total: f64,
    eps: f64,
}

impl Sim {
    pub(super) fn new(cfg: &TimedConfig) -> Self {
        let n = cfg.nodes;
        let tasks = (0..STAGES * n)
            .map(|t| Task {
                stage: t / n,
                work: Work::Idle,
                consumed: 0.0,
                remaining: if t < n {
                    cfg.records_per_node as f64
                } else {
                    0.0
                },
                pending_out: 0.0,
                epoch: 0,
                triggered: 0,
                paused_at: None,
                records_since_capture: 0.0,
                write_until: 0,
                waiting: false,
                blocked: false,
                finished: false,
            })
            .collect();
        let shuffles = (1..STAGES)
            .map(|_| {
                let mut s = Shuffle::default();
                s.consumed.insert(0f64.to_bits(), n as u32);
                s
            })
            .collect();
        Sim {
            eps: cfg.cost.chunk_records * 1e-9,
            cfg: cfg.clone(),
            n,
            rng: SplitMix64::new(cfg.seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            tasks,
            shuffles,
            coord: Coordinator {
                next_id: 1,
                ..Default::default()
            },
            finished: 0,
            last_finish: 0,
            sources_done: 0,
            report: TimedReport::default(),
            paused_total: 0.0,
        }
    }

    fn at(&mut self, at: Nanos, ev: Ev) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            ev,
        });
    }

    fn after(&mut self, seconds: f64, ev: Ev) {
        self.at(self.now + ns(seconds), ev);
    }

    /// Latency of a message between tasks (or to and from the coordinator).
    fn latency(&self) -> f64 {
        if self.n == 1 {
            self.cfg.cost.channel_latency_s
        } else {
            self.cfg.cost.net_latency_s
        }
    }

    fn aligns(&self) -> bool {
        matches!(
            self.cfg.protocol,
            ProtocolKind::Aligned | ProtocolKind::Sync
        )
    }

    fn sync(&self) -> bool {
        self.cfg.protocol == ProtocolKind::Sync
    }

    pub(super) fn run(mut self) -> Result<TimedReport> {
        for t in 0..self.tasks.len() {
            self.step(t);
        }
        if let Some(i) = self.cfg.interval_s {
            self.after(i, Ev::Trigger);
        }
        while let Some(s) = self.queue.pop() {
            self.now = s.at;
            self.report.events += 1;
            self.handle(s.ev);
        }
        if self.finished != self.tasks.len() {
            let stuck: Vec<_> = self
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| !t.finished)
                .take(5)
                .map(|(i, t)| format!("task {i} (stage {}): {t:?}", t.stage))
                .collect();
            return Err(Error::Task(format!(
                "timed simulation stalled with {} of {} tasks unfinished (a simulator bug; \
                 replay with seed {}): {}",
                self.tasks.len() - self.finished,
                self.tasks.len(),
                self.cfg.seed,
                stuck.join("; ")
            )));
        }
        let mut r = self.report;
        r.runtime_s = self.last_finish as f64 / 1e9;
        r.records = self.cfg.records_per_node * self.n as u64;
        r.throughput_rps = r.records as f64 / r.runtime_s.max(1e-12);
        r.paused_s = self.paused_total / self.n as f64;
        Ok(r)
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Done(t) => self.done(t),
            Ev::Arrive {
                shuffle,
                amount,
                after,
            } => {
                let s = &mut self.shuffles[shuffle];
                s.arrived += amount;
                let post = after != 0 && after == s.open;
                if post {
                    s.post += amount;
                }
                self.wake_waiting(shuffle, !post);
            }
            Ev::BarrierArrive { shuffle, id } => {
                let now = self.now;
                let n = self.n;
                let s = &mut self.shuffles[shuffle];
                if s.open != id {
                    s.open = id;
                    s.barriered = 0;
                    s.post = 0.0;
                    s.first_barrier = now;
                }
                s.barriered += 1;
                if s.barriered == n {
                    self.wake_all(shuffle);
                }
            }
            Ev::EndArrive { shuffle } => {
                self.shuffles[shuffle].ended += 1;
                if self.shuffles[shuffle].ended == self.n {
                    self.wake_all(shuffle);
                }
            }
            Ev::Trigger => self.trigger(),
            Ev::SourceTrigger { task, id } => {
                self.tasks[task].triggered = id;
                if self.tasks[task].finished {
                    // Its stream ended: its part is done; the barrier still
                    // goes out (after the end) so receivers can align.
                    self.tasks[task].epoch = id;
                    self.after(self.latency(), Ev::BarrierArrive { shuffle: 0, id });
                    self.ack();
                } else {
                    self.step(task);
                }
            }
            Ev::WriteDone => self.ack(),
            Ev::AckArrive { id } => {
                if id == self.coord.open {
                    let c = &mut self.coord;
                    c.ack_free_at = c.ack_free_at.max(self.now) + ns(self.cfg.cost.ack_s);
                    c.acks += 1;
                    if c.acks == self.tasks.len() {
                        let at = c.ack_free_at + ns(self.cfg.cost.commit_s);
                        self.at(at, Ev::Committed { id });
                    }
                }
            }
            Ev::Committed { id } => self.committed(id),
            Ev::Resume { task } => {
                let t = &mut self.tasks[task];
                if let Some(since) = t.paused_at.take() {
                    let pause = (self.now - since) as f64 / 1e9;
                    self.paused_total += pause;
                    self.report.max_pause_s = self.report.max_pause_s.max(pause);
                }
                self.step(task);
            }
        }
    }

    fn ack(&mut self) {
        let id = self.coord.open;
        self.after(self.latency(), Ev::AckArrive { id });
    }

    fn trigger(&mut self) {
        if self.sources_done > 0 || self.coord.open != 0 {
            return;
        }
        let id = self.coord.next_id;
        self.coord.next_id += 1;
        self.coord.open = id;
        self.coord.triggered_at = self.now;
        self.coord.acks = 0;
        self.coord.bytes = 0.0;
        self.coord.alignment = 0;
        let lat = self.latency();
        for task in 0..self.n {
            self.after(lat, Ev::SourceTrigger { task, id });
        }
    }

    fn committed(&mut self, id: u64) {
        let c = &mut self.coord;
        self.report.checkpoints += 1;
        self.report
            .checkpoint_s
            .push((self.now - c.triggered_at) as f64 / 1e9);
        self.report.state_bytes_max = self.report.state_bytes_max.max(c.bytes as u64);
        self.report.alignment_max_s = self.report.alignment_max_s.max(c.alignment as f64 / 1e9);
        let next = c.triggered_at + ns(self.cfg.interval_s.unwrap_or(0.0));
        c.open = 0;
        for s in &mut self.shuffles {
            if s.open == id {
                s.open = 0;
                s.post = 0.0;
                s.barriered = 0;
            }
            s.sent_post = 0.0;
            s.captured = 0;
        }
        for g in 0..self.shuffles.len() {
            self.wake_blocked(g);
        }
        if self.sync() {
            let lat = self.latency();
            for task in 0..self.n {
                self.after(lat, Ev::Resume { task });
            }
        }
        if self.sources_done == 0 {
            let at = next.max(self.now);
            self.at(at, Ev::Trigger);
        }
    }

    /// Decides what an idle task does next.
    fn step(&mut self, t: usize) {
        let task = &self.tasks[t];
        if task.work != Work::Idle || task.finished || task.waiting || task.blocked {
            return;
        }
        if task.pending_out > 0.0 && !self.send(t) {
            return;
        }
        if self.tasks[t].stage == 0 {
            self.step_source(t);
        } else {
            self.step_stage(t);
        }
    }

    fn step_source(&mut self, t: usize) {
        let task = &self.tasks[t];
        if task.triggered > task.epoch {
            let id = task.triggered;
            self.start(t, Work::Capture(id), SOURCE_CAPTURE_S);
            return;
        }
        if task.paused_at.is_some() {
            return;
        }
        if task.remaining <= self.eps {
            self.finish(t);
            return;
        }
        let amount = task.remaining.min(self.cfg.cost.chunk_records);
        self.tasks[t].remaining -= amount;
        let d = self.chunk_time(t, amount);
        self.start(t, Work::Chunk(amount), d);
    }

    fn step_stage(&mut self, t: usize) {
        let g = self.tasks[t].stage - 1;
        let (n, chunk, eps) = (self.n, self.cfg.cost.chunk_records, self.eps);
        let aligns = self.aligns();
        let s = &self.shuffles[g];
        let task = &self.tasks[t];
        // Aligning: some barrier of the open checkpoint is in and this task
        // has not captured it. Senders that ended without one (the last
        // checkpoint of a run) end the alignment.
        let aligning = aligns
            && s.open != 0
            && s.barriered > 0
            && task.epoch < s.open
            && (s.barriered == n || s.ended < n);
        if aligning && s.barriered == n && task.consumed >= s.pre_barrier() - eps {
            let (id, waited) = (s.open, self.now - s.first_barrier);
            self.coord.alignment = self.coord.alignment.max(waited);
            let keys = self.keys_to_capture(t);
            let d = keys * self.cfg.cost.capture_s_per_key;
            self.start(t, Work::Capture(id), d);
            return;
        }
        let limit = if aligning { s.pre_barrier() } else { s.arrived };
        let avail = limit - task.consumed;
        let flushing = s.ended == n || (aligning && s.barriered == n);
        if avail >= chunk - eps || (avail > eps && flushing) {
            let amount = avail.min(chunk);
            let from = task.consumed;
            let to = from + amount;
            self.tasks[t].consumed = to;
            self.tasks[t].records_since_capture += amount;
            self.shuffles[g].move_consumed(from, to);
            self.wake_blocked(g);
            let d = self.chunk_time(t, amount);
            self.start(t, Work::Chunk(amount), d);
            return;
        }
        if s.ended == n && !aligning && avail <= eps {
            self.finish(t);
            return;
        }
        let key = task.consumed.to_bits();
        self.tasks[t].waiting = true;
        let s = &mut self.shuffles[g];
        if aligning {
            s.wait_pre.push(Reverse((key, t)));
        } else {
            s.wait_any.push(Reverse((key, t)));
        }
    }

    fn start(&mut self, t: usize, work: Work, seconds: f64) {
        self.tasks[t].work = work;
        self.after(seconds, Ev::Done(t));
    }

    /// A chunk's time: its records at the node's rate (jittered, slower
    /// while a background write runs), or its share of the network if the
    /// node cannot send it faster.
    fn chunk_time(&mut self, t: usize, records: f64) -> f64 {
        let c = &self.cfg.cost;
        let mut cpu = records * c.record_s * self.rng.lognormal(c.jitter);
        if self.now < self.tasks[t].write_until {
            cpu *= 1.0 + c.background_slowdown;
        }
        let remote = (self.n - 1) as f64 / self.n as f64;
        let sends = self.tasks[t].stage < STAGES - 1;
        let net = if sends {
            records * c.record_bytes * remote / c.net_bytes_per_s
        } else {
            0.0
        };
        cpu.max(net)
    }

    fn done(&mut self, t: usize) {
        let work = std::mem::replace(&mut self.tasks[t].work, Work::Idle);
        match work {
            Work::Idle => unreachable!("Done for an idle task"),
            Work::Chunk(amount) => {
                if self.tasks[t].stage < STAGES - 1 {
                    self.tasks[t].pending_out = amount;
                }
            }
            Work::Capture(id) => self.captured(t, id),
        }
        self.step(t);
    }

    fn captured(&mut self, t: usize, id: u64) {
        let stage = self.tasks[t].stage;
        self.tasks[t].epoch = id;
        if stage > 0 {
            self.shuffles[stage - 1].captured += 1;
            if self.shuffles[stage - 1].captured == self.n {
                self.wake_blocked(stage - 1);
            }
        }
        if stage < STAGES - 1 {
            self.after(self.latency(), Ev::BarrierArrive { shuffle: stage, id });
        }
        if stage == 0 {
            if self.sync() {
                self.tasks[t].paused_at = Some(self.now);
            }
            self.ack();
            return;
        }
        let keys = self.keys_to_capture(t);
        self.tasks[t].records_since_capture = 0.0;
        let c = &self.cfg.cost;
        let bytes = keys * c.state_bytes_per_key;
        let share = c.write_bytes_per_s / KEYED_STAGES;
        let write = (c.write_latency_s + bytes / share) * self.rng.lognormal(c.jitter);
        self.coord.bytes += bytes;
        if !self.sync() {
            self.tasks[t].write_until = self.now + ns(write);
        }
        self.after(write, Ev::WriteDone);
    }

    /// Keys a capture copies: sync takes the whole state every time; ABS
    /// the keys touched since the last capture (uniform keys: each record
    /// touches a random one).
    fn keys_to_capture(&self, t: usize) -> f64 {
        let keys = self.cfg.keys_per_node as f64;
        if self.sync() || keys == 0.0 {
            return keys;
        }
        let r = self.tasks[t].records_since_capture;
        keys * -(-r / keys).exp_m1()
    }

    /// Sends the pending output of `t` into its shuffle, unless the shuffle
    /// is full (then `t` waits in its blocked list).
    fn send(&mut self, t: usize) -> bool {
        let g = self.tasks[t].stage;
        let limit = self.cfg.cost.buffer_records;
        let post = self.post_sender(t);
        let s = &mut self.shuffles[g];
        if s.full(post, self.n, limit) {
            self.tasks[t].blocked = true;
            if post {
                s.blocked_post.push_back(t);
            } else {
                s.blocked_pre.push_back(t);
            }
            return false;
        }
        let amount = self.tasks[t].pending_out / self.n as f64;
        s.sent += amount;
        if post {
            s.sent_post += amount;
        }
        self.tasks[t].pending_out = 0.0;
        let after = self.tasks[t].epoch;
        self.after(
            self.latency(),
            Ev::Arrive {
                shuffle: g,
                amount,
                after,
            },
        );
        true
    }

    fn finish(&mut self, t: usize) {
        let stage = self.tasks[t].stage;
        self.tasks[t].finished = true;
        self.finished += 1;
        self.last_finish = self.last_finish.max(self.now);
        if stage == 0 {
            self.sources_done += 1;
        }
        if stage < STAGES - 1 {
            self.after(self.latency(), Ev::EndArrive { shuffle: stage });
        }
    }

    /// Whether `t` has sent the barrier of the open checkpoint.
    fn post_sender(&self, t: usize) -> bool {
        self.coord.open != 0 && self.tasks[t].epoch == self.coord.open
    }

    /// Lets blocked senders of shuffle `g` go while there is room; senders
    /// of one kind share one condition, so the first that blocks again ends
    /// the round.
    fn wake_blocked(&mut self, g: usize) {
        let (n, limit) = (self.n, self.cfg.cost.buffer_records);
        for post in [false, true] {
            loop {
                let s = &mut self.shuffles[g];
                let queue = if post {
                    &mut s.blocked_post
                } else {
                    &mut s.blocked_pre
                };
                if queue.is_empty() {
                    break;
                }
                let head = queue[0];
                let head_post = self.post_sender(head);
                let s = &self.shuffles[g];
                if s.full(head_post, n, limit) {
                    break;
                }
                let s = &mut self.shuffles[g];
                let u = if post {
                    s.blocked_post.pop_front()
                } else {
                    s.blocked_pre.pop_front()
                }
                .expect("not empty");
                self.tasks[u].blocked = false;
                self.step(u);
                if self.tasks[u].blocked {
                    break;
                }
            }
        }
    }

    /// Wakes receivers that now have a chunk to take.
    fn wake_waiting(&mut self, g: usize, pre_barrier_too: bool) {
        let chunk = self.cfg.cost.chunk_records - self.eps;
        loop {
            let s = &mut self.shuffles[g];
            let ready = |h: &BinaryHeap<Reverse<(u64, usize)>>, limit: f64| {
                h.peek()
                    .is_some_and(|Reverse((c, _))| limit - f64::from_bits(*c) >= chunk)
            };
            let t = if ready(&s.wait_any, s.arrived) {
                s.wait_any.pop()
            } else if pre_barrier_too && ready(&s.wait_pre, s.pre_barrier()) {
                s.wait_pre.pop()
            } else {
                return;
            };
            let Reverse((_, t)) = t.expect("peeked");
            self.tasks[t].waiting = false;
            self.step(t);
        }
    }

    /// Every receiver re-decides: all barriers or all ends are in.
    fn wake_all(&mut self, g: usize) {
        let s = &mut self.shuffles[g];
        let mut all: Vec<usize> = s.wait_any.drain().map(|Reverse((_, t))| t).collect();
        all.extend(s.wait_pre.drain().map(|Reverse((_, t))| t));
        all.sort_unstable();
        for t in all {
            self.tasks[t].waiting = false;
            self.step(t);
        }
    }
}
