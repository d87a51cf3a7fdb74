//! Per-task snapshot state machines: pure functions of events, no threads, no I/O.
//!
//! The threaded runtime ([`crate::runtime`]) and the deterministic simulator
//! ([`crate::sim`]) drive the *same* machines: a driver pops an item from an
//! input channel (or gets a trigger), turns it into an [`Event`], calls
//! [`Protocol::on_event`], and carries out the returned [`Action`]s in order.
//!
//! Events and actions are per channel *item* (a whole data batch), never per
//! record, so the cost of consulting the machine is amortised over a batch.
//!
//! Machines: [`ChandyLamport`] (markers, never blocks), [`Aligned`] (ABS,
//! acyclic and cyclic; also used for [`ProtocolKind::Sync`] and
//! [`ProtocolKind::SyncCapture`], whose difference — pausing the sources,
//! and for `Sync` until the checkpoint is durable — lives in the runtime), [`Unaligned`]
//! (optionally aligned first, switching on [`Event::AlignmentTimeout`]).
//! Build one per task with [`for_task`]. Every machine is exercised by the
//! property tests in `tests/proptest_protocol.rs` and driven over whole
//! graphs by [`crate::sim::dataflow`].

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

mod abs;
mod aligned;
mod chandy_lamport;
pub mod sequence;
mod unaligned;

pub use aligned::Aligned;
pub use chandy_lamport::ChandyLamport;
pub use unaligned::Unaligned;

/// Index of an input channel of a task, `0..n_inputs`.
pub type InputId = usize;
/// Identifier of one global snapshot (checkpoint, barrier or marker number).
pub type CheckpointId = u64;

/// Whether an input takes part in barrier alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// An ordinary (forward) edge: aligned on.
    Regular,
    /// A back-edge of a cycle: excluded from alignment; its records are logged
    /// after the snapshot until the barrier comes round the loop.
    BackEdge,
}

/// Something that happened at a task, fed to its protocol machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A data item was popped from `input`.
    Record { input: InputId },
    /// Barrier (or marker) `id` was popped from `input`.
    Barrier { input: InputId, id: CheckpointId },
    /// Barrier `id` was seen *queued* on `input`, behind data not yet popped.
    /// Unaligned checkpoints use it to overtake that data; other protocols
    /// may ignore it. The same barrier is later popped as [`Event::Barrier`].
    BarrierQueued { input: InputId, id: CheckpointId },
    /// Start snapshot `id` at this task (a source triggered by the
    /// coordinator, or a Chandy–Lamport initiator).
    Trigger { id: CheckpointId },
    /// Alignment of `id` has lasted longer than the alignment timeout
    /// (measured by the driver's clock): switch to unaligned.
    AlignmentTimeout { id: CheckpointId },
    /// `input` reached end of stream; it no longer holds up alignment.
    EndOfInput { input: InputId },
    /// The coordinator aborted checkpoint `id` (timeout, failure elsewhere).
    Abort { id: CheckpointId },
}

/// What the driver must do, in the order returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Process the record just popped (only in answer to [`Event::Record`]).
    Deliver,
    /// Append the record just popped to the in-flight log of snapshot `id` for
    /// `input` (channel state / back-edge log / overtaken data). Comes before
    /// [`Action::Deliver`] for the same record.
    Log { input: InputId, id: CheckpointId },
    /// Stop popping from `input` (its data stays queued: backpressure, no copy).
    Block { input: InputId },
    /// Resume popping from `input`.
    Unblock { input: InputId },
    /// Capture this task's state for snapshot `id` now, before any further record.
    Snapshot { id: CheckpointId },
    /// Emit barrier/marker `id` on every output channel, ahead of any further output.
    Forward { id: CheckpointId },
    /// This task's part of snapshot `id` is final: state taken and every
    /// in-flight log of `id` closed. The driver acknowledges to the coordinator.
    Complete { id: CheckpointId },
}

/// A per-task snapshot protocol.
pub trait Protocol: Send + fmt::Debug {
    /// Feeds one event; appends the actions to carry out, in order, to `actions`.
    fn on_event(&mut self, event: Event, actions: &mut Vec<Action>);
    /// Whether the driver must not pop from `input` right now.
    fn is_blocked(&self, input: InputId) -> bool;
    /// The checkpoint this task is aligning (some inputs blocked, waiting for
    /// the others), if any. The driver starts its alignment-timeout clock
    /// when this becomes `Some(id)` and sends [`Event::AlignmentTimeout`]
    /// when it runs out while still `Some(id)`.
    fn aligning(&self) -> Option<CheckpointId> {
        None
    }
}

