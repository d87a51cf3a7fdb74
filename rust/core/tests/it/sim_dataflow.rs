//! Every protocol driven by the deterministic dataflow simulator over random
//! DAGs and graphs with cycles: every checkpoint that is not aborted must
//! complete and be a consistent cut (checked channel by channel inside
//! `sim::dataflow::run`). A failure prints the configuration; replay it with
//! `sim::dataflow::run(&that_config)`.

use proptest::prelude::*;
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::protocol::{Action, ChandyLamport, Event, InputId, Protocol};
use snapcut_core::sim::dataflow::{run, run_with, DataflowConfig};
use snapcut_core::Error;

fn kind() -> impl Strategy<Value = (ProtocolKind, bool)> {
    prop_oneof![
        Just((ProtocolKind::Aligned, false)),
        Just((ProtocolKind::Unaligned, false)),
        Just((ProtocolKind::Unaligned, true)),
        Just((ProtocolKind::Sync, false)),
        Just((ProtocolKind::SyncCapture, false)),
        Just((ProtocolKind::ChandyLamport, false)),
    ]
}

prop_compose! {
    fn config()(
        (protocol, aligned_first) in kind(),
        seed in any::<u64>(),
        sources in 1usize..4,
        more in 0usize..6,
        back_edges in prop_oneof![Just(0usize), 1usize..4],
        extra_edges in 0usize..6,
        tokens_per_source in 0u64..40,
        checkpoints in 1u64..6,
        max_hops in 1u32..8,
        end_of_stream in any::<bool>(),
        abort_one_in in prop_oneof![Just(0u32), 20u32..200],
    ) -> DataflowConfig {
        DataflowConfig {
            protocol,
            aligned_first,
            seed,
            vertices: sources + more,
            sources,
            back_edges,
            extra_edges,
            tokens_per_source,
            checkpoints,
            max_hops,
            end_of_stream,
            abort_one_in,
        }
    }
}

/// `PROPTEST_CASES` overrides the default case count (for long soak runs).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(10_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_checkpoint_is_a_consistent_cut(cfg in config()) {
        let report = run(&cfg).unwrap();
        if let Some(v) = &report.violation {
            prop_assert!(false, "{}", v);
        }
        for c in &report.checkpoints {
            prop_assert!(c.completed || c.aborted, "{c:?} in {cfg:?}");
        }
        prop_assert_eq!(report.checkpoints.len() as u64, cfg.checkpoints);
    }
}

#[test]
fn same_config_replays_exactly() {
    let mut cfg = DataflowConfig::new(ProtocolKind::Unaligned, 99);
    cfg.back_edges = 2;
    cfg.aligned_first = true;
    assert_eq!(run(&cfg).unwrap(), run(&cfg).unwrap());
    let other = DataflowConfig {
        seed: 100,
        ..cfg.clone()
    };
    assert_ne!(run(&cfg).unwrap(), run(&other).unwrap());
}

#[test]
fn aligned_on_a_dag_logs_nothing_and_unaligned_logs_something() {
    let mut logged = [0u64; 2];
    for seed in 0..200 {
        for (k, kind) in [ProtocolKind::Aligned, ProtocolKind::Unaligned]
            .into_iter()
            .enumerate()
        {
            let mut cfg = DataflowConfig::new(kind, seed);
            cfg.tokens_per_source = 60;
            let r = run(&cfg).unwrap();
            assert_eq!(r.violation, None);
            assert!(r.checkpoints.iter().all(|c| c.completed));
            logged[k] += r.checkpoints.iter().map(|c| c.logged).sum::<u64>();
        }
    }
    assert_eq!(logged[0], 0);
    assert!(logged[1] > 0, "unaligned never overtook data in 200 runs");
}

#[test]
fn cycles_log_back_edges_under_aligned() {
    let mut logged = 0;
    for seed in 0..200 {
        let mut cfg = DataflowConfig::new(ProtocolKind::Aligned, seed);
        cfg.back_edges = 3;
        cfg.tokens_per_source = 60;
        let r = run(&cfg).unwrap();
        assert_eq!(r.violation, None);
        assert!(r.checkpoints.iter().all(|c| c.completed), "{cfg:?}");
        logged += r.checkpoints.iter().map(|c| c.logged).sum::<u64>();
    }
    assert!(logged > 0, "no back-edge record was ever logged");
}

#[test]
fn alignment_timeouts_fire_and_still_give_consistent_cuts() {
    let mut fired = 0;
    for seed in 0..200 {
        let mut cfg = DataflowConfig::new(ProtocolKind::Unaligned, seed);
        cfg.aligned_first = true;
        cfg.sources = 3;
        cfg.tokens_per_source = 60;
        let r = run(&cfg).unwrap();
        assert_eq!(r.violation, None);
        fired += r.timeouts_fired;
    }
    assert!(fired > 0);
}

/// The checker must be able to fail: Chandy–Lamport with its channel
/// logging removed loses in-flight tokens, and the simulator says so.
#[test]
fn a_broken_protocol_is_caught() {
    let mut caught = 0;
    for seed in 0..50 {
        let mut cfg = DataflowConfig::new(ProtocolKind::ChandyLamport, seed);
        cfg.tokens_per_source = 60;
        let r = run_with(&cfg, |kinds| {
            Box::new(NoLogs(ChandyLamport::new(kinds.len())))
        })
        .unwrap();
        caught += usize::from(r.violation.is_some());
        if let Some(v) = r.violation {
            assert!(v.contains("replay with: DataflowConfig"), "{v}");
        }
    }
    assert!(caught > 0);
}

#[derive(Debug)]
struct NoLogs(ChandyLamport);

impl Protocol for NoLogs {
    fn on_event(&mut self, event: Event, actions: &mut Vec<Action>) {
        self.0.on_event(event, actions);
        actions.retain(|a| !matches!(a, Action::Log { .. }));
    }
    fn is_blocked(&self, input: InputId) -> bool {
        self.0.is_blocked(input)
    }
}

#[test]
fn bad_configs_are_rejected() {
    let cfg = DataflowConfig::new(ProtocolKind::None, 0);
    let e = run(&cfg).unwrap_err();
    assert!(matches!(e, Error::Config(_)) && e.to_string().contains("protocol none"));
    let cfg = DataflowConfig {
        sources: 0,
        ..DataflowConfig::new(ProtocolKind::Aligned, 0)
    };
    assert!(run(&cfg).unwrap_err().to_string().contains("sources"));
}
