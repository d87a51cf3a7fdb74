//! A state file mapped by Rust for Python to read as a pyarrow buffer
//! (`pyarrow.foreign_buffer(m.address, m.size, base=m)`): unlike a
//! `pyarrow.memory_map`, its pages can be let go of after a pass over it
//! (the checksum a restore checks), and a table restored from it keeps
//! them with its runs, so it releases what its lookups read.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_buffer::Buffer;
use pyo3::exceptions::PyFileNotFoundError;
use pyo3::prelude::*;
use snapcut_core::state::runs::Pages;
use snapcut_core::store::{map_file_pages, MappedPages};
use snapcut_core::Error;

use crate::errors::IntoPyResult;

/// A file mapped read-only, whole. Only files no one writes again (a
/// root's state files, a run cache's copies) may be mapped.
#[pyclass(module = "snapcut._core.format", name = "MappedFile", frozen)]
pub struct MappedFile {
    buffer: Buffer,
    /// `None` for an empty file (not mapped).
    pages: Option<MappedPages>,
}

impl MappedFile {
    /// The mapping's pages, for the runs a restore makes of the file.
    pub(crate) fn pages(&self) -> Option<Arc<dyn Pages>> {
        self.pages.clone().map(|p| Arc::new(p) as Arc<dyn Pages>)
    }
}

#[pymethods]
impl MappedFile {
    /// Maps `path`. The OS's refusals are raised as Python's own `OSError`
    /// subclasses (a missing file `FileNotFoundError`), as `open` raises
    /// them, for callers that tell a missing file from a broken disk.
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let what = path.display().to_string();
        let mapped = match py.detach(|| map_file_pages(&path, &what)) {
            Err(Error::Io { context, source }) => {
                let errno = source.raw_os_error();
                let text = format!("{context}: {source}");
                let err = PyErr::from(source);
                return Err(match errno {
                    Some(errno) => PyErr::from_type(err.get_type(py), (errno, text)),
                    None => err,
                });
            }
            other => other.map_py()?,
        };
        let (buffer, pages) = mapped.ok_or_else(|| {
            PyFileNotFoundError::new_err(format!("cannot map {what}: no such file"))
        })?;
        Ok(Self { buffer, pages })
    }

    /// Where the mapping starts (for `pyarrow.foreign_buffer`).
    #[getter]
    fn address(&self) -> usize {
        self.buffer.as_ptr() as usize
    }

    /// The file's length in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.buffer.len()
    }

    /// Drops the file's pages from this process's resident set; the page
    /// cache keeps them and a later read maps them back.
    fn release(&self, py: Python<'_>) {
        if let Some(pages) = &self.pages {
            py.detach(|| pages.release());
        }
    }

    fn __repr__(&self) -> String {
        format!("MappedFile(size={})", self.buffer.len())
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MappedFile>()
}
