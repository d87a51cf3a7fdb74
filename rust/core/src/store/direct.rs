//! A checkpoint file written once, front to back, with direct I/O
//! (`O_DIRECT`) where the filesystem takes it: the bytes go from one
//! aligned buffer, reused by the writing thread, to the device, never
//! through the page cache.
//!
//! Why (issue 37): a checkpoint's files are written once and read only by
//! a restore or a compaction, yet a buffered write puts every byte in the
//! page cache first, in pages the kernel must find. On a virtual machine
//! whose guest hands free pages back to its host (virtio-balloon free-page
//! reporting, as on this project's machines) a page the guest has not used
//! for ~2 s costs a host fault to touch again: there a buffered write of a
//! 500 MB checkpoint cost ~1 s of CPU, against ~0.1 s through warm pages
//! and ~0.08 s with `O_DIRECT` (`bench/results/state_store/direct_io/`).
//! RocksDB offers the same for flushes and compactions
//! (`use_direct_io_for_flush_and_compaction`).
//!
//! Durability is unchanged: direct I/O skips the cache, not the device's
//! own, so the store still fsyncs (or `syncfs`es) before a manifest counts.
//! Where `O_DIRECT` is refused (tmpfs, some network filesystems, other
//! systems than Linux) the file is written through the page cache as
//! before; the bytes are the same either way.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Alignment of a direct write's buffer address, length and file offset:
/// a page, a multiple of every logical block size Linux supports for it.
const ALIGN: usize = 4096;

/// Bytes a direct write hands the device at a time (and the buffer's size).
const CHUNK: usize = 4 << 20;

/// A page-aligned byte buffer of [`CHUNK`] bytes.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
}

// SAFETY: the buffer owns its allocation; nothing else points into it.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(CHUNK, ALIGN).expect("a valid layout")
    }

    fn new() -> Self {
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        let ptr = std::ptr::NonNull::new(raw)
            .unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout()));
        Self { ptr }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to CHUNK bytes this buffer owns, initialised
        // (zeroed) at allocation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), CHUNK) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout()) }
    }
}

