//! Sinks: an in-memory collector (two-phase commit) and an Arrow IPC file per subtask.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_array::{RecordBatch, StringArray, UInt64Array};
use arrow_ipc::writer::FileWriter;
use arrow_schema::{DataType, Field, Schema};

use crate::error::{Error, Result};
use crate::operator::{Batch, Emitter, Operator, OperatorFactory};
use crate::protocol::{CheckpointId, InputId};
use crate::snapshot::{StateCapture, StateKind};

/// (subtask, checkpoint) → batches pre-committed, not yet published.
type PreCommitted = BTreeMap<(usize, CheckpointId), Vec<RecordBatch>>;

/// What a [`collect_sink`] received, readable after (or during) the run.
/// Shared by every run of the same graph (restarts included), so that a
/// restored subtask can finish the commit its failed predecessor staged.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    committed: Arc<Mutex<Vec<RecordBatch>>>,
    /// (subtask, checkpoint) → batches pre-committed, not yet published.
    pending: Arc<Mutex<PreCommitted>>,
}

impl Collected {
    /// Batches published so far: those before a completed checkpoint, and
    /// everything once the job has ended.
    pub fn batches(&self) -> Vec<RecordBatch> {
        self.committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn num_rows(&self) -> usize {
        self.batches().iter().map(|b| b.num_rows()).sum()
    }

    /// Publishes `subtask`'s pre-committed batches up to checkpoint `upto`
    /// and drops those after `drop_after` (data that will be produced again).
    fn settle(&self, subtask: usize, upto: CheckpointId, drop_after: Option<CheckpointId>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<(usize, CheckpointId)> = pending
            .range((subtask, 0)..=(subtask, CheckpointId::MAX))
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::new();
        for k in keys {
            if k.1 <= upto {
                out.extend(pending.remove(&k).unwrap_or_default());
            } else if drop_after.is_some_and(|d| k.1 > d) {
                pending.remove(&k);
            }
        }
        drop(pending);
        self.committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(out);
    }
}

struct CollectSink {
    out: Collected,
    subtask: usize,
    staged: Vec<RecordBatch>,
    /// Set once restored, or once a fresh start dropped what a failed
    /// predecessor pre-committed (its checkpoints never completed).
    started: bool,
}

impl CollectSink {
    fn start(&mut self) {
        if !self.started {
            self.started = true;
            self.out.settle(self.subtask, 0, Some(0));
        }
    }
}

const COLLECT_CHECKPOINT: &str = "snapcut.checkpoint";

impl Operator for CollectSink {
    fn process(&mut self, _input: InputId, batch: Batch, _out: &mut dyn Emitter) -> Result<()> {
        self.start();
        self.staged.push(batch);
        Ok(())
    }

    /// The state only names the checkpoint, so that a restore knows which
    /// pre-committed batches are final.
    fn snapshot(&mut self, id: CheckpointId) -> Result<Option<StateCapture>> {
        self.start();
        let schema = Arc::new(Schema::new_with_metadata(
            vec![Field::new("subtask", DataType::UInt64, false)],
            [(COLLECT_CHECKPOINT.to_string(), id.to_string())].into(),
        ));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(UInt64Array::from(vec![self.subtask as u64]))],
        )
        .map_err(|e| Error::Task(format!("collect sink state: {e}")))?;
        Ok(Some(StateCapture {
            kind: StateKind::Full,
            batch,
            filter: None,
            times: None,
        }))
    }

    fn pre_commit(&mut self, id: CheckpointId) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        self.out
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((self.subtask, id))
            .or_default()
            .extend(staged);
        Ok(())
    }

    fn commit(&mut self, id: CheckpointId) -> Result<()> {
        self.out.settle(self.subtask, id, None);
        Ok(())
    }

    fn restore(&mut self, chain: &[StateCapture]) -> Result<()> {
        let Some(state) = chain.last() else {
            return Ok(());
        };
        let restored: CheckpointId = state
            .batch
            .schema_ref()
            .metadata()
            .get(COLLECT_CHECKPOINT)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                Error::Snapshot(format!(
                    "collect sink state of subtask {} does not name its checkpoint",
                    self.subtask
                ))
            })?;
        self.out.settle(self.subtask, restored, Some(restored));
        self.started = true;
        Ok(())
    }

    /// The job ended successfully: what is left is final output.
    fn finish(&mut self, _out: &mut dyn Emitter) -> Result<()> {
        self.start();
        self.out.settle(self.subtask, CheckpointId::MAX, None);
        let staged = std::mem::take(&mut self.staged);
        self.out
            .committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(staged);
        Ok(())
    }
}

