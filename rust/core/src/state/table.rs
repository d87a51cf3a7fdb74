//! [`StateTable`]: a keyed table that remembers what changed since its last checkpoint.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    make_array, new_null_array, Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::filter::filter_record_batch;

use super::changelog::ChangeLog;
use super::column::{check_supported, new_column, Column};
use super::group_index::GroupIndex;
use super::group_prefix::GroupPrefix;
use super::key::{Key, KeyIndex, KeySet, KeyType};
use super::runs::Pages;
use super::time_index::TimeIndex;
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{full_beats_diff, StateCapture, StateKind};
use confirmed::Interval;

mod confirmed;
mod sorted_slots;
mod spill;
mod spill_groups;
mod time_runs;
pub use spill::{
    check_memory_budget, parse_memory, CaptureRows, InMemoryRuns, RunSink, SpillStats,
    StreamedCapture, MAX_RUNS, MIN_STATE_MEMORY,
};

/// Name of the tombstone column of a diff batch.
pub const DELETED_COLUMN: &str = "__deleted";
/// Schema metadata key naming the key column of a state batch (files carry it,
/// so a reader can rebuild state without being told the key).
pub const KEY_METADATA: &str = "snapcut.key";
/// Schema metadata key of a diff batch: how many live keys the table held
/// when it was captured (the state its chain rebuilds), in decimal. A
/// restore that keeps the diff as a run takes it instead of looking every
/// key of the diff up in the older runs to count them.
pub const LIVE_KEYS_METADATA: &str = "snapcut.live_keys";
/// Schema metadata key of a full batch of a table with a time index: its
/// time column. The store writes the index beside the file (format 5), so
/// a restore need not read every row's time.
pub const TIME_METADATA: &str = "snapcut.time";

/// How often a checkpoint is a full materialisation instead of a diff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatePolicy {
    /// Every `full_every`-th checkpoint is full (1 = always full). Restore
    /// then reads at most `full_every` files per task. A checkpoint in which
    /// at least half the keys changed is full as well, whatever its
    /// position, while the state is in memory ([`full_beats_diff`]).
    pub full_every: u32,
}

impl Default for StatePolicy {
    fn default() -> Self {
        Self { full_every: 10 }
    }
}

/// A keyed state table: key column → typed value columns, with the changes
/// since the last checkpoint tracked so that a checkpoint costs
/// O(changed keys), never O(table size) (except every `full_every`-th one).
pub struct StateTable {
    schema: SchemaRef,
    diff_schema: SchemaRef,
    lookup_schema: SchemaRef,
    key_col: usize,
    key_type: KeyType,
    policy: StatePolicy,
    index: KeyIndex,
    columns: Vec<Box<dyn Column>>,
    /// Slot bookkeeping: which slots hold a live key, which are free for reuse.
    occupied: Vec<bool>,
    free: Vec<u32>,
    /// Rows written since the last checkpoint, contiguous (the diff's upserts).
    log: ChangeLog,
    tombstones: KeySet,
    last_checkpoint: Option<CheckpointId>,
    diffs_since_full: u32,
    force_full: bool,
    /// Set while replaying a chain: nothing to log, the end state is the base.
    restoring: bool,
    /// `Some` once [`StateTable::confirm_bases`] was called: diffs are then
    /// based on the last confirmed checkpoint.
    confirm: Option<Confirm>,
    /// Rows by a group column, if [`StateTable::with_group`] set one.
    group: Option<GroupIndex>,
    /// Runs below the memtable, if [`StateTable::with_memory_budget`] set one.
    spill: Option<spill::Spill>,
    /// Keys by a time column, if [`StateTable::with_time_index`] set one.
    time: Option<TimeIndex>,
}

/// Bookkeeping of confirmed-base mode (several checkpoints in flight).
#[derive(Debug, Default)]
struct Confirm {
    /// The newest confirmed checkpoint and the diffs in its chain.
    confirmed: Option<(CheckpointId, u32)>,
    /// Checkpoints taken after it, oldest first: each one's diffs-in-chain
    /// and the changes of the interval it closed.
    unconfirmed: Vec<(CheckpointId, u32, Interval)>,
}

impl std::fmt::Debug for StateTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateTable")
            .field("key", &self.key_column())
            .field("len", &self.len())
            .field("changed", &self.changed_len())
            .field("last_checkpoint", &self.last_checkpoint)
            .finish()
    }
}

