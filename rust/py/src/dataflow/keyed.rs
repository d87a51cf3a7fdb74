//! Keyed state held by a Python function, Spark `applyInPandasWithState`
//! style: per batch and per key, `fn(key, rows_of_that_key, state) ->
//! (output | None, new_state)`; `new_state = None` drops the key. The GIL is
//! taken once per batch. State is checkpointed incrementally as Arrow: the
//! key column plus the pickled state of the keys whose function ran since the
//! previous checkpoint, with `__deleted` tombstones for dropped keys
//! (`StateKind::Diff`), and every `full_every`-th time every key
//! (`StateKind::Full`); see [`snapcut_core::state::pickled`].
//!
//! A key counts as changed when the function was called for it: a state
//! object mutated in place by a call is re-pickled, one changed from outside
//! the function (shared between keys) is not.
//!
//! Under a memory budget (`Checkpointing(state_memory=)`) the pickles are
//! the state, as Spark's `applyInPandasWithState` keeps it: a batch's keys
//! are looked up in the spilling table together, unpickled for their calls
//! and pickled back after them, [`STEP_KEYS`] keys at a time, so no Python
//! object outlives its step; a restart opens the stored runs lazily.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::DataType;
use arrow_select::take::take_record_batch;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use snapcut_core::operator::{Batch, Emitter, Operator, OperatorFactory, TaskState};
use snapcut_core::protocol::{CheckpointId, InputId};
use snapcut_core::runtime::StateMemory;
use snapcut_core::snapshot::StateCapture;
use snapcut_core::state::{RunSink, SpillStats};
use snapcut_core::store::LocalRuns;
use snapcut_core::{Error, Result};

use super::convert::{batches_from_py, task_error, to_pyarrow};
use snapcut_core::state::pickled::{Changes, Key, Pickled, PickledState, STATE_COLUMN};

/// Keys a budgeted process calls its function for before their new states
/// go back into the table: bounds the Python objects alive at once, so one
/// batch may touch far more keys than the budget holds.
const STEP_KEYS: usize = 16_384;

/// A budgeted step's calls: outputs, new pickles, whether each of their keys
/// had state, and the keys dropped.
type StepCalls = (Vec<RecordBatch>, Vec<Pickled>, Vec<bool>, Vec<Key>);

/// The function's `(output, new_state)`, checked.
fn split_result<'py>(
    result: Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let pair = result.cast::<PyTuple>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(
            "a keyed process function must return a tuple (output, new_state)",
        )
    })?;
    if pair.len() != 2 {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "a keyed process function must return (output, new_state), got {} values",
            pair.len()
        )));
    }
    Ok((pair.get_item(0)?, pair.get_item(1)?))
}

fn key_to_py<'py>(key: &Key, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match key {
        Key::Int(v) => v.into_pyobject(py)?.into_any(),
        Key::Str(s) => s.into_pyobject(py)?.into_any(),
    })
}

/// The keys of a key column, which must hold no nulls: a keyed state
/// checkpoint has no place for a null key.
fn keys_of(name: &str, column: &ArrayRef) -> std::result::Result<Vec<Key>, String> {
    if column.null_count() > 0 {
        return Err(format!(
            "key column {name:?} holds {} null(s); every row needs a key: filter the nulls \
             out (or fill them) before key_by",
            column.null_count()
        ));
    }
    macro_rules! ints {
        ($t:ty) => {{
            column
                .as_primitive::<$t>()
                .values()
                .iter()
                .map(|&v| {
                    i64::try_from(v)
                        .map(Key::Int)
                        .map_err(|_| format!("key {v} does not fit in int64"))
                })
                .collect()
        }};
    }
    macro_rules! strs {
        ($a:expr) => {{
            Ok($a
                .iter()
                .flatten()
                .map(|v| Key::Str(v.to_string()))
                .collect())
        }};
    }
    match column.data_type() {
        DataType::Int8 => ints!(Int8Type),
        DataType::Int16 => ints!(Int16Type),
        DataType::Int32 => ints!(Int32Type),
        DataType::Int64 => ints!(Int64Type),
        DataType::UInt8 => ints!(UInt8Type),
        DataType::UInt16 => ints!(UInt16Type),
        DataType::UInt32 => ints!(UInt32Type),
        DataType::UInt64 => ints!(UInt64Type),
        DataType::Utf8 => strs!(column.as_string::<i32>()),
        DataType::LargeUtf8 => strs!(column.as_string::<i64>()),
        DataType::Utf8View => strs!(column.as_string_view()),
        other => Err(format!(
            "key columns must hold integers or strings, not {other}"
        )),
    }
}

