//! Property tests of the per-task protocol machines over random event
//! interleavings: one task, random input kinds, random input scripts (records
//! and barriers 1..=m in order, maybe ended early), a seeded scheduler that
//! pops from unblocked inputs, reports queued barriers, fires alignment
//! timeouts and triggers. Every run is checked against the cut rule:
//! for snapshot n and a record r on input i,
//! - r ahead of barrier n on i: delivered before Snapshot n and not logged
//!   for n, or delivered after it and logged for n (exactly once);
//! - r behind barrier n on i: delivered after Snapshot n, never logged for n.
//!
//! plus: Snapshot and Complete exactly once per id, Complete after every Log
//! of its id, blocked inputs are never popped, no deadlock, and aligned tasks
//! without back-edges (and without timeouts) never log.

#![allow(clippy::needless_range_loop)] // the harness indexes parallel per-input vectors

use proptest::prelude::*;
use snapcut_core::protocol::{
    for_task, Action, CheckpointId, Event, InputKind, Protocol, ProtocolKind,
};
use snapcut_core::sim::SplitMix64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    Rec(u32),
    Bar(CheckpointId),
    Eoi,
}

#[derive(Clone, Debug)]
struct Case {
    kind: ProtocolKind,
    aligned_first: bool,
    timeouts: bool,
    aborts: bool,
    kinds: Vec<InputKind>,
    scripts: Vec<Vec<Item>>,
    m: CheckpointId,
    seed: u64,
}

fn input_kind() -> impl Strategy<Value = InputKind> {
    prop_oneof![3 => Just(InputKind::Regular), 1 => Just(InputKind::BackEdge)]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just(ProtocolKind::Aligned),
            Just(ProtocolKind::Unaligned),
            Just(ProtocolKind::ChandyLamport),
            Just(ProtocolKind::Sync),
            Just(ProtocolKind::SyncCapture),
        ],
        any::<bool>(),
        any::<(bool, bool)>(),
        prop::collection::vec(input_kind(), 0..4),
        1u64..4,
        any::<u64>(),
    )
        .prop_flat_map(
            |(kind, aligned_first, (timeouts, aborts), kinds, m, seed)| {
                let n = kinds.len();
                (
                    Just((kind, aligned_first, (timeouts, aborts), kinds, m, seed)),
                    prop::collection::vec(
                        (
                            prop::collection::vec(0usize..4, (m as usize) + 1),
                            prop::option::of(0usize..=(m as usize)),
                        ),
                        n,
                    ),
                )
            },
        )
        .prop_map(
            |((kind, aligned_first, (timeouts, aborts), kinds, m, seed), inputs)| {
                let mut next = 0u32;
                let scripts = inputs
                    .into_iter()
                    .map(|(gaps, end_after)| {
                        let mut s = Vec::new();
                        for (k, gap) in gaps.iter().enumerate() {
                            for _ in 0..*gap {
                                next += 1;
                                s.push(Item::Rec(next));
                            }
                            if end_after == Some(k) {
                                s.push(Item::Eoi);
                                break;
                            }
                            if (k as u64) < m {
                                s.push(Item::Bar(k as u64 + 1));
                            }
                        }
                        s
                    })
                    .collect();
                Case {
                    kind,
                    aligned_first,
                    timeouts,
                    aborts,
                    kinds,
                    scripts,
                    m,
                    seed,
                }
            },
        )
}

/// One event fed to the machine and what it answered.
struct Step {
    event: Event,
    actions: Vec<Action>,
}

