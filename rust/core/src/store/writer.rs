//! The background writer: sorts, encodes and writes staged files on its own
//! thread so a task hands over its capture and goes back to processing (the
//! asynchronous phase of a checkpoint).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use serde_json::Value;

use super::files::{write_file, write_ipc, Fsync};
use super::format::{self, Written};
use super::manifest::{times_file_name, FilterEntry, TimesEntry};
use super::mapped::map_file_pages;
use super::run_files::write_state_runs;
use crate::error::{Error, Result};
use crate::state::runs::Run;
use crate::state::{KEY_METADATA, TIME_METADATA};

/// One file to write.
/// What a job writes: batches as they are, or a state's sorted runs
/// merged as the file is written (issue 37: a spilling table's capture,
/// never whole in memory).
pub(crate) enum Rows {
    Batches(Vec<RecordBatch>),
    /// Newest first; `base`: the whole state (a full, tombstones dropped).
    Runs {
        runs: Vec<Arc<Run>>,
        base: bool,
    },
}

pub(crate) struct Job {
    pub dir: PathBuf,
    pub name: String,
    pub schema: SchemaRef,
    pub rows: Rows,
    /// (Batches only: merged runs are sorted, and a diff's filter is built
    /// from the file they make.)
    /// A state file's key column where the store sorts state files
    /// (`StoreOptions::sort_state_files`): its rows are sorted by it before
    /// they are written, so the file is a sorted run (a restore maps it as a
    /// run as it is; a compaction's sort of it is a check).
    pub sort_key: Option<String>,
    /// A state diff's key column: its bloom filter is stored beside it
    /// (format 3), built here, off the task thread, like the file.
    pub filter_key: Option<String>,
    pub done: Sender<Result<Stored>>,
}

/// What writing a job gave: the file, the filter or time index stored
/// beside it, and for merged runs the key range of the rows written.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub written: Written,
    pub filter: Option<FilterEntry>,
    pub times: Option<TimesEntry>,
    pub key_range: Option<(Value, Value)>,
}