/// Makes one [`KeyedProcess`] per subtask.
pub struct KeyedProcessFactory {
    pub name: String,
    pub key: String,
    pub func: Arc<Py<PyAny>>,
}

impl OperatorFactory for KeyedProcessFactory {
    fn create(&self, _subtask: usize, _parallelism: usize) -> Result<Box<dyn Operator>> {
        Ok(Box::new(KeyedProcess {
            name: self.name.clone(),
            key: self.key.clone(),
            func: Arc::clone(&self.func),
            state: HashMap::new(),
            changed: HashSet::new(),
            pickled: PickledState::new(&self.key)?,
        }))
    }
}

struct KeyedProcess {
    name: String,
    key: String,
    func: Arc<Py<PyAny>>,
    /// The live state objects.
    state: HashMap<Key, Py<PyAny>>,
    /// Keys whose function ran since the last checkpoint (live or dropped).
    changed: HashSet<Key>,
    /// What checkpoints are made of: the pickles as of the last checkpoint.
    pickled: PickledState,
}

impl KeyedProcess {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Task(format!("operator '{}': {msg}", self.name))
    }

    /// Row indices per key, keys in order of first appearance.
    fn group(&mut self, batch: &RecordBatch) -> Result<Vec<(Key, Option<UInt32Array>)>> {
        let column = batch.column_by_name(&self.key).ok_or_else(|| {
            self.err(format!(
                "key column {:?} is not in the batch (columns: {:?})",
                self.key,
                batch
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            ))
        })?;
        let string_keys = matches!(
            column.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        );
        let keys = keys_of(&self.key, column).map_err(|m| self.err(m))?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.pickled
            .use_key_type(string_keys)
            .map_err(|e| self.err(e))?;
        let mut order: Vec<Key> = Vec::new();
        let mut rows: HashMap<Key, Vec<u32>> = Default::default();
        for (i, k) in keys.into_iter().enumerate() {
            let entry = rows.entry(k.clone()).or_insert_with(|| {
                order.push(k);
                Vec::new()
            });
            entry.push(i as u32);
        }
        if order.len() == 1 {
            return Ok(vec![(order.pop().expect("one key"), None)]);
        }
        Ok(order
            .into_iter()
            .map(|k| {
                let idx = rows.remove(&k).expect("grouped key");
                (k, Some(UInt32Array::from(idx)))
            })
            .collect())
    }

    fn call_groups(
        &mut self,
        py: Python<'_>,
        batch: &RecordBatch,
        groups: Vec<(Key, Option<RecordBatch>)>,
    ) -> PyResult<Vec<RecordBatch>> {
        let func = self.func.bind(py);
        let mut outputs = Vec::new();
        for (key, rows) in groups {
            let rows = rows.unwrap_or_else(|| batch.clone());
            let state = match self.state.get(&key) {
                Some(s) => s.clone_ref(py).into_bound(py),
                None => py.None().into_bound(py),
            };
            // Changed from the call on: the function may mutate `state` in
            // place even if it then fails to return a proper result.
            self.changed.insert(key.clone());
            let result = func.call1((key_to_py(&key, py)?, to_pyarrow(py, rows)?, state))?;
            let (output, new_state) = split_result(result)?;
            outputs.extend(batches_from_py(&output)?);
            if new_state.is_none() {
                self.state.remove(&key);
            } else {
                self.state.insert(key, new_state.unbind());
            }
        }
        Ok(outputs)
    }

    /// Pickles of the changed keys that are live, and the changed keys that
    /// were dropped; both in key order (diffs come out deterministic).
    fn pickle_changed(&self) -> Result<Changes> {
        let mut changed: Vec<&Key> = self.changed.iter().collect();
        changed.sort_unstable();
        let (live, dropped): (Vec<&Key>, Vec<&Key>) = changed
            .into_iter()
            .partition(|k| self.state.contains_key(*k));
        let upserts = Python::attach(|py| -> Result<Vec<Pickled>> {
            let dumps = py
                .import(intern!(py, "pickle"))
                .and_then(|m| m.getattr(intern!(py, "dumps")))
                .map_err(|e| self.err(format!("cannot import pickle: {e}")))?;
            live.into_iter()
                .map(|k| {
                    let bytes = self.pickle(&dumps, k, self.state[k].bind(py))?;
                    Ok((k.clone(), bytes))
                })
                .collect()
        })?;
        Ok((upserts, dropped.into_iter().cloned().collect()))
    }
}

