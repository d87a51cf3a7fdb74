//! `Checkpointing` → core `CheckpointConfig`, validated once, in Rust.

use std::time::Duration;

use pyo3::prelude::*;
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::runtime::{CheckpointConfig, StateMemory};
use snapcut_core::store::CompactionBudget;
use snapcut_core::Error;

use crate::errors::IntoPyResult;
use crate::state::memory_bytes;

/// A validated checkpoint configuration, opaque to Python.
#[pyclass(frozen, module = "snapcut._core", name = "_CheckpointConfig")]
#[derive(Clone)]
pub struct PyCheckpointConfig {
    pub inner: CheckpointConfig,
}

#[pymethods]
impl PyCheckpointConfig {
    /// Canonical protocol name (e.g. `"chandy-lamport"`).
    #[getter]
    fn protocol(&self) -> &'static str {
        self.inner.protocol.name()
    }

    fn __repr__(&self) -> String {
        format!("_CheckpointConfig({:?})", self.inner)
    }
}

fn seconds(name: &str, value: f64) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        Error::Config(format!(
            "{name} must be a finite, non-negative number of seconds, got {value}"
        ))
    })
}

/// Builds and validates a checkpoint configuration (times in seconds).
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (protocol, interval, timeout, min_pause, max_concurrent, tolerable_failures, retained, alignment_timeout, final_checkpoint, full_every=10, compaction_cpu_share=1.0, compaction_bytes_per_s=None, state_memory=None, spill_dir=None))]
pub fn checkpoint_config(
    protocol: &str,
    interval: Option<f64>,
    timeout: f64,
    min_pause: f64,
    max_concurrent: usize,
    tolerable_failures: u32,
    retained: usize,
    alignment_timeout: f64,
    final_checkpoint: bool,
    full_every: u32,
    compaction_cpu_share: f64,
    compaction_bytes_per_s: Option<u64>,
    state_memory: Option<&Bound<'_, PyAny>>,
    spill_dir: Option<std::path::PathBuf>,
) -> PyResult<PyCheckpointConfig> {
    let state_memory = match (state_memory, spill_dir) {
        (Some(memory), dir) => Some(StateMemory {
            budget: memory_bytes(memory)?,
            // Spark's spark.local.dir defaults to the temp dir too.
            spill_dir: dir.unwrap_or_else(std::env::temp_dir),
        }),
        (None, Some(dir)) => {
            return Err(Error::Config(format!(
                "spill_dir={} needs state_memory= (a budget past which keyed state spills there)",
                dir.display()
            )))
            .map_py()
        }
        (None, None) => None,
    };
    let build = || -> Result<CheckpointConfig, Error> {
        let config = CheckpointConfig {
            protocol: protocol.parse::<ProtocolKind>()?,
            interval: interval.map(|s| seconds("interval", s)).transpose()?,
            timeout: seconds("timeout", timeout)?,
            min_pause: seconds("min_pause", min_pause)?,
            max_concurrent,
            tolerable_failures,
            retained,
            alignment_timeout: seconds("alignment_timeout", alignment_timeout)?,
            final_checkpoint,
            full_every,
            compaction: CompactionBudget {
                cpu_share: compaction_cpu_share,
                bytes_per_s: compaction_bytes_per_s,
            },
            state_memory,
        };
        config.validate()?;
        Ok(config)
    };
    build().map(|inner| PyCheckpointConfig { inner }).map_py()
}
