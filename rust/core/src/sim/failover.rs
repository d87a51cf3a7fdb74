//! Failover simulator: a random DAG with several sinks runs under a real
//! protocol machine ([`for_task`]) while one task fails at a random step;
//! the tasks [`restart_set`] names (the same rule the runtime's coordinator
//! applies) restart from the last completed checkpoint, the rest keep
//! running and drop replays by per-channel sequence number, exactly as the
//! runtime's tasks do ([`crate::protocol::sequence::seen`]).
//!
//! Semantics chosen so that a failure-free run has one answer whatever the
//! schedule: sources emit numbered tokens; every other task counts the
//! tokens it takes (its state) and sends each, mapped by a pure function of
//! the token and the task, on every output; sinks are two-phase-commit:
//! what a sink took before its snapshot of checkpoint n is published when n
//! completes, and a restarted sink drops what it had not published. A run
//! is correct when every sink published exactly the multiset of a
//! failure-free run, every task's count equals the failure-free count, and
//! no task outside the restart set restarted.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::rng::SplitMix64;
use crate::error::{Error, Result};
use crate::graph::{restart_set, FailoverStrategy, Topology};
use crate::protocol::sequence::{seen, Seen};
use crate::protocol::{for_task, Action, CheckpointId, Event, InputKind, Protocol, ProtocolKind};

/// What to simulate. Everything random is drawn from `seed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverConfig {
    pub protocol: ProtocolKind,
    pub strategy: FailoverStrategy,
    pub seed: u64,
    /// Vertices in total, `sources` of them sources (one task each).
    pub vertices: usize,
    pub sources: usize,
    /// Probability, in percent, that a non-source vertex gets a second input
    /// (a merge; the rule then often falls back to the region).
    pub merge_percent: u32,
    pub tokens_per_source: u64,
    /// Task failures to inject at random steps (0: a failure-free run). A
    /// second failure can restore a checkpoint taken while healthy tasks
    /// were still dropping the first one's replay.
    pub failures: usize,
    /// Healthy tasks drop replays by sequence number (`false` only to show
    /// that the checks catch what that prevents).
    pub dedup: bool,
}

