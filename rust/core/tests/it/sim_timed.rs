//! The timed simulator (experiment 6): replay, the cost model's arithmetic
//! on jitter-free runs, ABS vs sync, scaling, and bad configurations.

use snapcut_core::protocol::ProtocolKind;
use snapcut_core::sim::timed::{run, CostModel, TimedConfig, TimedReport};

fn cfg(protocol: ProtocolKind, nodes: usize, interval_s: Option<f64>) -> TimedConfig {
    TimedConfig {
        protocol,
        nodes,
        records_per_node: 20_000_000,
        keys_per_node: 100_000,
        interval_s,
        seed: 1,
        cost: CostModel::default(),
    }
}

fn exact(mut c: TimedConfig) -> TimedConfig {
    c.cost.jitter = 0.0;
    c
}

fn sim(c: &TimedConfig) -> TimedReport {
    run(c).unwrap()
}

#[test]
fn a_run_replays_exactly_from_its_seed() {
    let c = cfg(ProtocolKind::Aligned, 6, Some(0.3));
    assert_eq!(sim(&c), sim(&c));
    let mut other = c.clone();
    other.seed = 2;
    assert_ne!(sim(&c).runtime_s, sim(&other).runtime_s);
}

#[test]
fn without_jitter_or_checkpoints_the_runtime_is_the_records_at_the_node_rate() {
    let c = exact(cfg(ProtocolKind::None, 4, None));
    let r = sim(&c);
    let ideal = c.records_per_node as f64 * c.cost.record_s;
    // Plus filling the pipeline: a chunk per stage and the latencies.
    assert!(r.runtime_s >= ideal, "{} < {ideal}", r.runtime_s);
    assert!(r.runtime_s < ideal * 1.03, "{} vs {ideal}", r.runtime_s);
    assert_eq!(r.records, 4 * c.records_per_node);
    assert_eq!(r.checkpoints, 0);
}

#[test]
fn weak_scaling_is_flat_without_jitter_and_the_network_caps_the_rate() {
    let one = sim(&exact(cfg(ProtocolKind::None, 1, None))).runtime_s;
    let many = sim(&exact(cfg(ProtocolKind::None, 64, None))).runtime_s;
    assert!(
        (many / one - 1.0).abs() < 0.03,
        "1 node {one} s, 64 nodes {many} s"
    );
    // A network slower than the CPU: each chunk takes its bytes' time.
    let mut slow = exact(cfg(ProtocolKind::None, 8, None));
    slow.cost.net_bytes_per_s = 16.0 * 7.0 / 8.0 / (2.0 * slow.cost.record_s);
    let r = sim(&slow);
    assert!(r.runtime_s > 1.9 * one, "{} vs {one}", r.runtime_s);
}

#[test]
fn sync_stalls_for_drain_full_write_and_commit_at_every_checkpoint() {
    let mut c = exact(cfg(ProtocolKind::Sync, 4, Some(0.5)));
    c.keys_per_node = 2_000_000;
    let none = sim(&exact(cfg(ProtocolKind::None, 4, None))).runtime_s;
    let r = sim(&c);
    let m = &c.cost;
    let write = m.write_latency_s
        + c.keys_per_node as f64 * m.state_bytes_per_key / (m.write_bytes_per_s / 3.0);
    let capture = c.keys_per_node as f64 * m.capture_s_per_key;
    assert!(r.checkpoints >= 3, "{r:?}");
    for &d in &r.checkpoint_s {
        assert!(
            d >= write + capture + m.commit_s,
            "{d} < {}",
            write + capture
        );
    }
    // The sources stood still for about every checkpoint's duration, and
    // the run got that much longer.
    let stalled: f64 = r.checkpoint_s.iter().sum();
    assert!(r.paused_s > 0.8 * stalled && r.paused_s <= stalled, "{r:?}");
    let grew = r.runtime_s - none;
    assert!(
        (grew / r.paused_s - 1.0).abs() < 0.2,
        "runtime grew {grew} s, paused {} s",
        r.paused_s
    );
    assert!(r.state_bytes_max as f64 >= 3.0 * 4.0 * 2e6 * m.state_bytes_per_key * 0.99);
}

