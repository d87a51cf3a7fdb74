//! The set of state slots written since the last capture, kept as a bitset
//! and a count of its members.
//!
//! Marking runs once per input row of a keyed operator, so it is on the hot
//! path whether checkpoints are on or not. A bitset of 100k slots is 12 KiB
//! and stays in L1 where a `Vec<bool>` of the same slots (100 KiB) does not;
//! a row costs a test-and-set with no branch (a list of members in the order
//! they joined cost a push behind a branch that mispredicts while the set
//! fills), and once every slot is in the set (a hot key space after the first
//! part of an interval, or every interval when checkpoints are off) a batch
//! costs one comparison instead of one lookup per row. Members come out of
//! the bits in ascending order, the order a diff lists its keys in, so a
//! capture needs no sort (three-shuffle, 100k keys, every 100 ms: the list's
//! pushes and the capture's sort took about 4 % of the tasks' CPU samples).
//!
//! When every slot was written in an interval, the capture closing it is
//! full. When that happens twice in a row (once proves little: in the first
//! interval every key is new), the key space is hot and the next capture
//! will most likely be full too. The same holds within an interval: once
//! half the slots (of a table of at least [`FULL_BEATS_DIFF_MIN_KEYS`]) are
//! members, the capture closing it is full ([`full_beats_diff`]), so the
//! set makes every slot a member and stops marking until the interval ends
//! (a superset of what changed, which any diff or full built from it may
//! list). With random keys, reaching half of n slots takes ~0.7 n rows and
//! reaching all of them ~n ln n (three-shuffle, 1M keys, aligned every 1 s:
//! marking took 1.8 % of the job's CPU samples, tracking every row until
//! the last key of the interval came).
//!
//! The set then stops tracking for the next
//! interval(s) and reports "every slot" (their captures are full, as
//! tracking would have found), and tries tracking again after 1, 2, 4, then
//! at most [`MAX_UNTRACKED`] intervals while it keeps finding every slot
//! written. (Three-shuffle, 100k keys, every 100 ms: the bitset alone took
//! 2 % of the job's CPU samples.) A key space that cools down costs at most
//! that many full captures that diffs could have replaced.

use crate::snapshot::full_beats_diff;
#[cfg(doc)]
use crate::snapshot::FULL_BEATS_DIFF_MIN_KEYS;

/// Most intervals in a row left untracked.
pub(crate) const MAX_UNTRACKED: u32 = 8;

/// Slots `0..capacity` of which some are dirty.
#[derive(Debug, Default)]
pub(crate) struct DirtySlots {
    bits: Vec<u64>,
    /// How many bits are set.
    members: usize,
    /// Untracked intervals left, this one included (0: this one is
    /// tracked); an untracked interval counts every slot as written.
    untracked_left: u32,
    /// Length of the last run of untracked intervals.
    backoff: u32,
    /// Tracked intervals in a row that covered every slot.
    covered_streak: u32,
    /// Every slot below this is a member (0 unless [`Self::mark_all`] ran
    /// in this interval): a later `mark_all` sets only the bits above.
    all_below: usize,
}

impl DirtySlots {
    /// Adds `slots` (each below `capacity`, the operator's number of slots).
    pub(crate) fn mark(&mut self, slots: &[u32], capacity: usize) {
        if self.untracked() || self.members >= capacity {
            // Every slot below `capacity` is already a member.
            return;
        }
        let words = capacity.div_ceil(64);
        if self.bits.len() < words {
            self.bits.resize(words, 0);
        }
        let mut added = 0;
        for &s in slots {
            let (w, bit) = ((s >> 6) as usize, 1u64 << (s & 63));
            let word = &mut self.bits[w];
            added += usize::from(*word & bit == 0);
            *word |= bit;
        }
        self.members += added;
        if full_beats_diff(self.members, capacity) {
            self.mark_all(capacity);
        }
    }

    /// Makes every slot below `capacity` a member, without listing them.
    pub(crate) fn mark_all(&mut self, capacity: usize) {
        if self.untracked() || self.members >= capacity {
            return;
        }
        let words = capacity.div_ceil(64);
        if self.bits.len() < words {
            self.bits.resize(words, 0);
        }
        // Slots at or above `capacity` are never marked: their bits stay 0.
        self.bits[self.all_below / 64..words].fill(u64::MAX);
        if capacity % 64 != 0 {
            self.bits[words - 1] = (1u64 << (capacity % 64)) - 1;
        }
        self.members = capacity;
        self.all_below = capacity;
    }

