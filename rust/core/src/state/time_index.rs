//! A secondary index of a [`super::StateTable`] by a time column: the keys
//! whose time is at or before a threshold, without reading the table.
//!
//! Timers (a row per timer), time-to-live (an expiry per row) and
//! `GroupState` timeouts are due when their time passes. Finding them by
//! reading every row costs O(table) per micro-batch, and with a memory
//! budget it reads every spilled run back. The index keeps (time, key) in
//! order, as Spark's RocksDB provider keeps a TTL index column family, so
//! expiry costs O(due keys · log n). It is derived: rebuilt from the rows on
//! restore, never written. It stays in memory whether or not the rows spill:
//! about 60 bytes a key with a time (more for byte keys), far less than a row.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::key::Key;

pub(crate) struct TimeIndex {
    /// The time column's position in the table's schema (Int64, nullable: a
    /// row with a null time is not in the index).
    pub(crate) col: usize,
    by_key: FxHashMap<Key, i64>,
    by_time: BTreeSet<(i64, Key)>,
}

impl TimeIndex {
    pub(crate) fn new(col: usize) -> Self {
        Self {
            col,
            by_key: FxHashMap::default(),
            by_time: BTreeSet::new(),
        }
    }

    /// Keys with a time.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// `key`'s row now has `time` (None: a null time, not indexed).
    pub(crate) fn set(&mut self, key: Key, time: Option<i64>) {
        match time {
            None => self.remove(&key),
            Some(t) => {
                if let Some(old) = self.by_key.insert(key.clone(), t) {
                    if old == t {
                        return;
                    }
                    self.by_time.remove(&(old, key.clone()));
                }
                self.by_time.insert((t, key));
            }
        }
    }

    /// `key`'s row is gone (absent keys are ignored).
    pub(crate) fn remove(&mut self, key: &Key) {
        if let Some(old) = self.by_key.remove(key) {
            self.by_time.remove(&(old, key.clone()));
        }
    }

    /// Keys whose time is at or before `threshold`, by time then key.
    pub(crate) fn due(&self, threshold: i64) -> Vec<Key> {
        self.by_time
            .iter()
            .take_while(|(t, _)| *t <= threshold)
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// The earliest time in the index.
    pub(crate) fn earliest(&self) -> Option<i64> {
        self.by_time.first().map(|(t, _)| *t)
    }

    pub(crate) fn clear(&mut self) {
        self.by_key.clear();
        self.by_time.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn due_keys_come_by_time_then_key_and_follow_updates() {
        let mut ix = TimeIndex::new(1);
        ix.set(Key::Int(3), Some(20));
        ix.set(Key::Int(1), Some(10));
        ix.set(Key::Int(2), Some(10));
        ix.set(Key::Int(4), None);
        assert_eq!(ix.due(9), vec![]);
        assert_eq!(ix.due(10), vec![Key::Int(1), Key::Int(2)]);
        ix.set(Key::Int(1), Some(30)); // moved later
        ix.set(Key::Int(3), None); // its time cleared
        ix.remove(&Key::Int(2));
        ix.remove(&Key::Int(99));
        assert_eq!(ix.due(25), vec![]);
        assert_eq!((ix.len(), ix.earliest()), (1, Some(30)));
        ix.clear();
        assert_eq!((ix.len(), ix.earliest()), (0, None));
    }

    proptest! {
        /// Against a model map: after any sequence of sets and removals,
        /// `due(t)` is exactly the model's keys with time <= t, ordered.
        #[test]
        fn matches_a_model(
            ops in prop::collection::vec((0i64..20, prop::option::of(-5i64..5), any::<bool>()), 0..200),
            threshold in -6i64..6,
        ) {
            let mut ix = TimeIndex::new(0);
            let mut model: BTreeMap<i64, i64> = BTreeMap::new();
            for (k, t, remove) in ops {
                if remove {
                    ix.remove(&Key::Int(k));
                    model.remove(&k);
                } else {
                    ix.set(Key::Int(k), t);
                    match t {
                        Some(t) => { model.insert(k, t); }
                        None => { model.remove(&k); }
                    }
                }
            }
            let mut want: Vec<(i64, i64)> =
                model.iter().filter(|(_, t)| **t <= threshold).map(|(k, t)| (*t, *k)).collect();
            want.sort();
            let want: Vec<Key> = want.into_iter().map(|(_, k)| Key::Int(k)).collect();
            prop_assert_eq!(ix.due(threshold), want);
            prop_assert_eq!(ix.len(), model.len());
        }
    }
}
