use std::sync::Arc;

use super::*;
use crate::operator::{Batch, OperatorFactory, Source, SourceFactory};
use crate::protocol::InputKind;

struct NoSource;
impl Source for NoSource {
    fn next_batch(&mut self) -> crate::Result<Option<Batch>> {
        Ok(None)
    }
    fn offset(&self) -> u64 {
        0
    }
    fn seek(&mut self, _: u64) -> crate::Result<()> {
        Ok(())
    }
}
struct NoSourceFactory;
impl SourceFactory for NoSourceFactory {
    fn create(&self, _: usize, _: usize) -> crate::Result<Box<dyn Source>> {
        Ok(Box::new(NoSource))
    }
}

fn src() -> Arc<dyn SourceFactory> {
    Arc::new(NoSourceFactory)
}
fn op() -> Arc<dyn OperatorFactory> {
    crate::runtime::ops::union()
}

fn err(g: &LogicalGraph) -> String {
    g.expand().unwrap_err().to_string()
}

#[test]
fn expands_hash_edges_into_a_full_mesh_and_forward_into_pairs() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 2, src());
    let m = g.add_operator("m", 2, op());
    let a = g.add_operator("a", 3, op());
    g.connect(s, m, Partitioning::Forward);
    g.connect(m, a, Partitioning::Hash { key: "k".into() });
    let p = g.expand().unwrap();
    assert_eq!(p.tasks.len(), 7);
    assert_eq!(p.channels.len(), 2 + 6);
    let m1 = p.task("m", 1).unwrap();
    assert_eq!(m1.inputs.len(), 1);
    assert_eq!(p.channels[m1.inputs[0]].from_subtask, 1);
    assert_eq!(m1.outputs[0].channels.len(), 3);
    let a2 = p.task("a", 2).unwrap();
    assert_eq!(a2.inputs.len(), 2);
    assert_eq!(p.channels[a2.inputs[1]].edge_name, "a<-m");
    assert!(p.back_edges.iter().all(|b| !b));
}

#[test]
fn finds_the_back_edge_of_a_loop() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    let h = g.add_operator("head", 2, op());
    let b = g.add_operator("body", 2, op());
    let k = g.add_operator("sink", 1, op());
    g.connect(s, h, Partitioning::RoundRobin);
    g.connect(h, b, Partitioning::Forward);
    let back = g.connect(b, h, Partitioning::Forward);
    g.connect(b, k, Partitioning::RoundRobin);
    let p = g.expand().unwrap();
    assert_eq!(p.back_edges, vec![false, false, true, false]);
    let h0 = p.task("head", 0).unwrap();
    assert_eq!(
        h0.input_kinds,
        vec![InputKind::Regular, InputKind::BackEdge]
    );
    assert!(h0.cycle.is_some() && p.task("body", 1).unwrap().cycle == h0.cycle);
    assert!(p.task("sink", 0).unwrap().cycle.is_none());
    assert!(p
        .channels
        .iter()
        .filter(|c| c.edge == back)
        .all(|c| c.in_cycle));
}

#[test]
fn declared_feedback_edge_is_the_back_edge_whatever_the_walk_order() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    let a = g.add_operator("a", 1, op());
    let b = g.add_operator("b", 1, op());
    g.connect(s, b, Partitioning::Forward);
    g.connect(s, a, Partitioning::Forward);
    g.connect(a, b, Partitioning::Forward);
    g.connect_feedback(b, a, Partitioning::Forward);
    let p = g.expand().unwrap();
    assert_eq!(p.back_edges, vec![false, false, false, true]);
}

#[test]
fn a_diamond_has_no_back_edge() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    let a = g.add_operator("a", 1, op());
    let b = g.add_operator("b", 1, op());
    let c = g.add_operator("c", 1, op());
    g.connect(s, a, Partitioning::Forward);
    g.connect(s, b, Partitioning::Forward);
    g.connect(a, c, Partitioning::Forward);
    g.connect(b, c, Partitioning::Forward);
    assert!(g.expand().unwrap().back_edges.iter().all(|b| !b));
}

#[test]
fn feedback_edge_that_closes_no_cycle_is_rejected() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    let a = g.add_operator("a", 1, op());
    let b = g.add_operator("b", 1, op());
    g.connect(s, a, Partitioning::Forward);
    g.connect_feedback(a, b, Partitioning::Forward);
    assert!(err(&g).contains("does not close a cycle"), "{}", err(&g));
}

#[test]
fn unreachable_vertex_is_rejected() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    let a = g.add_operator("a", 1, op());
    g.add_operator("lonely", 1, op());
    g.connect(s, a, Partitioning::Forward);
    let e = err(&g);
    assert!(
        e.contains("\"lonely\" is unreachable from any source"),
        "{e}"
    );
}

