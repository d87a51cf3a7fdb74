//! Sinks: an in-memory collector (two-phase commit) and an Arrow IPC file per subtask.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_ipc::writer::FileWriter;

use crate::error::{Error, Result};
use crate::protocol::{CheckpointId, InputId};
use crate::runtime::operator::{Batch, Emitter, Operator, OperatorFactory};

/// What a [`collect_sink`] received, readable after (or during) the run.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    committed: Arc<Mutex<Vec<RecordBatch>>>,
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
}

struct CollectSink {
    out: Collected,
    staged: Vec<RecordBatch>,
    pre_committed: BTreeMap<CheckpointId, Vec<RecordBatch>>,
}

impl CollectSink {
    fn publish(&self, batches: Vec<RecordBatch>) {
        self.out
            .committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(batches);
    }
}

impl Operator for CollectSink {
    fn process(&mut self, _input: InputId, batch: Batch, _out: &mut dyn Emitter) -> Result<()> {
        self.staged.push(batch);
        Ok(())
    }

    fn pre_commit(&mut self, id: CheckpointId) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        self.pre_committed.insert(id, staged);
        Ok(())
    }

    fn commit(&mut self, id: CheckpointId) -> Result<()> {
        let later = self.pre_committed.split_off(&(id + 1));
        let ready = std::mem::replace(&mut self.pre_committed, later);
        for (_, batches) in ready {
            self.publish(batches);
        }
        Ok(())
    }

    /// The job ended successfully: what is left is final output.
    fn finish(&mut self, _out: &mut dyn Emitter) -> Result<()> {
        let rest = std::mem::take(&mut self.pre_committed);
        for (_, batches) in rest {
            self.publish(batches);
        }
        let staged = std::mem::take(&mut self.staged);
        self.publish(staged);
        Ok(())
    }
}

/// A sink that keeps what it receives in memory. Output before barrier n is
/// published when checkpoint n completes (two-phase commit); the rest when
/// the job ends.
pub fn collect_sink() -> (Arc<dyn OperatorFactory>, Collected) {
    let out = Collected::default();
    let shared = out.clone();
    let factory = move |_: usize, _: usize| -> Result<Box<dyn Operator>> {
        Ok(Box::new(CollectSink {
            out: shared.clone(),
            staged: Vec::new(),
            pre_committed: BTreeMap::new(),
        }))
    };
    (Arc::new(factory), out)
}

struct IpcSink {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<FileWriter<File>>,
}

impl Operator for IpcSink {
    fn process(&mut self, _input: InputId, batch: Batch, _out: &mut dyn Emitter) -> Result<()> {
        if self.writer.is_none() {
            let file = File::create(&self.tmp)
                .map_err(|e| Error::io(format!("creating {}", self.tmp.display()), e))?;
            let w = FileWriter::try_new(file, batch.schema_ref())
                .map_err(|e| Error::Task(format!("writing {}: {e}", self.tmp.display())))?;
            self.writer = Some(w);
        }
        let w = self.writer.as_mut().expect("writer set above");
        w.write(&batch)
            .map_err(|e| Error::Task(format!("writing {}: {e}", self.tmp.display())))
    }

    fn finish(&mut self, _out: &mut dyn Emitter) -> Result<()> {
        if let Some(mut w) = self.writer.take() {
            w.finish()
                .map_err(|e| Error::Task(format!("finishing {}: {e}", self.tmp.display())))?;
            drop(w);
            std::fs::rename(&self.tmp, &self.path).map_err(|e| {
                Error::io(
                    format!("renaming {} to {}", self.tmp.display(), self.path.display()),
                    e,
                )
            })?;
        }
        Ok(())
    }
}

/// Writes `<dir>/part-<subtask>.arrow` (Arrow IPC file format), visible
/// under that name once the subtask's input has ended; a subtask that
/// received nothing writes no file.
pub fn ipc_file_sink(dir: impl AsRef<Path>) -> Result<Arc<dyn OperatorFactory>> {
    let dir = dir.as_ref().to_path_buf();
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let factory = move |subtask: usize, _: usize| -> Result<Box<dyn Operator>> {
        Ok(Box::new(IpcSink {
            path: dir.join(format!("part-{subtask}.arrow")),
            tmp: dir.join(format!("part-{subtask}.arrow.inprogress")),
            writer: None,
        }))
    };
    Ok(Arc::new(factory))
}
