//! The Chandy–Lamport bank: processes hold balances and send each other money
//! over FIFO channels; any process may start a snapshot, several may be in
//! flight. Each process runs the real [`ChandyLamport`] machine; this module
//! only carries out its actions. Every delivery is chosen by the caller (a
//! script) or by the seeded PRNG, so runs replay exactly.
//!
//! A snapshot records, per process, its balance, whether it has halted, and
//! how many transfers it had sent on each outgoing / received on each
//! incoming channel; per channel, the amounts recorded in flight. Those
//! counters make consistency checkable: FIFO channels mean a cut is
//! consistent iff, per channel, received ≤ sent and the recorded contents are
//! exactly the transfers numbered received+1..=sent.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::rng::SplitMix64;
use crate::error::{Error, Result};
use crate::protocol::{Action, ChandyLamport, CheckpointId, Event, Protocol};

/// Index of a process (in the order given at construction).
pub type ProcId = usize;

/// An item travelling on a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    Money(i64),
    Marker(CheckpointId),
}

/// Shape of a random bank's channels. Every shape is strongly connected, so a
/// marker from any initiator reaches every process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Every ordered pair of distinct processes.
    Complete,
    /// P0 → P1 → … → P(n-1) → P0 only.
    Ring,
    /// A ring through a random permutation plus random extra edges.
    Random,
}

impl std::str::FromStr for Topology {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "complete" => Ok(Topology::Complete),
            "ring" => Ok(Topology::Ring),
            "random" => Ok(Topology::Random),
            _ => Err(Error::Config(format!(
                "unknown topology {s:?}; use one of: complete, ring, random"
            ))),
        }
    }
}

/// Parameters of [`Bank::random`].
#[derive(Clone, Debug)]
pub struct RandomBank {
    pub processes: usize,
    pub seed: u64,
    /// Initial balance of every process.
    pub balance: i64,
    pub topology: Topology,
    /// Transfers a process makes before it halts; `None` = never halts.
    pub max_transfers: Option<u64>,
}

#[derive(Clone, Debug)]
struct Channel {
    src: ProcId,
    dst: ProcId,
    /// Input index of this channel at `dst`.
    input: usize,
    queue: VecDeque<Message>,
    /// Every amount ever sent, in order (the checker's ground truth).
    history: Vec<i64>,
    received: u64,
}

/// What one process recorded for a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRecord {
    pub balance: i64,
    pub halted: bool,
}

/// A global snapshot as recorded so far (complete once every process
/// received a marker on every incoming channel).
#[derive(Clone, Debug, Default)]
pub struct GlobalSnapshot {
    pub id: CheckpointId,
    pub initiator: ProcId,
    pub processes: BTreeMap<ProcId, ProcessRecord>,
    /// Processes in the order they recorded their state.
    pub order: Vec<ProcId>,
    /// Recorded in-flight amounts per channel `(src, dst)`.
    pub channels: BTreeMap<(ProcId, ProcId), Vec<i64>>,
    /// Transfers `src` had sent on the channel when `src` recorded.
    pub sent: BTreeMap<(ProcId, ProcId), u64>,
    /// Transfers `dst` had received on the channel when `dst` recorded.
    pub received: BTreeMap<(ProcId, ProcId), u64>,
    /// Processes whose part is final.
    pub done: BTreeSet<ProcId>,
    pub complete: bool,
}

impl GlobalSnapshot {
    /// Sum of recorded balances and recorded in-flight money.
    pub fn total(&self) -> i64 {
        self.processes.values().map(|p| p.balance).sum::<i64>()
            + self.channels.values().flatten().sum::<i64>()
    }

    /// No transfer recorded as received whose sending is not recorded, and
    /// every transfer recorded as sent but not received is in its channel.
    /// Only channels whose both ends recorded are checked (all, once complete).
    pub fn is_consistent(&self) -> bool {
        self.sent.iter().all(|(c, &sent)| {
            self.received.get(c).is_none_or(|&received| {
                received <= sent
                    && self.channels.get(c).map_or(0, Vec::len) as u64 == sent - received
            })
        })
    }

    /// The stable property "the bank has terminated": every process halted
    /// and every recorded channel empty.
    pub fn is_terminated(&self) -> bool {
        self.processes.values().all(|p| p.halted) && self.channels.values().all(Vec::is_empty)
    }
}

