//! The experiments' job at cluster scale, in simulated time (experiment 6).
//!
//! `nodes` machines each run one task of every stage of the job of
//! `snapcut.experiments.job`: a source, then three keyed stateful stages,
//! each behind a hash shuffle (all-to-all between the nodes):
//!
//! ```text
//! source ─shuffle→ stage1 ─shuffle→ stage2 ─shuffle→ stage3
//! ```
//!
//! Work moves in *chunks* (`CostModel::chunk_records` records); each takes
//! `records × record_s` of its task's time, jittered (log-normal), or longer
//! if the node's network cannot send its share of a shuffle that fast.
//! Inputs hold `buffer_records` before their senders block (backpressure).
//! A shuffle is modelled by symmetry: hashing spreads every sender's output
//! evenly, so every receiver gets `1/nodes` of each chunk, and one counter
//! per shuffle tracks what arrived, what was sent after a sender's barrier
//! (held back during alignment), and the least any receiver consumed (for
//! backpressure) — O(log n) per chunk, not O(n).
//!
//! Protocols, as snapcut's runtime runs them:
//! - `none`: no checkpoints.
//! - `aligned` (ABS): the coordinator triggers the sources every
//!   `interval`; barriers flow with the data; a task aligns (stops taking
//!   records sent after a barrier until every sender's barrier is in),
//!   captures the keys changed since the last capture in memory, forwards
//!   the barrier and writes the diff in the background (its processing
//!   slows by `background_slowdown` meanwhile), then acknowledges.
//! - `sync` (the paper's Naiad-style baseline): the trigger pauses the
//!   sources; the barriers drain every channel; each task captures and
//!   writes its *whole* state durably; the sources resume only once the
//!   coordinator has every acknowledgement and has committed.
//!
//! Both: at most one checkpoint in flight, the next trigger `interval` after
//! the previous one or at its completion if that is later (no minimum
//! pause); acknowledgements are handled one at a time by the coordinator.
//! Everything random comes from `seed`: a run replays exactly.

mod engine;

use crate::error::{Error, Result};
use crate::protocol::ProtocolKind;

/// What things cost. Defaults are round figures of this project's
/// measurements on a 2-vCPU machine; `snapcut.experiments.scaling_sim`
/// calibrates them from experiments 1 and 2 before simulating.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Seconds per record per stage on one node (1 / the node's rate).
    pub record_s: f64,
    /// Log-normal spread (sigma) of each chunk's time around its mean.
    pub jitter: f64,
    /// Records per simulated work item (the simulation's granularity).
    pub chunk_records: f64,
    /// Records an input holds before its senders block.
    pub buffer_records: f64,
    /// One-way latency between nodes (data, barriers, triggers, acks), s.
    pub net_latency_s: f64,
    /// Latency of a channel inside one node (a 1-node job), s.
    pub channel_latency_s: f64,
    /// Bytes per second one node can send.
    pub net_bytes_per_s: f64,
    /// Bytes of one record on the wire.
    pub record_bytes: f64,
    /// Bytes of keyed state per key and stage.
    pub state_bytes_per_key: f64,
    /// Bytes per second one node writes durably (its stateful tasks share it).
    pub write_bytes_per_s: f64,
    /// Fixed cost of one durable write (create, fsync, rename), s.
    pub write_latency_s: f64,
    /// Seconds to capture one key in memory (the task stands still).
    pub capture_s_per_key: f64,
    /// Share of a task's speed lost while its background write runs.
    pub background_slowdown: f64,
    /// The coordinator's time per acknowledgement, s.
    pub ack_s: f64,
    /// The coordinator's commit of a checkpoint (manifest write), s.
    pub commit_s: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            record_s: 1.0 / 10e6,
            jitter: 0.2,
            chunk_records: 65_536.0,
            buffer_records: 262_144.0,
            net_latency_s: 100e-6,
            channel_latency_s: 2e-6,
            net_bytes_per_s: 1.25e9,
            record_bytes: 16.0,
            state_bytes_per_key: 26.0,
            write_bytes_per_s: 400e6,
            write_latency_s: 2e-3,
            capture_s_per_key: 20e-9,
            background_slowdown: 0.3,
            ack_s: 20e-6,
            commit_s: 5e-3,
        }
    }
}

