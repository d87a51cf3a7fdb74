//! Unaligned checkpoints (Flink 1.11+), optionally starting aligned.
//!
//! - The first barrier `n` a task sees — popped, or seen queued behind data
//!   ([`Event::BarrierQueued`]) — makes it snapshot and forward `n` at once.
//! - From then on every input that has not popped barrier `n` is logged until
//!   it does: on the input where `n` was only seen queued, the data ahead of
//!   it is the in-flight data the barrier overtook. Complete when every log
//!   is closed (or its input ended).
//! - Back-edges need no special case: nothing waits for them.
//! - With `aligned_first` the task behaves as [`super::Aligned`] until
//!   [`Event::AlignmentTimeout`] for the id being aligned arrives (the
//!   alignment, and so [`Protocol::aligning`], starts at the first barrier
//!   popped *or seen queued*, so backpressure cannot delay the switch); then it
//!   snapshots and forwards at once, unblocks everything, and logs only the
//!   inputs still awaiting barrier `n` (blocked inputs already delivered it:
//!   they have nothing in flight to persist).
//! - A task (any task) snapshots on [`Event::Trigger`] when fully unaligned;
//!   with `aligned_first` only tasks without live regular inputs do.

use super::abs::{Core, Mode};
use super::{Action, CheckpointId, Event, InputId, InputKind, Protocol};

/// Per-task unaligned-barrier machine.
#[derive(Clone, Debug)]
pub struct Unaligned {
    core: Core,
}

impl Unaligned {
    /// A task whose input `i` is of kind `inputs[i]`; `aligned_first` starts
    /// every checkpoint aligned until the driver reports an alignment timeout.
    pub fn new(inputs: &[InputKind], aligned_first: bool) -> Self {
        let mode = if aligned_first {
            Mode::AlignedThenUnaligned
        } else {
            Mode::Unaligned
        };
        Unaligned {
            core: Core::new(inputs, mode),
        }
    }
}

impl Protocol for Unaligned {
    fn on_event(&mut self, event: Event, actions: &mut Vec<Action>) {
        self.core.on_event(event, actions);
    }

    fn is_blocked(&self, input: InputId) -> bool {
        self.core.is_blocked(input)
    }