impl FailoverConfig {
    pub fn new(protocol: ProtocolKind, strategy: FailoverStrategy, seed: u64) -> Self {
        FailoverConfig {
            protocol,
            strategy,
            seed,
            vertices: 7,
            sources: 2,
            merge_percent: 20,
            tokens_per_source: 20,
            failures: 2,
            dedup: true,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverReport {
    /// `(from, to)` per channel.
    pub edges: Vec<(usize, usize)>,
    /// Sinks' published tokens (sorted), by sink task.
    pub published: BTreeMap<usize, Vec<u64>>,
    /// Every task's final count of tokens taken.
    pub counts: Vec<u64>,
    /// Per failure: the failed task, the tasks restarted, and why
    /// `upstream` fell back to the region (if it did).
    pub failures: Vec<(usize, Vec<usize>, Option<String>)>,
    pub checkpoints_completed: u64,
    pub restored_from: Option<CheckpointId>,
    /// Tokens healthy tasks dropped as replays.
    pub replayed_dropped: u64,
    /// A protocol or sequence violation (a gap, a deadlock), if any.
    pub violation: Option<String>,
}

#[derive(Clone, Copy, Debug)]
enum Item {
    Token { value: u64, seq: u64 },
    Barrier { id: CheckpointId, seq: u64 },
}

/// One channel: segments are the queues of successive senders (a restarted
/// sender writes a new one; the receiver drains the old one first).
#[derive(Debug)]
struct Chan {
    from: usize,
    to: usize,
    segments: VecDeque<VecDeque<Item>>,
    /// Records the (current) sender has sent.
    sent: u64,
}

impl Chan {
    fn front(&self) -> Option<&Item> {
        self.segments.iter().find_map(|s| s.front())
    }
    fn pop(&mut self) -> Option<Item> {
        while let Some(s) = self.segments.front_mut() {
            if let Some(item) = s.pop_front() {
                return Some(item);
            }
            if self.segments.len() == 1 {
                return None;
            }
            self.segments.pop_front();
        }
        None
    }
    fn push(&mut self, item: Item) {
        self.segments.back_mut().expect("a segment").push_back(item);
    }
}

/// One task's part of a checkpoint.
#[derive(Clone, Debug, Default)]
struct TaskSnap {
    count: u64,
    emitted: u64,
    sent: Vec<u64>,
    taken: BTreeMap<usize, u64>,
    logs: Vec<(usize, u64)>,
    snapshotted: bool,
}

#[derive(Debug, Default)]
struct Ckpt {
    tasks: BTreeMap<usize, TaskSnap>,
    done: BTreeSet<usize>,
}

struct Task {
    machine: Box<dyn Protocol>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    count: u64,
    emitted: u64,
    taken: Vec<u64>,
    /// Sink: published, and taken but not published (tagged with the
    /// checkpoint that captured it, or `None` if taken since).
    published: Vec<u64>,
    staged: Vec<(Option<CheckpointId>, u64)>,
    /// Controls (aborts) not applied yet, as the runtime's mailbox.
    mailbox: VecDeque<CheckpointId>,
    restarts: u32,
}

struct Sim {
    cfg: FailoverConfig,
    rng: SplitMix64,
    chans: Vec<Chan>,
    tasks: Vec<Task>,
    in_flight: Option<(CheckpointId, Ckpt)>,
    last_completed: Option<(CheckpointId, BTreeMap<usize, TaskSnap>)>,
    next_id: CheckpointId,
    completed: u64,
    /// Steps at which a task fails, ascending.
    fail_at: VecDeque<u64>,
    failures: Vec<(usize, Vec<usize>, Option<String>)>,
    restored_from: Option<CheckpointId>,
    dropped: u64,
    actions: Vec<Action>,
}

/// Every vertex past the sources gets one input from a lower vertex, and
/// with `merge_percent` a second one; sinks are the vertices without outputs.
fn build_graph(cfg: &FailoverConfig, rng: &mut SplitMix64) -> Vec<(usize, usize)> {
    let mut edges = Vec::new();
    for v in cfg.sources..cfg.vertices {
        let u = rng.below(v);
        edges.push((u, v));
        if rng.chance(cfg.merge_percent, 100) {
            let w = rng.below(v);
            if w != u {
                edges.push((w, v));
            }
        }
    }
    edges
}

fn map_token(value: u64, task: usize) -> u64 {
    value.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) ^ (task as u64 + 1)
}

/// Runs one simulation.
pub fn run(cfg: &FailoverConfig) -> Result<FailoverReport> {
    if cfg.protocol == ProtocolKind::None || cfg.protocol.pauses_sources() {
        return Err(Error::Config(format!(
            "the failover simulator runs aligned, unaligned or chandy-lamport, not {}",
            cfg.protocol
        )));
    }
    if cfg.sources == 0 || cfg.sources >= cfg.vertices {
        return Err(Error::Config(format!(
            "need 1 <= sources < vertices, got sources={} vertices={}",
            cfg.sources, cfg.vertices
        )));
    }
    let mut rng = SplitMix64::new(cfg.seed);
    let edges = build_graph(cfg, &mut rng);
    let n = cfg.vertices;
    let mut inputs = vec![Vec::new(); n];
    let mut outputs = vec![Vec::new(); n];
    let mut chans = Vec::new();
    for (c, &(from, to)) in edges.iter().enumerate() {
        outputs[from].push(c);
        inputs[to].push(c);
        chans.push(Chan {
            from,
            to,
            segments: VecDeque::from([VecDeque::new()]),
            sent: 0,
        });
    }
    let machine =
        |k: usize| for_task(cfg.protocol, &vec![InputKind::Regular; k], false).expect("validated");
    let tasks = (0..n)
        .map(|v| Task {
            machine: machine(inputs[v].len()),
            inputs: inputs[v].clone(),
            outputs: outputs[v].clone(),
            count: 0,
            emitted: 0,
            taken: vec![0; inputs[v].len()],
            published: Vec::new(),
            staged: Vec::new(),
            mailbox: VecDeque::new(),
            restarts: 0,
        })
        .collect();
    let mut fail_at: Vec<u64> = (0..cfg.failures)
        .map(|_| 1 + rng.below(300) as u64)
        .collect();
    fail_at.sort_unstable();
    let mut sim = Sim {
        cfg: cfg.clone(),
        rng,
        chans,
        tasks,
        in_flight: None,
        last_completed: None,
        next_id: 1,
        completed: 0,
        fail_at: fail_at.into(),
        failures: Vec::new(),
        restored_from: None,
        dropped: 0,
        actions: Vec::new(),
    };
    let violation = sim.run().err();
    let published = (0..n)
        .filter(|&v| sim.tasks[v].outputs.is_empty())
        .map(|v| {
            let mut p = sim.tasks[v].published.clone();
            p.sort_unstable();
            (v, p)
        })
        .collect();
    Ok(FailoverReport {
        edges,
        published,
        counts: sim.tasks.iter().map(|t| t.count).collect(),
        failures: sim.failures.clone(),
        checkpoints_completed: sim.completed,
        restored_from: sim.restored_from,
        replayed_dropped: sim.dropped,
        violation: violation.map(|e| format!("{e}\nreplay with: {cfg:?}")),
    })
}

#[derive(Clone, Copy, Debug)]
enum Move {
    Emit(usize),
    Pop(usize, usize),
    Control(usize),
    Trigger,
}

impl Sim {
    fn sources_done(&self) -> bool {
        (0..self.cfg.sources).all(|v| self.tasks[v].emitted == self.cfg.tokens_per_source)
    }

    fn moves(&mut self) -> Vec<Move> {
        let mut moves = Vec::new();
        for v in 0..self.cfg.sources {
            if self.tasks[v].emitted < self.cfg.tokens_per_source {
                moves.push(Move::Emit(v));
            }
        }
        for (v, t) in self.tasks.iter().enumerate() {
            for (i, &c) in t.inputs.iter().enumerate() {
                if self.chans[c].front().is_some() && !t.machine.is_blocked(i) {
                    moves.push(Move::Pop(v, i));
                }
            }
            if !t.mailbox.is_empty() {
                moves.push(Move::Control(v));
            }
        }
        let quiet = moves.is_empty();
        if self.in_flight.is_none() && (quiet || self.rng.chance(1, 6)) {
            // After the sources are done and everything drained, one last
            // checkpoint publishes what the sinks staged; then the run ends.
            let published_all = quiet && self.sources_done() && self.all_published();
            if !published_all {
                moves.push(Move::Trigger);
            }
        }
        moves
    }

    fn all_published(&self) -> bool {
        self.tasks.iter().all(|t| t.staged.is_empty())
            && self.last_completed.is_some()
            && self.tasks.iter().all(|t| t.mailbox.is_empty())
    }

    fn run(&mut self) -> std::result::Result<(), String> {
        let mut steps = 0u64;
        loop {
            steps += 1;
            if steps > 2_000_000 {
                return Err("no end after 2,000,000 steps".into());
            }
            while self.fail_at.front().is_some_and(|&s| s <= steps) {
                self.fail_at.pop_front();
                self.fail()?;
            }
            let mut moves = self.moves();
            while moves.is_empty() && self.fail_at.pop_front().is_some() {
                // The run would end before the failure: fail now.
                self.fail()?;
                moves = self.moves();
            }
            if moves.is_empty() {
                if let Some((id, ck)) = &self.in_flight {
                    let missing: Vec<usize> = (0..self.tasks.len())
                        .filter(|v| !ck.done.contains(v))
                        .collect();
                    return Err(format!(
                        "deadlock: checkpoint {id} waits for tasks {missing:?}"
                    ));
                }
                return Ok(());
            }
            match *self.rng.pick(&moves) {
                Move::Emit(v) => {
                    self.tasks[v].emitted += 1;
                    let value = (v as u64) << 32 | self.tasks[v].emitted;
                    self.tasks[v].count += 1;
                    self.send(v, value);
                }
                Move::Pop(v, i) => self.pop(v, i)?,
                Move::Control(v) => {
                    let id = self.tasks[v].mailbox.pop_front().expect("listed");
                    self.feed(v, Event::Abort { id }, None)?;
                }
                Move::Trigger => self.trigger()?,
            }
        }
    }

    fn send(&mut self, v: usize, value: u64) {
        let outs = self.tasks[v].outputs.clone();
        for c in outs {
            let ch = &mut self.chans[c];
            ch.sent += 1;
            let seq = ch.sent;
            ch.push(Item::Token {
                value: map_token(value, v),
                seq,
            });
        }
    }

    fn trigger(&mut self) -> std::result::Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight = Some((id, Ckpt::default()));
        for v in 0..self.cfg.sources {
            self.feed(v, Event::Trigger { id }, None)?;
        }
        Ok(())
    }

    fn pop(&mut self, v: usize, i: usize) -> std::result::Result<(), String> {
        let c = self.tasks[v].inputs[i];
        let item = self.chans[c].pop().expect("listed");
        match item {
            Item::Token { value, seq } => {
                let taken = if self.cfg.dedup {
                    self.tasks[v].taken[i]
                } else {
                    seq - 1
                };
                match seen(taken, 1, seq) {
                    Seen::All => {
                        self.dropped += 1;
                        Ok(())
                    }
                    Seen::Gap { first } => Err(format!(
                        "task {v} input {i}: took up to {taken}, next token is {first}"
                    )),
                    Seen::Prefix(_) => {
                        self.tasks[v].taken[i] = seq;
                        self.feed(v, Event::Record { input: i }, Some(value))
                    }
                }
            }
            Item::Barrier { id, seq } => {
                // The runtime applies pending controls before a barrier.
                while let Some(a) = self.tasks[v].mailbox.pop_front() {
                    self.feed(v, Event::Abort { id: a }, None)?;
                }
                // While a restarted sender replays what this task took
                // before, its barrier's position lags the task's own: the
                // checkpoint keeps the higher one (what a restore must skip).
                let taken = seq.max(self.tasks[v].taken[i]);
                if let Some((cur, ck)) = &mut self.in_flight {
                    if *cur == id {
                        ck.tasks.entry(v).or_default().taken.insert(i, taken);
                    }
                }
                self.feed(v, Event::Barrier { input: i, id }, None)
            }
        }
    }

    fn feed(
        &mut self,
        v: usize,
        event: Event,
        value: Option<u64>,
    ) -> std::result::Result<(), String> {
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        self.tasks[v].machine.on_event(event, &mut actions);
        let result = actions
            .iter()
            .try_for_each(|&a| self.apply(v, event, a, value));
        self.actions = actions;
        result
    }

    fn ckpt(&mut self, id: CheckpointId) -> Option<&mut Ckpt> {
        match &mut self.in_flight {
            Some((cur, ck)) if *cur == id => Some(ck),
            _ => None,
        }
    }

    fn apply(
        &mut self,
        v: usize,
        event: Event,
        action: Action,
        value: Option<u64>,
    ) -> std::result::Result<(), String> {
        match action {
            Action::Deliver => {
                let value = value.ok_or_else(|| format!("task {v}: Deliver on {event:?}"))?;
                self.deliver(v, value);
            }
            Action::Log { input, id } => {
                let value = value.ok_or_else(|| format!("task {v}: Log on {event:?}"))?;
                if let Some(ck) = self.ckpt(id) {
                    ck.tasks.entry(v).or_default().logs.push((input, value));
                }
            }
            Action::Snapshot { id } => {
                let t = &mut self.tasks[v];
                for s in t.staged.iter_mut().filter(|s| s.0.is_none()) {
                    s.0 = Some(id);
                }
                let (count, emitted) = (t.count, t.emitted);
                let sent: Vec<u64> = t.outputs.iter().map(|&c| self.chans[c].sent).collect();
                if let Some(ck) = self.ckpt(id) {
                    let snap = ck.tasks.entry(v).or_default();
                    snap.count = count;
                    snap.emitted = emitted;
                    snap.sent = sent;
                    snap.snapshotted = true;
                }
            }
            Action::Forward { id } => {
                let outs = self.tasks[v].outputs.clone();
                for c in outs {
                    let seq = self.chans[c].sent;
                    self.chans[c].push(Item::Barrier { id, seq });
                }
            }
            Action::Complete { id } => {
                let n = self.tasks.len();
                let Some(ck) = self.ckpt(id) else {
                    return Ok(()); // aborted meanwhile
                };
                if !ck.tasks.get(&v).is_some_and(|s| s.snapshotted) || !ck.done.insert(v) {
                    return Err(format!(
                        "task {v}: Complete {id} without Snapshot, or twice"
                    ));
                }
                if ck.done.len() == n {
                    self.complete(id);
                }
            }
            Action::Block { .. } | Action::Unblock { .. } => {}
        }
        Ok(())
    }

    fn deliver(&mut self, v: usize, value: u64) {
        let t = &mut self.tasks[v];
        t.count += 1;
        if t.outputs.is_empty() {
            t.staged.push((None, value));
        } else {
            self.send(v, value);
        }
    }

    /// Every task finished its part: publish what sinks staged up to `id`.
    fn complete(&mut self, id: CheckpointId) {
        let (_, ck) = self.in_flight.take().expect("in flight");
        for t in &mut self.tasks {
            let (done, open): (Vec<_>, Vec<_>) = t
                .staged
                .drain(..)
                .partition(|s| s.0.is_some_and(|c| c <= id));
            t.published.extend(done.into_iter().map(|s| s.1));
            t.staged = open;
        }
        self.completed += 1;
        self.last_completed = Some((id, ck.tasks));
    }

    /// Fails a random task and restarts what [`restart_set`] says.
    fn fail(&mut self) -> std::result::Result<(), String> {
        let n = self.tasks.len();
        let failed = self.rng.below(n);
        let topo = Topology {
            channels: self.chans.iter().map(|c| (c.from, c.to)).collect(),
            cycle: vec![None; n],
            round_robin: vec![false; self.chans.len()],
        };
        let set = restart_set(self.cfg.strategy, &topo, failed, &|t| format!("task {t}"));
        let mut in_set = vec![false; n];
        for &t in &set.tasks {
            in_set[t] = true;
        }
        // The checkpoint in flight cannot complete: aborted everywhere (the
        // healthy tasks learn it through their mailboxes, later).
        if let Some((id, _)) = self.in_flight.take() {
            for (t, task) in self.tasks.iter_mut().enumerate() {
                if !in_set[t] {
                    task.mailbox.push_back(id);
                }
            }
        }
        let restore = self.last_completed.clone();
        self.restored_from = restore.as_ref().map(|r| r.0);
        let mut replays = Vec::new();
        for &t in &set.tasks {
            let snap = restore
                .as_ref()
                .and_then(|(_, tasks)| tasks.get(&t).cloned())
                .unwrap_or_default();
            let k = self.tasks[t].inputs.len();
            let task = &mut self.tasks[t];
            task.machine =
                for_task(self.cfg.protocol, &vec![InputKind::Regular; k], false).expect("valid");
            task.count = snap.count;
            task.emitted = snap.emitted;
            task.taken = (0..k)
                .map(|i| snap.taken.get(&i).copied().unwrap_or(0))
                .collect();
            task.staged.clear();
            task.mailbox.clear();
            task.restarts += 1;
            let outs = task.outputs.clone();
            for (k, c) in outs.into_iter().enumerate() {
                let ch = &mut self.chans[c];
                ch.sent = snap.sent.get(k).copied().unwrap_or(0);
                if in_set[ch.to] {
                    ch.segments = VecDeque::from([VecDeque::new()]);
                } else {
                    ch.segments.push_back(VecDeque::new());
                }
            }
            replays.extend(snap.logs.iter().map(|&(_, value)| (t, value)));
        }
        self.failures.push((failed, set.tasks, set.fallback));
        // Logged in-flight records are delivered first, as the runtime does.
        for (t, value) in replays {
            self.deliver(t, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(protocol: ProtocolKind, strategy: FailoverStrategy, seed: u64) -> FailoverReport {
        let cfg = FailoverConfig::new(protocol, strategy, seed);
        let clean = run(&FailoverConfig {
            failures: 0,
            ..cfg.clone()
        })
        .unwrap();
        assert_eq!(clean.violation, None);
        let r = run(&cfg).unwrap();
        assert_eq!(r.violation, None, "seed {seed}");
        assert_eq!(r.published, clean.published, "sinks, {cfg:?}\n{r:?}");
        assert_eq!(r.counts, clean.counts, "task state, {cfg:?}\n{r:?}");
        r
    }

    #[test]
    fn every_sink_is_exact_and_only_the_restart_set_restarts() {
        for protocol in [
            ProtocolKind::Aligned,
            ProtocolKind::Unaligned,
            ProtocolKind::ChandyLamport,
        ] {
            let mut upstream_only = 0;
            for seed in 0..150 {
                let r = check(protocol, FailoverStrategy::Upstream, seed);
                assert_eq!(r.failures.len(), 2, "{r:?}");
                let topo = Topology {
                    channels: r.edges.clone(),
                    cycle: vec![None; r.counts.len()],
                    round_robin: vec![false; r.edges.len()],
                };
                for (failed, restarted, fallback) in &r.failures {
                    let closure = crate::graph::failover::upstream_closure(&topo, *failed);
                    if fallback.is_none() {
                        upstream_only += 1;
                        // Exactly the upstream closure restarted: no task outside it.
                        assert!(restarted.iter().all(|&t| closure[t]), "{r:?}");
                        assert_eq!(restarted.len(), closure.iter().filter(|&&c| c).count());
                    }
                }
            }
            assert!(
                upstream_only > 50,
                "{protocol}: {upstream_only} upstream restarts"
            );
        }
    }

    #[test]
    fn region_and_full_are_exact_too() {
        for seed in 0..40 {
            check(ProtocolKind::Aligned, FailoverStrategy::Region, seed);
            let r = check(ProtocolKind::Unaligned, FailoverStrategy::Full, seed);
            assert!(r.failures.iter().all(|f| f.1.len() == r.counts.len()));
        }
    }

    #[test]
    fn healthy_tasks_drop_replays_somewhere() {
        let dropped: u64 = (0..60)
            .map(|s| check(ProtocolKind::Aligned, FailoverStrategy::Upstream, s).replayed_dropped)
            .sum();
        assert!(dropped > 0);
    }

    #[test]
    fn without_the_sequence_numbers_healthy_tasks_take_replays_twice() {
        let mut caught = 0;
        for seed in 0..40 {
            let cfg = FailoverConfig {
                dedup: false,
                ..FailoverConfig::new(ProtocolKind::Aligned, FailoverStrategy::Upstream, seed)
            };
            let clean = run(&FailoverConfig {
                failures: 0,
                ..cfg.clone()
            })
            .unwrap();
            let r = run(&cfg).unwrap();
            if r.published != clean.published || r.counts != clean.counts {
                caught += 1;
            }
        }
        assert!(
            caught > 5,
            "the checks caught {caught} runs with duplicates"
        );
    }
}
