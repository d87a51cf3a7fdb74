//! Which tasks restart when one fails: the failover strategies' rule, as a
//! pure function of the graph's shape. The runtime's coordinator and the
//! deterministic simulator ([`crate::sim::failover`]) both call
//! [`restart_set`], so the property tests check the rule the runtime runs.
//!
//! - `full`: every task.
//! - `region` (Flink's default): the failed task's pipelined region, the
//!   tasks connected to it by channels in either direction ([`Regions`]).
//! - `upstream` (SeaTunnel's regional failover): the failed task and its
//!   upstream closure only. Tasks downstream of that set keep running; the
//!   restarted senders replay from the checkpoint and the healthy receivers
//!   drop what they already took, recognised by per-channel sequence
//!   numbers. That needs a replay that re-sends the same records in the same
//!   order on every channel leaving the set, so the rule falls back to
//!   `region`, and says why, when a task feeding such a channel merges
//!   several inputs (their interleaving is timing, not data) or when the
//!   closure is the whole job anyway.

use super::regions::Regions;
use super::topology::{TaskIndex, Topology};
use crate::error::{Error, Result};

/// Which tasks restart after a task fails (Flink's
/// `jobmanager.execution.failover-strategy`, plus SeaTunnel's regional failover).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailoverStrategy {
    /// Only the failed task's region: the tasks connected to it by channels
    /// ([`Regions`]). Flink's default.
    #[default]
    Region,
    /// Every task of the job.
    Full,
    /// The failed task and its upstream closure; downstream tasks outside
    /// it keep running and drop replayed records by sequence number.
    Upstream,
}

impl FailoverStrategy {
    pub const ALL: [FailoverStrategy; 3] = [Self::Region, Self::Full, Self::Upstream];

    pub fn name(self) -> &'static str {
        match self {
            Self::Region => "region",
            Self::Full => "full",
            Self::Upstream => "upstream",
        }
    }

    /// The cancellation units of a job run under this strategy: a failure
    /// stops whole units, so every restart set must be a union of them.
    /// Under `upstream` each task is one, so a restart set can be any
    /// upstream closure.
    pub fn regions(self, topo: &Topology) -> Regions {
        match self {
            Self::Region => Regions::of(topo),
            Self::Full => Regions::whole(topo),
            Self::Upstream => Regions::singletons(topo),
        }
    }

    /// The regions whose numbers a restart reports: the cancellation units,
    /// except under `upstream`, whose units are single tasks and would say
    /// nothing; there the connected components (`region`'s units) are
    /// reported.
    pub fn reported_regions(self, topo: &Topology) -> Regions {
        match self {
            Self::Upstream => Regions::of(topo),
            other => other.regions(topo),
        }
    }
}

impl std::str::FromStr for FailoverStrategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "region" => Ok(Self::Region),
            "full" => Ok(Self::Full),
            "upstream" => Ok(Self::Upstream),
            other => Err(Error::Config(format!(
                "unknown failover strategy {other:?}; use \"region\" (restart the failed task's \
                 connected tasks), \"full\" (restart the whole job) or \"upstream\" (restart the \
                 failed task and its upstream only)"
            ))),
        }
    }
}

/// The tasks one failure restarts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartSet {
    /// Ascending task indices.
    pub tasks: Vec<TaskIndex>,
    /// Set when `upstream` could not be applied and `region` was used
    /// instead: why (reported in the run's restarts).
    pub fallback: Option<String>,
}

/// The tasks that restart when `failed` fails, under `strategy`. `name`
/// names a task in the fallback reason.
pub fn restart_set(
    strategy: FailoverStrategy,
    topo: &Topology,
    failed: TaskIndex,
    name: &dyn Fn(TaskIndex) -> String,
) -> RestartSet {
    let n = topo.tasks();
    let region = || {
        let regions = Regions::of(topo);
        regions.members[regions.of_task[failed]].clone()
    };
    match strategy {
        FailoverStrategy::Full => RestartSet {
            tasks: (0..n).collect(),
            fallback: None,
        },
        FailoverStrategy::Region => RestartSet {
            tasks: region(),
            fallback: None,
        },
        FailoverStrategy::Upstream => {
            let set = upstream_closure(topo, failed);
            match upstream_obstacle(topo, &set, failed, name) {
                None => RestartSet {
                    tasks: members(&set),
                    fallback: None,
                },
                Some(reason) => RestartSet {
                    tasks: region(),
                    fallback: Some(reason),
                },
            }
        }
    }
}

