//! Deterministic single-threaded discrete-event simulator driving the protocol state machines.
