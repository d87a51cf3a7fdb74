//! Dataflow-mode simulator: sources emit numbered tokens, tasks count them
//! and pass them on (with a hop limit, so cycles drain), over a random DAG or
//! a graph with cycles (back-edges marked [`InputKind::BackEdge`]). Every task
//! runs the real machine from [`crate::protocol::for_task`]; a seeded PRNG
//! picks every step (emit, pop, trigger, queued-barrier notice, alignment
//! timeout, abort), so a failing configuration replays exactly.
//!
//! Every completed checkpoint is checked to be a consistent cut, channel by
//! channel: tokens `u` had sent on `u → v` when `u` snapshotted == tokens `v`
//! had received on it when `v` snapshotted + tokens logged for that channel,
//! and the logged tokens are exactly the ones in between (FIFO). Aligned and
//! Sync checkpoints must log nothing but back-edges.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

use super::rng::SplitMix64;
use crate::error::{Error, Result};
use crate::protocol::{for_task, Action, CheckpointId, Event, InputKind, Protocol, ProtocolKind};

/// What to simulate. Everything random is drawn from `seed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataflowConfig {
    pub protocol: ProtocolKind,
    /// Unaligned only: start aligned, switch on a (randomly fired) timeout.
    pub aligned_first: bool,
    pub seed: u64,
    /// Vertices in total (`>= sources`).
    pub vertices: usize,
    /// Vertices `0..sources` emit tokens and have no regular inputs.
    pub sources: usize,
    /// Back-edges to add (0 = a DAG).
    pub back_edges: usize,
    /// Extra forward edges to try to add beyond the spanning ones.
    pub extra_edges: usize,
    pub tokens_per_source: u64,
    /// Checkpoints the coordinator triggers.
    pub checkpoints: u64,
    /// A token is dropped after this many hops (so cycles drain).
    pub max_hops: u32,
    /// DAGs only: sources end their streams when done; end-of-stream
    /// propagates and finished tasks count as snapshotted for later checkpoints.
    pub end_of_stream: bool,
    /// Abort an in-flight checkpoint with probability 1/`abort_one_in` per
    /// step (0 = never).
    pub abort_one_in: u32,
}

impl DataflowConfig {
    /// A small default configuration for `protocol` and `seed`.
    pub fn new(protocol: ProtocolKind, seed: u64) -> Self {
        DataflowConfig {
            protocol,
            aligned_first: false,
            seed,
            vertices: 6,
            sources: 2,
            back_edges: 0,
            extra_edges: 3,
            tokens_per_source: 30,
            checkpoints: 5,
            max_hops: 6,
            end_of_stream: false,
            abort_one_in: 0,
        }
    }
}

/// One checkpoint's fate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointOutcome {
    pub id: CheckpointId,
    pub completed: bool,
    pub aborted: bool,
    /// Tokens logged as channel state / back-edge log / overtaken data.
    pub logged: u64,
}

/// What a run did (for assertions and replay comparisons).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataflowReport {
    pub steps: u64,
    pub edges: Vec<(usize, usize, InputKind)>,
    pub tokens_emitted: u64,
    pub tokens_delivered: u64,
    pub checkpoints: Vec<CheckpointOutcome>,
    /// Alignment timeouts that switched a task to unaligned.
    pub timeouts_fired: u64,
    /// The first problem found (deadlock, a checkpoint that never completed,
    /// an inconsistent cut, a protocol answer that makes no sense), with the
    /// configuration to replay it; `None` if the run was correct.
    pub violation: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    /// The `seq`-th token sent on its channel (1-based).
    Token {
        seq: u64,
        hops: u32,
    },
    Barrier(CheckpointId),
    End,
}

#[derive(Debug)]
struct Chan {
    src: usize,
    dst: usize,
    kind: InputKind,
    queue: VecDeque<Item>,
    sent: u64,
    received: u64,
    /// Highest barrier id reported queued to `dst`.
    announced: CheckpointId,
}

struct Task {
    machine: Box<dyn Protocol>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    ended: Vec<bool>,
    finished: bool,
    emitted: u64,
}

#[derive(Default, Debug)]
struct Ckpt {
    /// Per vertex, per channel: tokens sent (outputs) / received (inputs) at its snapshot.
    sent: BTreeMap<usize, u64>,
    received: BTreeMap<usize, u64>,
    snapshotted: BTreeSet<usize>,
    done: BTreeSet<usize>,
    logged: BTreeMap<usize, Vec<u64>>,
    complete: bool,
    aborted: bool,
    timed_out: bool,
}

