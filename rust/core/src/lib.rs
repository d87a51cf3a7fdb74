//! snapcut-core: consistent global snapshots for streaming dataflows, in pure Rust.
//!
//! Layers (dependencies point down only):
//! - [`runtime`]: tasks on threads, operators, coordinator
//! - [`sim`]: deterministic single-threaded driver of the same protocol code
//! - [`store`] / [`state`]: snapshot files and keyed state with diffs
//! - [`protocol`]: per-task snapshot state machines (pure, no threads, no I/O)
//! - [`graph`]: logical graph → physical tasks and channels, back-edges
//! - [`channel`]: the lock-free bounded SPSC FIFO ring between two tasks

pub mod channel;
pub mod error;
pub mod failpoint;
pub mod graph;
pub mod protocol;
pub mod runtime;
pub mod sim;
pub mod snapshot;
pub mod state;
pub mod store;

pub use error::{Error, Result};
