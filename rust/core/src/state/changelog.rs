//! The change log: a copy of every row written since the last checkpoint,
//! one entry per key (a rewrite overwrites its entry in place).
//!
//! Writes already touch the row, so copying it into the log then costs a
//! sequential append. The sync phase of a checkpoint then reads the log
//! front to back instead of gathering changed rows from all over a large
//! table (one cache miss per column per row): what a diff needs is already
//! contiguous.

use arrow_schema::Schema;

use super::column::{new_column, Column};

const NONE: u32 = u32::MAX;

pub(crate) struct ChangeLog {
    pub(crate) columns: Vec<Box<dyn Column>>,
    /// Table slot of each entry; `NONE` once its key was deleted.
    slots: Vec<u32>,
    /// Entry of each table slot; valid only if `slots[pos[slot]] == slot`,
    /// so emptying the log needs no pass over `pos`.
    pos: Vec<u32>,
    dead: usize,
}

impl ChangeLog {
    pub(crate) fn new(schema: &Schema) -> Self {
        Self {
            columns: schema
                .fields()
                .iter()
                .map(|f| new_column(f.data_type(), f.is_nullable()).expect("checked supported"))
                .collect(),
            slots: Vec::new(),
            pos: Vec::new(),
            dead: 0,
        }
    }

    /// Makes room for table slots `0..len`.
    pub(crate) fn grow(&mut self, len: usize) {
        if len > self.pos.len() {
            self.pos.resize(len, NONE);
        }
    }

    fn entry_of(&self, slot: u32) -> Option<u32> {
        let p = self.pos[slot as usize];
        (self.slots.get(p as usize) == Some(&slot)).then_some(p)
    }

    /// Log entries for rows written to `slots` (new entries appended); the
    /// caller scatters the rows into `columns` at the returned positions.
    pub(crate) fn entries(&mut self, slots: &[u32]) -> Vec<u32> {
        let out = slots
            .iter()
            .map(|&slot| {
                self.entry_of(slot).unwrap_or_else(|| {
                    let p = self.slots.len() as u32;
                    self.slots.push(slot);
                    self.pos[slot as usize] = p;
                    p
                })
            })
            .collect();
        for c in &mut self.columns {
            c.resize(self.slots.len());
        }
        out
    }

    /// The key in `slot` was deleted: its entry no longer counts.
    pub(crate) fn remove(&mut self, slot: u32) {
        if let Some(p) = self.entry_of(slot) {
            self.slots[p as usize] = NONE;
            self.dead += 1;
        }
    }

    /// Number of live entries.
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.dead
    }

    /// Positions of the live entries, in log order.
    pub(crate) fn live(&self) -> Vec<u32> {
        if self.dead == 0 {
            return (0..self.slots.len() as u32).collect();
        }
        (0..self.slots.len() as u32)
            .filter(|&p| self.slots[p as usize] != NONE)
            .collect()
    }

    /// Empties the log in O(entries), leaving `pos` stale (hence harmless).
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.dead = 0;
        for c in &mut self.columns {
            c.resize(0);
        }
    }

    /// Bytes the log would allocate on top of its own if `entries` more
    /// entries came and its table grew to `slots` slots: each vector short
    /// of room grows to about twice its capacity (Rust's amortised growth).
    pub(crate) fn growth_bytes(&self, entries: usize, slots: usize) -> usize {
        let per_entry = self
            .columns
            .iter()
            .map(|c| c.allocated_bytes())
            .sum::<usize>()
            + self.slots.capacity() * std::mem::size_of::<u32>();
        grown_bytes(per_entry, self.slots.capacity(), self.slots.len() + entries)
            + grown_bytes(
                self.pos.capacity() * std::mem::size_of::<u32>(),
                self.pos.capacity(),
                slots,
            )
    }

    /// Bytes allocated (capacity: a cleared log keeps its room), a byte
    /// column's values on the heap aside.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.columns
            .iter()
            .map(|c| c.allocated_bytes())
            .sum::<usize>()
            + (self.slots.capacity() + self.pos.capacity()) * std::mem::size_of::<u32>()
    }

    /// Forgets every table slot too (the table was emptied).
    pub(crate) fn reset(&mut self) {
        self.clear();
        self.pos.clear();
    }
}

/// The bytes a vector (or vectors kept at one length) of `bytes` over
/// `capacity` elements allocates on top of them to hold `needed`: none if
/// they fit, else as `Vec` grows, to at least twice the capacity. An empty
/// one's first room is not counted (one write's own rows, which the
/// caller sizes).
pub(crate) fn grown_bytes(bytes: usize, capacity: usize, needed: usize) -> usize {
    if needed <= capacity || capacity == 0 {
        return 0;
    }
    let to = needed.max(2 * capacity);
    bytes / capacity * (to - capacity)
}
