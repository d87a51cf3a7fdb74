//! Asynchronous Barrier Snapshotting with barrier alignment (Carbone et al.
//! 2015; Flink's exactly-once default), acyclic and cyclic.
//!
//! - Barrier `n` popped on a regular input: block that input (its data stays
//!   queued) until every regular input that has not ended delivered `n`.
//! - Then: snapshot, forward `n` on all outputs, unblock every input.
//! - Back-edges ([`InputKind::BackEdge`]) are not aligned on: after the
//!   snapshot, records arriving on each back-edge are logged until barrier
//!   `n` comes round the loop there; then the task's part is complete. With
//!   no back-edges the task completes right after its snapshot. A back-edge
//!   whose barrier `n` arrives *before* the snapshot (a cross edge that the
//!   graph walk classified as a back-edge) is blocked like a regular input,
//!   and has nothing to log.
//! - A task with no live regular inputs (a source, or an iteration head fed
//!   only by back-edges) snapshots on [`Event::Trigger`]. Tasks with regular
//!   inputs ignore triggers: their barriers come from upstream.
//! - [`Event::EndOfInput`] removes an input from alignment (and may complete
//!   a pending alignment or close a back-edge log).
//! - [`Event::Abort`] drops all state of the id and unblocks; late barriers
//!   of it (and of any older id) are ignored. A barrier newer than the one
//!   being aligned abandons the older alignment (it was aborted upstream).
//!
//! The stop-the-world baselines ([`super::ProtocolKind::Sync`],
//! [`super::ProtocolKind::SyncCapture`]) use this same machine at tasks: the
//! runtime pauses the sources from the trigger until the checkpoint is
//! durably committed (`Sync`) or captured (`SyncCapture`), so alignment
//! simply happens with drained channels.

use super::abs::{Core, Mode};
use super::{Action, CheckpointId, Event, InputId, InputKind, Protocol};

/// Per-task aligned-barrier machine.
#[derive(Clone, Debug)]
pub struct Aligned {
    core: Core,
}

impl Aligned {
    /// A task whose input `i` is of kind `inputs[i]`.
    pub fn new(inputs: &[InputKind]) -> Self {
        Aligned {
            core: Core::new(inputs, Mode::Aligned),
        }
    }
}

impl Protocol for Aligned {
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

    fn step(p: &mut Aligned, e: Event) -> Vec<Action> {
        let mut out = Vec::new();
        p.on_event(e, &mut out);
        out
    }

