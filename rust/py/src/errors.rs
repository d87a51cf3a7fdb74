//! The one place where snapcut-core's `Error` becomes a Python exception.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use snapcut_core::Error;

create_exception!(
    _core,
    SnapcutError,
    PyException,
    "Base class of every snapcut error."
);
create_exception!(
    _core,
    ChannelClosedError,
    SnapcutError,
    "The other end of a channel was closed."
);
create_exception!(
    _core,
    ConfigError,
    SnapcutError,
    "An invalid configuration value."
);
create_exception!(
    _core,
    GraphError,
    SnapcutError,
    "A malformed dataflow graph."
);
create_exception!(
    _core,
    SnapshotError,
    SnapcutError,
    "A missing, partial, corrupt or unsupported snapshot."
);
create_exception!(
    _core,
    TaskError,
    SnapcutError,
    "A task or user function failed while the job ran."
);
create_exception!(
    _core,
    StorageError,
    SnapcutError,
    "An I/O error while reading or writing snapshots or output."
);

/// Converts a core error into the matching Python exception.
pub fn to_py(err: Error) -> PyErr {
    let msg = err.to_string();
    match err {
        Error::Disconnected => ChannelClosedError::new_err(msg),
        Error::Config(_) => ConfigError::new_err(msg),
        Error::Graph(_) => GraphError::new_err(msg),
        Error::Snapshot(_) => SnapshotError::new_err(msg),
        Error::Task(_) => TaskError::new_err(msg),
        Error::Io { .. } => StorageError::new_err(msg),
    }
}

/// Extension trait: `core_result.map_py()?` in binding code.
pub trait IntoPyResult<T> {
    fn map_py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn map_py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SnapcutError", py.get_type::<SnapcutError>())?;
    m.add("ChannelClosedError", py.get_type::<ChannelClosedError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("GraphError", py.get_type::<GraphError>())?;
    m.add("SnapshotError", py.get_type::<SnapshotError>())?;
    m.add("TaskError", py.get_type::<TaskError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    Ok(())
}
