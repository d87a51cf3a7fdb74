//! snapcut-core: consistent global snapshots for streaming dataflows, in pure Rust.
//!
//! Layers (dependencies point down only):
//! - [`runtime`]: tasks on threads, operators, coordinator
//! - [`sim`]: deterministic single-threaded driver of the same protocol code
//! - [`graph`]: logical graph → physical tasks and channels, back-edges
//! - [`operator`]: what a vertex runs (source, operator, sink traits), seen by
//!   the graph that holds the factories and the runtime that drives them
//! - [`store`] / [`state`]: snapshot files and keyed state with diffs
//! - [`protocol`]: per-task snapshot state machines (pure, no threads, no I/O)
//! - [`channel`]: the lock-free bounded SPSC FIFO ring between two tasks

pub use snapcut_channel as channel;
pub mod error;
pub mod failpoint;
pub mod graph;
pub mod heap;
pub mod operator;
pub mod protocol;
pub mod runtime;
pub mod sim;
pub mod snapshot;
pub mod state;
pub mod store;

pub use error::{Error, Result};
