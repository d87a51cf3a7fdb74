//! Coordinator policies: min pause between checkpoints, max concurrent
//! checkpoints in flight, the final checkpoint of a bounded job.

use std::sync::Arc;
use std::time::Duration;

use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Source, SourceFactory};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::runtime::ops::{collect_sink, dwell_source, keyed_aggregate, AggSpec};
use snapcut_core::runtime::{
    CheckpointConfig, CheckpointStatus, InMemorySnapshots, Job, JobOptions, JobReport,
};

/// 100 batches of 100 records per subtask, 2 ms apart.
struct Paced;
impl SourceFactory for Paced {
    fn create(&self, s: usize, p: usize) -> snapcut_core::Result<Box<dyn Source>> {
        struct P(Box<dyn Source>);
        impl Source for P {
            fn next_batch(&mut self) -> snapcut_core::Result<Option<Batch>> {
                std::thread::sleep(Duration::from_millis(2));
                self.0.next_batch()
            }
            fn offset(&self) -> u64 {
                self.0.offset()
            }
            fn seek(&mut self, o: u64) -> snapcut_core::Result<()> {
                self.0.seek(o)
            }
        }
        Ok(Box::new(P(dwell_source(20_000, 50, 5, 100)?.create(s, p)?)))
    }
}

fn run(config: CheckpointConfig) -> (JobReport, Arc<InMemorySnapshots>) {
    let mut g = LogicalGraph::new();
    let s = g.add_source("src", 2, Arc::new(Paced));
    let a = g.add_operator(
        "agg",
        2,
        keyed_aggregate("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap(),
    );
    let (sink, out) = collect_sink();
    let k = g.add_operator("sink", 1, sink);
    g.connect(s, a, Partitioning::Hash { key: "user".into() });
    g.connect(a, k, Partitioning::RoundRobin);
    let snaps = Arc::new(InMemorySnapshots::new());
    let report = Job::new(g, config, JobOptions::default())
        .unwrap()
        .run(snaps.clone())
        .unwrap();
    assert_eq!(out.num_rows(), 50);
    (report, snaps)
}

#[test]
fn min_pause_spaces_checkpoints_out() {
    let (report, snaps) = run(CheckpointConfig {
        interval: Some(Duration::from_millis(1)),
        min_pause: Duration::from_secs(30),
        ..Default::default()
    });
    // The job lasts well under 30 s: at most one periodic checkpoint, then the final one.
    assert!(report.checkpoints.len() <= 2, "{:?}", report.checkpoints);
    assert!(report.checkpoints.last().unwrap().is_final);
    assert_eq!(snaps.completed().len(), report.checkpoints.len());
}

#[test]
fn in_flight_checkpoints_never_exceed_max_concurrent() {
    for (protocol, max) in [
        (ProtocolKind::Aligned, 1),
        (ProtocolKind::Aligned, 2),
        (ProtocolKind::ChandyLamport, 3),
    ] {
        let (report, _) = run(CheckpointConfig {
            protocol,
            interval: Some(Duration::from_millis(1)),
            max_concurrent: max,
            ..Default::default()
        });
        let cps = &report.checkpoints;
        assert!(cps.len() >= 2);
        for c in cps {
            assert_eq!(c.status, CheckpointStatus::Completed);
            // Checkpoints in flight at the moment c was triggered (c included).
            let overlapping = cps
                .iter()
                .filter(|o| o.triggered_at <= c.triggered_at && o.finished_at > c.triggered_at)
                .count();
            assert!(
                overlapping <= max,
                "{protocol} max {max}: {overlapping} in flight at {:?}",
                c.triggered_at
            );
        }
        assert_eq!(cps.iter().filter(|c| c.is_final).count(), 1);
    }
}

#[test]
fn no_final_checkpoint_when_disabled() {
    let (report, snaps) = run(CheckpointConfig {
        final_checkpoint: false,
        ..Default::default()
    });
    assert!(report.checkpoints.is_empty());
    assert!(snaps.completed().is_empty());
}
