//! `snapcut._core.KeyedAggregates` (built-in aggregates kept in a
//! `StateTable`) and `encode_keys` (several key columns as one Binary key).

use std::sync::Arc;

use arrow_array::ArrayRef;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3_arrow::input::{AnyArray, AnyRecordBatch};
use pyo3_arrow::{PyRecordBatch, PySchema};
use snapcut_core::state::{self, AggSpec, KeyedAggregates as CoreAggs};
use snapcut_core::Error;

use crate::errors::IntoPyResult;
use crate::state::{array_to_pyarrow, one_array, one_batch, StateTable};

/// Keyed built-in aggregates whose accumulators live in a StateTable.
#[pyclass(module = "snapcut._core", name = "KeyedAggregates", frozen)]
pub struct KeyedAggregates {
    inner: CoreAggs,
}

#[pymethods]
impl KeyedAggregates {
    /// `specs` are `(func, column or None, output)`; func is one of count,
    /// sum, min, max, mean, first, last (column None only for count(*)).
    #[new]
    fn new(
        input_schema: PySchema,
        key: &str,
        specs: Vec<(String, Option<String>, String)>,
    ) -> PyResult<Self> {
        let specs = specs
            .into_iter()
            .map(|(func, column, output)| {
                Ok(AggSpec {
                    func: func.parse()?,
                    column,
                    output,
                })
            })
            .collect::<Result<Vec<_>, Error>>()
            .map_py()?;
        let inner = CoreAggs::new(&input_schema.into_inner(), key, specs).map_py()?;
        Ok(Self { inner })
    }

    /// Key plus accumulator columns: make the StateTable from this schema.
    #[getter]
    fn state_schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PySchema::new(self.inner.state_schema()).into_pyarrow(py)
    }

    /// Key plus one column per spec, named by its output.
    #[getter]
    fn output_schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PySchema::new(self.inner.output_schema()).into_pyarrow(py)
    }

    #[getter]
    fn key(&self) -> String {
        self.inner.key().to_string()
    }

    /// Folds a RecordBatch or Table into `table`; returns the merged state
    /// rows of the keys it touched (one per key, in order of first appearance).
    fn apply<'py>(
        &self,
        py: Python<'py>,
        mut table: PyRefMut<'_, StateTable>,
        batch: AnyRecordBatch,
    ) -> PyResult<Bound<'py, PyAny>> {
        let join = one_batch(batch)?;
        let inner = &self.inner;
        let table = &mut table.inner;
        let out = py.detach(|| inner.apply(table, &join()?).map_py())?;
        PyRecordBatch::new(out).into_pyarrow(py)
    }

    /// Output rows (mean = sum / count) of state rows (a RecordBatch or Table).
    fn output<'py>(
        &self,
        py: Python<'py>,
        state_rows: AnyRecordBatch,
    ) -> PyResult<Bound<'py, PyAny>> {
        let join = one_batch(state_rows)?;
        let inner = &self.inner;
        let out = py.detach(|| inner.output(&join()?).map_py())?;
        PyRecordBatch::new(out).into_pyarrow(py)
    }

    fn __repr__(&self) -> String {
        let specs: Vec<String> = self.inner.specs().map(ToString::to_string).collect();
        format!(
            "KeyedAggregates(key={:?}, specs=[{}])",
            self.inner.key(),
            specs.join(", ")
        )
    }
}

/// One Binary key per row of several key columns (a Table, RecordBatch or
/// list of arrays): equal rows, and only those, get equal bytes, in every
/// process.
#[pyfunction]
fn encode_keys<'py>(py: Python<'py>, columns: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let arrays: Vec<ArrayRef> = if columns.is_instance_of::<PyList>()
        || columns.is_instance_of::<PyTuple>()
    {
        columns
            .try_iter()?
            .map(|c| {
                let (chunks, field) = c?.extract::<AnyArray>()?.into_chunked_array()?.into_inner();
                one_array(chunks, field.data_type())
            })
            .collect::<PyResult<_>>()?
    } else if columns.hasattr("__arrow_c_stream__")? || columns.hasattr("__arrow_c_array__")? {
        let batch = columns.extract::<AnyRecordBatch>().map_err(|e| {
            PyTypeError::new_err(format!(
                "encode_keys takes a pyarrow Table, RecordBatch or list of arrays; for one \
                 key column pass [column] ({e})"
            ))
        })?;
        one_batch(batch)?()?.columns().to_vec()
    } else {
        return Err(PyTypeError::new_err(format!(
            "encode_keys takes a pyarrow Table, RecordBatch or list of arrays, got {}",
            columns.get_type().name()?
        )));
    };
    let keys = py.detach(|| state::encode_keys(&arrays)).map_py()?;
    array_to_pyarrow(py, Arc::new(keys))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KeyedAggregates>()?;
    m.add_function(wrap_pyfunction!(encode_keys, m)?)
}