/// The protocol machine for one task of a job running `kind`, whose input `i`
/// is of kind `inputs[i]`; `None` for [`ProtocolKind::None`].
///
/// - `Aligned`: [`Aligned`].
/// - `Unaligned`: [`Unaligned`], starting aligned if `aligned_first` (Flink's
///   aligned-checkpoint timeout > 0).
/// - `ChandyLamport`: [`ChandyLamport`] over all inputs (back-edges are
///   ordinary channels to it).
/// - `Sync` and `SyncCapture`: [`Aligned`] — the stop-the-world baselines
///   differ only in the runtime, which pauses the sources at the trigger
///   (so the barriers find drained channels) and resumes them after the
///   durable commit (`Sync`) or once every task has captured its state
///   (`SyncCapture`).
///
/// `aligned_first` only matters for `Unaligned`.
pub fn for_task(
    kind: ProtocolKind,
    inputs: &[InputKind],
    aligned_first: bool,
) -> Option<Box<dyn Protocol>> {
    match kind {
        ProtocolKind::Aligned | ProtocolKind::Sync | ProtocolKind::SyncCapture => {
            Some(Box::new(Aligned::new(inputs)))
        }
        ProtocolKind::Unaligned => Some(Box::new(Unaligned::new(inputs, aligned_first))),
        ProtocolKind::ChandyLamport => Some(Box::new(ChandyLamport::new(inputs.len()))),
        ProtocolKind::None => None,
    }
}

/// The snapshot protocol a job runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProtocolKind {
    /// ABS with barrier alignment (Flink's exactly-once default).
    Aligned,
    /// ABS with unaligned barriers (barriers overtake in-flight data).
    Unaligned,
    /// The Chandy–Lamport marker algorithm.
    ChandyLamport,
    /// Stop-the-world, the paper's synchronous baseline (Naiad): pause the
    /// sources, drain every channel, capture every task's *full* state and
    /// write it durably (files fsynced, manifest committed), and only then
    /// resume the sources.
    Sync,
    /// A lighter stop-the-world variant: pause the sources, drain, capture
    /// every task's state (incrementally, like ABS), and resume as soon as
    /// every task has handed its capture over; the store writes it in the
    /// background while the job runs again. Not the paper's baseline.
    SyncCapture,
    /// No checkpoints.
    None,
}

impl ProtocolKind {
    /// Every protocol, by its name as users spell it.
    pub const ALL: [ProtocolKind; 6] = [
        ProtocolKind::Aligned,
        ProtocolKind::Unaligned,
        ProtocolKind::ChandyLamport,
        ProtocolKind::Sync,
        ProtocolKind::SyncCapture,
        ProtocolKind::None,
    ];

    /// Whether checkpoints pause the sources (the stop-the-world protocols).
    pub fn pauses_sources(self) -> bool {
        matches!(self, ProtocolKind::Sync | ProtocolKind::SyncCapture)
    }

    /// Whether every checkpoint captures every task's whole state, never a
    /// diff (the synchronous baseline writes all state each time, as Naiad).
    pub fn full_state_every_time(self) -> bool {
        self == ProtocolKind::Sync
    }

    /// The name users write in configuration.
    pub fn name(self) -> &'static str {
        match self {
            ProtocolKind::Aligned => "aligned",
            ProtocolKind::Unaligned => "unaligned",
            ProtocolKind::ChandyLamport => "chandy-lamport",
            ProtocolKind::Sync => "sync",
            ProtocolKind::SyncCapture => "sync-capture",
            ProtocolKind::None => "none",
        }
    }
}

impl fmt::Display for ProtocolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProtocolKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        ProtocolKind::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<_> = ProtocolKind::ALL.iter().map(|p| p.name()).collect();
                Error::Config(format!(
                    "unknown protocol {s:?}; use one of: {}",
                    names.join(", ")
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names_round_trip() {
        for p in ProtocolKind::ALL {
            assert_eq!(p.name().parse::<ProtocolKind>().unwrap(), p);
        }
        assert_eq!(
            "Chandy_Lamport".parse::<ProtocolKind>().unwrap(),
            ProtocolKind::ChandyLamport
        );
    }

    #[test]
    fn factory_builds_each_protocol() {
        let inputs = [InputKind::Regular, InputKind::Regular];
        assert!(for_task(ProtocolKind::None, &inputs, false).is_none());
        for kind in [
            ProtocolKind::Aligned,
            ProtocolKind::Sync,
            ProtocolKind::SyncCapture,
        ] {
            let mut p = for_task(kind, &inputs, false).unwrap();
            let mut out = Vec::new();
            p.on_event(Event::Barrier { input: 0, id: 1 }, &mut out);
            assert_eq!(out, [Action::Block { input: 0 }], "{kind}");
            assert_eq!(p.aligning(), Some(1));
        }
        for kind in [ProtocolKind::Unaligned, ProtocolKind::ChandyLamport] {
            let mut p = for_task(kind, &inputs, false).unwrap();
            let mut out = Vec::new();
            p.on_event(Event::Barrier { input: 0, id: 1 }, &mut out);
            assert_eq!(
                out,
                [Action::Snapshot { id: 1 }, Action::Forward { id: 1 }],
                "{kind}"
            );
            assert!(!p.is_blocked(0));
            assert_eq!(p.aligning(), None);
        }
        let mut p = for_task(ProtocolKind::Unaligned, &inputs, true).unwrap();
        let mut out = Vec::new();
        p.on_event(Event::Barrier { input: 0, id: 1 }, &mut out);
        assert_eq!(out, [Action::Block { input: 0 }]);
    }

    #[test]
    fn unknown_protocol_names_the_choices() {
        let err = "abs".parse::<ProtocolKind>().unwrap_err().to_string();
        assert!(err.contains("unknown protocol \"abs\""), "{err}");
        assert!(err.contains("chandy-lamport"), "{err}");
    }
}
