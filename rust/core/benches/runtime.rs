//! Dwell-time job throughput: snapcut runtime (parallelism 2, built-in
//! aggregates, 1024-record batches) with no checkpoints, ABS (aligned) at
//! 1 s and 100 ms, sync at 1 s and 100 ms, and a bare Rust pipeline of the
//! same shape as the reference. Prints medians and ratios from one run.
//!
//! Run: `cargo bench -p snapcut-core --bench runtime` (env RECORDS, RUNS to change size).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use snapcut_core::channel::{channel_with_wakers, TaskWaker};
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::runtime::ops::{
    collect_sink, dwell_record, dwell_source, keyed_aggregate, AggSpec,
};
use snapcut_core::runtime::partition::{bucket, mix64};
use snapcut_core::runtime::{CheckpointConfig, InMemorySnapshots, Job, JobOptions, JobReport};

const USERS: u64 = 10_000;
const BATCH: usize = 1024;
const SEED: u64 = 7;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn job(records: u64, protocol: ProtocolKind, interval: Option<Duration>) -> JobReport {
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 2, dwell_source(records, USERS, SEED, BATCH).unwrap());
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
    let config = CheckpointConfig {
        protocol,
        interval,
        ..Default::default()
    };
    Job::new(g, config, JobOptions::default())
        .unwrap()
        .run(Arc::new(InMemorySnapshots::new()))
        .unwrap()
}

type Cols = (Vec<i64>, Vec<i64>);