/// The simulated bank.
#[derive(Debug)]
pub struct Bank {
    names: Vec<String>,
    balances: Vec<i64>,
    halted: Vec<bool>,
    transfers_left: Vec<Option<u64>>,
    channels: Vec<Channel>,
    by_pair: BTreeMap<(ProcId, ProcId), usize>,
    outgoing: Vec<Vec<usize>>,
    incoming: Vec<Vec<usize>>,
    machines: Vec<ChandyLamport>,
    snapshots: BTreeMap<CheckpointId, GlobalSnapshot>,
    next_id: CheckpointId,
    total: i64,
    rng: SplitMix64,
    actions: Vec<Action>,
}

impl Bank {
    /// A bank with the given processes and initial balances; channels are
    /// every ordered pair unless `topology` lists them.
    pub fn new(
        balances: &[(String, i64)],
        topology: Option<&[(String, String)]>,
        seed: u64,
    ) -> Result<Bank> {
        if balances.is_empty() {
            return Err(Error::Config(
                "a bank needs at least one process; pass e.g. {\"A\": 100}".into(),
            ));
        }
        let mut names = Vec::new();
        for (name, balance) in balances {
            if names.contains(name) {
                return Err(Error::Config(format!("process {name:?} is listed twice")));
            }
            if *balance < 0 {
                return Err(Error::Config(format!(
                    "process {name:?} has a negative initial balance {balance}; balances must be >= 0"
                )));
            }
            names.push(name.clone());
        }
        let n = names.len();
        let edges: Vec<(ProcId, ProcId)> = match topology {
            None => (0..n)
                .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
                .collect(),
            Some(list) => {
                let find = |name: &String| {
                    names.iter().position(|x| x == name).ok_or_else(|| {
                        Error::Graph(format!(
                            "topology names unknown process {name:?}; processes are: {}",
                            names.join(", ")
                        ))
                    })
                };
                let mut edges = Vec::new();
                for (s, d) in list {
                    let e = (find(s)?, find(d)?);
                    if e.0 == e.1 {
                        return Err(Error::Graph(format!(
                            "channel {s}→{d} is a self-loop; channels join distinct processes"
                        )));
                    }
                    if edges.contains(&e) {
                        return Err(Error::Graph(format!("channel {s}→{d} is listed twice")));
                    }
                    edges.push(e);
                }
                edges
            }
        };
        let balances_v: Vec<i64> = balances.iter().map(|(_, b)| *b).collect();
        let total = balances_v.iter().sum();
        Ok(Bank::build(names, balances_v, &edges, total, seed))
    }

    /// A bank of `cfg.processes` processes `P0..` with random channels (per
    /// `cfg.topology`) whose random steps are drawn from `cfg.seed`.
    pub fn random(cfg: &RandomBank) -> Result<Bank> {
        if cfg.processes == 0 {
            return Err(Error::Config("processes must be >= 1".into()));
        }
        if cfg.balance < 0 {
            return Err(Error::Config(format!(
                "balance must be >= 0, got {}",
                cfg.balance
            )));
        }
        let n = cfg.processes;
        let mut rng = SplitMix64::new(cfg.seed);
        let edges: Vec<(ProcId, ProcId)> = match cfg.topology {
            Topology::Complete => (0..n)
                .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
                .collect(),
            Topology::Ring => (0..n)
                .map(|i| (i, (i + 1) % n))
                .filter(|(s, d)| s != d)
                .collect(),
            Topology::Random => random_strongly_connected(n, &mut rng),
        };
        let names = (0..n).map(|i| format!("P{i}")).collect();
        let mut bank = Bank::build(
            names,
            vec![cfg.balance; n],
            &edges,
            cfg.balance * n as i64,
            rng.next_u64(),
        );
        bank.transfers_left = vec![cfg.max_transfers; n];
        if cfg.max_transfers == Some(0) {
            bank.halted = vec![true; n];
        }
        Ok(bank)
    }