impl StateTable {
    /// A new empty table of `schema`, keyed by column `key`.
    pub fn new(schema: SchemaRef, key: &str, policy: StatePolicy) -> Result<Self> {
        if policy.full_every == 0 {
            return Err(Error::Config(
                "state full_every must be at least 1 (1 = every checkpoint full)".into(),
            ));
        }
        let key_col = schema.index_of(key).map_err(|_| {
            Error::Config(format!(
                "key column '{key}' is not in the state schema (columns: {})",
                column_names(&schema)
            ))
        })?;
        if schema.fields().iter().any(|f| f.name() == DELETED_COLUMN) {
            return Err(Error::Config(format!(
                "state schema may not have a column named '{DELETED_COLUMN}' (reserved for tombstones)"
            )));
        }
        let key_type = KeyType::new(key, schema.field(key_col).data_type())?;
        for f in schema.fields() {
            check_supported(f.name(), f.data_type())?;
        }
        let mut metadata = schema.metadata().clone();
        metadata.insert(KEY_METADATA.into(), key.into());
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[key_col] = fields[key_col].clone().with_nullable(false);
        let schema = Arc::new(Schema::new_with_metadata(fields.clone(), metadata.clone()));
        // Tombstone rows (and absent keys of a lookup) carry only the key,
        // so every value column is nullable there.
        let values_nullable: Vec<Field> = fields
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                if i == key_col {
                    f
                } else {
                    f.with_nullable(true)
                }
            })
            .collect();
        let lookup_schema = Arc::new(Schema::new_with_metadata(
            values_nullable.clone(),
            metadata.clone(),
        ));
        let mut diff_fields = values_nullable;
        diff_fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
        let diff_schema = Arc::new(Schema::new_with_metadata(diff_fields, metadata));
        let columns = schema
            .fields()
            .iter()
            .map(|f| new_column(f.data_type(), f.is_nullable()).expect("checked supported"))
            .collect();
        Ok(Self {
            diff_schema,
            lookup_schema,
            key_col,
            index: key_type.new_index(),
            tombstones: key_type.new_set(),
            key_type,
            policy,
            columns,
            occupied: Vec::new(),
            free: Vec::new(),
            log: ChangeLog::new(&schema),
            last_checkpoint: None,
            diffs_since_full: 0,
            force_full: false,
            restoring: false,
            confirm: None,
            group: None,
            spill: None,
            time: None,
            schema,
        })
    }

    /// Indexes the keys by `column` (Int64, nullable: a null time is not
    /// indexed), for [`Self::due`]: the timers, expiries or timeouts that
    /// passed, found without reading the table (see `time_index`).
    pub fn with_time_index(mut self, column: &str) -> Result<Self> {
        let col = self.schema.index_of(column).map_err(|_| {
            Error::Config(format!(
                "time column '{column}' is not in the state schema (columns: {})",
                column_names(&self.schema)
            ))
        })?;
        let data_type = self.schema.field(col).data_type();
        if col == self.key_col || data_type != &DataType::Int64 {
            return Err(Error::Config(format!(
                "time column '{column}' must be an Int64 value column (milliseconds), not the \
                 key; it is {data_type}"
            )));
        }
        self.time = Some(TimeIndex::new(col));
        if !self.is_empty() {
            let rows = self.to_batch();
            self.note_base_times(rows.columns())?;
        }
        Ok(self)
    }

    /// The time column, if the table has a time index.
    pub fn time_column(&self) -> Option<&str> {
        self.time
            .as_ref()
            .map(|t| self.schema.field(t.col).name().as_str())
    }

    /// Indexes the rows by `column` as well (a key-typed column, typically a
    /// grouping key that prefixes a composite key), for
    /// [`Self::lookup_groups`] and [`Self::delete_groups`].
    pub fn with_group(mut self, column: &str) -> Result<Self> {
        if self.spill.is_some() {
            return Err(Error::Config(
                "a state table takes its group column (and its group prefix) before its memory \
                 budget: call with_group first"
                    .into(),
            ));
        }
        let col = self.schema.index_of(column).map_err(|_| {
            Error::Config(format!(
                "group column '{column}' is not in the state schema (columns: {})",
                column_names(&self.schema)
            ))
        })?;
        if self.schema.field(col).is_nullable() {
            return Err(Error::Config(format!(
                "group column '{column}' must be non-nullable: every row belongs to a group"
            )));
        }
        let key_type = KeyType::new(column, self.schema.field(col).data_type())?;
        let mut index = GroupIndex::new(col, key_type);
        let live = self.live_slots();
        if !live.is_empty() {
            let groups = self.columns[col].gather(&live);
            index.upserted(&live, index.key_type.keys(column, groups.as_ref())?);
        }
        self.group = Some(index);
        Ok(self)
    }

    /// Declares that every row's key begins with its group's `prefix`
    /// ([`GroupPrefix`]; the table must have a group column and binary
    /// keys): then a table with a memory budget finds a group's rows in its
    /// runs as one key range each, and every write is checked to keep it so.
    pub fn with_group_prefix(mut self, prefix: GroupPrefix) -> Result<Self> {
        if self.spill.is_some() {
            return Err(Error::Config(
                "a state table takes its group prefix before its memory budget: call \
                 with_group_prefix first"
                    .into(),
            ));
        }
        let col = self.group_index()?.col;
        let key = self.schema.field(self.key_col);
        let group = self.schema.field(col);
        prefix.check(
            (key.name(), key.data_type()),
            (group.name(), group.data_type()),
        )?;
        let live = self.live_slots();
        if !live.is_empty() {
            let keys = self.columns[self.key_col].gather(&live);
            let groups = self.columns[col].gather(&live);
            prefix.check_rows((key.name(), keys.as_ref()), (group.name(), groups.as_ref()))?;
        }
        if let Some(g) = self.group.as_mut() {
            g.prefix = Some(prefix);
        }
        Ok(self)
    }

    /// The group prefix, if one was declared.
    pub fn group_prefix(&self) -> Option<GroupPrefix> {
        self.group.as_ref().and_then(|g| g.prefix)
    }

    /// The group column, if the table has one.
    pub fn group_column(&self) -> Option<&str> {
        self.group
            .as_ref()
            .map(|g| self.schema.field(g.col).name().as_str())
    }

    /// Number of groups with at least one row in memory (0 without a group
    /// column; a spilling table's runs are not counted).
    pub fn group_count(&self) -> usize {
        self.group.as_ref().map_or(0, GroupIndex::len)
    }

    /// The table's schema (key column non-nullable; metadata names the key).
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The schema of diff batches: the table's plus a boolean `__deleted`.
    pub fn diff_schema(&self) -> SchemaRef {
        self.diff_schema.clone()
    }

    /// The schema of [`Self::lookup`] batches: the table's with every
    /// non-key column nullable.
    pub fn lookup_schema(&self) -> SchemaRef {
        self.lookup_schema.clone()
    }

    pub fn key_column(&self) -> &str {
        self.schema.field(self.key_col).name()
    }

    pub fn policy(&self) -> StatePolicy {
        self.policy
    }

    /// Number of live keys (in memory and, with a memory budget, in runs).
    pub fn len(&self) -> usize {
        self.index.len() + self.outside_len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Upper bound of keys changed (upserted or deleted) since the last checkpoint.
    pub fn changed_len(&self) -> usize {
        self.log.len() + self.tombstones.len() + self.pending_rows()
    }

    /// The checkpoint the next diff would be based on.
    pub fn last_checkpoint(&self) -> Option<CheckpointId> {
        self.last_checkpoint
    }

    /// Inserts or overwrites the rows of `batch` by key. The batch must have
    /// every column of the schema (any order, matched by name, same types);
    /// within a batch a later row wins over an earlier one with the same key.
    pub fn upsert(&mut self, batch: &RecordBatch) -> Result<()> {
        self.upsert_hinted(batch, None)
    }

    /// [`Self::upsert`] of rows whose keys are distinct and were just looked
    /// up with [`Self::lookup`] (`present`: its mask, in the batch's row
    /// order), nothing written in between: a spilling table then knows
    /// which keys new to memory its runs hold without searching them again.
    pub fn upsert_looked_up(&mut self, batch: &RecordBatch, present: &BooleanArray) -> Result<()> {
        if present.len() != batch.num_rows() || present.null_count() > 0 {
            return Err(Error::Config(format!(
                "upsert_looked_up: the present mask has {} values ({} null) for {} rows; pass \
                 the mask lookup returned for exactly these keys",
                present.len(),
                present.null_count(),
                batch.num_rows()
            )));
        }
        self.upsert_hinted(batch, Some(present))
    }

    fn upsert_hinted(&mut self, batch: &RecordBatch, present: Option<&BooleanArray>) -> Result<()> {
        let arrays = self.columns_of(batch)?;
        self.key_type
            .check(self.key_column(), arrays[self.key_col].as_ref())?;
        if let Some(g) = self.group.as_ref() {
            if let Some(prefix) = g.prefix {
                // The whole batch, before any of it is written.
                prefix.check_rows(
                    (self.key_column(), arrays[self.key_col].as_ref()),
                    (self.schema.field(g.col).name(), arrays[g.col].as_ref()),
                )?;
            }
        }
        // A spilling table takes a large batch (a restore's full state, a
        // backfill) a slice at a time, flushing between slices, so that its
        // memtable stays near the budget however many keys one write brings.
        let step = self.upsert_slice_rows(&arrays);
        let rows = arrays[self.key_col].len();
        if rows <= step {
            return self.upsert_arrays(arrays, present);
        }
        for start in (0..rows).step_by(step) {
            let len = step.min(rows - start);
            let part = present.map(|p| p.slice(start, len));
            self.upsert_arrays(
                arrays.iter().map(|a| a.slice(start, len)).collect(),
                part.as_ref(),
            )?;
        }
        Ok(())
    }

    /// Upserts checked columns in schema order (`present`: see
    /// [`Self::upsert_looked_up`]).
    fn upsert_arrays(
        &mut self,
        arrays: Vec<ArrayRef>,
        present: Option<&BooleanArray>,
    ) -> Result<()> {
        let key_array = arrays[self.key_col].as_ref();
        // Read (and check) the groups before anything changes.
        let groups = match &self.group {
            Some(g) => {
                let name = self.schema.field(g.col).name();
                Some(g.key_type.keys(name, arrays[g.col].as_ref())?)
            }
            None => None,
        };
        self.before_write(key_array.len())?;
        self.before_upsert(&arrays, present)?;
        self.note_times(&arrays)?;
        self.index.reserve(key_array.len());
        let mut len = self.occupied.len() as u32;
        let free = &mut self.free;
        let mut new_slot = || {
            free.pop().unwrap_or_else(|| {
                len += 1;
                len - 1
            })
        };
        let slots: Vec<u32> = match &mut self.index {
            // Hot path: Int64 keys straight from the Arrow buffer, no Key values.
            KeyIndex::Int(map)
                if self.tombstones.len() == 0 && key_array.data_type() == &DataType::Int64 =>
            {
                key_array
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .map(|&k| *map.entry(k).or_insert_with(&mut new_slot))
                    .collect()
            }
            index => {
                let keys = self
                    .key_type
                    .keys(self.schema.field(self.key_col).name(), key_array)?;
                let tombstones = &mut self.tombstones;
                keys.into_iter()
                    .map(|key| {
                        if tombstones.len() > 0 {
                            tombstones.remove(&key);
                        }
                        index.get_or_insert(key, &mut new_slot).0
                    })
                    .collect()
            }
        };
        self.grow(len as usize);
        for &slot in &slots {
            self.occupied[slot as usize] = true;
        }
        if let (Some(index), Some(groups)) = (self.group.as_mut(), groups) {
            index.upserted(&slots, groups);
        }
        for (column, array) in self.columns.iter_mut().zip(arrays.iter()) {
            column.scatter(&slots, array.as_ref());
        }
        if self.logging() {
            let entries = self.log.entries(&slots);
            for (logged, array) in self.log.columns.iter_mut().zip(arrays.iter()) {
                logged.scatter(&entries, array.as_ref());
            }
        }
        self.after_write()
    }

    /// Removes `keys` (absent ones are ignored); returns how many were present.
    pub fn delete(&mut self, keys: &dyn Array) -> Result<usize> {
        let keys = self.key_type.keys(self.key_column(), keys)?;
        if let Some(index) = self.time.as_mut() {
            keys.iter().for_each(|k| index.remove(k));
        }
        let mut removed = 0;
        let mut elsewhere = Vec::new();
        for key in keys {
            if let Some(slot) = self.index.remove(&key) {
                self.occupied[slot as usize] = false;
                if let Some(g) = self.group.as_mut() {
                    g.removed(slot);
                }
                self.free.push(slot);
                self.log.remove(slot);
                self.shadow(&key);
                if self.logging() {
                    self.tombstones.insert(key);
                }
                removed += 1;
            } else if self.has_runs() {
                elsewhere.push(key);
            }
        }
        if !elsewhere.is_empty() {
            removed += self.delete_from_runs(elsewhere)?;
        }
        Ok(removed)
    }

    /// The rows of the given keys that are present, in the order asked.
    pub fn get(&self, keys: &dyn Array) -> Result<RecordBatch> {
        self.key_type.check(self.key_column(), keys)?;
        if self.has_runs() {
            let (rows, present) = self.lookup_with_runs(keys)?;
            let rows = filter_record_batch(&rows, &present).map_err(arrow_err)?;
            return RecordBatch::try_new(self.schema.clone(), rows.columns().to_vec())
                .map_err(arrow_err);
        }
        let slots: Vec<u32> = self.index.slots_of(keys).into_iter().flatten().collect();
        Ok(self.gather(&slots))
    }

    /// One row per key asked, in the order asked (duplicates included):
    /// every column of a present key's row, nulls for an absent key, except
    /// the key column, which is `keys` itself; plus a mask of the keys that
    /// were present. The batch has [`Self::lookup_schema`].
    pub fn lookup(&self, keys: &dyn Array) -> Result<(RecordBatch, BooleanArray)> {
        self.key_type.check(self.key_column(), keys)?;
        if self.has_runs() {
            return self.lookup_with_runs(keys);
        }
        let slots = self.index.slots_of(keys);
        let present = BooleanArray::from(slots.iter().map(Option::is_some).collect::<Vec<_>>());
        let found: Vec<u32> = slots.iter().flatten().copied().collect();
        // Where each asked key's row sits among the found rows (null if
        // absent); not needed when every key was found.
        let positions = (found.len() < slots.len()).then(|| {
            let mut next = 0u32;
            slots
                .iter()
                .map(|s| {
                    s.map(|_| {
                        next += 1;
                        next - 1
                    })
                })
                .collect::<UInt32Array>()
        });
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for (i, column) in self.columns.iter().enumerate() {
            let array = if i == self.key_col {
                make_array(keys.to_data())
            } else if found.is_empty() {
                new_null_array(self.schema.field(i).data_type(), slots.len())
            } else {
                let rows = column.gather(&found);
                match &positions {
                    None => rows,
                    Some(p) => {
                        arrow_select::take::take(rows.as_ref(), p, None).map_err(arrow_err)?
                    }
                }
            };
            arrays.push(array);
        }
        let batch = RecordBatch::try_new(self.lookup_schema.clone(), arrays)
            .expect("columns match the lookup schema");
        Ok((batch, present))
    }

    /// Every row of the asked groups (groups in the order asked, a group's
    /// rows in the order they were first written), and for each row the
    /// position of its group among `groups`.
    /// Once runs hold part of the table, a group's rows in memory come
    /// first, then its rows in the runs in key order.
    pub fn lookup_groups(&self, groups: &dyn Array) -> Result<(RecordBatch, UInt32Array)> {
        if self.has_runs() {
            return self.lookup_groups_with_runs(groups);
        }
        let index = self.group_index()?;
        let name = self.schema.field(index.col).name();
        let keys = index.key_type.keys(name, groups)?;
        let (slots, which) = index.slots_of(&keys);
        Ok((self.gather(&slots), UInt32Array::from(which)))
    }

    /// Deletes every row of the asked groups; returns how many rows went.
    pub fn delete_groups(&mut self, groups: &dyn Array) -> Result<usize> {
        if self.has_runs() {
            return self.delete_groups_with_runs(groups);
        }
        let index = self.group_index()?;
        let name = self.schema.field(index.col).name();
        let keys = index.key_type.keys(name, groups)?;
        let (slots, _) = index.slots_of(&keys);
        if slots.is_empty() {
            return Ok(0);
        }
        let doomed = self.columns[self.key_col].gather(&slots);
        self.delete(doomed.as_ref())
    }

    fn group_index(&self) -> Result<&GroupIndex> {
        self.group.as_ref().ok_or_else(|| {
            Error::Config(
                "this state table has no group column: create it with a group column to read \
                 or delete rows by group"
                    .into(),
            )
        })
    }

    /// Every live row (slot order, which is not key order; key order once
    /// runs hold part of the state).
    pub fn to_batch(&self) -> RecordBatch {
        if self.has_runs() {
            return self
                .full_with_runs()
                .expect("a table's own runs merge: they share its schema and are sorted");
        }
        self.gather(&self.live_slots())
    }

    /// The changes since the last checkpoint as a diff batch, without
    /// starting a new checkpoint: upserts then tombstones (in key order
    /// once flushes moved some of them into runs).
    pub fn changes(&self) -> RecordBatch {
        self.interval_changes()
            .expect("a table's own runs merge: they share its schema and are sorted")
    }

    /// The changes since the last checkpoint held in memory: the change log
    /// and the tombstones.
    fn log_changes(&self) -> RecordBatch {
        if self.last_checkpoint.is_none() {
            // Before the first checkpoint nothing is logged: everything changed.
            return self.diff_batch(&self.columns, &self.live_slots(), &[]);
        }
        self.diff_batch(
            &self.log.columns,
            &self.log.live(),
            &self.tombstones.to_vec(),
        )
    }

    /// Whether writes go to the change log: not before the first checkpoint
    /// (which is full anyway) and not while restoring.
    fn logging(&self) -> bool {
        self.last_checkpoint.is_some() && !self.restoring
    }

    /// The synchronous phase of checkpoint `id`: captures the changes since
    /// the previous checkpoint (O(changed keys)) or, every `full_every`-th
    /// time, the whole table; then starts tracking afresh. The capture is
    /// immutable Arrow data: encoding and writing it can happen elsewhere.
    pub fn checkpoint(&mut self, id: CheckpointId) -> Result<StateCapture> {
        self.check_next_id(id)?;
        if self.confirm.is_some() {
            return self.checkpoint_confirmed_base(id);
        }
        let full = self.next_is_full();
        let capture = if full {
            StateCapture {
                kind: StateKind::Full,
                batch: self.to_batch(),
                filter: None,
                times: None,
            }
        } else if self.changed_every_key() {
            self.full_from_log()
        } else if !self.has_runs() && full_beats_diff(self.changed_len(), self.len()) {
            // A table whose runs hold state on disk leaves that to the
            // store's compactor: its full would merge every run.
            StateCapture {
                kind: StateKind::Full,
                batch: self.to_batch(),
                filter: None,
                times: None,
            }
        } else {
            StateCapture {
                kind: StateKind::Diff {
                    base: self.last_checkpoint.expect("diff has a base"),
                },
                batch: self.changes(),
                filter: None,
                times: None,
            }
        };
        let capture = self.with_capture_metadata(capture);
        self.checkpoint_taken(id, capture.kind);
        Ok(capture)
    }

    /// A capture with what its file tells a restore in its schema's
    /// metadata: a diff the table's live keys ([`LIVE_KEYS_METADATA`]), a
    /// full of a table with a time index its time column
    /// ([`TIME_METADATA`]: the writer stores the index beside the file).
    fn with_capture_metadata(&self, mut capture: StateCapture) -> StateCapture {
        capture.batch = self.batch_with_capture_metadata(capture.kind, &capture.batch);
        capture
    }

    /// `batch` of a capture of `kind` with its metadata (see
    /// [`Self::with_capture_metadata`]).
    pub(super) fn batch_with_capture_metadata(
        &self,
        kind: StateKind,
        batch: &RecordBatch,
    ) -> RecordBatch {
        let schema = self.capture_schema(kind, batch.schema_ref());
        if Arc::ptr_eq(&schema, batch.schema_ref()) {
            return batch.clone();
        }
        RecordBatch::try_new(schema, batch.columns().to_vec())
            .expect("only the schema's metadata changed")
    }

    /// `schema` of a capture of `kind` with its metadata (see
    /// [`Self::with_capture_metadata`]).
    pub(super) fn capture_schema(&self, kind: StateKind, schema: &SchemaRef) -> SchemaRef {
        let (name, value) = match kind {
            StateKind::Diff { .. } => (LIVE_KEYS_METADATA, self.len().to_string()),
            StateKind::Full => match self.time_column() {
                Some(column) => (TIME_METADATA, column.to_string()),
                None => return schema.clone(),
            },
        };
        let mut metadata = schema.metadata().clone();
        metadata.insert(name.into(), value);
        Arc::new(schema.as_ref().clone().with_metadata(metadata))
    }

    fn check_next_id(&self, id: CheckpointId) -> Result<()> {
        match self.last_checkpoint {
            Some(last) if id <= last => Err(Error::Config(format!(
                "state checkpoint ids must increase: got {id} after {last}"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the next checkpoint is a full one (the first, a forced one,
    /// or every `full_every`-th).
    fn next_is_full(&self) -> bool {
        match self.last_checkpoint {
            None => true,
            Some(_) => self.force_full || self.diffs_since_full + 1 >= self.policy.full_every,
        }
    }

    /// Checkpoint `id` of `kind` was captured: tracking starts afresh.
    fn checkpoint_taken(&mut self, id: CheckpointId, kind: StateKind) {
        self.reset_tracking();
        self.diffs_since_full = match kind {
            StateKind::Full => 0,
            StateKind::Diff { .. } => self.diffs_since_full + 1,
        };
        self.force_full = false;
        self.last_checkpoint = Some(id);
    }

    /// Whether something changed and every live key was written since the
    /// last checkpoint (so the change log holds the whole table). Deleted
    /// keys need no tombstones then: a full capture replaces the state
    /// instead of patching it.
    fn changed_every_key(&self) -> bool {
        self.logging() && !self.has_runs() && self.changed_len() > 0 && self.log.len() == self.len()
    }

    /// The whole table, read from the change log when it covers every live
    /// key: as cheap as the diff, and it ends the diff chain, so the store
    /// never has to rebuild a full state from it (hot keyed state at short
    /// intervals rewrites every key between two checkpoints).
    fn full_from_log(&self) -> StateCapture {
        let live = self.log.live();
        let arrays: Vec<ArrayRef> = self.log.columns.iter().map(|c| c.gather(&live)).collect();
        StateCapture {
            kind: StateKind::Full,
            batch: RecordBatch::try_new(self.schema.clone(), arrays)
                .expect("the change log has the table's schema"),
            filter: None,
            times: None,
        }
    }

    /// A checkpoint taken from this table was aborted: its changes were never
    /// stored, so the next checkpoint must be full to stay restorable.
    pub fn checkpoint_aborted(&mut self) {
        self.force_full = true;
    }

    /// Switches to confirmed bases, for several checkpoints in flight: a
    /// diff is then based on the newest checkpoint confirmed with
    /// [`Self::checkpoint_committed`] (not on the last one taken, which may
    /// still be aborted) and carries every change since, like RocksDB
    /// incremental checkpoints in Flink. Until a first confirmation every
    /// checkpoint is full.
    pub fn confirm_bases(&mut self) {
        if self.confirm.is_none() {
            self.confirm = Some(Confirm::default());
        }
    }

    /// Checkpoint `id`, taken from this table, completed (its capture is
    /// stored): later diffs may be based on it. Ignored unless
    /// [`Self::confirm_bases`] is on, and for ids it did not take or that a
    /// newer confirmation already covers.
    pub fn checkpoint_committed(&mut self, id: CheckpointId) {
        let Some(confirm) = self.confirm.as_mut() else {
            return;
        };
        if let Some(pos) = confirm.unconfirmed.iter().position(|(i, ..)| *i == id) {
            let diffs = confirm.unconfirmed[pos].1;
            confirm.unconfirmed.drain(..=pos);
            confirm.confirmed = Some((id, diffs));
        }
    }

    fn checkpoint_confirmed_base(&mut self, id: CheckpointId) -> Result<StateCapture> {
        // The changes of the interval this checkpoint closes; before the first
        // checkpoint none are logged, and none are needed (nothing older can
        // be confirmed).
        let interval = if self.last_checkpoint.is_some() {
            self.changes()
        } else {
            RecordBatch::new_empty(self.diff_schema.clone())
        };
        let confirm = self.confirm.as_ref().expect("confirmed-base mode");
        let base = match confirm.confirmed {
            Some((base, diffs)) if !self.force_full && diffs + 1 < self.policy.full_every => {
                Some((base, diffs))
            }
            _ => None,
        };
        let (capture, diffs) = match base {
            Some(_) if self.changed_every_key() => (self.full_from_log(), 0),
            None => (
                StateCapture {
                    kind: StateKind::Full,
                    batch: self.to_batch(),
                    filter: None,
                    times: None,
                },
                0,
            ),
            Some((base, diffs)) => {
                // Only while the state is in memory (see `checkpoint`). This
                // interval's keys alone are a lower bound of the diff's: past
                // half, the unconfirmed intervals need no merge.
                let full = |rows: usize| !self.has_runs() && full_beats_diff(rows, self.len());
                let diff = if full(interval.num_rows()) {
                    None
                } else {
                    let older: Vec<RecordBatch> = (confirm.unconfirmed.iter())
                        .map(|(_, _, changes)| changes.batch(self))
                        .collect::<Result<_>>()?;
                    let mut parts: Vec<&RecordBatch> = older.iter().collect();
                    parts.push(&interval);
                    Some(self.merge_diffs(&parts)?).filter(|d| !full(d.num_rows()))
                };
                let (kind, batch, diffs) = match diff {
                    Some(batch) => (StateKind::Diff { base }, batch, diffs + 1),
                    None => (StateKind::Full, self.to_batch(), 0),
                };
                let filter = None;
                (
                    StateCapture {
                        kind,
                        batch,
                        filter,
                        times: None,
                    },
                    diffs,
                )
            }
        };
        let capture = self.with_capture_metadata(capture);
        self.confirmed_base_taken(id, diffs, Interval::Batch(interval));
        Ok(capture)
    }

    /// Checkpoint `id` was captured in confirmed-base mode, `diffs` diffs
    /// into its chain, closing `interval`: kept until confirmed, and
    /// tracking starts afresh.
    fn confirmed_base_taken(&mut self, id: CheckpointId, diffs: u32, interval: Interval) {
        self.confirm
            .as_mut()
            .expect("confirmed-base mode")
            .unconfirmed
            .push((id, diffs, interval));
        self.reset_tracking();
        self.force_full = false;
        self.last_checkpoint = Some(id);
    }

    /// Diff batches of consecutive intervals as one: per key, the last
    /// row (upsert or tombstone) wins.
    fn merge_diffs(&self, parts: &[&RecordBatch]) -> Result<RecordBatch> {
        if let [one] = parts {
            return Ok((*one).clone());
        }
        let all = arrow_select::concat::concat_batches(&self.diff_schema, parts.iter().copied())
            .map_err(arrow_err)?;
        let keys = self
            .key_type
            .keys(self.key_column(), all.column(self.key_col).as_ref())?;
        let mut seen: HashSet<&Key> = HashSet::with_capacity(keys.len());
        let mut keep: Vec<u32> = (0..keys.len() as u32)
            .rev()
            .filter(|&i| seen.insert(&keys[i as usize]))
            .collect();
        keep.reverse();
        arrow_select::take::take_record_batch(&all, &UInt32Array::from(keep)).map_err(arrow_err)
    }

    /// Replaces the contents with the state at the end of `chain`: a full
    /// capture followed by diffs, each based on the previous entry's id.
    pub fn restore(&mut self, chain: &[(CheckpointId, StateCapture)]) -> Result<()> {
        self.restore_from(chain, false, &[])
    }

    /// As [`Self::restore`], where the chain's batches are mapped state files
    /// that no one writes again (a root's own files, read by a mapping): a
    /// spilling table takes a sorted full as its base run as it is, with no
    /// copy, no local file (its pages are the root file's page cache) and no
    /// filter, and each sorted diff after it as one more run (`adopt_diff`),
    /// so a cold restore costs order checks and one lookup of the diffs'
    /// keys, and lookups then read only the pages of the keys they touch. A
    /// table without a memory budget is opened the same way (lazily: its
    /// runs are the files, its memtable unbounded), unless its group has no
    /// prefix or the full is not sorted: then it restores into memory.
    pub fn restore_mapped(&mut self, chain: &[(CheckpointId, StateCapture)]) -> Result<()> {
        self.restore_from(chain, true, &[])
    }

    /// As [`Self::restore_mapped`], with the pages each of the chain's
    /// files lies in (one entry a file, `None` if not known): the runs the
    /// table takes keep them, so the table can release what its reads
    /// bring into the resident set ([`Self::release_pages`]); the pages the
    /// restore itself read are released when it is done.
    pub fn restore_mapped_with_pages(
        &mut self,
        chain: &[(CheckpointId, StateCapture)],
        pages: &[Option<Arc<dyn Pages>>],
    ) -> Result<()> {
        if pages.len() != chain.len() {
            return Err(Error::Config(format!(
                "a restore got the pages of {} files for a chain of {}: pass one entry (or \
                 None) per file",
                pages.len(),
                chain.len()
            )));
        }
        let restored = self.restore_from(chain, true, pages);
        pages.iter().flatten().for_each(|p| p.release());
        restored
    }

    fn restore_from(
        &mut self,
        chain: &[(CheckpointId, StateCapture)],
        mapped: bool,
        pages: &[Option<Arc<dyn Pages>>],
    ) -> Result<()> {
        let Some(((first_id, first), rest)) = chain.split_first() else {
            return Err(Error::Snapshot(
                "state restore needs a chain starting with a full capture; got an empty chain"
                    .into(),
            ));
        };
        if first.kind != StateKind::Full {
            return Err(Error::Snapshot(format!(
                "state restore chain must start with a full capture; checkpoint {first_id} is {:?}",
                first.kind
            )));
        }
        self.clear();
        if mapped {
            self.open_lazily()?;
        } else {
            self.close_lazy();
        }
        self.restoring = true;
        let replayed = self.replay(*first_id, first, rest, mapped, pages);
        self.restoring = false;
        let prev = replayed?;
        self.reset_tracking();
        self.last_checkpoint = Some(prev);
        self.diffs_since_full = rest.len() as u32;
        self.force_full = false;
        if let Some(confirm) = self.confirm.as_mut() {
            // The restored checkpoint is stored: a base.
            *confirm = Confirm {
                confirmed: Some((prev, rest.len() as u32)),
                unconfirmed: Vec::new(),
            };
        }
        Ok(())
    }

    /// Applies the captures of a chain; returns the last id.
    fn replay(
        &mut self,
        first_id: CheckpointId,
        first: &StateCapture,
        rest: &[(CheckpointId, StateCapture)],
        mapped: bool,
        pages: &[Option<Arc<dyn Pages>>],
    ) -> Result<CheckpointId> {
        let page = |i: usize| pages.get(i).cloned().flatten();
        let adopted = self.spill.is_some() && self.adopt_base(&first.batch, mapped, page(0))?;
        if !adopted {
            self.close_lazy();
            // Its times are noted in one sweep once it is in, not a row at a
            // time as it goes in.
            let time = self.time.take();
            let applied = self.apply(&first.batch, false);
            self.time = time;
            applied?;
        }
        if self.time.is_some() {
            let what = format!("the time index of checkpoint {first_id}'s full");
            if !self.take_stored_times(first, mapped, &what)? {
                let arrays = self.columns_of(&first.batch)?;
                self.note_base_times(&arrays)?;
            }
        }
        let mut prev = first_id;
        // A mapped chain's diffs become runs as they are while they can; from
        // the first that cannot on, they go through the memtable.
        let mut adopting = mapped && self.spill.is_some();
        for (i, (id, capture)) in rest.iter().enumerate() {
            match capture.kind {
                StateKind::Diff { base } if base == prev => {
                    let what = format!("the state diff of checkpoint {id}");
                    adopting = adopting
                        && self.adopt_diff(
                            &capture.batch,
                            capture.filter.as_deref(),
                            &what,
                            page(i + 1),
                        )?;
                    if !adopting {
                        self.apply(&capture.batch, true)?;
                    }
                }
                kind => {
                    return Err(Error::Snapshot(format!(
                        "state restore chain broken at checkpoint {id}: expected a diff based on \
                         {prev}, found {kind:?}"
                    )))
                }
            }
            prev = *id;
        }
        Ok(prev)
    }

    /// Applies one stored batch: a full one (plain upserts) or a diff (upserts
    /// and `__deleted` tombstones).
    pub fn apply(&mut self, batch: &RecordBatch, diff: bool) -> Result<()> {
        if !diff {
            return self.upsert(batch);
        }
        let deleted = batch
            .column_by_name(DELETED_COLUMN)
            .and_then(|c| c.as_any().downcast_ref::<BooleanArray>())
            .ok_or_else(|| {
                Error::Snapshot(format!(
                    "diff batch lacks a boolean '{DELETED_COLUMN}' column (columns: {})",
                    column_names(batch.schema_ref())
                ))
            })?;
        // A null `__deleted` counts as an upsert, never as a silent delete.
        let tombstone: BooleanArray = deleted.iter().map(|v| Some(v == Some(true))).collect();
        let upsert: BooleanArray = deleted.iter().map(|v| Some(v != Some(true))).collect();
        let removed = filter_record_batch(batch, &tombstone).map_err(arrow_err)?;
        let upsert = filter_record_batch(batch, &upsert).map_err(arrow_err)?;
        let key = self.key_column().to_string();
        if let Some(keys) = removed.column_by_name(&key) {
            self.delete(keys.as_ref())?;
        }
        self.upsert(&upsert)
    }

    /// Removes every key and all change tracking.
    pub fn clear(&mut self) {
        self.clear_runs();
        self.drop_pending();
        self.index.clear();
        for c in &mut self.columns {
            c.resize(0);
        }
        self.occupied.clear();
        self.free.clear();
        self.log.reset();
        self.tombstones.drain();
        if let Some(g) = self.group.as_mut() {
            g.clear();
        }
        self.clear_time_index();
    }

    fn reset_tracking(&mut self) {
        self.log.clear();
        self.tombstones.drain();
        self.drop_pending();
    }

    /// Empties the memtable after a flush (its rows are in a run), giving
    /// its memory back rather than keeping the capacity.
    fn empty_memtable(&mut self) {
        self.index = self.key_type.new_index();
        self.columns = self
            .schema
            .fields()
            .iter()
            .map(|f| new_column(f.data_type(), f.is_nullable()).expect("checked supported"))
            .collect();
        self.occupied = Vec::new();
        self.free = Vec::new();
        self.log = ChangeLog::new(&self.schema);
        self.tombstones.drain();
        if let Some(g) = self.group.as_mut() {
            g.clear();
        }
    }

    fn grow(&mut self, len: usize) {
        if len <= self.occupied.len() {
            return;
        }
        // Amortised doubling for every column at once.
        let cap = len.max(self.occupied.len() * 2).max(16);
        if cap > self.occupied.capacity() {
            self.occupied.reserve(cap - self.occupied.len());
        }
        self.occupied.resize(len, false);
        self.log.grow(len);
        for c in &mut self.columns {
            c.resize(len);
        }
    }

    fn live_slots(&self) -> Vec<u32> {
        (0..self.occupied.len() as u32)
            .filter(|&s| self.occupied[s as usize])
            .collect()
    }

    fn gather(&self, slots: &[u32]) -> RecordBatch {
        let arrays: Vec<ArrayRef> = self.columns.iter().map(|c| c.gather(slots)).collect();
        RecordBatch::try_new(self.schema.clone(), arrays).expect("columns match the schema")
    }

    /// `upserts` are positions in `columns` (the change log's or the table's).
    fn diff_batch(
        &self,
        columns: &[Box<dyn Column>],
        upserts: &[u32],
        tombstones: &[Key],
    ) -> RecordBatch {
        let n = upserts.len() + tombstones.len();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len() + 1);
        for (i, c) in columns.iter().enumerate() {
            let up = c.gather(upserts);
            let dead = if i == self.key_col {
                self.key_type.array(tombstones)
            } else {
                new_null_array(up.data_type(), tombstones.len())
            };
            let array = if tombstones.is_empty() {
                up
            } else {
                arrow_select::concat::concat(&[up.as_ref(), dead.as_ref()]).expect("same types")
            };
            arrays.push(array);
        }
        let deleted: BooleanArray = (0..n).map(|i| Some(i >= upserts.len())).collect();
        arrays.push(Arc::new(deleted));
        RecordBatch::try_new(self.diff_schema.clone(), arrays)
            .expect("columns match the diff schema")
    }

    /// The batch's arrays in schema order, checked by name and type.
    fn columns_of(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        let mut by_name: HashMap<&str, usize> = HashMap::new();
        for (i, f) in batch.schema_ref().fields().iter().enumerate() {
            by_name.insert(f.name().as_str(), i);
        }
        let mut out = Vec::with_capacity(self.schema.fields().len());
        for f in self.schema.fields() {
            let Some(&i) = by_name.get(f.name().as_str()) else {
                return Err(Error::Config(format!(
                    "batch has no column '{}' (batch columns: {}; state schema: {})",
                    f.name(),
                    column_names(batch.schema_ref()),
                    column_names(&self.schema)
                )));
            };
            let array = batch.column(i);
            if array.data_type() != f.data_type() {
                return Err(Error::Config(format!(
                    "column '{}' has type {}, the state schema says {}; cast it first",
                    f.name(),
                    array.data_type(),
                    f.data_type()
                )));
            }
            if !f.is_nullable() && array.null_count() > 0 {
                return Err(Error::Config(format!(
                    "column '{}' holds {} null(s) but is not nullable in the state schema",
                    f.name(),
                    array.null_count()
                )));
            }
            out.push(array.clone());
        }
        Ok(out)
    }
}

pub(crate) fn column_names(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn arrow_err(e: arrow_schema::ArrowError) -> Error {
    Error::Snapshot(format!("malformed state batch: {e}"))
}