thread_local! {
    /// The writing thread's buffer, kept between files so its pages stay
    /// the thread's (a fresh one each file would touch new pages: the cost
    /// this module avoids).
    static SPARE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// A new file written sequentially: through the page cache, or directly
/// (see the module's notes). Call [`OutputFile::finish`] to write the end;
/// dropping it without doing so leaves the file short.
pub(crate) struct OutputFile {
    file: File,
    /// `Some` while writing directly: the bytes not yet written.
    direct: Option<(AlignedBuf, usize)>,
    /// Buffered mode's buffer (direct mode writes from its own).
    buffered: Option<io::BufWriter<File>>,
}

impl OutputFile {
    /// Creates (or replaces) the file at `path`; `direct`: try `O_DIRECT`.
    pub(crate) fn create(path: &Path, direct: bool) -> io::Result<Self> {
        if direct {
            if let Some(file) = open_direct(path)? {
                let buf = SPARE
                    .with(|s| s.borrow_mut().take())
                    .unwrap_or_else(AlignedBuf::new);
                return Ok(Self {
                    file,
                    direct: Some((buf, 0)),
                    buffered: None,
                });
            }
        }
        let file = File::create(path)?;
        let clone = file.try_clone()?;
        Ok(Self {
            file,
            direct: None,
            buffered: Some(io::BufWriter::with_capacity(1 << 20, clone)),
        })
    }

    /// Whether the file is being written with direct I/O.
    #[cfg(test)]
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Writes what is left (the last, partial block through the page
    /// cache: a direct write takes whole blocks only) and returns the
    /// file, for the caller's fsync.
    pub(crate) fn finish(mut self) -> io::Result<File> {
        if let Some((mut buf, len)) = self.direct.take() {
            let whole = len / ALIGN * ALIGN;
            let result = self.write_direct(&mut buf, whole).and_then(|()| {
                if whole < len {
                    set_direct(&self.file, false)?;
                    self.file.write_all(&buf.bytes()[whole..len])?;
                }
                Ok(())
            });
            SPARE.with(|s| *s.borrow_mut() = Some(buf));
            result?;
        }
        if let Some(b) = self.buffered.take() {
            b.into_inner().map_err(|e| e.into_error())?;
        }
        Ok(self.file)
    }

    /// Writes the first `len` bytes of `buf` (a multiple of [`ALIGN`]) at
    /// the file's offset (also one); should the filesystem refuse a direct
    /// write after all, writes them and the rest through the page cache.
    fn write_direct(&mut self, buf: &mut AlignedBuf, len: usize) -> io::Result<()> {
        let mut done = 0;
        while done < len {
            match self.file.write(&buf.bytes()[done..len]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                // A short direct write leaves the offset unaligned: go on
                // through the page cache.
                Ok(n) if n % ALIGN != 0 => {
                    set_direct(&self.file, false)?;
                    self.file.write_all(&buf.bytes()[done + n..len])?;
                    return self.fall_back();
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    set_direct(&self.file, false)?;
                    self.file.write_all(&buf.bytes()[done..len])?;
                    return self.fall_back();
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Switches to buffered writing (the direct buffer is empty and the
    /// file descriptor no longer direct).
    fn fall_back(&mut self) -> io::Result<()> {
        if let Some((buf, _)) = self.direct.take() {
            SPARE.with(|s| *s.borrow_mut() = Some(buf));
        }
        self.buffered = Some(io::BufWriter::with_capacity(
            1 << 20,
            self.file.try_clone()?,
        ));
        Ok(())
    }
}

impl Write for OutputFile {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if let Some(b) = self.buffered.as_mut() {
            return b.write(data);
        }
        let (mut buf, len) = self.direct.take().expect("direct or buffered");
        let n = data.len().min(CHUNK - len);
        buf.bytes()[len..len + n].copy_from_slice(&data[..n]);
        if len + n < CHUNK {
            self.direct = Some((buf, len + n));
            return Ok(n);
        }
        let written = self.write_direct(&mut buf, CHUNK);
        if self.buffered.is_none() {
            self.direct = Some((buf, 0));
        } else {
            SPARE.with(|s| *s.borrow_mut() = Some(buf));
        }
        written.map(|()| n)
    }

    /// Buffered mode flushes its buffer; direct mode holds a partial block
    /// until [`OutputFile::finish`] (a direct write takes whole blocks).
    fn flush(&mut self) -> io::Result<()> {
        match self.buffered.as_mut() {
            Some(b) => b.flush(),
            None => Ok(()),
        }
    }
}

/// Opens `path` for direct writing, created or truncated; `None` where
/// this filesystem or system does not take `O_DIRECT`.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> io::Result<Option<File>> {
    Ok(None)
}

/// Sets or clears `O_DIRECT` on an open file.
#[cfg(target_os = "linux")]
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl reads and sets the flags of a descriptor `file` keeps
    // open; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn set_direct(_file: &File, _on: bool) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn write_in(path: &Path, direct: bool, data: &[u8], piece: usize) -> bool {
        let mut out = OutputFile::create(path, direct).unwrap();
        let was_direct = out.is_direct();
        for part in data.chunks(piece.max(1)) {
            out.write_all(part).unwrap();
        }
        out.flush().unwrap();
        let file = out.finish().unwrap();
        file.sync_all().unwrap();
        was_direct
    }

    #[test]
    fn writes_the_same_bytes_directly_and_through_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        // Around the chunk and block edges, and odd pieces.
        for len in [
            0,
            1,
            ALIGN - 1,
            ALIGN,
            ALIGN + 1,
            CHUNK - 1,
            CHUNK,
            CHUNK + 4097,
            3 * CHUNK + 5,
        ] {
            let data = pattern(len);
            for (direct, piece) in [(true, 1000), (true, CHUNK + 3), (false, 777)] {
                let path = dir.path().join(format!("f-{len}-{direct}-{piece}"));
                write_in(&path, direct, &data, piece);
                assert_eq!(
                    std::fs::read(&path).unwrap(),
                    data,
                    "{len} bytes, direct {direct}"
                );
            }
        }
    }

    #[test]
    fn replaces_a_longer_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_in(&path, true, &pattern(3 * CHUNK), 65536);
        let short = pattern(ALIGN + 10);
        write_in(&path, true, &short, 100);
        assert_eq!(std::fs::read(&path).unwrap(), short);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_direct_file_is_direct_where_the_filesystem_takes_it() {
        // Whatever the temporary directory's filesystem: direct where it
        // takes O_DIRECT (ext4, xfs, btrfs), buffered where not (tmpfs).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let direct = write_in(&path, true, &pattern(CHUNK + 1), 4096);
        let fs_takes_it = open_direct(&dir.path().join("probe")).unwrap().is_some();
        assert_eq!(direct, fs_takes_it);
        assert!(!write_in(&path, false, &pattern(10), 4));
    }
}
