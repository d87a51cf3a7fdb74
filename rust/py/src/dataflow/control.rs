//! `_JobControl`: triggers savepoints/checkpoints or cancels a running job
//! from another Python thread (`Dataflow.run(..., control=JobControl())`).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use snapcut_core::runtime::JobHandle;
use snapcut_core::Error;

use crate::errors::IntoPyResult;

/// The handle of the job attempt running now (restarts replace it).
#[pyclass(frozen, module = "snapcut._core", name = "_JobControl")]
#[derive(Default)]
pub struct PyJobControl {
    pub current: Arc<Mutex<Option<JobHandle>>>,
}

impl PyJobControl {
    fn with<T>(&self, f: impl FnOnce(&JobHandle) -> Result<T, Error>) -> PyResult<T> {
        let guard = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let handle = guard
            .as_ref()
            .ok_or_else(|| Error::Config("the job has not started yet".into()))
            .map_py()?;
        f(handle).map_py()
    }
}

#[pymethods]
impl PyJobControl {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Whether a job attempt has started (it may have ended since).
    #[getter]
    fn started(&self) -> bool {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// A savepoint: a checkpoint never removed by retention.
    fn trigger_savepoint(&self) -> PyResult<()> {
        self.with(JobHandle::trigger_savepoint)
    }

    fn trigger_checkpoint(&self) -> PyResult<()> {
        self.with(JobHandle::trigger_checkpoint)
    }

    /// Stops the job; `run` raises TaskError("job cancelled by the user").
    fn cancel(&self) -> PyResult<()> {
        self.with(JobHandle::cancel)
    }

    /// The current attempt's checkpoints: (started, completed, aborted).
    fn checkpoints(&self) -> PyResult<(u64, u64, u64)> {
        self.with(|h| {
            let c = h.checkpoints();
            Ok((c.started, c.completed, c.aborted))
        })
    }
}
