//! A state's runs (format 2) for writers that keep them across processes
//! (a Spark state root's tasks): the runs a committed state is made of, a
//! compactor of one process that merges them off the task's path, and a
//! later commit adopting what any process's compactor merged. The rules
//! are `snapcut_core::store::format` (`runs_of`, `plan_compaction`,
//! `merged_run`, `adopt`); the merge is the store's `Compactor`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use snapcut_core::store::format::{self, MergeKind};
use snapcut_core::store::{
    CompactionBudget, CompactionHold, CompactionJob, CompactionOutput, Compactor, FileEntry, Fsync,
    FsyncMode, RunEntry,
};

use super::io::Io;
use super::{entry_dict, entry_of, task};
use crate::errors::IntoPyResult;
use crate::pyjson::{from_py, to_py};

/// The runs `(vertex, subtask)`'s state at checkpoint `checkpoint_id` is
/// made of (`manifest`: its manifest bytes), newest first, checked: those
/// its entry lists, or those its chain implies (format 1, each link's
/// manifest from `manifest_of(id)`); None when the manifest holds no state
/// for the task.
#[pyfunction]
fn state_runs<'py>(
    py: Python<'py>,
    checkpoint_id: u64,
    manifest: &[u8],
    vertex: &str,
    subtask: usize,
    manifest_of: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let t = task(vertex, subtask);
    let top = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let Some(entry) = top.state_file(&t) else {
        return Ok(None);
    };
    let io = Io::new(manifest_of);
    let runs = format::runs_of(checkpoint_id, &t, entry, |cid| io.manifest(cid))
        .and_then(|runs| format::check_runs(checkpoint_id, &t, &runs).map(|()| runs));
    let runs = io.finish(runs)?;
    to_py(py, &runs).map(Some)
}

/// `entry` (a state file entry that lists runs) with a compaction's
/// `output` in place of its `inputs`, the output's file in checkpoint
/// `at`'s directory (the adopting checkpoint's where the file is linked
/// there, an older one's where it was stored there); None when the inputs are no longer among the
/// entry's runs, contiguous and in order (a full captured since, another
/// compaction adopted): the output is then of no use.
#[pyfunction]
fn adopt_run<'py>(
    py: Python<'py>,
    entry: &Bound<'py, PyAny>,
    inputs: &Bound<'py, PyAny>,
    output: &Bound<'py, PyAny>,
    at: u64,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let mut entry = entry_of(entry)?;
    let inputs: Vec<RunEntry> = from_py(inputs, "a compaction's input runs")?;
    let mut output: RunEntry = from_py(output, "a compaction's output run")?;
    output.checkpoint = at;
    let Some(runs) = format::adopt(&entry.runs, &inputs, output) else {
        return Ok(None);
    };
    entry.runs = runs;
    entry.chain = format::runs_chain(&entry.runs);
    entry_dict(py, &entry).map(Some)
}

/// A compaction input's checkpoint and its file entry.
type InputFile<'py> = (u64, Bound<'py, PyAny>);

/// The files the compaction `runs` (of `(vertex, subtask)`, newest first)
/// call for with `limit` diffs on their full (`plan_compaction`) reads:
/// `(checkpoint, file entry)` of each input, for a caller that fetches them
/// to where a [`RunCompactor`] reads them (a remote root's); None when the
/// runs call for no compaction.
#[pyfunction]
fn compaction_inputs<'py>(
    py: Python<'py>,
    vertex: &str,
    subtask: usize,
    runs: &Bound<'py, PyAny>,
    limit: usize,
) -> PyResult<Option<Vec<InputFile<'py>>>> {
    let runs: Vec<RunEntry> = from_py(runs, "a state's runs")?;
    let Some(plan) = format::plan_compaction(&runs, limit) else {
        return Ok(None);
    };
    let t = task(vertex, subtask);
    plan.inputs
        .iter()
        .map(|r| Ok((r.checkpoint, to_py(py, &r.file_entry(&t, None))?)))
        .collect::<PyResult<Vec<_>>>()
        .map(Some)
}

/// Whether `runs` (newest first) still hold a compaction's `inputs`,
/// contiguous and in order, so that a state built on them can adopt its
/// `output` ([`adopt_run`]).
#[pyfunction]
fn adoptable(
    runs: &Bound<'_, PyAny>,
    inputs: &Bound<'_, PyAny>,
    output: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    let runs: Vec<RunEntry> = from_py(runs, "a state's runs")?;
    let inputs: Vec<RunEntry> = from_py(inputs, "a compaction's input runs")?;
    let output: RunEntry = from_py(output, "a compaction's output run")?;
    Ok(format::adopt(&runs, &inputs, output).is_some())
}

