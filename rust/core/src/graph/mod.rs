//! Logical dataflow graph → physical tasks and channels; back-edge detection.
//!
//! The builder API below is fixed (the bindings build graphs with it); the
//! physical expansion and validation are in this module's submodules.

use std::sync::Arc;

use crate::operator::{OperatorFactory, SourceFactory};

pub mod failover;
mod fingerprint;
mod physical;
mod regions;
mod topology;
mod validate;

#[cfg(test)]
mod tests;

pub use failover::{restart_set, FailoverStrategy, RestartSet};
pub use physical::{ChannelId, OutputGroup, PhysicalChannel, PhysicalGraph, PhysicalTask};
pub use regions::{RegionIndex, Regions};
pub use topology::{TaskIndex, Topology};

/// Index of a logical vertex in a [`LogicalGraph`].
pub type VertexId = usize;
/// Index of a logical edge in a [`LogicalGraph`].
pub type EdgeId = usize;

/// How records of one logical edge are spread over the downstream subtasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Partitioning {
    /// Subtask i → subtask i (parallelism must match).
    Forward,
    /// By hash of a key column (the same key always reaches the same subtask).
    Hash { key: String },
    /// Every record to every downstream subtask.
    Broadcast,
    /// Whole batches dealt out in turn.
    RoundRobin,
}

/// What a vertex runs.
#[derive(Clone)]
pub enum VertexKind {
    Source(Arc<dyn SourceFactory>),
    Operator(Arc<dyn OperatorFactory>),
}

impl std::fmt::Debug for VertexKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VertexKind::Source(_) => f.write_str("Source"),
            VertexKind::Operator(_) => f.write_str("Operator"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Vertex {
    pub name: String,
    pub parallelism: usize,
    pub kind: VertexKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from: VertexId,
    pub to: VertexId,
    pub partitioning: Partitioning,
    /// Declared as the feedback edge of an iteration. Back-edges are also
    /// found by analysis; declaring one documents intent and is checked.
    pub feedback: bool,
    /// Output port of `from` this edge leaves on (0 unless set with
    /// [`LogicalGraph::set_output_port`]); an operator emits to a port with
    /// `Emitter::emit_to`, e.g. port 1 = the feedback of an iteration.
    pub port: usize,
}

/// The graph a user states: vertices with parallelism, edges with partitioning.
#[derive(Clone, Debug, Default)]
pub struct LogicalGraph {
    pub vertices: Vec<Vertex>,
    pub edges: Vec<Edge>,
}

impl LogicalGraph {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_source(
        &mut self,
        name: impl Into<String>,
        parallelism: usize,
        factory: Arc<dyn SourceFactory>,
    ) -> VertexId {
        self.push(name.into(), parallelism, VertexKind::Source(factory))
    }

    pub fn add_operator(
        &mut self,
        name: impl Into<String>,
        parallelism: usize,
        factory: Arc<dyn OperatorFactory>,
    ) -> VertexId {
        self.push(name.into(), parallelism, VertexKind::Operator(factory))
    }

    /// Adds an edge; validation (unknown vertices, parallelism mismatch for
    /// `Forward`, cycles without a source) happens when the graph is expanded.
    pub fn connect(&mut self, from: VertexId, to: VertexId, partitioning: Partitioning) -> EdgeId {
        self.edges.push(Edge {
            from,
            to,
            partitioning,
            feedback: false,
            port: 0,
        });
        self.edges.len() - 1
    }

    /// Adds the feedback edge of an iteration (a back-edge by intent).
    pub fn connect_feedback(
        &mut self,
        from: VertexId,
        to: VertexId,
        partitioning: Partitioning,
    ) -> EdgeId {
        let id = self.connect(from, to, partitioning);
        self.edges[id].feedback = true;
        id
    }

    /// Makes `edge` carry what its source operator emits on output `port`.
    pub fn set_output_port(&mut self, edge: EdgeId, port: usize) -> &mut Self {
        if let Some(e) = self.edges.get_mut(edge) {
            e.port = port;
        }
        self
    }

    /// Validates the graph and expands it into physical tasks and channels.
    pub fn expand(&self) -> crate::Result<PhysicalGraph> {
        physical::expand(self)
    }

    /// A stable fingerprint of the graph's shape (names, parallelism,
    /// partitioning, edges), recorded in checkpoints so that a restore into
    /// another shape is refused.
    pub fn fingerprint(&self) -> String {
        fingerprint::fingerprint(self)
    }

    fn push(&mut self, name: String, parallelism: usize, kind: VertexKind) -> VertexId {
        self.vertices.push(Vertex {
            name,
            parallelism,
            kind,
        });
        self.vertices.len() - 1
    }
}