    fn untracked(&self) -> bool {
        self.untracked_left > 0
    }

    /// How many slots were marked (meaningless while untracked: see
    /// [`Self::covers_all`]).
    pub(crate) fn len(&self) -> usize {
        self.members
    }

    /// Whether every slot below `capacity` counts as written.
    pub(crate) fn covers_all(&self, capacity: usize) -> bool {
        self.untracked() || (capacity > 0 && self.members == capacity)
    }

    /// The members together with `earlier` sets of slots (each below
    /// `capacity`), ascending and each once.
    pub(crate) fn union<'a>(
        &self,
        earlier: impl IntoIterator<Item = &'a [u32]>,
        capacity: usize,
    ) -> Vec<u32> {
        let mut bits = self.bits.clone();
        bits.resize(bits.len().max(capacity.div_ceil(64)), 0);
        for slots in earlier {
            for &s in slots {
                bits[(s >> 6) as usize] |= 1u64 << (s & 63);
            }
        }
        ones(&bits).collect()
    }

    /// Closes the interval: empties the set and returns its members in
    /// ascending order, or `None` if it covered every slot; then decides
    /// whether the next interval is tracked.
    pub(crate) fn take(&mut self, capacity: usize) -> Option<Vec<u32>> {
        let all = self.covers_all(capacity);
        let members = (!all).then(|| ones(&self.bits).collect());
        self.bits.fill(0);
        self.members = 0;
        self.all_below = 0;
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
        members
    }

    /// Empties the set, tracks from now on, and sizes it for `capacity` slots.
    pub(crate) fn reset(&mut self, capacity: usize) {
        *self = Self::default();
        self.bits.resize(capacity.div_ceil(64), 0);
    }
}

