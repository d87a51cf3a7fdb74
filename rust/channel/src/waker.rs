//! `TaskWaker`: lets one task sleep until ANY of several channel ends becomes ready.
//!
//! A task that reads several inputs builds all of them with the same receiver-side
//! waker; a task that writes several outputs can do the same on the sender side (or
//! use one waker for both roles). The waiting task spins briefly, then yields, then
//! announces that it sleeps, re-checks every end and parks. Every publish on a channel
//! ends with a cheap check of the peer's waker: it costs a relaxed load (and a compiler
//! fence on Linux, see `sync`) unless the peer actually sleeps.

use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::sync::{self, AtomicBool, Parker};
use std::sync::atomic::Ordering::Relaxed;

/// Spin rounds (each doubling the number of `spin_loop` hints) before yielding.
const SPIN_ROUNDS: u32 = 7;
/// `yield_now` calls before parking.
const YIELD_ROUNDS: u32 = 10;

/// How channels and tasks share a waker. Always `std::sync::Arc`, also under loom
/// (a waker holds no `UnsafeCell`, so loom needs no model of its reference count),
/// so that code outside the channel compiles unchanged with the `loom` feature.
pub type WakerRef = std::sync::Arc<TaskWaker>;

/// The sleep/wake point of one task (one thread at a time waits on it).
#[derive(Debug)]
pub struct TaskWaker {
    /// Set while the owner is (about to be) parked; read by every publish.
    sleeping: CachePadded<AtomicBool>,
    /// Where the owner blocks; only touched on the slow paths.
    parker: Parker,
}

impl Default for TaskWaker {
    fn default() -> Self {
        Self {
            sleeping: CachePadded::new(AtomicBool::new(false)),
            parker: Parker::default(),
        }
    }
}

impl TaskWaker {
    /// A new waker, shared by `Arc` between the channels it serves.
    pub fn new() -> WakerRef {
        std::sync::Arc::new(Self::default())
    }

    /// Blocks the calling thread until `ready()` returns true; returns at once if it
    /// already does. `ready` must check every channel end this waker serves (for
    /// example `rx.is_ready()`, which is also true once the peer disconnected).
    pub fn wait_until(&self, ready: impl FnMut() -> bool) {
        self.wait_inner(ready, None);
    }

    /// Like [`wait_until`](Self::wait_until) but gives up after `timeout`; returns
    /// whether `ready()` became true.
    pub fn wait_until_timeout(&self, ready: impl FnMut() -> bool, timeout: Duration) -> bool {
        self.wait_inner(ready, Instant::now().checked_add(timeout))
    }

    /// Like [`wait_until`](Self::wait_until) but gives up at `deadline` (`None`: never).
    pub fn wait_until_deadline(
        &self,
        ready: impl FnMut() -> bool,
        deadline: Option<Instant>,
    ) -> bool {
        self.wait_inner(ready, deadline)
    }

    /// Wakes the owner if it sleeps. Channels call this after every publish; call it
    /// yourself only after changing some other condition the owner waits on (after a
    /// store to that condition).
    #[inline(always)]
    pub fn notify(&self) {
        sync::light_barrier();
        if self.sleeping.load(Relaxed) {
            self.wake_slow();
        }
    }

    /// Whether the owner has announced that it sleeps (diagnostics and tests).
    pub fn is_sleeping(&self) -> bool {
        self.sleeping.load(Relaxed)
    }

    #[cold]
    #[inline(never)]
    fn wake_slow(&self) {
        self.parker.unpark();
    }

    fn wait_inner(&self, mut ready: impl FnMut() -> bool, deadline: Option<Instant>) -> bool {
        if ready() {
            return true;
        }
        // Brief spin then yields: a peer that is active answers within a few hundred
        // nanoseconds, and parking would cost microseconds on both sides.
        if !cfg!(feature = "loom") {
            for round in 0..SPIN_ROUNDS + YIELD_ROUNDS {
                if round < SPIN_ROUNDS {
                    for _ in 0..1u32 << round {
                        std::hint::spin_loop();
                    }
                } else {
                    sync::yield_now();
                }
                if ready() {
                    return true;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return false;
                }
            }
        }
        self.parker.prepare();
        loop {
            // Dekker handshake with `notify`: announce, barrier, re-check, park.
            self.sleeping.store(true, Relaxed);
            sync::heavy_barrier();
            if ready() {
                self.sleeping.store(false, Relaxed);
                return true;
            }
            match deadline {
                None => self.parker.park(None),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        self.sleeping.store(false, Relaxed);
                        return ready();
                    }
                    self.parker.park(Some(d - now));
                }
            }
            self.sleeping.store(false, Relaxed);
            if ready() {
                return true;
            }
        }
    }
}
