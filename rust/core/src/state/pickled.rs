//! The checkpointed side of a keyed process, free of Python: each key's
//! pickled state kept in a [`StateTable`] (key column + binary `state`), so
//! that a checkpoint writes only the keys whose function ran since the
//! previous one (upserts, plus `__deleted` tombstones for dropped keys) and
//! every `full_every`-th time the whole table — the same rules as the
//! built-in keyed aggregates: the first checkpoint, the first after a
//! restore and the first after an aborted one are full.
//!
//! Keeping the pickles (not only the live Python objects) costs memory but
//! makes a full capture a copy of bytes instead of a pickle of every key
//! under the GIL.
//!
//! Under a memory budget ([`PickledState::set_memory_budget`]) the table is
//! the only copy of the state: it spills past the budget to sorted runs,
//! the process looks a batch's keys up in it ([`PickledState::lookup`]),
//! writes their new pickles back after the calls ([`PickledState::write`]),
//! and a restore opens the stored runs lazily ([`PickledState::restore_runs`]).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{StateCapture, StateKind};
use crate::state::{RunSink, SpillStats, StatePolicy, StateTable, StreamedCapture, DELETED_COLUMN};
use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema};

/// Name of the column holding each key's pickled state.
pub const STATE_COLUMN: &str = "state";

/// A grouping key: integers and strings (what `key_by` columns hold).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Int(i64),
    Str(String),
}

/// A key and its pickled state.
pub type Pickled = (Key, Vec<u8>);

/// What changed since the last checkpoint: new pickles, and dropped keys.
pub type Changes = (Vec<Pickled>, Vec<Key>);

/// Makes the run sink of each table a budgeted state makes (the runtime's:
/// a directory of its own under the job's spill directory).
pub type RunSinks = Box<dyn Fn() -> Result<Box<dyn RunSink>> + Send>;

/// A memory budget in bytes and where the table's runs go past it.
struct Budget {
    bytes: usize,
    sinks: RunSinks,
}

/// Pickled state per key, with the changes since the last checkpoint.
pub struct PickledState {
    key: String,
    full_every: u32,
    budget: Option<Budget>,
    /// Created once the key type is known (first batch or a non-empty restore).
    table: Option<StateTable>,
}

impl PickledState {
    /// State keyed by column `key`; every checkpoint is full until
    /// [`Self::set_full_every`] says otherwise (as for the aggregates).
    pub fn new(key: &str) -> Result<Self> {
        if key == STATE_COLUMN || key == DELETED_COLUMN {
            return Err(Error::Config(format!(
                "a keyed process cannot be keyed by a column named {key:?}: its state file \
                 uses that name; rename the column before key_by"
            )));
        }
        Ok(Self {
            key: key.to_string(),
            full_every: 1,
            budget: None,
            table: None,
        })
    }

