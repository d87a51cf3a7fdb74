//! A full state file's time index written beside it (format 5), off the
//! task thread where the store writes (its writer thread; the Python
//! writer's own call): the (time, key) entries of the rows' time column,
//! read from the file just written (mapped) a bucket of times at a time
//! ([`BaseTimeChunks`]), so the writer holds a bucket's entries, never the
//! index. A restore then takes the file as the index's base run and reads
//! no row's time.

use std::path::Path;
use std::sync::Arc;

use arrow_schema::Schema;

use super::files::Fsync;
use super::format::{self, concat, decode_buffer};
use super::manifest::TimesEntry;
use super::mapped::map_file_pages;
use super::run_files::write_chunks;
use crate::error::{Error, Result};
use crate::state::{time_run_schema, BaseTimeChunks, TIME_METADATA};

/// Entries sorted at a time (16 bytes each: ~16 MB), however large the full.
const ENTRIES_PER_BUCKET: usize = 1 << 20;

/// Writes the time index of the full state file `state_file` (named
/// `state_name` in its manifest entry, keyed by `key`) to `out`, spooling
/// under `spool_dir`, if its schema names a time column
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
    let (schema, batches) = decode_buffer(buffer, &what)?;
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
    let written = write_chunks(out, spool_dir, &mut chunks, Some(file_schema), fsync)?;
    if let Some(pages) = pages {
        pages.release();
    }
    Ok(Some(format::times_entry(state_name, &column, &written)))
}