    #[test]
    fn blocks_until_all_regular_inputs_delivered_the_barrier() {
        let mut p = Aligned::new(&[Regular, Regular, Regular]);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 }),
            [Action::Block { input: 0 }]
        );
        assert!(p.is_blocked(0));
        assert_eq!(p.aligning(), Some(1));
        assert_eq!(step(&mut p, Event::Record { input: 1 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 2, id: 1 }),
            [Action::Block { input: 2 }]
        );
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 1 }),
            [
                Action::Snapshot { id: 1 },
                Action::Forward { id: 1 },
                Action::Unblock { input: 0 },
                Action::Unblock { input: 2 },
                Action::Complete { id: 1 }
            ]
        );
        assert!(!p.is_blocked(0) && !p.is_blocked(2));
        assert_eq!(p.aligning(), None);
        assert_eq!(step(&mut p, Event::Record { input: 0 }), [Action::Deliver]);
    }

    #[test]
    fn single_input_never_blocks() {
        let mut p = Aligned::new(&[Regular]);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 4 }),
            [
                Action::Snapshot { id: 4 },
                Action::Forward { id: 4 },
                Action::Complete { id: 4 }
            ]
        );
    }

    #[test]
    fn source_snapshots_on_trigger() {
        let mut p = Aligned::new(&[]);
        assert_eq!(
            step(&mut p, Event::Trigger { id: 1 }),
            [
                Action::Snapshot { id: 1 },
                Action::Forward { id: 1 },
                Action::Complete { id: 1 }
            ]
        );
        // The same id again is stale.
        assert!(step(&mut p, Event::Trigger { id: 1 }).is_empty());
    }

    #[test]
    fn task_with_regular_inputs_ignores_trigger() {
        let mut p = Aligned::new(&[Regular]);
        assert!(step(&mut p, Event::Trigger { id: 1 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 })[0],
            Action::Snapshot { id: 1 }
        );
    }

    #[test]
    fn back_edge_is_logged_after_snapshot_until_its_barrier() {
        let mut p = Aligned::new(&[Regular, BackEdge]);
        assert_eq!(step(&mut p, Event::Record { input: 1 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 }),
            [Action::Snapshot { id: 1 }, Action::Forward { id: 1 }]
        );
        assert_eq!(
            step(&mut p, Event::Record { input: 1 }),
            [Action::Log { input: 1, id: 1 }, Action::Deliver]
        );
        assert_eq!(step(&mut p, Event::Record { input: 0 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 1 }),
            [Action::Complete { id: 1 }]
        );
        assert_eq!(step(&mut p, Event::Record { input: 1 }), [Action::Deliver]);
    }

    #[test]
    fn back_edge_barrier_before_snapshot_blocks_and_is_not_logged() {
        let mut p = Aligned::new(&[Regular, BackEdge]);
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
    fn only_back_edges_snapshot_on_trigger_and_log() {
        let mut p = Aligned::new(&[BackEdge]);
        assert_eq!(
            step(&mut p, Event::Trigger { id: 2 }),
            [Action::Snapshot { id: 2 }, Action::Forward { id: 2 }]
        );
        assert_eq!(
            step(&mut p, Event::Record { input: 0 }),
            [Action::Log { input: 0, id: 2 }, Action::Deliver]
        );
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 2 }),
            [Action::Complete { id: 2 }]
        );
    }

    #[test]
    fn end_of_input_completes_a_pending_alignment() {
        let mut p = Aligned::new(&[Regular, Regular]);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert_eq!(
            step(&mut p, Event::EndOfInput { input: 1 }),
            [
                Action::Snapshot { id: 1 },
                Action::Forward { id: 1 },
                Action::Unblock { input: 0 },
                Action::Complete { id: 1 }
            ]
        );
        // Input 1 no longer takes part.
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 2 })[0],
            Action::Snapshot { id: 2 }
        );
    }

    #[test]
    fn end_of_back_edge_closes_its_log() {
        let mut p = Aligned::new(&[Regular, BackEdge]);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert_eq!(
            step(&mut p, Event::EndOfInput { input: 1 }),
            [Action::Complete { id: 1 }]
        );
    }

    #[test]
    fn abort_unblocks_and_ignores_late_barriers() {
        let mut p = Aligned::new(&[Regular, Regular]);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert_eq!(
            step(&mut p, Event::Abort { id: 1 }),
            [Action::Unblock { input: 0 }]
        );
        assert_eq!(p.aligning(), None);
        assert!(step(&mut p, Event::Barrier { input: 1, id: 1 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 2 }),
            [Action::Block { input: 1 }]
        );
    }

    #[test]
    fn abort_of_a_newer_id_does_not_make_older_barriers_stale() {
        let mut p = Aligned::new(&[Regular]);
        assert!(step(&mut p, Event::Abort { id: 3 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 2 })[0],
            Action::Snapshot { id: 2 }
        );
        // The aborted id stays ignored.
        assert!(step(&mut p, Event::Barrier { input: 0, id: 3 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 4 })[0],
            Action::Snapshot { id: 4 }
        );
    }

    #[test]
    fn newer_barrier_abandons_an_older_alignment() {
        let mut p = Aligned::new(&[Regular, Regular]);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 2 }),
            [Action::Unblock { input: 0 }, Action::Block { input: 1 }]
        );
        assert_eq!(p.aligning(), Some(2));
    }

    #[test]
    fn alignment_timeout_is_ignored_when_aligned_only() {
        let mut p = Aligned::new(&[Regular, Regular]);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert!(step(&mut p, Event::AlignmentTimeout { id: 1 }).is_empty());
        assert!(p.is_blocked(0));
    }
}