    /// Keeps at most about `bytes` of pickles in memory, the rest in sorted
    /// runs that `sinks` keep (`StateTable::with_memory_budget`). Set before
    /// the first batch or restore; a budget below the table's minimum is
    /// refused here, naming both.
    pub fn set_memory_budget(&mut self, bytes: usize, sinks: RunSinks) -> Result<()> {
        if self.table.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(Error::Config(
                "a keyed process's memory budget is set before its first batch or restore".into(),
            ));
        }
        crate::state::check_memory_budget(bytes)?;
        self.budget = Some(Budget { bytes, sinks });
        self.table = None;
        Ok(())
    }

    /// Whether a memory budget is set: the table is then the only copy of
    /// the state (module docs).
    pub fn spills(&self) -> bool {
        self.budget.is_some()
    }

    /// What the budgeted table's spilling did so far (`None` without a
    /// budget or before the key type is known).
    pub fn spill_stats(&self) -> Option<SpillStats> {
        self.budget.as_ref()?;
        self.table.as_ref().and_then(StateTable::spill_stats)
    }

    /// The pickles of `keys`, in the order asked; null where a key has no
    /// state. Empty nulls before the key type is known.
    pub fn lookup(&self, keys: &[&Key]) -> Result<BinaryArray> {
        let Some(table) = &self.table else {
            return Ok(BinaryArray::new_null(keys.len()));
        };
        let string = Self::is_string(table);
        let keys = keys_array(&self.key, string, &mut keys.iter().copied())?;
        let (rows, _) = table.lookup(keys.as_ref())?;
        let state = rows
            .column_by_name(STATE_COLUMN)
            .ok_or_else(|| Error::Task("keyed state lookup returned no state column".into()))?;
        Ok(state.as_binary::<i32>().clone())
    }

    /// Records new pickles and dropped keys (the key type must be known:
    /// [`Self::use_key_type`]); the next checkpoint captures them. A budgeted
    /// table takes a large write a slice at a time (`StateTable::upsert`).
    pub fn write(&mut self, upserts: &[Pickled], dropped: &[Key]) -> Result<()> {
        self.write_hinted(upserts, None, dropped)
    }

    /// As [`Self::write`], where every key was just asked of
    /// [`Self::lookup`] with nothing written since, and `present[i]` says
    /// whether `upserts[i]`'s key had state: the table then knows which new
    /// keys its runs hold without searching them again
    /// (`StateTable::upsert_looked_up`).
    pub fn write_looked_up(
        &mut self,
        upserts: &[Pickled],
        present: &[bool],
        dropped: &[Key],
    ) -> Result<()> {
        if present.len() != upserts.len() {
            return Err(Error::Task(format!(
                "keyed state write: {} presence flags for {} pickles",
                present.len(),
                upserts.len()
            )));
        }
        self.write_hinted(upserts, Some(present), dropped)
    }

    fn write_hinted(
        &mut self,
        upserts: &[Pickled],
        present: Option<&[bool]>,
        dropped: &[Key],
    ) -> Result<()> {
        let string = self.string_keys().ok_or_else(|| {
            Error::Task("keyed state changed before its key type was known".into())
        })?;
        let upsert_keys = keys_array(&self.key, string, &mut upserts.iter().map(|(k, _)| k))?;
        let dropped_keys = keys_array(&self.key, string, &mut dropped.iter())?;
        let table = self.table.as_mut().expect("key type known");
        if !upserts.is_empty() {
            let blobs: ArrayRef = Arc::new(BinaryArray::from_iter_values(
                upserts.iter().map(|(_, b)| b.as_slice()),
            ));
            let batch = RecordBatch::try_new(table.schema(), vec![upsert_keys, blobs])
                .map_err(|e| Error::Task(format!("keyed state batch: {e}")))?;
            match present {
                // Upserted before the deletes: nothing written in between.
                Some(p) => table.upsert_looked_up(&batch, &BooleanArray::from(p.to_vec()))?,
                None => table.upsert(&batch)?,
            }
        }
        if !dropped.is_empty() {
            table.delete(dropped_keys.as_ref())?;
        }
        Ok(())
    }

    pub fn set_full_every(&mut self, full_every: u32) -> Result<()> {
        let full_every = full_every.max(1);
        if full_every == self.full_every {
            return Ok(());
        }
        self.full_every = full_every;
        if let Some(old) = self.table.take() {
            // The policy is fixed per table: move the rows into a new one
            // (whose first checkpoint is then full, always a safe choice).
            let mut table = self.new_table(Self::is_string(&old))?;
            table.upsert(&old.to_batch())?;
            self.table = Some(table);
        }
        Ok(())
    }

    /// Whether keys are strings; `None` until known.
    pub fn string_keys(&self) -> Option<bool> {
        self.table.as_ref().map(Self::is_string)
    }

    /// Fixes the key type on first use; a later batch must keep it.
    pub fn use_key_type(&mut self, string: bool) -> Result<()> {
        match self.string_keys() {
            None => {
                self.table = Some(self.new_table(string)?);
                Ok(())
            }
            Some(s) if s == string => Ok(()),
            Some(s) => Err(Error::Task(format!(
                "key column {:?} changed from {} to {} keys between batches; keep one key type \
                 (cast the column before key_by)",
                self.key,
                kind_name(s),
                kind_name(string)
            ))),
        }
    }

    /// The synchronous phase of checkpoint `id`: records the new pickles of
    /// the keys changed since the last checkpoint and the keys dropped, then
    /// captures a diff of just those (or the whole table when a full one is due).
    pub fn checkpoint(
        &mut self,
        id: CheckpointId,
        upserts: &[Pickled],
        dropped: &[Key],
    ) -> Result<StateCapture> {
        if self.table.is_none() {
            if upserts.is_empty() && dropped.is_empty() {
                return self.empty_capture();
            }
            return Err(Error::Task(
                "keyed state changed before its key type was known".into(),
            ));
        }
        self.write(upserts, dropped)?;
        self.table.as_mut().expect("key type known").checkpoint(id)
    }

    /// As [`Self::checkpoint`] with nothing to record (a budgeted state
    /// writes its changes as batches run), leaving a spilled table's
    /// capture as its runs for the store to merge as it writes the file.
    pub fn checkpoint_streamed(&mut self, id: CheckpointId) -> Result<StreamedCapture> {
        match self.table.as_mut() {
            Some(table) => table.checkpoint_streamed(id),
            None => self.empty_capture().map(|c| StreamedCapture {
                kind: c.kind,
                rows: crate::state::CaptureRows::Batch(c.batch),
            }),
        }
    }

    /// No batch yet and nothing restored: an empty full capture (the
    /// table's own first checkpoint will be full again).
    fn empty_capture(&self) -> Result<StateCapture> {
        let batch = self.new_table(false)?.to_batch();
        Ok(StateCapture {
            kind: StateKind::Full,
            batch,
            filter: None,
            times: None,
        })
    }

    /// Checkpoint `id` completed: later diffs may be based on it.
    pub fn committed(&mut self, id: CheckpointId) {
        if let Some(t) = &mut self.table {
            t.checkpoint_committed(id);
        }
    }

    /// A checkpoint was aborted: its diff was never stored, so the next
    /// capture must be full to stay restorable.
    pub fn abort(&mut self) {
        if let Some(t) = &mut self.table {
            t.checkpoint_aborted();
        }
    }

    /// Replaces the state with the end of `chain` (a full capture, then
    /// diffs oldest first); returns the rows `(key, state)` to unpickle, or
    /// `None` if there are none or the state is budgeted (the table is then
    /// the state). The next checkpoint is full.
    pub fn restore(&mut self, chain: &[StateCapture]) -> Result<Option<RecordBatch>> {
        let Some((first, rest)) = chain.split_first() else {
            self.table = None;
            return Ok(None);
        };
        if first.kind != StateKind::Full {
            return Err(Error::Snapshot(format!(
                "keyed state restore chain must start with a full capture, not {:?}",
                first.kind
            )));
        }
        let mut last_base = None;
        for c in rest {
            match c.kind {
                StateKind::Diff { base } if last_base.is_none_or(|b| base > b) => {
                    last_base = Some(base)
                }
                kind => {
                    return Err(Error::Snapshot(format!(
                        "keyed state restore chain must continue with diffs on increasing \
                         bases; found {kind:?} after base {last_base:?}"
                    )))
                }
            }
        }
        let string = self.key_type_of(&first.batch)?;
        let mut table = self.new_table(string)?;
        let bad = |e: Error| Error::Snapshot(format!("restoring keyed state: {e}"));
        table.apply(&first.batch, false).map_err(bad)?;
        for c in rest {
            table.apply(&c.batch, true).map_err(bad)?;
        }
        if table.is_empty() {
            // Nothing to restore: leave the key type to the first batch.
            self.table = None;
            return Ok(None);
        }
        let rows = (!self.spills()).then(|| table.to_batch());
        self.table = Some(table);
        Ok(rows)
    }

    /// A budgeted state restored from a store's runs (mapped state files: a
    /// full, then diffs, each with the checkpoint it ends at), opened lazily:
    /// lookups read the pages of the keys they touch, nothing is rebuilt,
    /// and the next checkpoint is a diff on the restored one.
    pub fn restore_runs(&mut self, runs: &[(CheckpointId, StateCapture)]) -> Result<()> {
        if !self.spills() {
            return Err(Error::Snapshot(
                "a keyed process without a memory budget restores from one full capture, not \
                 runs"
                    .into(),
            ));
        }
        let Some((_, first)) = runs.first() else {
            self.table = None;
            return Ok(());
        };
        if runs.iter().all(|(_, c)| c.batch.num_rows() == 0) {
            // Captured before a first batch: its placeholder key type must
            // not fix the table's.
            self.table = None;
            return Ok(());
        }
        let mut table = self.new_table(self.key_type_of(&first.batch)?)?;
        table
            .restore_mapped(runs)
            .map_err(|e| Error::Snapshot(format!("restoring keyed state: {e}")))?;
        self.table = Some(table);
        Ok(())
    }

    /// Whether a stored state's keys are strings (its key column's type).
    fn key_type_of(&self, batch: &RecordBatch) -> Result<bool> {
        let schema = batch.schema();
        let key_col = batch.column_by_name(&self.key).ok_or_else(|| {
            Error::Snapshot(format!(
                "keyed state has no key column {:?} (columns: {:?}); was it written by \
                 another job?",
                self.key,
                schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
            ))
        })?;
        match key_col.data_type() {
            DataType::Int64 => Ok(false),
            DataType::Utf8 => Ok(true),
            other => Err(Error::Snapshot(format!(
                "keyed state key column {:?} has type {other}; expected int64 or utf8",
                self.key
            ))),
        }
    }

    fn new_table(&self, string: bool) -> Result<StateTable> {
        let key_type = if string {
            DataType::Utf8
        } else {
            DataType::Int64
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new(&self.key, key_type, false),
            Field::new(STATE_COLUMN, DataType::Binary, false),
        ]));
        let mut table = StateTable::new(
            schema,
            &self.key,
            StatePolicy {
                full_every: self.full_every,
            },
        )?;
        // Several checkpoints may be in flight: diff against the newest one
        // known to be stored, never against one that may still be aborted.
        table.confirm_bases();
        match &self.budget {
            Some(b) => table.with_memory_budget(b.bytes, (b.sinks)()?),
            None => Ok(table),
        }
    }

    fn is_string(table: &StateTable) -> bool {
        table
            .schema()
            .field_with_name(table.key_column())
            .is_ok_and(|f| f.data_type() == &DataType::Utf8)
    }
}

