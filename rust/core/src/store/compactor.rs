//! The compactor: one background thread that merges a task's runs
//! ([`format::plan_compaction`], [`format::merge_batches`]) so that no
//! commit ever rebuilds a state. The store hands it a job after a commit;
//! it writes the merged run under `<root>/compacting/` (a temporary name,
//! then a rename, so a finished output is whole); the next commit adopts it
//! into its manifest ([`format::adopt`]) or discards it when its inputs are
//! gone from the task's runs. Commit never waits for it.
//!
//! Bounded: one job at a time, at most [`QUEUE`] waiting, at most one per
//! task in flight or waiting for adoption (a job that does not fit is
//! dropped; the next commit plans it again). A task whose runs cannot be
//! merged (keys of a type runs do not order, a key twice in a file) is not
//! compacted again by this compactor: its runs stay as they are, and every
//! commit would otherwise read them in vain. A [`CompactionBudget`] bounds
//! its share of the machine: after each chunk of a merge, and after the
//! job, the thread rests long enough that its working time stays within a
//! share of one core and the bytes it writes within a rate (RocksDB's rate
//! limiter; [`super::pace`]). The inputs are mapped and the output written
//! as it is merged, so a job holds a chunk of rows, not the state. `pause`
//! sleeps before each job,
//! leaving the cores to the tasks; a [`CompactionHold`] (tests, tools) keeps
//! every job from starting its merge while it lives, at most
//! [`HOLD_TIMEOUT`]. Dropping the compactor stops it: the job
//! in hand is abandoned at its next step, and the drop waits at most
//! [`SHUTDOWN_TIMEOUT`] for the thread, then leaves it to finish alone (its
//! output is removed when the root is next opened).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::{RecordBatch, UInt32Array};
use arrow_select::take::take_record_batch;
use serde_json::Value;

use super::files::{map_checked_pages, write_ipc, Fsync, FsyncMode};
use super::format::{self, decode_buffer, CompactionPlan, MergeKind, Written};
use super::manifest::{
    checkpoint_dir_name, run_file_name, times_file_name, FilterEntry, TimesEntry,
};
use super::mapped::{map_file_pages, MappedPages};
use super::pace::{PacedChunks, Pacer};
use super::run_files::write_chunks;
use super::streamed::StreamedFile;
use super::time_files::write_times;
use super::writer::store_filter;
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{CompactionStats, TaskId};
use crate::state::runs::{
    merge_rows, run_order, MergeCursor, OrderedChunks, Pages, Run, RunChunks,
};
use crate::state::KEY_METADATA;

/// Directory under the root where outputs wait for their adoption.
pub const COMPACTING_DIR: &str = "compacting";

/// Jobs waiting behind the one in hand.
pub const QUEUE: usize = 4;

/// How long dropping the compactor waits for its thread: longer than a
/// merge of a 10M-key state on a slow machine takes (~2-4 s).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a job waits at most for the [`CompactionHold`]s to go before
/// it merges anyway: a hold forgotten by a test or a tool never stops
/// compaction for good.
pub const HOLD_TIMEOUT: Duration = Duration::from_secs(120);

/// The least [`CompactionBudget::cpu_share`]: 1 % of a core.
pub const MIN_CPU_SHARE: f64 = 0.01;

/// How much of the machine the compactor may take: a share of one core's
/// time and, optionally, bytes written per second. After each span of work
/// (a chunk of a merge, or the job's reading and finishing) that took
/// `busy` and wrote `bytes`, the thread rests [`Self::rest`], so it works
/// at most `cpu_share` of the time and writes at most `bytes_per_s`, within
/// a merge as over many. A commit never waits on a merge.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompactionBudget {
    /// Share of one core's time, from [`MIN_CPU_SHARE`] to 1; 1 = no rest.
    pub cpu_share: f64,
    /// Bytes written per second at most; `None` = no limit.
    pub bytes_per_s: Option<u64>,
}

impl CompactionBudget {
    /// Compact as fast as one thread can (the default).
    pub const UNBOUNDED: Self = Self {
        cpu_share: 1.0,
        bytes_per_s: None,
    };