/// One simulated run.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedConfig {
    /// `None`, `Aligned` or `Sync`.
    pub protocol: ProtocolKind,
    pub nodes: usize,
    /// Records each node's source emits (weak scaling: the job grows with
    /// the cluster).
    pub records_per_node: u64,
    /// Distinct keys each node's stateful tasks hold (per stage).
    pub keys_per_node: u64,
    /// Checkpoint interval; `None` with `ProtocolKind::None`.
    pub interval_s: Option<f64>,
    pub seed: u64,
    pub cost: CostModel,
}

/// What a run did, in simulated time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimedReport {
    /// From the start to the last task finishing.
    pub runtime_s: f64,
    pub records: u64,
    pub throughput_rps: f64,
    /// Checkpoints completed (acknowledged by every task and committed).
    pub checkpoints: u64,
    /// Trigger to commit, per completed checkpoint.
    pub checkpoint_s: Vec<f64>,
    /// Sync: time the sources stood still, summed over checkpoints
    /// (mean over sources).
    pub paused_s: f64,
    /// Sync: the longest single pause of a source.
    pub max_pause_s: f64,
    /// The longest a task waited from its first barrier to its capture.
    pub alignment_max_s: f64,
    /// Bytes of state one checkpoint wrote (all tasks), the most of any.
    pub state_bytes_max: u64,
    /// Events simulated (the simulation's own cost).
    pub events: u64,
}

/// Simulates `cfg`; `Err` names a bad configuration value and the fix.
pub fn run(cfg: &TimedConfig) -> Result<TimedReport> {
    validate(cfg)?;
    engine::Sim::new(cfg).run()
}

fn validate(cfg: &TimedConfig) -> Result<()> {
    let bad = |m: String| Err(Error::Config(m));
    match cfg.protocol {
        ProtocolKind::None | ProtocolKind::Aligned | ProtocolKind::Sync => {}
        other => {
            return bad(format!(
                "the timed simulator models none, aligned and sync, not {other}"
            ))
        }
    }
    match (cfg.protocol, cfg.interval_s) {
        (ProtocolKind::None, Some(_)) => {
            return bad("protocol none takes no checkpoint interval; pass None".into())
        }
        (ProtocolKind::None, None) => {}
        (_, Some(i)) if i.is_finite() && i > 0.0 => {}
        (p, i) => {
            return bad(format!(
                "protocol {p} needs a checkpoint interval > 0 s, got {i:?}"
            ))
        }
    }
    if cfg.nodes == 0 || cfg.nodes > 100_000 {
        return bad(format!("nodes must be 1..=100000, got {}", cfg.nodes));
    }
    if cfg.records_per_node == 0 {
        return bad("records_per_node must be at least 1".into());
    }
    let c = &cfg.cost;
    let positive = [
        ("record_s", c.record_s),
        ("chunk_records", c.chunk_records),
        ("buffer_records", c.buffer_records),
        ("net_bytes_per_s", c.net_bytes_per_s),
        ("write_bytes_per_s", c.write_bytes_per_s),
    ];
    for (name, v) in positive {
        if !(v.is_finite() && v > 0.0) {
            return bad(format!("cost.{name} must be a finite number > 0, got {v}"));
        }
    }
    let non_negative = [
        ("jitter", c.jitter),
        ("net_latency_s", c.net_latency_s),
        ("channel_latency_s", c.channel_latency_s),
        ("record_bytes", c.record_bytes),
        ("state_bytes_per_key", c.state_bytes_per_key),
        ("write_latency_s", c.write_latency_s),
        ("capture_s_per_key", c.capture_s_per_key),
        ("background_slowdown", c.background_slowdown),
        ("ack_s", c.ack_s),
        ("commit_s", c.commit_s),
    ];
    for (name, v) in non_negative {
        if !(v.is_finite() && v >= 0.0) {
            return bad(format!("cost.{name} must be a finite number >= 0, got {v}"));
        }
    }
    let chunks = cfg.records_per_node as f64 / c.chunk_records;
    if chunks * cfg.nodes as f64 * 4.0 > 2e9 {
        return bad(format!(
            "{} nodes x {} records per node in chunks of {} is too many events to \
             simulate; raise cost.chunk_records",
            cfg.nodes, cfg.records_per_node, c.chunk_records
        ));
    }
    Ok(())
}