impl KeyedProcess {
    fn pickle(
        &self,
        dumps: &Bound<'_, PyAny>,
        key: &Key,
        obj: &Bound<'_, PyAny>,
    ) -> Result<Vec<u8>> {
        dumps
            .call1((obj,))
            .and_then(|b| Ok(b.cast::<PyBytes>()?.as_bytes().to_vec()))
            .map_err(|e| {
                self.err(format!(
                    "cannot pickle the state of key {} ({e}); keyed state is checkpointed with \
                     pickle: keep picklable values in it (numbers, strings, lists, dicts, \
                     dataclasses), not functions, locks or open files",
                    key_label(key)
                ))
            })
    }

    fn unpickle<'py>(
        &self,
        loads: &Bound<'py, PyAny>,
        key: &Key,
        bytes: &[u8],
    ) -> Result<Bound<'py, PyAny>> {
        loads
            .call1((PyBytes::new(loads.py(), bytes),))
            .map_err(|e| {
                Error::Snapshot(format!(
                    "operator '{}': cannot unpickle the state of key {} ({e}); are the classes \
                     it was pickled with importable here?",
                    self.name,
                    key_label(key)
                ))
            })
    }

    /// A batch under a memory budget: per step of [`STEP_KEYS`] keys, their
    /// pickles looked up together, the calls, the new pickles (or drops)
    /// written back, the step's outputs emitted.
    fn process_spilling(
        &mut self,
        batch: &RecordBatch,
        groups: Vec<(Key, Option<RecordBatch>)>,
        out: &mut dyn Emitter,
    ) -> Result<()> {
        for step in groups.chunks(STEP_KEYS) {
            let keys: Vec<&Key> = step.iter().map(|(k, _)| k).collect();
            let pickles = self.pickled.lookup(&keys)?;
            let (outputs, upserts, present, dropped) =
                Python::attach(|py| self.call_spilling(py, batch, step, &pickles))?;
            self.pickled.write_looked_up(&upserts, &present, &dropped)?;
            for b in outputs {
                if b.num_rows() > 0 {
                    out.emit(b)?;
                }
            }
        }
        Ok(())
    }

    /// One step's calls: `(outputs, new pickles, whether each of their
    /// keys had state, dropped keys)`.
    fn call_spilling(
        &self,
        py: Python<'_>,
        batch: &RecordBatch,
        step: &[(Key, Option<RecordBatch>)],
        pickles: &arrow_array::BinaryArray,
    ) -> Result<StepCalls> {
        let import = |name: &'static str| {
            py.import(intern!(py, "pickle"))
                .and_then(|m| m.getattr(name))
                .map_err(|e| self.err(format!("cannot import pickle: {e}")))
        };
        let (dumps, loads) = (import("dumps")?, import("loads")?);
        let func = self.func.bind(py);
        let task = |e: PyErr| task_error(py, &self.name, e);
        let (mut outputs, mut upserts, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
        let mut present = Vec::new();
        for (i, (key, rows)) in step.iter().enumerate() {
            let rows = rows.clone().unwrap_or_else(|| batch.clone());
            let state = if pickles.is_valid(i) {
                self.unpickle(&loads, key, pickles.value(i))?
            } else {
                py.None().into_bound(py)
            };
            let result = func
                .call1((
                    key_to_py(key, py).map_err(task)?,
                    to_pyarrow(py, rows).map_err(task)?,
                    state,
                ))
                .map_err(task)?;
            let (output, new_state) = split_result(result).map_err(task)?;
            outputs.extend(batches_from_py(&output).map_err(task)?);
            if new_state.is_none() {
                dropped.push(key.clone());
            } else {
                upserts.push((key.clone(), self.pickle(&dumps, key, &new_state)?));
                present.push(pickles.is_valid(i));
            }
        }
        Ok((outputs, upserts, present, dropped))
    }
}