    fn build(
        names: Vec<String>,
        balances: Vec<i64>,
        edges: &[(ProcId, ProcId)],
        total: i64,
        seed: u64,
    ) -> Bank {
        let n = names.len();
        let mut outgoing = vec![Vec::new(); n];
        let mut incoming = vec![Vec::new(); n];
        let mut by_pair = BTreeMap::new();
        let mut channels = Vec::new();
        for (c, &(src, dst)) in edges.iter().enumerate() {
            outgoing[src].push(c);
            incoming[dst].push(c);
            by_pair.insert((src, dst), c);
            channels.push(Channel {
                src,
                dst,
                input: incoming[dst].len() - 1,
                queue: VecDeque::new(),
                history: Vec::new(),
                received: 0,
            });
        }
        let machines = incoming
            .iter()
            .map(|ins| ChandyLamport::new(ins.len()))
            .collect();
        Bank {
            names,
            balances,
            halted: vec![false; n],
            transfers_left: vec![None; n],
            channels,
            by_pair,
            outgoing,
            incoming,
            machines,
            snapshots: BTreeMap::new(),
            next_id: 1,
            total,
            rng: SplitMix64::new(seed),
            actions: Vec::new(),
        }
    }

    /// Process names, in index order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Channels as `(src, dst)` index pairs.
    pub fn edges(&self) -> Vec<(ProcId, ProcId)> {
        self.channels.iter().map(|c| (c.src, c.dst)).collect()
    }

    /// The money in the system (conserved by every transfer).
    pub fn total(&self) -> i64 {
        self.total
    }

    /// Live balances, in index order.
    pub fn balances(&self) -> &[i64] {
        &self.balances
    }

    pub fn is_halted(&self, p: ProcId) -> bool {
        self.halted[p]
    }

    /// Index of the process called `name`.
    pub fn process(&self, name: &str) -> Result<ProcId> {
        self.names.iter().position(|x| x == name).ok_or_else(|| {
            Error::Graph(format!(
                "unknown process {name:?}; processes are: {}",
                self.names.join(", ")
            ))
        })
    }

    fn channel(&self, src: ProcId, dst: ProcId) -> Result<usize> {
        self.by_pair.get(&(src, dst)).copied().ok_or_else(|| {
            Error::Graph(format!(
                "no channel {}→{} in the topology; add ({:?}, {:?}) to it or use an existing channel",
                self.names[src], self.names[dst], self.names[src], self.names[dst]
            ))
        })
    }

