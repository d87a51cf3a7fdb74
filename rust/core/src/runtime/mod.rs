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
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use snapcut_core::graph::{LogicalGraph, Partitioning};
//! use snapcut_core::protocol::ProtocolKind;
//! use snapcut_core::runtime::ops::{collect_sink, dwell_source, keyed_aggregate, AggSpec};
//! use snapcut_core::runtime::{CheckpointConfig, InMemorySnapshots, Job, JobOptions};
//!
//! let mut g = LogicalGraph::new();
//! let src = g.add_source("src", 2, dwell_source(100_000, 100, 42, 1024)?);
//! let agg = g.add_operator("agg", 2, keyed_aggregate("user", vec![
//!     AggSpec::count("dwell_ms", "n"),
//!     AggSpec::mean("dwell_ms", "avg"),
//! ])?);
//! let (sink, results) = collect_sink();
//! let out = g.add_operator("sink", 1, sink);
//! g.connect(src, agg, Partitioning::Hash { key: "user".into() });
//! g.connect(agg, out, Partitioning::RoundRobin);
//!
//! let config = CheckpointConfig {
//!     protocol: ProtocolKind::Aligned,
//!     interval: Some(Duration::from_millis(50)),
//!     ..Default::default()
//! };
//! let snapshots = Arc::new(InMemorySnapshots::new());
//! let report = Job::new(g, config, JobOptions::default())?.run(snapshots.clone())?;
//! assert_eq!(report.records_in, 100_000);
//! assert_eq!(results.num_rows(), 100); // one row per user
//! assert!(snapshots.latest().is_some()); // at least the final checkpoint
//! # Ok::<(), snapcut_core::Error>(())
//! ```

pub mod config;
mod control;
mod coordinator;
mod edge;
pub mod failover;
mod job;
mod launch;
pub mod metrics;
/// The operator traits live below the graph and the runtime ([`crate::operator`]).
pub use crate::operator;
pub mod ops;
mod output;
pub mod partition;
pub mod recovery;
mod snapshots;
mod task;

pub use config::{CheckpointConfig, StateMemory};
pub use control::CheckpointCounts;
pub use edge::Item;
pub use failover::{FailoverStrategy, Restart, RestartScope, RestartStrategy};
pub use job::{Job, JobHandle, JobOptions};
pub use metrics::{CheckpointMetrics, CheckpointStatus, JobReport, TaskReport};
pub use recovery::{job_from_store, run_durable, DurableOptions, DurableReport};
pub use snapshots::InMemorySnapshots;
