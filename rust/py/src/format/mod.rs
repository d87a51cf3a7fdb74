//! `snapcut._core.format`: the snapshot format's rules
//! (`snapcut_core::store::format`) for the Python backend that moves the
//! bytes of URI roots (`snapcut.snapshots`, the only Python caller). Files
//! and manifests cross as bytes, tables through the PyCapsule interface,
//! manifest entries and other JSON-shaped values as dicts and lists
//! ([`crate::pyjson`]).
//!
//! A submodule of `_core`, registered in `sys.modules` too, so that both
//! `from snapcut._core import format` and `import snapcut._core.format`
//! work (an extension module is not a package: Python finds the submodule
//! only there).

use pyo3::prelude::*;
use pyo3_arrow::PyTable;
use snapcut_core::snapshot::TaskId;
use snapcut_core::store::FileEntry;

mod io;
mod layout;
pub(crate) mod mapped;
mod read;
mod runs;
mod verify;
mod write;

/// The module's name, as `sys.modules` and its functions' `__module__` say.
const NAME: &str = "snapcut._core.format";

fn task(vertex: &str, subtask: usize) -> TaskId {
    TaskId {
        vertex: vertex.into(),
        subtask,
    }
}

/// `batch` as a pyarrow Table.
fn table<'py>(py: Python<'py>, batch: arrow_array::RecordBatch) -> PyResult<Bound<'py, PyAny>> {
    let schema = batch.schema();
    PyTable::try_new(vec![batch], schema)?.into_pyarrow(py)
}

/// A manifest file entry as the dict `json.loads` would give.
fn entry_dict<'py>(py: Python<'py>, entry: &FileEntry) -> PyResult<Bound<'py, PyAny>> {
    crate::pyjson::to_py(py, entry)
}

/// A manifest file entry from its dict.
fn entry_of(entry: &Bound<'_, PyAny>) -> PyResult<FileEntry> {
    crate::pyjson::from_py(entry, "manifest file entry")
}

/// Adds `format` to `_core` and to `sys.modules`.
pub fn register(core: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = core.py();
    let m = PyModule::new(py, NAME)?;
    layout::register(&m)?;
    write::register(&m)?;
    read::register(&m)?;
    runs::register(&m)?;
    verify::register(&m)?;
    mapped::register(&m)?;
    // Not `add_submodule`: it would name the attribute after `NAME`.
    core.add("format", &m)?;
    py.import("sys")?.getattr("modules")?.set_item(NAME, &m)?;
    Ok(())
}