/// What state file `entries` (a list of manifest file entries) say of
/// their runs, by the store's rule for its checkpoints' metrics
/// (`run_counts`): `runs_max` (the most runs one entry's state is made of:
/// what a cold task reads), `runs_total` and `debt_bytes` (the bytes of
/// their diff runs: what compaction folds into a full).
#[pyfunction]
fn run_counts<'py>(py: Python<'py>, entries: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let entries: Vec<FileEntry> = from_py(entries, "state file entries")?;
    let c = format::state_run_counts(&entries);
    let d = PyDict::new(py);
    d.set_item("runs_max", c.runs_max)?;
    d.set_item("runs_total", c.runs_total)?;
    d.set_item("debt_bytes", c.debt_bytes)?;
    Ok(d)
}

/// Refuses a compactor's budget outside its bounds (a share of one core
/// in [0.01, 1], a positive byte rate or None), naming the setting: what
/// [`RunCompactor`] would refuse, checked where the setting is given.
#[pyfunction]
#[pyo3(signature = (cpu_share, bytes_per_s = None))]
fn check_compaction_budget(cpu_share: f64, bytes_per_s: Option<u64>) -> PyResult<()> {
    CompactionBudget {
        cpu_share,
        bytes_per_s,
    }
    .validate()
    .map_py()
}

/// One process's compactor over a local root: merges runs on its own
/// thread (paced by a CPU share and a byte rate), its outputs staged in a
/// directory of its own; the caller publishes each finished output for any
/// process's commit to adopt ([`adopt_run`]). Closing it (or dropping it)
/// stops the thread: a merge in hand is abandoned, its partial output left
/// in the staging directory.
#[pyclass(module = "snapcut._core.format", name = "RunCompactor", frozen)]
struct RunCompactor {
    inner: Mutex<Option<Arc<Compactor>>>,
}

impl RunCompactor {
    fn compactor(&self) -> PyResult<Arc<Compactor>> {
        self.inner
            .lock()
            .expect("compactor poisoned")
            .clone()
            .ok_or_else(|| crate::errors::ConfigError::new_err("this RunCompactor was closed"))
    }
}

/// A finished output as Python takes it: where its files wait, what it
/// merged, and its run entry (its checkpoint set by whoever adopts it).
fn output_dict<'py>(py: Python<'py>, done: &CompactionOutput) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("vertex", &done.task.vertex)?;
    d.set_item("subtask", done.task.subtask)?;
    d.set_item("staged", done.staged.to_string_lossy().as_ref())?;
    let filter = done
        .filter
        .as_ref()
        .map(|f| done.staged_filter(f).to_string_lossy().into_owned());
    d.set_item("staged_filter", filter)?;
    let times = done
        .times
        .as_ref()
        .map(|t| done.staged_times(t).to_string_lossy().into_owned());
    d.set_item("staged_times", times)?;
    d.set_item(
        "kind",
        match done.plan.kind {
            MergeKind::Tier => "tier",
            MergeKind::Base => "base",
        },
    )?;
    d.set_item("inputs", to_py(py, &done.plan.inputs)?)?;
    let output = format::merged_run(
        &done.plan,
        0,
        done.name.clone(),
        done.written,
        done.key_range.clone(),
        done.filter.clone(),
        done.times.clone(),
    );
    d.set_item("output", to_py(py, &output)?)?;
    Ok(d)
}

#[pymethods]
impl RunCompactor {
    /// A compactor reading the runs of the local root `root`, staging its
    /// outputs in `staging` (cleared first: one compactor's own). Each
    /// output file is fsynced. `cpu_share` (0.01 to 1) of one core and
    /// `bytes_per_s` (None: no limit) bound its work; `pause_s` it sleeps
    /// before each job.
    #[new]
    #[pyo3(signature = (root, staging, cpu_share = 1.0, bytes_per_s = None, pause_s = 0.0))]
    fn new(
        root: PathBuf,
        staging: PathBuf,
        cpu_share: f64,
        bytes_per_s: Option<u64>,
        pause_s: f64,
    ) -> PyResult<Self> {
        let pause = Duration::try_from_secs_f64(pause_s).map_err(|_| {
            crate::errors::ConfigError::new_err(format!(
                "pause_s must be a number of seconds >= 0, got {pause_s}"
            ))
        })?;
        let budget = CompactionBudget {
            cpu_share,
            bytes_per_s,
        };
        let fsync = Arc::new(Fsync::new(FsyncMode::PerFile));
        let inner = Compactor::start_in(root, staging, fsync, pause, budget).map_py()?;
        Ok(Self {
            inner: Mutex::new(Some(Arc::new(inner))),
        })
    }

