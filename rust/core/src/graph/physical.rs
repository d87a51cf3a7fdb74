//! Expansion of a validated logical graph into physical tasks and channels.

use super::topology::{TaskIndex, Topology};
use super::validate::validate;
use super::{EdgeId, LogicalGraph, Partitioning, VertexId, VertexKind};
use crate::error::Result;
use crate::protocol::{InputId, InputKind};
use crate::snapshot::TaskId;

/// Index of a physical channel in [`PhysicalGraph::channels`].
pub type ChannelId = usize;

/// One SPSC channel between two subtasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhysicalChannel {
    pub edge: EdgeId,
    pub from: TaskIndex,
    pub to: TaskIndex,
    /// The input index of this channel at the receiving task.
    pub to_input: InputId,
    pub from_subtask: usize,
    pub kind: InputKind,
    /// Stable name of the logical edge, `"<to>:<port>"`-free: `"to<-from"`.
    pub edge_name: String,
    /// Whether both ends lie on one cycle (records can come round again).
    pub in_cycle: bool,
}

/// The channels of one logical out-edge of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputGroup {
    pub edge: EdgeId,
    pub port: usize,
    pub partitioning: Partitioning,
    /// One channel per receiving subtask, in subtask order (a single one for `Forward`).
    pub channels: Vec<ChannelId>,
}

/// One subtask of a vertex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhysicalTask {
    pub id: TaskId,
    pub vertex: VertexId,
    pub parallelism: usize,
    pub is_source: bool,
    /// Input channels, by input index.
    pub inputs: Vec<ChannelId>,
    pub input_kinds: Vec<InputKind>,
    pub outputs: Vec<OutputGroup>,
    /// Id of the cycle (strongly connected component) the vertex is on, if any.
    pub cycle: Option<usize>,
}

/// Tasks and channels of a job, ready to run.
#[derive(Clone, Debug)]
pub struct PhysicalGraph {
    pub tasks: Vec<PhysicalTask>,
    pub channels: Vec<PhysicalChannel>,
    /// Per logical edge: whether it is a back-edge.
    pub back_edges: Vec<bool>,
    pub fingerprint: String,
}

impl PhysicalGraph {
    /// The shape the failover rule works on.
    pub fn topology(&self) -> Topology {
        Topology {
            channels: self.channels.iter().map(|c| (c.from, c.to)).collect(),
            cycle: self.tasks.iter().map(|t| t.cycle).collect(),
            round_robin: self
                .channels
                .iter()
                .map(|c| {
                    self.tasks[c.from]
                        .outputs
                        .iter()
                        .any(|g| g.edge == c.edge && g.partitioning == Partitioning::RoundRobin)
                })
                .collect(),
        }
    }

    /// The task running `subtask` of vertex `name`.
    pub fn task(&self, name: &str, subtask: usize) -> Option<&PhysicalTask> {
        self.tasks
            .iter()
            .find(|t| t.id.vertex == name && t.id.subtask == subtask)
    }
}

pub(crate) fn expand(g: &LogicalGraph) -> Result<PhysicalGraph> {
    let analysis = validate(g)?;
    let mut tasks = Vec::new();
    let mut base = Vec::with_capacity(g.vertices.len());
    for (vi, v) in g.vertices.iter().enumerate() {
        base.push(tasks.len());
        for s in 0..v.parallelism {
            tasks.push(PhysicalTask {
                id: TaskId {
                    vertex: v.name.clone(),
                    subtask: s,
                },
                vertex: vi,
                parallelism: v.parallelism,
                is_source: matches!(v.kind, VertexKind::Source(_)),
                inputs: Vec::new(),
                input_kinds: Vec::new(),
                outputs: Vec::new(),
                cycle: analysis.cycle[vi],
            });
        }
    }
    let mut channels = Vec::new();
    for (ei, e) in g.edges.iter().enumerate() {
        let (from, to) = (&g.vertices[e.from], &g.vertices[e.to]);
        let kind = if analysis.back_edge[ei] {
            InputKind::BackEdge
        } else {
            InputKind::Regular
        };
        let in_cycle =
            analysis.cycle[e.from].is_some() && analysis.cycle[e.from] == analysis.cycle[e.to];
        let edge_name = format!("{}<-{}", to.name, from.name);
        for su in 0..from.parallelism {
            let targets: Vec<usize> = match e.partitioning {
                Partitioning::Forward => vec![su],
                _ => (0..to.parallelism).collect(),
            };
            let mut group = OutputGroup {
                edge: ei,
                port: e.port,
                partitioning: e.partitioning.clone(),
                channels: Vec::with_capacity(targets.len()),
            };
            for sv in targets {
                let (ft, tt) = (base[e.from] + su, base[e.to] + sv);
                let id = channels.len();
                let to_input = tasks[tt].inputs.len();
                tasks[tt].inputs.push(id);
                tasks[tt].input_kinds.push(kind);
                channels.push(PhysicalChannel {
                    edge: ei,
                    from: ft,
                    to: tt,
                    to_input,
                    from_subtask: su,
                    kind,
                    edge_name: edge_name.clone(),
                    in_cycle,
                });
                group.channels.push(id);
            }
            tasks[base[e.from] + su].outputs.push(group);
        }
    }
    Ok(PhysicalGraph {
        tasks,
        channels,
        back_edges: analysis.back_edge,
        fingerprint: super::fingerprint::fingerprint(g),
    })
}
