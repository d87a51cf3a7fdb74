//! Keyed state held by a Python function, Spark `applyInPandasWithState`
//! style: per batch and per key, `fn(key, rows_of_that_key, state) ->
//! (output | None, new_state)`; `new_state = None` drops the key. The GIL is
//! taken once per batch. State is snapshotted as Arrow: the key column plus
//! the pickled state (`StateCapture` Full).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{
    Array, ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema};
use arrow_select::take::take_record_batch;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use snapcut_core::protocol::{CheckpointId, InputId};
use snapcut_core::runtime::operator::{Batch, Emitter, Operator, OperatorFactory};
use snapcut_core::snapshot::{StateCapture, StateKind};
use snapcut_core::{Error, Result};

use super::convert::{batches_from_py, task_error, to_pyarrow};

/// A grouping key: integers and strings (what `key_by` columns hold).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Null,
    Int(i64),
    Str(String),
}

impl Key {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Key::Null => py.None().into_bound(py),
            Key::Int(v) => v.into_pyobject(py)?.into_any(),
            Key::Str(s) => s.into_pyobject(py)?.into_any(),
        })
    }
}

fn keys_of(column: &ArrayRef) -> std::result::Result<Vec<Key>, String> {
    macro_rules! ints {
        ($t:ty) => {{
            let a = column.as_primitive::<$t>();
            (0..a.len())
                .map(|i| {
                    if a.is_null(i) {
                        Ok(Key::Null)
                    } else {
                        i64::try_from(a.value(i))
                            .map(Key::Int)
                            .map_err(|_| format!("key {} does not fit in int64", a.value(i)))
                    }
                })
                .collect()
        }};
    }
    macro_rules! strs {
        ($a:expr) => {{
            let a = $a;
            Ok((0..a.len())
                .map(|i| {
                    if a.is_null(i) {
                        Key::Null
                    } else {
                        Key::Str(a.value(i).to_string())
                    }
                })
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
            state: BTreeMap::new(),
            string_keys: None,
        }))
    }
}

struct KeyedProcess {
    name: String,
    key: String,
    func: Arc<Py<PyAny>>,
    state: BTreeMap<Key, Py<PyAny>>,
    /// Whether keys are strings (else integers); known from the first batch or restore.
    string_keys: Option<bool>,
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
        self.string_keys.get_or_insert(string_keys);
        let keys = keys_of(column).map_err(|m| self.err(m))?;
        let mut order: Vec<Key> = Vec::new();
        let mut rows: std::collections::HashMap<Key, Vec<u32>> = Default::default();
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
            let result = func.call1((key.to_py(py)?, to_pyarrow(py, rows)?, state))?;
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
            outputs.extend(batches_from_py(&pair.get_item(0)?)?);
            let new_state = pair.get_item(1)?;
            if new_state.is_none() {
                self.state.remove(&key);
            } else {
                self.state.insert(key, new_state.unbind());
            }
        }
        Ok(outputs)
    }

    fn state_schema(&self) -> Arc<Schema> {
        let key_type = if self.string_keys == Some(true) {
            DataType::Utf8
        } else {
            DataType::Int64
        };
        Arc::new(Schema::new(vec![
            Field::new(&self.key, key_type, true),
            Field::new("state", DataType::Binary, false),
        ]))
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

    fn snapshot(&mut self, _id: CheckpointId) -> Result<Option<StateCapture>> {
        let schema = self.state_schema();
        let string_keys = self.string_keys == Some(true);
        let blobs: Vec<Vec<u8>> = Python::attach(|py| -> PyResult<Vec<Vec<u8>>> {
            let dumps = py
                .import(intern!(py, "pickle"))?
                .getattr(intern!(py, "dumps"))?;
            self.state
                .values()
                .map(|s| {
                    Ok(dumps
                        .call1((s.bind(py),))?
                        .cast::<PyBytes>()?
                        .as_bytes()
                        .to_vec())
                })
                .collect()
        })
        .map_err(|e| self.err(format!("cannot pickle the state: {e}")))?;
        let keys: ArrayRef = if string_keys {
            Arc::new(StringArray::from_iter(self.state.keys().map(|k| match k {
                Key::Str(s) => Some(s.clone()),
                _ => None,
            })))
        } else {
            Arc::new(Int64Array::from_iter(self.state.keys().map(|k| match k {
                Key::Int(v) => Some(*v),
                _ => None,
            })))
        };
        let states: ArrayRef = Arc::new(BinaryArray::from_iter_values(blobs.iter()));
        let batch = RecordBatch::try_new(schema, vec![keys, states]).map_err(|e| self.err(e))?;
        Ok(Some(StateCapture {
            kind: StateKind::Full,
            batch,
        }))
    }

    fn restore(&mut self, chain: &[StateCapture]) -> Result<()> {
        let Some(full) = chain.first() else {
            return Ok(());
        };
        let batch = &full.batch;
        if batch.num_columns() != 2 {
            return Err(self.err("restored state must have a key and a state column"));
        }
        let keys = keys_of(batch.column(0)).map_err(|m| self.err(m))?;
        self.string_keys = Some(matches!(batch.column(0).data_type(), DataType::Utf8));
        let blobs = batch
            .column(1)
            .as_binary_opt::<i32>()
            .ok_or_else(|| self.err("restored state column must be binary"))?
            .clone();
        let state = Python::attach(|py| -> PyResult<BTreeMap<Key, Py<PyAny>>> {
            let loads = py
                .import(intern!(py, "pickle"))?
                .getattr(intern!(py, "loads"))?;
            keys.into_iter()
                .enumerate()
                .map(|(i, k)| {
                    Ok((
                        k,
                        loads.call1((PyBytes::new(py, blobs.value(i)),))?.unbind(),
                    ))
                })
                .collect()
        })
        .map_err(|e| self.err(format!("cannot unpickle the state: {e}")))?;
        self.state = state;
        Ok(())
    }
}
