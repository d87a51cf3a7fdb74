//! Giving freed memory back to the OS after a large free. A state table
//! over its memory budget frees its memtable at each flush, and a
//! streamed checkpoint frees the copies it made; an allocator that keeps
//! freed pages for a while (mimalloc purges them only after a delay, on a
//! later call) leaves them counted in the process's resident memory, which
//! is what a Python worker's budget is measured by. The core has no say in
//! the allocator: whoever sets it (the Python bindings set mimalloc) says
//! how to collect, once, with [`set_release`].

use std::sync::OnceLock;

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets how the process's allocator returns freed memory to the OS. The
/// first call wins.
pub fn set_release(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Returns freed memory to the OS, if the allocator was told how
/// ([`set_release`]); else nothing.
pub fn release_freed() {
    if let Some(release) = RELEASE.get() {
        release();
    }
}
