//! A full state file's time index written beside it (format 5): the
//! (time, key) entries of the rows' time column, read from the file just
//! written (mapped) a bucket of times at a time ([`BaseTimeChunks`]), so
//! the writer holds a bucket's entries, never the index. The Rust store
//! writes it on its writer thread; a Spark task's writer (the Python
//! `write_state_file`) in its commit, on the task thread. A full's entries
//! are usually known in number and bytes before they are sorted (a row
//! with a time each), and then go straight to their place in the file, not
//! through a spool. A restore then takes the file as the index's base run
//! and reads no row's time.

use std::path::Path;
use std::sync::Arc;

use arrow_schema::Schema;

use super::files::Fsync;
use super::format::{self, concat, decode_buffer};
use super::manifest::TimesEntry;
use super::mapped::map_file_pages;
use super::presized::ColumnSize;
use super::run_files::{write_chunks, write_presized};
use crate::error::{Error, Result};
use crate::state::{time_run_schema, BaseTimeChunks, TIME_METADATA};

/// Entries sorted at a time (16 bytes each: ~16 MB, with room for the
/// bounds' error and the radix sort's scratch ~40 MB), however large the
/// full.
const ENTRIES_PER_BUCKET: usize = 1 << 20;

/// Writes the time index of the full state file `state_file` (named
/// `state_name` in its manifest entry, keyed by `key`) to `out` (spooling
/// under `spool_dir` when the entries' sizes are not known before they are
/// sorted, or direct I/O is asked for), if its schema names a time column
/// ([`TIME_METADATA`]); returns its entry. None: no time column, or no row
/// has a time (a restore then has nothing to read either way).
pub fn write_times(
    state_file: &Path,
    state_name: &str,
    out: &Path,
    spool_dir: &Path,
    key: &str,
    fsync: &Fsync,
) -> Result<Option<TimesEntry>> {
    let what = state_file.display().to_string();
    let (buffer, pages) = map_file_pages(state_file, &what)?
        .ok_or_else(|| Error::Snapshot(format!("{what} went while it was written")))?;
    // The pages the index's reads bring in go whatever the outcome.
    let stored = index_file(buffer, &what, state_name, out, spool_dir, key, fsync);
    if let Some(pages) = pages {
        pages.release();
    }
    stored
}

