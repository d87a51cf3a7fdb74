//! The Python `Dataflow` API's Rust side: Python-backed operators and
//! sources implementing snapcut-core's traits, the graph builder, and `run`.

use pyo3::prelude::*;

mod builder;
mod config;
mod convert;
mod keyed;
mod source;
mod udf;
mod union;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::PyCheckpointConfig>()?;
    m.add_function(wrap_pyfunction!(config::checkpoint_config, m)?)?;
    m.add_class::<builder::GraphBuilder>()?;
    Ok(())
}
