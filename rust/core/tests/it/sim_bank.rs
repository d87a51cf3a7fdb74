//! The Chandy–Lamport bank simulator: the worked examples reproduced exactly,
//! typed errors for bad input, and property tests over random strongly
//! connected banks with concurrent snapshots from different initiators.

use proptest::prelude::*;
use snapcut_core::sim::bank::{Bank, Message, RandomBank, Topology};
use snapcut_core::Error;

fn bank(balances: &[(&str, i64)], topology: Option<&[(&str, &str)]>) -> Bank {
    let b: Vec<(String, i64)> = balances.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let t: Option<Vec<(String, String)>> = topology.map(|t| {
        t.iter()
            .map(|(s, d)| (s.to_string(), d.to_string()))
            .collect()
    });
    Bank::new(&b, t.as_deref(), 0).unwrap()
}

#[test]
fn design_two_process_example() {
    let mut sim = bank(&[("A", 10000), ("B", 5000)], None);
    let (a, b) = (sim.process("A").unwrap(), sim.process("B").unwrap());
    sim.send(a, b, 1000).unwrap();
    assert_eq!(sim.balances(), [9000, 5000]);
    let id = sim.start_snapshot(a);
    sim.send(b, a, 1000).unwrap();
    sim.send(b, a, 2000).unwrap();
    assert_eq!(sim.deliver(a, b).unwrap(), Message::Money(1000));
    assert_eq!(sim.balances(), [9000, 3000]);
    assert_eq!(sim.deliver(a, b).unwrap(), Message::Marker(id));
    assert_eq!(sim.deliver(b, a).unwrap(), Message::Money(1000));
    assert_eq!(sim.deliver(b, a).unwrap(), Message::Money(2000));
    assert_eq!(sim.balances(), [12000, 3000]);
    assert!(!sim.snapshot(id).unwrap().complete);
    assert_eq!(sim.deliver(b, a).unwrap(), Message::Marker(id));
    let s = sim.snapshot(id).unwrap();
    assert!(s.complete);
    assert_eq!(s.processes[&a].balance, 9000);
    assert_eq!(s.processes[&b].balance, 3000);
    assert_eq!(s.channels[&(a, b)], Vec::<i64>::new());
    assert_eq!(s.channels[&(b, a)], vec![1000, 2000]);
    assert_eq!(s.total(), 15000);
    assert!(s.is_consistent());
    sim.verify(id).unwrap();
}

/// The seeds' three-process example (Gupta's lecture, as retold in the
/// Chinese write-up): P1 initiates after its local events a, b; P3 gets the
/// marker first, P2 last; P2's send at h reaches P1 (event d) after P1
/// recorded, so M[hd] is recorded on C21. Local events change no balance.
#[test]
fn seeds_three_process_example() {
    let mut sim = bank(&[("P1", 1000), ("P2", 2000), ("P3", 3000)], None);
    let p = |n: &str| sim.process(n).unwrap();
    let (p1, p2, p3) = (p("P1"), p("P2"), p("P3"));
    // a, b at P1; then P1 initiates: records {a, b}, markers on C12 and C13.
    let id = sim.start_snapshot(p1);
    // f, g local at P2; h: P2 sends 50 to P1.
    sim.send(p2, p1, 50).unwrap();
    // P3 gets the marker first: records {i}, C13 = [], markers to P1, P2.
    assert_eq!(sim.deliver(p1, p3).unwrap(), Message::Marker(id));
    // P1 gets P3's marker: C31 = [].
    assert_eq!(sim.deliver(p3, p1).unwrap(), Message::Marker(id));
    // P2 gets P3's marker: records {f, g, h}, C32 = [], markers to P1, P3.
    assert_eq!(sim.deliver(p3, p2).unwrap(), Message::Marker(id));
    // P2 gets P1's marker: C12 = []; P2 is done.
    assert_eq!(sim.deliver(p1, p2).unwrap(), Message::Marker(id));
    assert!(sim.snapshot(id).unwrap().done.contains(&p2));
    // P1 receives M[hd] (recorded on C21), then P2's marker: P1 is done.
    assert_eq!(sim.deliver(p2, p1).unwrap(), Message::Money(50));
    assert_eq!(sim.deliver(p2, p1).unwrap(), Message::Marker(id));
    assert!(!sim.snapshot(id).unwrap().complete);
    // P3 gets P2's marker on C23: everything recorded.
    assert_eq!(sim.deliver(p2, p3).unwrap(), Message::Marker(id));
    let s = sim.snapshot(id).unwrap();
    assert!(s.complete);
    assert_eq!(s.order, [p1, p3, p2]);
    assert_eq!(s.processes[&p1].balance, 1000);
    assert_eq!(s.processes[&p2].balance, 1950);
    assert_eq!(s.processes[&p3].balance, 3000);
    for (&c, msgs) in &s.channels {
        if c == (p2, p1) {
            assert_eq!(msgs, &[50]);
        } else {
            assert!(msgs.is_empty(), "{c:?} recorded {msgs:?}");
        }
    }
    assert_eq!(s.channels.len(), 6);
    assert_eq!(sim.balances(), [1050, 1950, 3000]);
    sim.verify(id).unwrap();
}

fn msg(e: Error) -> String {
    e.to_string()
}