/// A sink that keeps what it receives in memory. Output before barrier n is
/// published when checkpoint n completes (two-phase commit); the rest when
/// the job ends. A subtask restored from checkpoint r publishes what its
/// predecessor pre-committed up to r and drops the rest (it is replayed).
pub fn collect_sink() -> (Arc<dyn OperatorFactory>, Collected) {
    let out = Collected::default();
    let shared = out.clone();
    let factory = move |subtask: usize, _: usize| -> Result<Box<dyn Operator>> {
        Ok(Box::new(CollectSink {
            out: shared.clone(),
            subtask,
            staged: Vec::new(),
            started: false,
        }))
    };
    (Arc::new(factory), out)
}

/// Exactly-once Arrow IPC file sink of one subtask (two-phase commit).
///
/// Data between barrier n-1 and barrier n goes to `.part-<s>.inprogress`;
/// on barrier n's snapshot that file is closed and renamed to
/// `.part-<s>-<n>.arrow.pending` (pre-commit), and the names of every file
/// still pending go into the snapshot. When checkpoint n completes, pending
/// files up to n are renamed to `part-<s>-<n>.arrow` (commit). Names with a
/// leading dot are invisible to `*.arrow` globs and to `pyarrow.dataset`.
/// On restore from checkpoint r the files r's snapshot lists are committed
/// (idempotently: their checkpoint did complete), and stale pending files and
/// files committed by checkpoints after r (to be reproduced) are removed.
struct IpcSink {
    dir: PathBuf,
    subtask: usize,
    writer: Option<FileWriter<File>>,
    /// Checkpoint id → pending file name, not yet committed.
    pending: BTreeMap<CheckpointId, String>,
    /// Set once stale files of an earlier run have been cleaned up.
    started: bool,
    last_id: CheckpointId,
}

const FILE_COLUMN: &str = "pending_file";
const CHECKPOINT_METADATA: &str = "snapcut.checkpoint";

impl IpcSink {
    fn inprogress(&self) -> PathBuf {
        self.dir.join(format!(".part-{}.inprogress", self.subtask))
    }

    fn pending_name(&self, id: CheckpointId) -> String {
        format!(".part-{}-{id:08}.arrow.pending", self.subtask)
    }

    fn committed_name(&self, id: CheckpointId) -> String {
        format!("part-{}-{id:08}.arrow", self.subtask)
    }

    /// Checkpoint id of one of this subtask's files, committed or pending.
    fn parse(&self, name: &str) -> Option<(CheckpointId, bool)> {
        let (body, pending) = match name.strip_suffix(".arrow.pending") {
            Some(b) => (b.strip_prefix('.')?, true),
            None => (name.strip_suffix(".arrow")?, false),
        };
        let rest = body.strip_prefix(&format!("part-{}-", self.subtask))?;
        Some((rest.parse().ok()?, pending))
    }

    /// Removes what a previous run of this subtask left behind: the
    /// in-progress file, pending files not in `keep`, and committed files
    /// of checkpoints after `after` (their data is produced again).
    fn clean(&self, keep: &[String], after: Option<CheckpointId>) -> Result<()> {
        remove_file(&self.inprogress())?;
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((id, pending)) = self.parse(&name) else {
                continue;
            };
            let stale = if pending {
                !keep.contains(&name)
            } else {
                after.is_some_and(|r| id > r)
            };
            if stale {
                remove_file(&entry.path())?;
            }
        }
        Ok(())
    }

    fn start(&mut self) -> Result<()> {
        if !self.started {
            self.started = true;
            self.clean(&[], None)?;
        }
        Ok(())
    }

    fn close_writer(&mut self) -> Result<bool> {
        let Some(mut w) = self.writer.take() else {
            return Ok(false);
        };
        let tmp = self.inprogress();
        w.finish()
            .map_err(|e| Error::Task(format!("finishing {}: {e}", tmp.display())))?;
        let file = w
            .into_inner()
            .map_err(|e| Error::Task(format!("finishing {}: {e}", tmp.display())))?;
        file.sync_all()
            .map_err(|e| Error::io(format!("syncing {}", tmp.display()), e))?;
        Ok(true)
    }

    fn publish(&self, id: CheckpointId, pending: &str) -> Result<()> {
        let from = self.dir.join(pending);
        let to = self.dir.join(self.committed_name(id));
        match std::fs::rename(&from, &to) {
            Ok(()) => Ok(()),
            // Committed already (a restore finishing an earlier commit).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => Ok(()),
            Err(e) => Err(Error::io(
                format!("committing {} as {}", from.display(), to.display()),
                e,
            )),
        }
    }
}

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
    }
}

impl Operator for IpcSink {
    fn process(&mut self, _input: InputId, batch: Batch, _out: &mut dyn Emitter) -> Result<()> {
        self.start()?;
        if self.writer.is_none() {
            let tmp = self.inprogress();
            let file = File::create(&tmp)
                .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
            let w = FileWriter::try_new(file, batch.schema_ref())
                .map_err(|e| Error::Task(format!("writing {}: {e}", tmp.display())))?;
            self.writer = Some(w);
        }
        let w = self.writer.as_mut().expect("writer set above");
        w.write(&batch)
            .map_err(|e| Error::Task(format!("writing {}: {e}", self.dir.display())))
    }