struct Sim {
    cfg: DataflowConfig,
    rng: SplitMix64,
    chans: Vec<Chan>,
    tasks: Vec<Task>,
    ckpts: BTreeMap<CheckpointId, Ckpt>,
    next_id: CheckpointId,
    delivered: u64,
    timeouts: u64,
    actions: Vec<Action>,
}

/// Random graph: every non-source vertex gets a regular edge from a lower
/// vertex (so everything is reachable from the sources and regular edges
/// form a DAG); extra forward edges; back-edges go from a vertex to one not
/// higher (self-loops included).
fn build_graph(cfg: &DataflowConfig, rng: &mut SplitMix64) -> Vec<(usize, usize, InputKind)> {
    let mut edges: Vec<(usize, usize, InputKind)> = Vec::new();
    let has =
        |edges: &[(usize, usize, InputKind)], u, v| edges.iter().any(|e| e.0 == u && e.1 == v);
    for v in cfg.sources..cfg.vertices {
        let u = rng.below(v);
        edges.push((u, v, InputKind::Regular));
    }
    for _ in 0..cfg.extra_edges {
        if cfg.vertices > cfg.sources {
            let v = cfg.sources + rng.below(cfg.vertices - cfg.sources);
            let u = rng.below(v);
            if !has(&edges, u, v) {
                edges.push((u, v, InputKind::Regular));
            }
        }
    }
    for _ in 0..cfg.back_edges {
        let u = rng.below(cfg.vertices);
        let v = rng.below(u + 1);
        if !has(&edges, u, v) {
            edges.push((u, v, InputKind::BackEdge));
        }
    }
    edges
}

/// Runs `cfg` to quiescence and checks every checkpoint; see
/// [`DataflowReport::violation`]. `Err` only for an invalid configuration.
pub fn run(cfg: &DataflowConfig) -> Result<DataflowReport> {
    validate(cfg)?;
    let (protocol, aligned_first) = (cfg.protocol, cfg.aligned_first);
    run_with(cfg, |kinds| {
        for_task(protocol, kinds, aligned_first).expect("validated: not None")
    })
}

/// [`run`] with the per-task machine built by `machine(input_kinds)` instead
/// of [`for_task`] (`cfg.protocol` still decides Sync's source pauses,
/// queued-barrier notices and what "aligned" means to the checker). For
/// testing the checker itself and trying out new machines.
pub fn run_with(
    cfg: &DataflowConfig,
    mut machine: impl FnMut(&[InputKind]) -> Box<dyn Protocol>,
) -> Result<DataflowReport> {
    validate(cfg)?;
    let mut rng = SplitMix64::new(cfg.seed);
    let edges = build_graph(cfg, &mut rng);
    let mut chans = Vec::new();
    let mut inputs = vec![Vec::new(); cfg.vertices];
    let mut outputs = vec![Vec::new(); cfg.vertices];
    for (c, &(src, dst, kind)) in edges.iter().enumerate() {
        outputs[src].push(c);
        inputs[dst].push(c);
        chans.push(Chan {
            src,
            dst,
            kind,
            queue: VecDeque::new(),
            sent: 0,
            received: 0,
            announced: 0,
        });
    }
    let tasks = (0..cfg.vertices)
        .map(|v| {
            let kinds: Vec<InputKind> = inputs[v].iter().map(|&c| chans[c].kind).collect();
            Task {
                machine: machine(&kinds),
                inputs: inputs[v].clone(),
                outputs: outputs[v].clone(),
                ended: vec![false; inputs[v].len()],
                finished: false,
                emitted: 0,
            }
        })
        .collect();
    let mut sim = Sim {
        cfg: cfg.clone(),
        rng,
        chans,
        tasks,
        ckpts: BTreeMap::new(),
        next_id: 1,
        delivered: 0,
        timeouts: 0,
        actions: Vec::new(),
    };
    let mut steps = 0;
    let outcome = sim.run(&mut steps).and_then(|()| sim.check());
    Ok(DataflowReport {
        violation: outcome.err().map(|e| format!("{e}\nreplay with: {cfg:?}")),
        steps,
        edges,
        tokens_emitted: sim.tasks.iter().map(|t| t.emitted).sum(),
        tokens_delivered: sim.delivered,
        checkpoints: sim
            .ckpts
            .iter()
            .map(|(&id, c)| CheckpointOutcome {
                id,
                completed: c.complete,
                aborted: c.aborted,
                logged: c.logged.values().map(|l| l.len() as u64).sum(),
            })
            .collect(),
        timeouts_fired: sim.timeouts,
    })
}

