//! The shape of a physical job that failover reasons about: which task
//! sends to which, which tasks share a cycle, which channels are dealt
//! round-robin. [`super::PhysicalGraph::topology`] builds it; the failover
//! regions ([`super::Regions`]) and the restart rule ([`super::restart_set`])
//! read it. It lives apart from both so that neither needs the other's
//! module, nor the physical graph's, to know a job's shape (the simulator
//! builds one without a physical graph).

/// Index of a physical task in [`super::PhysicalGraph::tasks`].
pub type TaskIndex = usize;

/// The shape the failover rule needs: tasks, channels between them, and
/// which cycle (strongly connected group, with a shared termination
/// tracker) each task is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// `(from, to)` per channel.
    pub channels: Vec<(TaskIndex, TaskIndex)>,
    /// Per task: the id of its cycle, if any.
    pub cycle: Vec<Option<usize>>,
    /// Per channel: whether it belongs to a round-robin group (which
    /// channel a batch takes depends on where the dealing stood, not on the
    /// batch, and the dealing restarts with its sender).
    pub round_robin: Vec<bool>,
}

impl Topology {
    pub fn tasks(&self) -> usize {
        self.cycle.len()
    }
}
