//! Failover regions: the sets of tasks that must restart together.
//!
//! Flink restarts the *pipelined region* of a failed task: the tasks
//! connected to it by channels, in either direction. Tasks outside it share
//! no channel with it, so their state and in-flight data stay consistent
//! with the checkpoint the region restarts from. A forward edge connects
//! subtask i to subtask i only, so a forward-connected pipeline splits into
//! one region per subtask. Tasks on one cycle also share a termination
//! tracker, so they are kept in one region even when forward edges would
//! split them.

use super::topology::{TaskIndex, Topology};

/// Index of a region in [`Regions::members`].
pub type RegionIndex = usize;

/// The failover regions of a physical graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regions {
    /// Tasks of each region, ascending; regions ordered by their first task.
    pub members: Vec<Vec<TaskIndex>>,
    /// The region of each task.
    pub of_task: Vec<RegionIndex>,
}

impl Regions {
    /// One region per connected component of `topo`.
    pub fn of(topo: &Topology) -> Self {
        let n = topo.tasks();
        let mut parent: Vec<usize> = (0..n).collect();
        for &(from, to) in &topo.channels {
            union(&mut parent, from, to);
        }
        let mut first_on_cycle = std::collections::BTreeMap::new();
        for (t, cycle) in topo.cycle.iter().enumerate() {
            if let Some(c) = *cycle {
                let first = *first_on_cycle.entry(c).or_insert(t);
                union(&mut parent, first, t);
            }
        }
        Self::from_roots((0..n).map(|t| find(&mut parent, t)).collect())
    }

    /// One region per task: the cancellation units of the `upstream`
    /// strategy, whose restart sets are unions of them.
    pub fn singletons(topo: &Topology) -> Self {
        Self::from_roots((0..topo.tasks()).collect())
    }

    /// A single region holding every task (Flink's `full` failover strategy).
    pub fn whole(topo: &Topology) -> Self {
        Self::from_roots(vec![0; topo.tasks()])
    }

    fn from_roots(roots: Vec<usize>) -> Self {
        let mut index_of_root = std::collections::HashMap::new();
        let mut members: Vec<Vec<TaskIndex>> = Vec::new();
        let mut of_task = Vec::with_capacity(roots.len());
        for (t, root) in roots.into_iter().enumerate() {
            let r = *index_of_root.entry(root).or_insert_with(|| {
                members.push(Vec::new());
                members.len() - 1
            });
            members[r].push(t);
            of_task.push(r);
        }
        Self { members, of_task }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

fn union(parent: &mut [usize], a: usize, b: usize) {
    let (ra, rb) = (find(parent, a), find(parent, b));
    if ra != rb {
        parent[ra.max(rb)] = ra.min(rb);
    }
}
