//! The background writer: sorts, encodes and writes staged files on its own
//! thread so a task hands over its capture and goes back to processing (the
//! asynchronous phase of a checkpoint).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::files::{write_file, write_ipc, Fsync};
use super::format::{self, Written};
use super::manifest::FilterEntry;
use crate::error::{Error, Result};

/// One file to write.
pub(crate) struct Job {
    pub dir: PathBuf,
    pub name: String,
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
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

/// What writing a job gave: the file, and the filter stored beside it.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub written: Written,
    pub filter: Option<FilterEntry>,
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
        batches: Vec<RecordBatch>,
        sort_key: Option<String>,
        filter_key: Option<String>,
    ) -> Receiver<Result<Stored>> {
        let (done, result) = channel();
        let job = Job {
            dir,
            name,
            schema,
            batches,
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
        let outcome = sorted(&job).and_then(|batches| {
            std::fs::create_dir_all(&job.dir)
                .map_err(|e| Error::io(format!("creating {}", job.dir.display()), e))?;
            let written = write_ipc(&job.dir.join(&job.name), &job.schema, &batches, fsync)?;
            let filter = match &job.filter_key {
                Some(key) => store_filter(&job.dir, &job.name, &batches, key, fsync)?,
                None => None,
            };
            Ok(Stored { written, filter })
        });
        crate::failpoint::hit("store.after_state_file");
        // The stager may have given up (abort); nobody to tell then.
        let _ = job.done.send(outcome);
    }
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
fn sorted(job: &Job) -> Result<Vec<RecordBatch>> {
    let Some(key) = &job.sort_key else {
        return Ok(job.batches.clone());
    };
    job.batches
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
