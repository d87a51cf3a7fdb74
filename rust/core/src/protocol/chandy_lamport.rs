//! The Chandy–Lamport marker algorithm (1985), rule for rule.
//!
//! - Initiator ([`Event::Trigger`]): record state, send a marker on every
//!   output before any further message, record every input.
//! - First marker `n` on input `c`: record state, record `c` as empty, send
//!   markers, record every other input.
//! - Later marker `n` on `c`: `c`'s state is what was recorded on it since the
//!   snapshot; stop recording `c`.
//! - Done for `n` when a marker `n` came in on every input.
//!
//! Never blocks an input. Several snapshots (distinct ids, from different
//! initiators, in any order) may be in flight at once. Ids are not assumed to
//! arrive in increasing order, so unlike ABS there is no stale-id watermark.

use std::collections::{BTreeMap, BTreeSet};

use super::{Action, CheckpointId, Event, InputId, Protocol};

/// Per-process Chandy–Lamport machine.
#[derive(Clone, Debug)]
pub struct ChandyLamport {
    ended: Vec<bool>,
    /// Snapshots recorded here whose markers have not all arrived:
    /// `true` = input still being recorded (its marker not yet received).
    recording: BTreeMap<CheckpointId, Vec<bool>>,
    /// Finished or aborted ids: a late trigger or marker of one must not
    /// restart it. Only the most recent [`REMEMBERED`] are kept.
    closed: BTreeSet<CheckpointId>,
}

/// How many finished ids a process remembers (older ones never come back).
const REMEMBERED: usize = 4096;

impl ChandyLamport {
    /// A process with `n_inputs` incoming channels.
    pub fn new(n_inputs: usize) -> Self {
        ChandyLamport {
            ended: vec![false; n_inputs],
            recording: BTreeMap::new(),
            closed: BTreeSet::new(),
        }
    }

    /// Snapshot ids recorded here and still waiting for markers.
    pub fn in_flight(&self) -> impl Iterator<Item = CheckpointId> + '_ {
        self.recording.keys().copied()
    }

    fn close(&mut self, id: CheckpointId) {
        self.closed.insert(id);
        if self.closed.len() > REMEMBERED {
            self.closed.pop_first();
        }
    }

    fn record(&mut self, id: CheckpointId, marker_on: Option<InputId>, out: &mut Vec<Action>) {
        out.push(Action::Snapshot { id });
        out.push(Action::Forward { id });
        let logging: Vec<bool> = (0..self.ended.len())
            .map(|i| Some(i) != marker_on && !self.ended[i])
            .collect();
        if logging.iter().any(|&l| l) {
            self.recording.insert(id, logging);
        } else {
            self.close(id);
            out.push(Action::Complete { id });
        }
    }

    fn stop_recording(&mut self, id: CheckpointId, input: InputId, out: &mut Vec<Action>) {
        let Some(logging) = self.recording.get_mut(&id) else {
            return;
        };
        logging[input] = false;
        if logging.iter().all(|&l| !l) {
            self.recording.remove(&id);
            self.close(id);
            out.push(Action::Complete { id });
        }
    }
}

