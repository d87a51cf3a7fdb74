//! Graph validation and back-edge detection.
//!
//! Declared feedback edges are back-edges by intent and are checked to close
//! a cycle; every other back-edge is found by a depth-first walk from the
//! sources (an edge into a vertex still on the walk's stack).

use super::{LogicalGraph, Partitioning, VertexId, VertexKind};
use crate::error::{Error, Result};

/// What validation learns about a graph.
#[derive(Clone, Debug)]
pub(crate) struct Analysis {
    /// Per logical edge: whether it is a back-edge (excluded from alignment).
    pub back_edge: Vec<bool>,
    /// Per vertex: the id of its cyclic strongly connected component, if any.
    pub cycle: Vec<Option<usize>>,
}

pub(crate) fn validate(g: &LogicalGraph) -> Result<Analysis> {
    if g.vertices.is_empty() {
        return Err(Error::Graph(
            "the graph has no vertices; add a source".into(),
        ));
    }
    let mut names = std::collections::HashSet::new();
    for v in &g.vertices {
        if v.parallelism == 0 {
            return Err(Error::Graph(format!(
                "vertex {:?} has parallelism 0; use at least 1",
                v.name
            )));
        }
        if v.name.is_empty() {
            return Err(Error::Graph(
                "a vertex has an empty name; name every vertex".into(),
            ));
        }
        if !names.insert(v.name.as_str()) {
            return Err(Error::Graph(format!(
                "two vertices are named {:?}; vertex names must be unique (they name snapshot files)",
                v.name
            )));
        }
    }
    let n = g.vertices.len();
    for (i, e) in g.edges.iter().enumerate() {
        for end in [e.from, e.to] {
            if end >= n {
                return Err(Error::Graph(format!(
                    "edge {i} ({} -> {}) refers to unknown vertex {end}; the graph has {n} vertices",
                    e.from, e.to
                )));
            }
        }
        let (from, to) = (&g.vertices[e.from], &g.vertices[e.to]);
        if matches!(to.kind, VertexKind::Source(_)) {
            return Err(Error::Graph(format!(
                "source {:?} cannot have inputs, but edge {i} comes from {:?}",
                to.name, from.name
            )));
        }
        if e.partitioning == Partitioning::Forward && from.parallelism != to.parallelism {
            return Err(Error::Graph(format!(
                "forward edge {:?} -> {:?} joins parallelism {} to {}; make them equal or use hash/rebalance partitioning",
                from.name, to.name, from.parallelism, to.parallelism
            )));
        }
        if let Partitioning::Hash { key } = &e.partitioning {
            if key.is_empty() {
                return Err(Error::Graph(format!(
                    "hash edge {:?} -> {:?} has an empty key column name",
                    from.name, to.name
                )));
            }
        }
    }
    let sources: Vec<VertexId> = (0..n)
        .filter(|&v| matches!(g.vertices[v].kind, VertexKind::Source(_)))
        .collect();

    let out_all = adjacency(g, |_| true);
    let reach_all = reachable_from(&sources, &out_all, n);
    if let Some(v) = (0..n).find(|&v| !reach_all[v]) {
        let unreachable: Vec<VertexId> = (0..n).filter(|&v| !reach_all[v]).collect();
        if let Some(cycle) = find_cycle(&unreachable, &out_all) {
            let path: Vec<&str> = cycle.iter().map(|&v| g.vertices[v].name.as_str()).collect();
            return Err(Error::Graph(format!(
                "cycle with no source: {}; every cycle must be fed by a source",
                path.join(" -> ")
            )));
        }
        return Err(Error::Graph(format!(
            "vertex {:?} is unreachable from any source; connect it or remove it",
            g.vertices[v].name
        )));
    }

    let mut back_edge = vec![false; g.edges.len()];
    for (i, e) in g.edges.iter().enumerate() {
        if e.feedback {
            if !reachable_from(&[e.to], &out_all, n)[e.from] {
                return Err(Error::Graph(format!(
                    "feedback edge {:?} -> {:?} does not close a cycle; use connect() for it",
                    g.vertices[e.from].name, g.vertices[e.to].name
                )));
            }
            back_edge[i] = true;
        }
    }
    let out_regular = adjacency(g, |i| !g.edges[i].feedback);
    let reach_regular = reachable_from(&sources, &out_regular, n);
    if let Some(v) = (0..n).find(|&v| !reach_regular[v]) {
        return Err(Error::Graph(format!(
            "vertex {:?} is reachable only through feedback edges; give it a regular input",
            g.vertices[v].name
        )));
    }
    dfs_back_edges(&sources, &out_regular, g, &mut back_edge);

    Ok(Analysis {
        back_edge,
        cycle: cyclic_components(n, &out_all),
    })
}