    fn aligning(&self) -> Option<CheckpointId> {
        self.core.aligning()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InputKind::{BackEdge, Regular};

    fn step(p: &mut Unaligned, e: Event) -> Vec<Action> {
        let mut out = Vec::new();
        p.on_event(e, &mut out);
        out
    }

    #[test]
    fn first_popped_barrier_snapshots_and_logs_the_other_inputs() {
        let mut p = Unaligned::new(&[Regular, Regular, BackEdge], false);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 1 }),
            [Action::Snapshot { id: 1 }, Action::Forward { id: 1 }]
        );
        assert!(!p.is_blocked(1));
        assert_eq!(p.aligning(), None);
        assert_eq!(step(&mut p, Event::Record { input: 1 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::Record { input: 0 }),
            [Action::Log { input: 0, id: 1 }, Action::Deliver]
        );
        assert!(step(&mut p, Event::Barrier { input: 0, id: 1 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Record { input: 2 }),
            [Action::Log { input: 2, id: 1 }, Action::Deliver]
        );
        assert_eq!(
            step(&mut p, Event::Barrier { input: 2, id: 1 }),
            [Action::Complete { id: 1 }]
        );
    }

    #[test]
    fn queued_barrier_overtakes_the_data_ahead_of_it() {
        let mut p = Unaligned::new(&[Regular, Regular], false);
        assert_eq!(
            step(&mut p, Event::BarrierQueued { input: 0, id: 3 }),
            [Action::Snapshot { id: 3 }, Action::Forward { id: 3 }]
        );
        // The data ahead of the barrier on input 0 is logged too.
        assert_eq!(
            step(&mut p, Event::Record { input: 0 }),
            [Action::Log { input: 0, id: 3 }, Action::Deliver]
        );
        assert!(step(&mut p, Event::Barrier { input: 0, id: 3 }).is_empty());
        assert_eq!(step(&mut p, Event::Record { input: 0 }), [Action::Deliver]);
        // Seeing another queued copy changes nothing.
        assert!(step(&mut p, Event::BarrierQueued { input: 1, id: 3 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 3 }),
            [Action::Complete { id: 3 }]
        );
    }

    #[test]
    fn concurrent_checkpoints_log_per_id() {
        let mut p = Unaligned::new(&[Regular, Regular], false);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        step(&mut p, Event::Barrier { input: 0, id: 2 });
        assert_eq!(
            step(&mut p, Event::Record { input: 1 }),
            [
                Action::Log { input: 1, id: 1 },
                Action::Log { input: 1, id: 2 },
                Action::Deliver
            ]
        );
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 1 }),
            [Action::Complete { id: 1 }]
        );
        assert_eq!(
            step(&mut p, Event::Record { input: 1 }),
            [Action::Log { input: 1, id: 2 }, Action::Deliver]
        );
    }

    #[test]
    fn any_task_snapshots_on_trigger() {
        let mut p = Unaligned::new(&[Regular], false);
        assert_eq!(
            step(&mut p, Event::Trigger { id: 1 }),
            [Action::Snapshot { id: 1 }, Action::Forward { id: 1 }]
        );
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 }),
            [Action::Complete { id: 1 }]
        );
    }

    #[test]
    fn aligned_first_blocks_then_switches_on_timeout() {
        let mut p = Unaligned::new(&[Regular, Regular, Regular], true);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 }),
            [Action::Block { input: 0 }]
        );
        // Queued barriers do not short-cut alignment.
        assert!(step(&mut p, Event::BarrierQueued { input: 1, id: 1 }).is_empty());
        assert_eq!(p.aligning(), Some(1));
        // A timeout for another id is ignored.
        assert!(step(&mut p, Event::AlignmentTimeout { id: 9 }).is_empty());
        assert_eq!(
            step(&mut p, Event::AlignmentTimeout { id: 1 }),
            [
                Action::Snapshot { id: 1 },
                Action::Forward { id: 1 },
                Action::Unblock { input: 0 }
            ]
        );
        assert_eq!(p.aligning(), None);
        // Input 0 delivered its barrier: nothing to log there.
        assert_eq!(step(&mut p, Event::Record { input: 0 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::Record { input: 1 }),
            [Action::Log { input: 1, id: 1 }, Action::Deliver]
        );
        assert!(step(&mut p, Event::Barrier { input: 1, id: 1 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 2, id: 1 }),
            [Action::Complete { id: 1 }]
        );
    }

    #[test]
    fn aligned_first_starts_aligning_when_a_barrier_is_seen_queued() {
        let mut p = Unaligned::new(&[Regular, Regular], true);
        assert!(step(&mut p, Event::BarrierQueued { input: 0, id: 1 }).is_empty());
        assert_eq!(p.aligning(), Some(1));
        assert!(!p.is_blocked(0));
        // Data ahead of the barrier is still delivered before the snapshot.
        assert_eq!(step(&mut p, Event::Record { input: 0 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::AlignmentTimeout { id: 1 }),
            [Action::Snapshot { id: 1 }, Action::Forward { id: 1 }]
        );
        // Both inputs still hold data ahead of barrier 1: overtaken, logged.
        assert_eq!(
            step(&mut p, Event::Record { input: 0 }),
            [Action::Log { input: 0, id: 1 }, Action::Deliver]
        );
        assert!(step(&mut p, Event::Barrier { input: 0, id: 1 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 1 }),
            [Action::Complete { id: 1 }]
        );
    }

    #[test]
    fn aligned_first_queued_then_popped_aligns_normally() {
        let mut p = Unaligned::new(&[Regular, Regular], true);
        step(&mut p, Event::BarrierQueued { input: 1, id: 1 });
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 1 }),
            [Action::Block { input: 1 }]
        );
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 }),
            [
                Action::Snapshot { id: 1 },
                Action::Forward { id: 1 },
                Action::Unblock { input: 1 },
                Action::Complete { id: 1 }
            ]
        );
    }

    #[test]
    fn aligned_first_without_timeout_is_aligned() {
        let mut p = Unaligned::new(&[Regular, Regular], true);
        step(&mut p, Event::Barrier { input: 1, id: 1 });
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 }),
            [
                Action::Snapshot { id: 1 },
                Action::Forward { id: 1 },
                Action::Unblock { input: 1 },
                Action::Complete { id: 1 }
            ]
        );
        // A late timeout changes nothing.
        assert!(step(&mut p, Event::AlignmentTimeout { id: 1 }).is_empty());
    }

    #[test]
    fn end_of_input_closes_logs() {
        let mut p = Unaligned::new(&[Regular, Regular], false);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert_eq!(
            step(&mut p, Event::EndOfInput { input: 1 }),
            [Action::Complete { id: 1 }]
        );
    }

    #[test]
    fn abort_drops_logs_and_late_barriers() {
        let mut p = Unaligned::new(&[Regular, Regular], false);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert!(step(&mut p, Event::Abort { id: 1 }).is_empty());
        assert_eq!(step(&mut p, Event::Record { input: 1 }), [Action::Deliver]);
        assert!(step(&mut p, Event::Barrier { input: 1, id: 1 }).is_empty());
    }
}