/// [`write_times`] of the mapped state file `buffer` (named `what`).
fn index_file(
    buffer: arrow_buffer::Buffer,
    what: &str,
    state_name: &str,
    out: &Path,
    spool_dir: &Path,
    key: &str,
    fsync: &Fsync,
) -> Result<Option<TimesEntry>> {
    let (schema, batches) = decode_buffer(buffer, what)?;
    let Some(column) = schema.metadata().get(TIME_METADATA).cloned() else {
        return Ok(None);
    };
    let batch = concat(&schema, &batches)?;
    let times = batch.column_by_name(&column).ok_or_else(|| {
        Error::Snapshot(format!(
            "{what}: its '{TIME_METADATA}' metadata names time column '{column}', which it \
             does not hold"
        ))
    })?;
    let keys = batch.column_by_name(key).ok_or_else(|| {
        Error::Snapshot(format!("{what}: no key column '{key}' to index times by"))
    })?;
    if times.len() == times.null_count() {
        return Ok(None);
    }
    let mut chunks = BaseTimeChunks::new(times.as_ref(), keys.as_ref(), ENTRIES_PER_BUCKET)?;
    let run = time_run_schema();
    let file_schema = Arc::new(Schema::new_with_metadata(
        run.fields().clone(),
        [(TIME_METADATA.to_string(), column.clone())].into(),
    ));
    // An entry a row with a time (the usual case: a full's keys are unique
    // and in order) is known in size before it is sorted: no spool.
    let written = match chunks.sizes() {
        Some((rows, bytes)) if rows > 0 && !fsync.direct_io() => {
            let sizes = [
                ColumnSize {
                    nulls: 0,
                    value_bytes: bytes,
                },
                ColumnSize {
                    nulls: 0,
                    value_bytes: 0,
                },
            ];
            write_presized(out, &mut chunks, file_schema, rows, &sizes, fsync)?
        }
        _ => write_chunks(out, spool_dir, &mut chunks, Some(file_schema), fsync)?,
    };
    Ok(Some(format::times_entry(state_name, &column, &written)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::store::files::{write_ipc, FsyncMode};
    use crate::store::format::decode_ipc;

    /// A full of `keys` with a time for all but every 7th row.
    fn full(keys: ArrayRef) -> RecordBatch {
        let n = keys.len() as i64;
        let times = Int64Array::from_iter((0..n).map(|i| (i % 7 != 0).then_some((i * 37) % 11)));
        let schema = Schema::new_with_metadata(
            vec![
                Field::new("k", keys.data_type().clone(), false),
                Field::new("at", DataType::Int64, true),
            ],
            [(TIME_METADATA.to_string(), "at".to_string())].into(),
        );
        RecordBatch::try_new(Arc::new(schema), vec![keys, Arc::new(times)]).unwrap()
    }

    /// The index's bytes written with direct I/O asked (through the
    /// spool: `write_presized` takes none) and without.
    fn both_ways(batch: &RecordBatch) -> [(Vec<u8>, TimesEntry); 2] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("agg-0.state.arrow");
        write_ipc(
            &state,
            &batch.schema(),
            std::slice::from_ref(batch),
            &Fsync::new(FsyncMode::Off),
        )
        .unwrap();
        [true, false].map(|direct| {
            let out = dir.path().join(format!("times-{direct}.arrow"));
            let fsync = Fsync::new(FsyncMode::Off).with_direct_io(direct);
            let entry = write_times(&state, "agg-0.state.arrow", &out, dir.path(), "k", &fsync)
                .unwrap()
                .unwrap();
            (std::fs::read(&out).unwrap(), entry)
        })
    }

    #[test]
    fn an_index_written_in_place_is_the_spooled_one() {
        let ints: ArrayRef = Arc::new(Int64Array::from_iter_values((0..70_000).map(|k| k * 3)));
        let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..5_000).map(|k| format!("key-{k:06}{}", "x".repeat(k % 5))),
        ));
        for keys in [ints, strings] {
            let batch = full(keys);
            let [(spooled, a), (in_place, b)] = both_ways(&batch);
            assert_eq!(spooled, in_place);
            assert_eq!((a.rows, a.bytes, a.crc32c), (b.rows, b.bytes, b.crc32c));
            let timed = batch.num_rows() - batch.column(1).null_count();
            assert_eq!(b.rows, timed as u64);
            let (_, batches) = decode_ipc(in_place.clone(), "times").unwrap();
            let entries = batches[0].column(0).as_binary::<i32>();
            assert!((1..entries.len()).all(|i| entries.value(i - 1) < entries.value(i)));
        }
    }

    #[test]
    fn repeated_int_keys_go_through_the_spool_and_keep_one_entry() {
        // Not a full's keys, but a writer must not size a file wrong on them.
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values((0..1_000).map(|k| k / 2)));
        let n = keys.len();
        let times = Int64Array::from_iter_values((0..n as i64).map(|i| 5 + i / 2 % 3));
        let schema = Schema::new_with_metadata(
            vec![
                Field::new("k", DataType::Int64, false),
                Field::new("at", DataType::Int64, true),
            ],
            [(TIME_METADATA.to_string(), "at".to_string())].into(),
        );
        let batch = RecordBatch::try_new(Arc::new(schema), vec![keys, Arc::new(times)]).unwrap();
        let [(spooled, _), (plain, entry)] = both_ways(&batch);
        assert_eq!(spooled, plain);
        assert_eq!(entry.rows, 500);
    }
}