    /// Pre-commit: the data before barrier `id` becomes a pending file; the
    /// snapshot names every pending file, so a restore can finish the commit.
    fn snapshot(&mut self, id: CheckpointId) -> Result<Option<StateCapture>> {
        self.start()?;
        self.last_id = id;
        if self.close_writer()? {
            let name = self.pending_name(id);
            let to = self.dir.join(&name);
            std::fs::rename(self.inprogress(), &to)
                .map_err(|e| Error::io(format!("staging {}", to.display()), e))?;
            self.pending.insert(id, name);
        }
        let schema = Arc::new(Schema::new_with_metadata(
            vec![
                Field::new("checkpoint", DataType::UInt64, false),
                Field::new(FILE_COLUMN, DataType::Utf8, false),
            ],
            [(CHECKPOINT_METADATA.to_string(), id.to_string())].into(),
        ));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(UInt64Array::from_iter_values(self.pending.keys().copied())),
                Arc::new(StringArray::from_iter_values(self.pending.values())),
            ],
        )
        .map_err(|e| Error::Task(format!("ipc sink state: {e}")))?;
        Ok(Some(StateCapture {
            kind: StateKind::Full,
            batch,
            filter: None,
            times: None,
        }))
    }

    fn commit(&mut self, id: CheckpointId) -> Result<()> {
        let later = self.pending.split_off(&(id + 1));
        let ready = std::mem::replace(&mut self.pending, later);
        for (cid, name) in ready {
            crate::failpoint::hit("sink.before_commit_rename");
            self.publish(cid, &name)?;
            crate::failpoint::hit("sink.mid_commit");
        }
        Ok(())
    }

    fn restore(&mut self, chain: &[StateCapture]) -> Result<()> {
        let Some(state) = chain.last() else {
            return Ok(());
        };
        let bad = || {
            Error::Snapshot(format!(
                "ipc sink state of subtask {} lacks columns checkpoint/{FILE_COLUMN}",
                self.subtask
            ))
        };
        let ids = state
            .batch
            .column_by_name("checkpoint")
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
            .ok_or_else(bad)?;
        let files = state
            .batch
            .column_by_name(FILE_COLUMN)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(bad)?;
        let staged: Vec<(CheckpointId, String)> = ids
            .values()
            .iter()
            .zip(files.iter())
            .map(|(&id, f)| (id, f.unwrap_or_default().to_string()))
            .collect();
        let restored: CheckpointId = state
            .batch
            .schema_ref()
            .metadata()
            .get(CHECKPOINT_METADATA)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                Error::Snapshot(format!(
                    "ipc sink state of subtask {} does not name its checkpoint \
                     (schema metadata '{CHECKPOINT_METADATA}')",
                    self.subtask
                ))
            })?;
        // The restored checkpoint completed, so everything it staged commits.
        for (id, name) in &staged {
            self.publish(*id, name)?;
            // A crash here leaves some staged files published, some not: the
            // next restore must finish the job without publishing twice.
            crate::failpoint::hit("sink.during_restore");
        }
        self.started = true;
        self.last_id = restored;
        self.clean(&[], Some(restored))?;
        Ok(())
    }

    fn finish(&mut self, _out: &mut dyn Emitter) -> Result<()> {
        self.start()?;
        let rest = std::mem::take(&mut self.pending);
        for (cid, name) in rest {
            self.publish(cid, &name)?;
        }
        if self.close_writer()? {
            let id = self.last_id + 1;
            let to = self.dir.join(self.committed_name(id));
            std::fs::rename(self.inprogress(), &to).map_err(|e| {
                Error::io(
                    format!(
                        "renaming {} to {}",
                        self.inprogress().display(),
                        to.display()
                    ),
                    e,
                )
            })?;
        }
        Ok(())
    }
}

/// Writes Arrow IPC files `<dir>/part-<subtask>-<checkpoint>.arrow`, exactly
/// once: a file becomes visible under that name when the checkpoint that
/// ends it completes (or when the job ends); see [`IpcSink`]'s protocol.
pub fn ipc_file_sink(dir: impl AsRef<Path>) -> Result<Arc<dyn OperatorFactory>> {
    let dir = dir.as_ref().to_path_buf();
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let factory = move |subtask: usize, _: usize| -> Result<Box<dyn Operator>> {
        Ok(Box::new(IpcSink {
            dir: dir.clone(),
            subtask,
            writer: None,
            pending: BTreeMap::new(),
            started: false,
            last_id: 0,
        }))
    };
    Ok(Arc::new(factory))
}