    /// Moves `amount` from `src`'s balance into channel `src → dst`.
    pub fn send(&mut self, src: ProcId, dst: ProcId, amount: i64) -> Result<()> {
        let c = self.channel(src, dst)?;
        if amount <= 0 {
            return Err(Error::Config(format!(
                "transfer amount must be positive, got {amount}"
            )));
        }
        if self.halted[src] {
            return Err(Error::Config(format!(
                "process {} has halted: it sends no more money",
                self.names[src]
            )));
        }
        if self.balances[src] < amount {
            return Err(Error::Config(format!(
                "insufficient balance: {} has {}, cannot send {amount}",
                self.names[src], self.balances[src]
            )));
        }
        self.balances[src] -= amount;
        let ch = &mut self.channels[c];
        ch.queue.push_back(Message::Money(amount));
        ch.history.push(amount);
        if let Some(left) = &mut self.transfers_left[src] {
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.halted[src] = true;
            }
        }
        Ok(())
    }

    /// Marks `p` as halted: it will send no more money (terminated, for the
    /// stable-property check).
    pub fn halt(&mut self, p: ProcId) {
        self.halted[p] = true;
    }

    /// Starts a new snapshot at `p` (the initiator records at once); returns its id.
    pub fn start_snapshot(&mut self, p: ProcId) -> CheckpointId {
        let id = self.next_id;
        self.next_id += 1;
        self.snapshots.insert(
            id,
            GlobalSnapshot {
                id,
                initiator: p,
                ..GlobalSnapshot::default()
            },
        );
        self.feed(p, Event::Trigger { id }, None);
        id
    }

    /// Delivers the head of channel `src → dst` (money or marker) to `dst`.
    pub fn deliver(&mut self, src: ProcId, dst: ProcId) -> Result<Message> {
        let c = self.channel(src, dst)?;
        self.deliver_channel(c).ok_or_else(|| {
            Error::Config(format!(
                "channel {}→{} is empty: nothing to deliver",
                self.names[src], self.names[dst]
            ))
        })
    }

    fn deliver_channel(&mut self, c: usize) -> Option<Message> {
        let msg = self.channels[c].queue.pop_front()?;
        let (dst, input) = (self.channels[c].dst, self.channels[c].input);
        let event = match msg {
            Message::Money(_) => Event::Record { input },
            Message::Marker(id) => Event::Barrier { input, id },
        };
        self.feed(dst, event, Some(msg));
        if let Message::Money(_) = msg {
            // After the machine ran: a money delivery never records state,
            // so no snapshot can see this count half-updated.
            self.channels[c].received += 1;
        }
        Some(msg)
    }

    /// The messages queued on channel `src → dst`, head first.
    pub fn in_flight(&self, src: ProcId, dst: ProcId) -> Result<Vec<Message>> {
        let c = self.channel(src, dst)?;
        Ok(self.channels[c].queue.iter().copied().collect())
    }

    /// Snapshot `id` as recorded so far.
    pub fn snapshot(&self, id: CheckpointId) -> Result<&GlobalSnapshot> {
        self.snapshots.get(&id).ok_or_else(|| {
            Error::Config(format!(
                "unknown snapshot id {id}; ids start at 1 and {} snapshots were started",
                self.next_id - 1
            ))
        })
    }

    /// Every snapshot started, by id.
    pub fn snapshots(&self) -> &BTreeMap<CheckpointId, GlobalSnapshot> {
        &self.snapshots
    }

    /// Live termination: every process halted and every channel empty of money.
    pub fn is_terminated(&self) -> bool {
        self.halted.iter().all(|&h| h)
            && self
                .channels
                .iter()
                .all(|c| c.queue.iter().all(|m| matches!(m, Message::Marker(_))))
    }

    fn feed(&mut self, p: ProcId, event: Event, msg: Option<Message>) {
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        self.machines[p].on_event(event, &mut actions);
        for &a in &actions {
            self.apply(p, a, msg);
        }
        self.actions = actions;
    }

    fn apply(&mut self, p: ProcId, action: Action, msg: Option<Message>) {
        match action {
            Action::Deliver => {
                let Some(Message::Money(amount)) = msg else {
                    unreachable!("Deliver answers a record")
                };
                self.balances[p] += amount;
            }
            Action::Log { input, id } => {
                let Some(Message::Money(amount)) = msg else {
                    unreachable!("Log answers a record")
                };
                let ch = &self.channels[self.incoming[p][input]];
                let key = (ch.src, ch.dst);
                if let Some(s) = self.snapshots.get_mut(&id) {
                    s.channels.entry(key).or_default().push(amount);
                }
            }
            Action::Snapshot { id } => {
                let Some(s) = self.snapshots.get_mut(&id) else {
                    return;
                };
                s.order.push(p);
                s.processes.insert(
                    p,
                    ProcessRecord {
                        balance: self.balances[p],
                        halted: self.halted[p],
                    },
                );
                for &c in &self.outgoing[p] {
                    let ch = &self.channels[c];
                    s.sent.insert((ch.src, ch.dst), ch.history.len() as u64);
                }
                for &c in &self.incoming[p] {
                    let ch = &self.channels[c];
                    s.received.insert((ch.src, ch.dst), ch.received);
                    s.channels.entry((ch.src, ch.dst)).or_default();
                }
            }
            Action::Forward { id } => {
                for &c in &self.outgoing[p] {
                    self.channels[c].queue.push_back(Message::Marker(id));
                }
            }
            Action::Complete { id } => {
                let n = self.names.len();
                if let Some(s) = self.snapshots.get_mut(&id) {
                    s.done.insert(p);
                    s.complete = s.done.len() == n;
                }
            }
            Action::Block { .. } | Action::Unblock { .. } => {
                unreachable!("Chandy–Lamport never blocks")
            }
        }
    }

    /// One random step: a transfer by a process that still sends and has
    /// money, or the delivery of the head of a random non-empty channel.
    /// Returns `false` (and does nothing) when neither is possible.
    pub fn step(&mut self) -> bool {
        let senders: Vec<ProcId> = (0..self.names.len())
            .filter(|&p| !self.halted[p] && self.balances[p] > 0 && !self.outgoing[p].is_empty())
            .collect();
        let busy = self.busy_channels();
        if senders.is_empty() && busy.is_empty() {
            return false;
        }
        if !senders.is_empty() && (busy.is_empty() || self.rng.chance(1, 2)) {
            let p = *self.rng.pick(&senders);
            let c = *self.rng.pick(&self.outgoing[p]);
            let amount = 1 + self.rng.below((self.balances[p] / 2).max(1) as usize) as i64;
            let dst = self.channels[c].dst;
            self.send(p, dst, amount).expect("chosen to be valid");
        } else {
            let c = *self.rng.pick(&busy);
            self.deliver_channel(c);
        }
        true
    }

    fn busy_channels(&self) -> Vec<usize> {
        (0..self.channels.len())
            .filter(|&c| !self.channels[c].queue.is_empty())
            .collect()
    }

    /// Up to `steps` random steps; with `snapshot_every = Some(k)` a random
    /// process starts a snapshot before every k-th step. Returns the ids of
    /// snapshots that completed during the run.
    pub fn run(&mut self, steps: u64, snapshot_every: Option<u64>) -> Result<Vec<CheckpointId>> {
        if snapshot_every == Some(0) {
            return Err(Error::Config(
                "snapshot_every must be >= 1 (or None for no snapshots)".into(),
            ));
        }
        let before = self.completed();
        for k in 1..=steps {
            if snapshot_every.is_some_and(|e| k % e == 0) {
                let p = self.rng.below(self.names.len());
                self.start_snapshot(p);
            }
            if !self.step() {
                break;
            }
        }
        Ok(self.newly_completed(&before))
    }

    /// Delivers everything in flight (in random order, no new transfers)
    /// until every channel is empty; returns the snapshots that completed.
    pub fn drain(&mut self) -> Vec<CheckpointId> {
        let before = self.completed();
        loop {
            let busy = self.busy_channels();
            if busy.is_empty() {
                break;
            }
            let c = *self.rng.pick(&busy);
            self.deliver_channel(c);
        }
        self.newly_completed(&before)
    }

    fn completed(&self) -> BTreeSet<CheckpointId> {
        self.snapshots
            .values()
            .filter(|s| s.complete)
            .map(|s| s.id)
            .collect()
    }

    fn newly_completed(&self, before: &BTreeSet<CheckpointId>) -> Vec<CheckpointId> {
        self.completed().difference(before).copied().collect()
    }

    /// Full check of snapshot `id` against the ground truth (every amount
    /// ever sent): complete, per channel received ≤ sent and recorded
    /// contents == the transfers numbered received+1..=sent, total conserved.
    pub fn verify(&self, id: CheckpointId) -> std::result::Result<(), String> {
        let s = self.snapshot(id).map_err(|e| e.to_string())?;
        if !s.complete {
            return Err(format!("snapshot {id} is not complete"));
        }
        for ch in &self.channels {
            let key = (ch.src, ch.dst);
            let sent = s.sent.get(&key).copied().ok_or("sent count missing")? as usize;
            let received = s
                .received
                .get(&key)
                .copied()
                .ok_or("received count missing")? as usize;
            if received > sent {
                return Err(format!(
                    "snapshot {id}: {}→{} received {received} > sent {sent}",
                    self.names[ch.src], self.names[ch.dst]
                ));
            }
            let recorded = s.channels.get(&key).map_or(&[][..], Vec::as_slice);
            if recorded != &ch.history[received..sent] {
                return Err(format!(
                    "snapshot {id}: {}→{} recorded {recorded:?}, in flight at the cut {:?}",
                    self.names[ch.src],
                    self.names[ch.dst],
                    &ch.history[received..sent]
                ));
            }
        }
        if s.total() != self.total {
            return Err(format!(
                "snapshot {id}: total {} != {}",
                s.total(),
                self.total
            ));
        }
        Ok(())
    }
}

/// A ring through a random permutation (so strongly connected) plus each
/// other ordered pair with probability 1/3.
fn random_strongly_connected(n: usize, rng: &mut SplitMix64) -> Vec<(ProcId, ProcId)> {
    let mut perm: Vec<ProcId> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let mut edges: Vec<(ProcId, ProcId)> = (0..n)
        .map(|i| (perm[i], perm[(i + 1) % n]))
        .filter(|(s, d)| s != d)
        .collect();
    for s in 0..n {
        for d in 0..n {
            if s != d && !edges.contains(&(s, d)) && rng.chance(1, 3) {
                edges.push((s, d));
            }
        }
    }
    edges
}
