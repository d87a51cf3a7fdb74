//! Channel benchmarks against peers, all in one run so ratios are comparable:
//! - `throughput/*`: one u64 per operation, two threads, spinning `try_*` loops
//!   (the data structure, not a blocking strategy, is measured).
//! - `pingpong/*`: two channels A→B→A; reported time is the ONE-WAY latency
//!   (round trip / 2). `atomic_handoff` is the machine's raw core-to-core handoff: two
//!   threads bouncing one cache line.
//! - `batch_<n>/*`: batches of n u64 through our slice API vs rtrb's chunk API.
//! - `same_thread/*`: bursts of 64 pushes then 64 pops on one thread: the per-op code
//!   cost, robust to a busy machine (no cross-core handoff, no co-scheduling needed).
//!
//! Run: `cargo bench -p snapcut-core --bench channel`

use std::hint::{black_box, spin_loop};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use crossbeam_utils::CachePadded;
use snapcut_core::channel;

const CAPACITY: usize = 1024;
const BATCH_CAPACITY: usize = 4096;

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// Moves `iters` u64 from a producer thread to this thread; returns the elapsed time.
fn two_threads<P: Send, C>(
    iters: u64,
    (mut p, mut c): (P, C),
    send: impl Fn(&mut P, u64) + Send,
    recv: impl Fn(&mut C) -> u64,
) -> Duration {
    thread::scope(|s| {
        let start = Instant::now();
        s.spawn(move || {
            for i in 0..iters {
                send(&mut p, i);
            }
        });
        let mut sum = 0u64;
        for _ in 0..iters {
            sum = sum.wrapping_add(recv(&mut c));
        }
        black_box(sum);
        start.elapsed()
    })
}

/// Spins on a `try_*` operation; after many failures yields, so that a peer that
/// the (shared, 2-core) machine descheduled can run. Same policy for every peer.
macro_rules! spin_until_ok {
    ($e:expr) => {{
        let mut failures = 0u32;
        loop {
            if let Ok(v) = $e {
                break v;
            }
            backoff(&mut failures);
        }
    }};
}

#[inline(always)]
fn backoff(failures: &mut u32) {
    *failures += 1;
    if *failures % 256 == 0 {
        thread::yield_now();
    } else {
        spin_loop();
    }
}

fn throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("throughput");
    configure(&mut g);
    g.throughput(Throughput::Elements(1));
    g.bench_function("snapcut", |b| {
        b.iter_custom(|n| {
            two_threads(
                n,
                channel::channel::<u64>(CAPACITY),
                |tx, v| spin_until_ok!(tx.try_send(v)),
                |rx| spin_until_ok!(rx.try_recv()),
            )
        })
    });
    g.bench_function("rtrb", |b| {
        b.iter_custom(|n| {
            two_threads(
                n,
                rtrb::RingBuffer::<u64>::new(CAPACITY),
                |tx, v| spin_until_ok!(tx.push(v)),
                |rx| spin_until_ok!(rx.pop()),
            )
        })
    });
    g.bench_function("crossbeam_channel_bounded", |b| {
        b.iter_custom(|n| {
            two_threads(
                n,
                crossbeam_channel::bounded::<u64>(CAPACITY),
                |tx, v| spin_until_ok!(tx.try_send(v)),
                |rx| spin_until_ok!(rx.try_recv()),
            )
        })
    });
    g.bench_function("crossbeam_array_queue", |b| {
        b.iter_custom(|n| {
            let q = std::sync::Arc::new(crossbeam_queue::ArrayQueue::<u64>::new(CAPACITY));
            two_threads(
                n,
                (q.clone(), q),
                |q, v| spin_until_ok!(q.push(v)),
                |q| spin_until_ok!(q.pop().ok_or(())),
            )
        })
    });
    g.bench_function("std_sync_channel", |b| {
        b.iter_custom(|n| {
            two_threads(
                n,
                std::sync::mpsc::sync_channel::<u64>(CAPACITY),
                |tx, v| spin_until_ok!(tx.try_send(v)),
                |rx| spin_until_ok!(rx.try_recv()),
            )
        })
    });
    g.finish();
}

/// `iters` round trips between this thread and an echo thread; returns elapsed / 2.
fn ping_pong<A: Send, B>(
    iters: u64,
    (mut a_tx, mut a_rx): (A, B),
    (mut b_tx, mut b_rx): (A, B),
    send: impl Fn(&mut A, u64) + Sync,
    recv: impl Fn(&mut B) -> u64 + Sync,
) -> Duration
where
    B: Send,
{
    thread::scope(|s| {
        let (send, recv) = (&send, &recv);
        s.spawn(move || {
            for _ in 0..iters {
                let v = recv(&mut a_rx);
                send(&mut b_tx, v + 1);
            }
        });
        let start = Instant::now();
        for i in 0..iters {
            send(&mut a_tx, i);
            black_box(recv(&mut b_rx));
        }
        start.elapsed() / 2
    })
}

