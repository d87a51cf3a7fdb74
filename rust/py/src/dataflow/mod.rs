//! The Python `Dataflow` API's Rust side: Python-backed operators and
//! sources implementing snapcut-core's traits, the graph builder, and `run`.

use pyo3::prelude::*;

mod builder;
mod config;
mod control;
mod convert;
mod harness;
mod keyed;
mod report;
mod source;
mod udf;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::PyCheckpointConfig>()?;
    m.add_function(wrap_pyfunction!(config::checkpoint_config, m)?)?;
    m.add_class::<builder::GraphBuilder>()?;
    m.add_class::<report::PyCheckpoint>()?;
    m.add_class::<control::PyJobControl>()?;
    m.add_function(wrap_pyfunction!(dwell_events, m)?)?;
    m.add_function(wrap_pyfunction!(harness::_replay_source, m)?)?;
    m.add_function(wrap_pyfunction!(harness::_keyed_roundtrip, m)?)?;
    m.add_function(wrap_pyfunction!(harness::_keyed_checkpoints, m)?)?;
    m.add_function(wrap_pyfunction!(harness::_keyed_restore, m)?)?;
    Ok(())
}

/// The built-in generator's records `0..count` as a pyarrow Table, the same
/// records a `generate_dwell_events` source emits at any parallelism.
#[pyfunction]
fn dwell_events(py: Python<'_>, users: u64, count: u64, seed: u64) -> PyResult<Bound<'_, PyAny>> {
    use arrow_array::{Int64Array, RecordBatch};
    use snapcut_core::runtime::ops::{dwell_record, dwell_schema};
    if users == 0 {
        return Err(crate::errors::to_py(snapcut_core::Error::Config(
            "users must be at least 1".into(),
        )));
    }
    let batch = py
        .detach(|| {
            let (u, d): (Vec<i64>, Vec<i64>) =
                (0..count).map(|i| dwell_record(seed, i, users)).unzip();
            RecordBatch::try_new(
                dwell_schema(),
                vec![
                    std::sync::Arc::new(Int64Array::from(u)),
                    std::sync::Arc::new(Int64Array::from(d)),
                ],
            )
        })
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    convert::to_pyarrow(py, batch)
}
