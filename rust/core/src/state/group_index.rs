//! A secondary index of a [`super::StateTable`]: a group column's value → the
//! slots of its rows.
//!
//! State with one row per (grouping key, sub-key) — map entries, list
//! elements, timers — is keyed by the composite key, yet read, cleared and
//! expired per grouping key. The index makes those O(group), not O(table).

use rustc_hash::FxHashMap;

use super::group_prefix::GroupPrefix;
use super::key::{Key, KeyType};

pub(crate) struct GroupIndex {
    /// The group column's position in the table's schema.
    pub(crate) col: usize,
    pub(crate) key_type: KeyType,
    /// What the keys of a group's rows begin with, if declared
    /// (`StateTable::with_group_prefix`): a spilling table needs it.
    pub(crate) prefix: Option<GroupPrefix>,
    members: FxHashMap<Key, Vec<u32>>,
    of_slot: Vec<Option<Key>>,
}

impl GroupIndex {
    pub(crate) fn new(col: usize, key_type: KeyType) -> Self {
        Self {
            col,
            key_type,
            prefix: None,
            members: FxHashMap::default(),
            of_slot: Vec::new(),
        }
    }

    /// Number of groups with at least one row.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Row `i` of an upsert went to `slots[i]` with group `groups[i]`.
    pub(crate) fn upserted(&mut self, slots: &[u32], groups: Vec<Key>) {
        for (&slot, group) in slots.iter().zip(groups) {
            let s = slot as usize;
            if s >= self.of_slot.len() {
                self.of_slot.resize(s + 1, None);
            }
            if self.of_slot[s].as_ref() == Some(&group) {
                continue;
            }
            self.removed(slot);
            self.members.entry(group.clone()).or_default().push(slot);
            self.of_slot[s] = Some(group);
        }
    }

    /// The row in `slot` was deleted.
    pub(crate) fn removed(&mut self, slot: u32) {
        let Some(group) = self.of_slot.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        if let Some(members) = self.members.get_mut(&group) {
            // Keeps insertion order: a group's rows come back in the order written.
            if let Some(at) = members.iter().position(|&m| m == slot) {
                members.remove(at);
            }
            if members.is_empty() {
                self.members.remove(&group);
            }
        }
    }

    /// The slots of every asked group, and for each the position of its group
    /// among `groups` (groups in the order asked; rows in the order written).
    pub(crate) fn slots_of(&self, groups: &[Key]) -> (Vec<u32>, Vec<u32>) {
        let mut slots = Vec::new();
        let mut which = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            if let Some(members) = self.members.get(g) {
                slots.extend_from_slice(members);
                which.extend(std::iter::repeat_n(i as u32, members.len()));
            }
        }
        (slots, which)
    }

    pub(crate) fn clear(&mut self) {
        self.members.clear();
        self.of_slot.clear();
    }
}
