//! The core's integration tests, one module per suite, in one test binary:
//! one crate to compile and link instead of one per suite (CI built ~20,
//! each instantiating arrow's generics again). `cargo test --test it
//! <suite>::` runs one suite.

mod channel_proptest;
mod channel_stress;
mod proptest_protocol;
mod recovery_store;
mod runtime_coordinator;
mod runtime_cyclic;
mod runtime_dwell;
mod runtime_errors;
mod runtime_failover;
mod runtime_ops;
mod runtime_random;
mod runtime_sync;
mod runtime_upstream_failover;
mod sim_bank;
mod sim_dataflow;
mod sim_timed;
mod state_aggregate_props;
mod state_props;
mod store_common;
mod store_concurrent;
mod store_materialize;
mod store_props;
mod store_roundtrip;
mod store_tiers;
mod store_times;
mod store_verify;
