//! Files read through a memory mapping, as Arrow buffers: a spilled run
//! ([`super::LocalRuns`]) and a checkpoint's state file read by a lazy
//! restore ([`super::SnapshotReader::state_runs`]) cost page cache, which
//! the kernel can take back, rather than heap.
//!
//! Only files that no one writes again are mapped: a spilled run is its
//! process's own, a checkpoint's file is published by a rename and never
//! rewritten in place. Removing such a file (retention, a released run)
//! leaves a mapping valid until it is dropped.

use std::fs::File;
use std::panic::RefUnwindSafe;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;

use crate::error::{Error, Result};

/// Owns the mapping a buffer's arrays point into (never read through this
/// field; dropping it unmaps the file).
struct Mapped {
    _map: memmap2::Mmap,
}

// The mapping is read-only and never changes after it is made.
impl RefUnwindSafe for Mapped {}

/// `path` mapped read-only, whole, as one buffer; `what` names the file in
/// errors. `Ok(None)`: there is no such file.
pub(crate) fn map_file(path: &Path, what: &str) -> Result<Option<Buffer>> {
    let io = |e| Error::io(format!("mapping {what}"), e);
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if file.metadata().map_err(io)?.len() == 0 {
        // A zero-length mapping is refused by the OS; an empty file is read
        // as an empty buffer (and then refused by its checks).
        return Ok(Some(Buffer::from_vec(Vec::<u8>::new())));
    }
    // SAFETY: only files that are never written again are mapped (the
    // module's doc); removing one keeps the mapping valid.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let len = map.len();
    let ptr = NonNull::new(map.as_ptr() as *mut u8)
        .ok_or_else(|| Error::Snapshot(format!("{what}: mapped at a null address")))?;
    // SAFETY: `ptr` and `len` describe the mapping that the owner keeps
    // alive for as long as the buffer (and every slice of it) lives.
    Ok(Some(unsafe {
        Buffer::from_custom_allocation(ptr, len, Arc::new(Mapped { _map: map }))
    }))
}