/// `failed` and every task with a path to it; a task on a cycle brings its
/// whole cycle (one termination unit), and that cycle's upstream.
pub fn upstream_closure(topo: &Topology, failed: TaskIndex) -> Vec<bool> {
    let n = topo.tasks();
    let mut inputs: Vec<Vec<TaskIndex>> = vec![Vec::new(); n];
    for &(from, to) in &topo.channels {
        inputs[to].push(from);
    }
    let mut in_set = vec![false; n];
    let mut stack = vec![failed];
    while let Some(t) = stack.pop() {
        if std::mem::replace(&mut in_set[t], true) {
            continue;
        }
        stack.extend(inputs[t].iter().copied().filter(|&u| !in_set[u]));
        if let Some(c) = topo.cycle[t] {
            stack.extend((0..n).filter(|&u| topo.cycle[u] == Some(c) && !in_set[u]));
        }
    }
    in_set
}

/// Why restarting only `set` would not be exactly-once, if it would not.
fn upstream_obstacle(
    topo: &Topology,
    set: &[bool],
    failed: TaskIndex,
    name: &dyn Fn(TaskIndex) -> String,
) -> Option<String> {
    let n = topo.tasks();
    if set.iter().all(|&s| s) {
        return Some(format!(
            "the upstream of {} is the whole job: restarted its region",
            name(failed)
        ));
    }
    // Tasks whose output reaches a healthy task: the senders of channels
    // leaving the set, and everything upstream of them.
    let mut feeds_out = vec![false; n];
    let mut stack: Vec<TaskIndex> = topo
        .channels
        .iter()
        .filter(|&&(from, to)| set[from] && !set[to])
        .map(|&(from, _)| from)
        .collect();
    let mut in_degree = vec![0usize; n];
    let mut inputs: Vec<Vec<TaskIndex>> = vec![Vec::new(); n];
    for &(from, to) in &topo.channels {
        in_degree[to] += 1;
        inputs[to].push(from);
    }
    while let Some(t) = stack.pop() {
        if std::mem::replace(&mut feeds_out[t], true) {
            continue;
        }
        stack.extend(inputs[t].iter().copied().filter(|&u| !feeds_out[u]));
    }
    let dealt_out = topo
        .channels
        .iter()
        .zip(&topo.round_robin)
        .find(|&(&(from, to), &rr)| rr && set[from] && !set[to]);
    if let Some((&(from, _), _)) = dealt_out {
        return Some(format!(
            "{} deals batches round-robin to tasks outside the upstream of {}: a replayed \
             batch could take another channel, so healthy tasks could not tell replayed records \
             by sequence number; restarted the region instead",
            name(from),
            name(failed)
        ));
    }
    let merging = (0..n).find(|&t| feeds_out[t] && in_degree[t] > 1)?;
    Some(format!(
        "{} merges {} input channels and feeds tasks outside the upstream of {}: its replay \
         order would depend on timing, so healthy tasks could not tell replayed records by \
         sequence number; restarted the region instead",
        name(merging),
        in_degree[merging],
        name(failed)
    ))
}

