//! `map`, `filter` and `flat_map` over Arrow batches with a Python function.
//! The GIL is taken once per batch; emitting (which may block on a full
//! channel) happens after it is released.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_select::filter::filter_record_batch;
use pyo3::prelude::*;
use pyo3::types::PyIterator;
use snapcut_core::operator::{Batch, Emitter, Operator, OperatorFactory};
use snapcut_core::protocol::InputId;
use snapcut_core::{Error, Result};

use super::convert::{batches_from_py, mask_from_py, task_error, to_pyarrow};

/// What the Python function returns and how it is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdfKind {
    /// `fn(batch) -> RecordBatch | Table | None`
    Map,
    /// `fn(batch) -> boolean mask`
    Filter,
    /// `fn(batch) -> iterable of RecordBatch`
    FlatMap,
}

impl std::str::FromStr for UdfKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "map" => Ok(UdfKind::Map),
            "filter" => Ok(UdfKind::Filter),
            "flat_map" => Ok(UdfKind::FlatMap),
            other => Err(Error::Graph(format!(
                "unknown Python operator kind {other:?}"
            ))),
        }
    }
}

/// Makes one [`UdfOperator`] per subtask; they share the Python function.
pub struct UdfFactory {
    pub name: String,
    pub kind: UdfKind,
    pub func: Arc<Py<PyAny>>,
}

impl OperatorFactory for UdfFactory {
    fn create(&self, _subtask: usize, _parallelism: usize) -> Result<Box<dyn Operator>> {
        Ok(Box::new(UdfOperator {
            name: self.name.clone(),
            kind: self.kind,
            func: Arc::clone(&self.func),
        }))
    }
}

struct UdfOperator {
    name: String,
    kind: UdfKind,
    func: Arc<Py<PyAny>>,
}

enum Output {
    Batches(Vec<RecordBatch>),
    Mask(arrow_array::BooleanArray),
}

impl UdfOperator {
    fn call(&self, py: Python<'_>, batch: &RecordBatch) -> PyResult<Output> {
        let arg = to_pyarrow(py, batch.clone())?;
        let result = self.func.bind(py).call1((arg,))?;
        match self.kind {
            UdfKind::Map => Ok(Output::Batches(batches_from_py(&result)?)),
            UdfKind::Filter => Ok(Output::Mask(mask_from_py(&result)?)),
            UdfKind::FlatMap => {
                if result.is_none() {
                    return Ok(Output::Batches(Vec::new()));
                }
                let mut out = Vec::new();
                for item in PyIterator::from_object(&result)? {
                    out.extend(batches_from_py(&item?)?);
                }
                Ok(Output::Batches(out))
            }
        }
    }
}

impl Operator for UdfOperator {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        let output = Python::attach(|py| {
            self.call(py, &batch)
                .map_err(|e| task_error(py, &self.name, e))
        })?;
        let batches = match output {
            Output::Batches(b) => b,
            Output::Mask(mask) => {
                if mask.len() != batch.num_rows() {
                    return Err(Error::Task(format!(
                        "operator '{}': filter mask has {} values for a batch of {} rows",
                        self.name,
                        mask.len(),
                        batch.num_rows()
                    )));
                }
                let kept = filter_record_batch(&batch, &mask)
                    .map_err(|e| Error::Task(format!("operator '{}': {e}", self.name)))?;
                vec![kept]
            }
        };
        for b in batches {
            if b.num_rows() > 0 {
                out.emit(b)?;
            }
        }
        Ok(())
    }
}