#[test]
fn abs_writes_diffs_in_the_background_and_costs_less_than_sync() {
    let mut a = cfg(ProtocolKind::Aligned, 8, Some(0.25));
    a.keys_per_node = 1_000_000;
    let mut s = a.clone();
    s.protocol = ProtocolKind::Sync;
    let mut n = a.clone();
    n.protocol = ProtocolKind::None;
    n.interval_s = None;
    let (abs, sync, none) = (sim(&a), sim(&s), sim(&n));
    assert!(abs.checkpoints >= 4 && sync.checkpoints >= 4);
    assert_eq!(abs.paused_s, 0.0);
    assert!(abs.runtime_s < sync.runtime_s, "{abs:?} vs {sync:?}");
    let (oa, os) = (
        abs.runtime_s / none.runtime_s - 1.0,
        sync.runtime_s / none.runtime_s - 1.0,
    );
    assert!(oa < 0.5 * os, "ABS overhead {oa}, sync {os}");
    // Diffs: at most the keys touched in an interval, less than all of them.
    assert!(abs.state_bytes_max < sync.state_bytes_max);
}

#[test]
fn a_sync_stall_longer_than_the_interval_makes_checkpoints_back_to_back() {
    let mut c = exact(cfg(ProtocolKind::Sync, 2, Some(0.05)));
    c.records_per_node = 2_000_000;
    c.keys_per_node = 4_000_000;
    let r = sim(&c);
    let none = sim(&exact({
        let mut n = c.clone();
        n.protocol = ProtocolKind::None;
        n.interval_s = None;
        n
    }));
    // Each stall (~0.8 s of writes) outlasts the 50 ms interval: the job
    // only runs between a resume and the next trigger.
    assert!(r.runtime_s > 5.0 * none.runtime_s, "{r:?} vs {none:?}");
    assert!(r.paused_s > 0.8 * r.runtime_s, "{r:?}");
}

#[test]
fn alignment_waits_for_the_slowest_sender_and_grows_with_the_cluster() {
    let small = sim(&cfg(ProtocolKind::Aligned, 2, Some(0.3)));
    let large = sim(&cfg(ProtocolKind::Aligned, 64, Some(0.3)));
    assert!(small.alignment_max_s > 0.0);
    assert!(
        large.alignment_max_s > small.alignment_max_s,
        "{} vs {}",
        large.alignment_max_s,
        small.alignment_max_s
    );
}

#[test]
fn a_thousand_nodes_simulate() {
    let mut c = cfg(ProtocolKind::Sync, 1000, Some(0.2));
    c.records_per_node = 5_000_000;
    let r = sim(&c);
    assert_eq!(r.records, 5_000_000_000);
    assert!(r.checkpoints >= 1, "{r:?}");
}

#[test]
fn bad_configurations_name_the_value_and_the_fix() {
    let err = |c: TimedConfig| run(&c).unwrap_err().to_string();
    let e = err(cfg(ProtocolKind::Unaligned, 2, Some(1.0)));
    assert!(e.contains("models none, aligned and sync"), "{e}");
    let e = err(cfg(ProtocolKind::None, 2, Some(1.0)));
    assert!(e.contains("takes no checkpoint interval"), "{e}");
    let e = err(cfg(ProtocolKind::Sync, 2, None));
    assert!(e.contains("needs a checkpoint interval > 0"), "{e}");
    let e = err(cfg(ProtocolKind::Sync, 0, Some(1.0)));
    assert!(e.contains("nodes must be"), "{e}");
    let mut c = cfg(ProtocolKind::None, 2, None);
    c.cost.write_bytes_per_s = 0.0;
    assert!(err(c).contains("cost.write_bytes_per_s must be"));
    let mut c = cfg(ProtocolKind::None, 2, None);
    c.cost.jitter = f64::NAN;
    assert!(err(c).contains("cost.jitter must be"));
    let mut c = cfg(ProtocolKind::None, 50_000, None);
    c.records_per_node = u64::MAX / 4;
    assert!(err(c).contains("raise cost.chunk_records"));
}