fn kind_name(string: bool) -> &'static str {
    if string {
        "string"
    } else {
        "integer"
    }
}

fn keys_array(name: &str, string: bool, keys: &mut dyn Iterator<Item = &Key>) -> Result<ArrayRef> {
    let mismatch = |k: &Key| {
        Error::Task(format!(
            "key {k:?} of column {name:?} is not a {} key",
            kind_name(string)
        ))
    };
    Ok(if string {
        let v: Vec<&str> = keys
            .map(|k| match k {
                Key::Str(s) => Ok(s.as_str()),
                other => Err(mismatch(other)),
            })
            .collect::<Result<_>>()?;
        Arc::new(StringArray::from(v))
    } else {
        let v: Vec<i64> = keys
            .map(|k| match k {
                Key::Int(i) => Ok(*i),
                other => Err(mismatch(other)),
            })
            .collect::<Result<_>>()?;
        Arc::new(Int64Array::from(v))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::protocol::ProtocolKind;
    use crate::runtime::InMemorySnapshots;
    use crate::snapshot::{CheckpointMeta, SnapshotSink, TaskId, TaskSnapshot};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    use super::*;

    fn ints(batch: &RecordBatch, col: &str) -> Vec<i64> {
        batch
            .column_by_name(col)
            .unwrap()
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    }

    fn deleted(batch: &RecordBatch) -> Vec<bool> {
        let d = batch.column_by_name(DELETED_COLUMN).unwrap().as_boolean();
        (0..d.len()).map(|i| d.value(i)).collect()
    }

    fn blob(v: i64) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }

    /// Key → blob of a full state batch.
    fn contents(batch: &RecordBatch) -> BTreeMap<i64, Vec<u8>> {
        let b = batch
            .column_by_name(STATE_COLUMN)
            .unwrap()
            .as_binary::<i32>();
        ints(batch, "k")
            .into_iter()
            .enumerate()
            .map(|(i, k)| (k, b.value(i).to_vec()))
            .collect()
    }

    /// Checkpoint `id`, then confirm it (the job committed it).
    fn cp(
        s: &mut PickledState,
        id: CheckpointId,
        upserts: &[Pickled],
        dropped: &[Key],
    ) -> StateCapture {
        let c = s.checkpoint(id, upserts, dropped).unwrap();
        s.committed(id);
        c
    }

    fn up(keys: &[i64], v: i64) -> Vec<Pickled> {
        keys.iter().map(|&k| (Key::Int(k), blob(v))).collect()
    }

    #[test]
    fn diffs_hold_only_changed_keys_and_tombstones() {
        let mut s = PickledState::new("k").unwrap();
        s.set_full_every(3).unwrap();
        s.use_key_type(false).unwrap();
        let first = cp(&mut s, 1, &up(&(0..100).collect::<Vec<_>>(), 0), &[]);
        assert_eq!(first.kind, StateKind::Full);
        assert_eq!(first.batch.num_rows(), 100);

        let d = cp(&mut s, 2, &up(&[3, 7], 1), &[Key::Int(9)]);
        assert_eq!(d.kind, StateKind::Diff { base: 1 });
        assert_eq!(ints(&d.batch, "k"), vec![3, 7, 9]);
        assert_eq!(deleted(&d.batch), vec![false, false, true]);
        let names: Vec<_> = d
            .batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["k", "state", DELETED_COLUMN]);

        // Nothing changed: an empty diff.
        let e = cp(&mut s, 3, &[], &[]);
        assert_eq!(e.kind, StateKind::Diff { base: 2 });
        assert_eq!(e.batch.num_rows(), 0);

        // The third after a full is full again, without the dropped key.
        let f = cp(&mut s, 4, &up(&[5], 2), &[]);
        assert_eq!(f.kind, StateKind::Full);
        let all = contents(&f.batch);
        assert_eq!(all.len(), 99);
        assert!(!all.contains_key(&9));
        assert_eq!(all[&3], blob(1));
        assert_eq!(all[&5], blob(2));
        assert_eq!(all[&0], blob(0));
    }

    #[test]
    fn a_diff_is_based_on_the_last_confirmed_checkpoint_and_carries_unconfirmed_changes() {
        let mut s = PickledState::new("k").unwrap();
        s.set_full_every(100).unwrap();
        s.use_key_type(false).unwrap();
        // Keys 4..9 stay untouched: the diffs hold under half the keys.
        cp(&mut s, 1, &up(&[1, 2, 3, 4, 5, 6, 7, 8], 0), &[]);
        // Checkpoint 2 is in flight (not confirmed) when 3 is taken.
        let two = s.checkpoint(2, &up(&[1], 1), &[]).unwrap();
        assert_eq!(two.kind, StateKind::Diff { base: 1 });
        let three = s.checkpoint(3, &up(&[2], 2), &[Key::Int(3)]).unwrap();
        assert_eq!(three.kind, StateKind::Diff { base: 1 }, "2 may still abort");
        assert_eq!(ints(&three.batch, "k"), vec![1, 2, 3]);
        assert_eq!(deleted(&three.batch), vec![false, false, true]);
    }

    #[test]
    fn a_key_added_and_dropped_between_checkpoints_leaves_no_trace() {
        let mut s = PickledState::new("k").unwrap();
        s.set_full_every(10).unwrap();
        s.use_key_type(false).unwrap();
        cp(&mut s, 1, &up(&[1], 0), &[]);
        let d = cp(&mut s, 2, &[], &[Key::Int(42)]);
        assert_eq!(d.batch.num_rows(), 0);
    }

    #[test]
    fn abort_and_restore_force_a_full_capture() {
        let mut s = PickledState::new("k").unwrap();
        s.set_full_every(10).unwrap();
        s.use_key_type(false).unwrap();
        cp(&mut s, 1, &up(&[1, 2, 3], 0), &[]);
        assert!(matches!(
            s.checkpoint(2, &up(&[1], 1), &[]).unwrap().kind,
            StateKind::Diff { base: 1 }
        ));
        s.abort();
        let f = cp(&mut s, 3, &up(&[2], 1), &[]);
        assert_eq!(f.kind, StateKind::Full);
        assert_eq!(
            contents(&f.batch)[&1],
            blob(1),
            "the aborted diff's change is kept"
        );

        let mut r = PickledState::new("k").unwrap();
        r.set_full_every(10).unwrap();
        let rows = r.restore(std::slice::from_ref(&f)).unwrap().unwrap();
        assert_eq!(contents(&rows), contents(&f.batch));
        let next = cp(&mut r, 4, &up(&[3], 5), &[]);
        assert_eq!(
            next.kind,
            StateKind::Full,
            "first capture after restore is full"
        );
    }

    #[test]
    fn restore_replays_a_chain_of_full_and_diffs() {
        let mut s = PickledState::new("k").unwrap();
        s.set_full_every(100).unwrap();
        s.use_key_type(false).unwrap();
        // Keys 10..20 stay untouched, so c2 and c3 are diffs.
        let first: Vec<i64> = [1, 2, 3].into_iter().chain(10..20).collect();
        let c1 = cp(&mut s, 1, &up(&first, 0), &[]);
        let c2 = cp(&mut s, 2, &up(&[2], 1), &[Key::Int(3)]);
        let c3 = cp(&mut s, 3, &up(&[4], 2), &[Key::Int(1)]);
        assert_eq!(
            [c2.kind, c3.kind],
            [2, 3].map(|id| StateKind::Diff { base: id - 1 })
        );
        let mut r = PickledState::new("k").unwrap();
        let rows = r
            .restore(&[c1.clone(), c2.clone(), c3.clone()])
            .unwrap()
            .unwrap();
        let mut want = BTreeMap::from([(2, blob(1)), (4, blob(2))]);
        want.extend((10..20).map(|k| (k, blob(0))));
        assert_eq!(contents(&rows), want);
        // Out of order or missing the full: refused with a clear error.
        let err = r
            .restore(&[c2.clone(), c3.clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("must start with a full capture"), "{err}");
        let err = r.restore(&[c1, c3, c2]).unwrap_err().to_string();
        assert!(err.contains("increasing bases"), "{err}");
    }

    #[test]
    fn key_type_is_fixed_and_reserved_names_are_refused() {
        let mut s = PickledState::new("k").unwrap();
        s.use_key_type(true).unwrap();
        let err = s.use_key_type(false).unwrap_err().to_string();
        assert!(err.contains("changed from string to integer"), "{err}");
        let c = cp(&mut s, 1, &[(Key::Str("a".into()), vec![1])], &[]);
        assert_eq!(c.batch.schema().field(0).data_type(), &DataType::Utf8);
        for name in [STATE_COLUMN, DELETED_COLUMN] {
            let err = PickledState::new(name).err().unwrap().to_string();
            assert!(err.contains("rename the column"), "{err}");
        }
    }

    #[test]
    fn in_memory_snapshots_rebuild_the_diffs_to_full_state() {
        let sink = InMemorySnapshots::new();
        let task = TaskId {
            vertex: "keyed".into(),
            subtask: 0,
        };
        let mut s = PickledState::new("k").unwrap();
        s.set_full_every(100).unwrap();
        s.use_key_type(false).unwrap();
        // Keys 10..20 stay untouched: each later capture changes under half
        // the keys, so it is a diff (`full_beats_diff`).
        let first: Vec<i64> = [1, 2, 3].into_iter().chain(10..20).collect();
        let steps: [Changes; 3] = [
            (up(&first, 0), vec![]),
            (up(&[2], 1), vec![Key::Int(3)]),
            (up(&[5], 2), vec![Key::Int(1)]),
        ];
        for (i, (upserts, dropped)) in steps.iter().enumerate() {
            let id = i as u64 + 1;
            let state = cp(&mut s, id, upserts, dropped);
            assert_eq!(state.kind == StateKind::Full, id == 1);
            sink.task_snapshot(
                id,
                TaskSnapshot {
                    task: task.clone(),
                    state: Some(state),
                    state_runs: None,
                    channels: vec![],
                    source_offset: None,
                    alignment_nanos: 0,
                    sent_seq: Vec::new(),
                    taken_seq: Vec::new(),
                },
            )
            .unwrap();
            sink.commit(CheckpointMeta {
                id,
                protocol: ProtocolKind::Aligned,
                started_ms: 0,
                finished_ms: 0,
                graph_fingerprint: String::new(),
                savepoint: false,
            })
            .unwrap();
        }
        let last = sink.latest().unwrap();
        let state = last.tasks[&task].state.clone().unwrap();
        assert_eq!(state.kind, StateKind::Full);
        let mut want = BTreeMap::from([(2, blob(1)), (5, blob(2))]);
        want.extend((10..20).map(|k| (k, blob(0))));
        assert_eq!(contents(&state.batch), want);
    }

    /// A budgeted state over runs kept in memory.
    fn budgeted() -> PickledState {
        let mut s = PickledState::new("k").unwrap();
        s.set_full_every(100).unwrap();
        s.set_memory_budget(
            crate::state::MIN_STATE_MEMORY,
            Box::new(|| Ok(Box::new(crate::state::InMemoryRuns) as Box<dyn RunSink>)),
        )
        .unwrap();
        s.use_key_type(false).unwrap();
        s
    }

    fn big(keys: std::ops::Range<i64>, v: u8) -> Vec<Pickled> {
        keys.map(|k| (Key::Int(k), vec![v; 4096])).collect()
    }

    fn looked_up(s: &PickledState, keys: &[i64]) -> Vec<Option<Vec<u8>>> {
        let keys: Vec<Key> = keys.iter().map(|&k| Key::Int(k)).collect();
        let found = s.lookup(&keys.iter().collect::<Vec<_>>()).unwrap();
        (0..found.len())
            .map(|i| found.is_valid(i).then(|| found.value(i).to_vec()))
            .collect()
    }

    #[test]
    fn a_budgeted_state_spills_looks_up_and_restores_from_its_runs() {
        let mut s = budgeted();
        assert!(s.spills());
        // 1,000 pickles of 4 KB, four times the budget, in writes of 100.
        for start in (0..1000).step_by(100) {
            s.write(&big(start..start + 100, 1), &[]).unwrap();
        }
        let stats = s.spill_stats().unwrap();
        assert!(stats.flushes >= 2, "{stats:?}");
        let full = s.checkpoint(1, &[], &[]).unwrap();
        s.committed(1);
        assert_eq!((full.kind, full.batch.num_rows()), (StateKind::Full, 1000));
        // Keys 10..20 were looked up first (all present); 5000 never was.
        assert!(looked_up(&s, &(10..20).collect::<Vec<_>>())
            .iter()
            .all(Option::is_some));
        let err = s
            .write_looked_up(&big(10..20, 2), &[true], &[])
            .unwrap_err();
        assert!(
            err.to_string().contains("1 presence flags for 10 pickles"),
            "{err}"
        );
        s.write_looked_up(&big(10..20, 2), &[true; 10], &[Key::Int(3), Key::Int(5000)])
            .unwrap();
        let diff = s.checkpoint(2, &[], &[]).unwrap();
        s.committed(2);
        assert_eq!(diff.kind, StateKind::Diff { base: 1 });
        let mut keys = ints(&diff.batch, "k");
        keys.sort_unstable();
        assert_eq!(keys, [3].into_iter().chain(10..20).collect::<Vec<_>>());
        assert_eq!(
            looked_up(&s, &[0, 3, 12, 5000]),
            [Some(vec![1; 4096]), None, Some(vec![2; 4096]), None]
        );

        // A new state opens the two captures as its runs (sorted as the
        // store writes a budgeted job's files) and answers the same.
        let sorted = |c: &StateCapture| {
            let keys = ints(&c.batch, "k");
            let mut order: Vec<u32> = (0..keys.len() as u32).collect();
            order.sort_by_key(|&i| keys[i as usize]);
            let order = arrow_array::UInt32Array::from(order);
            StateCapture {
                kind: c.kind,
                batch: arrow_select::take::take_record_batch(&c.batch, &order).unwrap(),
                filter: None,
                times: None,
            }
        };
        let mut again = budgeted();
        again
            .restore_runs(&[(1, sorted(&full)), (2, sorted(&diff))])
            .unwrap();
        let stats = again.spill_stats().unwrap();
        assert_eq!(
            (stats.bases_mapped, stats.diffs_mapped),
            (1, 1),
            "{stats:?}"
        );
        assert_eq!(
            looked_up(&again, &[0, 3, 12, 5000]),
            [Some(vec![1; 4096]), None, Some(vec![2; 4096]), None]
        );
        // Its next capture is a diff on the checkpoint restored.
        again.write(&big(7..8, 3), &[]).unwrap();
        let next = again.checkpoint(3, &[], &[]).unwrap();
        assert_eq!(next.kind, StateKind::Diff { base: 2 });
        assert_eq!(ints(&next.batch, "k"), vec![7]);

        // Without a budget, runs are refused; with one, set after rows is too.
        let err = PickledState::new("k")
            .unwrap()
            .restore_runs(&[(1, full.clone())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("without a memory budget"), "{err}");
        let err = again
            .set_memory_budget(1 << 20, Box::new(|| unreachable!()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("before its first batch"), "{err}");
        let err = PickledState::new("k")
            .unwrap()
            .set_memory_budget(1000, Box::new(|| unreachable!()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("minimum"), "{err}");
    }
}
