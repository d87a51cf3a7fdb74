//! Arrow batches across the boundary (zero-copy, PyCapsule interface) and
//! Python exceptions turned into task errors.

use arrow_array::{Array, BooleanArray, RecordBatch};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3_arrow::{PyArray, PyRecordBatch, PyTable};
use snapcut_core::Error;

/// A Rust batch as a `pyarrow.RecordBatch` (no copy).
pub fn to_pyarrow<'py>(py: Python<'py>, batch: RecordBatch) -> PyResult<Bound<'py, PyAny>> {
    PyRecordBatch::new(batch).into_pyarrow(py)
}

/// Rust batches as one `pyarrow.Table` (no copy).
pub fn table_to_pyarrow<'py>(
    py: Python<'py>,
    batches: Vec<RecordBatch>,
    schema: arrow_schema::SchemaRef,
) -> PyResult<Bound<'py, PyAny>> {
    PyTable::try_new(batches, schema)?.into_pyarrow(py)
}

/// Any Arrow record batch or table exported through the PyCapsule
/// interface (pyarrow, polars, arro3, ...) as Rust batches; `None` → none.
pub fn batches_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Vec<RecordBatch>> {
    if obj.is_none() {
        return Ok(Vec::new());
    }
    if obj.hasattr(intern!(obj.py(), "__arrow_c_array__"))? {
        return Ok(vec![obj.extract::<PyRecordBatch>()?.into_inner()]);
    }
    if obj.hasattr(intern!(obj.py(), "__arrow_c_stream__"))? {
        return Ok(obj.extract::<PyTable>()?.into_inner().0);
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "expected a pyarrow.RecordBatch or Table, got {}",
        obj.get_type().name()?
    )))
}

/// A filter function's result (pyarrow boolean array, chunked array, numpy
/// bool array or list of bools) as a Rust boolean mask.
pub fn mask_from_py(obj: &Bound<'_, PyAny>) -> PyResult<BooleanArray> {
    let py = obj.py();
    let mut obj = obj.clone();
    if obj.hasattr(intern!(py, "combine_chunks"))? {
        obj = obj.call_method0(intern!(py, "combine_chunks"))?;
    }
    if !obj.hasattr(intern!(py, "__arrow_c_array__"))? {
        let pa = py.import(intern!(py, "pyarrow"))?;
        let bool_type = pa.getattr(intern!(py, "bool_"))?.call0()?;
        obj = pa
            .getattr(intern!(py, "array"))?
            .call1(PyTuple::new(py, [obj, bool_type])?)?;
    }
    let (array, _) = obj.extract::<PyArray>()?.into_inner();
    array
        .as_any()
        .downcast_ref::<BooleanArray>()
        .cloned()
        .ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "a filter function must return a boolean mask, got an array of {}",
                array.data_type()
            ))
        })
}

/// A Python exception raised inside operator `op` as a task error that names
/// the operator and carries the exception's type, message and traceback.
pub fn task_error(py: Python<'_>, op: &str, err: PyErr) -> Error {
    let text = format_exception(py, &err).unwrap_or_else(|_| err.to_string());
    Error::Task(format!(
        "operator '{op}': Python function raised {}",
        text.trim_end()
    ))
}

fn format_exception(py: Python<'_>, err: &PyErr) -> PyResult<String> {
    let traceback = py.import(intern!(py, "traceback"))?;
    let lines = traceback.getattr(intern!(py, "format_exception"))?.call1((
        err.get_type(py),
        err.value(py),
        err.traceback(py),
    ))?;
    let parts: Vec<String> = lines.extract()?;
    // The last line is "Type: message"; put it first so it reads well in one
    // line, then the traceback (if Python recorded one).
    let last = parts.last().cloned().unwrap_or_default();
    if parts.len() <= 1 {
        return Ok(last);
    }
    Ok(format!("{}\n{}", last.trim_end(), parts.concat()))
}
