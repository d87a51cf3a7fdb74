//! Built-in sources, operators and sinks (pure Rust).

mod aggregate;
mod basic;
mod batches;
mod dirty;
mod faults;
mod generator;
mod sinks;
mod spilling_aggregate;

pub use aggregate::{
    keyed_aggregate, keyed_aggregate_forwarding, AggFunc, AggSpec, KeyedAggregate,
};
pub use basic::{iterate, map_batches, union, ITERATE_FEEDBACK_PORT, ITERATE_OUTPUT_PORT};
pub use batches::{batch_source, BatchSource};
pub use faults::{inject, Fault, FaultAt, Fired};
pub use generator::{dwell_record, dwell_schema, dwell_source, DwellSource};
pub use sinks::{collect_sink, ipc_file_sink, Collected};
pub use spilling_aggregate::SpillingAggregate;
