//! Multi-threaded dataflow runtime: tasks on OS threads, SPSC channels, a checkpoint coordinator.
//!
//! ```text
//! Job::new(graph, CheckpointConfig, JobOptions)?.run(Arc<dyn SnapshotSink>)? -> JobReport
//! ```
//! Every task pops items (data batch | barrier | end-of-stream) from the
//! inputs its protocol machine ([`crate::protocol`]) does not block, feeds
//! the machine, and carries out its actions: deliver to the operator, log
//! in-flight data, snapshot, forward barriers, complete. The coordinator
//! triggers checkpoints at the sources and commits them to the sink once
//! every task has reported.

pub mod config;
mod control;
mod coordinator;
mod edge;
mod job;
pub mod metrics;
pub mod operator;
pub mod ops;
mod output;
pub mod partition;
mod snapshots;
mod task;

pub use config::CheckpointConfig;
pub use edge::Item;
pub use job::{Job, JobHandle, JobOptions};
pub use metrics::{CheckpointMetrics, CheckpointStatus, JobReport, TaskReport};
pub use snapshots::InMemorySnapshots;