fn pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong");
    configure(&mut g);
    g.bench_function("atomic_handoff", |b| {
        b.iter_custom(|n| {
            let line = CachePadded::new(AtomicU64::new(0));
            thread::scope(|s| {
                let line = &line;
                s.spawn(move || {
                    for i in 0..n {
                        let mut failures = 0;
                        while line.load(Ordering::Acquire) != 2 * i + 1 {
                            backoff(&mut failures);
                        }
                        line.store(2 * i + 2, Ordering::Release);
                    }
                });
                let start = Instant::now();
                for i in 0..n {
                    line.store(2 * i + 1, Ordering::Release);
                    let mut failures = 0;
                    while line.load(Ordering::Acquire) != 2 * i + 2 {
                        backoff(&mut failures);
                    }
                }
                start.elapsed() / 2
            })
        })
    });
    g.bench_function("snapcut", |b| {
        b.iter_custom(|n| {
            ping_pong(
                n,
                channel::channel::<u64>(CAPACITY),
                channel::channel::<u64>(CAPACITY),
                |tx, v| spin_until_ok!(tx.try_send(v)),
                |rx| spin_until_ok!(rx.try_recv()),
            )
        })
    });
    g.bench_function("rtrb", |b| {
        b.iter_custom(|n| {
            ping_pong(
                n,
                rtrb::RingBuffer::<u64>::new(CAPACITY),
                rtrb::RingBuffer::<u64>::new(CAPACITY),
                |tx, v| spin_until_ok!(tx.push(v)),
                |rx| spin_until_ok!(rx.pop()),
            )
        })
    });
    g.bench_function("crossbeam_channel_bounded", |b| {
        b.iter_custom(|n| {
            ping_pong(
                n,
                crossbeam_channel::bounded::<u64>(CAPACITY),
                crossbeam_channel::bounded::<u64>(CAPACITY),
                |tx, v| spin_until_ok!(tx.try_send(v)),
                |rx| spin_until_ok!(rx.try_recv()),
            )
        })
    });
    g.bench_function("crossbeam_array_queue", |b| {
        b.iter_custom(|n| {
            let q1 = std::sync::Arc::new(crossbeam_queue::ArrayQueue::<u64>::new(CAPACITY));
            let q2 = std::sync::Arc::new(crossbeam_queue::ArrayQueue::<u64>::new(CAPACITY));
            ping_pong(
                n,
                (q1.clone(), q1),
                (q2.clone(), q2),
                |q, v| spin_until_ok!(q.push(v)),
                |q| spin_until_ok!(q.pop().ok_or(())),
            )
        })
    });
    g.bench_function("std_sync_channel", |b| {
        b.iter_custom(|n| {
            let (t1, r1) = std::sync::mpsc::sync_channel::<u64>(CAPACITY);
            let (t2, r2) = std::sync::mpsc::sync_channel::<u64>(CAPACITY);
            thread::scope(|s| {
                s.spawn(move || {
                    for _ in 0..n {
                        let v = spin_until_ok!(r1.try_recv());
                        spin_until_ok!(t2.try_send(v + 1));
                    }
                });
                let start = Instant::now();
                for i in 0..n {
                    spin_until_ok!(t1.try_send(i));
                    black_box(spin_until_ok!(r2.try_recv()));
                }
                start.elapsed() / 2
            })
        })
    });
    g.finish();
}

