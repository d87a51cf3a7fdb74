//! Shims that switch the channel's atomics, cells, threads and barriers to loom's
//! model-checked versions under the `loom` feature, plus the asymmetric barrier pair that
//! keeps the sleep/wake handshake off the hot path.

#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicUsize};
#[cfg(feature = "loom")]
pub(crate) use loom::sync::Arc;
#[cfg(feature = "loom")]
pub(crate) use loom::thread::yield_now;

#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize};
#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::Arc;
#[cfg(not(feature = "loom"))]
pub(crate) use std::thread::yield_now;

#[cfg(feature = "loom")]
pub(crate) use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell` with loom's closure-based access API, so that the ring's
/// code is written once for both builds.
#[cfg(not(feature = "loom"))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(feature = "loom"))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Where a waiting task blocks: the OS thread parker in real builds; under loom a
/// `loom::sync::Notify`, because loom's `unpark` would also wake a thread blocked in
/// `join` (real `unpark` only leaves a token).
#[cfg(not(feature = "loom"))]
#[derive(Debug, Default)]
pub(crate) struct Parker {
    thread: std::sync::Mutex<Option<std::thread::Thread>>,
}

#[cfg(not(feature = "loom"))]
impl Parker {
    /// Records the calling thread as the one to unpark (a waker may move between
    /// threads with the task that owns it).
    pub(crate) fn prepare(&self) {
        let me = std::thread::current();
        let mut slot = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().map(std::thread::Thread::id) != Some(me.id()) {
            *slot = Some(me);
        }
    }

    /// Blocks until unparked (spurious returns allowed), at most `timeout` if given.
    pub(crate) fn park(&self, timeout: Option<std::time::Duration>) {
        match timeout {
            None => std::thread::park(),
            Some(t) => std::thread::park_timeout(t),
        }
    }

    pub(crate) fn unpark(&self) {
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(thread) = thread {
            thread.unpark();
        }
    }
}

#[cfg(feature = "loom")]
#[derive(Debug, Default)]
pub(crate) struct Parker {
    notify: loom::sync::Notify,
}

#[cfg(feature = "loom")]
impl Parker {
    pub(crate) fn prepare(&self) {}

    /// Loom has no timed wait; models never use timeouts.
    pub(crate) fn park(&self, _timeout: Option<std::time::Duration>) {
        self.notify.wait();
    }

    pub(crate) fn unpark(&self) {
        self.notify.notify();
    }
}

pub(crate) use barrier::{heavy_barrier, init_barriers, light_barrier};

/// The sleep/wake handshake is a Dekker pattern: the sleeper writes "sleeping" then
/// reads the ring index; the notifier writes the ring index then reads "sleeping".
/// Both sides need a store→load barrier. The notifier runs on every publish, the
/// sleeper only before parking, so on Linux the notifier's side is a compiler fence and
/// the sleeper pays for a process-wide `membarrier(PRIVATE_EXPEDITED)` which forces a
/// full barrier on every running thread of the process. Where membarrier is
/// unavailable both sides use `fence(SeqCst)`.
#[cfg(feature = "loom")]
mod barrier {
    use std::sync::atomic::Ordering::SeqCst;

    pub(crate) fn init_barriers() {}

    #[inline(always)]
    pub(crate) fn light_barrier() {
        super::fence(SeqCst);
    }

    pub(crate) fn heavy_barrier() {
        super::fence(SeqCst);
    }
}

#[cfg(all(not(feature = "loom"), target_os = "linux"))]
mod barrier {
    use std::sync::atomic::Ordering::{Relaxed, SeqCst};
    use std::sync::atomic::{compiler_fence, AtomicBool};
    use std::sync::Once;

    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    static ASYMMETRIC: AtomicBool = AtomicBool::new(false);
    static INIT: Once = Once::new();

    fn membarrier(cmd: libc::c_int) -> bool {
        // SAFETY: membarrier takes two integer arguments and touches no user memory.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            ) == 0
        }
    }

    /// Registers the process for expedited membarrier once; every channel constructor
    /// calls this before handing out its ends, so both sides agree on the mode.
    /// `SNAPCUT_CHANNEL_FENCE=1` forces the symmetric-fence fallback (for comparison).
    pub(crate) fn init_barriers() {
        INIT.call_once(|| {
            let forced_off = std::env::var_os("SNAPCUT_CHANNEL_FENCE").is_some_and(|v| v == "1");
            if !forced_off && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
                ASYMMETRIC.store(true, Relaxed);
            }
        });
    }

    #[inline(always)]
    pub(crate) fn light_barrier() {
        if ASYMMETRIC.load(Relaxed) {
            compiler_fence(SeqCst);
        } else {
            std::sync::atomic::fence(SeqCst);
        }
    }

    pub(crate) fn heavy_barrier() {
        if !(ASYMMETRIC.load(Relaxed) && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
            std::sync::atomic::fence(SeqCst);
        }
    }
}

#[cfg(all(not(feature = "loom"), not(target_os = "linux")))]
mod barrier {
    use std::sync::atomic::{fence, Ordering::SeqCst};

    pub(crate) fn init_barriers() {}

    #[inline(always)]
    pub(crate) fn light_barrier() {
        fence(SeqCst);
    }

    pub(crate) fn heavy_barrier() {
        fence(SeqCst);
    }
}