#[test]
fn cycle_without_source_is_rejected_and_named() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    let a = g.add_operator("a", 1, op());
    let x = g.add_operator("x", 1, op());
    let y = g.add_operator("y", 1, op());
    g.connect(s, a, Partitioning::Forward);
    g.connect(x, y, Partitioning::Forward);
    g.connect(y, x, Partitioning::Forward);
    let e = err(&g);
    assert!(
        e.contains("cycle with no source") && e.contains("x -> y -> x"),
        "{e}"
    );
}

#[test]
fn unknown_vertex_is_rejected() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    g.connect(s, 7, Partitioning::Forward);
    assert!(err(&g).contains("unknown vertex 7"), "{}", err(&g));
}

#[test]
fn forward_with_mismatched_parallelism_is_rejected() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 2, src());
    let a = g.add_operator("a", 3, op());
    g.connect(s, a, Partitioning::Forward);
    let e = err(&g);
    assert!(e.contains("parallelism 2 to 3"), "{e}");
}

#[test]
fn zero_parallelism_is_rejected() {
    let mut g = LogicalGraph::new();
    g.add_source("s", 0, src());
    assert!(err(&g).contains("parallelism 0"));
}

#[test]
fn source_with_inputs_is_rejected() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 1, src());
    let t = g.add_source("t", 1, src());
    g.connect(s, t, Partitioning::Forward);
    assert!(err(&g).contains("source \"t\" cannot have inputs"));
}

#[test]
fn duplicate_names_and_empty_graphs_are_rejected() {
    let mut g = LogicalGraph::new();
    assert!(err(&g).contains("no vertices"));
    g.add_source("s", 1, src());
    g.add_source("s", 1, src());
    assert!(err(&g).contains("two vertices are named \"s\""));
}

#[test]
fn fingerprint_is_stable_and_shape_sensitive() {
    let build = |p: usize, part: Partitioning| {
        let mut g = LogicalGraph::new();
        let s = g.add_source("s", p, src());
        let a = g.add_operator("a", 2, op());
        g.connect(s, a, part);
        g
    };
    let f = build(2, Partitioning::RoundRobin).fingerprint();
    assert!(f.starts_with("g1-") && f.len() == 19, "{f}");
    assert_eq!(f, build(2, Partitioning::RoundRobin).fingerprint());
    assert_ne!(f, build(1, Partitioning::RoundRobin).fingerprint());
    assert_ne!(f, build(2, Partitioning::Broadcast).fingerprint());
    assert_eq!(
        build(2, Partitioning::Forward)
            .expand()
            .unwrap()
            .fingerprint,
        build(2, Partitioning::Forward).fingerprint()
    );
}

/// Region names as sorted `vertex-subtask` lists, for readable asserts.
fn region_names(p: &PhysicalGraph, r: &Regions) -> Vec<Vec<String>> {
    r.members
        .iter()
        .map(|m| m.iter().map(|&t| p.tasks[t].id.to_string()).collect())
        .collect()
}

#[test]
fn regions_are_connected_components_and_forward_edges_split_them_per_subtask() {
    let mut g = LogicalGraph::new();
    let a = g.add_source("a", 2, src());
    let am = g.add_operator("am", 2, op());
    let b = g.add_source("b", 1, src());
    let bm = g.add_operator("bm", 2, op());
    g.connect(a, am, Partitioning::Forward);
    g.connect(b, bm, Partitioning::RoundRobin);
    let p = g.expand().unwrap();
    let r = Regions::of(&p.topology());
    assert_eq!(
        region_names(&p, &r),
        vec![
            vec!["a-0", "am-0"],
            vec!["a-1", "am-1"],
            vec!["b-0", "bm-0", "bm-1"],
        ]
    );
    for (t, &region) in r.of_task.iter().enumerate() {
        assert!(r.members[region].contains(&t));
    }
    assert_eq!(
        Regions::whole(&p.topology()).members,
        vec![(0..p.tasks.len()).collect::<Vec<_>>()]
    );
}

#[test]
fn a_hash_edge_joins_everything_into_one_region() {
    let mut g = LogicalGraph::new();
    let a = g.add_source("a", 2, src());
    let b = g.add_source("b", 2, src());
    let u = g.add_operator("u", 2, op());
    g.connect(a, u, Partitioning::Forward);
    g.connect(b, u, Partitioning::Hash { key: "k".into() });
    let p = g.expand().unwrap();
    assert_eq!(Regions::of(&p.topology()).len(), 1);
}

#[test]
fn subtasks_of_one_cycle_share_a_region_even_across_forward_edges() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("s", 2, src());
    let h = g.add_operator("head", 2, op());
    let body = g.add_operator("body", 2, op());
    g.connect(s, h, Partitioning::Forward);
    g.connect(h, body, Partitioning::Forward);
    g.connect_feedback(body, h, Partitioning::Forward);
    let p = g.expand().unwrap();
    let r = Regions::of(&p.topology());
    assert_eq!(
        region_names(&p, &r),
        vec![vec!["s-0", "s-1", "head-0", "head-1", "body-0", "body-1"]]
    );
}