    /// Hands the compaction `runs` (of `(vertex, subtask)`, newest first,
    /// keyed by `key`) call for with `limit` diffs on their full
    /// (`plan_compaction`) to the thread, without waiting: True if one was
    /// handed over; False if they call for none, or the queue is full, or
    /// the task has one in flight or its runs cannot be merged.
    fn submit(
        &self,
        vertex: &str,
        subtask: usize,
        key: &str,
        runs: &Bound<'_, PyAny>,
        limit: usize,
    ) -> PyResult<bool> {
        let runs: Vec<RunEntry> = from_py(runs, "a state's runs")?;
        let Some(plan) = format::plan_compaction(&runs, limit) else {
            return Ok(false);
        };
        Ok(self.compactor()?.submit(CompactionJob {
            task: task(vertex, subtask),
            key: Some(key.into()),
            plan,
        }))
    }

    /// The outputs finished since the last call, waiting at most
    /// `timeout_s` seconds for one (the GIL released): dicts of `vertex`,
    /// `subtask`, `staged` (its file), `staged_filter` (a diff output's
    /// filter, or None), `staged_times` (a full output's time index, or None), `kind` ("tier" or "base"), `inputs` (the runs it
    /// merged) and `output` (its run entry). Each is the caller's from now
    /// on: its task may be compacted again.
    fn wait_finished<'py>(
        &self,
        py: Python<'py>,
        timeout_s: f64,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let compactor = self.compactor()?;
        let timeout = Duration::try_from_secs_f64(timeout_s).map_err(|_| {
            crate::errors::ConfigError::new_err(format!(
                "timeout_s must be a number of seconds >= 0, got {timeout_s}"
            ))
        })?;
        let done = py.detach(|| {
            let until = Instant::now() + timeout;
            loop {
                let done = compactor.take_finished();
                if !done.is_empty() || Instant::now() >= until {
                    return done;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let out = done
            .iter()
            .map(|d| output_dict(py, d))
            .collect::<PyResult<Vec<_>>>()?;
        for d in &done {
            compactor.handed_over(d);
        }
        Ok(out)
    }

    /// The `(vertex, subtask)` of every job that ended with no output since
    /// the last call (its merge failed: an input gone or unreadable, data
    /// that runs cannot order; or the compactor stopped first).
    fn take_dropped(&self) -> PyResult<Vec<(String, usize)>> {
        Ok(self
            .compactor()?
            .take_dropped()
            .into_iter()
            .map(|t| (t.vertex, t.subtask))
            .collect())
    }

    /// Waits until every job handed over is done, at most `timeout_s`
    /// seconds; False if it ran out.
    fn wait_idle(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
        let compactor = self.compactor()?;
        let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
        Ok(py.detach(|| compactor.wait_idle(timeout)))
    }

    /// Keeps every job from starting its merge until the hold's
    /// `release()` (at most 120 s): for tests and tools.
    fn hold(&self) -> PyResult<RunCompactorHold> {
        Ok(RunCompactorHold {
            hold: Mutex::new(Some(self.compactor()?.hold())),
        })
    }

    /// What it did so far (`snapcut.CompactionStats`'s fields).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::store::compaction_dict(py, &self.compactor()?.stats())
    }

    /// Stops the thread (waiting at most 10 s for it); idempotent.
    fn close(&self, py: Python<'_>) {
        let inner = self.inner.lock().expect("compactor poisoned").take();
        py.detach(|| drop(inner));
    }
}

/// A [`RunCompactor::hold`]: no merge starts until `release()`.
#[pyclass(module = "snapcut._core.format", name = "RunCompactorHold", frozen)]
struct RunCompactorHold {
    hold: Mutex<Option<CompactionHold>>,
}

#[pymethods]
impl RunCompactorHold {
    fn release(&self) {
        self.hold.lock().expect("hold poisoned").take();
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(state_runs, m)?)?;
    m.add_function(wrap_pyfunction!(adopt_run, m)?)?;
    m.add_function(wrap_pyfunction!(adoptable, m)?)?;
    m.add_function(wrap_pyfunction!(compaction_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(run_counts, m)?)?;
    m.add_function(wrap_pyfunction!(check_compaction_budget, m)?)?;
    m.add_class::<RunCompactor>()?;
    m.add_class::<RunCompactorHold>()?;
    Ok(())
}