/// Out-edges per vertex as (edge id, target), in edge order.
fn adjacency(g: &LogicalGraph, keep: impl Fn(usize) -> bool) -> Vec<Vec<(usize, VertexId)>> {
    let mut out = vec![Vec::new(); g.vertices.len()];
    for (i, e) in g.edges.iter().enumerate() {
        if keep(i) {
            out[e.from].push((i, e.to));
        }
    }
    out
}

fn reachable_from(starts: &[VertexId], out: &[Vec<(usize, VertexId)>], n: usize) -> Vec<bool> {
    let mut seen = vec![false; n];
    let mut stack: Vec<VertexId> = starts.to_vec();
    for &s in starts {
        seen[s] = true;
    }
    while let Some(v) = stack.pop() {
        for &(_, w) in &out[v] {
            if !seen[w] {
                seen[w] = true;
                stack.push(w);
            }
        }
    }
    seen
}

/// Iterative DFS from the sources; an edge into a vertex on the stack is a back-edge.
fn dfs_back_edges(
    sources: &[VertexId],
    out: &[Vec<(usize, VertexId)>],
    g: &LogicalGraph,
    back_edge: &mut [bool],
) {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    let mut mark = vec![Mark::New; g.vertices.len()];
    for &s in sources {
        if mark[s] != Mark::New {
            continue;
        }
        // (vertex, index of the next out-edge to explore)
        let mut stack = vec![(s, 0usize)];
        mark[s] = Mark::OnStack;
        while let Some(&mut (v, ref mut next)) = stack.last_mut() {
            if let Some(&(edge, w)) = out[v].get(*next) {
                *next += 1;
                match mark[w] {
                    Mark::OnStack => back_edge[edge] = true,
                    Mark::New => {
                        mark[w] = Mark::OnStack;
                        stack.push((w, 0));
                    }
                    Mark::Done => {}
                }
            } else {
                mark[v] = Mark::Done;
                stack.pop();
            }
        }
    }
}

/// A cycle among `within`, as a closed path of vertices, if there is one.
fn find_cycle(within: &[VertexId], out: &[Vec<(usize, VertexId)>]) -> Option<Vec<VertexId>> {
    let inside = |v: VertexId| within.contains(&v);
    for &start in within {
        // BFS from start's successors back to start, keeping parents.
        let mut parent: std::collections::HashMap<VertexId, VertexId> = Default::default();
        let mut queue = std::collections::VecDeque::new();
        for &(_, w) in &out[start] {
            if inside(w) && !parent.contains_key(&w) {
                parent.insert(w, start);
                queue.push_back(w);
            }
        }
        while let Some(v) = queue.pop_front() {
            if v == start {
                let mut path = vec![start];
                let mut cur = parent[&start];
                while cur != start {
                    path.push(cur);
                    cur = parent[&cur];
                }
                path.push(start);
                path.reverse();
                return Some(path);
            }
            for &(_, w) in &out[v] {
                if inside(w) && !parent.contains_key(&w) {
                    parent.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
    }
    None
}

/// Per vertex, the index of its strongly connected component when that
/// component contains a cycle (several vertices, or a self-loop).
fn cyclic_components(n: usize, out: &[Vec<(usize, VertexId)>]) -> Vec<Option<usize>> {
    let reach: Vec<Vec<bool>> = (0..n).map(|v| reachable_from(&[v], out, n)).collect();
    let mut comp = vec![None; n];
    let mut next = 0;
    for v in 0..n {
        if comp[v].is_some() {
            continue;
        }
        let members: Vec<VertexId> = (0..n).filter(|&u| reach[v][u] && reach[u][v]).collect();
        let self_loop = out[v].iter().any(|&(_, w)| w == v);
        if members.len() > 1 || self_loop {
            for u in members {
                comp[u] = Some(next);
            }
            next += 1;
        }
    }
    comp
}