/// The positions of the set bits, ascending.
fn ones(bits: &[u64]) -> impl Iterator<Item = u32> + '_ {
    bits.iter().enumerate().flat_map(|(i, &word)| {
        let base = (i as u32) << 6;
        let mut rest = word;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let bit = rest.trailing_zeros();
                rest &= rest - 1;
                base + bit
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{DirtySlots, MAX_UNTRACKED};
    use crate::snapshot::FULL_BEATS_DIFF_MIN_KEYS;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// Against a `BTreeSet`: a tracked interval's members are exactly
        /// the marked slots, each once, in ascending order; an interval
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
                for batch in round {
                    capacity = capacity.max(batch.iter().map(|&s| s as usize + 1).max().unwrap_or(0));
                    dirty.mark(&batch, capacity);
                    model.extend(batch);
                }
                let full = capacity > 0 && model.len() == capacity;
                let untracked = dirty.untracked();
                prop_assert!(!untracked || previous_covered);
                let taken = dirty.take(capacity);
                match &taken {
                    Some(members) => {
                        prop_assert!(!full && !untracked);
                        prop_assert_eq!(members, &model.iter().copied().collect::<Vec<_>>());
                    }
                    None => prop_assert!(full || untracked),
                }
                previous_covered = taken.is_none();
            }
        }
    }

    proptest! {
        /// Tables of 1-3k slots, growing: a tracked interval's members
        /// hold every marked slot, and exactly those unless half of a
        /// large table's slots were written at some point in it; an
        /// interval reported as covering every slot wrote every slot, was
        /// untracked, or wrote half of a large table's.
        #[test]
        fn a_large_table_is_a_superset_once_half_is_written(rounds in prop::collection::vec(
            prop::collection::vec((prop::collection::vec(0u32..3000, 0..400), 1usize..3000), 0..6),
            1..8
        )) {
            let mut dirty = DirtySlots::default();
            let mut capacity = 0usize;
            for round in rounds {
                let mut model = BTreeSet::new();
                let mut half = false;
                for (batch, grow) in round {
                    capacity = capacity.max(grow);
                    let batch: Vec<u32> = batch.into_iter().filter(|&s| (s as usize) < capacity).collect();
                    dirty.mark(&batch, capacity);
                    model.extend(batch);
                    half |= capacity >= FULL_BEATS_DIFF_MIN_KEYS && 2 * model.len() >= capacity;
                }
                let full = capacity > 0 && model.len() == capacity;
                let untracked = dirty.untracked();
                match dirty.take(capacity) {
                    Some(members) => {
                        prop_assert!(!full && !untracked);
                        prop_assert!(model.iter().all(|s| members.binary_search(s).is_ok()));
                        prop_assert!(members.windows(2).all(|w| w[0] < w[1]));
                        if !half {
                            prop_assert_eq!(members, model.iter().copied().collect::<Vec<_>>());
                        }
                    }
                    None => prop_assert!(full || untracked || half),
                }
            }
        }
    }

    #[test]
    fn a_full_set_ignores_marks_until_taken() {
        let mut dirty = DirtySlots::default();
        dirty.mark(&[1], 2);
        assert!(!dirty.covers_all(2));
        dirty.mark(&[0, 1, 1], 2);
        assert!(dirty.covers_all(2));
        // New slots grow the capacity, so marking resumes.
        dirty.mark(&[3], 4);
        assert!(!dirty.covers_all(4));
        assert_eq!(dirty.take(4), Some(vec![0, 1, 3]));
        dirty.mark(&[2, 2], 4);
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
            tracked.push(!dirty.untracked());
            dirty.mark(&[0, 1], 2);
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

    /// Open members and earlier intervals' slots merge ascending, each once,
    /// across word boundaries and beyond the bits marked so far.
    #[test]
    fn union_lists_every_slot_once_in_ascending_order() {
        let mut dirty = DirtySlots::default();
        dirty.mark(&[70, 3, 64], 100);
        let earlier: [&[u32]; 2] = [&[3, 130], &[0, 64, 199]];
        assert_eq!(dirty.union(earlier, 200), vec![0, 3, 64, 70, 130, 199]);
        assert_eq!(DirtySlots::default().union([], 10), Vec::<u32>::new());
        // The union leaves the open set as it was.
        assert_eq!(dirty.take(100), Some(vec![3, 64, 70]));
    }

    /// A table of at least `FULL_BEATS_DIFF_MIN_KEYS` slots: once half are
    /// members, every slot is one (the capture is full either way), and
    /// slots a growing table adds join at once while half were written.
    #[test]
    fn half_the_slots_of_a_large_table_make_every_slot_a_member() {
        let n = FULL_BEATS_DIFF_MIN_KEYS as u32;
        let mut d = DirtySlots::default();
        let evens: Vec<u32> = (0..n).step_by(2).collect();
        d.mark(&evens[..evens.len() - 1], n as usize);
        assert!(!d.covers_all(n as usize));
        assert_eq!(d.len(), evens.len() - 1);
        d.mark(&evens[evens.len() - 1..], n as usize);
        assert!(d.covers_all(n as usize));
        assert_eq!(d.union([], n as usize), (0..n).collect::<Vec<u32>>());
        // The table grows by 100 keys, one of them written: still half.
        d.mark(&[n + 7], n as usize + 100);
        assert!(d.covers_all(n as usize + 100));
        assert_eq!(d.union([], n as usize + 100).len(), n as usize + 100);
        // It grows past twice what was written: marking resumes.
        let bigger = 3 * n as usize;
        d.mark(&[2 * n], bigger);
        assert!(!d.covers_all(bigger));
        assert_eq!(d.len(), n as usize + 101);
        assert_eq!(d.take(bigger).map(|m| m.len()), Some(n as usize + 101));
        // A small table is tracked slot by slot, however much is written.
        let mut small = DirtySlots::default();
        small.mark(&[0, 1, 2], 5);
        assert_eq!(small.take(5), Some(vec![0, 1, 2]));
    }

    #[test]
    fn mark_all_makes_every_slot_below_capacity_a_member() {
        let mut d = DirtySlots::default();
        d.mark(&[3], 70);
        d.mark_all(70);
        assert!(d.covers_all(70));
        assert_eq!(d.union([], 70), (0..70).collect::<Vec<u32>>());
    }
}
