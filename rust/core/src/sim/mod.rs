//! Deterministic single-threaded discrete-event simulator driving the protocol
//! state machines: every delivery is chosen by a script or a seeded PRNG, so
//! every run (and every failure) replays exactly from its seed.
//!
//! - [`bank`]: the Chandy–Lamport bank (processes send money over FIFO
//!   channels; snapshots must conserve the total and be consistent cuts).
//! - [`dataflow`]: sources, tasks and channels (DAGs or cycles) run under any
//!   [`crate::protocol::ProtocolKind`]; every checkpoint is checked to be a
//!   consistent cut channel by channel.
//! - [`failover`]: one task fails mid-run and the failover rule the runtime
//!   applies restarts its region or its upstream; every sink must publish
//!   what a failure-free run publishes.
//! - [`timed`]: the experiments' job at cluster scale in simulated time,
//!   with a cost model (per-record cost, network, state writes, the
//!   coordinator), for ABS vs the synchronous baseline beyond one machine.

pub mod bank;
pub mod dataflow;
pub mod failover;
pub mod rng;
pub mod timed;

pub use rng::SplitMix64;
