//! Names in a snapshot root (checkpoint directories, file names) and the
//! schema of `sources.arrow`.

use pyo3::prelude::*;
use snapcut_core::store::{self, format};

use super::{table, task};

/// `chk-NNNNNNNN`: the directory name of checkpoint `checkpoint_id`.
#[pyfunction]
fn checkpoint_dir_name(checkpoint_id: u64) -> String {
    store::checkpoint_dir_name(checkpoint_id)
}

/// The checkpoint id of a directory name, or None if it is not one.
#[pyfunction]
fn parse_checkpoint_dir(name: &str) -> Option<u64> {
    store::parse_checkpoint_dir(name)
}

/// `name` as part of a file name: `[A-Za-z0-9_-]` stay, other bytes `%XX`.
#[pyfunction]
fn file_component(name: &str) -> String {
    store::file_component(name)
}

/// `<vertex>-<subtask>.channel-<edge>.<from_subtask>.arrow`
#[pyfunction]
fn channel_file_name(vertex: &str, subtask: usize, edge: &str, from_subtask: usize) -> String {
    store::channel_file_name(&task(vertex, subtask), edge, from_subtask)
}

/// The schema of `sources.arrow`, as an empty pyarrow table.
#[pyfunction]
fn sources_schema(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    table(py, format::sources_batch(&[]))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(checkpoint_dir_name, m)?)?;
    m.add_function(wrap_pyfunction!(parse_checkpoint_dir, m)?)?;
    m.add_function(wrap_pyfunction!(file_component, m)?)?;
    m.add_function(wrap_pyfunction!(channel_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(sources_schema, m)?)?;
    Ok(())
}