fn validate(cfg: &DataflowConfig) -> Result<()> {
    if cfg.protocol == ProtocolKind::None {
        return Err(Error::Config(
            "protocol none takes no checkpoints: nothing to simulate; \
             pick aligned, unaligned, sync or chandy-lamport"
                .into(),
        ));
    }
    if cfg.sources == 0 || cfg.sources > cfg.vertices {
        return Err(Error::Config(format!(
            "need 1 <= sources <= vertices, got sources={} vertices={}",
            cfg.sources, cfg.vertices
        )));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Move {
    Emit(usize),
    Pop(usize, usize),
    Trigger,
    Queued(usize, CheckpointId),
    Timeout(usize, CheckpointId),
    Abort(CheckpointId),
}

impl Sim {
    fn in_flight(&self) -> impl Iterator<Item = CheckpointId> + '_ {
        self.ckpts
            .iter()
            .filter(|(_, c)| !c.complete && !c.aborted)
            .map(|(&id, _)| id)
    }

    fn cyclic(&self) -> bool {
        self.chans.iter().any(|c| c.kind == InputKind::BackEdge)
    }

    fn moves(&mut self) -> Vec<Move> {
        let cfg = &self.cfg;
        let sync_pause = cfg.protocol.pauses_sources() && self.in_flight().next().is_some();
        let mut moves = Vec::new();
        for v in 0..cfg.sources {
            if self.tasks[v].emitted < cfg.tokens_per_source && !sync_pause {
                moves.push(Move::Emit(v));
            }
        }
        for (v, t) in self.tasks.iter().enumerate() {
            for (i, &c) in t.inputs.iter().enumerate() {
                if !self.chans[c].queue.is_empty() && !t.machine.is_blocked(i) {
                    moves.push(Move::Pop(v, i));
                }
            }
            if cfg.aligned_first {
                if let Some(id) = t.machine.aligning() {
                    moves.push(Move::Timeout(v, id));
                }
            }
        }
        if cfg.protocol == ProtocolKind::Unaligned {
            for (c, ch) in self.chans.iter().enumerate() {
                // Like the runtime: only the first barrier queued, once.
                let first = ch.queue.iter().find_map(|it| match it {
                    Item::Barrier(id) => Some(*id),
                    _ => None,
                });
                if let Some(id) = first.filter(|&id| id > ch.announced) {
                    moves.push(Move::Queued(c, id));
                }
            }
        }
        let may_trigger = self.next_id <= cfg.checkpoints && !sync_pause;
        // Spread triggers out over the run rather than firing all at once.
        if may_trigger && (moves.is_empty() || self.rng.chance(1, 8)) {
            moves.push(Move::Trigger);
        }
        if cfg.abort_one_in > 0 && self.rng.chance(1, cfg.abort_one_in) {
            if let Some(id) = self.in_flight().next() {
                moves.push(Move::Abort(id));
            }
        }
        moves
    }

    fn run(&mut self, steps: &mut u64) -> std::result::Result<(), String> {
        loop {
            let moves = self.moves();
            if moves.is_empty() {
                let stuck: Vec<usize> = (0..self.chans.len())
                    .filter(|&c| !self.chans[c].queue.is_empty())
                    .collect();
                if !stuck.is_empty() {
                    return Err(format!(
                        "deadlock after {steps} steps: channels {stuck:?} blocked"
                    ));
                }
                return Ok(());
            }
            *steps += 1;
            let m = *self.rng.pick(&moves);
            match m {
                Move::Emit(v) => self.emit(v),
                Move::Pop(v, i) => self.pop(v, i)?,
                Move::Trigger => self.trigger()?,
                Move::Queued(c, id) => {
                    self.chans[c].announced = id;
                    let (dst, input) = self.input_of(c);
                    self.feed(dst, Event::BarrierQueued { input, id }, None)?;
                }
                Move::Timeout(v, id) => {
                    let before = self.tasks[v].machine.aligning();
                    self.feed(v, Event::AlignmentTimeout { id }, None)?;
                    if before.is_some() && self.tasks[v].machine.aligning().is_none() {
                        self.timeouts += 1;
                        if let Some(c) = self.ckpts.get_mut(&id) {
                            c.timed_out = true;
                        }
                    }
                }
                Move::Abort(id) => {
                    self.ckpts.get_mut(&id).expect("in flight").aborted = true;
                    for v in 0..self.tasks.len() {
                        self.feed(v, Event::Abort { id }, None)?;
                    }
                }
            }
        }
    }

    fn input_of(&self, c: usize) -> (usize, usize) {
        let dst = self.chans[c].dst;
        let input = self.tasks[dst]
            .inputs
            .iter()
            .position(|&x| x == c)
            .expect("channel is an input of its destination");
        (dst, input)
    }

    fn send_token(&mut self, v: usize, hops: u32) {
        let outs = &self.tasks[v].outputs;
        if outs.is_empty() || hops >= self.cfg.max_hops {
            return;
        }
        let c = outs[self.rng.below(outs.len())];
        let ch = &mut self.chans[c];
        ch.sent += 1;
        let seq = ch.sent;
        ch.queue.push_back(Item::Token { seq, hops });
    }

    fn emit(&mut self, v: usize) {
        self.tasks[v].emitted += 1;
        self.send_token(v, 0);
        if self.tasks[v].emitted == self.cfg.tokens_per_source
            && self.cfg.end_of_stream
            && !self.cyclic()
            && self.tasks[v].inputs.is_empty()
        {
            self.finish(v);
        }
    }

    fn finish(&mut self, v: usize) {
        self.tasks[v].finished = true;
        // A task that ends without having seen barrier n had only upstreams
        // that finished before n was triggered: its final state is its part
        // of n, and downstream it sends End, not the barrier.
        let pending: Vec<CheckpointId> = self
            .ckpts
            .iter()
            .filter(|(_, c)| !c.aborted && !c.snapshotted.contains(&v))
            .map(|(&id, _)| id)
            .collect();
        for id in pending {
            let mut ck = self.ckpts.remove(&id).expect("listed");
            self.record(&mut ck, v);
            ck.done.insert(v);
            self.ckpts.insert(id, ck);
            self.maybe_complete(id);
        }
        for &c in &self.tasks[v].outputs {
            self.chans[c].queue.push_back(Item::End);
        }
    }

    fn trigger(&mut self) -> std::result::Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut ck = Ckpt::default();
        // Finished tasks have final state and will never see the barrier:
        // the coordinator takes their part as done (Flink FLIP-147).
        for v in 0..self.tasks.len() {
            if self.tasks[v].finished {
                self.record(&mut ck, v);
                ck.done.insert(v);
            }
        }
        self.ckpts.insert(id, ck);
        for v in 0..self.cfg.sources {
            if !self.tasks[v].finished {
                self.feed(v, Event::Trigger { id }, None)?;
            }
        }
        // Chandy–Lamport lets any process initiate: sometimes an inner task
        // starts the same snapshot too, before the sources' markers reach it.
        if self.cfg.protocol == ProtocolKind::ChandyLamport && self.rng.chance(1, 2) {
            let v = self.rng.below(self.tasks.len());
            if !self.tasks[v].finished {
                self.feed(v, Event::Trigger { id }, None)?;
            }
        }
        self.maybe_complete(id);
        Ok(())
    }

    fn record(&self, ck: &mut Ckpt, v: usize) {
        let t = &self.tasks[v];
        for &c in &t.outputs {
            ck.sent.insert(c, self.chans[c].sent);
        }
        for &c in &t.inputs {
            ck.received.insert(c, self.chans[c].received);
        }
        ck.snapshotted.insert(v);
    }

    fn maybe_complete(&mut self, id: CheckpointId) {
        let n = self.tasks.len();
        if let Some(ck) = self.ckpts.get_mut(&id) {
            if !ck.aborted && ck.done.len() == n {
                ck.complete = true;
            }
        }
    }

    fn pop(&mut self, v: usize, i: usize) -> std::result::Result<(), String> {
        let c = self.tasks[v].inputs[i];
        let item = self.chans[c].queue.pop_front().expect("non-empty");
        match item {
            Item::Token { .. } => self.feed(v, Event::Record { input: i }, Some(item)),
            Item::Barrier(id) => self.feed(v, Event::Barrier { input: i, id }, None),
            Item::End => {
                self.tasks[v].ended[i] = true;
                self.feed(v, Event::EndOfInput { input: i }, None)?;
                if self.tasks[v].ended.iter().all(|&e| e) {
                    self.finish(v);
                }
                Ok(())
            }
        }
    }

    fn feed(
        &mut self,
        v: usize,
        event: Event,
        item: Option<Item>,
    ) -> std::result::Result<(), String> {
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        self.tasks[v].machine.on_event(event, &mut actions);
        let result = actions
            .iter()
            .try_for_each(|&a| self.apply(v, event, a, item));
        self.actions = actions;
        result
    }

    fn apply(
        &mut self,
        v: usize,
        event: Event,
        action: Action,
        item: Option<Item>,
    ) -> std::result::Result<(), String> {
        match action {
            Action::Deliver => {
                let (Event::Record { input }, Some(Item::Token { hops, .. })) = (event, item)
                else {
                    return Err(format!("task {v}: Deliver in answer to {event:?}"));
                };
                let c = self.tasks[v].inputs[input];
                self.chans[c].received += 1;
                self.delivered += 1;
                self.send_token(v, hops + 1);
            }
            Action::Log { input, id } => {
                let (Event::Record { input: popped }, Some(Item::Token { seq, .. })) =
                    (event, item)
                else {
                    return Err(format!("task {v}: Log in answer to {event:?}"));
                };
                if popped != input {
                    return Err(format!(
                        "task {v}: Log for input {input}, record came on {popped}"
                    ));
                }
                let c = self.tasks[v].inputs[input];
                if let Some(ck) = self.ckpts.get_mut(&id) {
                    ck.logged.entry(c).or_default().push(seq);
                }
            }
            Action::Snapshot { id } => {
                let Some(mut ck) = self.ckpts.remove(&id) else {
                    return Err(format!("task {v}: Snapshot of unknown checkpoint {id}"));
                };
                if ck.snapshotted.contains(&v) {
                    return Err(format!("task {v}: second Snapshot of {id}"));
                }
                self.record(&mut ck, v);
                self.ckpts.insert(id, ck);
            }
            Action::Forward { id } => {
                for &c in &self.tasks[v].outputs {
                    self.chans[c].queue.push_back(Item::Barrier(id));
                }
            }
            Action::Complete { id } => {
                if let Some(ck) = self.ckpts.get_mut(&id) {
                    if !ck.snapshotted.contains(&v) || !ck.done.insert(v) {
                        return Err(format!(
                            "task {v}: Complete {id} without Snapshot, or twice"
                        ));
                    }
                }
                self.maybe_complete(id);
            }
            Action::Block { input } => {
                if !self.tasks[v].machine.is_blocked(input) {
                    return Err(format!("task {v}: Block {input} but not blocked"));
                }
            }
            Action::Unblock { .. } => {}
        }
        Ok(())
    }

    fn check(&self) -> std::result::Result<(), String> {
        let mut problems = String::new();
        for (&id, ck) in &self.ckpts {
            if ck.aborted {
                continue;
            }
            if !ck.complete {
                let missing: Vec<usize> = (0..self.tasks.len())
                    .filter(|v| !ck.done.contains(v))
                    .collect();
                let _ = writeln!(
                    problems,
                    "checkpoint {id} never completed: tasks {missing:?} not done"
                );
                continue;
            }
            let aligned = matches!(
                self.cfg.protocol,
                ProtocolKind::Aligned | ProtocolKind::Sync | ProtocolKind::SyncCapture
            ) || (self.cfg.protocol == ProtocolKind::Unaligned
                && self.cfg.aligned_first
                && !ck.timed_out);
            for (c, ch) in self.chans.iter().enumerate() {
                let sent = ck.sent.get(&c).copied();
                let received = ck.received.get(&c).copied();
                let (Some(sent), Some(received)) = (sent, received) else {
                    let _ = writeln!(
                        problems,
                        "checkpoint {id}: channel {c} not recorded at both ends"
                    );
                    continue;
                };
                let logged = ck.logged.get(&c).map_or(&[][..], Vec::as_slice);
                let expected: Vec<u64> = (received + 1..=sent).collect();
                if received > sent || logged != expected.as_slice() {
                    let _ = writeln!(
                        problems,
                        "checkpoint {id}: channel {c} ({}→{}, {:?}): sent {sent} at source snapshot, \
                         received {received} at destination snapshot, logged {logged:?}",
                        ch.src, ch.dst, ch.kind
                    );
                }
                if aligned && ch.kind == InputKind::Regular && !logged.is_empty() {
                    let _ = writeln!(
                        problems,
                        "checkpoint {id}: aligned checkpoint logged regular channel {c}: {logged:?}"
                    );
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}
