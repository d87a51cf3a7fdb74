//! Random merge trees (sources → unions with random parallelism and
//! partitioning → one counting sink) under every protocol: every completed
//! checkpoint is a consistent cut — each record the sources emitted before
//! the barrier is either counted in the sink's state or logged in flight,
//! exactly once — and the final counts are exact.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Source, SourceFactory};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::runtime::ops::{collect_sink, dwell_source, keyed_aggregate, union, AggSpec};
use snapcut_core::runtime::{CheckpointConfig, InMemorySnapshots, Job, JobOptions};

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

const PER_SOURCE: u64 = 30_000;

struct Paced(u64);
impl SourceFactory for Paced {
    fn create(&self, s: usize, p: usize) -> snapcut_core::Result<Box<dyn Source>> {
        struct P(Box<dyn Source>);
        impl Source for P {
            fn next_batch(&mut self) -> snapcut_core::Result<Option<Batch>> {
                std::thread::sleep(Duration::from_micros(500));
                self.0.next_batch()
            }
            fn offset(&self) -> u64 {
                self.0.offset()
            }
            fn seek(&mut self, o: u64) -> snapcut_core::Result<()> {
                self.0.seek(o)
            }
        }
        Ok(Box::new(P(
            dwell_source(PER_SOURCE, 31, self.0, 128)?.create(s, p)?
        )))
    }
}

fn random_tree(seed: u64) -> (LogicalGraph, snapcut_core::runtime::ops::Collected, u64) {
    let mut rng = Rng(seed);
    let mut g = LogicalGraph::new();
    let n_sources = 1 + rng.below(3) as usize;
    let n_mid = 1 + rng.below(4) as usize;
    let mut vertices = Vec::new(); // (id, parallelism)
    for s in 0..n_sources {
        let p = 1 + rng.below(3) as usize;
        vertices.push((
            g.add_source(format!("src{s}"), p, Arc::new(Paced(seed + s as u64))),
            p,
        ));
    }
    for m in 0..n_mid {
        let p = 1 + rng.below(3) as usize;
        vertices.push((g.add_operator(format!("u{m}"), p, union()), p));
    }
    let agg = keyed_aggregate("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap();
    let sink_p = 1 + rng.below(3) as usize;
    let sink = g.add_operator("count", sink_p, agg);
    vertices.push((sink, sink_p));
    let (collect, out) = collect_sink();
    let last = g.add_operator("out", 1, collect);
    g.connect(sink, last, Partitioning::RoundRobin);
    // Each vertex but the sink feeds exactly one later vertex (a merge tree);
    // every union gets at least one input from the vertex just before it.
    let n = vertices.len();
    for i in 0..n - 1 {
        let to = if i + 1 >= n_sources && i + 1 < n - 1 && rng.below(2) == 0 {
            i + 1
        } else {
            (i + 1 + rng.below((n - 1 - i) as u64) as usize)
                .max(n_sources)
                .min(n - 1)
        };
        let (from_v, from_p) = vertices[i];
        let (to_v, to_p) = vertices[to];
        let part = if to == n - 1 {
            Partitioning::Hash { key: "user".into() }
        } else {
            match rng.below(3) {
                0 if from_p == to_p => Partitioning::Forward,
                1 => Partitioning::Hash { key: "user".into() },
                _ => Partitioning::RoundRobin,
            }
        };
        g.connect(from_v, to_v, part);
    }
    (g, out, n_sources as u64 * PER_SOURCE)
}

/// Runs one shape; false if the shape is invalid (a union nobody feeds).
fn check(seed: u64, protocol: ProtocolKind) -> bool {
    let (g, out, total) = random_tree(seed);
    if let Err(e) = g.expand() {
        assert!(e.to_string().contains("unreachable"), "{e}");
        return false;
    }
    let config = CheckpointConfig {
        protocol,
        interval: Some(Duration::from_millis(7)),
        // Progress between checkpoints on a loaded machine (sync pauses sources).
        min_pause: Duration::from_millis(7),
        max_concurrent: if protocol == ProtocolKind::Aligned {
            2
        } else {
            1
        },
        ..Default::default()
    };
    let snaps = Arc::new(InMemorySnapshots::new());
    let report = Job::new(
        g,
        config,
        JobOptions {
            channel_capacity: 4,
            ..Default::default()
        },
    )
    .unwrap()
    .run(snaps.clone())
    .unwrap();
    assert_eq!(report.records_in, total);
    let counted: i64 = out
        .batches()
        .iter()
        .map(|b| {
            b.column_by_name("n")
                .unwrap()
                .as_primitive::<Int64Type>()
                .iter()
                .map(|v| v.unwrap())
                .sum::<i64>()
        })
        .sum();
    assert_eq!(counted as u64, total, "seed {seed} {protocol}: final count");
    let completed = snaps.completed();
    assert!(!completed.is_empty());
    for c in &completed {
        let mut emitted = 0u64;
        let mut found = 0u64;
        for (task, snap) in &c.tasks {
            emitted += snap.source_offset.unwrap_or(0);
            if task.vertex == "count" {
                let st = &snap.state.as_ref().unwrap().batch;
                found += st
                    .column_by_name("n")
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .iter()
                    .map(|v| v.unwrap() as u64)
                    .sum::<u64>();
            }
            found += snap
                .channels
                .iter()
                .flat_map(|l| &l.records)
                .map(|b| b.num_rows() as u64)
                .sum::<u64>();
        }
        assert_eq!(
            found, emitted,
            "seed {seed} {protocol}: checkpoint {} is not a consistent cut",
            c.meta.id
        );
    }
    true
}

#[test]
fn random_merge_trees_give_consistent_cuts_under_every_protocol() {
    let mut shapes = 0;
    for seed in 1..=8u64 {
        for protocol in [
            ProtocolKind::Aligned,
            ProtocolKind::Unaligned,
            ProtocolKind::ChandyLamport,
            ProtocolKind::Sync,
            ProtocolKind::SyncCapture,
        ] {
            shapes += check(seed, protocol) as usize;
        }
    }
    assert!(shapes >= 12, "only {shapes} valid (shape, protocol) runs");
}