fn run(case: &Case) -> Result<Vec<Step>, TestCaseError> {
    let mut p: Box<dyn Protocol> =
        for_task(case.kind, &case.kinds, case.aligned_first).expect("not None");
    let mut rng = SplitMix64::new(case.seed);
    let n = case.kinds.len();
    let mut pos = vec![0usize; n];
    let mut announced = vec![0usize; n]; // index up to which queued barriers were reported
    let mut next_trigger: CheckpointId = 1;
    let mut steps = Vec::new();
    let feed = |p: &mut Box<dyn Protocol>, event: Event, steps: &mut Vec<Step>| {
        let mut actions = Vec::new();
        p.on_event(event, &mut actions);
        steps.push(Step { event, actions });
    };
    loop {
        #[derive(Clone, Copy)]
        enum Move {
            Pop(usize),
            Queued(usize, usize),
            Timeout(CheckpointId),
            Trigger,
            Abort(CheckpointId),
        }
        let mut moves = Vec::new();
        for i in 0..n {
            if pos[i] < case.scripts[i].len() && !p.is_blocked(i) {
                moves.push(Move::Pop(i));
            }
            // Like the runtime, report only the first barrier in the queue,
            // once.
            if let Some(off) = case.scripts[i][pos[i]..]
                .iter()
                .position(|it| matches!(it, Item::Bar(_)))
            {
                if pos[i] + off >= announced[i] {
                    moves.push(Move::Queued(i, pos[i] + off));
                }
            }
        }
        if case.timeouts {
            if let Some(id) = p.aligning() {
                moves.push(Move::Timeout(id));
            }
        }
        // ABS triggers only reach tasks without regular inputs (sources,
        // iteration heads); markers may be initiated anywhere.
        let aligns = matches!(
            case.kind,
            ProtocolKind::Aligned | ProtocolKind::Sync | ProtocolKind::SyncCapture
        ) || (case.kind == ProtocolKind::Unaligned && case.aligned_first);
        let triggerable = !aligns || !case.kinds.contains(&InputKind::Regular);
        if triggerable && next_trigger <= case.m && rng.chance(1, 4) {
            moves.push(Move::Trigger);
        }
        // The coordinator may abort any checkpoint, at any time, out of band.
        if case.aborts && rng.chance(1, 40) {
            let id = 1 + rng.below(case.m as usize) as CheckpointId;
            moves.push(Move::Abort(id));
        }
        if moves.is_empty() {
            let stuck: Vec<usize> = (0..n).filter(|&i| pos[i] < case.scripts[i].len()).collect();
            prop_assert!(stuck.is_empty(), "deadlock: inputs {stuck:?} blocked");
            break;
        }
        match *rng.pick(&moves) {
            Move::Pop(i) => {
                let event = match case.scripts[i][pos[i]] {
                    Item::Rec(_) => Event::Record { input: i },
                    Item::Bar(id) => Event::Barrier { input: i, id },
                    Item::Eoi => Event::EndOfInput { input: i },
                };
                pos[i] += 1;
                feed(&mut p, event, &mut steps);
            }
            Move::Queued(i, at) => {
                let Item::Bar(id) = case.scripts[i][at] else {
                    unreachable!()
                };
                announced[i] = at + 1;
                feed(&mut p, Event::BarrierQueued { input: i, id }, &mut steps);
            }
            Move::Timeout(id) => feed(&mut p, Event::AlignmentTimeout { id }, &mut steps),
            Move::Abort(id) => feed(&mut p, Event::Abort { id }, &mut steps),
            Move::Trigger => {
                feed(&mut p, Event::Trigger { id: next_trigger }, &mut steps);
                next_trigger += 1;
            }
        }
        for i in 0..n {
            // Blocked-ness may only change through Block/Unblock actions.
            let last = &steps.last().expect("fed").actions;
            let blocked_now = p.is_blocked(i);
            let said_block = last.contains(&Action::Block { input: i });
            let said_unblock = last.contains(&Action::Unblock { input: i });
            if said_block {
                prop_assert!(blocked_now, "Block {{ {i} }} but not blocked");
            }
            if said_unblock {
                prop_assert!(!blocked_now, "Unblock {{ {i} }} but still blocked");
            }
        }
    }
    // Sources (and tasks whose regular inputs all ended) snapshot on
    // triggers; the coordinator triggers every id (stale ones are ignored).
    for id in 1..=case.m {
        feed(&mut p, Event::Trigger { id }, &mut steps);
    }
    Ok(steps)
}