    /// Rejects a share below [`MIN_CPU_SHARE`] or above 1 and a zero rate,
    /// naming the setting.
    pub fn validate(&self) -> Result<()> {
        // At least 1 %: the rest is at most 99 times the work, never an overflow.
        if !(MIN_CPU_SHARE..=1.0).contains(&self.cpu_share) {
            return Err(Error::Config(format!(
                "compaction_cpu_share must be in [0.01, 1] (a share of one core; 1 = no limit), \
                 got {}",
                self.cpu_share
            )));
        }
        if self.bytes_per_s == Some(0) {
            return Err(Error::Config(
                "compaction_bytes_per_s must be positive, or None for no limit".into(),
            ));
        }
        Ok(())
    }

    /// How long to rest after a job that worked `busy` and wrote `bytes`:
    /// the longer of `busy * (1 / share - 1)` and the time `bytes` take at
    /// `bytes_per_s` beyond `busy`.
    pub fn rest(&self, busy: Duration, bytes: u64) -> Duration {
        let by_cpu = busy.mul_f64(1.0 / self.cpu_share - 1.0);
        let by_bytes = self.bytes_per_s.map_or(Duration::ZERO, |rate| {
            Duration::from_secs_f64(bytes as f64 / rate as f64).saturating_sub(busy)
        });
        by_cpu.max(by_bytes)
    }
}

impl Default for CompactionBudget {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}

/// A compaction of `task`'s runs, keyed by `key`.
#[derive(Clone, Debug)]
pub struct Job {
    pub task: TaskId,
    pub key: Option<String>,
    pub plan: CompactionPlan,
}

/// A merged run waiting under `compacting/` for a commit to adopt it.
#[derive(Debug)]
pub struct Finished {
    pub task: TaskId,
    pub plan: CompactionPlan,
    /// Where it waits, and its name in the adopting checkpoint.
    pub staged: PathBuf,
    pub name: String,
    pub written: Written,
    pub key_range: Option<(Value, Value)>,
    /// A diff output's filter, staged beside it ([`Self::staged_filter`]).
    pub filter: Option<FilterEntry>,
    /// A full output's time index (format 5: its schema names a time
    /// column), staged beside it ([`Self::staged_times`]).
    pub times: Option<TimesEntry>,
}

impl Finished {
    /// Where the output's filter waits to be adopted with it.
    pub fn staged_filter(&self, filter: &FilterEntry) -> PathBuf {
        self.staged.with_file_name(&filter.path)
    }

    /// Where the output's time index waits to be adopted with it.
    pub fn staged_times(&self, times: &TimesEntry) -> PathBuf {
        self.staged.with_file_name(&times.path)
    }
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    finished: Mutex<Vec<Finished>>,
    /// Per task with a job in flight or waiting: its inputs' files (with
    /// their filters), by (checkpoint, name).
    pending: Mutex<BTreeMap<TaskId, Vec<(CheckpointId, String)>>>,
    /// Tasks whose runs could not be merged (not I/O: the data).
    refused: Mutex<BTreeSet<TaskId>>,
    /// Tasks whose job ended with no output (failed, or abandoned at a
    /// stop) since [`Compactor::take_dropped`] last took them.
    dropped: Mutex<Vec<TaskId>>,
    /// [`CompactionHold`]s alive; `released` is told when one goes.
    holds: Mutex<usize>,
    released: Condvar,
    submitted: AtomicU64,
    merged: AtomicU64,
    adopted: AtomicU64,
    discarded: AtomicU64,
    failed: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    busy_ns: AtomicU64,
    rested_ns: AtomicU64,
}

pub struct Compactor {
    jobs: Option<SyncSender<Job>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Told when the thread ends (a `Mutex` only to make it `Sync`).
    exited: Mutex<Receiver<()>>,
}

impl Compactor {
    /// Starts the thread for `root`, clearing what an earlier process left
    /// under `compacting/` (`budget` validated by the store).
    pub fn start(
        root: PathBuf,
        fsync: Arc<Fsync>,
        pause: Duration,
        budget: CompactionBudget,
    ) -> Result<Self> {
        let staging = root.join(COMPACTING_DIR);
        Self::start_in(root, staging, fsync, pause, budget)
    }

