//! Sorted runs: the immutable levels of the keyed state store (issue 37). A
//! run is a state file whose rows are sorted by key, each key once, with the
//! run's key range and a filter beside it, so a batch's lookups skip the runs
//! that cannot hold its keys and search the rest together. Pure rules, no
//! I/O: the files are the store's (`crate::store`).
//!
//! - [`hash`]: XXH64, the keys' filter hash (fixed by the format);
//! - [`filter`]: Parquet's split-block bloom filter;
//! - [`sorted`]: batched lookups in a sorted key column, and its check.

pub mod filter;
pub mod hash;
pub mod sorted;

pub use filter::BloomFilter;