fn check(case: &Case, steps: &[Step]) -> Result<(), TestCaseError> {
    use std::collections::BTreeMap;
    let n = case.kinds.len();
    let mut snap_at: BTreeMap<CheckpointId, usize> = BTreeMap::new();
    let mut complete_at: BTreeMap<CheckpointId, usize> = BTreeMap::new();
    let mut last_log: BTreeMap<CheckpointId, usize> = BTreeMap::new();
    // Per input, per popped record: (step index, ids it was logged for).
    let mut popped: Vec<Vec<(usize, Vec<CheckpointId>)>> = vec![Vec::new(); n];
    let mut any_log = false;
    let mut timed_out = false;
    let mut aborted = std::collections::BTreeSet::new();
    for (t, s) in steps.iter().enumerate() {
        if let Event::Abort { id } = s.event {
            aborted.insert(id);
        }
        for a in &s.actions {
            if let Action::Snapshot { id } | Action::Log { id, .. } | Action::Complete { id } = *a {
                prop_assert!(!aborted.contains(&id), "{:?} after Abort {}", a, id);
            }
        }
        if matches!(s.event, Event::AlignmentTimeout { .. }) && !s.actions.is_empty() {
            timed_out = true;
        }
        let is_record = matches!(s.event, Event::Record { .. });
        let delivers = s.actions.iter().filter(|a| **a == Action::Deliver).count();
        prop_assert_eq!(
            delivers,
            usize::from(is_record),
            "Deliver iff record: {:?}",
            s.event
        );
        if is_record {
            prop_assert_eq!(s.actions.last(), Some(&Action::Deliver));
        }
        let mut logged = Vec::new();
        for a in &s.actions {
            match *a {
                Action::Snapshot { id } => {
                    prop_assert!(snap_at.insert(id, t).is_none(), "Snapshot {} twice", id);
                }
                Action::Complete { id } => {
                    prop_assert!(snap_at.contains_key(&id), "Complete {} before Snapshot", id);
                    prop_assert!(complete_at.insert(id, t).is_none(), "Complete {} twice", id);
                }
                Action::Log { input, id } => {
                    any_log = true;
                    prop_assert_eq!(Some(input), record_input(s.event));
                    prop_assert!(snap_at.contains_key(&id), "Log {} before Snapshot", id);
                    prop_assert!(!complete_at.contains_key(&id), "Log {} after Complete", id);
                    prop_assert!(!logged.contains(&id), "two Logs for {}", id);
                    logged.push(id);
                    last_log.insert(id, t);
                }
                Action::Forward { id } => {
                    prop_assert_eq!(
                        snap_at.get(&id),
                        Some(&t),
                        "Forward {} without Snapshot",
                        id
                    );
                }
                Action::Deliver | Action::Block { .. } | Action::Unblock { .. } => {}
            }
        }
        if let Some(i) = record_input(s.event) {
            popped[i].push((t, logged));
        }
    }
    for id in (1..=case.m).filter(|id| !aborted.contains(id)) {
        prop_assert!(snap_at.contains_key(&id), "no Snapshot {}", id);
        prop_assert!(complete_at.contains_key(&id), "no Complete {}", id);
    }
    let aligned = matches!(
        case.kind,
        ProtocolKind::Aligned | ProtocolKind::Sync | ProtocolKind::SyncCapture
    ) || (case.kind == ProtocolKind::Unaligned && case.aligned_first && !timed_out);
    if aligned && !case.kinds.contains(&InputKind::BackEdge) {
        prop_assert!(!any_log, "aligned task without back-edges logged");
    }
    // The cut rule.
    for i in 0..n {
        let records: Vec<(usize, &Item)> = case.scripts[i]
            .iter()
            .enumerate()
            .filter(|(_, it)| matches!(it, Item::Rec(_)))
            .collect();
        prop_assert_eq!(records.len(), popped[i].len(), "input {} not drained", i);
        for ((at, _), (t, logged)) in records.iter().zip(&popped[i]) {
            for (&id, &ts) in snap_at.iter().filter(|(id, _)| !aborted.contains(*id)) {
                let ahead = !case.scripts[i][..*at].contains(&Item::Bar(id));
                let after = *t > ts;
                let is_logged = logged.contains(&id);
                if ahead {
                    prop_assert_eq!(
                        after,
                        is_logged,
                        "input {} record #{} ahead of barrier {}: after snapshot={} logged={}",
                        i,
                        at,
                        id,
                        after,
                        is_logged
                    );
                } else {
                    prop_assert!(
                        after && !is_logged,
                        "input {} record #{} behind barrier {}: after snapshot={} logged={}",
                        i,
                        at,
                        id,
                        after,
                        is_logged
                    );
                }
            }
        }
    }
    Ok(())
}

fn record_input(e: Event) -> Option<usize> {
    match e {
        Event::Record { input } => Some(input),
        _ => None,
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
        cases: cases(20_000),
        max_shrink_iters: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn protocols_take_consistent_cuts(case in case()) {
        let steps = run(&case)?;
        check(&case, &steps)?;
    }
}