/// Two generator threads → hash partition per batch → SPSC rings → two
/// FxHashMap aggregators: the hand-written reference.
fn bare(records: u64) -> Duration {
    let start = Instant::now();
    let wakers: Vec<Arc<TaskWaker>> = (0..4).map(|_| TaskWaker::new()).collect();
    let mut txs: Vec<Vec<_>> = vec![Vec::new(), Vec::new()];
    let mut rxs: Vec<Vec<_>> = vec![Vec::new(), Vec::new()];
    for (g, tx_row) in txs.iter_mut().enumerate() {
        for (a, rx_row) in rxs.iter_mut().enumerate() {
            let (tx, rx) =
                channel_with_wakers::<Option<Cols>>(64, wakers[g].clone(), wakers[2 + a].clone())
                    .unwrap();
            tx_row.push(tx);
            rx_row.push(rx);
        }
    }
    let mut threads = Vec::new();
    for (g, mut outs) in txs.into_iter().enumerate() {
        threads.push(std::thread::spawn(move || {
            let (s, p) = (g as u64, 2u64);
            let count = (records - s).div_ceil(p);
            let mut off = 0;
            while off < count {
                let n = (count - off).min(BATCH as u64) as usize;
                let mut users = Vec::with_capacity(n);
                let mut dwell = Vec::with_capacity(n);
                let mut i = s + off * p;
                for _ in 0..n {
                    let (u, d) = dwell_record(SEED, i, USERS);
                    users.push(u);
                    dwell.push(d);
                    i += p;
                }
                off += n as u64;
                let mut parts: [Cols; 2] = [
                    (Vec::with_capacity(n), Vec::with_capacity(n)),
                    (Vec::with_capacity(n), Vec::with_capacity(n)),
                ];
                for (&u, &d) in users.iter().zip(&dwell) {
                    let b = bucket(mix64(u as u64), 2);
                    parts[b].0.push(u);
                    parts[b].1.push(d);
                }
                for (k, part) in parts.into_iter().enumerate() {
                    outs[k].send(Some(part)).unwrap();
                }
            }
            for o in &mut outs {
                o.send(None).unwrap();
            }
        }));
    }
    for (a, mut ins) in rxs.into_iter().enumerate() {
        let waker = wakers[2 + a].clone();
        threads.push(std::thread::spawn(move || {
            let mut map: FxHashMap<i64, (i64, i64)> = FxHashMap::default();
            let mut open = ins.len();
            while open > 0 {
                let mut progress = false;
                for rx in ins.iter_mut() {
                    while let Ok(item) = rx.try_recv() {
                        progress = true;
                        match item {
                            Some((u, d)) => {
                                for (&u, &d) in u.iter().zip(&d) {
                                    let e = map.entry(u).or_insert((0, 0));
                                    e.0 += 1;
                                    e.1 += d;
                                }
                            }
                            None => open -= 1,
                        }
                    }
                }
                if !progress && open > 0 {
                    waker.wait_until_timeout(
                        || ins.iter().any(|r| r.is_ready()),
                        Duration::from_millis(10),
                    );
                }
            }
            std::hint::black_box(map.len());
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed()
}

/// CPU time (user + system) of the whole process so far: less sensitive to
/// other processes on a shared machine than wall time.
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs us too: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let records = env("RECORDS", if quick { 200_000 } else { 100_000_000 });
    let runs = env("RUNS", if quick { 1 } else { 5 }) as usize;
    let cases: Vec<(&str, ProtocolKind, Option<Duration>)> = vec![
        ("none", ProtocolKind::None, None),
        (
            "aligned 1s",
            ProtocolKind::Aligned,
            Some(Duration::from_secs(1)),
        ),
        (
            "aligned 100ms",
            ProtocolKind::Aligned,
            Some(Duration::from_millis(100)),
        ),
        ("sync 1s", ProtocolKind::Sync, Some(Duration::from_secs(1))),
        (
            "sync 100ms",
            ProtocolKind::Sync,
            Some(Duration::from_millis(100)),
        ),
        (
            "unaligned 100ms",
            ProtocolKind::Unaligned,
            Some(Duration::from_millis(100)),
        ),
        (
            "chandy-lamport 100ms",
            ProtocolKind::ChandyLamport,
            Some(Duration::from_millis(100)),
        ),
    ];
    let only = std::env::var("ONLY").ok();
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|(name, _, _)| {
            only.as_deref()
                .is_none_or(|o| name.starts_with(o) || *name == "none")
        })
        .collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cases.len() + 1];
    let mut cpu_rates: Vec<Vec<f64>> = vec![Vec::new(); cases.len() + 1];
    let mut ckpts: Vec<Vec<usize>> = vec![Vec::new(); cases.len()];
    // Interleave the cases run by run, so that machine load hits all alike.
    for _ in 0..runs {
        let c0 = cpu_time();
        let d = bare(records);
        cpu_rates[cases.len()].push(records as f64 / (cpu_time() - c0).as_secs_f64());
        rates[cases.len()].push(records as f64 / d.as_secs_f64());
        for (k, (_, protocol, interval)) in cases.iter().enumerate() {
            let c0 = cpu_time();
            let r = job(records, *protocol, *interval);
            cpu_rates[k].push(records as f64 / (cpu_time() - c0).as_secs_f64());
            assert_eq!(r.records_in, records);
            rates[k].push(r.throughput());
            ckpts[k].push(r.completed_checkpoints().count());
        }
    }
    let none = median(rates[0].clone());
    let bare_rate = median(rates[cases.len()].clone());
    let cpu_none = median(cpu_rates[0].clone());
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let best_none = best(&rates[0]);
    println!(
        "records per run: {records}, runs: {runs}, parallelism 2, batch {BATCH}, users {USERS}"
    );
    println!(
        "{:<22} {:>11} {:>8} {:>8} {:>11} {:>8} {:>11} {:>8} {:>6}",
        "case",
        "wall rec/s",
        "vs none",
        "vs bare",
        "rec/cpu-s",
        "vs none",
        "best wall",
        "vs none",
        "ckpts"
    );
    let row = |name: &str, k: usize, ck: String| {
        let (w, c, b) = (
            median(rates[k].clone()),
            median(cpu_rates[k].clone()),
            best(&rates[k]),
        );
        println!(
            "{:<22} {:>11.3e} {:>8.3} {:>8.3} {:>11.3e} {:>8.3} {:>11.3e} {:>8.3} {:>6}",
            name,
            w,
            w / none,
            w / bare_rate,
            c,
            c / cpu_none,
            b,
            b / best_none,
            ck
        );
    };
    row("bare rust pipeline", cases.len(), "-".into());
    for (k, (name, _, _)) in cases.iter().enumerate() {
        let c = median(ckpts[k].iter().map(|&c| c as f64).collect());
        row(name, k, format!("{c}"));
    }
    println!("every run, wall rec/s:");
    for (k, (name, _, _)) in cases.iter().enumerate() {
        let all: Vec<String> = rates[k].iter().map(|r| format!("{r:.3e}")).collect();
        println!("  {name}: {}", all.join(" "));
    }
    let all: Vec<String> = rates[cases.len()]
        .iter()
        .map(|r| format!("{r:.3e}"))
        .collect();
    println!("  bare: {}", all.join(" "));
}