fn key_label(k: &Key) -> String {
    match k {
        Key::Int(v) => v.to_string(),
        Key::Str(s) => format!("{s:?}"),
    }
}

impl Operator for KeyedProcess {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        let groups = self.group(&batch)?;
        let groups = groups
            .into_iter()
            .map(|(k, idx)| match idx {
                None => Ok((k, None)),
                Some(idx) => take_record_batch(&batch, &idx)
                    .map(|b| (k, Some(b)))
                    .map_err(|e| self.err(e)),
            })
            .collect::<Result<Vec<_>>>()?;
        if self.pickled.spills() {
            return self.process_spilling(&batch, groups, out);
        }
        let outputs = Python::attach(|py| {
            self.call_groups(py, &batch, groups)
                .map_err(|e| task_error(py, &self.name, e))
        })?;
        for b in outputs {
            if b.num_rows() > 0 {
                out.emit(b)?;
            }
        }
        Ok(())
    }

    fn snapshot(&mut self, id: CheckpointId) -> Result<Option<StateCapture>> {
        if self.pickled.spills() {
            // Its changes went into the table as the batches ran.
            return self
                .pickled
                .checkpoint(id, &[], &[])
                .map(Some)
                .map_err(|e| self.err(e));
        }
        let (upserts, dropped) = self.pickle_changed()?;
        let capture = self
            .pickled
            .checkpoint(id, &upserts, &dropped)
            .map_err(|e| self.err(e))?;
        self.changed.clear();
        Ok(Some(capture))
    }

    fn snapshot_runs(&mut self, id: CheckpointId) -> Result<Option<TaskState>> {
        if !self.pickled.spills() {
            return Ok(self.snapshot(id)?.map(TaskState::Capture));
        }
        self.pickled
            .checkpoint_streamed(id)
            .map(|c| Some(c.into()))
            .map_err(|e| self.err(e))
    }

    fn commit(&mut self, id: CheckpointId) -> Result<()> {
        self.pickled.committed(id);
        Ok(())
    }

    fn abort(&mut self, _id: CheckpointId) -> Result<()> {
        self.pickled.abort();
        Ok(())
    }

    fn set_full_every(&mut self, full_every: u32) {
        // Only fails if the key type's table cannot be rebuilt, which a
        // table built before cannot; keep the old policy then.
        let _ = self.pickled.set_full_every(full_every);
    }

    fn set_state_memory(&mut self, memory: &StateMemory) -> Result<()> {
        if !self.state.is_empty() {
            return Err(Error::Config(
                "a keyed process's memory budget is set before its first batch".into(),
            ));
        }
        let dir = memory.spill_dir.clone();
        self.pickled.set_memory_budget(
            memory.budget,
            Box::new(move || Ok(Box::new(LocalRuns::new(&dir)?) as Box<dyn RunSink>)),
        )
    }

    fn spill_stats(&self) -> Option<SpillStats> {
        self.pickled.spill_stats()
    }

    fn restores_runs(&self) -> bool {
        self.pickled.spills()
    }

    fn restore_runs(&mut self, runs: &[(CheckpointId, StateCapture)]) -> Result<()> {
        self.changed.clear();
        self.state.clear();
        self.pickled.restore_runs(runs)
    }

    fn restore(&mut self, chain: &[StateCapture]) -> Result<()> {
        let rows = self.pickled.restore(chain)?;
        self.changed.clear();
        self.state.clear();
        let Some(rows) = rows else {
            return Ok(());
        };
        let keys = keys_of(&self.key, rows.column(0)).map_err(|m| self.err(m))?;
        let blobs = rows
            .column_by_name(STATE_COLUMN)
            .and_then(|c| c.as_binary_opt::<i32>())
            .ok_or_else(|| self.err("restored state has no binary 'state' column"))?
            .clone();
        let state = Python::attach(|py| -> Result<HashMap<Key, Py<PyAny>>> {
            let loads = py
                .import(intern!(py, "pickle"))
                .and_then(|m| m.getattr(intern!(py, "loads")))
                .map_err(|e| self.err(format!("cannot import pickle: {e}")))?;
            keys.into_iter()
                .enumerate()
                .map(|(i, k)| {
                    let obj = self.unpickle(&loads, &k, blobs.value(i))?;
                    Ok((k, obj.unbind()))
                })
                .collect()
        })?;
        self.state = state;
        Ok(())
    }
}