/// A thread draining a queue of [`Job`]s, in submission order.
pub(crate) struct Writer {
    queue: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    pub(crate) fn start(fsync: Arc<Fsync>) -> Result<Self> {
        let (tx, rx) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("snapcut-store-writer".into())
            .spawn(move || run(rx, &fsync))
            .map_err(|e| Error::io("starting the snapshot writer thread", e))?;
        Ok(Self {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a file; the receiver yields its outcome once written.
    pub(crate) fn submit(
        &self,
        dir: PathBuf,
        name: String,
        schema: SchemaRef,
        rows: Rows,
        sort_key: Option<String>,
        filter_key: Option<String>,
    ) -> Receiver<Result<Stored>> {
        let (done, result) = channel();
        let job = Job {
            dir,
            name,
            schema,
            rows,
            sort_key,
            filter_key,
            done,
        };
        let queue = self.queue.lock().expect("writer queue poisoned");
        if let Some(q) = queue.as_ref() {
            if let Err(failed) = q.send(job) {
                let _ = failed.0.done.send(Err(stopped()));
            }
        } else {
            let _ = job.done.send(Err(stopped()));
        }
        result
    }
}

fn stopped() -> Error {
    Error::Snapshot("the snapshot writer thread has stopped".into())
}

fn run(rx: Receiver<Job>, fsync: &Fsync) {
    for job in rx {
        let outcome = std::fs::create_dir_all(&job.dir)
            .map_err(|e| Error::io(format!("creating {}", job.dir.display()), e))
            .and_then(|()| match &job.rows {
                Rows::Batches(batches) => write_batches(&job, batches, fsync),
                Rows::Runs { runs, base } => write_runs(&job, runs, *base, fsync),
            });
        crate::failpoint::hit("store.after_state_file");
        // The stager may have given up (abort); nobody to tell then.
        let _ = job.done.send(outcome);
    }
}

fn write_batches(job: &Job, batches: &[RecordBatch], fsync: &Fsync) -> Result<Stored> {
    let batches = sorted(job, batches)?;
    let written = write_ipc(&job.dir.join(&job.name), &job.schema, &batches, fsync)?;
    let filter = match &job.filter_key {
        Some(key) => store_filter(&job.dir, &job.name, &batches, key, fsync)?,
        None => None,
    };
    Ok(Stored {
        written,
        filter,
        times: store_times(job, fsync)?,
        key_range: None,
    })
}

/// A state's runs merged into its file as it is written (spool files
/// beside it), the filter of a diff beside it, and the key range read
/// back from the file's first and last rows (it is sorted).
fn write_runs(job: &Job, runs: &[Arc<Run>], base: bool, fsync: &Fsync) -> Result<Stored> {
    let key = job.schema.metadata().get(KEY_METADATA).ok_or_else(|| {
        Error::Snapshot(format!(
            "state file {}: its runs' schema names no key column ('{KEY_METADATA}')",
            job.name
        ))
    })?;
    let path = job.dir.join(&job.name);
    let (written, filter) =
        write_state_runs(&path, &job.dir, runs, base, job.schema.clone(), key, fsync)?;
    let filter = match filter {
        Some(bytes) => {
            let entry = format::filter_entry(&job.name, &bytes);
            write_file(&job.dir.join(&entry.path), &bytes, fsync)?;
            Some(entry)
        }
        None => None,
    };
    Ok(Stored {
        written,
        filter,
        times: store_times(job, fsync)?,
        key_range: sorted_key_range(&path, key)?,
    })
}

/// A full state file's time index written beside it (format 5), read from
/// the file just written, if its schema names a time column (a table with
/// a time index names it in its full captures).
fn store_times(job: &Job, fsync: &Fsync) -> Result<Option<TimesEntry>> {
    let metadata = job.schema.metadata();
    let (Some(_), Some(key)) = (metadata.get(TIME_METADATA), metadata.get(KEY_METADATA)) else {
        return Ok(None);
    };
    let out = job.dir.join(times_file_name(&job.name));
    super::write_times(
        &job.dir.join(&job.name),
        &job.name,
        &out,
        &job.dir,
        key,
        fsync,
    )
}

/// The key range of a sorted state file: its first and last keys.
fn sorted_key_range(path: &Path, key: &str) -> Result<Option<(Value, Value)>> {
    let what = path.display().to_string();
    let Some((buffer, pages)) = map_file_pages(path, &what)? else {
        return Err(Error::Snapshot(format!("{what} went while it was written")));
    };
    let (_, batches) = format::decode_buffer(buffer, &what)?;
    let range = match batches.as_slice() {
        [] => None,
        [batch] if batch.num_rows() == 0 => None,
        [batch] => {
            let ends = [batch.slice(0, 1), batch.slice(batch.num_rows() - 1, 1)];
            let ends = arrow_select::concat::concat_batches(batch.schema_ref(), &ends)
                .map_err(|e| Error::Snapshot(format!("{what}: {e}")))?;
            format::key_range(&ends, key)
        }
        _ => {
            return Err(Error::Snapshot(format!(
                "{what}: a state file is one record batch"
            )))
        }
    };
    if let Some(pages) = pages {
        pages.release();
    }
    Ok(range)
}

/// Writes the filter of a diff's `batches` beside its file `name` in `dir`
/// (none for an empty diff).
pub(crate) fn store_filter(
    dir: &Path,
    name: &str,
    batches: &[RecordBatch],
    key: &str,
    fsync: &Fsync,
) -> Result<Option<FilterEntry>> {
    let Some(bytes) = format::diff_filter(batches, key)? else {
        return Ok(None);
    };
    let entry = format::filter_entry(name, &bytes);
    write_file(&dir.join(&entry.path), &bytes, fsync)?;
    Ok(Some(entry))
}

/// The job's batches, each sorted by its sort key (a state file is one batch).
fn sorted(job: &Job, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    let Some(key) = &job.sort_key else {
        return Ok(batches.to_vec());
    };
    batches
        .iter()
        .map(|b| format::sort_by_key(b, key))
        .collect()
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the jobs already queued.
        self.queue.lock().map(|mut q| q.take()).ok();
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}