fn batched(c: &mut Criterion) {
    for batch in [64usize, 256] {
        let mut g = c.benchmark_group(format!("batch_{batch}"));
        configure(&mut g);
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_function("snapcut", |b| {
            b.iter_custom(|n| {
                let (mut tx, mut rx) = channel::channel::<u64>(BATCH_CAPACITY);
                let total = n * batch as u64;
                thread::scope(|s| {
                    let start = Instant::now();
                    s.spawn(move || {
                        let src: Vec<u64> = (0..batch as u64).collect();
                        let (mut sent, mut failures) = (0u64, 0u32);
                        while sent < total {
                            let want = (total - sent).min(batch as u64) as usize;
                            match tx.try_send_slice(&src[..want]) {
                                Ok(0) => backoff(&mut failures),
                                Ok(k) => sent += k as u64,
                                Err(_) => unreachable!(),
                            }
                        }
                    });
                    let mut buf = vec![0u64; batch];
                    let (mut got, mut sum, mut failures) = (0u64, 0u64, 0u32);
                    while got < total {
                        match rx.try_recv_slice(&mut buf) {
                            Ok(k) => {
                                sum = sum.wrapping_add(buf[k - 1]);
                                got += k as u64;
                            }
                            Err(_) => backoff(&mut failures),
                        }
                    }
                    black_box(sum);
                    start.elapsed()
                })
            })
        });
        g.bench_function("rtrb_chunks", |b| {
            b.iter_custom(|n| {
                let (mut tx, mut rx) = rtrb::RingBuffer::<u64>::new(BATCH_CAPACITY);
                let total = n * batch as u64;
                thread::scope(|s| {
                    let start = Instant::now();
                    s.spawn(move || {
                        let src: Vec<u64> = (0..batch as u64).collect();
                        let (mut sent, mut failures) = (0u64, 0u32);
                        while sent < total {
                            let want = ((total - sent).min(batch as u64) as usize).min(tx.slots());
                            if want == 0 {
                                backoff(&mut failures);
                                continue;
                            }
                            let mut chunk = tx.write_chunk_uninit(want).unwrap();
                            let (a, b) = chunk.as_mut_slices();
                            let split = a.len();
                            rtrb::CopyToUninit::copy_to_uninit(&src[..split], a);
                            rtrb::CopyToUninit::copy_to_uninit(&src[split..want], b);
                            // SAFETY: both slices were fully initialised above.
                            unsafe { chunk.commit_all() };
                            sent += want as u64;
                        }
                    });
                    let mut buf = vec![0u64; batch];
                    let (mut got, mut sum, mut failures) = (0u64, 0u64, 0u32);
                    while got < total {
                        let k = rx.slots().min(batch);
                        if k == 0 {
                            backoff(&mut failures);
                            continue;
                        }
                        let chunk = rx.read_chunk(k).unwrap();
                        let (a, b) = chunk.as_slices();
                        buf[..a.len()].copy_from_slice(a);
                        buf[a.len()..k].copy_from_slice(b);
                        chunk.commit_all();
                        sum = sum.wrapping_add(buf[k - 1]);
                        got += k as u64;
                    }
                    black_box(sum);
                    start.elapsed()
                })
            })
        });
        g.finish();
    }
}

/// One thread pushes a burst of 64 then pops it: the per-operation code cost of each
/// queue without cross-core traffic, which a busy machine's scheduling cannot skew much.
fn same_thread(c: &mut Criterion) {
    const BURST: u64 = 64;
    let mut g = c.benchmark_group("same_thread");
    configure(&mut g);
    g.throughput(Throughput::Elements(BURST));
    let (mut tx, mut rx) = channel::channel::<u64>(CAPACITY);
    g.bench_function("snapcut", |b| {
        b.iter(|| {
            for i in 0..BURST {
                tx.try_send(black_box(i)).unwrap();
            }
            for _ in 0..BURST {
                black_box(rx.try_recv().unwrap());
            }
        })
    });
    let (mut tx, mut rx) = rtrb::RingBuffer::<u64>::new(CAPACITY);
    g.bench_function("rtrb", |b| {
        b.iter(|| {
            for i in 0..BURST {
                tx.push(black_box(i)).unwrap();
            }
            for _ in 0..BURST {
                black_box(rx.pop().unwrap());
            }
        })
    });
    let (tx, rx) = crossbeam_channel::bounded::<u64>(CAPACITY);
    g.bench_function("crossbeam_channel_bounded", |b| {
        b.iter(|| {
            for i in 0..BURST {
                tx.try_send(black_box(i)).unwrap();
            }
            for _ in 0..BURST {
                black_box(rx.try_recv().unwrap());
            }
        })
    });
    let q = crossbeam_queue::ArrayQueue::<u64>::new(CAPACITY);
    g.bench_function("crossbeam_array_queue", |b| {
        b.iter(|| {
            for i in 0..BURST {
                q.push(black_box(i)).unwrap();
            }
            for _ in 0..BURST {
                black_box(q.pop().unwrap());
            }
        })
    });
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(CAPACITY);
    g.bench_function("std_sync_channel", |b| {
        b.iter(|| {
            for i in 0..BURST {
                tx.try_send(black_box(i)).unwrap();
            }
            for _ in 0..BURST {
                black_box(rx.try_recv().unwrap());
            }
        })
    });
    g.finish();
}

fn configure(g: &mut Group<'_>) {
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
}

criterion_group!(benches, throughput, pingpong, batched, same_thread);
criterion_main!(benches);
