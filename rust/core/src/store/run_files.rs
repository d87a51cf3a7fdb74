//! Sorted runs written as their rows come (issue 37): a flush's memtable
//! sorted as it goes, a merge of runs, a checkpoint's capture merged from a
//! table's runs into its state file. Each goes through a [`StreamedFile`]
//! a chunk at a time, the pages of the runs it reads released behind it,
//! so the writer holds a chunk of rows, never the run.

use std::path::Path;

use arrow_schema::SchemaRef;

use super::files::{write_encoded, Fsync};
use super::format::{self, Written};
use super::mapped::map_file_pages;
use super::presized::{ColumnSize, PresizedFile};
use super::streamed::StreamedFile;
use crate::error::{Error, Result};
use crate::state::runs::{MergeCursor, Run, RunChunks};

/// Rows a streamed run is written a chunk of at a time (a multiple of 8: see
/// [`StreamedFile::push`]).
pub const RUN_CHUNK_ROWS: usize = 1 << 16;

/// Chunks between two releases of a streamed run's inputs' pages.
const RELEASE_EVERY_CHUNKS: usize = 16;

/// Writes the rows of `chunks` (in key order: a sorted run) as one Arrow
/// IPC file at `path` (created or replaced, fsynced as `fsync` says),
/// [`RUN_CHUNK_ROWS`] rows at a time, releasing the inputs' pages behind
/// it ([`RunChunks::release_inputs`]); the output goes through spool files
/// under `spool_dir`, so the writer holds a chunk of rows, never the run.
/// `schema`: the file's schema (the rows' columns, names and metadata as
/// the caller stores them); `None` the rows' own.
pub fn write_chunks(
    path: &Path,
    spool_dir: &Path,
    chunks: &mut dyn RunChunks,
    schema: Option<SchemaRef>,
    fsync: &Fsync,
) -> Result<Written> {
    let schema = schema.unwrap_or_else(|| chunks.schema().clone());
    let stem = path
        .file_name()
        .map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned());
    let mut file = StreamedFile::new(schema, spool_dir, &stem)?;
    feed(chunks, |chunk| file.push(chunk))?;
    let written = write_encoded(path, fsync, |out, what| file.finish(out, what))?;
    // The chunks were freed as it went.
    crate::heap::release_freed();
    Ok(written)
}

/// As [`write_chunks`], for rows whose number and sizes are known before
/// they come (`sizes`: a column's nulls and values' bytes): each buffer is
/// written straight to its place in the file ([`PresizedFile`]), with no
/// spool file. Direct I/O is not taken here (positional writes of any
/// length).
pub fn write_presized(
    path: &Path,
    chunks: &mut dyn RunChunks,
    schema: SchemaRef,
    rows: usize,
    sizes: &[ColumnSize],
    fsync: &Fsync,
) -> Result<Written> {
    let mut file = PresizedFile::create(path, schema, rows, sizes)?;
    feed(chunks, |chunk| file.push(chunk))?;
    let written = file.finish(fsync)?;
    crate::heap::release_freed();
    Ok(written)
}

/// Gives `push` every chunk of `chunks`, [`RUN_CHUNK_ROWS`] rows at a
/// time, releasing the inputs' pages behind it.
fn feed(
    chunks: &mut dyn RunChunks,
    mut push: impl FnMut(&arrow_array::RecordBatch) -> Result<()>,
) -> Result<()> {
    let mut read = 0usize;
    while let Some(chunk) = chunks.next_chunk(RUN_CHUNK_ROWS)? {
        push(&chunk)?;
        read += 1;
        if read % RELEASE_EVERY_CHUNKS == 0 {
            chunks.release_inputs();
        }
    }
    chunks.release_inputs();
    Ok(())
}

/// Writes a state file of the merge of `runs` (a capture of
/// `StateTable::checkpoint_streamed`: `base` for a full) at `path` with
/// the columns of `schema` as [`write_chunks`] writes it, spooling under
/// `spool_dir`. Returns what was written and, for a diff (not `base`), its
/// filter's bytes (format 3, [`format::diff_filter`]), built from the keys
/// of the file as written, read back mapped, its pages released after.
pub fn write_state_runs(
    path: &Path,
    spool_dir: &Path,
    runs: &[std::sync::Arc<Run>],
    base: bool,
    schema: SchemaRef,
    key: &str,
    fsync: &Fsync,
) -> Result<(Written, Option<Vec<u8>>)> {
    let refs: Vec<&Run> = runs.iter().map(|r| r.as_ref()).collect();
    let mut merge = MergeCursor::new(&refs, base)?;
    let written = write_chunks(path, spool_dir, &mut merge, Some(schema), fsync)?;
    if base {
        return Ok((written, None));
    }
    let what = path.display().to_string();
    let (buffer, pages) = map_file_pages(path, &what)?
        .ok_or_else(|| Error::Snapshot(format!("{what} went while it was written")))?;
    let (_, batches) = format::decode_buffer(buffer, &what)?;
    let filter = format::diff_filter(&batches, key)?;
    if let Some(pages) = pages {
        pages.release();
    }
    Ok((written, filter))
}