impl Protocol for ChandyLamport {
    fn on_event(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::Record { input } => {
                for (&id, logging) in &self.recording {
                    if logging[input] {
                        out.push(Action::Log { input, id });
                    }
                }
                out.push(Action::Deliver);
            }
            Event::Barrier { input, id } => {
                if self.closed.contains(&id) {
                    return;
                }
                if self.recording.contains_key(&id) {
                    self.stop_recording(id, input, out);
                } else {
                    self.record(id, Some(input), out);
                }
            }
            Event::Trigger { id } => {
                if !self.closed.contains(&id) && !self.recording.contains_key(&id) {
                    self.record(id, None, out);
                }
            }
            Event::EndOfInput { input } => {
                if !self.ended[input] {
                    self.ended[input] = true;
                    let ids: Vec<CheckpointId> = self.recording.keys().copied().collect();
                    for id in ids {
                        self.stop_recording(id, input, out);
                    }
                }
            }
            Event::Abort { id } => {
                self.recording.remove(&id);
                self.close(id);
            }
            // Markers are handled when popped; there is no alignment to time out.
            Event::BarrierQueued { .. } | Event::AlignmentTimeout { .. } => {}
        }
    }

    fn is_blocked(&self, _input: InputId) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(p: &mut ChandyLamport, e: Event) -> Vec<Action> {
        let mut out = Vec::new();
        p.on_event(e, &mut out);
        out
    }

    #[test]
    fn initiator_records_forwards_and_records_every_input() {
        let mut p = ChandyLamport::new(2);
        assert_eq!(
            step(&mut p, Event::Trigger { id: 1 }),
            [Action::Snapshot { id: 1 }, Action::Forward { id: 1 }]
        );
        assert_eq!(
            step(&mut p, Event::Record { input: 1 }),
            [Action::Log { input: 1, id: 1 }, Action::Deliver]
        );
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 1 }),
            Vec::<Action>::new()
        );
        assert_eq!(step(&mut p, Event::Record { input: 0 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 1 }),
            [Action::Complete { id: 1 }]
        );
        assert_eq!(step(&mut p, Event::Record { input: 1 }), [Action::Deliver]);
    }

    #[test]
    fn first_marker_records_its_channel_as_empty() {
        let mut p = ChandyLamport::new(3);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 1, id: 7 }),
            [Action::Snapshot { id: 7 }, Action::Forward { id: 7 }]
        );
        assert_eq!(step(&mut p, Event::Record { input: 1 }), [Action::Deliver]);
        assert_eq!(
            step(&mut p, Event::Record { input: 2 }),
            [Action::Log { input: 2, id: 7 }, Action::Deliver]
        );
        assert!(step(&mut p, Event::Barrier { input: 0, id: 7 }).is_empty());
        assert_eq!(
            step(&mut p, Event::Barrier { input: 2, id: 7 }),
            [Action::Complete { id: 7 }]
        );
        assert!(!p.is_blocked(0) && !p.is_blocked(1) && !p.is_blocked(2));
    }

    #[test]
    fn concurrent_snapshots_log_once_per_recording_id() {
        let mut p = ChandyLamport::new(2);
        step(&mut p, Event::Barrier { input: 0, id: 5 });
        step(&mut p, Event::Trigger { id: 3 });
        assert_eq!(
            step(&mut p, Event::Record { input: 0 }),
            [Action::Log { input: 0, id: 3 }, Action::Deliver]
        );
        assert_eq!(
            step(&mut p, Event::Record { input: 1 }),
            [
                Action::Log { input: 1, id: 3 },
                Action::Log { input: 1, id: 5 },
                Action::Deliver
            ]
        );
        assert_eq!(p.in_flight().collect::<Vec<_>>(), [3, 5]);
    }

    #[test]
    fn process_without_inputs_completes_at_once() {
        let mut p = ChandyLamport::new(0);
        assert_eq!(
            step(&mut p, Event::Trigger { id: 1 }),
            [
                Action::Snapshot { id: 1 },
                Action::Forward { id: 1 },
                Action::Complete { id: 1 }
            ]
        );
        // A finished id is not restarted.
        assert!(step(&mut p, Event::Trigger { id: 1 }).is_empty());
    }

    #[test]
    fn single_input_process_completes_on_its_marker() {
        let mut p = ChandyLamport::new(1);
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 2 }),
            [
                Action::Snapshot { id: 2 },
                Action::Forward { id: 2 },
                Action::Complete { id: 2 }
            ]
        );
    }

    #[test]
    fn end_of_input_closes_its_recording() {
        let mut p = ChandyLamport::new(2);
        step(&mut p, Event::Barrier { input: 0, id: 1 });
        assert_eq!(
            step(&mut p, Event::EndOfInput { input: 1 }),
            [Action::Complete { id: 1 }]
        );
        // A later snapshot does not wait for the ended input.
        assert_eq!(
            step(&mut p, Event::Barrier { input: 0, id: 2 }),
            [
                Action::Snapshot { id: 2 },
                Action::Forward { id: 2 },
                Action::Complete { id: 2 }
            ]
        );
    }

    #[test]
    fn abort_drops_state_and_ignores_late_markers() {
        let mut p = ChandyLamport::new(2);
        step(&mut p, Event::Trigger { id: 1 });
        step(&mut p, Event::Abort { id: 1 });
        assert_eq!(step(&mut p, Event::Record { input: 0 }), [Action::Deliver]);
        assert!(step(&mut p, Event::Barrier { input: 0, id: 1 }).is_empty());
        assert!(step(&mut p, Event::Trigger { id: 1 }).is_empty());
    }
}
