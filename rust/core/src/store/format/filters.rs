//! A state diff's bloom filter stored beside its file (format 3): which
//! files get one, its entry, and reading it back checked. A base has none by
//! design: it holds nearly every key a batch looks up, so a filter would let
//! almost all of them through (`Run::from_sorted_unfiltered`).

use arrow_array::RecordBatch;

use super::entries::filter_file_entry;
use super::verify::check_file;
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::state::key::KeyType;
use crate::state::runs::sorted::hashes;
use crate::state::runs::{BloomFilter, DEFAULT_FPP};
use crate::store::manifest::{filter_file_name, FilterEntry};

/// Keys hashed at a time into a diff's filter.
const HASH_SLICE: usize = 1 << 16;

/// The bytes of the filter a state diff of `batches` (keyed by `key`)
/// stores beside its file, at the runs' [`DEFAULT_FPP`]; `None` for a diff
/// without rows (nothing to look up in it), or keyed by a type no state
/// table keys by (the store takes any capture; only a table makes runs).
pub fn diff_filter(batches: &[RecordBatch], key: &str) -> Result<Option<Vec<u8>>> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let key_type = batches
        .first()
        .and_then(|b| b.schema().field_with_name(key).ok().cloned());
    if rows == 0 || key_type.is_some_and(|f| KeyType::new(key, f.data_type()).is_err()) {
        return Ok(None);
    }
    let mut filter = BloomFilter::for_keys(rows, DEFAULT_FPP)?;
    for batch in batches {
        let keys = batch.column_by_name(key).ok_or_else(|| {
            Error::Snapshot(format!(
                "a state diff has no key column '{key}' to build its filter from"
            ))
        })?;
        // A slice at a time: the hashes of a 20M-key diff at once would be
        // 160 MB.
        for at in (0..keys.len()).step_by(HASH_SLICE) {
            let slice = keys.slice(at, HASH_SLICE.min(keys.len() - at));
            for hash in hashes(slice.as_ref())? {
                filter.insert(hash);
            }
        }
    }
    Ok(Some(filter.to_bytes()))
}

/// The entry of the filter `bytes` of the state file `state_path`.
pub fn filter_entry(state_path: &str, bytes: &[u8]) -> FilterEntry {
    FilterEntry {
        path: filter_file_name(state_path),
        bytes: bytes.len() as u64,
        crc32c: crc32c::crc32c(bytes),
    }
}

/// A stored filter's bytes (`path` naming the file in errors) checked
/// against its entry (size, checksum) and parsed; a corrupt one is an
/// error, never used.
pub fn read_filter(
    bytes: &[u8],
    entry: &FilterEntry,
    checkpoint: CheckpointId,
    path: &str,
) -> Result<BloomFilter> {
    check_file(&filter_file_entry(entry, None), bytes, checkpoint, path)?;
    BloomFilter::from_bytes(bytes, &format!("checkpoint {checkpoint}: file {path}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{BooleanArray, Int64Array};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::state::runs::hash::hash_int;

    fn diff(keys: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("__deleted", DataType::Boolean, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys.to_vec())),
                Arc::new(BooleanArray::from(vec![false; keys.len()])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_diff_filter_holds_its_keys_and_reads_back_checked() {
        let bytes = diff_filter(&[diff(&[5, 1]), diff(&[9])], "k")
            .unwrap()
            .unwrap();
        let entry = filter_entry("agg-0.state.arrow", &bytes);
        assert_eq!(entry.path, "agg-0.state.bloom");
        let filter = read_filter(&bytes, &entry, 4, "x").unwrap();
        assert!([1, 5, 9].iter().all(|&k| filter.may_contain(hash_int(k))));
        let mut bad = bytes.clone();
        bad[3] ^= 1;
        let err = read_filter(&bad, &entry, 4, "chk/agg-0.state.bloom").unwrap_err();
        assert!(err.to_string().contains("fails its checksum"), "{err}");
        let err = read_filter(&bytes[..16], &entry, 4, "x").unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        // A filter of the right size and checksum that does not parse.
        let odd = vec![0u8; 33];
        let err = read_filter(&odd, &filter_entry("a.arrow", &odd), 4, "a.bloom").unwrap_err();
        assert!(err.to_string().contains("is corrupt"), "{err}");
    }

    #[test]
    fn an_empty_diff_stores_no_filter_and_a_missing_key_is_named() {
        assert_eq!(diff_filter(&[diff(&[])], "k").unwrap(), None);
        let floats = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Float64, false)])),
            vec![Arc::new(arrow_array::Float64Array::from(vec![0.5]))],
        )
        .unwrap();
        assert_eq!(diff_filter(&[floats], "k").unwrap(), None);
        let err = diff_filter(&[diff(&[1])], "key").unwrap_err();
        assert!(err.to_string().contains("no key column 'key'"), "{err}");
    }
}
