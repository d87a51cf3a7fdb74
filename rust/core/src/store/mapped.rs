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

/// Owns the mapping a buffer's arrays point into (read through this field
/// only to advise the OS; dropping it unmaps the file).
struct Mapped {
    _map: memmap2::Mmap,
}

// The mapping is read-only and never changes after it is made.
impl RefUnwindSafe for Mapped {}

/// A mapped file's pages, which its reader may let go of while it still
/// holds the buffer ([`Self::release`]).
#[derive(Clone)]
pub struct MappedPages(Arc<Mapped>);

impl std::fmt::Debug for MappedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MappedPages")
            .field(&self.0._map.len())
            .finish()
    }
}

impl crate::state::runs::Pages for MappedPages {
    fn release(&self) {
        MappedPages::release(self);
    }
}

impl MappedPages {
    /// Drops the file's pages from this process's resident set: a pass
    /// over a large run (a merge, a filter built from its keys) would
    /// otherwise keep every page it read counted in the process's RSS
    /// until the run is dropped. The pages stay in the page cache, and a
    /// later read faults them back in. Best effort: an OS that refuses
    /// the advice leaves them resident.
    pub fn release(&self) {
        #[cfg(unix)]
        // SAFETY: the mapping is a read-only map of a file that is never
        // written again (the module's doc): MADV_DONTNEED only drops the
        // page table entries, and a read after it sees the file's bytes
        // as before, never zeroed memory.
        let _ = unsafe {
            self.0
                ._map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }
}

/// `path` mapped read-only, whole, as one buffer, with the mapping's pages
/// (`None` for an empty file, which is not mapped); `what` names the file
/// in errors. `Ok(None)`: there is no such file.
pub fn map_file_pages(path: &Path, what: &str) -> Result<Option<(Buffer, Option<MappedPages>)>> {
    let io = |e| Error::io(format!("mapping {what}"), e);
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if file.metadata().map_err(io)?.len() == 0 {
        // A zero-length mapping is refused by the OS; an empty file is read
        // as an empty buffer (and then refused by its checks).
        return Ok(Some((Buffer::from_vec(Vec::<u8>::new()), None)));
    }
    // SAFETY: only files that are never written again are mapped (the
    // module's doc); removing one keeps the mapping valid.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let len = map.len();
    let ptr = NonNull::new(map.as_ptr() as *mut u8)
        .ok_or_else(|| Error::Snapshot(format!("{what}: mapped at a null address")))?;
    let owner = Arc::new(Mapped { _map: map });
    // SAFETY: `ptr` and `len` describe the mapping that the owner keeps
    // alive for as long as the buffer (and every slice of it) lives.
    let buffer = unsafe { Buffer::from_custom_allocation(ptr, len, owner.clone()) };
    Ok(Some((buffer, Some(MappedPages(owner)))))
}
