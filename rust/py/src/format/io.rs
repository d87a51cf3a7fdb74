//! The caller's I/O as the format's drivers see it: a Python callable that
//! gives a manifest's bytes or checks a file.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use snapcut_core::store::{format, FileEntry, Manifest};
use snapcut_core::Error;

use crate::errors::IntoPyResult;

/// A Python callable a driver of the format calls for bytes (the caller's
/// I/O). A `SnapshotError` it raises is the format's business (a missing or
/// broken file: the rule decides what it means); any other exception stops
/// the driver and is raised as it was.
pub(super) struct Io<'a, 'py> {
    call: &'a Bound<'py, PyAny>,
    failed: std::cell::RefCell<Option<PyErr>>,
}

impl<'a, 'py> Io<'a, 'py> {
    pub(super) fn new(call: &'a Bound<'py, PyAny>) -> Self {
        Self {
            call,
            failed: Default::default(),
        }
    }

    fn stopped() -> Error {
        Error::Snapshot("stopped by an I/O error".into())
    }

    fn outcome<T>(&self, r: PyResult<T>) -> Result<T, Error> {
        if self.failed.borrow().is_some() {
            return Err(Self::stopped());
        }
        r.map_err(|e| {
            let py = self.call.py();
            if e.is_instance_of::<crate::errors::SnapshotError>(py) {
                let msg = e.value(py).to_string();
                let prefix = Error::Snapshot(String::new()).to_string();
                Error::Snapshot(msg.strip_prefix(&prefix).unwrap_or(&msg).to_string())
            } else {
                *self.failed.borrow_mut() = Some(e);
                Self::stopped()
            }
        })
    }

    /// The manifest of checkpoint `id`, from the bytes the callable returns.
    pub(super) fn manifest(&self, id: u64) -> Result<Manifest, Error> {
        let bytes = self.outcome(
            self.call
                .call1((id,))
                .and_then(|b| Ok(b.cast::<PyBytes>()?.as_bytes().to_vec())),
        )?;
        format::parse_manifest(&bytes, "manifest", id)
    }

    /// Calls the callable with `(checkpoint, entry dict)`.
    pub(super) fn check(&self, id: u64, entry: &FileEntry) -> Result<(), Error> {
        let py = self.call.py();
        self.outcome(
            super::entry_dict(py, entry)
                .and_then(|e| self.call.call1((id, e)))
                .map(drop),
        )
    }

    /// `r`, unless the callable raised something else: then that.
    pub(super) fn finish<T>(self, r: Result<T, Error>) -> PyResult<T> {
        match self.failed.into_inner() {
            Some(e) => Err(e),
            None => r.map_py(),
        }
    }
}
