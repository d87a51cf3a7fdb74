//! Multi-threaded dataflow runtime: tasks on OS threads, SPSC channels, a checkpoint coordinator.

pub mod config;
pub mod operator;

pub use config::CheckpointConfig;