fn members(set: &[bool]) -> Vec<TaskIndex> {
    (0..set.len()).filter(|&t| set[t]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(channels: &[(usize, usize)], cycle: Vec<Option<usize>>) -> Topology {
        Topology {
            channels: channels.to_vec(),
            round_robin: vec![false; channels.len()],
            cycle,
        }
    }

    fn name(t: TaskIndex) -> String {
        format!("t{t}")
    }

    #[test]
    fn strategy_names_round_trip_and_a_bad_name_says_the_choices() {
        for s in FailoverStrategy::ALL {
            assert_eq!(s.name().parse::<FailoverStrategy>().unwrap(), s);
        }
        let e = "regional"
            .parse::<FailoverStrategy>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"region\"") && e.contains("\"full\"") && e.contains("\"upstream\""),
            "{e}"
        );
    }

    #[test]
    fn each_strategy_cancels_its_own_units_and_reports_components_under_upstream() {
        // Two pipelines: 0 -> 1 and 2 -> 3.
        let t = topo(&[(0, 1), (2, 3)], vec![None; 4]);
        let units = |s: FailoverStrategy| s.regions(&t).members;
        assert_eq!(
            units(FailoverStrategy::Region),
            vec![vec![0, 1], vec![2, 3]]
        );
        assert_eq!(units(FailoverStrategy::Full), vec![vec![0, 1, 2, 3]]);
        assert_eq!(
            units(FailoverStrategy::Upstream),
            vec![vec![0], vec![1], vec![2], vec![3]]
        );
        for s in [FailoverStrategy::Region, FailoverStrategy::Full] {
            assert_eq!(s.reported_regions(&t), s.regions(&t));
        }
        assert_eq!(
            FailoverStrategy::Upstream.reported_regions(&t),
            FailoverStrategy::Region.regions(&t)
        );
    }

    #[test]
    fn a_failed_sink_of_a_fan_out_restarts_with_its_upstream_only() {
        // source 0 -> stage 1 -> sinks 2, 3, 4
        let t = topo(&[(0, 1), (1, 2), (1, 3), (1, 4)], vec![None; 5]);
        let s = restart_set(FailoverStrategy::Upstream, &t, 3, &name);
        assert_eq!(s.tasks, vec![0, 1, 3]);
        assert_eq!(s.fallback, None);
        assert_eq!(
            restart_set(FailoverStrategy::Region, &t, 3, &name).tasks,
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(
            restart_set(FailoverStrategy::Full, &t, 3, &name).tasks,
            vec![0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn a_failed_middle_task_restarts_its_upstream_not_its_downstream() {
        // 0 -> 1 -> 2 -> 3, and 0 -> 4
        let t = topo(&[(0, 1), (1, 2), (2, 3), (0, 4)], vec![None; 5]);
        let s = restart_set(FailoverStrategy::Upstream, &t, 2, &name);
        assert_eq!(s.tasks, vec![0, 1, 2]);
    }

    #[test]
    fn a_back_edge_makes_the_cycle_one_unit() {
        // 0 -> 1 -> 2 -> 1 (back-edge), 2 -> 3, cycle {1, 2}; 3 fails.
        let t = topo(
            &[(0, 1), (1, 2), (2, 1), (2, 3), (0, 4)],
            vec![None, Some(0), Some(0), None, None],
        );
        let closure = upstream_closure(&t, 3);
        assert_eq!(members(&closure), vec![0, 1, 2, 3]);
        // Task 1 merges the source and the back-edge, but nothing in the
        // closure feeds a task outside it except 0 (to 4), which has no inputs.
        let s = restart_set(FailoverStrategy::Upstream, &t, 3, &name);
        assert_eq!(s.tasks, vec![0, 1, 2, 3]);
        assert_eq!(s.fallback, None);
        // Failing a task on the cycle brings the whole cycle, even the
        // member downstream of it.
        assert_eq!(members(&upstream_closure(&t, 1)), vec![0, 1, 2]);
        // Task 1 merges and feeds 3 through 2: falls back, naming the merge.
        let s = restart_set(FailoverStrategy::Upstream, &t, 1, &name);
        assert_eq!(s.tasks, vec![0, 1, 2, 3, 4]);
        assert!(
            s.fallback.as_deref().unwrap().contains("t1 merges 2"),
            "{s:?}"
        );
    }

    #[test]
    fn tasks_sharing_a_cycle_id_restart_together_even_when_forward_edges_split_them() {
        // Two parallel copies of a loop (forward edges) share cycle id 0.
        let t = topo(
            &[(0, 1), (1, 0), (2, 3), (3, 2), (1, 4), (3, 5)],
            vec![Some(0), Some(0), Some(0), Some(0), None, None],
        );
        assert_eq!(members(&upstream_closure(&t, 4)), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_merge_feeding_a_healthy_task_falls_back_to_the_region_and_says_why() {
        // sources 0, 1 -> shuffle into 2, 3 -> sinks 4 (from 2), 5 (from 2)
        let t = topo(
            &[(0, 2), (1, 2), (0, 3), (1, 3), (2, 4), (2, 5), (3, 5)],
            vec![None; 6],
        );
        let s = restart_set(FailoverStrategy::Upstream, &t, 4, &name);
        assert_eq!(s.tasks, vec![0, 1, 2, 3, 4, 5]);
        let why = s.fallback.unwrap();
        assert!(why.contains("t2 merges 2 input channels"), "{why}");
        // The failed task itself may merge: nothing it sends leaves the set.
        let t = topo(&[(0, 2), (1, 2), (0, 3)], vec![None; 4]);
        let s = restart_set(FailoverStrategy::Upstream, &t, 2, &name);
        assert_eq!((s.tasks, s.fallback), (vec![0, 1, 2], None));
    }

    #[test]
    fn round_robin_dealing_to_a_healthy_task_falls_back() {
        // 0 deals round-robin to 1 and 2; 1 fails.
        let mut t = topo(&[(0, 1), (0, 2)], vec![None; 3]);
        t.round_robin = vec![true, true];
        let s = restart_set(FailoverStrategy::Upstream, &t, 1, &name);
        assert_eq!(s.tasks, vec![0, 1, 2]);
        assert!(s.fallback.unwrap().contains("t0 deals batches round-robin"));
        // Dealing only inside the restarted set is replayed as it was.
        let mut t = topo(&[(0, 1), (0, 2), (1, 3), (2, 3), (0, 4)], vec![None; 5]);
        t.round_robin = vec![true, true, false, false, false];
        let s = restart_set(FailoverStrategy::Upstream, &t, 3, &name);
        assert_eq!((s.tasks, s.fallback), (vec![0, 1, 2, 3], None));
    }

    #[test]
    fn an_upstream_that_is_the_whole_job_degenerates_to_the_region() {
        let t = topo(&[(0, 1), (1, 2)], vec![None; 3]);
        let s = restart_set(FailoverStrategy::Upstream, &t, 2, &name);
        assert_eq!(s.tasks, vec![0, 1, 2]);
        assert!(s.fallback.unwrap().contains("whole job"));
    }
}
