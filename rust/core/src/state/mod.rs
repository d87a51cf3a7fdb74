//! Keyed state tables with incremental diffing (changed keys + tombstones).
