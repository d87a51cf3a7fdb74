//! The set of state slots written since the last capture, kept as a bitset
//! plus the list of its members in the order they joined.
//!
//! Marking runs once per input row of a keyed operator, so it is on the hot
//! path whether checkpoints are on or not. A bitset of 100k slots is 12 KiB
//! and stays in L1 where a `Vec<bool>` of the same slots (100 KiB) does not;
//! and once every slot is in the set (a hot key space after the first part
//! of an interval, or every interval when checkpoints are off) a batch costs
//! one comparison instead of one lookup per row.
//!
//! When every slot was written in an interval, the capture closing it is
//! full. When that happens twice in a row (once proves little: in the first
//! interval every key is new), the key space is hot and the next capture
//! will most likely be full too. The set then stops tracking for the next
//! interval(s) and reports "every slot" (their captures are full, as
//! tracking would have found), and tries tracking again after 1, 2, 4, then
//! at most [`MAX_UNTRACKED`] intervals while it keeps finding every slot
//! written. (Three-shuffle, 100k keys, every 100 ms: the bitset alone took
//! 2 % of the job's CPU samples.) A key space that cools down costs at most
//! that many full captures that diffs could have replaced.

/// Most intervals in a row left untracked.
pub(crate) const MAX_UNTRACKED: u32 = 8;

/// Slots `0..capacity` of which some are dirty.
#[derive(Debug, Default)]
pub(crate) struct DirtySlots {
    bits: Vec<u64>,
    members: Vec<u32>,
    /// Untracked intervals left, this one included (0: this one is
    /// tracked); an untracked interval counts every slot as written.
    untracked_left: u32,
    /// Length of the last run of untracked intervals.
    backoff: u32,
    /// Tracked intervals in a row that covered every slot.
    covered_streak: u32,
}

impl DirtySlots {
    /// Adds `slots` (each below `capacity`, the operator's number of slots).
    pub(crate) fn mark(&mut self, slots: &[u32], capacity: usize) {
        if self.untracked() || self.members.len() >= capacity {
            // Every slot below `capacity` is already a member.
            return;
        }
        let words = capacity.div_ceil(64);
        if self.bits.len() < words {
            self.bits.resize(words, 0);
        }
        for &s in slots {
            let (w, bit) = ((s >> 6) as usize, 1u64 << (s & 63));
            let word = &mut self.bits[w];
            if *word & bit == 0 {
                *word |= bit;
                self.members.push(s);
            }
        }
    }

    fn untracked(&self) -> bool {
        self.untracked_left > 0
    }

    /// Whether every slot below `capacity` counts as written.
    pub(crate) fn covers_all(&self, capacity: usize) -> bool {
        self.untracked() || (capacity > 0 && self.members.len() == capacity)
    }

    /// Members in the order they were first marked (empty while untracked).
    pub(crate) fn members(&self) -> &[u32] {
        &self.members
    }

    /// Closes the interval: empties the set in O(members) and returns its
    /// members, or `None` if it covered every slot; then decides whether
    /// the next interval is tracked.
    pub(crate) fn take(&mut self, capacity: usize) -> Option<Vec<u32>> {
        let all = self.covers_all(capacity);
        for &s in &self.members {
            self.bits[(s >> 6) as usize] = 0;
        }
        let members = std::mem::take(&mut self.members);
        if self.untracked() {
            self.untracked_left -= 1;
        } else if all {
            self.covered_streak += 1;
            if self.covered_streak >= 2 {
                self.backoff = (self.backoff * 2).clamp(1, MAX_UNTRACKED);
                self.untracked_left = self.backoff;
            }
        } else {
            self.covered_streak = 0;
            self.backoff = 0;
        }
        (!all).then_some(members)
    }

    /// Empties the set, tracks from now on, and sizes it for `capacity` slots.
    pub(crate) fn reset(&mut self, capacity: usize) {
        *self = Self::default();
        self.bits.resize(capacity.div_ceil(64), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::{DirtySlots, MAX_UNTRACKED};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// Against a `BTreeSet`: a tracked interval's members are exactly
        /// the marked slots, each once, in first-marked order; an interval
        /// is reported as covering every slot only if every slot was
        /// written in it, or it was left untracked, which only follows an
        /// interval that covered every slot.
        #[test]
        fn behaves_like_a_set(rounds in prop::collection::vec(
            prop::collection::vec(prop::collection::vec(0u32..64, 0..80), 0..6), 1..12
        )) {
            let mut dirty = DirtySlots::default();
            let mut capacity = 0usize;
            let mut previous_covered = false;
            for round in rounds {
                let mut model = BTreeSet::new();
                let mut order = Vec::new();
                for batch in round {
                    capacity = capacity.max(batch.iter().map(|&s| s as usize + 1).max().unwrap_or(0));
                    dirty.mark(&batch, capacity);
                    for s in batch {
                        if model.insert(s) {
                            order.push(s);
                        }
                    }
                }
                let full = capacity > 0 && model.len() == capacity;
                let untracked = dirty.untracked();
                prop_assert!(!untracked || previous_covered);
                let taken = dirty.take(capacity);
                match &taken {
                    Some(members) => {
                        prop_assert!(!full && !untracked);
                        prop_assert_eq!(members, &order);
                    }
                    None => prop_assert!(full || untracked),
                }
                previous_covered = taken.is_none();
            }
        }
    }

    #[test]
    fn a_full_set_ignores_marks_until_taken() {
        let mut dirty = DirtySlots::default();
        dirty.mark(&[1, 0, 1], 2);
        assert_eq!(dirty.members(), &[1, 0]);
        dirty.mark(&[0, 1, 1], 2);
        assert!(dirty.covers_all(2));
        // New slots grow the capacity, so marking resumes.
        dirty.mark(&[3], 4);
        assert!(!dirty.covers_all(4));
        assert_eq!(dirty.take(4), Some(vec![1, 0, 3]));
        dirty.mark(&[2, 2], 4);
        assert_eq!(dirty.members(), &[2]);
        assert_eq!(dirty.take(4), Some(vec![2]));
    }

    /// A hot key space: after two intervals that wrote every slot, 1, 2, 4,
    /// then 8 intervals are left untracked (covering every slot) between
    /// tracked ones; one tracked interval that is not full ends that.
    #[test]
    fn a_hot_key_space_is_tracked_ever_more_rarely() {
        let mut dirty = DirtySlots::default();
        let mut tracked = Vec::new();
        for _ in 0..40 {
            dirty.mark(&[0, 1], 2);
            tracked.push(!dirty.members().is_empty());
            assert_eq!(dirty.take(2), None);
        }
        let gaps: Vec<usize> = tracked
            .split(|&t| t)
            .skip(1)
            .map(|untracked| untracked.len())
            .collect();
        assert_eq!(&gaps[..6], &[0, 1, 2, 4, 8, 8]);
        assert!(gaps.iter().all(|&g| g <= MAX_UNTRACKED as usize));
        // Cooling down: the next tracked interval writes one slot.
        while dirty.untracked() {
            assert_eq!(dirty.take(2), None);
        }
        dirty.mark(&[1], 2);
        assert_eq!(dirty.take(2), Some(vec![1]));
        dirty.mark(&[0], 2);
        assert_eq!(dirty.take(2), Some(vec![0]));
        dirty.reset(2);
        assert!(!dirty.covers_all(2));
    }
}
