//! ABS overhead with DURABLE checkpoints: the dwell-time job (parallelism 2,
//! built-in aggregates, 1024-record batches, 10k users) with no checkpoints
//! vs aligned checkpoints written to a `SnapshotStore` every 1 s and 100 ms
//! (incremental state, full every 10), and in memory every 100 ms (what the
//! store adds). Runs are interleaved; prints medians and ratios from one run.
//!
//! Run: `cargo bench -p snapcut-core --bench recovery` (env RECORDS, RUNS).

use std::time::{Duration, Instant};

use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::runtime::ops::{collect_sink, dwell_source, keyed_aggregate, AggSpec};
use snapcut_core::runtime::{
    run_durable, CheckpointConfig, DurableOptions, InMemorySnapshots, Job, JobOptions,
};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn graph(records: u64) -> LogicalGraph {
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 2, dwell_source(records, 10_000, 7, 1024).unwrap());
    let agg = g.add_operator(
        "agg",
        2,
        keyed_aggregate(
            "user",
            vec![
                AggSpec::count("dwell_ms", "n"),
                AggSpec::sum("dwell_ms", "total"),
            ],
        )
        .unwrap(),
    );
    let (sink, _out) = collect_sink();
    let sink = g.add_operator("sink", 1, sink);
    g.connect(src, agg, Partitioning::Hash { key: "user".into() });
    g.connect(agg, sink, Partitioning::RoundRobin);
    g
}

/// Where a mode's checkpoints go.
#[derive(Clone, Copy)]
enum Mode {
    None,
    InMemory(Duration),
    Durable(Duration),
}

/// (seconds, completed checkpoints)
fn run(records: u64, mode: Mode) -> (f64, usize) {
    let start = Instant::now();
    let aligned = |iv| CheckpointConfig {
        protocol: ProtocolKind::Aligned,
        interval: Some(iv),
        ..Default::default()
    };
    match mode {
        Mode::None => {
            let config = CheckpointConfig {
                protocol: ProtocolKind::None,
                ..Default::default()
            };
            Job::new(graph(records), config, JobOptions::default())
                .unwrap()
                .run(std::sync::Arc::new(InMemorySnapshots::new()))
                .unwrap();
            (start.elapsed().as_secs_f64(), 0)
        }
        Mode::InMemory(iv) => {
            let r = Job::new(graph(records), aligned(iv), JobOptions::default())
                .unwrap()
                .run(std::sync::Arc::new(InMemorySnapshots::new()))
                .unwrap();
            (
                start.elapsed().as_secs_f64(),
                r.completed_checkpoints().count(),
            )
        }
        Mode::Durable(iv) => {
            let dir = tempfile::tempdir().unwrap();
            let r = run_durable(
                graph(records),
                aligned(iv),
                JobOptions::default(),
                &DurableOptions::new(dir.path()),
                &mut |_| {},
            )
            .unwrap();
            let secs = start.elapsed().as_secs_f64();
            (secs, r.report.completed_checkpoints().count())
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let records = env("RECORDS", 20_000_000);
    let runs = env("RUNS", 5) as usize;
    let ms = Duration::from_millis;
    let modes: [(&str, Mode); 4] = [
        ("none", Mode::None),
        ("aligned, in memory, 100 ms", Mode::InMemory(ms(100))),
        ("aligned, durable, 1 s", Mode::Durable(ms(1000))),
        ("aligned, durable, 100 ms", Mode::Durable(ms(100))),
    ];
    let mut times = vec![Vec::new(); modes.len()];
    let mut cps = vec![Vec::new(); modes.len()];
    // Rounds run every mode once, in an order rotated each round, so that
    // drift in the machine's speed does not favour one mode.
    for round in 0..runs {
        for k in 0..modes.len() {
            let i = (round + k) % modes.len();
            let (t, c) = run(records, modes[i].1);
            times[i].push(t);
            cps[i].push(c as f64);
        }
    }
    let base = median(times[0].clone());
    println!("records={records} runs={runs}");
    println!(
        "| mode | median s | Mrec/s | median time / none | median of per-round ratios | best / best none | checkpoints (median) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    for (i, (name, _)) in modes.iter().enumerate() {
        let m = median(times[i].clone());
        let paired = median(times[i].iter().zip(&times[0]).map(|(t, n)| t / n).collect());
        println!(
            "| {name} | {m:.3} | {:.2} | {:.3} | {paired:.3} | {:.3} | {} |",
            records as f64 / m / 1e6,
            m / base,
            best(&times[i]) / best(&times[0]),
            median(cps[i].clone())
        );
    }
}
