//! Local runs of spilling state tables (issue 37): [`LocalRuns`] writes
//! each run a table flushes (`StateTable::with_memory_budget`) as an Arrow
//! IPC file in a directory of its own and reads it back mapped, so a
//! spilled run costs page cache, which the kernel can take back, rather
//! than heap. A released run's file goes at once (a mapping still read
//! keeps its pages until dropped); the directory goes with the `LocalRuns`.
//! Nothing here is durable: a checkpoint writes the state's changes through
//! the snapshot store as ever, and a restart restores from it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_array::RecordBatch;

use super::files::{write_ipc, Fsync, FsyncMode};
use super::format::{concat, decode_buffer};
use super::mapped::map_file_pages;
use super::run_files::write_chunks;
use crate::error::{Error, Result};
use crate::state::runs::{Run, RunChunks, DEFAULT_FPP};
use crate::state::RunSink;

/// Tables' run directories made by this process so far (their names).
static DIRS: AtomicU64 = AtomicU64::new(0);

/// Spilled runs of one table, as files under a directory of their own.
pub struct LocalRuns {
    dir: PathBuf,
    next: u64,
    kept: Vec<(Arc<Run>, PathBuf)>,
}

impl std::fmt::Debug for LocalRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRuns")
            .field("dir", &self.dir)
            .field("runs", &self.kept.len())
            .finish()
    }
}

impl LocalRuns {
    /// Runs in a new directory under `parent` (created if missing; local
    /// and writable, or the error names it).
    pub fn new(parent: &Path) -> Result<Self> {
        remove_orphans(parent);
        let n = DIRS.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("spill-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir).map_err(|e| {
            Error::io(
                format!("creating the state spill directory {}", dir.display()),
                e,
            )
        })?;
        Ok(Self {
            dir,
            next: 0,
            kept: Vec::new(),
        })
    }

    /// The directory the runs are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, run: &Run, path: &Path) -> Result<()> {
        let batch = run.batch();
        let no_sync = Fsync::new(FsyncMode::Off);
        write_ipc(
            path,
            batch.schema_ref(),
            std::slice::from_ref(batch),
            &no_sync,
        )
        .map(|_| ())
    }

    fn next_path(&mut self) -> PathBuf {
        let path = self.dir.join(format!("run-{:06}.arrow", self.next));
        self.next += 1;
        path
    }

    /// The run written at `path`, mapped back and made a run by `make`
    /// (given the batch and the file's name), its pages released once
    /// made (a filter built from its keys read every key's page), and kept.
    fn adopt(
        &mut self,
        path: PathBuf,
        make: impl FnOnce(RecordBatch, &str) -> Result<Run>,
    ) -> Result<Arc<Run>> {
        let what = path.display().to_string();
        let (buffer, pages) = map_file_pages(&path, &what)?.ok_or_else(|| {
            Error::Snapshot(format!(
                "spilled run {what} is missing: its directory was removed under it"
            ))
        })?;
        let (schema, batches) = decode_buffer(buffer, &what)?;
        let mut run = make(concat(&schema, &batches)?, &what)?;
        if let Some(pages) = pages {
            pages.release();
            run = run.with_pages(Arc::new(pages));
        }
        let kept = Arc::new(run);
        self.kept.push((Arc::clone(&kept), path));
        Ok(kept)
    }
}

/// Removes the spill directories under `parent` that processes no longer
/// running left (killed before their tables dropped them): spilled runs are
/// never part of a checkpoint, so nothing reads them again. A directory of
/// a live process, or one whose process cannot be told, stays.
fn remove_orphans(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("spill-"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != me && process_gone(pid) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(target_os = "linux")]
fn process_gone(pid: u32) -> bool {
    Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(not(target_os = "linux"))]
fn process_gone(_pid: u32) -> bool {
    false
}

impl RunSink for LocalRuns {
    fn keep(&mut self, run: Run) -> Result<Arc<Run>> {
        let path = self.next_path();
        self.write(&run, &path)?;
        crate::failpoint::hit("spill.after_run");
        let key = run.key_column().to_string();
        let filter = run.filter_bytes();
        // The caller's copy goes before the file is read back.
        drop(run);
        self.adopt(path, |batch, what| match filter {
            Some(filter) => Run::from_parts(batch, &key, &filter, what),
            None => Run::from_sorted_unfiltered(batch, &key, what),
        })
    }

    /// The rows written as they come ([`write_chunks`]), then mapped back
    /// and the run's filter built from the mapped keys: a merge or a flush
    /// holds a chunk of rows, never the run.
    fn keep_chunks(&mut self, chunks: &mut dyn RunChunks) -> Result<Arc<Run>> {
        let key = chunks.key_column().to_string();
        let path = self.next_path();
        write_chunks(&path, &self.dir, chunks, None, &Fsync::new(FsyncMode::Off))?;
        crate::failpoint::hit("spill.after_run");
        self.adopt(path, |batch, what| {
            Run::from_sorted(batch, &key, DEFAULT_FPP, what)
        })
    }

    fn keep_merged(&mut self, chunks: &mut dyn RunChunks) -> Result<Arc<Run>> {
        let key = chunks.key_column().to_string();
        let path = self.next_path();
        write_chunks(&path, &self.dir, chunks, None, &Fsync::new(FsyncMode::Off))?;
        crate::failpoint::hit("spill.after_run");
        self.adopt(path, |batch, _| {
            Run::from_sorted_trusted_unfiltered(batch, &key)
        })
    }

    fn release(&mut self, runs: &[Arc<Run>]) {
        self.kept.retain(|(kept, path)| {
            if runs.iter().any(|r| Arc::ptr_eq(r, kept)) {
                // Best effort: the directory goes with the table anyway.
                let _ = fs::remove_file(path);
                false
            } else {
                true
            }
        });
    }
}

impl Drop for LocalRuns {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
