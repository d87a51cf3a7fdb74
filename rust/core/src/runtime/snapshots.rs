//! [`InMemorySnapshots`]: a [`SnapshotSink`] that keeps completed checkpoints in memory.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{
    CheckpointMeta, CompletedCheckpoint, SnapshotSink, StateCapture, StateKind, TaskId,
    TaskSnapshot,
};

/// Keeps every completed checkpoint (retention is a store's business).
/// Incremental captures are rebuilt to full state at commit, so every
/// checkpoint held here restores on its own (`Job::restore_from`).
#[derive(Debug, Default)]
pub struct InMemorySnapshots {
    staged: Mutex<BTreeMap<CheckpointId, BTreeMap<TaskId, TaskSnapshot>>>,
    completed: Mutex<Vec<CompletedCheckpoint>>,
    aborted: Mutex<Vec<CheckpointId>>,
}

impl InMemorySnapshots {
    pub fn new() -> Self {
        Self::default()
    }

    /// Completed checkpoints, oldest first.
    pub fn completed(&self) -> Vec<CompletedCheckpoint> {
        self.completed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn latest(&self) -> Option<CompletedCheckpoint> {
        self.completed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .cloned()
    }

    pub fn get(&self, id: CheckpointId) -> Option<CompletedCheckpoint> {
        self.completed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|c| c.meta.id == id)
            .cloned()
    }

    /// Ids of aborted checkpoints.
    pub fn aborted(&self) -> Vec<CheckpointId> {
        self.aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl SnapshotSink for InMemorySnapshots {
    fn task_snapshot(&self, id: CheckpointId, mut snapshot: TaskSnapshot) -> Result<()> {
        // Kept in memory: a capture left as runs is merged now.
        if let Some(runs) = snapshot.state_runs.take() {
            snapshot.state = Some(runs.to_capture()?);
        }
        let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        let tasks = staged.entry(id).or_default();
        if tasks.contains_key(&snapshot.task) {
            return Err(Error::Snapshot(format!(
                "task {} reported checkpoint {id} twice",
                snapshot.task
            )));
        }
        tasks.insert(snapshot.task.clone(), snapshot);
        Ok(())
    }

    fn commit(&self, meta: CheckpointMeta) -> Result<()> {
        let mut tasks = self
            .staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&meta.id)
            .unwrap_or_default();
        let mut completed = self.completed.lock().unwrap_or_else(|e| e.into_inner());
        for (task, snap) in tasks.iter_mut() {
            let Some(StateCapture {
                kind: StateKind::Diff { base },
                batch,
                ..
            }) = &snap.state
            else {
                continue;
            };
            let base_state = completed
                .iter()
                .find(|c| c.meta.id == *base)
                .and_then(|c| c.tasks.get(task))
                .and_then(|t| t.state.clone())
                .ok_or_else(|| {
                    Error::Snapshot(format!(
                        "checkpoint {}: state diff of {task} is based on checkpoint {base}, \
                         which was not committed",
                        meta.id
                    ))
                })?;
            let mut table = crate::store::table_for(base_state.batch.schema_ref(), meta.id, task)?;
            table.restore(&[
                (*base, base_state),
                (
                    meta.id,
                    StateCapture {
                        kind: StateKind::Diff { base: *base },
                        batch: batch.clone(),
                        filter: None,
                        times: None,
                    },
                ),
            ])?;
            snap.state = Some(StateCapture {
                kind: StateKind::Full,
                batch: table.to_batch(),
                filter: None,
                times: None,
            });
        }
        completed.push(CompletedCheckpoint {
            meta,
            tasks,
            state_runs: BTreeMap::new(),
        });
        Ok(())
    }

    fn latest_completed(&self) -> Result<Option<CompletedCheckpoint>> {
        Ok(self.latest())
    }

    /// Every diff is rebuilt to full state at commit.
    fn materializes(&self) -> bool {
        true
    }

    fn abort(&self, id: CheckpointId) -> Result<()> {
        self.staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        self.aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id);
        Ok(())
    }
}