    /// As [`Self::start`], its outputs staged in `staging` (cleared first):
    /// a directory of its own where several processes compact runs of one
    /// root (a Spark state root's workers), each publishing what it
    /// finished for any of them to adopt.
    pub fn start_in(
        root: PathBuf,
        staging: PathBuf,
        fsync: Arc<Fsync>,
        pause: Duration,
        budget: CompactionBudget,
    ) -> Result<Self> {
        budget.validate()?;
        match fs::remove_dir_all(&staging) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", staging.display()), e)),
        }
        fs::create_dir_all(&staging)
            .map_err(|e| Error::io(format!("creating {}", staging.display()), e))?;
        let (jobs, queue) = mpsc::sync_channel::<Job>(QUEUE);
        let (exit, exited) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let worker = Worker {
            root,
            staging,
            fsync,
            pause,
            budget,
            shared: Arc::clone(&shared),
        };
        let thread = std::thread::Builder::new()
            .name("snapcut-compactor".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    worker.run(job);
                }
                let _ = exit.send(());
            })
            .map_err(|e| Error::io("starting the compactor thread", e))?;
        Ok(Self {
            jobs: Some(jobs),
            shared,
            thread: Some(thread),
            exited: Mutex::new(exited),
        })
    }

    /// Hands `job` over without waiting; false (the job dropped) when the
    /// queue is full, the task has a job already or its runs were refused.
    pub fn submit(&self, job: Job) -> bool {
        let Some(jobs) = &self.jobs else { return false };
        if self
            .shared
            .refused
            .lock()
            .expect("compactor poisoned")
            .contains(&job.task)
        {
            return false;
        }
        let mut pending = self.shared.pending.lock().expect("compactor poisoned");
        if pending.contains_key(&job.task) {
            return false;
        }
        let inputs = job
            .plan
            .inputs
            .iter()
            .flat_map(|r| {
                let filter = r.filter.iter().map(|f| (r.checkpoint, f.path.clone()));
                std::iter::once((r.checkpoint, r.path.clone())).chain(filter)
            })
            .collect();
        let task = job.task.clone();
        match jobs.try_send(job) {
            Ok(()) => {
                pending.insert(task, inputs);
                self.shared.submitted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// The outputs finished since the last call, for a commit to adopt or
    /// discard (each then [`Self::settled`]).
    pub fn take_finished(&self) -> Vec<Finished> {
        std::mem::take(&mut *self.shared.finished.lock().expect("compactor poisoned"))
    }

    /// `done` was adopted (or else discarded): its task may compact again.
    pub fn settled(&self, done: &Finished, adopted: bool) {
        self.shared
            .pending
            .lock()
            .expect("compactor poisoned")
            .remove(&done.task);
        let count = if adopted {
            &self.shared.adopted
        } else {
            &self.shared.discarded
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// `done` was handed to another process to adopt (moved out of the
    /// staging directory): its task may compact again, and it counts
    /// neither as adopted nor as discarded here.
    pub fn handed_over(&self, done: &Finished) {
        self.shared
            .pending
            .lock()
            .expect("compactor poisoned")
            .remove(&done.task);
    }

    /// The tasks whose job ended with no output since the last call (it
    /// failed, or the compactor stopped first): whoever handed them over
    /// may let another compactor try (a Spark worker gives up its claim).
    pub fn take_dropped(&self) -> Vec<TaskId> {
        std::mem::take(&mut *self.shared.dropped.lock().expect("compactor poisoned"))
    }

    /// The files jobs in flight read, by (checkpoint, name): retention
    /// keeps them.
    pub fn needed(&self) -> BTreeSet<(CheckpointId, String)> {
        let pending = self.shared.pending.lock().expect("compactor poisoned");
        pending.values().flatten().cloned().collect()
    }

    /// Waits until every job handed over is done (its output waiting for
    /// a commit, or dropped), at most `timeout`; false if it ran out.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            let idle = {
                let pending = self.shared.pending.lock().expect("compactor poisoned");
                let finished = self.shared.finished.lock().expect("compactor poisoned");
                pending
                    .keys()
                    .all(|t| finished.iter().any(|f| &f.task == t))
            };
            if idle {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Keeps every job from starting its merge until the hold is dropped
    /// (or [`HOLD_TIMEOUT`] passed): jobs are still handed over, retention
    /// still keeps their inputs, commits go on without them.
    pub fn hold(&self) -> CompactionHold {
        *self.shared.holds.lock().expect("compactor poisoned") += 1;
        CompactionHold {
            shared: Arc::clone(&self.shared),
        }
    }

    pub fn stats(&self) -> CompactionStats {
        let s = &self.shared;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CompactionStats {
            submitted: get(&s.submitted),
            merged: get(&s.merged),
            adopted: get(&s.adopted),
            discarded: get(&s.discarded),
            failed: get(&s.failed),
            refused: s.refused.lock().expect("compactor poisoned").len() as u64,
            pending: s.pending.lock().expect("compactor poisoned").len() as u64,
            bytes_read: get(&s.bytes_read),
            bytes_written: get(&s.bytes_written),
            busy: Duration::from_nanos(get(&s.busy_ns)),
            rested: Duration::from_nanos(get(&s.rested_ns)),
        }
    }
}

/// While it lives, the compactor merges nothing (see [`Compactor::hold`]).
#[must_use = "the compactor is held only while the hold lives"]
pub struct CompactionHold {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CompactionHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompactionHold")
    }
}

impl Drop for CompactionHold {
    fn drop(&mut self) {
        let mut holds = self.shared.holds.lock().unwrap_or_else(|e| e.into_inner());
        *holds = holds.saturating_sub(1);
        self.shared.released.notify_all();
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.released.notify_all();
        drop(self.jobs.take());
        let exited = self.exited.lock().unwrap_or_else(|e| e.into_inner());
        match exited.recv_timeout(SHUTDOWN_TIMEOUT) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
            }
            // Left to finish alone: it writes only under `compacting/`.
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The thread's side.
struct Worker {
    root: PathBuf,
    staging: PathBuf,
    fsync: Arc<Fsync>,
    pause: Duration,
    budget: CompactionBudget,
    shared: Arc<Shared>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Worker {
    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }

    fn run(&self, job: Job) {
        self.sleep(self.pause);
        self.wait_while_held();
        let sleep = |span| self.sleep(span);
        let mut pacer = Pacer::new(self.budget, &sleep);
        let outcome = self.merge(&job, &mut pacer);
        let written = match &outcome {
            Ok(Some(done)) => done.written.bytes,
            _ => 0,
        };
        // The merge rested after each chunk for the chunk's work and bytes;
        // what is left (reading the inputs' checksums, finishing the file)
        // is counted now and rested after the output is handed over: a
        // commit never waits on it.
        let owed = pacer.close(written.saturating_sub(pacer.bytes));
        let s = &self.shared;
        s.busy_ns.fetch_add(nanos(pacer.busy), Ordering::Relaxed);
        s.rested_ns
            .fetch_add(nanos(pacer.rested + owed), Ordering::Relaxed);
        s.bytes_written.fetch_add(written, Ordering::Relaxed);
        match outcome {
            Ok(Some(done)) => {
                self.shared.merged.fetch_add(1, Ordering::Relaxed);
                self.shared
                    .finished
                    .lock()
                    .expect("compactor poisoned")
                    .push(done);
            }
            Ok(None) => {
                self.release(&job.task);
            }
            Err(_) => {
                // Nothing adopted, nothing lost: the runs stay as they are,
                // and a later commit plans the job again.
                self.shared.failed.fetch_add(1, Ordering::Relaxed);
                self.release(&job.task);
            }
        }
        self.sleep(owed);
    }

    fn release(&self, task: &TaskId) {
        self.shared
            .pending
            .lock()
            .expect("compactor poisoned")
            .remove(task);
        self.shared
            .dropped
            .lock()
            .expect("compactor poisoned")
            .push(task.clone());
    }

    /// Sleeps `span` in short steps, so a stop is not kept waiting.
    fn sleep(&self, span: Duration) {
        let until = Instant::now() + span;
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
    }

    /// Waits while a [`CompactionHold`] lives, at most [`HOLD_TIMEOUT`],
    /// and not once the compactor is stopping.
    fn wait_while_held(&self) {
        let until = Instant::now() + HOLD_TIMEOUT;
        let mut holds = self.shared.holds.lock().expect("compactor poisoned");
        while *holds > 0 && !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            // Short steps: a stop sets a flag the condvar is not tied to.
            let step = left.min(Duration::from_millis(20));
            holds = self
                .shared
                .released
                .wait_timeout(holds, step)
                .expect("compactor poisoned")
                .0;
        }
    }

    /// `task`'s runs cannot be merged: do not try again.
    fn refuse(&self, task: &TaskId) {
        self.shared
            .refused
            .lock()
            .expect("compactor poisoned")
            .insert(task.clone());
    }

    /// The job's output written under `compacting/`; `None` if stopped.
    /// The inputs are mapped (checked against their checksums first) and
    /// merged into the file a chunk of rows at a time
    /// ([`crate::store::write_chunks`]), pages released behind the merge, so
    /// the compactor holds a chunk, not the state; `pacer` rests after
    /// each chunk as the budget asks.
    fn merge(&self, job: &Job, pacer: &mut Pacer<'_>) -> Result<Option<Finished>> {
        let mut runs = Vec::with_capacity(job.plan.inputs.len());
        let mut key = job.key.clone();
        let mut full_schema = None;
        for run in &job.plan.inputs {
            if self.stopped() {
                return Ok(None);
            }
            let dir = self.root.join(checkpoint_dir_name(run.checkpoint));
            let entry = run.file_entry(&job.task, job.key.clone());
            let (buffer, pages) = map_checked_pages(&dir, &entry, run.checkpoint)?;
            self.shared
                .bytes_read
                .fetch_add(buffer.len() as u64, Ordering::Relaxed);
            let what = format!("checkpoint {} file {}", run.checkpoint, run.path);
            let (schema, parts) = decode_buffer(buffer, &what)?;
            let batch = format::concat(&schema, &parts)?;
            key = key.or_else(|| schema.metadata().get(KEY_METADATA).cloned());
            let Some(name) = key.as_deref() else {
                self.refuse(&job.task);
                return Err(Error::Snapshot(format!(
                    "state of {} names no key",
                    job.task
                )));
            };
            full_schema = Some(schema.clone());
            let order = run_order(&batch, name).inspect_err(|_| self.refuse(&job.task))?;
            let run = match order {
                // In capture order (an in-memory aggregate's full): sorted
                // into a file a chunk at a time and mapped back.
                Some(order) if StreamedFile::supports(batch.schema_ref()) => {
                    // Named by its checkpoint too: a job's inputs from
                    // different checkpoints share a file name.
                    let copy = format!("{}-{}.sorted.tmp", run.checkpoint, run.path);
                    match self.sorted_copy(&batch, order, name, pages, pacer, &copy)? {
                        Some(sorted) => sorted,
                        None => return Ok(None),
                    }
                }
                // A state whose columns a file cannot be streamed with is
                // sorted in memory; a sorted input is merged from its
                // mapping as it is. Either way the pages the order check or
                // the copy read are let go of now.
                Some(order) => {
                    let sorted = take_record_batch(&batch, &order)
                        .map_err(|e| Error::Snapshot(format!("sorting {what} by '{name}': {e}")))?;
                    in_pages(
                        Run::from_sorted_trusted_unfiltered(sorted, name)?,
                        pages,
                        true,
                    )
                }
                None => in_pages(
                    Run::from_sorted_trusted_unfiltered(batch, name)?,
                    pages,
                    true,
                ),
            };
            runs.push(run);
        }
        let key = key.expect("every input named it");
        let base = job.plan.kind == MergeKind::Base;
        let refs: Vec<&Run> = runs.iter().collect();
        let cursor = MergeCursor::new(&refs, base).inspect_err(|_| self.refuse(&job.task))?;
        let (first, last) = format::merge_span(&job.plan);
        let name = run_file_name(&job.task, first, last);
        let tmp = self.staging.join(format!("{name}.tmp"));
        let staged = self.staging.join(&name);
        // A merged full keeps its full's schema (the merge makes value
        // columns nullable: a tombstone has only its key), so a restore
        // from it builds the same table as from the full; a diff keeps
        // the merge's, `__deleted` last.
        let schema = if base { full_schema } else { None };
        let outcome = if StreamedFile::supports(cursor.schema()) {
            self.write_streamed(cursor, pacer, &tmp, schema, base)
        } else {
            drop(cursor);
            self.write_whole(&refs, base, &tmp, schema, &key)
        };
        let (written, keys, key_range) = match outcome {
            Ok(Some(out)) => out,
            Ok(None) | Err(_) => {
                let _ = fs::remove_file(&tmp);
                return outcome.map(|_| None);
            }
        };
        // A merged diff keeps a filter, as a diff a task wrote does; a
        // merged full its time index, as a full a task wrote does (a
        // restore from it then reads no row's time).
        let filter = match keys {
            Some(keys) => store_filter(&self.staging, &name, &keys, &key, &self.fsync)?,
            None => None,
        };
        let times = match base {
            true => self.store_times(&tmp, &name, &key).inspect_err(|_| {
                let _ = fs::remove_file(&tmp);
            })?,
            false => None,
        };
        crate::failpoint::hit("compaction.before_rename");
        fs::rename(&tmp, &staged)
            .map_err(|e| Error::io(format!("renaming into {}", staged.display()), e))?;
        Ok(Some(Finished {
            task: job.task.clone(),
            plan: job.plan.clone(),
            staged,
            name,
            written,
            key_range,
            filter,
            times,
        }))
    }

    /// The time index of the merged full `tmp` (to be named `name`),
    /// written beside it under its own name, if its schema names a time
    /// column.
    fn store_times(
        &self,
        tmp: &std::path::Path,
        name: &str,
        key: &str,
    ) -> Result<Option<TimesEntry>> {
        let out = self.staging.join(times_file_name(name));
        let out_tmp = self.staging.join(format!("{}.tmp", times_file_name(name)));
        let stored = write_times(tmp, name, &out_tmp, &self.staging, key, &self.fsync);
        match stored {
            Ok(Some(times)) => {
                fs::rename(&out_tmp, &out)
                    .map_err(|e| Error::io(format!("renaming into {}", out.display()), e))?;
                Ok(Some(times))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                let _ = fs::remove_file(&out_tmp);
                Err(e)
            }
        }
    }

    /// `batch` (an input in capture order, lying in `pages`) in `order`:
    /// written a chunk at a time, at `pacer`'s pace, into `name` in the
    /// staging directory (through the page cache, unsynced: it is read
    /// straight back and removed), then mapped back as a run. The
    /// compactor so holds the order and a chunk, not a sorted copy of the
    /// input (468 MB at 10M keys). `None` if the compactor stopped.
    fn sorted_copy(
        &self,
        batch: &RecordBatch,
        order: UInt32Array,
        key: &str,
        pages: Option<MappedPages>,
        pacer: &mut Pacer<'_>,
        name: &str,
    ) -> Result<Option<Run>> {
        let path = self.staging.join(name);
        let pages = pages.map(|p| Arc::new(p) as Arc<dyn Pages>);
        let chunks = OrderedChunks::new(batch, order, key, pages)?;
        let stopping = || self.stopped();
        let mut paced = PacedChunks::new(chunks, pacer, &stopping, false);
        let scratch = Fsync::new(FsyncMode::Off);
        let written = write_chunks(&path, &self.staging, &mut paced, None, &scratch);
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return if paced.stopped() { Ok(None) } else { Err(e) };
        }
        crate::failpoint::hit("compaction.sorted_copy");
        let what = path.display().to_string();
        let mapped = map_file_pages(&path, &what);
        // The mapping stays valid once the file is gone.
        let _ = fs::remove_file(&path);
        let (buffer, pages) =
            mapped?.ok_or_else(|| Error::Snapshot(format!("{what}: written, then not found")))?;
        let (schema, parts) = decode_buffer(buffer, &what)?;
        let run = Run::from_sorted_trusted_unfiltered(format::concat(&schema, &parts)?, key)?;
        Ok(Some(in_pages(run, pages, false)))
    }

    /// Writes the merge into `tmp` a chunk at a time, at `pacer`'s pace;
    /// `None` if the compactor stopped. Returns what was written, a
    /// diff's keys (for its filter; `None` for a full) and the key range.
    fn write_streamed(
        &self,
        cursor: MergeCursor<'_>,
        pacer: &mut Pacer<'_>,
        tmp: &std::path::Path,
        schema: Option<arrow_schema::SchemaRef>,
        base: bool,
    ) -> Result<Option<MergeOutput>> {
        let stopping = || self.stopped();
        let mut paced = PacedChunks::new(cursor, pacer, &stopping, !base);
        match write_chunks(tmp, &self.staging, &mut paced, schema, &self.fsync) {
            Err(_) if paced.stopped() => Ok(None),
            Err(e) => Err(e),
            Ok(written) => {
                let keys = (!base).then(|| paced.key_batches()).transpose()?;
                Ok(Some((written, keys, paced.key_range())))
            }
        }
    }

    /// Writes the merge into `tmp` as one batch made in memory: a state
    /// with a column a file cannot be streamed with (nested types, see
    /// [`StreamedFile::supports`]). The budget rests after the job.
    fn write_whole(
        &self,
        runs: &[&Run],
        base: bool,
        tmp: &std::path::Path,
        schema: Option<arrow_schema::SchemaRef>,
        key: &str,
    ) -> Result<Option<MergeOutput>> {
        let mut merged = merge_rows(runs, base)?;
        if let Some(schema) = schema {
            merged = RecordBatch::try_new(schema, merged.columns().to_vec()).map_err(|e| {
                Error::Snapshot(format!("a merged full does not fit its full's schema: {e}"))
            })?;
        }
        if self.stopped() {
            return Ok(None);
        }
        let written = write_ipc(
            tmp,
            &merged.schema(),
            std::slice::from_ref(&merged),
            &self.fsync,
        )?;
        let keys = (!base).then(|| vec![merged.clone()]);
        Ok(Some((written, keys, format::key_range(&merged, key))))
    }
}

/// `run` lying in `pages` (a mapped file's), its pages let go of first if
/// `release` (what making the run read of them).
fn in_pages(run: Run, pages: Option<MappedPages>, release: bool) -> Run {
    match pages {
        Some(pages) => {
            if release {
                pages.release();
            }
            run.with_pages(Arc::new(pages))
        }
        None => run,
    }
}

/// What writing a merge gave: the file, a diff's keys (batches holding its
/// key column) for its filter, and its key range.
type MergeOutput = (Written, Option<Vec<RecordBatch>>, Option<(Value, Value)>);

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rest_keeps_work_within_the_share_and_writes_within_the_rate() {
        let quarter = CompactionBudget {
            cpu_share: 0.25,
            bytes_per_s: None,
        };
        assert_eq!(quarter.rest(100 * MS, u64::MAX), 300 * MS);
        let rate = CompactionBudget {
            cpu_share: 1.0,
            bytes_per_s: Some(1_000_000),
        };
        // 500 kB at 1 MB/s take 500 ms: 100 ms of work, then 400 ms of rest.
        assert_eq!(rate.rest(100 * MS, 500_000), 400 * MS);
        assert_eq!(rate.rest(Duration::from_secs(1), 500_000), Duration::ZERO);
        let both = CompactionBudget {
            cpu_share: 0.5,
            bytes_per_s: Some(1_000_000),
        };
        assert_eq!(both.rest(100 * MS, 500_000), 400 * MS);
        assert_eq!(both.rest(400 * MS, 100), 400 * MS);
        let free = CompactionBudget::default();
        assert_eq!(free, CompactionBudget::UNBOUNDED);
        assert_eq!(free.rest(Duration::from_secs(5), u64::MAX), Duration::ZERO);
    }

    #[test]
    fn a_share_outside_a_hundredth_to_one_or_a_zero_rate_is_refused() {
        for share in [0.0, 0.009, -0.5, 1.01, f64::NAN, f64::INFINITY] {
            let b = CompactionBudget {
                cpu_share: share,
                bytes_per_s: None,
            };
            let msg = b.validate().unwrap_err().to_string();
            assert!(
                msg.contains("compaction_cpu_share must be in [0.01, 1]"),
                "{msg}"
            );
        }
        let b = CompactionBudget {
            cpu_share: 1.0,
            bytes_per_s: Some(0),
        };
        let msg = b.validate().unwrap_err().to_string();
        assert!(
            msg.contains("compaction_bytes_per_s must be positive"),
            "{msg}"
        );
        for ok in [0.01, 0.5, 1.0] {
            CompactionBudget {
                cpu_share: ok,
                bytes_per_s: Some(1),
            }
            .validate()
            .unwrap();
        }
    }
}