#[test]
fn bad_input_gets_typed_errors() {
    let mut sim = bank(&[("A", 100), ("B", 0)], Some(&[("A", "B")]));
    let (a, b) = (0, 1);
    assert!(
        matches!(sim.process("Z"), Err(Error::Graph(m)) if m.contains("unknown process \"Z\""))
    );
    let e = sim.send(b, a, 1).unwrap_err();
    assert!(matches!(e, Error::Graph(_)) && msg(e).contains("no channel B→A"));
    let e = sim.send(a, b, 101).unwrap_err();
    assert!(matches!(e, Error::Config(_)) && msg(e).contains("insufficient balance: A has 100"));
    let e = sim.send(a, b, -5).unwrap_err();
    assert!(matches!(e, Error::Config(_)) && msg(e).contains("must be positive, got -5"));
    let e = sim.deliver(a, b).unwrap_err();
    assert!(matches!(e, Error::Config(_)) && msg(e).contains("A→B is empty"));
    assert!(matches!(sim.snapshot(1), Err(Error::Config(_))));
    sim.halt(a);
    assert!(msg(sim.send(a, b, 1).unwrap_err()).contains("halted"));
    let dup = [("A".to_string(), 1), ("A".to_string(), 2)];
    assert!(matches!(Bank::new(&dup, None, 0), Err(Error::Config(_))));
    let neg = [("A".to_string(), -1)];
    assert!(matches!(Bank::new(&neg, None, 0), Err(Error::Config(_))));
    let one = [("A".to_string(), 1)];
    let t = [("A".to_string(), "Q".to_string())];
    assert!(matches!(Bank::new(&one, Some(&t), 0), Err(Error::Graph(_))));
    let t = [("A".to_string(), "A".to_string())];
    assert!(matches!(Bank::new(&one, Some(&t), 0), Err(Error::Graph(_))));
    assert!(matches!(Bank::new(&[], None, 0), Err(Error::Config(_))));
}

#[test]
fn same_seed_replays_exactly() {
    let cfg = RandomBank {
        processes: 5,
        seed: 11,
        balance: 1000,
        topology: Topology::Random,
        max_transfers: None,
    };
    let run = || {
        let mut b = Bank::random(&cfg).unwrap();
        let done = b.run(2000, Some(37)).unwrap();
        (done, b.balances().to_vec(), b.edges())
    };
    assert_eq!(run(), run());
}

#[test]
fn single_process_snapshot_completes_at_once() {
    let mut sim = bank(&[("A", 7)], None);
    let id = sim.start_snapshot(0);
    assert!(sim.snapshot(id).unwrap().complete);
    sim.verify(id).unwrap();
}

#[test]
fn inconsistent_counters_are_detected() {
    let mut sim = bank(&[("A", 10), ("B", 10)], None);
    let id = sim.start_snapshot(0);
    sim.drain();
    let mut s = sim.snapshot(id).unwrap().clone();
    assert!(s.is_consistent());
    s.received.insert((1, 0), 1); // B→A received one transfer never sent
    assert!(!s.is_consistent());
}

fn topology() -> impl Strategy<Value = Topology> {
    prop_oneof![
        Just(Topology::Complete),
        Just(Topology::Ring),
        Just(Topology::Random)
    ]
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
        cases: cases(2000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random strongly connected banks, random transfers and delivery order,
    /// concurrent snapshots from random initiators: every snapshot completes,
    /// conserves the total and is a consistent cut (checked against every
    /// amount ever sent); a snapshot that says "terminated" is only taken
    /// when the bank really terminated, and one started after termination
    /// says so.
    #[test]
    fn snapshots_are_consistent_and_terminate(
        processes in 1usize..7,
        seed in any::<u64>(),
        topology in topology(),
        steps in 0u64..400,
        every in 1u64..40,
        max_transfers in prop::option::of(0u64..30),
    ) {
        let cfg = RandomBank { processes, seed, balance: 1000, topology, max_transfers };
        let mut sim = Bank::random(&cfg).unwrap();
        let mut done = Vec::new();
        for k in 1..=steps {
            if k % every == 0 {
                let p = (seed as usize).wrapping_add(k as usize) % processes;
                let terminated = sim.is_terminated();
                let id = sim.start_snapshot(p);
                if terminated {
                    sim.drain();
                    prop_assert!(sim.snapshot(id).unwrap().is_terminated(), "seed {seed}: missed termination");
                }
            }
            let before: Vec<u64> = sim.snapshots().values().filter(|s| s.complete).map(|s| s.id).collect();
            if !sim.step() {
                sim.drain();
            }
            for s in sim.snapshots().values().filter(|s| s.complete && !before.contains(&s.id)) {
                if s.is_terminated() {
                    prop_assert!(sim.is_terminated(), "seed {seed}: snapshot {} claims termination", s.id);
                }
            }
        }
        done.extend(sim.drain());
        prop_assert_eq!(sim.balances().iter().sum::<i64>(), sim.total());
        for s in sim.snapshots().values() {
            prop_assert!(s.complete, "seed {}: snapshot {} did not terminate", seed, s.id);
            prop_assert!(s.is_consistent());
            if let Err(e) = sim.verify(s.id) {
                prop_assert!(false, "seed {seed}, cfg {cfg:?}: {e}");
            }
        }
    }
}
